"""The tuned vLLM serving objects of one model as plain Kubernetes object dicts (pure).

ServiceAccount, Deployment, Service and PodDisruptionBudget from a ModelPlan; the VllmModel
component (components/serving.py) registers them, and the tests validate them against the
Kubernetes schemas.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..decisions import placement, tuning
from ..plan_model import ModelPlan

HTTP_PORT = 8000
# Pod volume of the node's compile-cache directory (other pod wiring mounts it by this name).
COMPILE_CACHE_VOLUME = "compile-cache"
IRSA_ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
ANNOTATION_DOMAIN = placement.ANNOTATION_DOMAIN
# Extra time, beyond the start-up budget, for Karpenter / Auto Mode to launch a GPU node and
# pull the image before the Deployment counts as stuck.
NODE_LAUNCH_SECONDS = 900


def labels(model: str) -> dict[str, str]:
    """Recommended Kubernetes labels; the first two are the selector."""
    return {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": model,
        "app.kubernetes.io/component": "inference-server",
        "app.kubernetes.io/part-of": "warmstart",
        "app.kubernetes.io/managed-by": "pulumi",
    }


def selector(model: str) -> dict[str, str]:
    return {k: v for k, v in labels(model).items() if k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}


def _quantity(n_bytes: int) -> str:
    mib = n_bytes // (1024 * 1024)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def vllm_args(m: ModelPlan) -> list[str]:
    """`vllm serve` arguments; the model URI first."""
    extra_config = {"concurrency": m.concurrency, "distributed": m.distributed}
    args = [
        m.source,
        "--load-format=runai_streamer",
        "--model-loader-extra-config=" + json.dumps(extra_config, sort_keys=True, separators=(",", ":")),
        f"--tensor-parallel-size={m.tensor_parallel_size}",
        f"--gpu-memory-utilization={m.gpu_memory_utilization}",
        f"--served-model-name={m.name}",
        "--host=0.0.0.0",
        f"--port={HTTP_PORT}",
    ]
    if m.max_model_len is not None:
        args.append(f"--max-model-len={m.max_model_len}")
    if m.eager:
        args.append("--enforce-eager")
    args.extend(m.extra_args)
    return args


def vllm_env(m: ModelPlan, region: str) -> list[dict[str, str]]:
    env = {
        # One ~4 GiB request per shard; cut stalled transfers after 3 s below 1 MiB/s and
        # retry, since the pod is ready only when the slowest chunk lands
        # (https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html#model-loading-runai-model-streamer).
        "RUNAI_STREAMER_CHUNK_BYTESIZE": str(m.loader.chunk_bytes),
        "RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS": str(m.loader.request_timeout_ms),
        "RUNAI_STREAMER_S3_LOW_SPEED_LIMIT": str(m.loader.low_speed_limit_bytes_per_second),
        # The streamer freezes boto3's resolved credentials and region for the CRT client
        # (https://github.com/run-ai/runai-model-streamer/blob/master/docs/src/env-vars.md):
        # the region must be explicit on EKS.
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
    }
    if m.compile_cache:
        root = placement.COMPILE_CACHE_MOUNT
        env |= {
            # vLLM keeps its cache under $XDG_CACHE_HOME/vllm and redirects inductor/triton
            # under its own hash directory
            # (https://docs.vllm.ai/en/latest/design/torch_compile/#compilation-cache); the
            # two torch variables still point at the NVMe mount so any compile outside
            # vLLM's path lands there too.
            "XDG_CACHE_HOME": root,
            "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
            "TRITON_CACHE_DIR": f"{root}/triton",
        }
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


@dataclass(frozen=True)
class PodExtras:
    """Containers, volumes and env another component adds to the serving pod
    (the compile-cache restore/publish wiring, for one)."""

    init_containers: tuple[dict, ...] = ()
    volumes: tuple[dict, ...] = ()
    env: tuple[dict, ...] = ()
    volume_mounts: tuple[dict, ...] = ()
    pod_annotations: dict[str, str] = field(default_factory=dict)


def merge_extras(*extras: PodExtras) -> PodExtras:
    """Several components' pod wiring as one (init containers run in the given order)."""
    out = PodExtras()
    for e in extras:
        out = PodExtras(
            init_containers=out.init_containers + tuple(e.init_containers),
            volumes=out.volumes + tuple(e.volumes),
            env=out.env + tuple(e.env),
            volume_mounts=out.volume_mounts + tuple(e.volume_mounts),
            pod_annotations=out.pod_annotations | dict(e.pod_annotations),
        )
    return out


def deployment_spec(m: ModelPlan, namespace: Any, region: str, extras: PodExtras = PodExtras()) -> dict[str, Any]:
    """The Deployment object (apps/v1) for one model."""
    size = m.pod
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": tuning.PROBE_PERIOD_SECONDS}
    volumes: list[dict] = [
        # NCCL and vLLM's all-reduce use /dev/shm between TP ranks; the container default is
        # 64 MiB.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(size.shm_bytes)}},
    ]
    mounts: list[dict] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if m.compile_cache:
        volumes.append({
            "name": COMPILE_CACHE_VOLUME,
            # A per-model directory on the node's NVMe, shared by that model's pods on the
            # node. The nvme-check init container makes sure this path is NVMe, not EBS.
            "hostPath": {"path": f"{m.compile_cache_host_path}/{m.name}", "type": "DirectoryOrCreate"},
        })
        mounts.append({"name": COMPILE_CACHE_VOLUME, "mountPath": placement.COMPILE_CACHE_MOUNT})
    volumes.extend(extras.volumes)
    mounts.extend(extras.volume_mounts)
    gpu = str(m.tensor_parallel_size)
    container = {
        "name": "vllm",
        "image": m.image,
        # Explicit: older images start `python3 -m vllm.entrypoints.openai.api_server`.
        "command": ["vllm", "serve"],
        "args": vllm_args(m),
        "env": vllm_env(m, region) + list(extras.env),
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": f"{size.cpu_millis}m", "memory": _quantity(size.memory_bytes), placement.GPU_RESOURCE: gpu},
            "limits": {"memory": _quantity(size.memory_bytes), placement.GPU_RESOURCE: gpu},
        },
        # vLLM binds its port only after weights and compile are done
        # (https://github.com/vllm-project/vllm/blob/main/vllm/entrypoints/launcher.py), so
        # /health refuses connections while loading. The start-up probe owns that phase with
        # a budget derived from the weights size; liveness starts only after it succeeds, so
        # no probe kills a pod that is still loading.
        "startupProbe": probe | {"timeoutSeconds": 5,
                                 "failureThreshold": -(-m.startup_budget_seconds // tuning.PROBE_PERIOD_SECONDS)},
        "readinessProbe": probe | {"timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": probe | {"timeoutSeconds": 10, "failureThreshold": 6},
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False},
    }
    pod_labels = labels(m.name)
    spec = {
        "replicas": m.replicas,
        "selector": {"matchLabels": selector(m.name)},
        # Keep the old pod serving until the new one has loaded.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "progressDeadlineSeconds": m.startup_budget_seconds + NODE_LAUNCH_SECONDS,
        "revisionHistoryLimit": 3,
        "template": {
            "metadata": {"labels": pod_labels, **({"annotations": extras.pod_annotations} if extras.pod_annotations else {})},
            "spec": {
                "serviceAccountName": m.name,
                # The pool, when the model names one, and always the instance type it was tuned for.
                "nodeSelector": ({placement.NODEPOOL_LABEL: m.pool} if m.pool else {}) | {
                    placement.INSTANCE_TYPE_LABEL: m.instance.instance_type,
                },
                "tolerations": [{"key": placement.GPU_TAINT_KEY, "operator": "Exists", "effect": placement.GPU_TAINT_EFFECT}],
                "initContainers": list(extras.init_containers),
                "containers": [container],
                "volumes": volumes,
                "terminationGracePeriodSeconds": 60,
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            },
        },
    }
    if not spec["template"]["spec"]["initContainers"]:
        del spec["template"]["spec"]["initContainers"]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": m.name,
            "namespace": namespace,
            "labels": pod_labels,
            "annotations": {
                # What the Deployment was tuned from, so policies can re-check the decisions.
                f"{ANNOTATION_DOMAIN}/weights-bytes": str(m.weights_bytes),
                f"{ANNOTATION_DOMAIN}/chunk-bytes": str(m.loader.chunk_bytes),
                f"{ANNOTATION_DOMAIN}/concurrency": str(m.concurrency),
                f"{ANNOTATION_DOMAIN}/tensor-parallel-size": str(m.tensor_parallel_size),
                # Let `pulumi up` wait as long as Kubernetes itself would.
                "pulumi.com/timeoutSeconds": str(spec["progressDeadlineSeconds"]),
            },
        },
        "spec": spec,
    }


def service_spec(m: ModelPlan, namespace: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": m.name, "namespace": namespace, "labels": labels(m.name)},
        "spec": {
            "type": "ClusterIP",
            "selector": selector(m.name),
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def pdb_spec(m: ModelPlan, namespace: Any) -> dict[str, Any]:
    # maxUnavailable rather than minAvailable: a single-replica model must not block node
    # drains forever.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": m.name, "namespace": namespace, "labels": labels(m.name)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(m.name)}},
    }


def service_account_spec(m: ModelPlan, namespace: str, role_arn: Any = None) -> dict[str, Any]:
    """The model's ServiceAccount; `role_arn` (a string or a Pulumi Input) is the IRSA role."""
    meta: dict[str, Any] = {"name": m.name, "namespace": namespace, "labels": labels(m.name)}
    if role_arn is not None:
        meta["annotations"] = {IRSA_ROLE_ANNOTATION: role_arn}
    # The IRSA webhook mounts its own projected token; the pod never calls the Kubernetes API.
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, "automountServiceAccountToken": False}
