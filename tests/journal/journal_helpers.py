from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from zcluster.message import CONTENT_TYPE_NDJSON, JournalSpec

PROCS = Path(__file__).with_name("journal_procs.py")


def ndjson(name: str, **labels: str) -> JournalSpec:
    return JournalSpec(name, {"content-type": CONTENT_TYPE_NDJSON, **labels})


def run_proc(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a journal_procs command in a fresh Python process; return the completed process."""
    proc = subprocess.run([sys.executable, str(PROCS), *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}: {proc.stderr}")
    return proc


def start_proc(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(PROCS), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def read_all(store: object, journal: str, offset: int = 0) -> bytes:
    return b"".join(chunk for _, chunk in store.read(journal, offset))  # type: ignore[attr-defined]
