"""The C module zcluster/state/_untrack.c (built with the compiled hot path, :mod:`zcluster._native`)."""

def untrack(obj: object, /) -> bool:
    """Stop the cyclic garbage collector tracking ``obj`` when it is a tuple with no ``__dict__`` whose items
    are all exact str, bytes, int, float, bool or None (it can be in no reference cycle); True if it did."""
