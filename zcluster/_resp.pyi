"""The C module zcluster/_resp.c (built with the compiled hot path, :mod:`zcluster._native`)."""

from collections.abc import Sequence

Argument = bytes | str | int | float

def pack_commands(commands: Sequence[tuple[Argument, ...] | list[Argument]], /) -> bytes:
    """Each command as a RESP array of bulk strings, all in one bytes object: hiredis' bytes for the same
    arguments (str as UTF-8, int in decimal, float as Python's repr). TypeError names the command and
    argument of any other type (bool included); an empty command is a ValueError."""
