"""Every way a restore or publish can fail ends the same way: exit 0, one log line naming the
cause, no temp file and nothing half-restored in the node's cache, so vLLM simply compiles."""

from __future__ import annotations

import errno
import io
import os
import tarfile
from pathlib import Path
from typing import Callable

import pytest

from tests.podside import archives
from tests.podside.pods import PodFactory, Run, leftovers, make_cache, pod_factory, tree
from tests.podside.servers import BUCKET, RcloneS3, S3Server
from warmstart.podside.compile_cache import node as compile_cache_node
from warmstart.podside.compile_cache import settings as compile_cache_settings
from warmstart.podside.compile_cache import main as cc

pytestmark = pytest.mark.servers  # the pod scripts against S3 servers


def assert_clean_failure(run: Run | cc.Outcome, pod_cache: Path, result: str, reason: str) -> None:
    line = run.line if isinstance(run, Run) else {"result": run.result, "reason": run.reason}
    if isinstance(run, Run):
        assert run.returncode == 0, run.stderr
    assert line["result"] == result, line
    assert reason in (line["reason"] or ""), line
    assert tree(pod_cache) == {}, "a failed restore must leave no cache files"
    assert leftovers(pod_cache) == []


def publish_from_node_a(pod: PodFactory, server: S3Server, **env: str) -> tuple[str, dict[str, bytes]]:
    a = pod("node-a", **env)
    published = make_cache(a.cache_dir, seed=21)
    out = cc.publish(a.settings(), client=server.client(), wait=False, emit=False)
    assert out.result == "published"
    return out.key, published  # type: ignore[return-value]


def replace_object(server: S3Server, key: str, change: Callable[[bytes], bytes]) -> None:
    """Rewrite the object's bytes but keep the metadata the publisher recorded."""
    client = server.client()
    obj = client.get_object(Bucket=BUCKET, Key=key)
    body, meta = obj["Body"].read(), {k.lower(): v for k, v in obj["Metadata"].items()}
    client.put_object(Bucket=BUCKET, Key=key, Body=change(body), Metadata=meta)


def test_s3_unreachable(tmp_path: Path, health) -> None:
    with RcloneS3(tmp_path / "s3") as server:
        pod = pod_factory(tmp_path, server, health.url)
        publish_from_node_a(pod, server)
    b = pod("node-b")
    assert_clean_failure(b.run("restore"), b.cache_dir, "error", "Could not connect")
    a2 = pod("node-c")
    make_cache(a2.cache_dir, seed=22)
    run = a2.run("publish", "--once")
    assert (run.returncode, run.line["result"]) == (0, "error") and "Could not connect" in run.line["reason"]
    assert leftovers(a2.cache_dir) == []


def test_no_object_for_the_key(pod: PodFactory) -> None:
    b = pod("node-b")
    assert_clean_failure(b.run("restore"), b.cache_dir, "miss", "no cache published")


def test_truncated_object(pod: PodFactory, rclone_s3) -> None:
    key, _ = publish_from_node_a(pod, rclone_s3)
    replace_object(rclone_s3, key, lambda body: body[: len(body) // 2])
    b = pod("node-b")
    assert_clean_failure(b.run("restore"), b.cache_dir, "error", "truncated")


def test_corrupted_object(pod: PodFactory, rclone_s3) -> None:
    key, _ = publish_from_node_a(pod, rclone_s3)
    replace_object(rclone_s3, key, lambda body: body[:100] + bytes([body[100] ^ 0xFF]) + body[101:])
    b = pod("node-b")
    assert_clean_failure(b.run("restore"), b.cache_dir, "error", "corrupt")


def test_object_without_a_checksum_is_not_trusted(pod: PodFactory, rclone_s3) -> None:
    key, _ = publish_from_node_a(pod, rclone_s3)
    body = rclone_s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()
    rclone_s3.client().put_object(Bucket=BUCKET, Key=key, Body=body)
    b = pod("node-b")
    assert_clean_failure(b.run("restore"), b.cache_dir, "error", "cannot be verified")


def evil_archive(kind: str, key_hash: str) -> bytes:
    """A valid first file, then one member restore must refuse, then a manifest that vouches for
    both: the refusal is restore's own check, not a missing signature."""
    name = {"dotdot": "inductor/../../escape", "absolute": "/tmp/warmstart-escape",
            "forged-marker": ".warmstart/restored-x.json"}.get(kind, "inductor/bad")
    payload = b"payload" if kind in ("dotdot", "absolute", "forged-marker") else b""

    def add_evil(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        if kind == "symlink-out":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc"
        elif kind == "symlink-up":
            info.type, info.linkname = tarfile.SYMTYPE, "../../.."
        elif kind == "hardlink":
            info.type, info.linkname = tarfile.LNKTYPE, "inductor/ok"
        elif kind == "device":
            info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
        elif kind == "fifo":
            info.type = tarfile.FIFOTYPE
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload) if payload else None)

    entries = archives.manifest_entries({"inductor/ok": b"fine", name: payload})
    return archives.forge({"inductor/ok": b"fine"}, key_hash, manifest=entries, before_manifest=add_evil)


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "forged-marker", "symlink-out", "symlink-up",
                                  "hardlink", "device", "fifo"])
def test_unsafe_archive_is_refused_whole(pod: PodFactory, rclone_s3, kind: str, tmp_path: Path) -> None:
    b = pod("node-b")
    key = b.key()
    archives.put(rclone_s3, key, evil_archive(kind, compile_cache_node.key_digest(key)))
    out = cc.restore(b.settings(), client=rclone_s3.client(), emit=False)
    assert_clean_failure(out, b.cache_dir, "error", "archive")
    assert not (tmp_path / "escape").exists() and not Path("/tmp/warmstart-escape").exists()
    assert not (b.cache_dir / compile_cache_settings.STATE_DIRNAME / "restored-x.json").exists()


@pytest.mark.parametrize("change", [
    {"WARMSTART_TP": "2"},
    {"WARMSTART_ACCELERATOR": "NVIDIA L4, 8.9"},
    {"WARMSTART_IMAGE": "registry.example/vllm/vllm-openai:v0.11.2@sha256:" + "ef" * 32},
    {"WARMSTART_COMPILE_FINGERPRINT": "fp-2"},
], ids=lambda change: next(iter(change)))
def test_another_configuration_never_loads_the_cache(pod: PodFactory, rclone_s3, change: dict) -> None:
    publish_from_node_a(pod, rclone_s3)
    b = pod("node-b", **change)
    assert_clean_failure(cc.restore(b.settings(), client=rclone_s3.client(), emit=False), b.cache_dir,
                         "miss", "no cache published")
    assert cc.restore(pod("node-c").settings(), client=rclone_s3.client(), emit=False).result == "restored"


def make_readonly(path: Path, mount_tmpfs) -> bool:
    """A read-only mount where allowed (root); permission bits otherwise. True if mounted."""
    if mount_tmpfs(path, "1m", readonly=True):
        return True
    if os.geteuid() == 0:
        pytest.skip("cannot mount a read-only tmpfs here, and root ignores permission bits")
    path.chmod(0o555)
    return False


def test_read_only_cache_dir(pod: PodFactory, rclone_s3, mount_tmpfs) -> None:
    publish_from_node_a(pod, rclone_s3)
    b = pod("node-b")
    mounted = make_readonly(b.cache_dir, mount_tmpfs)
    try:
        run = b.run("restore")
        assert_clean_failure(run, b.cache_dir, "error", "EROFS" if mounted else "EACCES")
    finally:
        if not mounted:
            b.cache_dir.chmod(0o755)


@pytest.mark.parametrize("where", ["download", "extract"])
def test_full_disk_on_a_real_filesystem(pod: PodFactory, rclone_s3, mount_tmpfs, where: str) -> None:
    """A 64 KiB tmpfs: the download itself does not fit, or it fits and its contents do not."""
    a = pod("node-a")
    make_cache(a.cache_dir, seed=23, kib=256, compressible=(where == "extract"))
    out = cc.publish(a.settings(), client=rclone_s3.client(), wait=False, emit=False)
    assert (out.bytes < 32 * 1024) == (where == "extract")
    b = pod("node-b")
    if not mount_tmpfs(b.cache_dir, "64k"):
        pytest.skip("mounting a tmpfs needs root")
    assert_clean_failure(b.run("restore"), b.cache_dir, "error", "ENOSPC")


def test_full_disk_anywhere_a_write_happens(pod: PodFactory, rclone_s3, monkeypatch) -> None:
    """The same without root: every byte the tool writes goes through _write_stream."""
    publish_from_node_a(pod, rclone_s3)
    real = cc.write_stream
    calls = []

    def fill_up(read, out, limit, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the restore unpacks as it downloads: the second file hits the wall
            out.write(read(10))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(read, out, limit, *args, **kwargs)

    monkeypatch.setattr(cc, "write_stream", fill_up)
    b = pod("node-b")
    assert_clean_failure(cc.restore(b.settings(), client=rclone_s3.client(), emit=False), b.cache_dir,
                         "error", "ENOSPC")


def test_a_failure_while_moving_into_place_takes_back_what_moved(pod: PodFactory, rclone_s3, monkeypatch) -> None:
    publish_from_node_a(pod, rclone_s3)
    real_rename = os.rename
    moves = []

    def rename(src, dst):
        moves.append(dst)
        if len(moves) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(dst))
        return real_rename(src, dst)

    monkeypatch.setattr(cc.os, "rename", rename)
    b = pod("node-b")
    assert_clean_failure(cc.restore(b.settings(), client=rclone_s3.client(), emit=False), b.cache_dir,
                         "error", "EIO")


def test_access_denied(pod: PodFactory, rclone_s3) -> None:
    publish_from_node_a(pod, rclone_s3)
    b = pod("node-b", AWS_SECRET_ACCESS_KEY="not-the-secret")
    assert_clean_failure(b.run("restore"), b.cache_dir, "error", "(403)")
    make_cache(b.cache_dir, seed=24)
    run = b.run("publish", "--once")
    assert (run.returncode, run.line["result"]) == (0, "error") and "(403)" in run.line["reason"]


def test_bad_configuration_is_one_error_line(pod: PodFactory) -> None:
    b = pod("node-b", WARMSTART_TP="auto")
    assert_clean_failure(b.run("restore"), b.cache_dir, "error", "WARMSTART_TP='auto' is not an integer")
