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
  /usr/bin/promtool), fetched by name through the machine's own apt configuration:
  `apt-get download prometheus=<version>` into a temporary folder (after `apt-get update` only
  when apt does not know that version yet), checked against its pinned sha256, and promtool is
  taken out of it in pure Python (a .deb is an `ar` archive holding data.tar.xz); nothing is
  installed into the system. Where apt-get is absent, promtool is not installed and its tests
  skip naming what installs it (under WARMSTART_TOOLS_REQUIRED they fail).

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
import tempfile
import time
from pathlib import Path
from typing import NoReturn

INSTALL_COMMAND = ".venv/bin/python -m tests.install"
REQUIRED_ENV = "WARMSTART_TOOLS_REQUIRED"

CHECKOV_VERSION = "3.3.30"
INSTALL_TIMEOUT_S = 1200
LOCK_WAIT_S = INSTALL_TIMEOUT_S + 60

PROMTOOL_VERSION = "2.42.0+ds-5+deb12u1"
PROMTOOL_PACKAGE = "prometheus"
# sha256 of prometheus_2.42.0+ds-5+deb12u1_amd64.deb, measured when it was pinned (19 257 088 bytes).
DEB_SHA256 = "81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55"
PROMTOOL_MEMBER = "./usr/bin/promtool"
DOWNLOAD_TIMEOUT_S = 300
APT_DOWNLOAD = ["apt-get", "download", f"{PROMTOOL_PACKAGE}={PROMTOOL_VERSION}"]


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


class Unavailable(RuntimeError):
    """A tool that cannot be installed on this machine: the client that fetches it is absent."""


def _missing_client(name: str) -> str | None:
    """Why `tests.install` cannot install `name` here, with what would; None if it can."""
    if name == "promtool" and shutil.which("apt-get") is None:
        return (f"promtool comes from Debian's `{PROMTOOL_PACKAGE}` package and this machine has no apt-get: "
                f"on a Debian bookworm machine run `{INSTALL_COMMAND}` (it runs `{' '.join(APT_DOWNLOAD)}`), "
                f"or put prometheus {PROMTOOL_VERSION}'s promtool at {cache() / f'promtool-{PROMTOOL_VERSION}'}")
    return None


def require(name: str) -> Path:
    """The tool's path; else the test skips (or, under WARMSTART_TOOLS_REQUIRED, fails) naming
    the command that installs it."""
    found = WHERE[name]()
    if found is not None:
        return found
    import pytest

    why = _missing_client(name) or (
        f"{name} is not installed in {cache()} (WARMSTART_TOOLS_CACHE): run `{INSTALL_COMMAND}` once, with network")
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


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S,
                          env={**os.environ, "LC_ALL": "C"})


def apt_download(package: str, version: str, into: Path) -> Path:
    """`package`=`version` as a .deb in `into`, fetched by apt from the sources this machine has
    configured; `apt-get update` first only when apt does not know that version yet."""
    if _run(["apt-cache", "show", f"{package}={version}"]).returncode != 0:
        update = _run(["apt-get", "update"])
        if update.returncode != 0:
            raise RuntimeError(f"apt-get update failed ({update.returncode}): {update.stderr.strip()[-400:]}")
    with tempfile.TemporaryDirectory(dir=into, prefix=f".{package}-download-") as tmp:
        got = _run(["apt-get", "download", f"{package}={version}"], cwd=Path(tmp))
        debs = sorted(Path(tmp).glob("*.deb"))
        if got.returncode != 0 or len(debs) != 1:
            raise RuntimeError(f"`apt-get download {package}={version}` failed ({got.returncode}): "
                               f"{(got.stderr or got.stdout).strip()[-400:]}")
        target = into / debs[0].name
        debs[0].replace(target)
    return target


def install_promtool() -> Path:
    """promtool out of the pinned `prometheus` .deb (fetched once by apt, its sha256 checked)."""
    tools = cache()
    tools.mkdir(parents=True, exist_ok=True)
    binary = tools / f"promtool-{PROMTOOL_VERSION}"
    if binary.is_file():
        return binary
    why = _missing_client("promtool")
    if why:
        raise Unavailable(why)
    known = sorted(tools.glob(f"{PROMTOOL_PACKAGE}_*.deb"))
    deb = next((d for d in known if hashlib.sha256(d.read_bytes()).hexdigest() == DEB_SHA256), None)
    if deb is None:
        deb = apt_download(PROMTOOL_PACKAGE, PROMTOOL_VERSION, tools)
    data = deb.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != DEB_SHA256:
        deb.unlink()
        raise ValueError(f"{deb.name} from apt has sha256 {digest}, not the pinned {DEB_SHA256}")
    with tarfile.open(fileobj=io.BytesIO(ar_member(data, "data.tar")), mode="r:xz") as tar:
        extracted = tar.extractfile(tar.getmember(PROMTOOL_MEMBER))
        assert extracted is not None
        partial = binary.with_suffix(".partial")
        partial.write_bytes(extracted.read())
        partial.chmod(partial.stat().st_mode | stat.S_IXUSR)
        partial.replace(binary)
    return binary


INSTALL = {"checkov": install_checkov, "promtool": install_promtool}
