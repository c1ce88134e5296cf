"""The wheel's build hook: the hot path compiled with mypyc (:mod:`zcluster._native`) goes into the wheel.

The wheel then carries each compiled module's extension beside its ``.py`` and the shared library
``zcluster_native__mypyc.*.so`` at its root, and is tagged for this interpreter and platform. Without a C
compiler (or mypyc failing), or with ``ZCLUSTER_PURE=1``, the wheel is the pure-Python one, said on stderr.
A source tree with a current in-place build (``python -m zcluster._native_build build``, as ``./run`` makes:
same sources, same interpreter) gives the wheel those files rather than compile them again.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class NativeHook(BuildHookInterface):  # type: ignore[misc]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        self.scratch: Path | None = None
        if self.target_name != "wheel" or version == "editable":
            return  # an editable install builds in place: python -m zcluster._native_build build
        if os.environ.get("ZCLUSTER_PURE", "") not in ("", "0"):
            print("zcluster wheel: ZCLUSTER_PURE is set: a pure-Python wheel", file=sys.stderr)
            return
        root = Path(self.root)
        sys.path.insert(0, str(root))
        try:
            from zcluster._native_build import compile_into, current

            reused = current(root)
            if reused is None:
                self.scratch = Path(tempfile.mkdtemp(prefix="zcluster-wheel-native-"))
                outputs, base, how = compile_into(root, self.scratch), self.scratch, "compiled"
            else:
                outputs, base, how = reused, root, "taken from the current in-place build"
        except (Exception, SystemExit) as exc:  # no compiler, no mypyc: the pure wheel still works
            print(f"zcluster wheel: not compiled ({exc!r}): a pure-Python wheel", file=sys.stderr)
            return
        finally:
            sys.path.remove(str(root))
        for rel in outputs:
            build_data["force_include"][str(base / rel)] = str(rel)
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        print(f"zcluster wheel: {len(outputs)} compiled files, {how}", file=sys.stderr)

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
