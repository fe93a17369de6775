"""The pod scripts as their pods run them: each entry point's artifact, built by
warmstart/manifests/pod_scripts.py from the same sources the tests import, written once per test
process to a folder of its own, and run as `python3 <folder>/<entry>.pyz`."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from warmstart.manifests import pod_scripts

_FOLDER: Path | None = None


def artifact(key: str) -> Path:
    """The path of the built artifact `key` (`<entry>.pyz`), as a pod's ConfigMap volume holds it."""
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = Path(tempfile.mkdtemp(prefix="warmstart-pod-scripts-"))
        atexit.register(shutil.rmtree, _FOLDER, True)
    path = _FOLDER / key
    if not path.is_file():
        path.write_bytes(pod_scripts.build(key).blob)
        path.chmod(0o444)  # a ConfigMap volume is read-only
    return path
