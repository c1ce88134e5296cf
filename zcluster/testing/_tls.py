"""Throwaway TLS certificates for local test servers (re-exported as :class:`zcluster.testing.TlsFiles`)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from zcluster.errors import ZClusterError

__all__ = ["TlsFiles"]


@dataclass(frozen=True)
class TlsFiles:
    """A CA and a server certificate for 127.0.0.1, for TLS-enabled local servers."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def generate(cls, directory: Path) -> TlsFiles:
        """Create a throwaway CA and a server certificate for 127.0.0.1 with the ``openssl`` command."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise ZClusterError("TLS test certificates need the openssl command (apt-get install openssl)")
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        steps = [
            "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj /CN=zcluster-local-ca",
            "req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1",
            "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2 "
            "-extfile ext.cnf",
        ]
        for step in steps:
            subprocess.run([openssl, *step.split()], cwd=d, check=True, capture_output=True)
        return cls(d / "ca.crt", d / "server.crt", d / "server.key")
