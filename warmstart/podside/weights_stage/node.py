"""The weights stager's node directory, which anything with write access to it can plant files
in: bounded reads that never follow a link or block, removal that never follows a link, atomic
writes, the node lock, serving pods' pause requests, the completion marker and the collection of
old versions.

Part of weights_stage.py, whose docstring has the commands, the life of a copy, the faults and
the environment; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Any, Mapping

from ..common.shared import parse_json as _parse_json, read_regular
from .settings import (
    Deadline, LOADING_DIR, LOCK_FILE, MARKER, MARKER_FORMAT, MAX_JSON_DEPTH, MAX_MARKER_BYTES, MAX_PAUSE_FILE_BYTES,
    MAX_PAUSE_FILES, PARTIAL_SUFFIX, Settings, StageRefused,
)

def read_small(path: Path, limit: int, dir_fd: int | None = None) -> bytes | None:
    """The bytes of a regular file of at most `limit` bytes; None for anything else. Opened
    without following a symbolic link (O_NOFOLLOW) and without blocking (O_NONBLOCK: a planted
    FIFO would block an open for reading until a writer came), checked to be a regular file
    before a byte is read, and never read past `limit`."""
    raw = read_regular(path, limit, dir_fd)
    return raw if isinstance(raw, bytes) else None


def parse_json(raw: bytes | None) -> Any | None:
    """A JSON document, or None for anything that is not one: absent, not UTF-8, not JSON, cut
    short, or nested deeper than MAX_JSON_DEPTH (refused before Python's recursion limit)."""
    if raw is None:
        return None
    doc, why = _parse_json(raw, MAX_JSON_DEPTH)
    return None if why else doc


def _lexists_not_dir(path: Path) -> bool:
    try:
        return not stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def is_real_dir(path: Path) -> bool:
    """A directory itself, not a symbolic link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def remove(path: Path) -> None:
    """Remove a directory tree, or a single entry of any other kind (a symbolic link is removed
    itself, never its target: rmtree does not follow links inside the tree either)."""
    try:
        if is_real_dir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def under(path: Path, root: Path) -> bool:
    """Whether `path`, every link resolved, is inside `root`."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or real.startswith(base.rstrip("/") + "/")


def sanitize_tree(top: Path) -> list[str]:
    """Remove what the copier never writes from a copy directory: symbolic links, FIFOs,
    sockets, devices (walked without following links). Returns what was removed."""
    removed = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in list(dirnames) + filenames:
            p = Path(dirpath) / name
            try:
                mode = os.lstat(p).st_mode
            except OSError:
                continue
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                remove(p)
                removed.append(str(p.relative_to(top)))
                if name in dirnames:
                    dirnames.remove(name)
    return removed


def fresh_dir(path: Path) -> None:
    """`path` as a real directory: a symbolic link or other entry planted under its name is
    removed first (the copy never lands outside the root)."""
    if _lexists_not_dir(path):
        remove(path)
    path.mkdir(parents=True, exist_ok=True)
    if not is_real_dir(path):
        raise StageRefused(f"{path} is not a directory")


def loading_pods(settings: Settings, now: float | None = None) -> list[str]:
    """Pause requests of serving pods on this node that are streaming from S3 right now;
    expired requests are removed. Each request counts for at most WARMSTART_MAX_PAUSE_S past
    its file's modification time and past now, whatever its `until` says (a skewed clock, a
    planted `Infinity`). `.loading` is opened without following a link and read through its
    descriptor, so a planted link never makes this delete files elsewhere; entries other than
    small regular files are removed unread."""
    d = settings.root / LOADING_DIR
    now = time.time() if now is None else now
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            remove(d)  # a planted link or file under the name: the link itself goes
        return []
    active = []
    try:
        for name in sorted(os.listdir(fd))[:MAX_PAUSE_FILES]:
            try:
                st = os.lstat(name, dir_fd=fd)
            except OSError:
                continue
            doc = parse_json(read_small(Path(name), MAX_PAUSE_FILE_BYTES, dir_fd=fd)) \
                if stat.S_ISREG(st.st_mode) else None
            try:
                until = float(doc.get("until", 0)) if isinstance(doc, dict) else 0.0
            except (TypeError, ValueError):
                until = 0.0
            if math.isnan(until):  # garbage, like any other malformed request: dropped
                until = 0.0
            elif math.isinf(until):  # a planted Infinity: counts for the cap below, no longer
                until = now + settings.max_pause_s if until > 0 else 0.0
            until = min(until, st.st_mtime + settings.max_pause_s, now + settings.max_pause_s)
            if until > now:
                active.append(name.removesuffix(".json"))
            elif not stat.S_ISDIR(st.st_mode):
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
    except OSError:
        return sorted(active)
    finally:
        os.close(fd)
    return sorted(active)


class Pauses:
    """The pause budget of one attempt: serving pods' requests hold the copy back for at most
    half the attempt's deadline in all, so requests that keep coming (or one that never ends)
    cannot defer staging for the whole deadline on every attempt."""

    def __init__(self, settings: Settings, deadline: Deadline) -> None:
        self.settings, self.budget, self.used = settings, max(0.0, deadline.left() / 2), 0.0
        self._since: float | None = None

    def active(self) -> list[str]:
        """The live requests while the budget lasts (the budget is wall-clock time spent
        paused, counted from the first live request of each pause)."""
        if self.used >= self.budget:
            return []
        pods = loading_pods(self.settings)
        now = time.monotonic()
        if self._since is not None:
            self.used += now - self._since
        self._since = now if pods else None
        return pods if self.used < self.budget else []


def wait_while_loading(settings: Settings, deadline: Deadline, pauses: Pauses | None = None) -> float:
    """Seconds spent waiting for serving pods' streaming to finish (bounded by the deadline and
    the attempt's pause budget)."""
    pauses = pauses or Pauses(settings, deadline)
    start = time.monotonic()
    while pauses.active() and deadline.left() > 0:
        time.sleep(min(settings.poll_s, max(0.0, deadline.left())))
    return time.monotonic() - start


def write_file(path: Path, data: bytes) -> None:
    """Write a small file atomically (temporary name, fsync, rename), never through a link
    planted under either name."""
    tmp = path.with_name(f".{path.name}.tmp")
    if _lexists_not_dir(tmp) or is_real_dir(tmp):
        remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_marker(directory: Path) -> dict[str, Any] | None:
    if not is_real_dir(directory):
        return None
    marker = parse_json(read_small(directory / MARKER, MAX_MARKER_BYTES))
    return marker if isinstance(marker, dict) and marker.get("format") == MARKER_FORMAT else None


def complete(settings: Settings) -> bool:
    """The current digest is staged: marker present, for this source, and every file a regular
    file under the copy with its recorded size."""
    marker = read_marker(settings.final)
    if not marker or marker.get("digest") != settings.digest or marker.get("source") != settings.source:
        return False
    files = marker.get("files")
    if not isinstance(files, list) or not files:
        return False
    for f in files:
        try:
            key = str(f["key"])
            if not key or key.startswith("/") or ".." in Path(key).parts:
                return False
            st = os.lstat(settings.final / key)
            if not stat.S_ISREG(st.st_mode) or st.st_size != f["size"] or not under(settings.final / key, settings.final):
                return False
        except (OSError, KeyError, TypeError):
            return False
    return True


def collect_garbage(settings: Settings) -> list[str]:
    """Remove every version but the current one and the newest previous complete one, and
    stale partial copies of other digests. Called only once the current one is complete."""
    removed = []
    previous: list[tuple[float, Path]] = []
    for p in settings.root.iterdir():
        if p.name.startswith(".") or p == settings.final:
            continue
        if not is_real_dir(p):
            if p.is_symlink():  # a planted link among the versions: the link goes, never its target
                remove(p)
                removed.append(p.name)
            continue
        if p.name.endswith(PARTIAL_SUFFIX):
            if p != settings.partial:
                remove(p)
                removed.append(p.name)
            continue
        marker = read_marker(p)
        try:
            epoch = float(marker.get("completed_epoch", 0)) if marker else -1.0
        except (TypeError, ValueError):
            epoch = -1.0
        previous.append((epoch if math.isfinite(epoch) else -1.0, p))
    previous.sort(reverse=True)
    for _, p in previous[1:]:
        remove(p)
        removed.append(p.name)
    if previous and previous[0][0] < 0:  # not a complete version: nothing to roll back to
        remove(previous[0][1])
        removed.append(previous[0][1].name)
    return sorted(removed)


def check_space(settings: Settings, listing: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a copy that would leave less than the eviction threshold free."""
    have = 0
    for rel, meta in listing.items():
        try:
            st = os.lstat(settings.partial / rel)
            if stat.S_ISREG(st.st_mode) and st.st_size == meta["size"]:
                have += meta["size"]
        except OSError:
            pass
    need = sum(m["size"] for m in listing.values()) - have
    try:
        st = os.statvfs(settings.root)
    except OSError as exc:  # EIO from a failing disk: no copy onto a disk whose space is unknown
        raise StageRefused(f"disk: cannot read the free space of {settings.root} ({exc}); "
                           "the copy is refused and its partial copy removed") from None
    free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    keep = int(size * settings.min_free_share)
    if free - need < keep:
        raise StageRefused(f"disk: the copy needs {need} more bytes, {free} are free and {keep} must stay free "
                           f"({settings.min_free_share:.0%} of {size}, the kubelet's eviction threshold)")


class NodeLock:
    """One stager per model per node (a restarted container, a second pod during a rollout)."""

    def __init__(self, root: Path, deadline: Deadline) -> None:
        self.path, self.deadline, self.fd = root / LOCK_FILE, deadline, -1

    def _open(self) -> int:
        flags = os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            fd = -1
        if fd >= 0 and stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        if fd >= 0:
            os.close(fd)
        remove(self.path)  # a planted link, FIFO or directory under the lock's name
        return os.open(self.path, flags | os.O_EXCL, 0o644)

    def __enter__(self) -> "NodeLock":
        self.fd = self._open()
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if self.deadline.left() <= 0:
                    os.close(self.fd)
                    raise TimeoutError("another stager holds the node lock") from None
                time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
