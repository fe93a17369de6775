"""`python -m tests.install`: everything the test suite needs, before pytest starts.

Run by the README's test command and by `.ci/run`, into the virtual environment that runs it:

1. the pinned torch (`pyproject.toml`'s `test` extra names it) as the CPU build, alone, from
   PyTorch's CPU index (https://pytorch.org/get-started/locally/): PyPI's Linux wheel is the CUDA
   build, gigabytes of GPU libraries the tests never use. Only torch comes from that index, without
   its dependencies (they come from PyPI in step 2); `TORCH_INDEX_URL` names another (a mirror);
2. the project with its `test` extra, from pyproject.toml's pins;
3. checkov and promtool into the tools cache (tests/support/tools.py).

Already installed parts are kept, so a second run takes seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from tests.support import tools

ROOT = Path(__file__).resolve().parent.parent
TORCH_INDEX_URL = os.environ.get("TORCH_INDEX_URL", "https://download.pytorch.org/whl/cpu")


def torch_requirement() -> str:
    """`torch==X` as the test extra pins it: the one place the version is written."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    return next(d for d in extras if d.startswith("torch=="))


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                   cwd=ROOT, check=True)


def main() -> None:
    started = time.monotonic()
    # torch alone (--no-deps): its dependencies come from PyPI with the test extras next.
    _pip("--no-deps", torch_requirement(), "--index-url", TORCH_INDEX_URL)
    _pip("-e", ".[test]")
    for name, install in tools.INSTALL.items():
        print(f"{name}: {install()}")
    print(f"test dependencies installed in {time.monotonic() - started:.0f}s; tools in {tools.cache()}")


if __name__ == "__main__":
    main()
