"""The front queue as its pod runs it: the built artifact (`front_queue.pyz`, which carries the
pinned h11: warmstart/manifests/pod_scripts.py), started as `python3 <artifact>` with nothing of
this environment's site-packages (`-I -S`), so the tests prove the zip alone is enough."""

from __future__ import annotations

import sys

from tests.support.pod_scripts import artifact


def interpreter() -> list[str]:
    """The command that runs the script as the pod does, before its arguments."""
    return [sys.executable, "-I", "-S", str(artifact("front_queue.pyz"))]
