"""The stager's content check per bucket encryption and upload tool.

Each test runs the script as the pod runs it (a file, this interpreter, the real s5cmd, a real S3
server on 127.0.0.1) and checks the outcome line, what is on the node and how often the source
was read: a valid object is never refused, a check that cannot succeed never makes the stager
copy the model again, and a real mismatch is still refused.

SeaweedFS gives multipart objects S3's ETag and answers HeadObject's PartsCount; rclone 1.75
gives every object its MD5. What neither server does (SSE-KMS ETags, withholding PartsCount) a
fault proxy in front of the real server rewrites into its answers (tests/podside/faults.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.podside.faults import FaultProxy, Rule
from tests.podside.servers import BUCKET, RcloneS3, SeaweedS3
from tests.support.node_cache import STAGE, Node, Version, digest_of, model_files, tree
from warmstart.podside.weights_stage import settings as weights_stage_settings
from warmstart.podside.weights_stage import main as weights_stage

MIB = 1 << 20


def _upload(server, prefix: str, files: dict[str, bytes], tmp_path: Path, *, part_bytes: int | None = None,
            **extra) -> Version:
    """Upload with boto3's managed transfer (the AWS CLI's): multipart at `part_bytes`."""
    from boto3.s3.transfer import TransferConfig

    client = server.client()
    for name, body in files.items():
        if part_bytes is None:
            client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=body, **extra)
            continue
        path = tmp_path / "upload.bin"
        path.write_bytes(body)
        client.upload_file(str(path), BUCKET, f"{prefix}/{name}", ExtraArgs=extra or None,
                           Config=TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=part_bytes))
    return Version(prefix, dict(files))


def _prefix(tag: str) -> str:
    return f"node-cache/{os.getpid()}-{tag}-{time.monotonic_ns()}/model"


@pytest.fixture
def weed_node(tmp_path, seaweed_s3: SeaweedS3, s5cmd: str) -> Node:
    return Node(tmp_path / "nvme" / "weights" / "llama", seaweed_s3, s5cmd)


def _without_parts_count(method: str, path: str, headers: dict[str, str], body: bytes):
    """A store that does not answer HeadObject's PartNumber (no x-amz-mp-parts-count): the part
    size must then be derived from the size and the ETag alone."""
    if method == "HEAD" and "partNumber=" in path:
        headers = {k: v for k, v in headers.items() if k.lower() not in ("x-amz-mp-parts-count", "content-range")}
    return headers, body


# --------------------------------------------------------------------------------------------
# Item 1: multipart objects as S3 clients write them


pytestmark = pytest.mark.servers


def test_a_one_part_multipart_object_is_checked_as_md5_of_its_md5(tmp_path, weed_node, seaweed_s3):
    """`-1`: the AWS CLI with a chunk size above the file's size (MD5 of the MD5 of the whole)."""
    big = os.urandom(6 * MIB)
    v = _upload(seaweed_s3, _prefix("one-part"), {"model.safetensors": big}, tmp_path, part_bytes=8 * MIB)
    _upload(seaweed_s3, v.prefix, {"config.json": b"{}"}, tmp_path)
    d = digest_of(v)
    listing = weights_stage.list_source(weed_node.settings(v, d), weights_stage.Deadline(60))
    assert listing["model.safetensors"]["etag"].endswith("-1"), listing  # a real one-part multipart object
    rc, lines = weed_node.run(STAGE, "stage", env=weed_node.env(v, d))
    assert rc == 0 and lines[-1]["result"] == "staged" and lines[-1]["checked"] == ["etag"], lines
    assert (weed_node.root / d / "model.safetensors").read_bytes() == big


@pytest.mark.parametrize("parts_count", [True, False], ids=["PartsCount", "no-PartsCount"])
def test_a_21_mib_shard_in_20_mib_parts_is_staged(tmp_path, weed_node, seaweed_s3, parts_count):
    """Two parts, 20 MiB and 1 MiB: S3's PartsCount names the part size; without it, 20 MiB is
    one of the sizes derived from ceil(size / part) == 2 (before: 8 guesses, 20 MiB not among them)."""
    big = os.urandom(21 * MIB)
    v = _upload(seaweed_s3, _prefix("20mib"), {"model.safetensors": big}, tmp_path, part_bytes=20 * MIB)
    _upload(seaweed_s3, v.prefix, {"config.json": b"{}"}, tmp_path)
    d = digest_of(v)
    env = weed_node.env(v, d)
    with FaultProxy(seaweed_s3.endpoint) as proxy:
        if not parts_count:
            proxy.add(Rule(lambda m, p, h: m == "HEAD", "rewrite", rewrite=_without_parts_count))
        rc, lines = weed_node.run(STAGE, "stage", env=env | {"AWS_ENDPOINT_URL": proxy.url})
    assert rc == 0 and lines[-1]["result"] == "staged" and lines[-1]["checked"] == ["etag"], lines
    assert "unverifiable" not in lines[-1], lines


def test_a_part_size_no_rule_finds_is_unverifiable_and_never_copied_twice(tmp_path, weed_node, seaweed_s3):
    """An odd part size (5 MiB + 12345 bytes) without S3's PartsCount: no derived size gives the
    ETag. That is not a mismatch: `auto` keeps the copy on its size (one line names the file),
    `etag` refuses it but keeps the copy, and its next attempt neither copies nor logs again."""
    odd = 5 * MIB + 12345
    big = os.urandom(21 * MIB)
    v = _upload(seaweed_s3, _prefix("odd"), {"model.safetensors": big}, tmp_path, part_bytes=odd)
    _upload(seaweed_s3, v.prefix, {"config.json": b"{}"}, tmp_path)
    d = digest_of(v)
    with FaultProxy(seaweed_s3.endpoint) as proxy:
        proxy.add(Rule(lambda m, p, h: m == "HEAD", "rewrite", rewrite=_without_parts_count))
        env = weed_node.env(v, d, AWS_ENDPOINT_URL=proxy.url)
        rc, lines = weed_node.run(STAGE, "stage", env=env | {"WARMSTART_CONTENT_CHECK": "etag"})
        assert rc == 0 and lines[-1]["result"] == "refused" and "unverifiable" in lines[-1]["reason"], lines
        assert "model.safetensors" in lines[-1]["unverifiable"], lines
        assert (weed_node.root / f"{d}.partial" / "model.safetensors").read_bytes() == big  # kept
        gets = sum(1 for m, p, _ in proxy.seen if m == "GET" and p.split("?")[0].endswith("model.safetensors"))
        assert gets >= 1
        # The next attempts (the hold loop's retries, in one process): no copy, no re-hash, one line.
        code = ("import sys; from warmstart.podside.weights_stage import main as w\n"
                "for _ in range(3): w.stage()\n")
        before = len(proxy.seen)
        out = subprocess.run([sys.executable, "-c", code], env=env | {"WARMSTART_CONTENT_CHECK": "etag",
                                                                     "PYTHONPATH": os.getcwd()},
                             capture_output=True, text=True, timeout=120)
        again = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
        assert [x["result"] for x in again] == ["refused"], (again, out.stderr[-2000:])
        assert not any(m == "GET" and p.split("?")[0].endswith("model.safetensors") for m, p, _ in proxy.seen[before:])
        # auto: staged on its size, the file named once.
        rc, lines = weed_node.run(STAGE, "stage", env=env)
    assert rc == 0 and lines[-1]["result"] == "staged" and lines[-1]["checked"] == ["etag", "size"], lines
    assert list(lines[-1]["unverifiable"]) == ["model.safetensors"], lines
    assert tree(weed_node.root / d) == {"model.safetensors": big, "config.json": b"{}"}


def test_with_partscount_an_odd_part_size_is_checked_and_a_flipped_byte_refused(tmp_path, weed_node, seaweed_s3):
    odd = 5 * MIB + 12345
    big = os.urandom(12 * MIB)
    v = _upload(seaweed_s3, _prefix("odd-known"), {"model.safetensors": big}, tmp_path, part_bytes=odd)
    _upload(seaweed_s3, v.prefix, {"config.json": b"{}"}, tmp_path)
    d = digest_of(v)
    rc, lines = weed_node.run(STAGE, "stage", env=weed_node.env(v, d))
    assert rc == 0 and lines[-1]["result"] == "staged" and lines[-1]["checked"] == ["etag"], lines
    # The same object, a byte flipped on the way: the part size is known, so this is a mismatch.
    weights_stage.remove(weed_node.root / d)
    with FaultProxy(seaweed_s3.endpoint) as proxy:
        proxy.add(Rule(lambda m, p, h: m == "GET" and p.split("?")[0].endswith("model.safetensors"), "flip"))
        rc, lines = weed_node.run(STAGE, "stage", env=weed_node.env(v, d, AWS_ENDPOINT_URL=proxy.url))
    assert rc == 0 and lines[-1]["result"] == "refused" and "content mismatch" in lines[-1]["reason"], lines
    assert not os.path.lexists(weed_node.root / f"{d}.partial")


# --------------------------------------------------------------------------------------------
# Item 2: SSE-KMS buckets


def _as_sse_kms(method: str, path: str, headers: dict[str, str], body: bytes):
    """Answers as S3 gives SSE-KMS objects: an ETag that is not the MD5 of the bytes (in the
    listing and in HeadObject) and `x-amz-server-side-encryption: aws:kms`."""
    def fake(etag: str) -> str:
        return hashlib.md5(b"kms" + etag.encode()).hexdigest()

    if method == "GET" and "list-type=2" in path:
        body = re.sub(rb"<ETag>(&#34;|&quot;|\")?([0-9a-f]{32}(-\d+)?)(&#34;|&quot;|\")?</ETag>",
                      lambda m: b"<ETag>&#34;" + fake(m[2].decode()).encode() + b"&#34;</ETag>", body)
    elif method == "HEAD":
        headers = {k: v for k, v in headers.items()}
        for k in list(headers):
            if k.lower() == "etag":
                headers[k] = '"' + fake(headers[k].strip('"')) + '"'
        headers["x-amz-server-side-encryption"] = "aws:kms"
        headers["x-amz-server-side-encryption-aws-kms-key-id"] = "arn:aws:kms:us-east-1:123456789012:key/test"
    return headers, body


@pytest.fixture
def kms_proxy(rclone_s3: RcloneS3) -> Iterator[FaultProxy]:
    with FaultProxy(rclone_s3.endpoint) as p:
        p.add(Rule(lambda m, path, h: m in ("GET", "HEAD"), "rewrite", rewrite=_as_sse_kms))
        yield p


def test_an_sse_kms_bucket_is_staged_on_sizes_and_says_so(node, upload, kms_proxy):
    """Before: "content does not match its ETag" for every file, the copy dropped, every attempt."""
    v = upload(model_files(40, mib=1))
    d = digest_of(v)
    env = node.env(v, d, AWS_ENDPOINT_URL=kms_proxy.url)
    listing = weights_stage.list_source(node.settings(v, d, AWS_ENDPOINT_URL=kms_proxy.url), weights_stage.Deadline(60))
    name = "model-00001-of-00002.safetensors"
    assert listing[name]["etag"] != hashlib.md5(v.files[name]).hexdigest()  # as S3 lists SSE-KMS objects
    rc, lines = node.run(STAGE, "stage", env=env)
    assert rc == 0 and lines[-1]["result"] == "staged" and lines[-1]["checked"] == ["size"], lines
    assert set(lines[-1]["unverifiable"]) == set(v.files) and all("aws:kms" in why for why in
                                                                   lines[-1]["unverifiable"].values()), lines
    assert tree(node.root / d) == v.files


def test_an_sse_kms_bucket_is_verified_by_the_import_manifests_sha256(node, upload, kms_proxy, rclone_s3):
    files = model_files(41, mib=1)
    v = upload(files)
    d = digest_of(v)
    s = node.settings(v, d, AWS_ENDPOINT_URL=kms_proxy.url)
    listing = weights_stage.list_source(s, weights_stage.Deadline(60))
    manifest = {"status": "complete", "part_bytes": 64 * MIB,
                "files": [{"name": n, "etag": listing[n]["etag"], "sha256": hashlib.sha256(b).hexdigest()}
                          for n, b in files.items()]}
    rclone_s3.client().put_object(Bucket=BUCKET, Key=f"{v.prefix}/{weights_stage.IMPORT_MANIFEST}",
                                  Body=json.dumps(manifest).encode())
    # Every file by the sha256 the manifest records; the manifest itself (which cannot name its
    # own sha256) on its size, even where the policy asks for a sha256 of every file.
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d, AWS_ENDPOINT_URL=kms_proxy.url,
                                                      WARMSTART_CONTENT_CHECK="sha256"))
    assert rc == 0 and lines[-1]["result"] == "staged" and lines[-1]["checked"] == ["sha256", "size"], lines
    assert list(lines[-1]["unverifiable"]) == [weights_stage.IMPORT_MANIFEST], lines
    # A recorded sha256 that is wrong is a mismatch on an SSE-KMS bucket too.
    weights_stage.remove(node.root / d)
    manifest["files"][0]["sha256"] = "0" * 64
    rclone_s3.client().put_object(Bucket=BUCKET, Key=f"{v.prefix}/{weights_stage.IMPORT_MANIFEST}",
                                  Body=json.dumps(manifest).encode())
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d, AWS_ENDPOINT_URL=kms_proxy.url))
    assert rc == 0 and lines[-1]["result"] == "refused" and "sha256" in lines[-1]["reason"], lines


def test_s3s_own_checksum_sha256_verifies_an_object_and_refuses_a_flipped_byte(tmp_path, weed_node, seaweed_s3):
    big = os.urandom(3 * MIB)
    v = _upload(seaweed_s3, _prefix("checksum"), {"model.safetensors": big, "config.json": b"{}"}, tmp_path,
                ChecksumAlgorithm="SHA256")
    d = digest_of(v)
    rc, lines = weed_node.run(STAGE, "stage", env=weed_node.env(v, d, WARMSTART_CONTENT_CHECK="sha256"))
    assert rc == 0 and lines[-1]["result"] == "staged" and lines[-1]["checked"] == ["sha256"], lines
    weights_stage.remove(weed_node.root / d)
    with FaultProxy(seaweed_s3.endpoint) as proxy:
        proxy.add(Rule(lambda m, p, h: m == "GET" and p.split("?")[0].endswith("model.safetensors"), "flip"))
        rc, lines = weed_node.run(STAGE, "stage", env=weed_node.env(v, d, AWS_ENDPOINT_URL=proxy.url))
    assert rc == 0 and lines[-1]["result"] == "refused" and "ChecksumSHA256" in lines[-1]["reason"], lines


def test_an_unknown_content_check_is_one_clear_line(node, upload):
    v = upload(model_files(42, mib=1))
    rc, lines = node.run(STAGE, "stage", env=node.env(v, digest_of(v), WARMSTART_CONTENT_CHECK="md5"))
    assert rc == 0 and lines[-1]["result"] == "error" and "nodeCacheContentCheck" in lines[-1]["reason"], lines


# --------------------------------------------------------------------------------------------
# Item 3: an empty object under the prefix


def test_an_empty_file_under_the_prefix_is_staged(node, upload):
    """s5cmd's listing has no "size" for an empty object (before: KeyError on every attempt)."""
    files = model_files(43, mib=1) | {"__init__.py": b"", "sub/.keep": b""}
    v = upload(files)
    d = digest_of(v)
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d))
    assert rc == 0 and lines[-1]["result"] == "staged", lines
    assert tree(node.root / d) == files


# --------------------------------------------------------------------------------------------
# Item 6: leftovers of the last round


def test_a_failing_free_space_check_refuses_and_leaves_no_partial_copy(node, upload, tmp_path):
    """statvfs raising EIO (a failing disk): refused, and the partial copy it made is removed."""
    v = upload(model_files(44, mib=1))
    d = digest_of(v)
    wrapper = tmp_path / "eio_statvfs.py"
    wrapper.write_text("import errno, os, runpy, sys\n"
                       "def statvfs(path):\n"
                       "    raise OSError(errno.EIO, 'Input/output error', str(path))\n"
                       "os.statvfs = statvfs\n"
                       f"sys.argv = [{str(STAGE)!r}, 'stage']\n"
                       f"runpy.run_path({str(STAGE)!r}, run_name='__main__')\n")
    rc, lines = node.run(wrapper, env=node.env(v, d))
    assert rc == 0 and lines[-1]["result"] == "refused" and "free space" in lines[-1]["reason"], lines
    assert not os.path.lexists(node.root / f"{d}.partial") and not os.path.lexists(node.root / d)


def test_a_nan_pause_request_is_dropped_as_garbage(node, upload):
    v = upload(model_files(45, mib=1))
    d = digest_of(v)
    (node.root / weights_stage_settings.LOADING_DIR).mkdir(parents=True)
    (node.root / weights_stage_settings.LOADING_DIR / "nan.json").write_text('{"until": NaN}')
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d, WARMSTART_STAGE_DEADLINE_S="30"), timeout=90)
    assert rc == 0 and lines[-1]["result"] == "staged" and lines[-1]["paused_s"] < 3, lines  # before: ~15 s
    assert not (node.root / weights_stage_settings.LOADING_DIR / "nan.json").exists()


def test_without_headobject_a_kms_etag_is_refused_once_then_unverifiable(node, upload, kms_proxy, tmp_path):
    """An image without boto3 cannot ask S3 whether it computed an MD5-shaped ETag. The first
    mismatch is refused (it may be a byte flipped on the way); the same mismatch on the next,
    fresh copy is the ETag's: unverifiable, staged on sizes under `auto`, never a third copy."""
    v = upload(model_files(46, mib=1))
    d = digest_of(v)
    no_boto3 = tmp_path / "no_boto3.py"
    no_boto3.write_text("import runpy, sys\n"
                        "sys.modules['boto3'] = None  # import boto3 raises ImportError\n"
                        f"sys.argv = [{str(STAGE)!r}, 'stage']\n"
                        f"runpy.run_path({str(STAGE)!r}, run_name='__main__')\n")
    env = node.env(v, d, AWS_ENDPOINT_URL=kms_proxy.url)
    rc, lines = node.run(no_boto3, env=env)
    assert rc == 0 and lines[-1]["result"] == "refused" and "content mismatch" in lines[-1]["reason"], lines
    assert "no boto3" in lines[-1]["reason"]
    rc, lines = node.run(no_boto3, env=env)
    assert rc == 0 and lines[-1]["result"] == "staged" and lines[-1]["checked"] == ["size"], lines
    assert set(lines[-1]["unverifiable"]) == set(v.files) and \
        all("two fresh copies" in why for why in lines[-1]["unverifiable"].values()), lines
    assert tree(node.root / d) == v.files


def test_parts_of_different_sizes_are_refused_once_then_unverifiable(tmp_path, weed_node, seaweed_s3):
    """S3 allows the parts of one upload to differ in size: the first part's size S3 answers
    then does not give the ETag. Refused once (it could be a flipped byte), then unverifiable:
    `auto` stages it on its size instead of copying it again and again."""
    sizes = [5 * MIB + 1, 6 * MIB, 1 * MIB]
    data = os.urandom(sum(sizes))
    prefix = _prefix("uneven")
    client = seaweed_s3.client()
    key = f"{prefix}/model.safetensors"
    upload_id = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    parts, offset = [], 0
    for n, size in enumerate(sizes, 1):
        r = client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload_id, PartNumber=n, Body=data[offset:offset + size])
        parts.append({"PartNumber": n, "ETag": r["ETag"]})
        offset += size
    client.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/config.json", Body=b"{}")
    v = Version(prefix, {})
    d = digest_of(v)
    rc, lines = weed_node.run(STAGE, "stage", env=weed_node.env(v, d))
    assert rc == 0 and lines[-1]["result"] == "refused" and "may not all be the first part" in lines[-1]["reason"], lines
    rc, lines = weed_node.run(STAGE, "stage", env=weed_node.env(v, d))
    assert rc == 0 and lines[-1]["result"] == "staged" and list(lines[-1]["unverifiable"]) == ["model.safetensors"], lines
    assert (weed_node.root / d / "model.safetensors").read_bytes() == data
