"""The programs the suite runs besides Python packages, checkov and promtool: installed before
pytest starts (`python -m tests.install`, which `.ci/run` and the README's test command run),
never while the tests run.

One cache folder holds them all: `$WARMSTART_TOOLS_CACHE`, default `~/.cache/warmstart-tools`.
A test that needs a tool missing there skips and names the install command; with
`WARMSTART_TOOLS_REQUIRED=1` (set by `.ci/run`) it fails instead, so CI never goes green by
skipping. `WARMSTART_CHECKOV=/path/to/checkov` uses an existing checkov of the pinned version.

- checkov pins its own boto3, which conflicts with the project's, so it lives in a virtual
  environment of its own in the cache (`pip install checkov==CHECKOV_VERSION`, about a minute).
- promtool comes from Debian bookworm's `prometheus` package (2.42.0+ds-5+deb12u1, which ships
  /usr/bin/promtool): the .deb is downloaded from deb.debian.org, checked against its pinned
  sha256, and promtool is taken out of it in pure Python (a .deb is an `ar` archive holding
  data.tar.xz), with no apt and no root.

This module imports nothing beyond the standard library at import time: `tests.install` runs it
before pytest is installed.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import NoReturn

INSTALL_COMMAND = ".venv/bin/python -m tests.install"
REQUIRED_ENV = "WARMSTART_TOOLS_REQUIRED"

CHECKOV_VERSION = "3.3.30"
INSTALL_TIMEOUT_S = 1200
LOCK_WAIT_S = INSTALL_TIMEOUT_S + 60

PROMTOOL_VERSION = "2.42.0+ds-5+deb12u1"
DEB_URL = f"https://deb.debian.org/debian/pool/main/p/prometheus/prometheus_{PROMTOOL_VERSION}_amd64.deb"
# sha256 of that file, measured when it was pinned (19 257 088 bytes).
DEB_SHA256 = "81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55"
PROMTOOL_MEMBER = "./usr/bin/promtool"
DOWNLOAD_TIMEOUT_S = 120


def cache() -> Path:
    """The one folder every tool is installed in."""
    return Path(os.environ.get("WARMSTART_TOOLS_CACHE") or Path.home() / ".cache" / "warmstart-tools")


# --------------------------------------------------------------------------------------
# Where each tool is, when installed


def checkov() -> Path | None:
    given = os.environ.get("WARMSTART_CHECKOV")
    if given:
        return Path(given)
    venv = cache() / f"checkov-{CHECKOV_VERSION}"
    # The marker is written last, so an install that died half-way does not count.
    return venv / "bin" / "checkov" if (venv / ".installed").is_file() else None


def promtool() -> Path | None:
    binary = cache() / f"promtool-{PROMTOOL_VERSION}"
    return binary if binary.is_file() else None


WHERE = {"checkov": checkov, "promtool": promtool}


def require(name: str) -> Path:
    """The tool's path; else the test skips (or, under WARMSTART_TOOLS_REQUIRED, fails) naming
    the command that installs it."""
    found = WHERE[name]()
    if found is not None:
        return found
    import pytest

    why = f"{name} is not installed in {cache()} (WARMSTART_TOOLS_CACHE): run `{INSTALL_COMMAND}` once, with network"
    if os.environ.get(REQUIRED_ENV):
        _fail(pytest, why)
    pytest.skip(why)


def _fail(pytest, why: str) -> NoReturn:  # type: ignore[no-untyped-def]
    pytest.fail(f"{why} ({REQUIRED_ENV} is set, so a missing tool fails instead of skipping)", pytrace=False)


# --------------------------------------------------------------------------------------
# Installing them (tests.install)


def install_checkov() -> Path:
    """checkov CHECKOV_VERSION in its own virtual environment, under a file lock so two
    installers running at once install it once. (A virtual environment cannot be moved: its
    scripts name its path, so it is built in place.)"""
    tools = cache()
    tools.mkdir(parents=True, exist_ok=True)
    venv = tools / f"checkov-{CHECKOV_VERSION}"
    with open(tools / f"checkov-{CHECKOV_VERSION}.lock", "w") as lock:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:  # bounded: another installer holds the lock at most INSTALL_TIMEOUT_S
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"waited {LOCK_WAIT_S}s for another process installing checkov into {venv}")
                time.sleep(1)
        try:
            if not (venv / ".installed").is_file():
                shutil.rmtree(venv, ignore_errors=True)
                started = time.monotonic()
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
                subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                                "--disable-pip-version-check", f"checkov=={CHECKOV_VERSION}"],
                               check=True, timeout=INSTALL_TIMEOUT_S)
                (venv / ".installed").write_text(f"checkov=={CHECKOV_VERSION} in {time.monotonic() - started:.0f}s\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return venv / "bin" / "checkov"


def ar_member(archive: bytes, wanted_prefix: str) -> bytes:
    """One member of a Unix `ar` archive: 8-byte magic, then per member a 60-byte header
    (name 16, mtime 12, uid 6, gid 6, mode 8, size 10, magic 2) and the data, padded to even."""
    if not archive.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive")
    pos = 8
    while pos + 60 <= len(archive):
        header = archive[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        start = pos + 60
        if name.startswith(wanted_prefix):
            return archive[start:start + size]
        pos = start + size + (size % 2)
    raise KeyError(wanted_prefix)


def install_promtool() -> Path:
    """promtool out of the pinned Debian .deb (downloaded once, its sha256 checked)."""
    tools = cache()
    tools.mkdir(parents=True, exist_ok=True)
    binary = tools / f"promtool-{PROMTOOL_VERSION}"
    if binary.is_file():
        return binary
    deb = tools / DEB_URL.rsplit("/", 1)[-1]
    if not deb.is_file() or hashlib.sha256(deb.read_bytes()).hexdigest() != DEB_SHA256:
        partial = deb.with_suffix(".partial")
        deadline = time.monotonic() + DOWNLOAD_TIMEOUT_S
        with urllib.request.urlopen(DEB_URL, timeout=DOWNLOAD_TIMEOUT_S) as resp, partial.open("wb") as out:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"download of {DEB_URL} exceeded {DOWNLOAD_TIMEOUT_S} s")
        partial.replace(deb)
    data = deb.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != DEB_SHA256:
        raise ValueError(f"{deb} has sha256 {digest}, not the pinned {DEB_SHA256}")
    with tarfile.open(fileobj=io.BytesIO(ar_member(data, "data.tar")), mode="r:xz") as tar:
        extracted = tar.extractfile(tar.getmember(PROMTOOL_MEMBER))
        assert extracted is not None
        partial = binary.with_suffix(".partial")
        partial.write_bytes(extracted.read())
        partial.chmod(partial.stat().st_mode | stat.S_IXUSR)
        partial.replace(binary)
    return binary


INSTALL = {"checkov": install_checkov, "promtool": install_promtool}
