#!/usr/bin/env python3
"""Stage one model version's weights on this node's NVMe, and say so with a node label.

Runs in the model's own image (standard library, and the image's boto3 for HeadObject where it
has one; the copier is the s5cmd binary an init container copies in), in a DaemonSet pod on
every GPU node of a pool:

    python3 /opt/warmstart/weights_stage.py stage   # init container: one staging attempt
    python3 /opt/warmstart/weights_stage.py hold    # main container: label, watch, retry, unlabel

Nothing here can fail a deploy or a node: every outcome is one JSON line and exit status 0. A
node without a complete copy simply has no label, and its serving pods stream from S3.

Life of a copy (all under WARMSTART_WEIGHTS_ROOT = the node's `<nvme>/weights/<model>`):
1. list the source (`s5cmd ls`); refuse an empty listing or one without safetensors;
2. check free space: the copy must leave the kubelet's eviction threshold free, or it is
   refused before a byte is written (no DiskPressure, the previous copy untouched);
3. wait while a serving pod on this node streams from S3 (it writes `.loading/<uid>.json`,
   see weights_select.py): the first pod on a new node keeps the whole network link;
4. `s5cmd sync --size-only` into `<digest>.partial/`, stopped (and later resumed, sync skips
   what is complete) whenever a serving pod starts streaming, under an overall deadline; the
   listing the copy is made from is kept in the partial directory, and a resume first drops
   files whose ETag has changed since (same-size shards of another revision);
5. verify against a FRESH listing: same keys, sizes AND ETags as before the copy (a source
   rewritten during the copy is refused), every file a regular file with its size, and nothing
   else (s5cmd's temporary files, planted links and FIFOs are removed);
6. check the content against what S3 vouches for (check_content): the import manifest's sha256
   where it names the file with this ETag, else S3's ChecksumSHA256, else the ETag recomputed
   from the bytes where S3 computed it from them (not SSE-KMS or SSE-C: HeadObject says): the
   MD5, or the MD5 of the parts' MD5s for a multipart object, its part size known (manifest,
   S3's PartsCount) or derived as S3 clients choose it; a mismatch is refused and the copy
   dropped; a file nothing vouches for is "unverifiable", handled per WARMSTART_CONTENT_CHECK
   and never copied again for it;
7. write `.warmstart-complete.json` (keys, sizes, ETags, how each was checked, bytes, seconds),
   fsync every file and the directory, rename `<digest>.partial` -> `<digest>`;
8. garbage-collect: keep the current digest and the newest previous complete one (a rollback),
   remove older ones and stale partials of other digests. Nothing is removed before step 7.
A failed or interrupted attempt never renames: a partial copy is never used. A mismatch or a
full disk (during the copy or at the marker) removes the partial copy; a deadline, a signal or a
failed s5cmd run keeps it to be resumed.

Under faults (anything that can write the node directory can plant files in it): every read
there is opened without following links and without blocking (O_NOFOLLOW | O_NONBLOCK), must be
a regular file, and is bounded (a marker at 1 MiB, a pause request at 4 KiB, 256 requests);
`.loading` is read through its own descriptor, so a planted link never makes the stager delete
elsewhere; `<digest>.partial` and `<digest>` are real directories under the root (a planted link
is removed, never followed). A pause request counts for at most WARMSTART_MAX_PAUSE_S past its
file's time and now, and pauses take at most half of an attempt's deadline. SIGTERM: s5cmd gets
2 s, the unlabel call 5 s, inside the pod's 30 s grace period.

Environment:

    WARMSTART_WEIGHTS_SOURCE     s3://bucket/prefix of the version. Required.
    WARMSTART_WEIGHTS_DIGEST     its digest (the directory and label value). Required.
    WARMSTART_WEIGHTS_ROOT       the model's node weights directory. Default /weights.
    WARMSTART_S5CMD              the copier. Default /opt/s5cmd/s5cmd.
    WARMSTART_STAGE_DEADLINE_S   overall deadline of one attempt (listing, waits, copy). Default 3600.
    WARMSTART_STAGE_WORKERS      s5cmd --numworkers. Default 64.
    WARMSTART_MIN_FREE_SHARE     share of the filesystem that must stay free. Default 0.15.
    WARMSTART_POLL_S             how often pause requests are checked. Default 1.
    WARMSTART_MAX_PAUSE_S        the longest one pause request counts for. Default 1200.
    WARMSTART_CONTENT_CHECK      (the stack key models[].nodeCacheContentCheck) `auto` (default):
                                 step 6, an unverifiable file kept on its size and ETag agreement
                                 and named in the outcome line; `etag`, `sha256`: an unverifiable
                                 file (`sha256`: one without a sha256) refuses the copy, which is
                                 kept, logged once; `size`: sizes and ETag agreement only.
    WARMSTART_RETRY_S            hold: wait between failed attempts. Default 300.
    WARMSTART_LABEL              node label key, e.g. weights.warmstart.io/<model>. Empty: no label.
    WARMSTART_KUBE_API           API server URL. Default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
    WARMSTART_SA_DIR             service-account token dir. Default /var/run/secrets/kubernetes.io/serviceaccount.
    NODE_NAME, POD_NAME, POD_UID, POD_NAMESPACE   downward API.
    AWS_ENDPOINT_URL             passed to s5cmd as --endpoint-url (tests, S3-compatible stores).

Log line, one per outcome, on stdout:

    {"event":"warmstart.weights_stage","phase":"stage","result":"staged","digest":"...","bytes":1,
     "files":1,"seconds":1.0,"paused_s":0.0,"reason":null}

    stage results: staged | present (already complete) | refused (listing, size, ETag, content,
                   space, unverifiable) | deferred
                   (deadline while waiting) | error
    label results: labelled | unlabelled | skipped | error
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import signal
import ssl
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping

if __package__:  # imported as warmstart.podside.* (the tests, the renderer)
    from .podside_common import emit_line, make_s3_client, parse_json as _parse_json, read_regular
else:  # run as a file from the ConfigMap's folder: flat modules. `python3 <folder>/<script>.py` puts
    # the folder first on sys.path, runpy.run_path(<script>) does not: the insert covers both.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from podside_common import emit_line, make_s3_client, parse_json as _parse_json, read_regular

EVENT = "warmstart.weights_stage"
MARKER = ".warmstart-complete.json"
MARKER_FORMAT = "warmstart-weights-stage/1"
LOADING_DIR = ".loading"
LOCK_FILE = ".lock"
PARTIAL_SUFFIX = ".partial"
SOURCE_SNAPSHOT = ".warmstart-source.json"
"""In `<digest>.partial/`: the listing (keys, sizes, ETags) the copy in it was made from, so a
resumed copy drops files of another source revision that `sync --size-only` would keep."""
IMPORT_MANIFEST = "warmstart-manifest.json"
"""The weights import's manifest in the source prefix (warmstart/podside/weights_import.py):
per-file sha256 (Hub imports) and the part size of its multipart copies."""
# Bounds on what is read from the node directory, which anything with write access to it can
# plant files in: a marker of a 1,000-file model is about 100 KB; json.loads of a document
# takes up to ~30x its size in memory, so 1 MiB stays far inside the containers' limits.
MAX_MARKER_BYTES = 1 << 20
MAX_PAUSE_FILE_BYTES = 4096
MAX_PAUSE_FILES = 256
MAX_JSON_DEPTH = 32
MIB = 1 << 20
ETAG_MD5 = re.compile(r"^[0-9a-f]{32}$")
ETAG_MULTIPART = re.compile(r"^(?P<md5>[0-9a-f]{32})-(?P<parts>[1-9][0-9]{0,4})$")
# A planted stager or copier must finish with margin inside terminationGracePeriodSeconds (30 s):
# s5cmd gets this long after SIGTERM, the unlabel call this long in all.
COPIER_STOP_S = 2.0
UNLABEL_TIMEOUT_S = 5.0
NFD_API = "nfd.k8s-sigs.io/v1alpha1"
NFD_NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"
_STDERR_TAIL = 2000


class StageRefused(RuntimeError):
    """An expected refusal with a reason worth one log line."""


@dataclasses.dataclass(frozen=True)
class Settings:
    source: str
    digest: str
    root: Path
    s5cmd: str
    deadline_s: float
    workers: int
    min_free_share: float
    poll_s: float
    retry_s: float
    label: str
    max_pause_s: float
    content_check: str
    kube_api: str
    sa_dir: Path
    node: str
    pod: str
    pod_uid: str
    namespace: str
    endpoint: str
    child_env: dict[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    """The environment the copier runs with (the one read here: AWS credentials, region)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env

        def get(name: str, default: str = "") -> str:
            return env.get(name, "").strip() or default

        source = get("WARMSTART_WEIGHTS_SOURCE").rstrip("/")
        digest = get("WARMSTART_WEIGHTS_DIGEST")
        if not source.startswith("s3://") or not digest or "/" in digest or digest.startswith("."):
            raise StageRefused("WARMSTART_WEIGHTS_SOURCE (s3://...) and WARMSTART_WEIGHTS_DIGEST must be set")
        host, port = get("KUBERNETES_SERVICE_HOST"), get("KUBERNETES_SERVICE_PORT", "443")
        if get("WARMSTART_CONTENT_CHECK", "auto").lower() not in CONTENT_CHECKS:
            raise StageRefused(f"WARMSTART_CONTENT_CHECK={get('WARMSTART_CONTENT_CHECK')!r} is not one of "
                               f"{', '.join(CONTENT_CHECKS)} (models[].nodeCacheContentCheck)")
        return cls(
            source=source, digest=digest, root=Path(get("WARMSTART_WEIGHTS_ROOT", "/weights")),
            s5cmd=get("WARMSTART_S5CMD", "/opt/s5cmd/s5cmd"),
            deadline_s=float(get("WARMSTART_STAGE_DEADLINE_S", "3600")),
            workers=int(get("WARMSTART_STAGE_WORKERS", "64")),
            min_free_share=float(get("WARMSTART_MIN_FREE_SHARE", "0.15")),
            poll_s=max(0.05, float(get("WARMSTART_POLL_S", "1"))),
            retry_s=max(1.0, float(get("WARMSTART_RETRY_S", "300"))),
            label=get("WARMSTART_LABEL"),
            max_pause_s=max(0.0, float(get("WARMSTART_MAX_PAUSE_S", "1200"))),
            content_check=get("WARMSTART_CONTENT_CHECK", "auto").lower(),
            kube_api=get("WARMSTART_KUBE_API", f"https://{host}:{port}" if host else ""),
            sa_dir=Path(get("WARMSTART_SA_DIR", "/var/run/secrets/kubernetes.io/serviceaccount")),
            node=get("NODE_NAME"), pod=get("POD_NAME"), pod_uid=get("POD_UID"),
            namespace=get("POD_NAMESPACE"), endpoint=get("AWS_ENDPOINT_URL"), child_env=dict(env))

    @property
    def final(self) -> Path:
        return self.root / self.digest

    @property
    def partial(self) -> Path:
        return self.root / f"{self.digest}{PARTIAL_SUFFIX}"


def emit(record: Mapping[str, Any]) -> None:
    emit_line({"event": EVENT, **record}, sort_keys=True)


# --------------------------------------------------------------------------------------------
# The copier


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def _s5(settings: Settings, *args: str) -> list[str]:
    cmd = [settings.s5cmd, "--json"]
    if settings.endpoint:
        cmd += ["--endpoint-url", settings.endpoint]
    return [*cmd, *args]


def list_source(settings: Settings, deadline: Deadline) -> dict[str, dict[str, Any]]:
    """{relative key: {"size", "etag"}} of every object under the source prefix."""
    timeout = max(1.0, min(deadline.left(), 600))
    try:
        proc = subprocess.run(_s5(settings, "ls", f"{settings.source}/*"), capture_output=True, text=True,
                              timeout=timeout, env=settings.child_env or None)
    except subprocess.TimeoutExpired:  # not a TimeoutError: it would be reported as an error
        raise TimeoutError(f"deadline reached while listing {settings.source} ({timeout:g} s)") from None
    if proc.returncode != 0:
        if "no object found" in (proc.stderr + proc.stdout).lower():
            return {}
        raise StageRefused(f"listing {settings.source} failed: {proc.stderr.strip()[-_STDERR_TAIL:]}")
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


# --------------------------------------------------------------------------------------------
# Reading the node directory: anything with write access to it can plant files there


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


def _stop(proc: subprocess.Popen, grace_s: float = COPIER_STOP_S) -> None:
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
    _write_file(settings.partial / SOURCE_SNAPSHOT, json.dumps(dict(before), sort_keys=True).encode())


def _write_file(path: Path, data: bytes) -> None:
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


def copy(settings: Settings, deadline: Deadline) -> float:
    """Sync the source into the partial directory; pause (stop s5cmd) while a serving pod
    streams. Returns the seconds paused. Raises on failure or deadline."""
    paused = 0.0
    pauses = Pauses(settings, deadline)
    cmd = _s5(settings, "--numworkers", str(settings.workers), "sync", "--size-only",
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
                        _stop(proc)
                        break
                    time.sleep(min(settings.poll_s, max(0.01, deadline.left())))
            finally:
                _stop(proc)
            err.seek(0)
            stderr = err.read()[-_STDERR_TAIL:]
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


# --------------------------------------------------------------------------------------------
# Content: what S3 can vouch for


@dataclasses.dataclass(frozen=True)
class ObjectFacts:
    """What HeadObject says of one source object (None: not asked, or not answered)."""

    sse: str | None = None
    """`ServerSideEncryption`: `AES256` (SSE-S3), `aws:kms`, `aws:kms:dsse`, or None."""
    customer_key: bool = False
    """SSE-C (`SSECustomerAlgorithm`): the ETag is not an MD5 either."""
    parts: int | None = None
    """`PartsCount` (HeadObject with PartNumber=1): the object's multipart part count."""
    first_part: int | None = None
    """With `parts`: the first part's bytes (that HeadObject's ContentLength)."""
    sha256: str | None = None
    """`ChecksumSHA256` (HeadObject with ChecksumMode=ENABLED): base64, `-<parts>` when composite."""
    error: str | None = None
    """Why HeadObject could not be read (no boto3 in the image, access denied, ...)."""

    @property
    def etag_is_md5(self) -> bool | None:
        """Whether S3 computed the ETag from the bytes: SSE-S3 and unencrypted objects only
        (https://docs.aws.amazon.com/AmazonS3/latest/API/API_Object.html, "ETag"). None: unknown."""
        if self.error is not None:
            return None
        return not self.customer_key and self.sse not in ("aws:kms", "aws:kms:dsse")


def _split_source(source: str) -> tuple[str, str]:
    bucket, _, prefix = source.removeprefix("s3://").partition("/")
    return bucket, prefix


def s3_client(settings: Settings) -> tuple[Any, str | None]:
    """A boto3 S3 client with the copier's credentials (the vLLM image has boto3, for the Run:ai
    streamer), or (None, why not). Only HeadObject is called: s3:GetObject, which the copy
    needs anyway."""
    env = settings.child_env or os.environ
    keys = {}
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        keys = {"aws_access_key_id": env["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
                "aws_session_token": env.get("AWS_SESSION_TOKEN") or None}
    try:
        # The endpoint and keys of the environment the settings were read from, which is not
        # always the process's (the copier runs with it too).
        client = make_s3_client(region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
                                endpoint_url=settings.endpoint or None, credentials=keys, connect_timeout_s=5,
                                read_timeout_s=20, max_attempts=3, with_boto3=True)
    except ImportError as exc:
        return None, f"no boto3 in the image ({exc})"
    except Exception as exc:  # noqa: BLE001 - e.g. no region: the facts are then unknown
        return None, f"{type(exc).__name__}: {exc}"
    return client, None


def object_facts(client: Any, bucket: str, key: str, multipart: bool) -> ObjectFacts:
    """HeadObject of one object (twice for a multipart one: with PartNumber=1 S3 answers the
    part count and the first part's size, https://docs.aws.amazon.com/AmazonS3/latest/API/API_HeadObject.html,
    "x-amz-mp-parts-count"). Never raises."""
    try:
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        parts = first = None
        if multipart:
            part = client.head_object(Bucket=bucket, Key=key, PartNumber=1)
            if isinstance(part.get("PartsCount"), int) and part["PartsCount"] > 0:
                parts, first = int(part["PartsCount"]), int(part.get("ContentLength") or 0) or None
        sha = head.get("ChecksumSHA256")
        return ObjectFacts(sse=head.get("ServerSideEncryption"), customer_key=bool(head.get("SSECustomerAlgorithm")),
                           parts=parts, first_part=first, sha256=sha if isinstance(sha, str) and sha else None)
    except Exception as exc:  # noqa: BLE001 - unknown facts, never a failed attempt
        response = getattr(exc, "response", None)
        code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
        return ObjectFacts(error=f"HeadObject: {code or type(exc).__name__}")


# Part sizes S3 clients choose by themselves (a listing does not carry an object's part size):
# boto3 (s3transfer) and the AWS CLI start at 8 MiB and double it until the file fits in S3's
# 10,000 parts (s3transfer `ChunksizeAdjuster`,
# https://github.com/boto/s3transfer/blob/develop/s3transfer/utils.py;
# https://docs.aws.amazon.com/cli/latest/topic/s3-config.html, multipart_chunksize); Go SDK
# uploaders (s5cmd's 50 MiB `cp --part-size`, https://github.com/peak/s5cmd, and the SDK's own
# 5 MiB) take size/10000 + 1 bytes when the default would need more parts
# (https://github.com/aws/aws-sdk-go/blob/main/service/s3/s3manager/upload.go); rclone starts at
# 5 MiB (`--s3-chunk-size`, https://rclone.org/s3/#s3-chunk-size); warmstart's import records
# its own (64 MiB by default) in the manifest.
S3_MAX_PARTS = 10_000
S3_MIN_PART = 5 * MIB
S3_MAX_PART = 5 << 30
MAX_GUESSED_PART_SIZES = 8
"""Part sizes tried for an object whose part size is not known (each costs an MD5 pass)."""


def _doubled(start: int, size: int) -> int:
    p = start
    while math.ceil(size / p) > S3_MAX_PARTS and p < S3_MAX_PART:
        p *= 2
    return p


def _go_sdk(start: int, size: int) -> int:
    return size // S3_MAX_PARTS + 1 if size // start >= S3_MAX_PARTS else start


def part_size_candidates(size: int, parts: int, *, recorded: int | None = None, first_part: int | None = None,
                         limit: int = MAX_GUESSED_PART_SIZES) -> tuple[list[int], bool]:
    """(part sizes that split `size` bytes into exactly `parts` parts, whether the part size is
    known rather than guessed).

    Every part but the last has the part size P, so ceil(size / P) == parts: P lies in
    [ceil(size / parts), floor((size - 1) / (parts - 1))]. Known: one part (any P >= size), the
    import's recorded size, or the first part's size S3 answers. Guessed, in this order and at
    most `limit`: the sizes S3 clients choose by themselves (above), then whole MiB in that range,
    the round ones (multiples of 10 MiB, powers of two, multiples of 5 and 4 MiB) first."""
    def fits(p: int | None) -> bool:
        return bool(p) and p > 0 and math.ceil(size / p) == parts  # type: ignore[operator]

    if parts == 1:
        return [max(size, 1)], True
    for known in (recorded, first_part):
        if fits(known):
            return [int(known)], True  # type: ignore[arg-type]
    found: list[int] = []

    def add(p: int) -> None:
        if fits(p) and p not in found and len(found) < limit:
            found.append(p)

    for p in (_doubled(8 * MIB, size), _go_sdk(50 * MIB, size), _go_sdk(5 * MIB, size), _doubled(5 * MIB, size),
              64 * MIB, 16 * MIB, 100 * MIB):
        add(p)
    lo, hi = math.ceil(size / parts), (size - 1) // (parts - 1)
    first_mib, last_mib = max(5, math.ceil(lo / MIB)), hi // MIB

    def roundness(m: int) -> tuple[int, int]:
        return (0 if m % 10 == 0 or m & (m - 1) == 0 else 1 if m % 5 == 0 or m % 4 == 0 else 2, m)

    if last_mib - first_mib < 4096:
        for m in sorted(range(first_mib, last_mib + 1), key=roundness):
            if len(found) >= limit:
                break
            add(m * MIB)
    else:  # a huge range (few parts of a large file): its round sizes only
        for step in (1024, 256, 100, 64, 10):
            for m in range(math.ceil(first_mib / step) * step, last_mib + 1, step):
                if len(found) >= limit:
                    break
                add(m * MIB)
    return found, False


class _PartDigests:
    """The digests of a file's consecutive parts of `part` bytes (None: the whole file is one part)."""

    def __init__(self, algorithm: str, part: int | None) -> None:
        self.algorithm, self.part = algorithm, part
        self.current, self.filled, self.done = hashlib.new(algorithm), 0, []  # type: ignore[var-annotated]

    def update(self, view: memoryview) -> None:
        if self.part is None:
            self.current.update(view)
            return
        while view:
            take = min(len(view), self.part - self.filled)
            self.current.update(view[:take])
            self.filled += take
            view = view[take:]
            if self.filled == self.part:
                self.done.append(self.current.digest())
                self.current, self.filled = hashlib.new(self.algorithm), 0

    def finish(self) -> list[bytes]:
        if self.filled or not self.done:  # the last, short part (or an empty file's one part)
            self.done.append(self.current.digest())
        return self.done


def _hash_file(path: Path, digests: list[_PartDigests], deadline: Deadline) -> None:
    """One pass over the file, every digest fed each chunk."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StageRefused(f"{path} is not a regular file")
        while True:
            if deadline.left() <= 0:
                raise TimeoutError("deadline reached while checking the copy's content")
            chunk = os.read(fd, 8 * MIB)
            if not chunk:
                break
            for d in digests:
                d.update(memoryview(chunk))
    finally:
        os.close(fd)


def s3_etag(parts: list[bytes], multipart: bool) -> str:
    """S3's ETag of an object from its parts' MD5s: the MD5 itself for a single-part upload, else
    the MD5 of the concatenated part MD5s and `-<parts>`, one part included (`-1`: the MD5 of the
    whole file's MD5)."""
    return f"{hashlib.md5(b''.join(parts)).hexdigest()}-{len(parts)}" if multipart else parts[0].hex()


def s3_checksum(parts: list[bytes], composite: bool) -> str:
    """S3's `ChecksumSHA256` from the parts' sha256: base64 of the whole file's, or, for a
    multipart upload's composite checksum, base64 of the sha256 of the concatenated part digests
    and `-<parts>` (https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html)."""
    import base64

    if composite:
        return f"{base64.b64encode(hashlib.sha256(b''.join(parts)).digest()).decode()}-{len(parts)}"
    return base64.b64encode(parts[0]).decode()


CONTENT_CHECKS = ("auto", "etag", "sha256", "size")
"""WARMSTART_CONTENT_CHECK (the stack key `models[].nodeCacheContentCheck`):
- auto: the strongest check S3 vouches for, per file (below); a file nothing can vouch for
  (an SSE-KMS object without a sha256, a part size that cannot be found) is kept on its size and
  ETag agreement, named once in the outcome line;
- etag, sha256: as auto, but a file that cannot be checked that way (`sha256`: only by a sha256)
  refuses the copy; the copy is kept (never copied again for it) and the refusal is logged once
  until the source changes;
- size: sizes and ETag agreement only."""
UNVERIFIABLE_MEMO = ".warmstart-unverifiable.json"
"""In `<digest>.partial/`: the listing a strict check found unverifiable, so the next attempt
refuses at once (no re-hash, no second log line) until the source or the policy changes."""
_LOGGED_MEMOS: set[str] = set()
MISMATCH_MEMO = ".warmstart-mismatch.json"
"""In the model's node directory: [key, size, ETag] of files whose copy did not match an
MD5-shaped ETag while HeadObject could not say whether S3 computed it. The same mismatch on the
next, fresh copy makes the file unverifiable instead of a third copy (never a re-copy loop)."""


class KeptRefusal(StageRefused):
    """A refusal whose copy is kept: nothing a new copy could change (an unverifiable check)."""

    def __init__(self, reason: str, repeat: bool = False) -> None:
        super().__init__(reason)
        self.repeat = repeat


def _memo_key(settings: Settings, listing: Mapping[str, Mapping[str, Any]]) -> str:
    facts = sorted((k, v["size"], v.get("etag")) for k, v in listing.items())
    return hashlib.sha256(json.dumps([settings.content_check, settings.source, facts]).encode()).hexdigest()


def check_content(settings: Settings, listing: Mapping[str, Mapping[str, Any]], deadline: Deadline
                  ) -> tuple[dict[str, str], dict[str, str]]:
    """Every staged file's bytes against what S3 vouches for: ({key: how it was checked},
    {key: why it could not be checked}).

    Per file, the first that applies:
    - the import's manifest (copied with the weights) names the file with this ETag and a
      sha256: that sha256 (Hub imports hash every file against the Hub's published sha256);
    - S3's own `ChecksumSHA256` (HeadObject with ChecksumMode=ENABLED): the whole file's, or the
      composite of a multipart upload with its part size known;
    - the ETag, where S3 computed it from the bytes (SSE-S3 or unencrypted, read from the
      object's `ServerSideEncryption`): the MD5, or for a multipart object (`-<parts>`) the MD5
      of its parts' MD5s, the part size from the manifest, S3's PartsCount and first part, or
      else the sizes S3 clients choose (part_size_candidates).
    A mismatch against a known check raises StageRefused (the copy is dropped). A file no check
    applies to (an SSE-KMS or SSE-C ETag without a sha256; a guessed part size that matches
    none; `sha256` without a sha256) is "unverifiable", never a mismatch: a new copy could not
    change it."""
    if settings.content_check == "size":
        return {k: "size" for k in listing}, {}
    manifest = parse_json(read_small(settings.partial / IMPORT_MANIFEST, 8 * MIB)) \
        if IMPORT_MANIFEST in listing else None
    recorded: dict[str, dict[str, Any]] = {}
    part_bytes = None
    if isinstance(manifest, dict) and manifest.get("status") == "complete":
        part_bytes = manifest.get("part_bytes") if isinstance(manifest.get("part_bytes"), int) else None
        for f in manifest.get("files") or []:
            if isinstance(f, dict) and isinstance(f.get("name"), str):
                recorded[f["name"]] = f
    bucket, prefix = _split_source(settings.source)
    client, no_client = s3_client(settings)
    how: dict[str, str] = {}
    bad: list[str] = []
    unverifiable: dict[str, str] = {}
    lock = threading.Lock()
    remembered = parse_json(read_small(settings.root / MISMATCH_MEMO, MAX_MARKER_BYTES))
    seen_before = [f for f in remembered if isinstance(f, list)] if isinstance(remembered, list) else []
    suspects: list[list[Any]] = []

    def one(rel: str) -> None:
        meta = listing[rel]
        size = int(meta["size"])
        etag = str(meta.get("etag") or "").strip('"').lower()
        rec = recorded.get(rel)
        manifest_sha = str(rec["sha256"]).lower() if rec and rec.get("etag") == etag \
            and isinstance(rec.get("sha256"), str) else None
        m = ETAG_MULTIPART.match(etag)
        multipart = m is not None
        if manifest_sha is not None:
            sha = _PartDigests("sha256", None)
            _hash_file(settings.partial / rel, [sha], deadline)
            got = sha.finish()[0].hex()
            with lock:
                how[rel] = "sha256" if got == manifest_sha else "mismatch"
                if got != manifest_sha:
                    bad.append(f"{rel}: sha256 {got}, the import recorded {rec['sha256']}")  # type: ignore[index]
            return
        facts = object_facts(client, bucket, f"{prefix}/{rel}", multipart) if client is not None \
            else ObjectFacts(error=no_client)
        parts = int(m["parts"]) if m else 1
        if facts.parts is not None and multipart and facts.parts != parts:
            facts = dataclasses.replace(facts, parts=None, first_part=None)  # not this object's answer
        part_sizes, known = part_size_candidates(size, parts, recorded=part_bytes, first_part=facts.first_part) \
            if multipart else ([max(size, 1)], True)
        # S3's first part gives the part size of an upload whose parts are all alike (every tool
        # above); S3 allows parts of different sizes, which only a second mismatch can reveal.
        by_first_part = multipart and parts > 1 and known and part_sizes == [facts.first_part] \
            and not (part_bytes and math.ceil(size / part_bytes) == parts)
        checksum = facts.sha256
        composite = checksum is not None and "-" in checksum
        use_checksum = checksum is not None and (not composite or known)
        etag_md5 = facts.etag_is_md5
        use_etag = (multipart or ETAG_MD5.match(etag) is not None) and etag_md5 is not False \
            and settings.content_check != "sha256" and not use_checksum
        if not use_checksum and not use_etag:
            why = ("no sha256 (manifest or ChecksumSHA256) for WARMSTART_CONTENT_CHECK=sha256"
                   if settings.content_check == "sha256" and (etag_md5 is not False)
                   else f"ETag {etag!r} is not an MD5 S3 computed "
                        f"({'SSE-C' if facts.customer_key else facts.sse or 'unknown form'}) and S3 holds no sha256 of it")
            with lock:
                unverifiable[rel] = why
            return
        digests = ([_PartDigests("sha256", part_sizes[0] if composite else None)] if use_checksum
                   else [_PartDigests("md5", p if multipart else None) for p in part_sizes])
        _hash_file(settings.partial / rel, digests, deadline)
        with lock:
            if use_checksum:
                got = s3_checksum(digests[0].finish(), composite)
                if got == checksum:
                    how[rel] = "sha256"
                else:
                    bad.append(f"{rel}: sha256 {got}, S3's ChecksumSHA256 {checksum}")
            elif etag in (s3_etag(d.finish(), multipart) for d in digests):
                how[rel] = "etag"
            elif known and etag_md5 is not None and not by_first_part:
                bad.append(f"{rel}: content does not match its ETag {etag}")
            elif known:
                # S3's facts unknown (an MD5-shaped ETag may be an SSE-KMS one), or the part size
                # taken from the first part (parts may differ): refused the first time (a byte
                # flipped on the way); the same mismatch on a fresh copy is the check's, not the
                # bytes': unverifiable from then on, never a re-copy loop.
                doubt = (f"whether S3 computed it from the bytes is unknown ({facts.error})" if etag_md5 is None
                         else f"its parts may not all be the first part's {facts.first_part} bytes")
                fact = [rel, size, etag]
                if fact in seen_before:
                    unverifiable[rel] = f"content does not match ETag {etag!r} on two fresh copies, and {doubt}"
                else:
                    suspects.append(fact)
                    bad.append(f"{rel}: content does not match its ETag {etag} ({doubt})")
            else:
                unverifiable[rel] = (f"ETag {etag!r}: none of the part sizes S3 clients choose "
                                     f"({', '.join(f'{p / MIB:g} MiB' for p in part_sizes) or 'none fits'}) "
                                     f"gives it, and S3 did not answer the part size ({facts.error or 'no PartsCount'})")

    errors: list[BaseException] = []

    def worker(names: list[str]) -> None:
        for rel in names:
            try:
                one(rel)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
                return

    names = sorted(listing)
    n = max(1, min(4, os.cpu_count() or 1, len(names)))
    threads = [threading.Thread(target=worker, args=(names[i::n],), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if suspects or seen_before:
        try:
            _write_file(settings.root / MISMATCH_MEMO, json.dumps(sorted(suspects)).encode())
        except OSError:
            pass  # then the next attempt refuses once more
    if bad:
        raise StageRefused(f"content mismatch: {'; '.join(sorted(bad)[:4])}")
    return how, unverifiable


def _fsync_path(path: Path, directory: bool = False) -> None:
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


def promote(settings: Settings, listing: Mapping[str, Mapping[str, Any]], total: int, seconds: float,
            checked: Mapping[str, str] | None = None) -> None:
    files = [{"key": k, "size": v["size"], "etag": v["etag"]} | ({"checked": checked[k]} if checked and k in checked else {})
             for k, v in sorted(listing.items())]
    for f in files:
        _fsync_path(settings.partial / f["key"])
    marker = {"format": MARKER_FORMAT, "digest": settings.digest, "source": settings.source, "files": files,
              "bytes": total, "seconds": round(seconds, 3),
              "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "completed_epoch": time.time()}
    _write_file(settings.partial / MARKER, json.dumps(marker, sort_keys=True).encode())
    (settings.partial / SOURCE_SNAPSHOT).unlink(missing_ok=True)  # the marker says it all now
    (settings.partial / UNVERIFIABLE_MEMO).unlink(missing_ok=True)
    for d in sorted({(settings.partial / f["key"]).parent for f in files} | {settings.partial}, reverse=True):
        _fsync_path(d, directory=True)
    if os.path.lexists(settings.final):  # an incomplete leftover (or a planted link): never a source
        remove(settings.final)
    os.rename(settings.partial, settings.final)
    _fsync_path(settings.root, directory=True)


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


def stage(settings: Settings | None = None, *, emit_line: bool = True) -> dict[str, Any]:
    """One staging attempt. Never raises (a KeyboardInterrupt/SystemExit is logged, re-raised)."""
    start = time.monotonic()
    record: dict[str, Any] = {"phase": "stage", "result": "error", "reason": None, "paused_s": 0.0}
    try:
        settings = settings or Settings.from_env()
        record["digest"] = settings.digest
        settings.root.mkdir(parents=True, exist_ok=True)
        deadline = Deadline(settings.deadline_s)
        with NodeLock(settings.root, deadline):
            if complete(settings):
                record.update(result="present", removed=collect_garbage(settings))
            else:
                _stage_locked(settings, deadline, record, start)
    except StageRefused as exc:
        record.update(result="refused", reason=str(exc))
        if isinstance(exc, KeptRefusal) and exc.repeat:
            emit_line = False  # logged once already (the same listing, the same policy)
    except TimeoutError as exc:
        record.update(result="deferred", reason=str(exc))
    except BaseException as exc:  # noqa: BLE001 - never fail the node's DaemonSet pod
        record.update(result="error", reason=f"{type(exc).__name__}: {exc}")
        if not isinstance(exc, Exception):
            record["seconds"] = round(time.monotonic() - start, 3)
            if emit_line:
                emit(record)
            raise
    record["seconds"] = round(time.monotonic() - start, 3)
    if emit_line:
        emit(record)
    return record


def _stage_locked(settings: Settings, deadline: Deadline, record: dict[str, Any], start: float) -> None:
    before = list_source(settings, deadline)
    if not before:
        raise StageRefused(f"no objects under {settings.source}")
    if not any(k.endswith(".safetensors") for k in before):
        raise StageRefused(f"no .safetensors files under {settings.source}")
    # Stale partial copies of other digests are never used: free their space first.
    for p in settings.root.iterdir():
        if p.name.endswith(PARTIAL_SUFFIX) and p != settings.partial:
            remove(p)
    try:
        prepare_partial(settings, before)
        check_space(settings, before)
        record["paused_s"] = round(copy(settings, deadline), 3)
        after = list_source(settings, deadline)
        total = verify(settings, before, after)
        checked = _check_by_policy(settings, after, deadline, record)
        promote(settings, after, total, time.monotonic() - start, checked)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            # The copy or its marker filled the disk: give the space back (the previous
            # version is untouched, nothing was renamed).
            remove(settings.partial)
            raise StageRefused(f"disk full: {exc}") from None
        raise
    except KeptRefusal:
        raise  # nothing a new copy could change: the copy stays, to be checked as the policy allows
    except StageRefused:
        remove(settings.partial)  # a copy that does not match its source: start over
        raise
    # Stopped by the deadline, a signal or a failed s5cmd run, the partial copy is kept to be
    # resumed; its listing snapshot makes the resume drop files of another revision.
    record.update(result="staged", bytes=total, files=len(after), removed=collect_garbage(settings),
                  checked=sorted(set(checked.values())))


def _check_by_policy(settings: Settings, after: Mapping[str, Mapping[str, Any]], deadline: Deadline,
                     record: dict[str, Any]) -> dict[str, str]:
    """check_content under WARMSTART_CONTENT_CHECK: {key: how it was checked}. Files nothing can
    vouch for are named once in the outcome line (`unverifiable`); `auto` keeps them on their
    sizes and ETag agreement, `etag` and `sha256` refuse the copy but keep it (KeptRefusal), and
    a repeated attempt over the same listing refuses at once from the memo, without a re-hash."""
    memo_key = _memo_key(settings, after)
    memo = parse_json(read_small(settings.partial / UNVERIFIABLE_MEMO, MAX_MARKER_BYTES))
    if isinstance(memo, dict) and memo.get("key") == memo_key and isinstance(memo.get("reason"), str):
        record["unverifiable"] = memo.get("files")
        repeat = memo_key in _LOGGED_MEMOS
        _LOGGED_MEMOS.add(memo_key)
        raise KeptRefusal(memo["reason"], repeat=repeat)
    checked, unverifiable = check_content(settings, after, deadline)
    if not unverifiable:
        return checked
    names = sorted(unverifiable)
    record["unverifiable"] = {k: unverifiable[k] for k in names[:16]} | (
        {"...": f"{len(names) - 16} more"} if len(names) > 16 else {})
    # The import's manifest cannot name its own sha256: it is never what a strict check refuses on.
    if settings.content_check == "auto" or names == [IMPORT_MANIFEST]:
        return checked | {k: "size" for k in names}
    names = [n for n in names if n != IMPORT_MANIFEST]
    reason = (f"unverifiable under WARMSTART_CONTENT_CHECK={settings.content_check}: {len(names)} file(s) "
              f"cannot be checked that way ({names[0]}: {unverifiable[names[0]]}); the copy is kept; fix: "
              "models[].nodeCacheContentCheck: auto (or size) for this bucket")
    _write_file(settings.partial / UNVERIFIABLE_MEMO,
                json.dumps({"key": memo_key, "reason": reason, "files": record["unverifiable"]}).encode())
    _LOGGED_MEMOS.add(memo_key)
    raise KeptRefusal(reason)


class Terminated(BaseException):
    """SIGTERM in the hold container, raised wherever it waits (a sleep, a copy)."""


# --------------------------------------------------------------------------------------------
# The node label: an NFD NodeFeature owned by this pod


def node_feature(settings: Settings) -> dict[str, Any]:
    """The NodeFeature whose label nfd-master copies onto the node. Owned by this pod, so the
    garbage collector deletes it (and nfd-master the label) when the pod goes
    (https://kubernetes-sigs.github.io/node-feature-discovery/v0.19/usage/customization-guide.html#nodefeature-custom-resource).
    No blockOwnerDeletion: setting it needs update rights on the pod's finalizers."""
    return {
        "apiVersion": NFD_API, "kind": "NodeFeature",
        "metadata": {"name": feature_name(settings), "namespace": settings.namespace,
                     "labels": {NFD_NODE_NAME_LABEL: settings.node},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": settings.pod,
                                          "uid": settings.pod_uid}]},
        "spec": {"labels": {settings.label: settings.digest}},
    }


def feature_name(settings: Settings) -> str:
    model = settings.label.rsplit("/", 1)[-1]
    return f"{model}-weights-{settings.node}"[:253].rstrip(".-")


def _api(settings: Settings, method: str, path: str, body: Any = None, content_type: str = "application/json",
         timeout: float = 10) -> int:
    token = (settings.sa_dir / "token").read_text().strip()
    req = urllib.request.Request(settings.kube_api.rstrip("/") + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": content_type,
                                          "Accept": "application/json"})
    context = None
    if settings.kube_api.startswith("https://"):
        context = ssl.create_default_context(cafile=str(settings.sa_dir / "ca.crt"))
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _feature_path(settings: Settings, name: str | None = None) -> str:
    base = f"/apis/{NFD_API}/namespaces/{settings.namespace}/nodefeatures"
    return base if name is None else f"{base}/{name}"


def label(settings: Settings, present: bool, timeout: float = 10) -> dict[str, Any]:
    """Apply (server-side apply: one idempotent call, verbs create+patch) or delete this
    node's NodeFeature. Never raises."""
    record: dict[str, Any] = {"phase": "label", "result": "skipped", "digest": settings.digest, "reason": None}
    if not settings.label or not settings.kube_api:
        record["reason"] = "WARMSTART_LABEL or the API server address is not set"
        return record
    if not (settings.node and settings.pod and settings.pod_uid and settings.namespace):
        record["reason"] = "NODE_NAME, POD_NAME, POD_UID and POD_NAMESPACE must come from the downward API"
        return record
    name = feature_name(settings)
    try:
        if present:
            status = _api(settings, "PATCH", _feature_path(settings, name) + "?fieldManager=warmstart-weights&force=true",
                          node_feature(settings), content_type="application/apply-patch+yaml")
            ok = 200 <= status < 300
            record.update(result="labelled" if ok else "error", reason=None if ok else f"HTTP {status}")
        else:
            status = _api(settings, "DELETE", _feature_path(settings, name), timeout=timeout)
            ok = 200 <= status < 300 or status == 404
            record.update(result="unlabelled" if ok else "error", reason=None if ok else f"HTTP {status}")
    except Exception as exc:  # noqa: BLE001 - a label is an optimisation, never a failure
        record.update(result="error", reason=f"{type(exc).__name__}: {exc}")
    return record


def hold(settings: Settings, *, rounds: int | None = None, sleep: Callable[[float], None] = time.sleep,
         check_s: float = 30.0) -> None:
    """Keep the label true: labelled while the copy is complete, unlabelled (and restaged)
    when it is not; unlabel on SIGTERM. `rounds` bounds the loop (tests).

    SIGTERM raises Terminated wherever the loop waits (its sleep, a copy: s5cmd gets
    COPIER_STOP_S to stop), and the unlabel call has UNLABEL_TIMEOUT_S: the label is gone well
    inside the pod's 30 s terminationGracePeriodSeconds, not at the next 30 s check."""
    def on_term(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one unwinding: the unlabel is not interrupted
        raise Terminated()

    if rounds is None:
        signal.signal(signal.SIGTERM, on_term)
    labelled: bool | None = None
    next_attempt = 0.0
    n = 0
    try:
        while rounds is None or n < rounds:
            n += 1
            ok = complete(settings)
            if not ok and time.monotonic() >= next_attempt:
                ok = stage(settings)["result"] in ("staged", "present")
                next_attempt = time.monotonic() + settings.retry_s
            if ok != labelled:
                record = label(settings, ok)
                emit(record)
                if record["result"] in ("labelled", "unlabelled"):
                    labelled = ok
            if rounds is None or n < rounds:
                sleep(check_s)
    except Terminated:
        pass
    if labelled:
        emit(label(settings, False, timeout=UNLABEL_TIMEOUT_S))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("stage", "hold", "label"))
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except (StageRefused, ValueError) as exc:
        emit({"phase": args.command, "result": "error", "reason": str(exc)})
        if args.command == "hold":
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # PID 1: no default SIGTERM action
            while True:  # keep the pod Running (no crash loop); nothing to do
                time.sleep(3600)
        return 0
    if args.command == "stage":
        stage(settings)
    elif args.command == "label":
        emit(label(settings, complete(settings)))
    else:
        hold(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
