"""Pre-warm vLLM's torch.compile cache on a new node from S3, and publish it once.

Why: the first vLLM pod on a node compiles for 50-80 s; pods that find the node's NVMe cache
start the compile phase in 4-6 s (AWS, "Accelerate model loading on Amazon EKS":
https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html). This file
carries that warm start across nodes. It is shipped into pods through a ConfigMap and run with
the vLLM image's own interpreter, so it uses only the standard library and boto3/botocore
(which the vLLM image ships for the Run:ai streamer):

    python3 /opt/warmstart/compile_cache.py restore   # init container, before vLLM
    python3 /opt/warmstart/compile_cache.py publish   # sidecar, next to vLLM
    python3 /opt/warmstart/compile_cache.py key       # print the object key (debugging)

Neither command can make a pod fail: every outcome, including every error, is one JSON line on
stdout and exit status 0, and vLLM then simply compiles as it would without this tool.

Environment (read once, in Settings.from_env):

    WARMSTART_CACHE_DIR            node cache directory (the hostPath mount). Default /compile-cache.
    WARMSTART_CACHE_BUCKET         compile-cache bucket. Empty: restore and publish are skipped.
    WARMSTART_CACHE_PREFIX         the model's key prefix, e.g. "llama-8b/" (a missing trailing "/"
                                   is added). Required. Every key this tool touches starts with it,
                                   because the pod's IAM role only allows reads and writes under it.
    WARMSTART_MODEL                model name. Required (a key factor).
    WARMSTART_TP                   tensor-parallel degree. Default 1, vLLM's default (a key factor).
    WARMSTART_IMAGE                container image reference. Required (a key factor). With
                                   "@sha256:" only the digest counts: it pins vLLM, torch, Triton, CUDA.
    WARMSTART_COMPILE_FINGERPRINT  hash of the compile-relevant vLLM arguments, computed at render
                                   time (a key factor). Default "none".
    WARMSTART_STARTUP_PLAN_FINGERPRINT
                                   hash of the `vllm serve` arguments vLLM's startup plan depends on but
                                   does not fingerprint (--gpu-memory-utilization), computed at render
                                   time (a key factor). Default "none". Before anything else, restore
                                   makes this value's own plan folder on the node
                                   (<cache dir>/vllm/startup_plan/<its first 16 hex>), which the vLLM
                                   container mounts as its startup_plan folder, so vLLM never applies
                                   a KV-cache size measured under other memory settings.
    WARMSTART_ACCELERATOR          accelerator identity, replacing detection (tests; containers that
                                   cannot see the GPU). Default: detected with nvidia-smi.
    WARMSTART_GPU_DRIVER           NVIDIA driver version, replacing detection (tests). Default: read from
                                   /sys/module/nvidia/version or /proc/driver/nvidia/version (a key factor:
                                   the CUDA driver's JIT cache is only valid for the driver that wrote it).
    WARMSTART_STATE_FILE           optional pod-local file (an emptyDir shared by the init container
                                   and the sidecar): restore writes the key factors it computed there
                                   and publish reuses them, so a sidecar that cannot see the GPU still
                                   publishes under the key the GPU-holding init container derived.
    WARMSTART_WEIGHTS_CHOICE_FILE  the node cache's `choice.json` (warmstart/podside/weights_select.py writes it
                                   before vLLM starts): where this pod's vLLM loads its weights from, a key
                                   factor (`weights`), because vLLM hashes the model path into its compile
                                   cache directory, so an NVMe-loaded and an S3-streamed pod never share one.
                                   `local:<path>` when the file says `local` with an absolute path, else `s3`
                                   (unset, missing, unreadable, larger than 64 KiB or malformed: vLLM then
                                   streams the URI, and the S3 URI is already in the fingerprint).
    WARMSTART_CACHE_PATHS          comma-separated directories under the cache dir that are
                                   published. Default DEFAULT_CACHE_PATHS: Inductor, Triton, vLLM's
                                   torch.compile cache, its startup plan, the DeepGEMM, FlashInfer,
                                   CUDA driver, TVM-FFI and TileLang JIT caches (the serving pod points
                                   each at its directory here, warmstart/manifests/serving.py). An
                                   allow-list because XDG_CACHE_HOME points at the cache dir, so other
                                   tools' caches (a Hugging Face download, say) can land there too and
                                   must never be uploaded.
    WARMSTART_MAX_BYTES            largest cache published or restored, uncompressed, and largest object
                                   downloaded. Default 4 GiB (AWS measured about 15 MB of artifacts for a
                                   60 GB model). An object whose Content-Length is larger is refused
                                   before a byte of it is read.
    WARMSTART_MAX_FILES            most files an archive may hold. Default 100000. tarfile keeps a header
                                   object per member, so an archive of millions of empty members (a few
                                   MB compressed) would otherwise grow the restore past its memory limit.
    WARMSTART_DEADLINE_BASE_S      every S3 request must end within this many seconds plus its bytes at
    WARMSTART_FLOOR_BYTES_PER_S    the floor rate: a HEAD or the factors manifest within the base, the
                                   download within base + object bytes / floor (from its Content-Length)
                                   + 5 ms per file it unpacks (the restore unpacks as it downloads),
                                   the upload within base + archive bytes / floor. Defaults 20 s and
                                   16 MiB/s, so the largest cache (4 GiB) is bounded by 20 + 256 s. A
                                   request past its bound is abandoned and reported as `error`.
    WARMSTART_LOCK_TIMEOUT_S       how long a restore waits for another pod on the node that is fetching
                                   the same key, and then for the node lock (held only while files are
                                   renamed into place, never across network I/O). Default 600.
    WARMSTART_HEALTH_URL           publish waits for HTTP 200 here. Default http://127.0.0.1:8000/health.
    WARMSTART_HEALTH_TIMEOUT_S     how long publish waits for it, and then for the other vLLMs on the node
                                   that compile the same key; 0 waits forever. Default 7200.
    WARMSTART_POLL_INTERVAL_S      longest gap between health polls (they start at 1 s). Default 5.
    WARMSTART_SETTLE_S             a file is published only if it did not change over this interval,
                                   measured before it is archived, nor while it was archived (3 tries,
                                   then `skipped`). Default 10.
    WARMSTART_PUBLISH_RETRIES      how often the sidecar tries again after a cache that kept changing
    WARMSTART_PUBLISH_RETRY_S      (a JIT cache a first request still fills), waiting RETRY_S, then twice
                                   that, and so on. Defaults 4 and 120 (the last try about 30 min after
                                   vLLM got healthy).
    AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL and the rest of the standard AWS
    environment (IRSA, Pod Identity) are read by boto3 itself.

Object layout, all under WARMSTART_CACHE_PREFIX:

    <prefix><sha256>.tar.gz   the cache: a gzip tar of the files under WARMSTART_CACHE_PATHS, relative
                              to the cache dir, then `.warmstart/manifest.json`, the publisher's list of
                              every file with its size and sha256 as read while it held still. Metadata
                              (all required on restore): warmstart-sha256 and warmstart-bytes (of the
                              object), warmstart-factors-sha256 (the key hash, compared with the key)
                              and warmstart-format.
    <prefix><sha256>.json     the key factors, for debugging a miss; written by the publisher that won.

    <sha256> is the hex sha256 of the canonical JSON (sorted keys, no spaces) of compute_factors().

A restore installs a file only if it is a regular file under WARMSTART_CACHE_PATHS (the restoring
pod's own list: anything else, a Hugging Face config or a shared library, say, is refused) and the
manifest lists it with the size and sha256 it has; otherwise the whole object is refused.

Node-local state lives in <cache dir>/.warmstart/ (locks, markers, temp files), which is never
published or overwritten by a restore. Locks there are flock(2)s, released by the kernel when a
pod dies: `lock` (the node lock, held while a restore renames files into place),
`fetch-<sha256>.lock` (one download per key per node), `publish-<sha256>.lock` (one publisher per
key per node), and `compiling-<sha256>-*.lock`, held by each publish sidecar until its vLLM is
healthy, so that no node publishes while another vLLM there still compiles the same key.

Log line, one per phase outcome, on stdout:

    {"event":"warmstart.compile_cache","phase":"restore","result":"restored","key":"llama-8b/<sha>.tar.gz",
     "bytes":15728640,"files":412,"seconds":1.234,"reason":null}

    restore results: restored | hit (this node already has the key) | miss (no object yet)
                     | skipped (disabled, or another pod held a lock too long)
                     | misconfigured (the bucket does not exist) | error
    publish results: published | exists (the object is there already, or another publisher won)
                     | skipped (disabled, empty cache, never healthy, never settled, another vLLM on
                     the node still compiling, another pod publishing) | misconfigured | error
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import secrets
import signal
import sys
import tarfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Mapping

# The names the code below uses; a caller imports each from the module that defines it.
from .archive import (
    BoundedTarInfo, build_archive, Changed, install_tree, manifest_limit, parse_manifest, safe_name,
    snapshot,
)
from .key import cache_key, compute_factors, factors_hash, manifest_key, resolve_factors, runs_nvidia_smi
from .node import (
    acquire, clean_stale_temp, Compiling, compiling_peers, FileLock, lock_node, LockTimeout, node_marker,
    node_has, node_has_any, remove_path, write_json_atomic,
)
from .outcome import compile_dirs, describe_error, emit_outcome, Outcome
from .s3 import (
    Ahead, bounded_call, Budget, BudgetedReader, is_missing_bucket, make_client, missing_bucket, write_stream,
)
from .settings import (
    CacheError, CHUNK, ConfigError, DeadlineExceeded, EXTRACT_S_PER_FILE, FORMAT_VERSION, MANIFEST_MEMBER,
    Misconfigured, Settings, STABLE_TRIES,
)
from .startup_plan import guard_startup_plans
from ..common.shared import s3_code as _s3_code, s3_status as _s3_status

# --------------------------------------------------------------------------------------------
# Archive: safe extraction (the rest of the archive is compile_cache_archive.py). Here, with the
# restore, because it writes every file through write_stream, which the fault tests replace
# on this module (tests/podside/test_podside_faults.py).


def extract_archive(archive: Path | Any, dest: Path, settings: Settings, key_hash: str,
                    budget: Budget | None = None) -> int:
    """Extract into `dest` (an empty staging dir) what the publisher vouched for, or refuse it all.

    `archive` is a file, or a stream read once from start to end (the download itself, so that
    unpacking overlaps the transfer); `budget` is checked before every member.

    Members are written one by one with O_EXCL|O_NOFOLLOW rather than with extractall, so no
    link, device, absolute path or `..` can place anything outside `dest`, whatever Python's
    tarfile filter defaults are in the image. Every member must be a regular file under
    WARMSTART_CACHE_PATHS (this pod's list, not the archive's), at most WARMSTART_MAX_FILES of
    them and WARMSTART_MAX_BYTES in all, each refused at its header before its data is read;
    and every one must be listed in the manifest (the last member) with its size and sha256,
    which must list nothing else. Memory stays bounded: one chunk, one header and the manifest.
    Returns the number of files.
    """
    seen: dict[str, tuple[int, str, bool]] = {}
    manifest: dict[str, tuple[int, str, bool]] | None = None
    made: set[str] = set()
    total = 0
    if isinstance(archive, (str, Path)):
        opened = tarfile.open(archive, "r:gz", tarinfo=BoundedTarInfo)
    else:
        # Inflated here, not by tarfile ("r|gz"): tarfile's stream inflates a whole read of
        # compressed input at once, however large it grows, then copies what is left of it on
        # every read (tarfile._Stream._read), so a member header cost a copy of up to ~1000
        # times the chunk read. Here each read gives at most `_OUT` bytes (zlib's max_length,
        # https://docs.python.org/3/library/zlib.html#zlib.Decompress.decompress), fed `_IN`
        # bytes at a time, so memory stays one chunk and tarfile's copies stay small.
        _IN, _OUT = 32 << 10, 32 << 10
        stream = archive

        class _Inflating:
            def __init__(self) -> None:
                self.inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing
                self.feed = memoryview(b"")

            def read(self, n: int = _OUT) -> bytes:
                inflater = self.inflater
                while not inflater.eof:
                    data: Any = inflater.unconsumed_tail
                    if not data:
                        if not self.feed:
                            chunk = stream.read(CHUNK)
                            if not chunk:
                                return b""  # truncated: tarfile reports what it lacks
                            self.feed = memoryview(chunk)
                        data, self.feed = self.feed[:_IN], self.feed[_IN:]
                    out = inflater.decompress(data, n if 0 < n < _OUT else _OUT)
                    if out:
                        return out
                return b""

        opened = tarfile.open(fileobj=_Inflating(), mode="r|", tarinfo=BoundedTarInfo, bufsize=_OUT)
    with opened as tar:
        while True:
            if budget is not None:
                budget.check()
            member = tar.next()
            # tarfile keeps every header it has read (for getmembers); they are not needed here.
            tar.members.clear()
            if member is None:
                break
            if manifest is not None:
                raise CacheError(f"archive member {member.name!r} follows the manifest")
            if member.name == MANIFEST_MEMBER:
                limit = manifest_limit(settings)
                if member.size > limit:
                    raise CacheError(f"archive manifest is {member.size} bytes, more than {limit} for "
                                     f"WARMSTART_MAX_FILES={settings.max_files}")
                source = tar.extractfile(member)
                assert source is not None
                manifest = parse_manifest(source.read(limit + 1), settings, key_hash)
                continue
            name = safe_name(member.name)
            if not settings.published_path(name):
                raise CacheError(f"archive member {name!r} is not under WARMSTART_CACHE_PATHS="
                                 f"{','.join(settings.cache_paths)}: only published cache paths are installed")
            if name in seen:
                raise CacheError(f"archive member {name!r} appears twice")
            if len(seen) >= settings.max_files:
                raise CacheError(f"archive holds more than WARMSTART_MAX_FILES={settings.max_files} files")
            total += member.size
            if total > settings.max_bytes:
                raise CacheError(f"archive expands beyond WARMSTART_MAX_BYTES={settings.max_bytes}")
            target = dest / name
            # Each directory is made once: a mkdir per member was a tenth of an unpack here
            # (one failing syscall each), and the archive lists a directory's files together.
            parent = os.path.dirname(name)
            if parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(parent)
            source = tar.extractfile(member)
            assert source is not None
            executable = bool(member.mode & 0o111)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                written, sha = write_stream(source.read, out, member.size)
                if written != member.size:
                    raise CacheError(f"archive member {member.name!r} is truncated")
                # On the open file, not the path: no second lookup, and the file is the one
                # O_EXCL|O_NOFOLLOW created (os.utime takes a descriptor where the platform
                # can, https://docs.python.org/3/library/os.html#os.utime).
                out.flush()
                os.fchmod(fd, 0o755 if executable else 0o644)
                os.utime(fd, (member.mtime, member.mtime))
            seen[name] = (written, sha, executable)
            if budget is not None:
                budget.extend(EXTRACT_S_PER_FILE)
    if manifest is None:
        raise CacheError("archive has no manifest: the publisher vouched for none of its files")
    unvouched = sorted(set(seen) - set(manifest))
    if unvouched:
        raise CacheError(f"archive member {unvouched[0]!r} is not in the publisher's manifest")
    missing = sorted(set(manifest) - set(seen))
    if missing:
        raise CacheError(f"archive lacks {missing[0]!r}, which its manifest lists")
    for name, (size, sha, _) in seen.items():
        if manifest[name][:2] != (size, sha):
            raise CacheError(f"archive member {name!r} differs from what the publisher recorded for it")
    return len(seen)


# --------------------------------------------------------------------------------------------
# restore


# The switch `warmstart drill` sets on its cache-bypassed pod (warmstart/drill/manifests.py BYPASS_ENV).
BYPASS_ENV = "WARMSTART_CACHE_BYPASS"


def restore(settings: Settings | None = None, *, client: Any = None, emit: bool = True) -> Outcome:
    """Fetch the cache for this pod's key into the node's cache dir, unless the node has it.

    Never raises: every failure becomes one `error` (or `misconfigured`) outcome, temp files
    are removed and nothing half-restored is left behind, so vLLM compiles as if this step had
    not run. The download ends within Settings.bound_s(object bytes), waiting for another pod's
    download of the same key within WARMSTART_LOCK_TIMEOUT_S.
    """
    outcome = Outcome("restore")
    start = time.monotonic()
    try:
        settings = settings or Settings.from_env()
        if os.environ.get(BYPASS_ENV) == "1":
            # `warmstart drill`'s standalone pod, whose caches are bypassed to time the fallback
            # path (docs/drill.md); the outcome line says so, and so does the cold-start record.
            outcome.result, outcome.reason = "bypassed", f"{BYPASS_ENV}=1: no restore (warmstart drill's fallback pod)"
        else:
            _restore(settings, client, outcome)
    except Misconfigured as exc:
        outcome.result, outcome.reason = "misconfigured", str(exc)
    except BaseException as exc:  # noqa: BLE001 - the contract is "never fail the pod"
        outcome.result, outcome.reason = "error", describe_error(exc)
        if not isinstance(exc, Exception):
            outcome.reason = f"interrupted: {type(exc).__name__}"
            outcome.seconds = time.monotonic() - start
            if emit:
                emit_outcome(outcome)
            raise
    outcome.seconds = time.monotonic() - start
    if emit:
        emit_outcome(outcome)
    _record_outcome(settings, outcome)
    return outcome


def _record_outcome(settings: Settings | None, outcome: Outcome) -> None:
    """The restore's outcome line, next to the key file in the pod's state directory, for the
    first-token sidecar's cold-start record (podside/first_token.py); best effort."""
    if settings is None or not settings.state_file:
        return
    try:
        settings.state_file.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(settings.state_file.parent / f"compile-cache-{outcome.phase}.json", json.loads(outcome.line()))
    except (OSError, ValueError):
        pass


def _restore(settings: Settings, client: Any, outcome: Outcome) -> None:
    # The S3 client (importing botocore and loading its S3 model, about 0.2 s of CPU) is built
    # beside the key's nvidia-smi run when the node cannot hit, having no marker of any key: that
    # run waits on the driver and leaves the thread the GIL (with a 0.2 s stand-in nvidia-smi, a
    # restore here ended ~0.13 s sooner). Without nvidia-smi the rest of the key takes a few ms,
    # there is nothing to overlap and interleaved runs showed no gain, so the client is then
    # built when needed. A hit never imports botocore.
    if client is None and settings.bucket and runs_nvidia_smi(settings.accelerator) \
            and not node_has_any(settings):
        client = Ahead(make_client, settings)
    note = guard_startup_plans(settings)
    try:
        _restore_cache(settings, client, outcome)
    finally:
        if note:
            outcome.reason = f"{outcome.reason}; {note}" if outcome.reason else note


def _restore_cache(settings: Settings, client: Any, outcome: Outcome) -> None:
    if not settings.bucket:
        outcome.result, outcome.reason = "skipped", "WARMSTART_CACHE_BUCKET is empty: pre-warm is off"
        return
    factors = compute_factors(settings)
    key = outcome.key = cache_key(settings.prefix, factors)
    key_hash = factors_hash(factors)
    note = _write_state_file(settings, key, factors)
    held = node_has(settings, key)
    if held:
        outcome.result, outcome.reason = "hit", held
        outcome.compile_dirs = compile_dirs(settings.cache_dir)
        return
    # One download per key per node: the others wait for it (it ends within its bound), then hit.
    fetching = acquire(FileLock(settings.state_dir / f"fetch-{key_hash}.lock", settings.lock_timeout_s,
                                 "the download of this key"), outcome)
    if fetching is None:
        return
    try:
        held = node_has(settings, key)
        if held:
            outcome.result, outcome.reason = "hit", held
            outcome.compile_dirs = compile_dirs(settings.cache_dir)
            return
        clean_stale_temp(settings, own=("restore", key_hash))
        base = settings.state_dir / f"tmp-restore-{key_hash}-{secrets.token_hex(6)}"
        staging = base.with_name(base.name + ".d")
        try:
            client = client.get() if isinstance(client, Ahead) else client or make_client(settings)
            fetched = _download_extracted(settings, client, key, key_hash, staging, outcome)
            if fetched is None:
                return
            size, files = fetched
            # The node lock only for the renames: local, milliseconds. Never across network I/O.
            lock = lock_node(settings, outcome)
            if lock is None:
                return
            try:
                moved = install_tree(staging, settings.cache_dir)
                try:
                    write_json_atomic(node_marker(settings, "restored", key),
                                       {"key": key, "bucket": settings.bucket, "bytes": size, "files": files,
                                        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                except BaseException:
                    for path in reversed(moved):
                        remove_path(path)
                    raise
            finally:
                lock.__exit__()
            outcome.result, outcome.bytes, outcome.files = "restored", size, files
            outcome.reason = note
            outcome.compile_dirs = compile_dirs(settings.cache_dir)
        finally:
            remove_path(staging)
    finally:
        fetching.__exit__()


def _check_metadata(meta: Mapping[str, str], key_hash: str, length: Any, settings: Settings) -> None:
    """Refuse an object before reading its body: every field the publisher writes is required."""
    if not meta.get("warmstart-sha256"):
        raise CacheError("object has no warmstart-sha256 metadata, so it cannot be verified")
    if meta.get("warmstart-format") != str(FORMAT_VERSION):
        raise CacheError(f"object has warmstart-format {meta.get('warmstart-format')!r}, not {FORMAT_VERSION}")
    if not meta.get("warmstart-factors-sha256"):
        raise CacheError("object has no warmstart-factors-sha256 metadata, so nothing says it is for this key")
    if meta["warmstart-factors-sha256"] != key_hash:
        raise CacheError("object metadata names other key factors than its key")
    if not isinstance(length, int) or length < 0:
        raise CacheError("object has no Content-Length, so its download cannot be bounded")
    if length > settings.max_bytes:
        raise CacheError(f"object is {length} bytes, over WARMSTART_MAX_BYTES={settings.max_bytes}; not downloaded")
    if meta.get("warmstart-bytes") != str(length):
        raise CacheError(f"object is {length} bytes but was published as {meta.get('warmstart-bytes')} (truncated)")


class _VerifyingReader:
    """The object's body as the extraction reads it: never more than its Content-Length, each
    read checked against the budget, every byte hashed, so the whole object is verified against
    the publisher's sha256 once it has been read."""

    _AHEAD = 8  # chunks read ahead of the extraction: 2 MiB in flight at most
    _READ = 256 << 10

    def __init__(self, body: Any, length: int, budget: Budget):
        self._body, self._length, self._budget = body, length, budget
        self.digest, self.count = hashlib.sha256(), 0
        # The network is read on its own thread, so the transfer goes on while the extraction
        # unpacks and writes (both mostly outside the GIL). That thread also counts and hashes
        # what it reads (hashlib drops the GIL for large buffers), so the object's sha256 is
        # off the extraction's path: measured here, a third of the extracting thread's time
        # was hashing. Every byte the body gives is hashed in order, and the extraction reads
        # them all (drain), so the digest is the object's.
        self._chunks: "queue.Queue[bytes | BaseException]" = queue.Queue(self._AHEAD)
        self._pending = b""
        self._done = False
        self._stop = threading.Event()
        self._filler = threading.Thread(target=self._fill, name="warmstart-read-ahead", daemon=True)
        self._filler.start()

    def _stopped(self) -> bool:
        return self._stop.is_set() or self._budget.abandoned.is_set()

    def _put(self, item: "bytes | BaseException") -> None:
        while not self._stopped():
            try:
                self._chunks.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def _fill(self) -> None:
        try:
            while not self._stopped():
                # 256 KiB reads: a read returns only when full, and the budget is checked
                # between. Reads of 64 KiB cost about half again as much CPU per byte here
                # (urllib3 works per read), on a start-up path that is CPU-bound.
                data = self._body.read(self._READ)
                self.count += len(data)
                if self.count > self._length:
                    raise CacheError(f"more than the {self._length} bytes expected "
                                     f"(WARMSTART_MAX_BYTES={self._length} at most)")
                self.digest.update(data)
                self._put(data)
                if not data:
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the extracting thread
            self._put(exc)

    def close(self) -> None:
        """Stop reading ahead; the body may be closed once this returns."""
        self._stop.set()
        self._filler.join(timeout=1)  # a read stuck on the socket ends when the body is closed

    def _next(self) -> bytes:
        while True:
            self._budget.check()
            try:
                item = self._chunks.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            return item

    def read(self, n: int = -1) -> bytes:
        self._budget.check()
        if not self._pending and not self._done:
            self._pending = self._next()
            self._done = not self._pending
        want = len(self._pending) if n is None or n < 0 else n
        if want >= len(self._pending):  # the usual case: tarfile asks for more than a chunk
            data, self._pending = self._pending, b""
        else:
            data, self._pending = self._pending[:want], self._pending[want:]
        return data

    def drain(self) -> None:
        """Read what the extraction left (tar padding, the gzip trailer), so all of it is hashed."""
        while self.read(self._READ):
            pass


def _corrupt(sha: str, expected: str) -> CacheError:
    return CacheError(f"object sha256 {sha[:12]}... does not match the published {expected[:12]}... (corrupt)")


def _download_extracted(settings: Settings, client: Any, key: str, key_hash: str, staging: Path,
                        outcome: Outcome) -> tuple[int, int] | None:
    """Download the object and unpack it into `staging` as it arrives (extract_archive), then
    check the whole object against the size and sha256 the publisher recorded; nothing in
    `staging` is installed unless both match. Within Settings.bound_s: the base until the
    response headers, then base + Content-Length / floor rate from the start. (bytes, files),
    or None when there is no object (a miss)."""
    budget = Budget(f"download of s3://{settings.bucket}/{key}", settings.bound_s())
    readers: list[_VerifyingReader] = []

    def fetch(budget: Budget) -> tuple[int, int]:
        response = client.get_object(Bucket=settings.bucket, Key=key)
        body = response["Body"]
        try:
            budget.check()
            # Servers differ in the case of metadata names (S3 lower-cases them, rclone capitalises).
            meta = {k.lower(): v for k, v in (response.get("Metadata") or {}).items()}
            length = response.get("ContentLength")
            _check_metadata(meta, key_hash, length, settings)
            budget.allow(settings.bound_s(length))
            expected = meta["warmstart-sha256"]
            reader = _VerifyingReader(body, length, budget)
            readers.append(reader)
            staging.mkdir()
            try:
                files = extract_archive(reader, staging, settings, key_hash, budget)
                reader.drain()
            except (tarfile.TarError, EOFError, ValueError, zlib.error, CacheError) as exc:
                # A damaged object usually fails as an archive first: say so when its bytes are
                # not the published ones, else the archive's own reason.
                if isinstance(exc, DeadlineExceeded):
                    raise
                try:
                    reader.drain()
                except Exception:  # noqa: BLE001 - the first failure is the one to report
                    raise exc from None
                if reader.digest.hexdigest() != expected:
                    raise _corrupt(reader.digest.hexdigest(), expected) from exc
                raise
            if reader.count != length:
                raise CacheError(f"object ended after {reader.count} of its {length} bytes (truncated)")
            if reader.digest.hexdigest() != expected:
                raise _corrupt(reader.digest.hexdigest(), expected)
            return length, files
        finally:
            for r in readers:
                r.close()
            body.close()
            if budget.abandoned.is_set():  # the waiting thread has given up: leave nothing behind
                remove_path(staging)

    try:
        return bounded_call(budget, fetch)
    except Exception as exc:
        if is_missing_bucket(exc):
            raise missing_bucket(settings) from exc
        if _s3_code(exc) in ("NoSuchKey", "404", "NotFound") or _s3_status(exc) == 404:
            outcome.result, outcome.reason = "miss", "no cache published for this key yet"
            return None
        raise


def _write_state_file(settings: Settings, key: str, factors: Mapping[str, Any]) -> str | None:
    if not settings.state_file:
        return None
    try:
        settings.state_file.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(settings.state_file, {"key": key, "factors": factors})
    except OSError as exc:
        return f"state file not written: {describe_error(exc)}"
    return None


# --------------------------------------------------------------------------------------------
# publish


def wait_for_health(url: str, timeout_s: float, max_interval_s: float) -> bool:
    """Poll until `url` answers 200. Starts at 1 s and backs off to `max_interval_s`, so a
    model that loads for ten minutes costs a handful of requests. False after `timeout_s`
    (0: never)."""
    # Imported here, by the sidecar only: the restore on the pod's start-up path never polls, and
    # urllib.request (with http.client and email) was a fifth of its imports.
    import urllib.error
    import urllib.request

    # No proxies: a cluster-wide HTTP_PROXY must not capture a request to the pod's own loopback.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = None if timeout_s <= 0 else time.monotonic() + timeout_s
    interval = min(1.0, max_interval_s)
    while True:
        try:
            with opener.open(url, timeout=5) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(interval, remaining))
        else:
            time.sleep(interval)
        interval = min(interval * 2, max_interval_s)


def publish(settings: Settings | None = None, *, client: Any = None, wait: bool = True, emit: bool = True) -> Outcome:
    """Once vLLM serves, upload the node's cache under this pod's key unless it is there already.

    The upload is a conditional write (If-None-Match: *), so of several nodes publishing one key
    exactly one object is ever written on S3; the losers see 412 and report `exists`. Only files
    that held still over WARMSTART_SETTLE_S before and while they were archived are published,
    and only once no other vLLM on the node still compiles this key. No lock is held across the
    upload but this key's publish lease. Never raises, like restore.
    """
    outcome = Outcome("publish")
    start = time.monotonic()
    try:
        settings = settings or Settings.from_env()
        _publish(settings, client, outcome, wait=wait)
    except Misconfigured as exc:
        outcome.result, outcome.reason = "misconfigured", str(exc)
    except BaseException as exc:  # noqa: BLE001
        outcome.result, outcome.reason = "error", describe_error(exc)
        if not isinstance(exc, Exception):
            outcome.reason = f"interrupted: {type(exc).__name__}"
            outcome.seconds = time.monotonic() - start - (outcome.waited_s or 0)
            if emit:
                emit_outcome(outcome)
            raise
    # The work itself; the wait for vLLM is reported apart, in waited_s.
    outcome.seconds = time.monotonic() - start - (outcome.waited_s or 0)
    if emit:
        emit_outcome(outcome)
    return outcome


def object_exists(client: Any, bucket: str, key: str) -> bool | None:
    """True or False from a HEAD; None when S3 will not say (403, see describe_error)."""
    try:
        client.head_object(Bucket=bucket, Key=key)
        return True
    except Exception as exc:
        status = _s3_status(exc)
        if status == 404:
            return False
        if status == 403:
            return None
        raise


def _wait_for_peers(settings: Settings, key_hash: str, waited_from: float) -> bool:
    """Wait until no other vLLM on the node compiles this key (their leases are free), within
    WARMSTART_HEALTH_TIMEOUT_S of `waited_from` (0: no limit). False if they never finish."""
    deadline = None if settings.health_timeout_s <= 0 else waited_from + settings.health_timeout_s
    while compiling_peers(settings, key_hash):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(min(settings.poll_interval_s, 1.0))
    return True


def _publish(settings: Settings, client: Any, outcome: Outcome, *, wait: bool) -> None:
    if not settings.bucket:
        outcome.result, outcome.reason = "skipped", "WARMSTART_CACHE_BUCKET is empty: pre-warm is off"
        return
    factors = resolve_factors(settings, prefer_state_file=True)
    key = outcome.key = cache_key(settings.prefix, factors)
    key_hash = factors_hash(factors)
    held = node_has(settings, key)
    if held:  # checked before the wait, so a restarted sidecar settles at once
        outcome.result, outcome.reason = "exists", held
        return
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    waited_from = time.monotonic()
    compiling = Compiling(settings, key_hash)
    try:
        if wait:
            healthy = wait_for_health(settings.health_url, settings.health_timeout_s, settings.poll_interval_s)
            outcome.waited_s = time.monotonic() - waited_from
            if not healthy:
                outcome.result = "skipped"
                outcome.reason = f"{settings.health_url} never answered 200 within {settings.health_timeout_s:g} s"
                return
    finally:
        compiling.release()
    # Another vLLM on this node may still be writing this key's files (some in place): a copy
    # taken now could carry a half-written one to every node that restores it.
    peers_done = _wait_for_peers(settings, key_hash, waited_from)
    if wait or time.monotonic() - waited_from > 0.5:
        outcome.waited_s = time.monotonic() - waited_from
    if not peers_done:
        outcome.result = "skipped"
        outcome.reason = (f"another vLLM on this node was still compiling this key after "
                          f"{settings.health_timeout_s:g} s (WARMSTART_HEALTH_TIMEOUT_S); it publishes when done")
        return
    publishing = FileLock(settings.state_dir / f"publish-{key_hash}.lock", 0, "the publish lease of this key")
    try:
        publishing.__enter__()
    except LockTimeout:
        outcome.result, outcome.reason = "skipped", "another pod on this node is publishing this key"
        return
    tmp_archive = settings.state_dir / f"tmp-publish-{key_hash}-{secrets.token_hex(6)}.tar.gz"
    try:
        held = node_has(settings, key)
        if held:
            outcome.result, outcome.reason = "exists", held
            return
        clean_stale_temp(settings, own=("publish", key_hash))
        client = client or make_client(settings)
        # HEAD first: skips building the archive in the common case that another node won long
        # ago. It is also what keeps a second publisher from overwriting on servers that ignore
        # If-None-Match (rclone's `serve s3` 1.75 does); the conditional PUT closes the race
        # on S3 itself.
        head = Budget(f"HEAD s3://{settings.bucket}/{key}", settings.bound_s())
        if bounded_call(head, lambda _: object_exists(client, settings.bucket, key)):
            outcome.result, outcome.reason = "exists", "already in the bucket"
            _mark_published(settings, key, None)
            return
        entries = _stable_archive(settings, tmp_archive, key_hash, outcome)
        if entries is None:
            return
        size, sha = _file_digest(tmp_archive)
        outcome.bytes, outcome.files = size, len(entries)
        metadata = {"warmstart-sha256": sha, "warmstart-bytes": str(size), "warmstart-format": str(FORMAT_VERSION),
                    "warmstart-factors-sha256": key_hash}

        def upload(budget: Budget) -> None:
            with open(tmp_archive, "rb") as f:
                client.put_object(Bucket=settings.bucket, Key=key, Body=BudgetedReader(f, budget),
                                  ContentLength=size, ContentType="application/gzip", Metadata=metadata,
                                  IfNoneMatch="*")

        try:
            bounded_call(Budget(f"upload of {size} bytes to s3://{settings.bucket}/{key}", settings.bound_s(size)),
                     upload)
        except Exception as exc:
            if is_missing_bucket(exc):
                raise missing_bucket(settings) from exc
            # 412: another publisher won. 409 ConditionalRequestConflict: one is writing right now.
            if _s3_status(exc) in (409, 412) or _s3_code(exc) in ("PreconditionFailed", "ConditionalRequestConflict"):
                outcome.result, outcome.reason = "exists", "another publisher won the conditional write"
                _mark_published(settings, key, None)
                return
            raise
        outcome.result = "published"
        _mark_published(settings, key, sha)
        body = json.dumps({"key": key, "factors": factors, "sha256": sha, "bytes": size, "files": len(entries),
                           "publisher": os.environ.get("HOSTNAME"), "node": os.environ.get("NODE_NAME")},
                          indent=1, sort_keys=True).encode()
        try:
            bounded_call(Budget(f"PUT s3://{settings.bucket}/{manifest_key(key)}", settings.bound_s(len(body))),
                     lambda _: client.put_object(Bucket=settings.bucket, Key=manifest_key(key),
                                                 ContentType="application/json", Body=body))
        except Exception as exc:
            outcome.reason = f"factors manifest not written: {describe_error(exc)}"
    finally:
        remove_path(tmp_archive)
        publishing.__exit__()


_KEPT_CHANGING = "cache kept changing"


def publish_until_settled(settings: Settings | None = None, *, client: Any = None,
                          sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """The sidecar's publish: once vLLM is healthy, and again after WARMSTART_PUBLISH_RETRY_S
    (doubling, WARMSTART_PUBLISH_RETRIES times) while the cache keeps changing. Besides the
    compile cache the archive carries JIT caches (FlashInfer, the CUDA driver's) that a first
    request may still fill after /health; one busy minute must not cost the node's whole publish.
    Each try logs its own line. Never raises."""
    outcome = publish(settings, client=client)
    try:
        settings = settings or Settings.from_env()
    except ConfigError:
        return outcome
    for attempt in range(settings.publish_retries):
        if outcome.result != "skipped" or not (outcome.reason or "").startswith(_KEPT_CHANGING):
            break
        sleep(settings.publish_retry_s * 2 ** attempt)
        outcome = publish(settings, client=client, wait=False)  # vLLM answered /health already
    return outcome


def _mark_published(settings: Settings, key: str, sha: str | None) -> None:
    """Remember that the bucket has this key, so a restarted sidecar does not publish again."""
    try:
        write_json_atomic(node_marker(settings, "published", key), {"key": key, "sha256": sha,
                           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    except OSError:
        pass  # only an optimisation; the HEAD answers the same question next time


def _stable_archive(settings: Settings, out: Path, key_hash: str, outcome: Outcome) -> list[list[Any]] | None:
    """Tar the cache only if no file changed over WARMSTART_SETTLE_S before it was archived nor
    while it was read: a file vLLM is still writing in place changes size or mtime within that
    interval. None, with the outcome set, when the cache is empty, too big or never settles."""
    for _ in range(STABLE_TRIES):
        before = snapshot(settings)
        if not before:
            outcome.result = "skipped"
            outcome.reason = ("cache is empty (eager mode, or vLLM compiled into a directory outside "
                              f"WARMSTART_CACHE_PATHS={','.join(settings.cache_paths)})")
            return None
        total = sum(size for size, _, _ in before.values())
        if total > settings.max_bytes:
            outcome.result = "skipped"
            outcome.reason = f"cache is {total} bytes, over WARMSTART_MAX_BYTES={settings.max_bytes}"
            return None
        if len(before) > settings.max_files:
            outcome.result = "skipped"
            outcome.reason = f"cache has {len(before)} files, over WARMSTART_MAX_FILES={settings.max_files}"
            return None
        time.sleep(settings.settle_s)
        files = snapshot(settings)
        if files != before:
            continue
        try:
            entries = build_archive(settings, files, out, key_hash)
        except Changed:
            remove_path(out)
            continue
        if snapshot(settings) == files:
            return entries
        remove_path(out)
    outcome.result = "skipped"
    outcome.reason = (f"{_KEPT_CHANGING}: {STABLE_TRIES} tries found a file that changed within "
                      f"WARMSTART_SETTLE_S={settings.settle_s:g} s or while it was archived")
    return None


def _file_digest(path: Path) -> tuple[int, str]:
    with open(path, "rb") as f:
        return write_stream(f.read, _NullWriter(), 1 << 62)


class _NullWriter:
    def write(self, data: bytes) -> int:
        return len(data)


# --------------------------------------------------------------------------------------------
# Command line


def _idle_forever() -> None:
    """A sidecar that exits is restarted and would publish again; one that sleeps is not."""
    while True:
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("restore", help="init container: restore the node's cache from S3 (always exits 0)")
    pub = sub.add_parser("publish", help="sidecar: publish once vLLM is healthy, then idle")
    pub.add_argument("--once", action="store_true", help="return after publishing instead of idling (tests)")
    key = sub.add_parser("key", help="print the object key for this environment")
    key.add_argument("--json", action="store_true", help="print the key and its factors as JSON")
    args = parser.parse_args(argv)

    # As PID 1 in its container this process would ignore SIGTERM and hold up pod shutdown for
    # the whole grace period; exiting runs the `finally` blocks that remove temp files.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    if args.command == "restore":
        restore()
        return 0
    if args.command == "publish":
        if args.once:
            publish()
            return 0
        publish_until_settled()
        _idle_forever()
        return 0
    try:
        settings = Settings.from_env()
        factors = compute_factors(settings)
    except (ConfigError, CacheError) as exc:
        print(f"warmstart compile_cache key: {exc}", file=sys.stderr)
        return 2
    k = cache_key(settings.prefix, factors)
    print(json.dumps({"bucket": settings.bucket, "key": k, "factors": factors}, indent=1, sort_keys=True)
          if args.json else k)
    return 0


def exit_now(code: int) -> None:
    """End the process without the interpreter's teardown. Run as the init container's command,
    the restore is on the pod's start-up path, and tearing down an interpreter that has loaded
    botocore and built a client costs CPU for nothing: measured here, a restore that downloads
    ended about 25 ms sooner (a hit about 8 ms), a bare client build 60-100 ms. Nothing is lost
    by skipping it (os._exit runs no cleanup handlers and flushes no stdio buffers,
    https://docs.python.org/3/library/os.html#os._exit): every file this tool writes is closed
    and its temp files removed before main returns, its own threads are daemons it has given
    up on, and stdout and stderr are flushed here."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)

