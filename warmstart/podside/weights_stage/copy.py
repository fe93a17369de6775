"""The weights stager's copier: the source's listing (s5cmd ls), the partial copy made safe to
resume, the sync that stops while a serving pod streams, the verification against a fresh
listing, and the promotion of a complete copy.

Part of weights_stage.py, whose docstring has the commands, the life of a copy, the faults and
the environment; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from .content import UNVERIFIABLE_MEMO
from .node import (
    fsync_path, write_file, fresh_dir, is_real_dir, parse_json, Pauses, read_small, remove, sanitize_tree, under,
    wait_while_loading,
)
from .settings import (
    COPIER_STOP_S, Deadline, MARKER, MARKER_FORMAT, MAX_MARKER_BYTES, Settings, SOURCE_SNAPSHOT, StageRefused,
    STDERR_TAIL,
)

def s5(settings: Settings, *args: str) -> list[str]:
    cmd = [settings.s5cmd, "--json"]
    if settings.endpoint:
        cmd += ["--endpoint-url", settings.endpoint]
    return [*cmd, *args]


def list_source(settings: Settings, deadline: Deadline) -> dict[str, dict[str, Any]]:
    """{relative key: {"size", "etag"}} of every object under the source prefix."""
    timeout = max(1.0, min(deadline.left(), 600))
    try:
        proc = subprocess.run(s5(settings, "ls", f"{settings.source}/*"), capture_output=True, text=True,
                              timeout=timeout, env=settings.child_env or None)
    except subprocess.TimeoutExpired:  # not a TimeoutError: it would be reported as an error
        raise TimeoutError(f"deadline reached while listing {settings.source} ({timeout:g} s)") from None
    if proc.returncode != 0:
        if "no object found" in (proc.stderr + proc.stdout).lower():
            return {}
        raise StageRefused(f"listing {settings.source} failed: {proc.stderr.strip()[-STDERR_TAIL:]}")
    prefix = settings.source + "/"
    out: dict[str, dict[str, Any]] = {}
    for line in proc.stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        key = str(item.get("key", ""))
        if item.get("type") != "file" or not key.startswith(prefix):
            continue
        rel = key[len(prefix):]
        if not rel or ".." in Path(rel).parts or rel.startswith("/"):
            raise StageRefused(f"unsafe object key {key!r}")
        # s5cmd omits "size" for an empty object (Go's omitempty on a zero value): an `__init__.py`
        # or a 0-byte marker is 0 bytes, not a KeyError.
        out[rel] = {"size": int(item.get("size") or 0), "etag": str(item.get("etag", "")).strip('"')}
    return out


def stop_copier(proc: subprocess.Popen, grace_s: float = COPIER_STOP_S) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # s5cmd runs in a session of its own
        except OSError:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                proc.kill()
            proc.wait(timeout=10)


def prepare_partial(settings: Settings, before: Mapping[str, Mapping[str, Any]]) -> None:
    """Make `<digest>.partial/` safe to resume into: a real directory; nothing in it the copier
    does not write (links, FIFOs); and no file of another source revision: the snapshot of the
    listing the copy in it was made from names every file's ETag, and a file whose ETag has
    changed since is removed (sync --size-only would keep a same-size file of the old revision).
    A partial copy without a snapshot is of unknown origin and starts over."""
    if is_real_dir(settings.partial):
        snap = parse_json(read_small(settings.partial / SOURCE_SNAPSHOT, MAX_MARKER_BYTES))
        if not isinstance(snap, dict):
            remove(settings.partial)
        else:
            sanitize_tree(settings.partial)
            for rel, meta in snap.items():
                now = before.get(rel)
                if not isinstance(meta, dict) or now is None or meta.get("etag") != now["etag"] \
                        or meta.get("size") != now["size"]:
                    if ".." not in Path(str(rel)).parts:
                        remove(settings.partial / str(rel))
    fresh_dir(settings.partial)
    write_file(settings.partial / SOURCE_SNAPSHOT, json.dumps(dict(before), sort_keys=True).encode())


def copy(settings: Settings, deadline: Deadline) -> float:
    """Sync the source into the partial directory; pause (stop s5cmd) while a serving pod
    streams. Returns the seconds paused. Raises on failure or deadline."""
    paused = 0.0
    pauses = Pauses(settings, deadline)
    cmd = s5(settings, "--numworkers", str(settings.workers), "sync", "--size-only",
              f"{settings.source}/*", f"{settings.partial}/")
    while True:
        paused += wait_while_loading(settings, deadline, pauses)
        if deadline.left() <= 0:
            raise TimeoutError("deadline reached before the copy finished")
        if not is_real_dir(settings.partial) or not under(settings.partial, settings.root):
            raise StageRefused(f"{settings.partial} was replaced during the copy")
        # stderr to an unnamed temporary file ($TMPDIR, the pod's scratch): a named file in
        # the node directory could be a planted link.
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                    env=settings.child_env or None)
            interrupted = None
            try:
                while proc.poll() is None:
                    if deadline.left() <= 0:
                        interrupted = "deadline"
                    elif pauses.active():
                        interrupted = "loading"
                    if interrupted:
                        stop_copier(proc)
                        break
                    time.sleep(min(settings.poll_s, max(0.01, deadline.left())))
            finally:
                stop_copier(proc)
            err.seek(0)
            stderr = err.read()[-STDERR_TAIL:]
        if interrupted == "deadline":
            raise TimeoutError("deadline reached during the copy")
        if interrupted == "loading":
            continue  # resume after the serving pod has loaded: sync skips the finished files
        if proc.returncode != 0:
            if "no space left" in stderr.lower():
                raise OSError(errno.ENOSPC, f"disk full during the copy: {stderr.strip()}")
            raise RuntimeError(f"s5cmd exited {proc.returncode}: {stderr.strip()}")
        return paused


def verify(settings: Settings, before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]) -> int:
    """The copy matches the source's fresh listing exactly; returns its bytes. Sizes AND ETags
    of the listings before and after the copy must agree: a source rewritten during the copy
    (a new import into the same prefix, same-size shards) is never promoted. Extra files in
    the partial directory (s5cmd's temporary files of a stopped copy) and anything the copier
    never writes (links, FIFOs) are removed first; every file must be a regular file whose
    path stays under the root."""
    def facts(listing: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[Any, Any]]:
        return {k: (v["size"], v.get("etag")) for k, v in listing.items()}

    if facts(before) != facts(after):
        old, new = facts(before), facts(after)
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise StageRefused(f"listing mismatch: the source changed during the copy ({', '.join(changed[:5])})")
    sanitize_tree(settings.partial)
    keep = set(after) | {SOURCE_SNAPSHOT, UNVERIFIABLE_MEMO}
    for dirpath, dirnames, filenames in os.walk(settings.partial, topdown=False, followlinks=False):
        for name in filenames:
            path = Path(dirpath) / name
            if path.relative_to(settings.partial).as_posix() not in keep:
                path.unlink(missing_ok=True)
        for name in dirnames:
            try:
                (Path(dirpath) / name).rmdir()
            except OSError:
                pass  # not empty
    total = 0
    for rel, meta in sorted(after.items()):
        p = settings.partial / rel
        try:
            st = os.lstat(p)
        except OSError:
            raise StageRefused(f"size mismatch: {rel} is missing from the copy") from None
        if not stat.S_ISREG(st.st_mode) or not under(p, settings.partial):
            raise StageRefused(f"{rel} in the copy is not a regular file under {settings.partial}")
        if st.st_size != meta["size"]:
            raise StageRefused(f"size mismatch: {rel} is {st.st_size} bytes, the source lists {meta['size']}")
        total += st.st_size
    return total


def promote(settings: Settings, listing: Mapping[str, Mapping[str, Any]], total: int, seconds: float,
            checked: Mapping[str, str] | None = None) -> None:
    files = [{"key": k, "size": v["size"], "etag": v["etag"]} | ({"checked": checked[k]} if checked and k in checked else {})
             for k, v in sorted(listing.items())]
    for f in files:
        fsync_path(settings.partial / f["key"])
    marker = {"format": MARKER_FORMAT, "digest": settings.digest, "source": settings.source, "files": files,
              "bytes": total, "seconds": round(seconds, 3),
              "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "completed_epoch": time.time()}
    write_file(settings.partial / MARKER, json.dumps(marker, sort_keys=True).encode())
    (settings.partial / SOURCE_SNAPSHOT).unlink(missing_ok=True)  # the marker says it all now
    (settings.partial / UNVERIFIABLE_MEMO).unlink(missing_ok=True)
    for d in sorted({(settings.partial / f["key"]).parent for f in files} | {settings.partial}, reverse=True):
        fsync_path(d, directory=True)
    if os.path.lexists(settings.final):  # an incomplete leftover (or a planted link): never a source
        remove(settings.final)
    os.rename(settings.partial, settings.final)
    fsync_path(settings.root, directory=True)
