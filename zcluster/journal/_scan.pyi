"""The C module zcluster/journal/_scan.c (built with the compiled hot path, :mod:`zcluster._native`)."""

def scan_payloads(buf: bytes | bytearray | memoryview, collect: object, /) -> tuple[int, int, bytes | None]:
    """(records, used, payloads): the whole, CRC-valid records at the start of ``buf``, the bytes they
    cover, and their payloads end to end (None unless ``collect``), as
    :func:`zcluster.journal._filefmt._scan_payloads` finds them."""

def split_lines(buf: bytes | bytearray | memoryview, /) -> list[bytes]:
    """``bytes(buf).split(b"\\n")``, exactly: the pieces between newlines, the one after the last included."""
