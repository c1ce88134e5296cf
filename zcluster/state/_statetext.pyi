"""The C module zcluster/state/_statetext.c (built with the compiled hot path, :mod:`zcluster._native`)."""

def state_text(state: object, /) -> str | None:
    """A producer state's checkpoint text (``zcluster.state.layout._text``'s spelling) for a 5-tuple of exact
    bytes producer (at most 64) and exact ints in [-2**63, 2**64) (max_clock may be None); None for anything else."""
