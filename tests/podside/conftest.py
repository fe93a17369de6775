"""Fixtures for the pod-side compile-cache tests: real S3 servers on 127.0.0.1 and pods on nodes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.podside.engine_hosts import Host, hosts_in
from tests.podside.faults import FaultProxy
from tests.podside.hub import HubStandIn
from tests.podside.pods import PodFactory, pod_factory
from tests.podside.servers import BUCKET, HealthServer, RcloneS3, S3Server
from tests.support.weights_import import COMMIT, DST, PART, SRC, Job, ensure_bucket, model_files, put_tree, weights_gib

def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "torch_compile: runs a real torch.compile in subprocesses (tens of seconds)")


@pytest.fixture(params=["rclone", "seaweedfs"])
def any_s3(request: pytest.FixtureRequest) -> S3Server:
    """Both servers: one that ignores If-None-Match and one that honours it."""
    return request.getfixturevalue(f"{request.param.replace('fs', '')}_s3")


@pytest.fixture
def health() -> Iterator[HealthServer]:
    with HealthServer() as server:
        yield server


@pytest.fixture
def pod(tmp_path: Path, rclone_s3: RcloneS3, health: HealthServer) -> PodFactory:
    """Pods of one model (a prefix of its own) against rclone: pod("node-b") is another node."""
    return pod_factory(tmp_path, rclone_s3, health.url)


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path | None]]:
    """Mount a small tmpfs (root only): a real full or read-only filesystem. None if not allowed."""
    mounted: list[Path] = []

    def mount(path: Path, size: str, readonly: bool = False) -> Path | None:
        path.mkdir(parents=True, exist_ok=True)
        opts = f"size={size},mode=0755" + (",ro" if readonly else "")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True)
        if proc.returncode != 0:
            return None
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", str(path)], check=False)


# The weights-import Jobs (tests/podside/test_podside_weights_import.py, test_podside_import_faults.py)

_counter = iter(range(10**6))


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own, so tests share the session's servers."""
    return f"t{next(_counter)}-{os.getpid()}/org/model"


@pytest.fixture
def s3_job(seaweed_s3: S3Server, prefix: str) -> tuple[Job, dict[str, bytes]]:
    files = model_files(seed=1)
    put_tree(seaweed_s3, BUCKET, f"{SRC}/{prefix}", files)
    env = {"WARMSTART_MODEL": "llama", "WARMSTART_DEST_BUCKET": BUCKET, "WARMSTART_DEST_PREFIX": f"{DST}/{prefix}",
           "WARMSTART_WEIGHTS_GIB": repr(weights_gib(files)), "WARMSTART_SOURCE_S3": f"s3://{BUCKET}/{SRC}/{prefix}",
           "WARMSTART_PART_BYTES": str(PART), "WARMSTART_MAX_CONCURRENCY": "8"}
    return Job(seaweed_s3, env), files


@pytest.fixture
def hub():
    with HubStandIn() as h:
        yield h


@pytest.fixture
def hub_job(rclone_s3: S3Server, hub: HubStandIn, prefix: str, tmp_path: Path) -> tuple[Job, dict[str, bytes]]:
    ensure_bucket(rclone_s3, "models")
    files = model_files(seed=2)
    hub.add("org/model", COMMIT, files)
    env = {"WARMSTART_MODEL": "llama", "WARMSTART_DEST_BUCKET": "models", "WARMSTART_DEST_PREFIX": prefix,
           "WARMSTART_WEIGHTS_GIB": repr(weights_gib(files)), "WARMSTART_HF_REPO": "org/model",
           "WARMSTART_HF_REVISION": COMMIT, "WARMSTART_SCRATCH_DIR": str(tmp_path / "scratch"),
           "WARMSTART_PART_BYTES": str(PART), "WARMSTART_RETRIES": "2", "HF_ENDPOINT": hub.url,
           "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    return Job(rclone_s3, env), files


@pytest.fixture
def proxy(seaweed_s3: S3Server) -> Iterator[FaultProxy]:
    """A fault proxy in front of SeaweedFS, for the weights import's fault tests."""
    with FaultProxy(seaweed_s3.endpoint) as p:
        yield p


@pytest.fixture
def host_factory(tmp_path: Path) -> Iterator[Callable[..., Host]]:
    """Engine host supervisors over fake engines (tests/podside/engine_hosts.py), all stopped after."""
    yield from hosts_in(tmp_path)
