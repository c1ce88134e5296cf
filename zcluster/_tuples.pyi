"""The C module zcluster/_tuples.c (built with the compiled hot path, :mod:`zcluster._native`)."""

def construct(cls: type[tuple[object, object, object]], /) -> None:
    """Give the three-field NamedTuple class ``cls`` a C constructor for calls with three positional
    arguments (any other call goes to its own); TypeError for any other class."""

def untrack(obj: object, /) -> bool:
    """Stop the cyclic garbage collector tracking ``obj`` when it is a tuple with no ``__dict__`` whose items
    are all exact str, bytes, int, float, bool or None (it can be in no reference cycle); True if it did."""
