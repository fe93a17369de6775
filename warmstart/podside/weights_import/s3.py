"""The weights import's S3 side: errors, the client, bounded JSON reads, the managed transfers.

Part of weights_import.py, whose docstring has the job, the environment and the log;
shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..common.shared import (
    make_s3_client, parse_json as _parse_json, s3_code as _s3_code, s3_status as _s3_status,
)
from .settings import (
    AccessError, MIB, PERMANENT_S3_CODES, Settings, SMALL_READ_S, TransferError,
)

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
    # Pooled connections for every transfer thread; botocore's own retries for throttling and
    # 5xx, on top of this script's per-file attempts. A boto3 session's client: boto3's transfer
    # manager (Transfers) runs on it.
    return make_s3_client(region=settings.region, connect_timeout_s=10, read_timeout_s=120, max_attempts=5,
                          max_pool_connections=settings.max_concurrency + 4, with_boto3=True)


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


class KnownSize:
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
