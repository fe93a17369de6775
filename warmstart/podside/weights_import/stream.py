"""The Hub import's transfer, file by file through a bounded scratch disk.

Part of weights_import.py, whose docstring has the job, the environment and the log;
shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).

Each file is downloaded with the Hub client (`hf_hub_download`: its own size check, hf_xet
where the repository is on Xet), then uploaded while it is hashed: a multipart upload whose
parts go out as they are read, completed only when the bytes read match the Hub's sha256 (LFS
files) or git blob id (the others), aborted otherwise. A file smaller than one part is hashed
first and written with one PutObject only on a match. Its local copy is deleted as soon as its
upload ends, so the scratch disk holds only the files in flight: a byte budget (ByteBudget)
admits a file only while the files in flight and it fit WARMSTART_SCRATCH_BYTES, and at most
WARMSTART_FILE_PARALLELISM files move at once. A file larger than the whole budget is refused
before any download (file_too_large), naming it.
"""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable

#: How often a thread waiting for scratch room or an upload slot looks at the cancel flag.
_POLL_S = 0.25


class Cancelled(Exception):
    """The copy was cancelled (another file failed, or SIGTERM): stop and abort what is open."""


class ByteBudget:
    """Bytes of scratch disk handed out to files in flight; `acquire` waits for room."""

    def __init__(self, total: int, cancelled: threading.Event):
        self.total, self.free, self.peak_used = total, total, 0
        self.cancelled = cancelled
        self._cond = threading.Condition()

    def acquire(self, n: int) -> None:
        with self._cond:
            while self.free < n:
                if self.cancelled.is_set():
                    raise Cancelled()
                self._cond.wait(_POLL_S)
            if self.cancelled.is_set():
                raise Cancelled()
            self.free -= n
            self.peak_used = max(self.peak_used, self.total - self.free)

    def release(self, n: int) -> None:
        with self._cond:
            self.free += n
            self._cond.notify_all()


@dataclass(frozen=True)
class Stored:
    """A file whose upload completed after its bytes matched the Hub's hash."""

    name: str
    bytes: int
    sha256: str
    etag: str


class PartUploads:
    """The threads that send upload parts, shared by every file, with at most `in_flight` parts
    held in memory at once (each is `part_bytes`; the Job's memory limit counts them)."""

    def __init__(self, workers: int, cancelled: threading.Event):
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="warmstart-part")
        self.slots = threading.Semaphore(workers)
        self.cancelled = cancelled

    def submit(self, fn: Callable[[], str]) -> Future:
        while not self.slots.acquire(timeout=_POLL_S):
            if self.cancelled.is_set():
                raise Cancelled()
        try:
            future = self.pool.submit(fn)
        except BaseException:
            self.slots.release()
            raise
        future.add_done_callback(lambda _: self.slots.release())
        return future

    def close(self, wait_for: bool = True) -> None:
        self.pool.shutdown(wait=wait_for, cancel_futures=not wait_for)


def content_mismatch(name: str, seen: int, size: int, sha: Any, blob: Any, sha256: str | None,
                     git_sha1: str | None) -> str | None:
    """Why the bytes read are not the file the Hub publishes (None: they are)."""
    if seen != size:
        return f"{name}: read {seen} bytes, the Hub lists {size}"
    if sha256 and sha.hexdigest() != sha256:
        return f"{name}: sha256 {sha.hexdigest()}, the Hub's LFS sha256 is {sha256}"
    if not sha256 and git_sha1 and blob is not None and blob.hexdigest() != git_sha1:
        return f"{name}: git blob id {blob.hexdigest()}, the Hub's is {git_sha1}"
    return None


def upload_verified(client: Any, bucket: str, key: str, read: Callable[[int], bytes], *, name: str, size: int,
                    sha256: str | None, git_sha1: str | None, part_bytes: int, parts: PartUploads,
                    cancelled: threading.Event) -> Stored | str:
    """Upload what `read` yields to s3://bucket/key while hashing it; the object exists
    afterwards only if the bytes matched (returns Stored), else nothing was stored (returns why).
    Raises on an S3 error or Cancelled, after aborting the multipart upload it opened."""
    sha = hashlib.sha256()
    blob = hashlib.sha1(b"blob %d\0" % size) if git_sha1 and not sha256 else None
    if size <= part_bytes:
        data = read(size + 1)
        sha.update(data)
        if blob is not None:
            blob.update(data)
        why = content_mismatch(name, len(data), size, sha, blob, sha256, git_sha1)
        if why:
            return why
        etag = client.put_object(Bucket=bucket, Key=key, Body=data)["ETag"]
        return Stored(name, size, sha.hexdigest(), str(etag).strip('"'))
    upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    futures: list[tuple[int, Future]] = []
    try:
        seen = 0
        while True:
            if cancelled.is_set():
                raise Cancelled()
            chunk = read(part_bytes)
            if not chunk:
                break
            seen += len(chunk)
            sha.update(chunk)
            if blob is not None:
                blob.update(chunk)
            number = len(futures) + 1

            def send(number: int = number, chunk: bytes = chunk) -> str:
                return client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                          Body=chunk)["ETag"]

            futures.append((number, parts.submit(send)))
            del chunk
            if seen > size:  # more bytes than the Hub lists: never a match, stop reading
                break
        wait([f for _, f in futures], return_when=FIRST_EXCEPTION)
        for _, f in futures:
            if f.done() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        etags = [(n, f.result()) for n, f in futures]
        why = content_mismatch(name, seen, size, sha, blob, sha256, git_sha1)
        if why:
            _abort(client, bucket, key, upload_id)
            return why
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                         MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in etags]})
    except BaseException:
        for _, f in futures:
            f.cancel()
        _abort(client, bucket, key, upload_id)
        raise
    # The ETag a listing reports, which the resume check compares: read back rather than taken
    # from CompleteMultipartUpload's answer (S3 gives the same one; rclone's `serve s3` does not).
    etag = client.head_object(Bucket=bucket, Key=key)["ETag"]
    return Stored(name, size, sha.hexdigest(), str(etag).strip('"'))


def _abort(client: Any, bucket: str, key: str, upload_id: str) -> None:
    """Best effort: the model bucket's lifecycle rule removes what an abort leaves (components/storage.py)."""
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except Exception:  # noqa: BLE001 - the parts are unreachable either way: no object was completed
        pass


def file_too_large(names_sizes: dict[str, int], budget: int) -> list[tuple[str, int]]:
    """The files that can never fit the scratch budget alone, largest first."""
    return sorted(((n, b) for n, b in names_sizes.items() if b > budget), key=lambda x: -x[1])
