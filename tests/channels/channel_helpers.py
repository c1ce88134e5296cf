from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROCS = Path(__file__).with_name("channel_procs.py")


def run_proc(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a channel_procs command in a fresh Python process; return the completed process."""
    proc = subprocess.run([sys.executable, str(PROCS), *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{args} exited {proc.returncode}: {proc.stderr}")
    return proc
