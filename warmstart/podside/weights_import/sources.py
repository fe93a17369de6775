"""The weights import's sources (S3, the Hugging Face Hub): what is there and how it is copied.

Part of weights_import.py, whose docstring has the job, the environment and the log;
shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable

from .s3 import (
    CANCEL_WAIT_S, describe_error, is_permanent_s3, KnownSize, list_prefix, MAX_JSON_BYTES, parse_json,
    read_json, transfer_all, Transfers, UNREADABLE,
)
from .stream import ByteBudget, Cancelled, file_too_large, PartUploads, Stored, upload_verified
from .settings import (
    AccessError, ConfigError, gib, ImportFailure, MIB, Settings, TransferError, VerifyError,
)

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

    def copy(self, files: list[SourceFile], manager: Any, record: Callable[[Any], None] | None = None) -> int:
        s, sizes = self.settings, {f.name: f.bytes for f in files}

        def submit(mgr: Any, name: str) -> Any:
            # TaggingDirective REPLACE (with no tags): the copy needs no s3:GetObjectTagging on the source.
            return mgr.copy(copy_source={"Bucket": s.s3_bucket, "Key": f"{s.s3_prefix}/{name}"},
                            bucket=s.dest_bucket, key=s.dest_key(name),
                            extra_args={"TaggingDirective": "REPLACE"}, subscribers=[KnownSize(sizes[name])],
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

    def copy(self, files: list[SourceFile], manager: Any,
             record: Callable[[Stored], None] | None = None) -> int:
        """Each file downloaded to scratch, uploaded while hashed and stored only on a match
        (weights_import_stream), its local copy deleted; files in parallel within the scratch
        budget. `record(stored)` runs after each file's object is complete (the resume record).
        `manager` (the S3 copy's transfer manager) is not used: the parts are sent here."""
        s = self.settings
        s.scratch_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(s.scratch_dir).free
        budget_bytes = min(s.scratch_bytes, free) if s.scratch_bytes else free
        too_large = file_too_large({f.name: f.bytes for f in files}, budget_bytes)
        if too_large:
            name, size = too_large[0]
            raise ConfigError(
                f"{s.model}: {s.hf_repo}@{s.hf_revision} has {name}, one file of {gib(size):.2f} GiB, and the import's "
                f"scratch disk holds {gib(budget_bytes):.2f} GiB (WARMSTART_SCRATCH_BYTES, the largest file the Job "
                f"streams through it); nothing was downloaded; fix: import a copy of the model re-sharded into smaller "
                f"files (transformers' save_pretrained(max_shard_size=\"5GB\")) from the Hub or with import.s3"
                + (f" ({len(too_large)} such file(s): {', '.join(n for n, _ in too_large[:4])})" if len(too_large) > 1 else ""))
        cancelled = threading.Event()
        budget = ByteBudget(budget_bytes, cancelled)
        parts = PartUploads(s.max_concurrency, cancelled)
        self.budget = budget
        record = record or (lambda stored: None)
        lock = threading.Lock()

        def one(f: SourceFile) -> None:
            budget.acquire(f.bytes)
            try:
                self._one(f, parts, cancelled, lock, record)
            finally:
                budget.release(f.bytes)

        pool = ThreadPoolExecutor(max_workers=min(s.file_parallelism, max(1, len(files))),
                                  thread_name_prefix="warmstart-file")
        # Largest first: the budget then packs the small files around the large ones.
        futures = {pool.submit(one, f): f for f in sorted(files, key=lambda f: (-f.bytes, f.name))}
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [fut for fut in done if fut.exception() is not None and not isinstance(fut.exception(), Cancelled)]
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
        except BaseException:
            # Another file failed, or SIGTERM: every file stops at its next part and aborts its
            # multipart upload; nothing unverified is ever completed.
            cancelled.set()
            pool.shutdown(wait=False, cancel_futures=True)
            parts.close(wait_for=False)
            ended = wait(futures, timeout=CANCEL_WAIT_S)
            if ended.not_done:
                Transfers.abandoned = True
            raise
        pool.shutdown()
        parts.close()
        shutil.rmtree(self.local_dir, ignore_errors=True)
        return 1

    def _one(self, f: SourceFile, parts: PartUploads, cancelled: threading.Event, lock: threading.Lock,
             record: Callable[[Stored], None]) -> None:
        """One file: download, upload while hashing, record; its local copy always deleted."""
        s = self.settings
        bad: str | None = None
        for attempt in range(1, s.retries + 1):
            if cancelled.is_set():
                raise Cancelled()
            path = self._retry(lambda: Path(self.hub.hf_hub_download(
                s.hf_repo, f.name, revision=s.hf_revision, local_dir=str(self.local_dir),
                cache_dir=str(s.scratch_dir / "hub-cache"))), f"downloading {f.name}")
            try:
                got = path.stat().st_size if path.is_file() else None
                if got != f.bytes:
                    raise TransferError(f"downloaded {f.name} is {got} bytes, the Hub lists {f.bytes}")
                try:
                    with open(path, "rb") as fh:
                        out = upload_verified(self.client, s.dest_bucket, s.dest_key(f.name), fh.read, name=f.name,
                                              size=f.bytes, sha256=f.sha256, git_sha1=f.git_sha1,
                                              part_bytes=s.part_bytes, parts=parts, cancelled=cancelled)
                except (ImportFailure, Cancelled):
                    raise
                except Exception as exc:  # noqa: BLE001 - sorted: permanent, or retried
                    if is_permanent_s3(exc):
                        raise AccessError(f"uploading {f.name}: {describe_error(exc)}") from exc
                    if attempt >= s.retries:
                        raise TransferError(f"uploading {f.name} failed after {attempt} attempts: "
                                            f"{describe_error(exc)}") from exc
                    time.sleep(min(2 ** attempt, 30))
                    continue
            finally:
                path.unlink(missing_ok=True)
            if isinstance(out, Stored):
                with lock:
                    self.hashes[f.name] = out.sha256
                    record(out)
                return
            bad = out  # other bytes than the Hub publishes: downloaded again
        raise VerifyError(f"{s.model}: {f.name} downloaded from {s.hf_repo}@{s.hf_revision} differs from what the "
                          f"Hub publishes for it, on each of {s.retries} downloads: {bad}; it was not stored (its "
                          "upload was aborted before completion); fix: check the network path to the Hub (a proxy "
                          "rewriting content), then run `pulumi up` again")
