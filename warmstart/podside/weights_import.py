#!/usr/bin/env python3
"""Copy a model's weights into its S3 `source` prefix, verify them, and record a manifest.

Why: a stack whose model bucket is created by the same `pulumi up` starts with an empty
bucket, and vLLM without weights crash-loops on a GPU node until the Deployment times out. The
import Job runs this script on a non-GPU node before the Deployment is created. It is shipped
into the pod through a ConfigMap and run with the model's own vLLM image, which has boto3 (for
the Run:ai streamer) and huggingface_hub (for Hub downloads), so there is no other image:

    python3 /opt/warmstart/weights_import.py

What it copies: only what vLLM reads, directly under the source prefix (the Run:ai streamer
does not list recursively): the `*.safetensors` weights, `*.json` config and tokenizer files,
tokenizer vocabularies (`*.model`, `*.tiktoken`, `*.txt`), chat templates (`*.jinja`) and
`*.py` for remote code. Files in sub-folders (`original/`, `onnx/`, ...) are never copied.
When the source has `model.safetensors.index.json`, the weights are exactly the shards it
names (vLLM loads only those; a `consolidated.safetensors` beside them is skipped).

How: from S3, boto3's managed transfer does server-side copies (multipart `UploadPartCopy`
above WARMSTART_PART_BYTES), many files and parts at once on one thread pool; nothing passes
through the pod. From the Hugging Face Hub, `huggingface_hub.snapshot_download` fetches the
pinned commit into WARMSTART_SCRATCH_DIR (it honours HF_ENDPOINT and HF_TOKEN, and hf_transfer
when installed), and the same transfer manager uploads the files (multipart, threaded).

Order, so that a half-done import is never taken for a whole one:
    check     the destination's manifest: if it names this source and revision and every key it
              lists is there with its size, nothing is copied (and the source is not contacted);
    plan      list the source, pick the files, and verify them BEFORE copying anything:
              config.json, at least one shard, every shard the index names, and the total
              against WARMSTART_WEIGHTS_GIB;
    copy      only what is missing or differs in size at the destination (an interrupted run
              is completed by the next), each file retried WARMSTART_RETRIES times. Sizes
              cannot tell two revisions apart, so over another import everything is copied,
              and that import's manifest is first replaced by an "incomplete" one, so it never
              vouches for files that are partly this import's;
    verify    list the destination again: every file there with its source size, every shard
              of the index, the total against weightsGiB, no stray shard vLLM would load;
    manifest  `warmstart-manifest.json` next to the weights, written LAST: keys, sizes, ETags,
              total bytes, source, revision and time.

Environment (read once, in Settings.from_env):

    WARMSTART_MODEL             model name, for messages. Required.
    WARMSTART_DEST_BUCKET       bucket of the model's `source`. Required.
    WARMSTART_DEST_PREFIX       key prefix of the model's `source` (no trailing slash). Required.
    WARMSTART_WEIGHTS_GIB       the model's configured weightsGiB. Required.
    WARMSTART_SOURCE_S3         `s3://bucket/prefix` to copy from; or else
    WARMSTART_HF_REPO           a Hub repository id, with
    WARMSTART_HF_REVISION       the commit to copy (40 hex characters).
    WARMSTART_SCRATCH_DIR       Hub download directory (an emptyDir). Default /scratch.
    WARMSTART_MAX_CONCURRENCY   transfer threads (parts and files). Default 16.
    WARMSTART_PART_BYTES        multipart threshold and part size. Default 64 MiB (S3's minimum is 5 MiB).
    WARMSTART_RETRIES           attempts per file (and per Hub listing or download). Default 3.
    WARMSTART_SMALL_READ_S      the most one small JSON read (manifest, index, config) may take,
                                all its attempts together. Default 60.
    WARMSTART_TERMINATION_LOG   where the failure reason is written for `kubectl describe` and
                                `pulumi up`. Default /dev/termination-log where it exists (in a pod).
    HF_TOKEN, HF_ENDPOINT, HF_HUB_*  read by huggingface_hub itself.
    AWS_REGION, AWS_ENDPOINT_URL and the rest of the AWS environment (IRSA) are read by boto3.

Exit codes (the Job's podFailurePolicy fails the Job at once on 2, 3 and 4: a retry cannot help):

    0  imported and verified, or already complete (nothing copied)
    2  the environment is not a usable configuration
    3  the source or destination cannot be read or written: not found, access denied, a gated
       or private Hub repository without a token that may read it, an unknown revision
    4  verification failed: no config.json, no shard, a shard the index names is missing, the
       total disagrees with weightsGiB, stray shards at the destination
    5  a transfer still failed after its retries, a small file's read was cut short on every
       attempt or took longer than WARMSTART_SMALL_READ_S, or the scratch disk is too small
    143  SIGTERM (the Job's deadline, a node drain): in-flight transfers are cancelled, nothing
       is recorded as complete, the next run resumes. A SIGTERM after the complete manifest
       reached S3 (looked up when its write was in flight) is 0: the import is complete. The
       final line says which, and what S3 holds.
    1  anything else (a bug: the log line has the exception)

Under faults: a JSON file (manifest, index, config) whose body disagrees with its Content-Length
or its listed size is read again, never taken whole; one nested deeper than MAX_JSON_DEPTH or over
MAX_JSON_BYTES is "unreadable" (an index: exit 4; the destination's manifest: it vouches for
nothing and everything is copied again). From the Hub every downloaded file is hashed against
the Hub's published sha256 (LFS files) or git blob id (the others) before any upload; from S3
the copy is server-side and S3 itself checks it (the manifest records ETags and the part size).

Log: one JSON line per phase on stdout, e.g.

    {"event":"warmstart.weights_import","phase":"copy","result":"copied","model":"llama","files":4,
     "bytes":16060522496,"seconds":93.2,"reason":null}
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

if __package__:  # imported as warmstart.podside.* (the tests, the renderer)
    from .podside_common import parse_json as _parse_json, s3_code as _s3_code, s3_status as _s3_status
else:  # run as a file from the ConfigMap's folder, which is sys.path[0]: flat modules
    from podside_common import parse_json as _parse_json, s3_code as _s3_code, s3_status as _s3_status

EVENT = "warmstart.weights_import"
FORMAT = "warmstart-weights-import/1"
MANIFEST_NAME = "warmstart-manifest.json"
INDEX_NAME = "model.safetensors.index.json"
GIB = 1 << 30
MIB = 1 << 20
# How far the measured safetensors total may be from weightsGiB. People write a rounded figure
# (15 for Llama-3.1-8B's 14.96 GiB); within 5 % the streamer concurrency, ceil(weights / 4 GiB),
# moves by at most one worker, while a wrong model, another precision (FP8 is half of BF16) or
# a missing shard is far outside it. warmstart.decisions.weights_import has the same number.
WEIGHTS_TOLERANCE = 0.05
# What vLLM reads from the model prefix: weights, config and tokenizer files, chat templates,
# remote code. Top-level names only (matched against names without a "/").
WANTED_PATTERNS = ("*.safetensors", "*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py")
HF_COMMIT = re.compile(r"^[0-9a-f]{40}$")
S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<prefix>[^\s]*[^\s/])/?$")
# S3 answers these for a request that will never succeed: no point retrying.
PERMANENT_S3_CODES = frozenset({"AccessDenied", "NoSuchBucket", "NoSuchKey", "InvalidAccessKeyId",
                                "SignatureDoesNotMatch", "AllAccessDisabled", "InvalidObjectState",
                                "AccountProblem", "InvalidBucketName"})

DEFAULT_TERMINATION_LOG = "/dev/termination-log"

EXIT_OK, EXIT_BUG, EXIT_CONFIG, EXIT_ACCESS, EXIT_VERIFY, EXIT_TRANSFER = 0, 1, 2, 3, 4, 5
EXIT_TERMINATED = 143


class ImportFailure(RuntimeError):
    """An expected failure: its exit code and a message that says what to do."""

    exit_code = EXIT_BUG


class ConfigError(ImportFailure):
    exit_code = EXIT_CONFIG


class AccessError(ImportFailure):
    exit_code = EXIT_ACCESS


class VerifyError(ImportFailure):
    exit_code = EXIT_VERIFY


class TransferError(ImportFailure):
    exit_code = EXIT_TRANSFER


class Interrupted(ImportFailure):
    exit_code = 143  # EXIT_TERMINATED


# --------------------------------------------------------------------------------------------
# Settings


def termination_log(env: Mapping[str, str]) -> Path | None:
    """Where the failure reason goes: WARMSTART_TERMINATION_LOG, else the file Kubernetes mounts
    into every container (none outside a pod)."""
    given = env.get("WARMSTART_TERMINATION_LOG", "").strip()
    if given:
        return Path(given)
    return Path(DEFAULT_TERMINATION_LOG) if Path(DEFAULT_TERMINATION_LOG).is_file() else None


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything this script reads from the environment, validated once."""

    model: str
    dest_bucket: str
    dest_prefix: str
    weights_gib: float
    s3_bucket: str | None
    s3_prefix: str | None
    hf_repo: str | None
    hf_revision: str | None
    scratch_dir: Path
    max_concurrency: int
    part_bytes: int
    retries: int
    region: str | None
    termination_log: Path | None
    small_read_s: float = 60.0
    """WARMSTART_SMALL_READ_S: the most one small JSON read may take, all its attempts together."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        problems: list[str] = []

        def text(name: str, required: bool = False) -> str:
            value = env.get(name, "").strip()
            if required and not value:
                problems.append(f"{name} is not set")
            return value

        def number(name: str, default: float, *, integer: bool = False, minimum: float = 0) -> Any:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = int(raw) if integer else float(raw)
            except ValueError:
                problems.append(f"{name}={raw!r} is not {'an integer' if integer else 'a number'}")
                return default
            if value < minimum:
                problems.append(f"{name}={raw!r} must be >= {minimum}")
            return value

        prefix = text("WARMSTART_DEST_PREFIX", required=True).strip("/")
        weights_gib = number("WARMSTART_WEIGHTS_GIB", 0.0)
        if not env.get("WARMSTART_WEIGHTS_GIB", "").strip():
            problems.append("WARMSTART_WEIGHTS_GIB is not set")
        elif weights_gib <= 0:
            problems.append("WARMSTART_WEIGHTS_GIB must be > 0")
        s3_uri, repo, revision = text("WARMSTART_SOURCE_S3"), text("WARMSTART_HF_REPO"), text("WARMSTART_HF_REVISION")
        s3_bucket = s3_prefix = None
        if bool(s3_uri) == bool(repo):
            problems.append("set exactly one of WARMSTART_SOURCE_S3 or WARMSTART_HF_REPO")
        if s3_uri:
            m = S3_URI.match(s3_uri)
            if m is None:
                problems.append(f"WARMSTART_SOURCE_S3={s3_uri!r} is not s3://bucket/prefix")
            else:
                s3_bucket, s3_prefix = m["bucket"], m["prefix"].strip("/")
            if revision:
                problems.append("WARMSTART_HF_REVISION applies only to a Hugging Face import")
        if repo and not HF_COMMIT.match(revision):
            problems.append(f"WARMSTART_HF_REVISION={revision!r} must be a 40-hex commit (a branch or tag can move)")
        part = number("WARMSTART_PART_BYTES", 64 * MIB, integer=True, minimum=5 * MIB)
        term = termination_log(env)
        settings = cls(
            model=text("WARMSTART_MODEL", required=True),
            dest_bucket=text("WARMSTART_DEST_BUCKET", required=True),
            dest_prefix=prefix,
            weights_gib=weights_gib,
            s3_bucket=s3_bucket,
            s3_prefix=s3_prefix,
            hf_repo=repo or None,
            hf_revision=revision or None,
            scratch_dir=Path(text("WARMSTART_SCRATCH_DIR") or "/scratch"),
            max_concurrency=number("WARMSTART_MAX_CONCURRENCY", 16, integer=True, minimum=1),
            part_bytes=part,
            retries=number("WARMSTART_RETRIES", 3, integer=True, minimum=1),
            region=text("AWS_REGION") or text("AWS_DEFAULT_REGION") or None,
            termination_log=term,
            small_read_s=number("WARMSTART_SMALL_READ_S", SMALL_READ_S, minimum=1),
        )
        if (s3_bucket is not None and settings.dest_bucket == s3_bucket
                and (f"{s3_prefix}/".startswith(f"{prefix}/") or f"{prefix}/".startswith(f"{s3_prefix}/"))):
            problems.append(f"the source s3://{s3_bucket}/{s3_prefix} overlaps the destination "
                            f"s3://{settings.dest_bucket}/{prefix}")
        if problems:
            raise ConfigError("; ".join(problems))
        return settings

    @property
    def source(self) -> str:
        """What the manifest records as the source: `s3://bucket/prefix` or `hf://<repo>`."""
        return f"s3://{self.s3_bucket}/{self.s3_prefix}" if self.s3_bucket else f"hf://{self.hf_repo}"

    @property
    def revision(self) -> str | None:
        return self.hf_revision

    @property
    def destination(self) -> str:
        return f"s3://{self.dest_bucket}/{self.dest_prefix}"

    def dest_key(self, name: str) -> str:
        return f"{self.dest_prefix}/{name}"


# --------------------------------------------------------------------------------------------
# The log line


@dataclasses.dataclass
class Phase:
    """One phase's outcome; `line()` is its one JSON log line."""

    name: str
    model: str
    result: str = "error"
    files: int | None = None
    bytes: int | None = None
    reason: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    started: float = dataclasses.field(default_factory=time.monotonic)

    def line(self) -> str:
        record = {"event": EVENT, "phase": self.name, "result": self.result, "model": self.model,
                  "files": self.files, "bytes": self.bytes,
                  "seconds": round(time.monotonic() - self.started, 3),
                  "reason": None if self.reason is None else self.reason[:2000], **self.extra}
        return json.dumps(record, separators=(",", ":"), sort_keys=False)


def emit(phase: Phase) -> None:
    sys.stdout.write(phase.line() + "\n")
    sys.stdout.flush()


def gib(n: int | float) -> float:
    return n / GIB


def wanted(name: str) -> bool:
    """A top-level file vLLM reads (never the manifest)."""
    return "/" not in name and name != MANIFEST_NAME and any(fnmatch.fnmatchcase(name, p) for p in WANTED_PATTERNS)


# --------------------------------------------------------------------------------------------
# S3


def describe_error(exc: BaseException) -> str:
    code, status = _s3_code(exc), _s3_status(exc)
    if code or status:
        message = exc.response.get("Error", {}).get("Message") or ""  # type: ignore[attr-defined]
        return f"S3 {code} ({status}): {message}".strip()
    return f"{type(exc).__name__}: {exc}"


def is_permanent_s3(exc: BaseException) -> bool:
    return _s3_code(exc) in PERMANENT_S3_CODES or _s3_status(exc) in (403, 404)


def make_client(settings: Settings) -> Any:
    import boto3
    from botocore.config import Config

    # Pooled connections for every transfer thread; botocore's own retries for throttling and
    # 5xx, on top of this script's per-file attempts.
    config = Config(connect_timeout=10, read_timeout=120, max_pool_connections=settings.max_concurrency + 4,
                    retries={"max_attempts": 5, "mode": "standard"})
    return boto3.session.Session().client("s3", region_name=settings.region, config=config)


def transfer_config(settings: Settings) -> Any:
    from boto3.s3.transfer import TransferConfig

    kwargs = dict(multipart_threshold=settings.part_bytes, multipart_chunksize=settings.part_bytes,
                  max_concurrency=settings.max_concurrency, use_threads=True)
    try:
        # The classic manager everywhere: the same behaviour on every node type and boto3 build.
        return TransferConfig(preferred_transfer_client="classic", **kwargs)
    except TypeError:  # boto3 before 1.28 has no CRT choice at all
        return TransferConfig(**kwargs)


def list_prefix(client: Any, bucket: str, prefix: str) -> dict[str, dict[str, Any]]:
    """Top-level objects under `prefix/`: name -> {"bytes", "etag"} (one level: Delimiter "/")."""
    out: dict[str, dict[str, Any]] = {}
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": f"{prefix}/", "Delimiter": "/"}
    while True:
        page = client.list_objects_v2(**kwargs)
        for obj in page.get("Contents", []) or []:
            name = obj["Key"][len(prefix) + 1:]
            if name and "/" not in name:
                out[name] = {"bytes": int(obj["Size"]), "etag": str(obj.get("ETag", "")).strip('"')}
        if not page.get("IsTruncated"):
            return out
        kwargs["ContinuationToken"] = page["NextContinuationToken"]


#: Largest JSON file read into memory (a manifest, config or safetensors index: a 405B model's
#: index is about 100 KB, so this is 160 times that). A larger object is "unreadable", never an
#: OOM kill of the Job: `json.loads` of a document made of many small entries takes up to
#: ~50 times its size in memory (JSON_PARSE_FACTOR keeps a margin over that) (measured by tests/podside/test_podside_hardening_24.py),
#: and warmstart.manifests.weights_import sizes the Job's memory limit from both numbers.
MAX_JSON_BYTES = 16 * MIB
JSON_PARSE_FACTOR = 60
#: Deepest nesting accepted: an index, a config or a manifest is a few levels deep. Deeper is
#: refused before Python's recursion limit turns it into a RecursionError.
MAX_JSON_DEPTH = 64
#: The unreadable-document marker every caller tests for (a dict, so `.get` works on it).
UNREADABLE = "_unreadable"


class Truncated(RuntimeError):
    """A body shorter (or longer) than its Content-Length or its listed size: a transient fault
    of the connection or of a proxy, retried; never taken for the whole document."""


def parse_json(body: bytes) -> Any:
    """A JSON document, or {UNREADABLE: why} for anything that is not one this script may read:
    over MAX_JSON_BYTES, not UTF-8, not JSON, or nested deeper than MAX_JSON_DEPTH. Never raises."""
    if len(body) > MAX_JSON_BYTES:
        return {UNREADABLE: f"over {MAX_JSON_BYTES} bytes"}
    doc, why = _parse_json(body, MAX_JSON_DEPTH)
    return {UNREADABLE: why} if why else doc


def _read_body(client: Any, bucket: str, key: str, expected: int | None) -> bytes | None:
    """One GET of a small object: its bytes (at most MAX_JSON_BYTES + 1), None when there is
    none. Raises Truncated when the body disagrees with its Content-Length or the listed size.
    A response without a Content-Length (`Transfer-Encoding: chunked`, as a proxy or gateway
    that streams sends it, https://www.rfc-editor.org/rfc/rfc9112#section-6.1) is framed by its
    chunks: a body cut short lacks the last chunk, which the HTTP client reports as an error."""
    try:
        response = client.get_object(Bucket=bucket, Key=key)
    except Exception as exc:
        if _s3_code(exc) != "NoSuchBucket" and (_s3_code(exc) in ("NoSuchKey", "404", "NotFound")
                                                 or _s3_status(exc) == 404):
            return None
        raise
    stream = response["Body"]
    try:
        given = response.get("ContentLength")
        length = int(given) if given is not None else None
        if (length or 0) > MAX_JSON_BYTES or (expected is not None and expected > MAX_JSON_BYTES):
            return b" " * (MAX_JSON_BYTES + 1)  # over the limit: parse_json refuses it
        try:
            body = stream.read(MAX_JSON_BYTES + 1)
        except Exception as exc:  # noqa: BLE001 - botocore/urllib3 raise their own on a cut connection
            if _s3_code(exc):
                raise
            raise Truncated(f"reading {key} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        stream.close()
    if (length is not None and len(body) != length) or (expected is not None and len(body) != expected):
        raise Truncated(f"{key}: read {len(body)} bytes, Content-Length {length}"
                        + (f", listed {expected}" if expected is not None else ""))
    return body


#: The most one small read may take, all attempts together (WARMSTART_SMALL_READ_S): botocore's
#: read_timeout bounds each socket read, not a body trickled a byte at a time.
SMALL_READ_S = 60.0


def _within(seconds: float, fn: Callable[[], Any]) -> Any:
    """fn() in a thread of its own, or TimeoutError after `seconds` (the thread is left to end
    with its connection; it holds nothing else)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True, name="warmstart-small-read")
    t.start()
    t.join(max(0.0, seconds))
    if t.is_alive():
        raise TimeoutError(f"not read within {seconds:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def read_json(client: Any, bucket: str, key: str, expected: int | None = None, retries: int = 3,
              deadline_s: float = SMALL_READ_S) -> Any | None:
    """A small JSON object, or None when there is none; {UNREADABLE: why} when it is not one
    this script may read (see parse_json). A body cut short (against its Content-Length, or
    `expected`, the size the listing gave) is read again, `retries` attempts in all, then a
    TransferError (exit 5, the Job retries): a transient fault is never a verdict on the file.
    All attempts together take at most `deadline_s` (a stalled or trickled body is a
    TransferError then). A missing bucket is not "none": it raises (NoSuchBucket), so the caller
    reports it."""
    last: Exception | None = None
    end = time.monotonic() + deadline_s
    for attempt in range(1, max(1, retries) + 1):
        try:
            body = _within(end - time.monotonic(), lambda: _read_body(client, bucket, key, expected))
        except TimeoutError as exc:
            raise TransferError(f"s3://{bucket}/{key} was not read within {deadline_s:g} s "
                                f"(WARMSTART_SMALL_READ_S; a stalled or trickling connection): {last or exc}") from None
        except Truncated as exc:
            last = exc
            if attempt < retries:
                time.sleep(max(0.0, min(min(2 ** attempt, 30) / 4, end - time.monotonic())))
            continue
        return None if body is None else parse_json(body)
    raise TransferError(f"s3://{bucket}/{key} was cut short on every one of {retries} reads: {last}")


#: How long a failed or interrupted copy waits for the transfers it cancelled to wind down
#: (in-flight requests finish, queued ones are dropped) before the process exits without them:
#: well inside the pod's 30 s termination grace period.
CANCEL_WAIT_S = 10.0


class Transfers:
    """One s3transfer TransferManager and every future submitted to it.

    A failure or SIGTERM cancels the futures one by one (`TransferFuture.cancel()`) instead of
    `TransferManager.shutdown(cancel=True)`, which raises a TypeError in every s3transfer
    release: it passes its arguments to `_shutdown` out of order
    (https://github.com/boto/s3transfer/issues/143, https://github.com/boto/s3transfer/issues/312).
    Waiting for the cancelled transfers is bounded: issue 143 also reports that waiting after a
    cancel can deadlock, so the wait runs on a daemon thread and the process exits without it
    (`abandoned`, see `main`)."""

    abandoned = False
    """Set when a cancelled transfer did not wind down in time: the process must exit with
    os._exit, since Python joins the manager's worker threads at a normal exit."""

    def __init__(self, client: Any, config: Any) -> None:
        from boto3.s3.transfer import create_transfer_manager

        self.manager = create_transfer_manager(client, config)
        self.futures: list[Any] = []

    def copy(self, **kwargs: Any) -> Any:
        future = self.manager.copy(**kwargs)
        self.futures.append(future)
        return future

    def upload(self, *args: Any, **kwargs: Any) -> Any:
        future = self.manager.upload(*args, **kwargs)
        self.futures.append(future)
        return future

    def close(self) -> None:
        """After every future finished: nothing is in flight, the wait returns at once."""
        self.manager.shutdown()

    def cancel(self, timeout_s: float = CANCEL_WAIT_S) -> bool:
        """Cancel what is queued or running and wait up to `timeout_s` for it; True if it ended."""
        for future in self.futures:
            try:
                if not future.done():
                    future.cancel()
            except Exception:  # noqa: BLE001 - cancelling is best effort, the exit is not
                pass
        waiter = threading.Thread(target=self._wait, daemon=True)
        waiter.start()
        waiter.join(timeout_s)
        if waiter.is_alive():
            Transfers.abandoned = True
            return False
        return True

    def _wait(self) -> None:
        try:
            self.manager.shutdown()  # cancel=False: only waits; the cancels were sent above
        except BaseException:  # noqa: BLE001 - on a daemon thread: nothing to report to
            pass


class _KnownSize:
    """Tells the transfer manager a copy's size, so it skips a HEAD of the source."""

    def __init__(self, size: int):
        self.size = size

    def on_queued(self, future: Any, **_: Any) -> None:
        future.meta.provide_transfer_size(self.size)

    def on_progress(self, **_: Any) -> None:
        pass

    def on_done(self, **_: Any) -> None:
        pass


def transfer_all(settings: Settings, manager: Any, names: list[str],
                 submit: Callable[[Any, str], Any], what: str) -> int:
    """Run `submit(manager, name)` for every name on the one transfer manager (all at once, its
    threads shared), retrying failed files up to `settings.retries` attempts in all. Returns
    the attempts used."""
    pending = list(names)
    attempt = 0
    while pending:
        attempt += 1
        futures = [(name, submit(manager, name)) for name in pending]
        failed: list[tuple[str, BaseException]] = []
        for name, future in futures:
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001 - sorted below
                if is_permanent_s3(exc):
                    raise AccessError(f"{what} {name}: {describe_error(exc)}") from exc
                failed.append((name, exc))
        if not failed:
            return attempt
        if attempt >= settings.retries:
            detail = "; ".join(f"{n}: {describe_error(e)}" for n, e in failed[:5])
            raise TransferError(f"{what} failed for {len(failed)} file(s) after {attempt} attempts: {detail}")
        time.sleep(min(2 ** attempt, 30))
        pending = [name for name, _ in failed]
    return attempt


# --------------------------------------------------------------------------------------------
# Sources: what is there, and how it gets to the destination


@dataclasses.dataclass(frozen=True)
class SourceFile:
    name: str
    bytes: int
    sha256: str | None = None
    """The content's sha256 the source publishes (the Hub's LFS `oid`), checked after download."""
    git_sha1: str | None = None
    """The Hub's git blob id of a file kept in git (not LFS), checked after download."""
    etag: str | None = None
    """An S3 source object's ETag: a destination object with the same one holds the same bytes."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(8 * MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def git_blob_sha1(path: Path) -> str:
    """Git's id of a blob: sha1 of `blob <size>\\0` and the content (https://git-scm.com/book/en/v2/Git-Internals-Git-Objects)."""
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(8 * MIB), b""):
            h.update(chunk)
    return h.hexdigest()


class S3Source:
    """Another `s3://bucket/prefix`, copied server-side."""

    def __init__(self, settings: Settings, client: Any):
        self.settings, self.client = settings, client
        self.hashes: dict[str, str] = {}  # a server-side copy never sees the bytes
        assert settings.s3_bucket and settings.s3_prefix

    def list(self) -> dict[str, SourceFile]:
        s = self.settings
        try:
            found = list_prefix(self.client, s.s3_bucket, s.s3_prefix)
        except Exception as exc:
            if is_permanent_s3(exc):
                raise AccessError(f"cannot list the import source {s.source}: {describe_error(exc)}; fix: check "
                                  "that it exists and that import.s3 names it") from exc
            raise
        if not found:
            raise VerifyError(f"the import source {s.source} holds no objects directly under its prefix; fix: "
                              "point import.s3 at the folder that holds config.json and the *.safetensors shards")
        return {n: SourceFile(n, v["bytes"], etag=v["etag"] or None) for n, v in found.items()}

    def read_json(self, name: str, size: int | None = None) -> Any | None:
        return read_json(self.client, self.settings.s3_bucket, f"{self.settings.s3_prefix}/{name}", size,
                         self.settings.retries, self.settings.small_read_s)

    def copy(self, files: list[SourceFile], manager: Any) -> int:
        s, sizes = self.settings, {f.name: f.bytes for f in files}

        def submit(mgr: Any, name: str) -> Any:
            # TaggingDirective REPLACE (with no tags): the copy needs no s3:GetObjectTagging on the source.
            return mgr.copy(copy_source={"Bucket": s.s3_bucket, "Key": f"{s.s3_prefix}/{name}"},
                            bucket=s.dest_bucket, key=s.dest_key(name),
                            extra_args={"TaggingDirective": "REPLACE"}, subscribers=[_KnownSize(sizes[name])],
                            source_client=self.client)

        return transfer_all(s, manager, sorted(sizes), submit, "copying")


def prove_by_hash(client: Any, bucket: str, key: str, f: SourceFile) -> str | None:
    """The object's sha256 when its bytes are the ones the source publishes (`f.sha256`, or the
    git blob id `f.git_sha1`), else None (also when it cannot be read: it is then copied)."""
    sha = hashlib.sha256()
    blob = hashlib.sha1(b"blob %d\0" % f.bytes) if f.git_sha1 else None
    try:
        stream = client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            seen = 0
            for chunk in iter(lambda: stream.read(8 * MIB), b""):
                seen += len(chunk)
                sha.update(chunk)
                if blob is not None:
                    blob.update(chunk)
        finally:
            stream.close()
    except Exception:  # noqa: BLE001 - unproven: copied
        return None
    if seen != f.bytes:
        return None
    if f.sha256:
        return sha.hexdigest() if sha.hexdigest() == f.sha256 else None
    return sha.hexdigest() if blob is not None and blob.hexdigest() == f.git_sha1 else None


def _hub() -> Any:
    """huggingface_hub, with hf_transfer switched on where this version still uses it (< 1.0)."""
    try:
        version = importlib.metadata.version("huggingface_hub")
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError("huggingface_hub is not installed in this image; fix: use an image that has it "
                          "(vLLM's does), or import from S3") from None
    if (int(version.split(".")[0]) < 1 and importlib.util.find_spec("hf_transfer") is not None
            and "HF_HUB_ENABLE_HF_TRANSFER" not in os.environ):
        os.environ["HF_HUB_ENABLE_HF_TRANSFER"] = "1"
    import huggingface_hub

    return huggingface_hub


def _hub_errors(hub: Any) -> dict[str, type]:
    """The Hub's error classes across versions (`huggingface_hub.errors` since 0.23, `.utils` before)."""
    found = {}
    for module_name in ("huggingface_hub.errors", "huggingface_hub.utils"):
        try:
            module = __import__(module_name, fromlist=["_"])
        except ImportError:
            continue
        for name in ("GatedRepoError", "RepositoryNotFoundError", "RevisionNotFoundError",
                     "EntryNotFoundError", "HfHubHTTPError", "LocalEntryNotFoundError"):
            if name not in found and hasattr(module, name):
                found[name] = getattr(module, name)
    return found


class HubSource:
    """A Hugging Face Hub repository at a pinned commit: downloaded to scratch, then uploaded."""

    def __init__(self, settings: Settings, client: Any):
        self.settings, self.client = settings, client
        self.hub = _hub()
        self.errors = _hub_errors(self.hub)
        self.local_dir = settings.scratch_dir / "files"
        self.token_given = bool(os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"))
        self.hashes: dict[str, str] = {}
        """name -> sha256 of what this run downloaded, checked and uploaded (the manifest records it)."""

    def _status(self, exc: BaseException) -> int | None:
        response = getattr(exc, "response", None)
        return getattr(response, "status_code", None)

    def _failure(self, exc: BaseException, what: str) -> ImportFailure | None:
        """An AccessError for what no retry can fix, else None (transient)."""
        s, e = self.settings, self.errors
        repo, url = s.hf_repo, f"https://huggingface.co/{s.hf_repo}"
        if isinstance(exc, e.get("GatedRepoError", ())):
            if self.token_given:
                return AccessError(f"{repo} is a gated repository and the token's account may not read it; fix: "
                                   f"accept its license at {url} with the account the token belongs to")
            return AccessError(f"{repo} is a gated repository and no token is set; fix: accept its license at "
                               f"{url}, then `pulumi config set --secret warmstart:huggingFaceToken hf_...` "
                               "(a read token of that account) and run `pulumi up` again")
        if isinstance(exc, e.get("RevisionNotFoundError", ())):
            return AccessError(f"{repo} has no revision {s.hf_revision}; fix: set import.huggingFace.revision to "
                               f"a commit of {url}/commits/main")
        if isinstance(exc, e.get("RepositoryNotFoundError", ())) or self._status(exc) in (401, 403, 404):
            return AccessError(f"{repo} was not found, or is private and "
                               f"{'the token may not read it' if self.token_given else 'no token is set'}; fix: "
                               "check import.huggingFace.repo, or set warmstart:huggingFaceToken to a token "
                               f"that can read it ({what}: {type(exc).__name__})")
        return None

    def _retry(self, fn: Callable[[], Any], what: str) -> Any:
        last: BaseException | None = None
        for attempt in range(1, self.settings.retries + 1):
            try:
                return fn()
            except ImportFailure:
                raise
            except Exception as exc:  # noqa: BLE001 - sorted by _failure
                failure = self._failure(exc, what)
                if failure is not None:
                    raise failure from exc
                last = exc
                if attempt < self.settings.retries:
                    time.sleep(min(2 ** attempt, 30))
        raise TransferError(f"{what} of {self.settings.hf_repo}@{self.settings.hf_revision} failed after "
                            f"{self.settings.retries} attempts: {type(last).__name__}: {last}")

    def list(self) -> dict[str, SourceFile]:
        s = self.settings

        def tree() -> dict[str, SourceFile]:
            api = self.hub.HfApi()
            out = {}
            for entry in api.list_repo_tree(s.hf_repo, revision=s.hf_revision, recursive=False):
                size = getattr(entry, "size", None)
                if size is not None and not getattr(entry, "tree_id", None):  # a file, not a folder
                    # The Hub publishes an LFS file's sha256 (`lfs.sha256`, the pointer's oid)
                    # and a git file's blob id (`blob_id`): huggingface_hub's RepoFile,
                    # https://huggingface.co/docs/huggingface_hub/package_reference/hf_api#huggingface_hub.hf_api.RepoFile
                    lfs = getattr(entry, "lfs", None)
                    sha256 = getattr(lfs, "sha256", None) or (lfs.get("sha256") if isinstance(lfs, dict) else None)
                    blob = getattr(entry, "blob_id", None)
                    out[entry.path] = SourceFile(entry.path, int(size), str(sha256).lower() if sha256 else None,
                                                 None if sha256 or not blob else str(blob).lower())
            return out

        return self._retry(tree, "listing")

    def read_json(self, name: str, size: int | None = None) -> Any | None:
        s = self.settings
        if size is not None and size > MAX_JSON_BYTES:
            return {UNREADABLE: f"over {MAX_JSON_BYTES} bytes"}

        def fetch() -> Path:
            return Path(self.hub.hf_hub_download(s.hf_repo, name, revision=s.hf_revision,
                                                 local_dir=str(self.local_dir),
                                                 cache_dir=str(s.scratch_dir / "hub-cache")))

        path = self._retry(fetch, f"downloading {name}")
        with open(path, "rb") as fh:
            return parse_json(fh.read(MAX_JSON_BYTES + 1))

    def copy(self, files: list[SourceFile], manager: Any) -> int:
        s = self.settings
        need = sum(f.bytes for f in files)
        s.scratch_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(s.scratch_dir).free
        if need > free:
            raise TransferError(f"the scratch disk {s.scratch_dir} has {gib(free):.2f} GiB free and the download "
                                f"needs {gib(need):.2f} GiB; fix: raise the import Job's scratch size")

        def download() -> None:
            self.hub.snapshot_download(s.hf_repo, revision=s.hf_revision, local_dir=str(self.local_dir),
                                       cache_dir=str(s.scratch_dir / "hub-cache"),
                                       allow_patterns=sorted(f.name for f in files),
                                       max_workers=min(s.max_concurrency, 8))

        # Content, not only sizes: every file is hashed against what the Hub publishes for it,
        # before anything is uploaded. A mismatch is downloaded again (the file removed, so
        # the client fetches it anew); one that persists fails verification (exit 4).
        bad: list[str] = []
        for attempt in range(1, s.retries + 1):
            self._retry(download, "downloading")
            bad = []
            for f in files:
                path = self.local_dir / f.name
                if not path.is_file() or path.stat().st_size != f.bytes:
                    got = path.stat().st_size if path.is_file() else None
                    raise TransferError(f"downloaded {f.name} is {got} bytes, the Hub lists {f.bytes}")
                why = self._content_mismatch(f, path)
                if why:
                    bad.append(why)
                    path.unlink(missing_ok=True)
            if not bad:
                break
        if bad:
            raise VerifyError(f"{s.model}: {len(bad)} file(s) downloaded from {s.hf_repo}@{s.hf_revision} differ from "
                              f"what the Hub publishes for them, on each of {s.retries} downloads: {'; '.join(bad[:4])}; "
                              "nothing was uploaded; fix: check the network path to the Hub (a proxy rewriting "
                              "content), then run `pulumi up` again")
        self.hashes = {f.name: file_sha256(self.local_dir / f.name) for f in files}

        def submit(mgr: Any, name: str) -> Any:
            return mgr.upload(str(self.local_dir / name), s.dest_bucket, s.dest_key(name))

        return self._upload(files, manager, submit)

    def _content_mismatch(self, f: SourceFile, path: Path) -> str | None:
        if f.sha256:
            got = file_sha256(path)
            return None if got == f.sha256 else f"{f.name}: sha256 {got}, the Hub's LFS sha256 is {f.sha256}"
        if f.git_sha1:
            got = git_blob_sha1(path)
            return None if got == f.git_sha1 else f"{f.name}: git blob id {got}, the Hub's is {f.git_sha1}"
        return None

    def _upload(self, files: list[SourceFile], manager: Any, submit: Callable[[Any, str], Any]) -> int:
        s = self.settings

        attempts = transfer_all(s, manager, sorted(f.name for f in files), submit, "uploading")
        shutil.rmtree(self.local_dir, ignore_errors=True)
        return attempts


# --------------------------------------------------------------------------------------------
# The checks


def weights_of(names: Iterable[str], index: Any | None) -> tuple[list[str], list[str]]:
    """(the weight files vLLM loads, the other *.safetensors present): with an index, exactly
    the shards it names; without one, every top-level *.safetensors."""
    shards = sorted(n for n in names if n.endswith(".safetensors"))
    if isinstance(index, dict) and isinstance(index.get("weight_map"), dict):
        named = sorted(set(str(v) for v in index["weight_map"].values()))
        return named, [n for n in shards if n not in named]
    return shards, []


def check_weights_total(settings: Settings, total: int, where: str) -> None:
    measured, configured = gib(total), settings.weights_gib
    if abs(measured - configured) > WEIGHTS_TOLERANCE * configured:
        raise VerifyError(
            f"{settings.model}: the safetensors weights {where} total {measured:.2f} GiB ({total} bytes) but "
            f"weightsGiB is {configured:g} ({(measured - configured) / configured:+.1%}, more than the "
            f"{WEIGHTS_TOLERANCE:.0%} tolerance); fix: set weightsGiB: {measured:.2f} for model {settings.model} "
            "(the streamer concurrency, tensor parallelism and start-up budget are derived from it), or "
            "import the model you meant")


def check_files(settings: Settings, present: Mapping[str, int], index: Any | None, where: str
                ) -> tuple[list[str], list[str]]:
    """The rules a set of files (name -> bytes) must meet for vLLM; (weights, other shards)."""
    if "config.json" not in present:
        raise VerifyError(f"{settings.model}: {where} has no config.json, which vLLM needs; fix: import the "
                          "folder of a Hugging Face-format model (config.json beside the *.safetensors)")
    if isinstance(index, dict) and UNREADABLE in index:
        raise VerifyError(f"{settings.model}: {INDEX_NAME} at {where} is not a safetensors index this import reads "
                          f"({index[UNREADABLE]}); fix: import a model whose index is a safetensors index "
                          f"(at most {MAX_JSON_BYTES >> 20} MiB, nested at most {MAX_JSON_DEPTH} deep)")
    if index is not None and not (isinstance(index, dict) and isinstance(index.get("weight_map"), dict)):
        raise VerifyError(f"{settings.model}: {INDEX_NAME} at {where} is not a safetensors index (no weight_map)")
    weights, others = weights_of(present, index)
    if not weights:
        raise VerifyError(f"{settings.model}: {where} has no *.safetensors weights (the Run:ai streamer loads "
                          "only safetensors); fix: import a repository or prefix with safetensors shards")
    missing = [w for w in weights if w not in present]
    if missing:
        raise VerifyError(f"{settings.model}: {INDEX_NAME} at {where} names {len(missing)} shard(s) that are not "
                          f"there: {', '.join(missing[:8])}; fix: import a complete copy of the model")
    check_weights_total(settings, sum(present[w] for w in weights), where)
    return weights, others


# --------------------------------------------------------------------------------------------
# The import


def manifest_complete(settings: Settings, manifest: Any, dest: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why the destination is not a complete import of this source and revision (None: it is)."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return "no manifest" if manifest is None else "the manifest is not one this script wrote"
    if manifest.get("source") != settings.source or manifest.get("revision") != settings.revision:
        return f"the manifest records {manifest.get('source')}@{manifest.get('revision')}"
    if manifest.get("status") != "complete":
        return "an import of this source was interrupted"
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        return "the manifest lists no files"
    if not all(isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("bytes"), int)
               for f in files):
        return "the manifest is not one this script wrote (malformed file list)"
    index = manifest.get("index_shards")
    if index is not None and not (isinstance(index, list)
                                  and all(isinstance(n, str) and n in dest for n in index)):
        return "the manifest's index shards are malformed or missing at the destination"
    for f in files:
        have = dest.get(str(f.get("name")))
        if have is None or have["bytes"] != f.get("bytes"):
            return f"{f.get('name')} is {'missing' if have is None else 'a different size'}"
    return None


def run(settings: Settings, client: Any = None) -> int:
    """The whole import; its phases log one line each. Returns the exit code (never raises
    an ImportFailure)."""
    client = client or make_client(settings)
    s = settings

    # check: a complete import of this source and revision is left alone.
    phase = Phase("check", s.model)
    try:
        dest = list_prefix(client, s.dest_bucket, s.dest_prefix)
        # A manifest that is cut short on the way is read again (read_json); one that is not a
        # document this script wrote (corrupt, nested, foreign) vouches for nothing: the import
        # goes on as over another import's files (everything copied), never fails on it.
        manifest = read_json(client, s.dest_bucket, s.dest_key(MANIFEST_NAME),
                             dest[MANIFEST_NAME]["bytes"] if MANIFEST_NAME in dest else None, s.retries,
                             s.small_read_s)
    except Exception as exc:
        return _fail(s, phase, AccessError(f"cannot read the destination {s.destination}: {describe_error(exc)}")
                     if is_permanent_s3(exc) else exc)
    why = manifest_complete(s, manifest, dest)
    same_source = isinstance(manifest, dict) and manifest.get("source") == s.source \
        and manifest.get("revision") == s.revision
    if why is None:
        weights = [str(f["name"]) for f in manifest["files"] if str(f["name"]).endswith(".safetensors")]
        index = manifest.get("index_shards")
        try:
            check_weights_total(s, sum(int(dest[w]["bytes"]) for w in (index or weights)), f"at {s.destination}")
        except VerifyError as exc:
            return _fail(s, phase, exc)
        phase.result, phase.files = "complete", len(manifest["files"])
        phase.bytes = sum(int(f["bytes"]) for f in manifest["files"])
        phase.reason = f"{s.destination} already holds {s.source}" + (f"@{s.revision}" if s.revision else "")
        emit(phase)
        emit(Phase("done", s.model, result="unchanged", files=0, bytes=0, extra={"exit_code": EXIT_OK}))
        return EXIT_OK
    phase.result, phase.reason, phase.files = ("incomplete" if manifest is not None else "absent"), why, len(dest)
    emit(phase)

    try:
        source = S3Source(s, client) if s.s3_bucket else HubSource(s, client)
    except ImportFailure as exc:
        return _fail(s, Phase("plan", s.model), exc)

    # plan: what the source has, verified before anything is written.
    phase = Phase("plan", s.model)
    try:
        listing = source.list()
        picked = {n: f for n, f in listing.items() if wanted(n)}
        index = source.read_json(INDEX_NAME, picked[INDEX_NAME].bytes) if INDEX_NAME in picked else None
        weights, skipped = check_files(s, {n: f.bytes for n, f in picked.items()}, index, f"the source {s.source}")
        files = {n: f for n, f in picked.items() if n not in skipped}
        # Sizes say whether a file is there already only for a copy of this same source (its
        # manifest, "incomplete" over another import's files, says so), and then only for a file
        # whose ETag is not one that was there before it started: two revisions' shards often
        # have the same size. Files of unknown origin (no manifest: an interrupted first import,
        # an older tool, a hand copy) are proven or copied: from S3 by an ETag equal to the
        # source's (S3 computes both from the bytes), from the Hub by hashing the object against
        # the Hub's sha256 or git blob id (an S3 read instead of a Hub download).
        resumable = same_source
        replaced = (manifest.get("replacing_etags") or {}) if same_source and manifest.get("status") == "incomplete" \
            else {}
        if not isinstance(replaced, dict):  # a hand-edited or foreign manifest: trust no ETag in it
            replaced = {}

        def present(n: str, f: SourceFile) -> bool:
            if n not in dest or dest[n]["bytes"] != f.bytes:
                return False
            if f.etag and dest[n]["etag"] == f.etag:
                return True
            if resumable:
                return dest[n]["etag"] != replaced.get(n)
            if manifest is None and (f.sha256 or f.git_sha1):
                got = prove_by_hash(client, s.dest_bucket, s.dest_key(n), f)
                if got is not None:
                    proven[n] = got
                    return True
            return False

        proven: dict[str, str] = {}

        todo = sorted((f for n, f in files.items() if not present(n, f)), key=lambda f: f.name)
        strays = sorted(n for n in dest if n.endswith(".safetensors") and n not in files)
        if strays and index is None:
            raise VerifyError(
                f"{s.model}: {s.destination} holds *.safetensors that are not part of {s.source}: "
                f"{', '.join(strays[:8])}; vLLM (no index) would load them too; fix: delete them, e.g. "
                f"`aws s3 rm {s.destination}/{strays[0]}` (the import may not delete), and run `pulumi up` again")
    except Exception as exc:  # noqa: BLE001
        return _fail(s, phase, exc)
    phase.result, phase.files = "planned", len(files)
    phase.bytes = sum(f.bytes for f in files.values())
    phase.extra = {"to_copy": len(todo), "to_copy_bytes": sum(f.bytes for f in todo),
                   "weights_bytes": sum(files[w].bytes for w in weights), "skipped": sorted(skipped) or None,
                   "strays": strays or None}
    emit(phase)

    # copy: only what is missing or differs.
    phase = Phase("copy", s.model)
    attempts = 0
    if todo and manifest is not None and not same_source:
        # Overwriting another import: first say so where its manifest was, or an interrupted run
        # would leave that manifest vouching for files that are partly this import's.
        try:
            client.put_object(Bucket=s.dest_bucket, Key=s.dest_key(MANIFEST_NAME), ContentType="application/json",
                              Body=json.dumps({"format": FORMAT, "status": "incomplete", "model": s.model,
                                               "source": s.source, "revision": s.revision,
                                               "replacing": {k: manifest.get(k) for k in ("source", "revision")}
                                               if isinstance(manifest, dict) else None,
                                               "replacing_etags": {n: v["etag"] for n, v in sorted(dest.items())},
                                               "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                              indent=1, sort_keys=True).encode())
        except Exception as exc:  # noqa: BLE001
            return _fail(s, phase, AccessError(f"cannot write the manifest: {describe_error(exc)}")
                         if is_permanent_s3(exc) else exc)
    if todo:
        transfers = Transfers(client, transfer_config(s))
        try:
            attempts = source.copy(todo, transfers)
        except BaseException as exc:
            ended = transfers.cancel()
            if not ended:
                phase.extra = {"cancelled_transfers": "still running after "
                                                      f"{CANCEL_WAIT_S:g} s; exiting without them"}
            if not isinstance(exc, Exception):
                phase.reason = f"interrupted: {type(exc).__name__}"
                emit(phase)
                raise
            return _fail(s, phase, exc)
        transfers.close()
    phase.result = "copied" if todo else "nothing-to-copy"
    phase.files, phase.bytes = len(todo), sum(f.bytes for f in todo)
    phase.extra = {"attempts": attempts, "kind": "s3-server-side" if s.s3_bucket else "hub-download-upload"}
    emit(phase)

    # verify: the destination itself, listed again.
    phase = Phase("verify", s.model)
    try:
        dest = list_prefix(client, s.dest_bucket, s.dest_prefix)
        wrong = [n for n, f in files.items() if n not in dest or dest[n]["bytes"] != f.bytes]
        if wrong:
            raise VerifyError(f"{s.model}: after the copy {s.destination} lacks or has other sizes for "
                              f"{', '.join(sorted(wrong)[:8])}")
        dest_index = read_json(client, s.dest_bucket, s.dest_key(INDEX_NAME), int(dest[INDEX_NAME]["bytes"]),
                               s.retries, s.small_read_s) if INDEX_NAME in files and INDEX_NAME in dest else None
        check_files(s, {n: int(v["bytes"]) for n, v in dest.items() if n in files}, dest_index,
                    f"the destination {s.destination}")
    except Exception as exc:  # noqa: BLE001
        return _fail(s, phase, exc)
    phase.result, phase.files = "verified", len(files)
    phase.bytes = sum(f.bytes for f in files.values())
    emit(phase)

    # manifest: last, and only now.
    phase = Phase("manifest", s.model)
    weights_bytes = sum(files[w].bytes for w in weights)
    # A file an earlier run of this import uploaded was hashed against the Hub's sha256 before
    # its upload: the Hub's value is its sha256 as much as this run's hashes are.
    copied = {f.name for f in todo}
    sha256s = {n: f.sha256 for n, f in files.items() if f.sha256 and n not in copied and resumable} \
        | {n: v for n, v in proven.items() if n not in copied} | source.hashes
    record = {
        "format": FORMAT, "status": "complete", "model": s.model, "source": s.source, "revision": s.revision,
        "destination": s.destination,
        "files": [{"name": n, "key": s.dest_key(n), "bytes": int(dest[n]["bytes"]), "etag": dest[n]["etag"]}
                  | ({"sha256": sha256s[n]} if n in sha256s else {}) for n in sorted(files)],
        # The part size of this run's multipart copies and uploads: with it an object's ETag
        # (the MD5 of its parts' MD5s) can be recomputed from a copy of its bytes (weights_stage).
        "part_bytes": s.part_bytes,
        "total_bytes": sum(f.bytes for f in files.values()), "weights_bytes": weights_bytes,
        "weights_gib": round(gib(weights_bytes), 4), "configured_weights_gib": s.weights_gib,
        "index_shards": weights if index is not None else None,
        "imported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "copied_files": len(todo),
    }
    # What a SIGTERM from here on reports depends on whether the manifest reached S3 (_terminated).
    _MANIFEST.update(state="writing", client=client, settings=s, imported_at=record["imported_at"])
    try:
        client.put_object(Bucket=s.dest_bucket, Key=s.dest_key(MANIFEST_NAME), ContentType="application/json",
                          Body=json.dumps(record, indent=1, sort_keys=True).encode())
    except Exception as exc:  # noqa: BLE001
        _MANIFEST["state"] = None
        return _fail(s, phase, AccessError(f"cannot write the manifest: {describe_error(exc)}")
                     if is_permanent_s3(exc) else exc)
    _MANIFEST["state"] = "written"
    phase.result, phase.files, phase.bytes = "written", len(files), record["total_bytes"]
    emit(phase)
    emit(Phase("done", s.model, result="imported", files=len(todo), bytes=sum(f.bytes for f in todo),
               extra={"exit_code": EXIT_OK}))
    return EXIT_OK


def _fail(settings: Settings | None, phase: Phase, exc: BaseException) -> int:
    """Log the phase as failed, leave the reason where Kubernetes shows it, return the exit code."""
    if isinstance(exc, ImportFailure):
        code, reason = exc.exit_code, str(exc)
    elif _s3_code(exc) or _s3_status(exc):
        code, reason = EXIT_TRANSFER, describe_error(exc)
    else:
        code, reason = EXIT_BUG, f"{type(exc).__name__}: {exc}"
    phase.result, phase.reason = "error", reason
    phase.extra = {**phase.extra, "exit_code": code}
    emit(phase)
    path = settings.termination_log if settings else termination_log(os.environ)
    if path is not None:
        try:
            path.write_text(f"weights import failed ({phase.name}): {reason}\n"[:4000])
        except OSError:
            pass
    return code


def main(argv: list[str] | None = None) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    # As PID 1 this process would ignore SIGTERM (the Job's deadline, a node drain) and hold up
    # the pod for the whole grace period: the handler unwinds the run (its transfers are
    # cancelled on the way, see Transfers) and the process exits 143 (128 + SIGTERM).
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        settings = Settings.from_env()
    except ConfigError as exc:
        return _fail(None, Phase("check", os.environ.get("WARMSTART_MODEL", "?")), exc)
    try:
        code = run(settings)
    except ImportFailure as exc:
        code = _fail(settings, Phase("done", settings.model), exc)
    except Terminated:
        code = _terminated(settings)
        terminated = True
    else:
        terminated = False
    if Transfers.abandoned or code == EXIT_TERMINATED or terminated:
        # Cancelled transfers may still hold worker threads, which a normal exit joins.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


class Terminated(BaseException):
    """SIGTERM, raised in the main thread wherever it waits (a BaseException, so no
    `except Exception` on the way swallows it)."""


_MANIFEST: dict[str, Any] = {"state": None}
"""The complete manifest's write: state None (not begun, or failed), "writing" (sent, no answer
yet: S3 may hold it) or "written" (S3 answered), with what _terminated needs to look."""


def _what_s3_holds(seconds: float = 5.0) -> str | None:
    """The manifest's state as S3 has it now: "written" (this run's complete manifest is there),
    None (it is not), "unknown" (it could not be read within `seconds`)."""
    state = _MANIFEST.get("state")
    if state != "writing":
        return state
    s: Settings = _MANIFEST["settings"]
    try:
        doc = read_json(_MANIFEST["client"], s.dest_bucket, s.dest_key(MANIFEST_NAME), None, 1, seconds)
    except Exception:  # noqa: BLE001 - said as such
        return "unknown"
    ours = isinstance(doc, dict) and doc.get("status") == "complete" and doc.get("source") == s.source \
        and doc.get("revision") == s.revision and doc.get("imported_at") == _MANIFEST.get("imported_at")
    return "written" if ours else None


def _sigterm_outcome(state: str | None, settings: Settings | None, extra: str = "") -> tuple[int, str]:
    """(exit code, the final line's reason) of a SIGTERM, by what S3 holds."""
    where = f"{settings.destination} " if settings else ""
    if state == "written":
        return EXIT_OK, (f"terminated by SIGTERM after the complete manifest reached S3{extra}: {where}holds a "
                         "complete, verified import; a rerun copies nothing")
    if state == "unknown":
        return EXIT_TERMINATED, (f"terminated by SIGTERM (the Job's deadline or a node drain) while the complete "
                                 f"manifest was being written{extra}; whether S3 holds it could not be read; a rerun "
                                 "checks it and copies nothing if it does")
    return EXIT_TERMINATED, (f"terminated by SIGTERM (the Job's deadline or a node drain){extra}; {where}holds no "
                             "complete manifest (nothing was recorded as complete), a rerun resumes the copy")


def _terminated(settings: Settings) -> int:
    """The one final line after SIGTERM: what S3 holds, looked up when the manifest was in flight."""
    code, reason = _sigterm_outcome(_what_s3_holds(), settings)
    if code == EXIT_OK:
        emit(Phase("done", settings.model, result="imported", reason=reason, extra={"exit_code": EXIT_OK}))
        return EXIT_OK
    return _fail(settings, Phase("done", settings.model), Interrupted(reason))


#: After SIGTERM the process is gone by this many seconds, whatever its unwinding is doing: the
#: exception is raised wherever the main thread is, inside a library's locking too, and a
#: cancelled transfer's lock left held would hang it for good. Inside the pod's 30 s grace
#: period, after the transfers' own CANCEL_WAIT_S.
TERM_DEADLINE_S = 20.0


def _on_sigterm(*_: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one unwinding; the cleanup is not interrupted
    threading.Thread(target=_exit_by_deadline, args=(TERM_DEADLINE_S,), daemon=True).start()
    raise Terminated()


def _exit_by_deadline(deadline_s: float) -> None:
    """SIGTERM's backstop: the final record and exit 143, written without the locks the stuck
    main thread may hold (os.write, not sys.stdout)."""
    time.sleep(deadline_s)
    state = _MANIFEST.get("state")
    code, reason = _sigterm_outcome("unknown" if state == "writing" else state, _MANIFEST.get("settings"),
                                    f"; the run did not wind down within {deadline_s:g} s")
    phase = Phase("done", os.environ.get("WARMSTART_MODEL", "?"), result="imported" if code == EXIT_OK else "error",
                  reason=reason, extra={"exit_code": code})
    try:
        os.write(1, (phase.line() + "\n").encode())
        path = termination_log(os.environ)
        if path is not None and code != EXIT_OK:
            path.write_text(f"weights import failed (done): {reason}\n")
    except OSError:
        pass
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
