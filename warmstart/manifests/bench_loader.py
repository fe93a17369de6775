"""The `warmstart bench-loader` Job (pure): warmstart/podside/bench_loader.py on the model's GPU
pool, with the model's ServiceAccount (so its IAM role reads the model bucket exactly as the
serving pod does), the model's image (the streamer the pods use), and the tuned streamer
environment the serving container gets (serving.vllm_env)."""

from __future__ import annotations

import json
from typing import Any

from ..decisions import placement
from ..plan.records import ServingPlan
from .serving import labels, vllm_env

CONFIGMAP_NAME = "warmstart-bench-loader"
SCRIPT_KEY = "bench_loader.pyz"
SCRIPT_MOUNT = "/opt/warmstart-bench"
# Long enough for the three reads of a 200 GiB model at the streamer defaults' rate.
ACTIVE_DEADLINE_SECONDS = 3 * 3600


def job_name(model: str) -> str:
    return f"{model}-bench-loader"[:63].rstrip("-")


def tuned_streamer_env(m: ServingPlan, region: str) -> dict[str, str]:
    """The RUNAI_STREAMER_* values of the serving container, plus the concurrency vLLM exports
    from --model-loader-extra-config."""
    env = {e["name"]: e["value"] for e in vllm_env(m, region) if e["name"].startswith("RUNAI_STREAMER_")}
    return env | {"RUNAI_STREAMER_CONCURRENCY": str(m.concurrency)}


def bench_loader_job(m: ServingPlan, namespace: str, region: str, config_map: str = CONFIGMAP_NAME,
                     max_bytes: int = 0) -> dict[str, Any]:
    """The Job object (batch/v1). `max_bytes`: stream at most this much of the model (0: all)."""
    env = {
        "WARMSTART_MODEL_URI": m.source,
        "WARMSTART_TUNED_ENV": json.dumps(tuned_streamer_env(m, region), sort_keys=True),
        "WARMSTART_NETWORK_GBPS": f"{m.instance.network_baseline_gbps:g}",
        "WARMSTART_MAX_BYTES": str(max_bytes),
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
    }
    pod_labels = labels(m.name) | {"app.kubernetes.io/component": "bench-loader"}
    gpus = str(m.tensor_parallel_size)
    container = {
        "name": "bench-loader",
        "image": m.image,
        "command": ["python3", f"{SCRIPT_MOUNT}/{SCRIPT_KEY}"],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        # The serving pod's share of the node, so the bench sees the same NIC share and CPU.
        "resources": {"requests": {"cpu": f"{m.pod.cpu_millis}m", "memory": f"{m.pod.memory_bytes // 2**20}Mi",
                                   placement.GPU_RESOURCE: gpus},
                      "limits": {"memory": f"{m.pod.memory_bytes // 2**20}Mi", placement.GPU_RESOURCE: gpus}},
        "volumeMounts": [{"name": "script", "mountPath": SCRIPT_MOUNT, "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(m.name), "namespace": namespace, "labels": pod_labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": ACTIVE_DEADLINE_SECONDS,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "serviceAccountName": m.name,
                    "restartPolicy": "Never",
                    "nodeSelector": ({placement.NODEPOOL_LABEL: m.pool} if m.pool else {}) | {
                        placement.INSTANCE_TYPE_LABEL: m.instance.instance_type},
                    "tolerations": [{"key": placement.GPU_TAINT_KEY, "operator": "Exists",
                                     "effect": placement.GPU_TAINT_EFFECT}],
                    "containers": [container],
                    "volumes": [{"name": "script", "configMap": {"name": config_map}}],
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                },
            },
        },
    }
