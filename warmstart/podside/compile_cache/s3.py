"""The compile-cache tool's S3 client and the deadlines on its requests.

Part of compile_cache.py, whose docstring has the commands, the environment and the object
layout; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any, Callable

from .settings import CacheError, CHUNK, DeadlineExceeded, Misconfigured, Settings
from ..common.shared import s3_code as _s3_code

# --------------------------------------------------------------------------------------------
# Deadlines


class Budget:
    """The bound one network operation must meet, and the flag that stops it once missed."""

    def __init__(self, what: str, bound_s: float):
        self.what = what
        self.start = time.monotonic()
        self.bound_s = bound_s
        self.abandoned = threading.Event()

    @property
    def deadline(self) -> float:
        return self.start + self.bound_s

    def allow(self, bound_s: float) -> None:
        """The bound, once the operation knows its size (a download from its Content-Length)."""
        self.bound_s = bound_s

    def extend(self, seconds: float) -> None:
        """More time for local work the operation does as it goes (a file it unpacked)."""
        self.bound_s += seconds

    def check(self) -> None:
        if self.abandoned.is_set():
            raise DeadlineExceeded(f"{self.what}: abandoned at its deadline")


def bounded_call(budget: Budget, work: Callable[[Budget], Any]) -> Any:
    """`work(budget)` on a worker thread, waited for until the budget's deadline at most.

    botocore's timeouts are per socket read, so a server that trickles a byte at a time, or
    accepts and never answers through every retry, would hold the caller for hours. Past the
    deadline the worker is abandoned: it stops at its next chunk (it checks the budget), and
    it is a daemon thread, so the process can exit under it. The worker creates and closes
    its own files; nothing it holds is closed from here.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work(budget)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    worker = threading.Thread(target=run, name=f"warmstart-{budget.what[:20]}", daemon=True)
    worker.start()
    while worker.is_alive():
        remaining = budget.deadline - time.monotonic()
        if remaining <= 0:
            budget.abandoned.set()
            raise DeadlineExceeded(f"{budget.what} did not finish within {budget.bound_s:.3g} s "
                                   "(WARMSTART_DEADLINE_BASE_S + bytes / WARMSTART_FLOOR_BYTES_PER_S)")
        worker.join(min(remaining, 0.05))  # short: the bound may grow once the size is known
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --------------------------------------------------------------------------------------------
# S3


def make_client(settings: Settings) -> Any:
    """An S3 client that fails within seconds: a pod must not wait long for an optional cache."""
    # botocore's session, not boto3's (make_s3_client without with_boto3): boto3's import was a
    # third of a restore's wall time, and the restore sits on the pod's start-up path. Imported
    # here, as botocore is in make_s3_client, so that `key` works in an image without boto3.
    from ..common.shared import make_s3_client

    # Per socket operation only; the bound on a whole request is bounded_call's (see Settings.bound_s).
    return make_s3_client(region=settings.region, connect_timeout_s=5, read_timeout_s=20, max_attempts=3)


class Ahead:
    """`make(*args)` started now on a daemon thread, its value taken later: get() waits for it and
    returns it, or raises what it raised, as if it had been called at that point. The restore
    builds its S3 client this way on a node that cannot hit, so importing botocore and loading
    its S3 model (about 0.2 s of CPU) overlap with the key's factors (nvidia-smi's run above all)
    instead of following them."""

    def __init__(self, make: Callable[..., Any], *args: Any):
        self._box: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, args=(make, args), name="warmstart-ahead", daemon=True)
        self._thread.start()

    def _run(self, make: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            self._box["value"] = make(*args)
        except BaseException as exc:  # noqa: BLE001 - raised in the thread that calls get()
            self._box["error"] = exc

    def get(self) -> Any:
        self._thread.join()
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]


def write_stream(read: Callable[[int], bytes], out: Any, limit: int,
                  budget: Budget | None = None, chunk: int = CHUNK) -> tuple[int, str]:
    """Copy a stream to a file, returning (bytes, sha256). Writes go through here so a full disk
    surfaces as one OSError(ENOSPC) that the caller cleans up after. Never more than `limit`
    bytes, one chunk in memory at a time; stops once `budget` is abandoned."""
    digest = hashlib.sha256()
    total = 0
    while True:
        if budget is not None:
            budget.check()
        data = read(chunk)
        if not data:
            return total, digest.hexdigest()
        total += len(data)
        if total > limit:
            raise CacheError(f"more than the {limit} bytes expected (WARMSTART_MAX_BYTES={limit} at most)")
        digest.update(data)
        out.write(data)


class BudgetedReader:
    """An upload body that stops being readable once its budget is abandoned, so an abandoned
    upload ends at its next chunk instead of feeding a stalled server forever."""

    def __init__(self, f: Any, budget: Budget):
        self._f, self._budget = f, budget

    def read(self, n: int = -1) -> bytes:
        self._budget.check()
        return self._f.read(n)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


def is_missing_bucket(exc: BaseException) -> bool:
    return _s3_code(exc) == "NoSuchBucket"


def missing_bucket(settings: Settings) -> Misconfigured:
    return Misconfigured(f"the bucket {settings.bucket!r} (WARMSTART_CACHE_BUCKET) does not exist; this is a "
                         "deployment error, not a cache miss: fix the bucket name or create the bucket")
