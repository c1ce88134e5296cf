"""The C module zcluster/message/_uuidhex.c (built with the compiled hot path, :mod:`zcluster._native`)."""

def bytes16(text: str, /) -> bytes | None:
    """The 16 bytes of ``text`` when it is exactly a UUID's canonical form (36 characters, dashes at 8, 13, 18
    and 23, hex digits of either case elsewhere), else None; TypeError for anything not a str."""

def ack_text(line: bytes, /) -> str | None:
    """The 36 characters of ``line`` when it is exactly ``{"UUID":"<36 ASCII characters>"}``, else None;
    TypeError for anything not bytes."""
