#!/usr/bin/env python3
"""Stage one model version's weights on this node's NVMe, and say so with a node label.

Runs in the model's own image (standard library only; the copier is the s5cmd binary an init
container copies in), in a DaemonSet pod on every GPU node of a pool:

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
   what is complete) whenever a serving pod starts streaming, under an overall deadline;
5. verify against a FRESH listing: same keys and sizes as before the copy, every file present
   with its size, and nothing else (s5cmd's temporary files are removed);
6. write `.warmstart-complete.json` (keys, sizes, ETags, bytes, seconds), fsync every file and
   the directory, rename `<digest>.partial` -> `<digest>`;
7. garbage-collect: keep the current digest and the newest previous complete one (a rollback),
   remove older ones and stale partials of other digests. Nothing is removed before step 6.
A failed or interrupted attempt never renames: a partial copy is never used.

Environment:

    WARMSTART_WEIGHTS_SOURCE     s3://bucket/prefix of the version. Required.
    WARMSTART_WEIGHTS_DIGEST     its digest (the directory and label value). Required.
    WARMSTART_WEIGHTS_ROOT       the model's node weights directory. Default /weights.
    WARMSTART_S5CMD              the copier. Default /opt/s5cmd/s5cmd.
    WARMSTART_STAGE_DEADLINE_S   overall deadline of one attempt (listing, waits, copy). Default 3600.
    WARMSTART_STAGE_WORKERS      s5cmd --numworkers. Default 64.
    WARMSTART_MIN_FREE_SHARE     share of the filesystem that must stay free. Default 0.15.
    WARMSTART_POLL_S             how often pause requests are checked. Default 1.
    WARMSTART_RETRY_S            hold: wait between failed attempts. Default 300.
    WARMSTART_LABEL              node label key, e.g. weights.warmstart.io/<model>. Empty: no label.
    WARMSTART_KUBE_API           API server URL. Default https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT.
    WARMSTART_SA_DIR             service-account token dir. Default /var/run/secrets/kubernetes.io/serviceaccount.
    NODE_NAME, POD_NAME, POD_UID, POD_NAMESPACE   downward API.
    AWS_ENDPOINT_URL             passed to s5cmd as --endpoint-url (tests, S3-compatible stores).

Log line, one per outcome, on stdout:

    {"event":"warmstart.weights_stage","phase":"stage","result":"staged","digest":"...","bytes":1,
     "files":1,"seconds":1.0,"paused_s":0.0,"reason":null}

    stage results: staged | present (already complete) | refused (listing, size, space) | deferred
                   (deadline while waiting) | error
    label results: labelled | unlabelled | skipped | error
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import fcntl
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping

EVENT = "warmstart.weights_stage"
MARKER = ".warmstart-complete.json"
MARKER_FORMAT = "warmstart-weights-stage/1"
LOADING_DIR = ".loading"
LOCK_FILE = ".lock"
PARTIAL_SUFFIX = ".partial"
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
        return cls(
            source=source, digest=digest, root=Path(get("WARMSTART_WEIGHTS_ROOT", "/weights")),
            s5cmd=get("WARMSTART_S5CMD", "/opt/s5cmd/s5cmd"),
            deadline_s=float(get("WARMSTART_STAGE_DEADLINE_S", "3600")),
            workers=int(get("WARMSTART_STAGE_WORKERS", "64")),
            min_free_share=float(get("WARMSTART_MIN_FREE_SHARE", "0.15")),
            poll_s=max(0.05, float(get("WARMSTART_POLL_S", "1"))),
            retry_s=max(1.0, float(get("WARMSTART_RETRY_S", "300"))),
            label=get("WARMSTART_LABEL"),
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
    print(json.dumps({"event": EVENT, **record}, sort_keys=True, separators=(",", ":")), flush=True)


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
        out[rel] = {"size": int(item["size"]), "etag": str(item.get("etag", "")).strip('"')}
    return out


def loading_pods(settings: Settings, now: float | None = None) -> list[str]:
    """Pause requests of serving pods on this node that are streaming from S3 right now;
    expired requests are removed."""
    d = settings.root / LOADING_DIR
    now = time.time() if now is None else now
    active = []
    try:
        entries = list(d.iterdir())
    except OSError:
        return []
    for p in entries:
        try:
            until = float(json.loads(p.read_text()).get("until", 0))
        except (OSError, ValueError, AttributeError):
            until = 0.0
        if until > now:
            active.append(p.stem)
        else:
            p.unlink(missing_ok=True)
    return sorted(active)


def wait_while_loading(settings: Settings, deadline: Deadline) -> float:
    """Seconds spent waiting for serving pods' streaming to finish (bounded by the deadline)."""
    start = time.monotonic()
    while loading_pods(settings) and deadline.left() > 0:
        time.sleep(min(settings.poll_s, max(0.0, deadline.left())))
    return time.monotonic() - start


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def copy(settings: Settings, deadline: Deadline) -> float:
    """Sync the source into the partial directory; pause (stop s5cmd) while a serving pod
    streams. Returns the seconds paused. Raises on failure or deadline."""
    settings.partial.mkdir(parents=True, exist_ok=True)
    paused = 0.0
    cmd = _s5(settings, "--numworkers", str(settings.workers), "sync", "--size-only",
              f"{settings.source}/*", f"{settings.partial}/")
    while True:
        paused += wait_while_loading(settings, deadline)
        if deadline.left() <= 0:
            raise TimeoutError("deadline reached before the copy finished")
        err_path = settings.root / f".s5cmd-{os.getpid()}.err"
        with open(err_path, "w+") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                    env=settings.child_env or None)
            interrupted = None
            try:
                while proc.poll() is None:
                    if deadline.left() <= 0:
                        interrupted = "deadline"
                    elif loading_pods(settings):
                        interrupted = "loading"
                    if interrupted:
                        _stop(proc)
                        break
                    time.sleep(min(settings.poll_s, max(0.01, deadline.left())))
            finally:
                _stop(proc)
            err.seek(0)
            stderr = err.read()[-_STDERR_TAIL:]
        err_path.unlink(missing_ok=True)
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
    """The copy matches the source's fresh listing exactly; returns its bytes. Extra files in
    the partial directory (s5cmd's temporary files of a stopped copy) are removed first."""
    if {k: v["size"] for k, v in before.items()} != {k: v["size"] for k, v in after.items()}:
        changed = sorted(k for k in set(before) | set(after)
                         if before.get(k, {}).get("size") != after.get(k, {}).get("size"))
        raise StageRefused(f"listing mismatch: the source changed during the copy ({', '.join(changed[:5])})")
    for path in sorted(settings.partial.rglob("*"), reverse=True):
        rel = path.relative_to(settings.partial).as_posix()
        if path.is_file() and rel not in after:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    total = 0
    for rel, meta in sorted(after.items()):
        p = settings.partial / rel
        try:
            size = p.stat().st_size
        except OSError:
            raise StageRefused(f"size mismatch: {rel} is missing from the copy") from None
        if size != meta["size"]:
            raise StageRefused(f"size mismatch: {rel} is {size} bytes, the source lists {meta['size']}")
        total += size
    return total


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_marker(directory: Path) -> dict[str, Any] | None:
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("format") == MARKER_FORMAT else None


def complete(settings: Settings) -> bool:
    """The current digest is staged: marker present, for this source, and every file sized."""
    marker = read_marker(settings.final)
    if not marker or marker.get("digest") != settings.digest or marker.get("source") != settings.source:
        return False
    for f in marker.get("files") or []:
        try:
            if (settings.final / f["key"]).stat().st_size != f["size"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return bool(marker.get("files"))


def promote(settings: Settings, listing: Mapping[str, Mapping[str, Any]], total: int, seconds: float) -> None:
    files = [{"key": k, "size": v["size"], "etag": v["etag"]} for k, v in sorted(listing.items())]
    for f in files:
        _fsync_path(settings.partial / f["key"])
    marker = {"format": MARKER_FORMAT, "digest": settings.digest, "source": settings.source, "files": files,
              "bytes": total, "seconds": round(seconds, 3),
              "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "completed_epoch": time.time()}
    tmp = settings.partial / f"{MARKER}.tmp"
    with open(tmp, "w") as fh:
        json.dump(marker, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, settings.partial / MARKER)
    for d in sorted({(settings.partial / f["key"]).parent for f in files} | {settings.partial}, reverse=True):
        _fsync_path(d, directory=True)
    if settings.final.exists():  # an incomplete leftover under the final name: never a source
        shutil.rmtree(settings.final)
    os.rename(settings.partial, settings.final)
    _fsync_path(settings.root, directory=True)


def collect_garbage(settings: Settings) -> list[str]:
    """Remove every version but the current one and the newest previous complete one, and
    stale partial copies of other digests. Called only once the current one is complete."""
    removed = []
    previous: list[tuple[float, Path]] = []
    for p in settings.root.iterdir():
        if not p.is_dir() or p.name.startswith(".") or p == settings.final:
            continue
        if p.name.endswith(PARTIAL_SUFFIX):
            if p != settings.partial:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p.name)
            continue
        marker = read_marker(p)
        previous.append((float(marker.get("completed_epoch", 0)) if marker else -1.0, p))
    previous.sort(reverse=True)
    for _, p in previous[1:]:
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    if previous and previous[0][0] < 0:  # not a complete version: nothing to roll back to
        shutil.rmtree(previous[0][1], ignore_errors=True)
        removed.append(previous[0][1].name)
    return sorted(removed)


def check_space(settings: Settings, listing: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a copy that would leave less than the eviction threshold free."""
    have = 0
    for rel, meta in listing.items():
        try:
            if (settings.partial / rel).stat().st_size == meta["size"]:
                have += meta["size"]
        except OSError:
            pass
    need = sum(m["size"] for m in listing.values()) - have
    st = os.statvfs(settings.root)
    free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    keep = int(size * settings.min_free_share)
    if free - need < keep:
        raise StageRefused(f"disk: the copy needs {need} more bytes, {free} are free and {keep} must stay free "
                           f"({settings.min_free_share:.0%} of {size}, the kubelet's eviction threshold)")


class NodeLock:
    """One stager per model per node (a restarted container, a second pod during a rollout)."""

    def __init__(self, root: Path, deadline: Deadline) -> None:
        self.path, self.deadline, self.fd = root / LOCK_FILE, deadline, -1

    def __enter__(self) -> "NodeLock":
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
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
        if p.is_dir() and p.name.endswith(PARTIAL_SUFFIX) and p != settings.partial:
            shutil.rmtree(p, ignore_errors=True)
    check_space(settings, before)
    try:
        record["paused_s"] = round(copy(settings, deadline), 3)
        after = list_source(settings, deadline)
        total = verify(settings, before, after)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            shutil.rmtree(settings.partial, ignore_errors=True)  # give the space back; previous intact
            raise StageRefused(str(exc)) from None
        raise
    except StageRefused:
        shutil.rmtree(settings.partial, ignore_errors=True)  # a copy that does not match: start over
        raise
    promote(settings, after, total, time.monotonic() - start)
    record.update(result="staged", bytes=total, files=len(after), removed=collect_garbage(settings))


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


def label(settings: Settings, present: bool) -> dict[str, Any]:
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
            status = _api(settings, "DELETE", _feature_path(settings, name))
            ok = 200 <= status < 300 or status == 404
            record.update(result="unlabelled" if ok else "error", reason=None if ok else f"HTTP {status}")
    except Exception as exc:  # noqa: BLE001 - a label is an optimisation, never a failure
        record.update(result="error", reason=f"{type(exc).__name__}: {exc}")
    return record


def hold(settings: Settings, *, rounds: int | None = None, sleep: Callable[[float], None] = time.sleep,
         check_s: float = 30.0) -> None:
    """Keep the label true: labelled while the copy is complete, unlabelled (and restaged)
    when it is not; unlabel on SIGTERM. `rounds` bounds the loop (tests)."""
    stopping = {"now": False}

    def on_term(*_: object) -> None:
        stopping["now"] = True

    if rounds is None:
        signal.signal(signal.SIGTERM, on_term)
    labelled: bool | None = None
    next_attempt = 0.0
    n = 0
    while not stopping["now"] and (rounds is None or n < rounds):
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
    if labelled:
        emit(label(settings, False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("stage", "hold", "label"))
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
    except (StageRefused, ValueError) as exc:
        emit({"phase": args.command, "result": "error", "reason": str(exc)})
        if args.command == "hold":
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
