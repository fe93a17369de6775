"""Publish and restore against real S3 servers: round trips, the sidecar's wait, concurrency."""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import re
import tarfile
import threading
import time
from pathlib import Path

import pytest

from tests.podside.pods import PodFactory, finish, leftovers, make_cache, pod_factory, tree
from tests.podside.servers import BUCKET, HealthServer, S3Server, SeaweedS3
from warmstart.podside.compile_cache import node as compile_cache_node
from warmstart.podside.compile_cache import settings as compile_cache_settings
from warmstart.podside.compile_cache import main as cc

pytestmark = pytest.mark.servers  # the pod scripts against S3 servers


def stored(server: S3Server, key: str) -> tuple[dict[str, str], bytes]:
    obj = server.client().get_object(Bucket=BUCKET, Key=key)
    return {k.lower(): v for k, v in obj["Metadata"].items()}, obj["Body"].read()


def archive_files(body: bytes) -> dict[str, bytes]:
    """The cache files in a published archive; its manifest must vouch for exactly these."""
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}  # type: ignore[union-attr]
    manifest = json.loads(members.pop(cc.MANIFEST_MEMBER))
    assert {name: (size, sha) for name, size, sha, _ in manifest["files"]} == {
        name: (len(data), hashlib.sha256(data).hexdigest()) for name, data in members.items()}
    return members


def test_round_trip_carries_exactly_the_compile_cache(pod: PodFactory, rclone_s3, capsys) -> None:
    a = pod("node-a")
    published = make_cache(a.cache_dir, seed=1)

    out = cc.publish(a.settings(), client=rclone_s3.client(), wait=False)
    assert (out.result, out.files) == ("published", len(published))
    key = out.key
    assert key == a.key() and key.startswith(a.settings().prefix)

    meta, body = stored(rclone_s3, key)
    assert meta["warmstart-sha256"] == hashlib.sha256(body).hexdigest()
    assert int(meta["warmstart-bytes"]) == len(body) == out.bytes
    assert archive_files(body) == published  # no lock, temp file or other tool's cache
    manifest = json.loads(rclone_s3.client().get_object(Bucket=BUCKET, Key=cc.manifest_key(key))["Body"].read())
    assert manifest["factors"] == cc.compute_factors(a.settings())

    b = pod("node-b")
    back = cc.restore(b.settings(), client=rclone_s3.client())
    assert (back.result, back.key, back.bytes, back.files) == ("restored", key, len(body), len(published))
    assert tree(b.cache_dir) == published
    assert os.access(b.cache_dir / "inductor/c1/kernel.so", os.X_OK)
    assert leftovers(a.cache_dir) == leftovers(b.cache_dir) == []

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["phase"], line["result"]) for line in lines] == [("publish", "published"), ("restore", "restored")]


def test_pod_lifecycle_through_the_command_line(pod: PodFactory, rclone_s3, tmp_path: Path) -> None:
    """What the Deployment runs: publish waits for vLLM's health, restore runs on later nodes."""
    with HealthServer(ready_after=3) as vllm:
        a = pod("node-a", WARMSTART_HEALTH_URL=vllm.url)
        assert a.run("restore").line["result"] == "miss"  # first node ever: nothing to restore
        published = make_cache(a.cache_dir, seed=2)
        run = a.run("publish", "--once")
        assert run.returncode == 0 and run.line["result"] == "published"
        assert vllm.requests == 4 and run.line["waited_s"] > 0  # three 503s, then 200
    assert a.run("publish", "--once").line["result"] == "exists"  # a restarted sidecar

    b = pod("node-b")
    gets = rclone_s3.count_gets(a.key())  # node a's miss was one
    first = b.run("restore")
    assert (first.returncode, first.line["result"]) == (0, "restored")
    assert tree(b.cache_dir) == published
    again = b.run("restore")  # the next pod on node b
    assert (again.returncode, again.line["result"]) == (0, "hit")
    assert b.run("publish", "--once").line["result"] == "exists"
    assert rclone_s3.count_gets(first.line["key"]) == gets + 1  # only the first pod downloaded


def imported_botocore(stderr: str) -> bool:
    """Whether a run with PYTHONPROFILEIMPORTTIME=1 imported botocore (`import time: ... | botocore`)."""
    return re.search(r"^import time:.*\|\s+botocore\b", stderr, re.MULTILINE) is not None


def fake_nvidia_smi(tmp_path: Path) -> dict[str, str]:
    """The env of a pod that sees a GPU: an nvidia-smi on PATH that names an H100, no override."""
    bin_dir = tmp_path / "gpu-bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nsleep 0.2\necho 'NVIDIA H100 80GB HBM3, 9.0'\n")
    smi.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "WARMSTART_ACCELERATOR": ""}


def test_a_hit_imports_no_s3_client(pod: PodFactory, rclone_s3, tmp_path: Path) -> None:
    """The hit is every later pod's start on a node: it never imports botocore, with or without
    nvidia-smi (the check can fail: the first restore of node b does import it)."""
    for gpu in ({}, fake_nvidia_smi(tmp_path)):
        a = pod("node-a", **gpu)
        make_cache(a.cache_dir, seed=31)
        assert a.run("publish", "--once").line["result"] == "published"  # under the key this env derives
        hit = a.run("restore", env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert hit.line["result"] == "hit" and not imported_botocore(hit.stderr), hit.stderr[-2000:]
    new = pod("node-b", **gpu).run("restore", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert new.line["result"] == "restored" and imported_botocore(new.stderr)


def test_a_node_that_cannot_hit_builds_its_client_beside_nvidia_smi(pod: PodFactory, rclone_s3, tmp_path: Path,
                                                                   monkeypatch) -> None:
    """A node with no marker of any key cannot hit: while nvidia-smi runs for the key, its client
    is built on another thread (compile_cache._restore). A node that may hit, or that runs no
    nvidia-smi, builds it when it needs it, on the restoring thread; a hit never builds one."""
    gpu = fake_nvidia_smi(tmp_path)
    monkeypatch.setenv("PATH", gpu["PATH"])
    a = pod("node-a", **gpu)
    published = make_cache(a.cache_dir, seed=32)
    assert cc.publish(a.settings(), client=rclone_s3.client(), wait=False, emit=False).result == "published"
    built_on: list[str] = []

    def make_client(settings: cc.Settings):
        built_on.append(threading.current_thread().name)
        return rclone_s3.client()

    monkeypatch.setattr(cc, "make_client", make_client)
    b = pod("node-b", **gpu)
    assert cc.restore(b.settings(), emit=False).result == "restored" and tree(b.cache_dir) == published
    assert cc.restore(b.settings(), emit=False).result == "hit"
    c = pod("node-c", **gpu)
    (c.cache_dir / compile_cache_settings.STATE_DIRNAME).mkdir()
    (c.cache_dir / compile_cache_settings.STATE_DIRNAME / f"restored-{'0' * 64}.json").write_text("{}")  # another key's
    assert cc.restore(c.settings(), emit=False).result == "restored" and tree(c.cache_dir) == published
    assert cc.restore(pod("node-d").settings(), emit=False).result == "miss"  # WARMSTART_ACCELERATOR given
    assert built_on == ["warmstart-ahead", "MainThread", "MainThread"]


def test_a_client_that_cannot_be_built_is_one_error_line_ahead_or_not(pod: PodFactory, rclone_s3,
                                                                      tmp_path: Path) -> None:
    gpu = fake_nvidia_smi(tmp_path)
    for node, marker in (("node-b", False), ("node-c", True)):  # built ahead, built when needed
        d = pod(node, AWS_ENDPOINT_URL="not a url", **gpu)
        if marker:
            (d.cache_dir / compile_cache_settings.STATE_DIRNAME).mkdir()
            (d.cache_dir / compile_cache_settings.STATE_DIRNAME / f"published-{'0' * 64}.json").write_text("{}")
        run = d.run("restore")
        assert (run.returncode, run.line["result"]) == (0, "error") and "Invalid endpoint" in run.line["reason"]
        assert tree(d.cache_dir) == {} and leftovers(d.cache_dir) == []


def test_a_sidecar_publishes_under_the_key_its_init_container_derived(pod: PodFactory, tmp_path: Path) -> None:
    """The init container can hold the GPU; the sidecar cannot. The state file bridges them."""
    state = str(tmp_path / "pod-a-state" / "key.json")
    init = pod("node-a", WARMSTART_STATE_FILE=state)
    assert init.run("restore").line["result"] == "miss"
    make_cache(init.cache_dir, seed=3)
    sidecar = init.with_env(WARMSTART_ACCELERATOR="")  # no GPU, no nvidia-smi, CPU torch here
    run = sidecar.run("publish", "--once")
    assert run.line["result"] == "published" and run.line["key"] == init.key()


def test_publish_skips_an_empty_cache(pod: PodFactory, rclone_s3) -> None:
    a = pod("node-a")
    (a.cache_dir / "inductor").mkdir()
    run = a.run("publish", "--once")
    assert (run.returncode, run.line["result"]) == (0, "skipped") and "empty" in run.line["reason"]
    listed = rclone_s3.client().list_objects_v2(Bucket=BUCKET, Prefix=a.settings().prefix)
    assert listed.get("KeyCount", 0) == 0


def test_publish_gives_up_on_a_server_that_never_gets_healthy(pod: PodFactory) -> None:
    with HealthServer(ready_after=10**9) as vllm:
        a = pod("node-a", WARMSTART_HEALTH_URL=vllm.url, WARMSTART_HEALTH_TIMEOUT_S="0.5")
        make_cache(a.cache_dir, seed=4)
        run = a.run("publish", "--once")
    assert (run.returncode, run.line["result"]) == (0, "skipped") and "never answered 200" in run.line["reason"]


def test_publish_idles_after_publishing_so_the_sidecar_never_restarts(pod: PodFactory) -> None:
    a = pod("node-a")
    make_cache(a.cache_dir, seed=5)
    proc = a.spawn("publish")
    deadline = time.monotonic() + 60
    line = ""
    while time.monotonic() < deadline and not line:
        line = proc.stdout.readline()  # type: ignore[union-attr]
    try:
        assert json.loads(line)["result"] == "published"
        time.sleep(0.5)
        assert proc.poll() is None  # still running, idle
        proc.terminate()  # what the kubelet sends at pod shutdown: must exit at once, cleanly
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def hold_node_lock(cache_dir: Path) -> int:
    state = cache_dir / compile_cache_settings.STATE_DIRNAME
    state.mkdir(parents=True, exist_ok=True)
    fd = os.open(state / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_concurrent_restorers_on_one_node_download_once(pod: PodFactory, rclone_s3) -> None:
    a = pod("node-a")
    published = make_cache(a.cache_dir, seed=6, kib=256)
    key = cc.publish(a.settings(), client=rclone_s3.client(), wait=False, emit=False).key

    b = pod("node-b")
    fd = hold_node_lock(b.cache_dir)  # queue all four behind the lock, then let them race
    try:
        procs = [b.spawn("restore") for _ in range(4)]
        time.sleep(3)
    finally:
        os.close(fd)
    runs = [finish(p) for p in procs]
    assert all(r.returncode == 0 for r in runs)
    assert sorted(r.line["result"] for r in runs) == ["hit", "hit", "hit", "restored"]
    assert rclone_s3.count_gets(key) == 1
    assert tree(b.cache_dir) == published and leftovers(b.cache_dir) == []


def test_a_restorer_that_waits_too_long_for_the_lock_lets_vllm_compile(pod: PodFactory, rclone_s3) -> None:
    """The node lock covers only the renames into place: held past the timeout, the restore
    gives up after its download and leaves nothing behind."""
    a = pod("node-a")
    make_cache(a.cache_dir, seed=30)
    assert cc.publish(a.settings(), client=rclone_s3.client(), wait=False, emit=False).result == "published"
    b = pod("node-b", WARMSTART_LOCK_TIMEOUT_S="0.3")
    fd = hold_node_lock(b.cache_dir)
    try:
        run = b.run("restore")
    finally:
        os.close(fd)
    assert (run.returncode, run.line["result"]) == (0, "skipped") and "node lock" in run.line["reason"]
    assert tree(b.cache_dir) == {} and leftovers(b.cache_dir) == []


def test_a_restorer_waits_for_another_download_of_its_key_within_the_lock_timeout(pod: PodFactory) -> None:
    b = pod("node-b", WARMSTART_LOCK_TIMEOUT_S="0.3")
    state = b.cache_dir / compile_cache_settings.STATE_DIRNAME
    state.mkdir(parents=True)
    fd = os.open(state / f"fetch-{compile_cache_node.key_digest(b.key())}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        run = b.run("restore")
    finally:
        os.close(fd)
    assert (run.returncode, run.line["result"]) == (0, "skipped") and "download of this key" in run.line["reason"]
    assert time.monotonic() - started < 10


def test_concurrent_publishers_leave_one_intact_object(any_s3: S3Server, tmp_path: Path, health) -> None:
    """Two nodes compile the same key at once and publish different bytes."""
    make = pod_factory(tmp_path, any_s3, health.url)
    a, b = make("node-a"), make("node-b")
    contents = [make_cache(a.cache_dir, seed=7), make_cache(b.cache_dir, seed=8)]
    assert contents[0] != contents[1] and a.key() == b.key()

    runs = [finish(p) for p in [a.spawn("publish", "--once"), b.spawn("publish", "--once")]]

    assert all(r.returncode == 0 for r in runs)
    results = sorted(r.line["result"] for r in runs)
    meta, body = stored(any_s3, a.key())
    assert meta["warmstart-sha256"] == hashlib.sha256(body).hexdigest()
    assert archive_files(body) in contents  # one publisher's cache, whole, never a mix
    if isinstance(any_s3, SeaweedS3):  # honours If-None-Match: exactly one write happened
        assert results == ["exists", "published"]
    else:  # rclone overwrites a conditional PUT: the HEAD narrows the race, the object stays whole
        assert "published" in results and set(results) <= {"published", "exists"}
    c = make("node-c")
    assert c.run("restore").line["result"] == "restored" and tree(c.cache_dir) in contents


def test_the_loser_of_a_conditional_write_reports_exists(seaweed_s3: SeaweedS3, tmp_path: Path, health, monkeypatch) -> None:
    """Both publishers passed the HEAD check; S3 decides with If-None-Match and 412."""
    make = pod_factory(tmp_path, seaweed_s3, health.url)
    a, b = make("node-a"), make("node-b")
    first = make_cache(a.cache_dir, seed=9)
    make_cache(b.cache_dir, seed=10)
    assert cc.publish(a.settings(), client=seaweed_s3.client(), wait=False).result == "published"

    monkeypatch.setattr(cc, "object_exists", lambda *args: False)  # lost the race after its HEAD
    out = cc.publish(b.settings(), client=seaweed_s3.client(), wait=False)

    assert out.result == "exists" and "conditional write" in out.reason
    assert archive_files(stored(seaweed_s3, a.key())[1]) == first
    assert leftovers(b.cache_dir) == []


def test_temp_files_of_a_killed_pod_are_cleaned(pod: PodFactory, rclone_s3) -> None:
    """A temp file is a dead pod's when nobody holds its key's lease, or (no key in its name) when
    it is over an hour old; a live pod's temp is left alone."""
    a = pod("node-a")
    published = make_cache(a.cache_dir, seed=11)
    cc.publish(a.settings(), client=rclone_s3.client(), wait=False, emit=False)
    b = pod("node-b")
    state = b.cache_dir / compile_cache_settings.STATE_DIRNAME
    own, other, live = compile_cache_node.key_digest(b.key()), "1" * 64, "2" * 64
    (state / f"tmp-restore-{own}-dead.d" / "inductor").mkdir(parents=True)
    (state / f"tmp-restore-{own}-dead.tar.gz").write_bytes(b"partial")
    (state / f"tmp-publish-{other}-dead.tar.gz").write_bytes(b"partial")
    old = state / "tmp-restore-999.tar.gz"  # an older layout's name
    old.write_bytes(b"partial")
    os.utime(old, (time.time() - 2 * 3600,) * 2)
    (state / f"tmp-restore-{live}-alive.tar.gz").write_bytes(b"downloading")
    fd = os.open(state / f"fetch-{live}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # that download's pod is alive
    try:
        assert b.run("restore").line["result"] == "restored"
    finally:
        os.close(fd)
    assert leftovers(b.cache_dir) == [f"tmp-restore-{live}-alive.tar.gz"] and tree(b.cache_dir) == published


def test_restore_keeps_what_the_node_compiled_itself(pod: PodFactory, rclone_s3) -> None:
    a = pod("node-a")
    published = make_cache(a.cache_dir, seed=12)
    cc.publish(a.settings(), client=rclone_s3.client(), wait=False, emit=False)
    b = pod("node-b")
    own = b.cache_dir / "inductor/fxgraph/ab/fabcdef/entry"
    own.parent.mkdir(parents=True)
    own.write_bytes(b"compiled here")
    assert cc.restore(b.settings(), client=rclone_s3.client()).result == "restored"
    assert tree(b.cache_dir) == {**published, "inductor/fxgraph/ab/fabcdef/entry": b"compiled here"}


@pytest.mark.parametrize("paths", ["inductor", "triton,vllm/torch_compile_cache"])
def test_only_the_listed_cache_paths_are_published(pod: PodFactory, rclone_s3, paths: str) -> None:
    a = pod("node-a", WARMSTART_CACHE_PATHS=paths)
    everything = make_cache(a.cache_dir, seed=13)
    out = cc.publish(a.settings(), client=rclone_s3.client(), wait=False, emit=False)
    expected = {k: v for k, v in everything.items() if any(k.startswith(p + "/") for p in paths.split(","))}
    assert archive_files(stored(rclone_s3, out.key)[1]) == expected


def test_a_cache_that_keeps_changing_is_not_published(pod: PodFactory, rclone_s3, monkeypatch) -> None:
    """vLLM may still be compiling a late shape: publish only a cache that held still while read."""
    a = pod("node-a")
    make_cache(a.cache_dir, seed=14)
    real, calls = cc.snapshot, []

    def moving(settings):
        calls.append(1)
        return {**real(settings), f"inductor/late-{len(calls)}": (1, len(calls), False)}

    monkeypatch.setattr(cc, "snapshot", moving)
    out = cc.publish(a.settings(), client=rclone_s3.client(), wait=False, emit=False)
    assert out.result == "skipped" and "kept changing" in out.reason
    assert rclone_s3.client().list_objects_v2(Bucket=BUCKET, Prefix=a.settings().prefix).get("KeyCount", 0) == 0
    assert leftovers(a.cache_dir) == []


def test_the_sidecar_tries_again_while_the_cache_keeps_changing(pod: PodFactory, rclone_s3, monkeypatch) -> None:
    """A JIT cache a first request still fills after /health: the sidecar waits and publishes
    once it holds still, backing off, instead of giving up for the pod's life."""
    a = pod("node-a", WARMSTART_PUBLISH_RETRIES="3", WARMSTART_PUBLISH_RETRY_S="30")
    published = make_cache(a.cache_dir, seed=31)
    real, calls = cc.snapshot, []

    def busy_then_still(settings):
        calls.append(1)
        extra = {f"nv/ComputeCache/entry-{len(calls)}": (1, len(calls), False)} if len(calls) <= 12 else {}
        return {**real(settings), **extra}

    monkeypatch.setattr(cc, "snapshot", busy_then_still)
    waits: list[float] = []
    out = cc.publish_until_settled(a.settings(), client=rclone_s3.client(), sleep=waits.append)
    assert out.result == "published" and waits == [30, 60]
    assert archive_files(stored(rclone_s3, out.key)[1]) == published


def test_the_sidecar_stops_trying_after_its_retries(pod: PodFactory, rclone_s3, monkeypatch) -> None:
    a = pod("node-a", WARMSTART_PUBLISH_RETRIES="2", WARMSTART_PUBLISH_RETRY_S="5")
    make_cache(a.cache_dir, seed=32)
    real, calls = cc.snapshot, []
    monkeypatch.setattr(cc, "snapshot", lambda s: (calls.append(1), {**real(s), f"triton/x{len(calls)}": (1, 1, False)})[1])
    waits: list[float] = []
    out = cc.publish_until_settled(a.settings(), client=rclone_s3.client(), sleep=waits.append)
    assert out.result == "skipped" and "kept changing" in out.reason and waits == [5, 10]
    assert rclone_s3.client().list_objects_v2(Bucket=BUCKET, Prefix=a.settings().prefix).get("KeyCount", 0) == 0
