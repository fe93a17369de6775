"""The weights stager's content check: what S3 vouches for of each staged file (the import's
sha256, S3's ChecksumSHA256, an ETag S3 computed from the bytes, the part sizes S3 clients
choose), HeadObject through the shared S3 client, and the memos that keep an unverifiable file
from being copied again.

Part of weights_stage.py, whose docstring has the commands, the life of a copy, the faults and
the environment; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import stat
import threading
from pathlib import Path
from typing import Any, Mapping

from ..common.shared import make_s3_client
from .node import write_file, parse_json, read_small
from .settings import (
    Deadline, ETAG_MD5, ETAG_MULTIPART, IMPORT_MANIFEST, MAX_MARKER_BYTES, MIB, Settings, StageRefused,
)

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


def split_source(source: str) -> tuple[str, str]:
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


class PartDigests:
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


def hash_file(path: Path, digests: list[PartDigests], deadline: Deadline) -> None:
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
UNVERIFIABLE_MEMO = ".warmstart-unverifiable.json"
"""In `<digest>.partial/`: the listing a strict check found unverifiable, so the next attempt
refuses at once (no re-hash, no second log line) until the source or the policy changes."""
LOGGED_MEMOS: set[str] = set()
MISMATCH_MEMO = ".warmstart-mismatch.json"
"""In the model's node directory: [key, size, ETag] of files whose copy did not match an
MD5-shaped ETag while HeadObject could not say whether S3 computed it. The same mismatch on the
next, fresh copy makes the file unverifiable instead of a third copy (never a re-copy loop)."""


class KeptRefusal(StageRefused):
    """A refusal whose copy is kept: nothing a new copy could change (an unverifiable check)."""

    def __init__(self, reason: str, repeat: bool = False) -> None:
        super().__init__(reason)
        self.repeat = repeat


def content_memo_key(settings: Settings, listing: Mapping[str, Mapping[str, Any]]) -> str:
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
    bucket, prefix = split_source(settings.source)
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
            sha = PartDigests("sha256", None)
            hash_file(settings.partial / rel, [sha], deadline)
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
        digests = ([PartDigests("sha256", part_sizes[0] if composite else None)] if use_checksum
                   else [PartDigests("md5", p if multipart else None) for p in part_sizes])
        hash_file(settings.partial / rel, digests, deadline)
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
            write_file(settings.root / MISMATCH_MEMO, json.dumps(sorted(suspects)).encode())
        except OSError:
            pass  # then the next attempt refuses once more
    if bad:
        raise StageRefused(f"content mismatch: {'; '.join(sorted(bad)[:4])}")
    return how, unverifiable
