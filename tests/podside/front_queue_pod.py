"""The front queue as its pod runs it: the script beside the one package it imports (h11), in a
folder of its own, started as `python3 <script>` with nothing of this environment's site-packages
(`-E -s -S`; the script's folder is first on the path, as `python3 <script>` has it). The pod-side
packaging carries the same pinned h11 with the script."""

from __future__ import annotations

import functools
import shutil
import sys
import tempfile
from pathlib import Path

import h11

from warmstart.podside import front_queue

SCRIPT = Path(front_queue.__file__).resolve()


@functools.cache
def bundle() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="front-queue-"))
    shutil.copy(SCRIPT, folder / SCRIPT.name)
    shutil.copytree(Path(h11.__file__).parent, folder / "h11", ignore=shutil.ignore_patterns("__pycache__"))
    return folder / SCRIPT.name


def interpreter() -> list[str]:
    """The command that runs the script as the pod does, before its arguments."""
    return [sys.executable, "-E", "-s", "-S", str(bundle())]
