"""The compile-cache tool's outcome: one JSON line per phase, on stdout.

Part of compile_cache.py, whose docstring has the commands, the environment and the object
layout; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

from .settings import ephemeral, EVENT
from ..common.shared import emit_line, json_line, s3_code as _s3_code, s3_status as _s3_status

# --------------------------------------------------------------------------------------------
# Outcomes and the log line


@dataclasses.dataclass
class Outcome:
    """The one result of a phase; `line()` is what the cold-start report parses."""

    phase: str
    result: str = "error"
    key: str | None = None
    bytes: int | None = None
    files: int | None = None
    seconds: float | None = None
    reason: str | None = None
    waited_s: float | None = None
    compile_dirs: list[str] | None = None
    """restore: vLLM's torch.compile hash directories the node holds after this restore (or hit),
    so the cold-start report can tell a hash mismatch from a failed load when vLLM compiles anyway."""

    def line(self) -> str:
        record = {"event": EVENT, "phase": self.phase, "result": self.result, "key": self.key,
                  "bytes": self.bytes, "files": self.files,
                  "seconds": None if self.seconds is None else round(self.seconds, 3),
                  "reason": None if self.reason is None else self.reason[:600]}
        if self.waited_s is not None:
            record["waited_s"] = round(self.waited_s, 3)
        if self.compile_dirs is not None:
            record["compile_dirs"] = self.compile_dirs
        return json_line(record)


#: Where vLLM puts its per-hash compile directories: `torch_compile_cache/<hash10>` (piecewise) and
#: `torch_compile_cache/torch_aot_compile/<sha256>` (AOT, vllm/compilation/decorators.py in 0.33).
_COMPILE_HASH_PARENTS = ("vllm/torch_compile_cache", "vllm/torch_compile_cache/torch_aot_compile",
                         "vllm/torch_aot_compile")


_MAX_COMPILE_DIRS = 32


def compile_dirs(cache_dir: Path) -> list[str]:
    """The hash directories of vLLM's torch.compile cache on the node (at most 32, sorted)."""
    found: set[str] = set()
    for parent in _COMPILE_HASH_PARENTS:
        try:
            with os.scandir(cache_dir / parent) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False) and entry.name != "torch_aot_compile" \
                            and not ephemeral(entry.name):
                        found.add(f"{parent}/{entry.name}"[len("vllm/"):][:120])
        except OSError:
            continue
    return sorted(found)[:_MAX_COMPILE_DIRS]


def emit_outcome(outcome: Outcome) -> None:
    emit_line(outcome.line())


def describe_error(exc: BaseException) -> str:
    """One line naming the failure, for the log: S3 error codes, errno names, our own reasons."""
    code, status = _s3_code(exc), _s3_status(exc)
    if code or status:
        message = exc.response.get("Error", {}).get("Message") or ""  # type: ignore[attr-defined]
        hint = ""
        if code == "AccessDenied":
            hint = " (S3 also answers this for a missing key when the role lacks s3:ListBucket on the prefix)"
        return f"S3 {code} ({status}): {message}{hint}".strip()
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        where = f" {exc.filename}" if exc.filename else ""
        return f"{name}: {exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"
