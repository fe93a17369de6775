"""`python -m tests.install`: everything the test suite needs, before pytest starts.

Run by the README's test command and by `.ci/run`, into the virtual environment that runs it:

1. the pinned torch (`pyproject.toml`'s `test` extra names it), alone and without its
   dependencies (they come in step 2), by name through pip as this machine configures it (its
   index, extra indexes and find-links). The tests need only torch's CPU build; PyPI's Linux
   wheel is the CUDA build, gigabytes of GPU libraries the tests never use, so a machine that
   should not fetch it offers the CPU wheel to pip (the project's test machines carry it in
   pip's find-links) or sets `TORCH_INDEX_URL` to an index that serves it (PyTorch publishes a
   CPU-only one: https://pytorch.org/get-started/locally/), used for torch alone;
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
TORCH_INDEX_ENV = "TORCH_INDEX_URL"


def torch_requirement() -> str:
    """`torch==X` as the test extra pins it: the one place the version is written."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    return next(d for d in extras if d.startswith("torch=="))


def torch_install_args(environ: dict[str, str] | None = None) -> list[str]:
    """pip's arguments for torch: by name, as pip is configured; `--index-url` only when
    TORCH_INDEX_URL asks for another index."""
    index = (os.environ if environ is None else environ).get(TORCH_INDEX_ENV, "").strip()
    return ["--no-deps", torch_requirement(), *(["--index-url", index] if index else [])]


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                   cwd=ROOT, check=True)


def main() -> None:
    started = time.monotonic()
    # torch alone (--no-deps): its dependencies come with the test extras next.
    _pip(*torch_install_args())
    _pip("-e", ".[test]")
    for name, install in tools.INSTALL.items():
        try:
            print(f"{name}: {install()}")
        except tools.Unavailable as why:
            # Its tests skip saying so (or fail under WARMSTART_TOOLS_REQUIRED).
            print(f"{name}: not installed: {why}")
    print(f"test dependencies installed in {time.monotonic() - started:.0f}s; tools in {tools.cache()}")


if __name__ == "__main__":
    main()
