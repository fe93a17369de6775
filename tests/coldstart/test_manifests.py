"""The bench-loader Job and the first-token sidecar validate against the Kubernetes schemas and
carry the model's identity, pool and tuning; the bench script runs for real against S3."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest

from tests.podside.servers import BUCKET
from tests.support.stacks import render_stack
from tests.support.pod_scripts import artifact
from warmstart.decisions import placement
from warmstart.manifests import bench_loader, first_token
from warmstart.podside import bench_loader as bench_script


@pytest.fixture(params=["dev", "prod"])
def plan(request):
    return render_stack(request.param).stack_plan


def test_bench_job_runs_as_the_model_on_its_pool(plan):
    for m in plan.models:
        job = bench_loader.bench_loader_job(m, plan.config.namespace, plan.config.region)
        kubernetes_validate.validate(job, plan.config.kubernetes_version, strict=True)
        spec = job["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == m.name
        assert spec["nodeSelector"][placement.INSTANCE_TYPE_LABEL] == m.instance.instance_type
        assert {"key": placement.GPU_TAINT_KEY, "operator": "Exists", "effect": placement.GPU_TAINT_EFFECT} in spec["tolerations"]
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        tuned = json.loads(env["WARMSTART_TUNED_ENV"])
        assert tuned["RUNAI_STREAMER_CONCURRENCY"] == str(m.concurrency)
        assert tuned["RUNAI_STREAMER_CHUNK_BYTESIZE"] == str(m.loader.chunk_bytes)
        assert env["WARMSTART_MODEL_URI"] == m.source


def test_first_token_sidecar_validates_in_a_pod(plan):
    for m in plan.models:
        extras = first_token.first_token_extras(m, "cache-bucket", plan.config.region, state_volume="compile-cache-state")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "inference"},
               "spec": {"initContainers": list(extras.init_containers),
                        "containers": [{"name": "vllm", "image": m.image, "env": list(extras.env)}],
                        "volumes": list(extras.volumes) + [{"name": "compile-cache-state", "emptyDir": {}}]}}
        kubernetes_validate.validate(pod, plan.config.kubernetes_version, strict=True)
        c = extras.init_containers[0]
        assert c["restartPolicy"] == "Always"
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["WARMSTART_RECORD_PREFIX"] == f"{m.name}/coldstart/"
        assert {e["name"] for e in c["env"]} >= {"POD_NAME", "NODE_NAME", "POD_NAMESPACE"}
        assert {e["name"]: e["value"] for e in extras.env} == {"RUNAI_STREAMER_LOG_TO_STDERR": "1",
                                                                 "VLLM_DISABLE_LOG_LOGO": "1"}


def _shard(path: Path, n_tensors: int, tensor_bytes: int) -> None:
    header = {f"t{i}": {"dtype": "BF16", "shape": [tensor_bytes // 2], "data_offsets": [i * tensor_bytes, (i + 1) * tensor_bytes]}
              for i in range(n_tensors)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.write(os.urandom(n_tensors * tensor_bytes))


@pytest.mark.slow
def test_bench_script_measures_three_ways_against_s3(rclone_s3, tmp_path):
    prefix = "bench-loader-test/model"
    s3 = rclone_s3.client()
    for i in range(2):
        f = tmp_path / f"model-{i + 1:05d}-of-00002.safetensors"
        _shard(f, 4, 4 << 20)
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{f.name}", Body=f.read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RUNAI_"))} | rclone_s3.env() | {
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        "WARMSTART_MODEL_URI": f"s3://{BUCKET}/{prefix}",
        "WARMSTART_TUNED_ENV": json.dumps({"RUNAI_STREAMER_CONCURRENCY": "2", "RUNAI_STREAMER_CHUNK_BYTESIZE": str(16 << 20)}),
        "WARMSTART_NETWORK_GBPS": "5", "WARMSTART_CEILING_THREADS": "4", "WARMSTART_CASE_TIMEOUT_S": "120"}
    proc = subprocess.run([sys.executable, str(artifact("bench_loader.pyz"))], env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["event"] == "warmstart.bench_loader" and line["result"] == "ok", line
    assert line["files"] == 2 and line["bytes"] > 2 * 4 * (4 << 20)
    for k in ("defaults", "tuned", "ceiling"):
        assert line[k]["bytes"] >= 2 * 4 * (4 << 20) and line[k]["gib_per_s"] > 0
    assert line["recommendation"]
    from warmstart.coldstart.command import format_bench

    assert "recommendation:" in format_bench(line)
