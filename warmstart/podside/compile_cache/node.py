"""The compile-cache tool's node-local state in <cache dir>/.warmstart/: locks, markers, temp files.

Part of compile_cache.py, whose docstring has the commands, the environment and the object
layout; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path, PurePosixPath
from typing import Any

from .outcome import Outcome
from .settings import CacheError, Settings, STALE_TEMP_S

# --------------------------------------------------------------------------------------------
# Node-local state: lock, markers, temp files


class LockTimeout(CacheError):
    pass


class FileLock:
    """An exclusive flock on a file in <cache dir>/.warmstart/, shared by every pod on the node.

    flock is per open file description and released by the kernel when the holder dies, so a
    killed pod never leaves the node locked. The files are never removed: a waiter would then
    lock an unlinked inode while a newcomer locks a new file.
    """

    def __init__(self, path: Path, timeout_s: float, what: str = "the node lock"):
        self.path = path
        self.timeout_s = timeout_s
        self.what = what
        self.fd: int | None = None

    def __enter__(self) -> "FileLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise LockTimeout(f"another pod held {self.what} {self.path} for over {self.timeout_s:g} s")
                time.sleep(0.05)
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def NodeLock(state_dir: Path, timeout_s: float) -> FileLock:  # noqa: N802 - the name callers know
    return FileLock(state_dir / "lock", timeout_s)


def acquire(lock: FileLock, outcome: "Outcome") -> FileLock | None:
    """`lock`, held; or None, with the outcome `skipped`, when another pod kept it too long
    (that pod is doing the same work, or vLLM compiles as it would without this tool)."""
    lock.path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return lock.__enter__()
    except LockTimeout as exc:
        outcome.result, outcome.reason = "skipped", str(exc)
        return None


def lock_node(settings: Settings, outcome: "Outcome") -> FileLock | None:
    return acquire(NodeLock(settings.state_dir, settings.lock_timeout_s), outcome)


def key_digest(key: str) -> str:
    return PurePosixPath(key).name.split(".")[0]


def node_marker(settings: Settings, kind: str, key: str) -> Path:
    return settings.state_dir / f"{kind}-{key_digest(key)}.json"


def node_has(settings: Settings, key: str) -> str | None:
    """Why this node already holds the cache for `key`, or None."""
    if node_marker(settings, "restored", key).exists():
        return "restored on this node before"
    if node_marker(settings, "published", key).exists():
        return "compiled and published from this node"
    return None


def node_has_any(settings: Settings) -> bool:
    """Whether the node holds a restored or published marker of any key (a hit is possible)."""
    try:
        with os.scandir(settings.state_dir) as entries:
            return any(e.name.startswith(("restored-", "published-")) for e in entries)
    except FileNotFoundError:
        return False  # a new node
    except OSError:
        return True  # unreadable: assume it may, and build the client only when needed


def write_json_atomic(path: Path, value: Any) -> None:
    tmp = path.with_name(f"tmp-json-{secrets.token_hex(6)}-{path.name}")
    try:
        tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class Compiling:
    """`compiling-<key hash>-<token>.lock`, flocked while this pod's vLLM has not yet answered
    /health, i.e. while it may still be writing the key's cache files (vLLM writes some of them
    in place). Created under a temp name and renamed once locked, so a peer never sees it
    unlocked while its holder lives."""

    def __init__(self, settings: Settings, key_hash: str):
        token = secrets.token_hex(6)
        tmp = settings.state_dir / f"tmp-lease-{token}"
        self.path = settings.state_dir / f"compiling-{key_hash}-{token}.lock"
        self.fd: int | None = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            os.rename(tmp, self.path)
        except BaseException:
            os.close(self.fd)
            tmp.unlink(missing_ok=True)
            raise

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None


def compiling_peers(settings: Settings, key_hash: str) -> int:
    """How many other pods on the node still compile this key (their lease is held). Leases
    of dead pods (flock free) are removed on the way."""
    alive = 0
    for path in settings.state_dir.glob(f"compiling-{key_hash}-*.lock"):
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                alive += 1
                continue
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return alive


_KEYED_TEMP = re.compile(r"^tmp-(restore|publish)-([0-9a-f]{64})-")


_LEASE_OF = {"restore": "fetch", "publish": "publish"}


def clean_stale_temp(settings: Settings, own: tuple[str, str]) -> None:
    """Temp files of dead pods. A keyed temp (`tmp-<restore|publish>-<key hash>-...`) belongs to
    the holder of that key's lease: it is removed when the caller holds that lease itself (`own`,
    so the file is a dead holder's) or can take it (nobody holds it). Any other temp is removed
    once it is older than an hour: nothing this tool writes lives that long."""
    now = time.time()
    for entry in settings.state_dir.glob("tmp-*"):
        m = _KEYED_TEMP.match(entry.name)
        if m is None:
            try:
                if now - entry.lstat().st_mtime > STALE_TEMP_S:
                    remove_path(entry)
            except FileNotFoundError:
                pass
            continue
        if (m[1], m[2]) == own:
            remove_path(entry)
            continue
        lease = FileLock(settings.state_dir / f"{_LEASE_OF[m[1]]}-{m[2]}.lock", 0)
        try:
            with lease:
                remove_path(entry)
        except LockTimeout:
            pass  # its owner is alive


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
