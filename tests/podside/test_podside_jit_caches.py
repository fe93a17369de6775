"""The engine state beyond torch.compile (the startup plan and the FlashInfer, CUDA, DeepGEMM,
TVM-FFI and TileLang JIT caches) on the compile-cache volume and through the S3 cache, with the
guarantees the compile cache has: a fake engine (tests/podside/fake_engine.py) writes the trees at
their real relative paths, from the env the serving manifest renders, on node a; node b restores
them byte for byte; a truncated, corrupt, foreign or oversized archive never breaks a start."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.podside import archives
from tests.podside.pods import PodFactory, leftovers, run_engine, tree
from tests.podside.servers import BUCKET
from warmstart.podside.compile_cache import node as compile_cache_node
from warmstart.podside.compile_cache import settings as compile_cache_settings
from warmstart.podside.compile_cache import main as cc

pytestmark = pytest.mark.servers  # the pod scripts against S3 servers


def published(pod_cache: Path, settings: cc.Settings) -> dict[str, bytes]:
    return {k: v for k, v in tree(pod_cache).items() if settings.published_path(k)}


def engine_on(pod, tmp_path: Path, node: str, **kw) -> dict[str, bytes]:
    """The fake engine's start on `pod`'s node; returns the files a publish must carry."""
    run_engine(pod.cache_dir, tmp_path / f"{node}-home", **kw)
    return published(pod.cache_dir, pod.settings())


def test_the_engine_state_travels_byte_for_byte(pod: PodFactory, rclone_s3, tmp_path: Path) -> None:
    a = pod("node-a")
    assert cc.restore(a.settings(), client=rclone_s3.client(), emit=False).result == "miss"  # an empty node
    carried = engine_on(a, tmp_path, "node-a")
    # Every allow-listed tree got files from the engine: the env and the allow-list name the same places.
    tops = {top for top in compile_cache_settings.DEFAULT_CACHE_PATHS if any(k.startswith(top + "/") for k in carried)}
    assert tops == set(compile_cache_settings.DEFAULT_CACHE_PATHS) - {"vllm/torch_aot_compile"}  # vLLM 0.11's AOT layout
    # What the engines write that is not cache never travels.
    everything = tree(a.cache_dir)
    left_out = set(everything) - set(carried)
    assert any(k.startswith("huggingface/") for k in left_out)
    assert any(k.endswith("flashinfer_jit.log") for k in left_out)
    assert any(k.startswith("tilelang/tmp/") for k in left_out)
    assert all(not k.endswith((".lock", ".log")) for k in carried)
    # Nothing landed in the pod's HOME, the emptyDir every pod starts without.
    home = tmp_path / "node-a-home"
    assert [p for p in home.rglob("*") if p.is_file()] == []

    out = cc.publish(a.settings(), client=rclone_s3.client(), wait=False, emit=False)
    assert (out.result, out.files) == ("published", len(carried))

    b = pod("node-b")
    back = cc.restore(b.settings(), client=rclone_s3.client(), emit=False)
    assert (back.result, back.files) == ("restored", len(carried))
    restored = tree(b.cache_dir)
    assert restored == carried  # byte-identical, and nothing else
    assert {hashlib.sha256(v).hexdigest() for v in restored.values()} == \
        {hashlib.sha256(v).hexdigest() for v in carried.values()}
    assert any(k.startswith("vllm/startup_plan/startup_plan_") for k in restored)
    # The restore names vLLM's hash directories the node now holds (for the cold-start report).
    assert back.compile_dirs and all(d.startswith("torch_compile_cache/") for d in back.compile_dirs)
    assert leftovers(b.cache_dir) == []

    c = pod("node-c")  # a third node: the same bytes again, from S3
    assert cc.restore(c.settings(), client=rclone_s3.client(), emit=False).result == "restored"
    assert tree(c.cache_dir) == carried


def test_flashinfer_ops_built_on_the_node_travel_and_precompiled_ones_leave_no_so(pod: PodFactory, rclone_s3,
                                                                                 tmp_path: Path) -> None:
    """An op in the image's flashinfer-jit-cache leaves only its build.ninja and sources in the
    workspace; one FlashInfer had to build (a model outside that set) leaves its .so, which the
    archive carries like any cache file (tests/podside/fake_engine.py has the sources)."""
    a = pod("node-a")
    precompiled = engine_on(a, tmp_path, "node-a", scale=0.05)
    ops = "flashinfer/.cache/flashinfer/"
    assert any(k.startswith(ops) and k.endswith("/build.ninja") for k in precompiled)
    assert not any(k.startswith(ops) and k.endswith(".so") for k in precompiled)

    b = pod("node-b", WARMSTART_CACHE_PREFIX="jit-built/")
    built = engine_on(b, tmp_path, "node-b", scale=0.05, flashinfer_jit=True)
    so = {k for k in built if k.startswith(ops) and k.endswith(".so")}
    assert len(so) == 4 and set(built) - so == set(precompiled)
    assert cc.publish(b.settings(), client=rclone_s3.client(), wait=False, emit=False).result == "published"
    c = pod("node-c", WARMSTART_CACHE_PREFIX="jit-built/")
    assert cc.restore(c.settings(), client=rclone_s3.client(), emit=False).result == "restored"
    assert tree(c.cache_dir) == built


def _published_engine_key(pod: PodFactory, server, tmp_path: Path, **env: str) -> tuple[str, dict[str, bytes]]:
    a = pod("node-a", **env)
    carried = engine_on(a, tmp_path, "node-a")
    out = cc.publish(a.settings(), client=server.client(), wait=False, emit=False)
    assert out.result == "published"
    return out.key, carried  # type: ignore[return-value]


def _assert_clean(outcome: cc.Outcome, cache_dir: Path, result: str, reason: str) -> None:
    assert outcome.result == result and reason in (outcome.reason or ""), outcome
    assert tree(cache_dir) == {} and leftovers(cache_dir) == []


@pytest.mark.parametrize("change, reason", [
    (lambda body: body[: len(body) // 2], "truncated"),
    (lambda body: body[:4096] + bytes([body[4096] ^ 0xFF]) + body[4097:], "corrupt"),
], ids=["truncated", "corrupt"])
def test_a_damaged_engine_archive_leaves_the_node_empty(pod: PodFactory, rclone_s3, tmp_path: Path,
                                                        change, reason: str) -> None:
    key, _ = _published_engine_key(pod, rclone_s3, tmp_path)
    client = rclone_s3.client()
    obj = client.get_object(Bucket=BUCKET, Key=key)
    body, meta = obj["Body"].read(), {k.lower(): v for k, v in obj["Metadata"].items()}
    client.put_object(Bucket=BUCKET, Key=key, Body=change(body), Metadata=meta)
    b = pod("node-b")
    _assert_clean(cc.restore(b.settings(), client=client, emit=False), b.cache_dir, "error", reason)


def test_an_engine_cache_over_the_size_bound_is_neither_published_nor_restored(pod: PodFactory, rclone_s3,
                                                                               tmp_path: Path) -> None:
    a = pod("node-a", WARMSTART_MAX_BYTES=str(4 << 20))
    carried = engine_on(a, tmp_path, "node-a")
    assert sum(map(len, carried.values())) > 4 << 20
    out = cc.publish(a.settings(), client=rclone_s3.client(), wait=False, emit=False)
    assert out.result == "skipped" and "over WARMSTART_MAX_BYTES" in out.reason
    assert rclone_s3.client().list_objects_v2(Bucket=BUCKET, Prefix=a.settings().prefix).get("KeyCount", 0) == 0
    # Published under a larger bound, refused before download by a pod with the smaller one.
    assert cc.publish(a.with_env(WARMSTART_MAX_BYTES="").settings(), client=rclone_s3.client(), wait=False,
                      emit=False).result == "published"
    b = pod("node-b", WARMSTART_MAX_BYTES=str(4 << 20))
    _assert_clean(cc.restore(b.settings(), client=rclone_s3.client(), emit=False), b.cache_dir, "error",
                  "over WARMSTART_MAX_BYTES")


def test_an_engine_cache_with_too_many_files_is_refused(pod: PodFactory, rclone_s3, tmp_path: Path) -> None:
    key, carried = _published_engine_key(pod, rclone_s3, tmp_path)
    b = pod("node-b", WARMSTART_MAX_FILES=str(len(carried) - 1))
    _assert_clean(cc.restore(b.settings(), client=rclone_s3.client(), emit=False), b.cache_dir, "error",
                  "WARMSTART_MAX_FILES")


@pytest.mark.parametrize("member", [
    "nv/other/entry",  # beside the CUDA cache, not in it
    "flashinfer/.cache/flashinfer/0.7.2.post1/90a/flashinfer_jit.log",  # a log, not a cache
    "tilelang/tmp/123_abc.so",  # TileLang's scratch
    "flashinfer/lib/libinjected.so",  # outside FlashInfer's cache tree
], ids=["beside-cuda", "log", "scratch", "outside-flashinfer"])
def test_a_foreign_file_in_an_engine_tree_refuses_the_whole_archive(pod: PodFactory, rclone_s3, member: str) -> None:
    b = pod("node-b")
    key = b.key()
    files = {"nv/ComputeCache/index": b"index", "vllm/startup_plan/startup_plan_0123456789abcdef.json": b"{}",
             member: b"foreign"}
    archives.put(rclone_s3, key, archives.forge(files, compile_cache_node.key_digest(key)))
    _assert_clean(cc.restore(b.settings(), client=rclone_s3.client(), emit=False), b.cache_dir, "error",
                  "not under WARMSTART_CACHE_PATHS")
