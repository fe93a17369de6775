"""Node-local model cache decisions: version digest, whether staging pays, capacity, warm nodes (pure).

A model's weights can be staged on each GPU node's NVMe ahead of time so a pod reads them
locally instead of streaming them from S3 (SageMaker HyperPod does the same with
`modelCacheConfig.weightsCache`,
https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-model-deployment-model-caching.html).
Staging is not always faster: AWS measured, for ~200 GB on p5.48xlarge, an S3 -> NVMe copy
plus an NVMe -> GPU load slower than tuned direct streaming ("Fast model loading for AI
inference on Amazon EKS",
https://aws.amazon.com/blogs/containers/fast-model-loading-for-ai-inference-on-amazon-eks/).
So `nodeCache: auto` compares two predictions made here.

Units: bytes (`*_bytes`), seconds (`*_seconds`), bytes per second (`*_bytes_per_second`).
Functions raise NodeCacheError(rule, fix); the config layer adds the key.

Prediction constants are self-contained here (a separate phases module may later own them);
each says where it comes from.
"""

from __future__ import annotations

import hashlib
import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from . import gpu_pools, phases, tuning
from .instances import GIB, GpuInstance

NodeCacheMode = Literal["auto", "on", "off"]
ContentCheck = Literal["auto", "etag", "sha256", "size"]
"""How the stager checks a copy's bytes (`WARMSTART_CONTENT_CHECK`, warmstart/podside/weights_stage.py)."""
CONTENT_CHECKS: tuple[str, ...] = typing.get_args(ContentCheck)

# --------------------------------------------------------------------------------------
# Version digest

DIGEST_HEX_CHARS = 12
# Format of the digest inputs; bump to invalidate every staged copy at once.
DIGEST_FORMAT = "warmstart-weights/1"


def model_version_digest(source: str, revision: str | None = None, import_source: str | None = None,
                         import_revision: str | None = None) -> str:
    """Immutable name of one version of a model's weights: the node directory and the label value.

    The inputs are what makes a version: the S3 `source` and, where given, a revision, or the
    import that fills `source` (its origin and pinned revision, which is what the import
    manifest records). A changed input is a new directory: a node never mixes two versions.
    Requires the source prefix itself to be immutable (a new version gets a new prefix or a
    new import revision).
    """
    if not source.startswith("s3://"):
        raise NodeCacheError(f"source {source!r} is not an s3:// URI", "stage only models whose source is in S3")
    parts = [DIGEST_FORMAT, source.rstrip("/"), revision or "", import_source or "", import_revision or ""]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:DIGEST_HEX_CHARS]


# --------------------------------------------------------------------------------------
# Layout (node side) and the stable in-container path

WEIGHTS_DIRNAME = "weights"
# In the serving container the model's weights root is always mounted here, whatever the
# mode's NVMe mount, so `/weights/<digest>` is the same string on every node: vLLM hashes the
# model path into its compile-cache directory (`ModelConfig.compute_hash`,
# https://github.com/vllm-project/vllm/blob/main/vllm/config/model.py), so the path must
# depend only on the digest.
CONTAINER_WEIGHTS_ROOT = "/weights"


def node_weights_root(nvme_mount: str, model: str) -> str:
    """Node directory holding one model's staged versions: `<nvme>/weights/<model>`."""
    return f"{nvme_mount.rstrip('/')}/{WEIGHTS_DIRNAME}/{model}"


def container_model_path(digest: str) -> str:
    return f"{CONTAINER_WEIGHTS_ROOT}/{digest}"


# --------------------------------------------------------------------------------------
# Load-time predictions

# The load-time figures are the cold-start predictions' (warmstart/decisions/phases.py, each
# sourced there): one set of constants for the plan, the render and `warmstart coldstart`.
NVME_READ_BYTES_PER_SECOND = phases.NVME_READ_BYTES_PER_S
# Staging must save at least this much of a cold start, and this share of it, to be worth
# its S3 traffic, NVMe space and a DaemonSet pod per node.
MIN_SAVING_SECONDS = 10.0
MIN_SAVING_SHARE = 0.25


@dataclass(frozen=True)
class LoadPrediction:
    """Predicted weight-load times of one model on one instance type, and the decision."""

    instance_type: str
    weights_bytes: int
    s3_bytes_per_second: float
    nvme_bytes_per_second: float
    s3_seconds: float
    nvme_seconds: float
    mode: NodeCacheMode
    """What was asked: auto, on or off."""
    staged: bool
    """The decision: stage the weights on this pool's nodes."""
    reason: str

    def summary(self) -> dict:
        return {"instanceType": self.instance_type, "s3Seconds": round(self.s3_seconds, 1),
                "nvmeSeconds": round(self.nvme_seconds, 1), "nodeCache": self.mode, "staged": self.staged,
                "reason": self.reason}


def predict(instance: GpuInstance, weights_bytes: int, mode: NodeCacheMode = "auto") -> LoadPrediction:
    """Weight-load time from S3 (tuned streaming, capped by the instance's network: the same
    figure as the cold-start predictions, `phases.s3_weights_bytes_per_s`) and from NVMe, and
    whether to stage (`on`/`off` override)."""
    if weights_bytes <= 0:
        raise NodeCacheError("weights size must be positive", "set the model's weightsGiB")
    s3_rate = phases.s3_weights_bytes_per_s(instance, tuned=True)
    s3_s = weights_bytes / s3_rate
    nvme_s = weights_bytes / NVME_READ_BYTES_PER_SECOND
    saving = s3_s - nvme_s
    pays = instance.nvme_total_gb > 0 and saving >= max(MIN_SAVING_SECONDS, MIN_SAVING_SHARE * s3_s)
    if mode == "on":
        staged, reason = True, "nodeCache: on"
    elif mode == "off":
        staged, reason = False, "nodeCache: off"
    elif instance.nvme_total_gb <= 0:
        staged, reason = False, f"{instance.instance_type} has no local NVMe"
    elif pays:
        staged, reason = True, f"NVMe saves {saving:.0f} s of {s3_s:.0f} s"
    else:
        staged, reason = False, (f"tuned streaming is about as fast ({s3_s:.0f} s from S3 vs {nvme_s:.0f} s "
                                 f"from NVMe; staging needs to save >= {MIN_SAVING_SECONDS:.0f} s and "
                                 f">= {MIN_SAVING_SHARE:.0%})")
    return LoadPrediction(instance.instance_type, weights_bytes, s3_rate, NVME_READ_BYTES_PER_SECOND, s3_s,
                          nvme_s, mode, staged, reason)


# --------------------------------------------------------------------------------------
# Capacity


class NodeCacheError(ValueError):
    def __init__(self, rule: str, fix: str) -> None:
        self.rule = rule
        self.fix = fix
        super().__init__(f"{rule}; fix: {fix}")


# Kubelet's default hard eviction thresholds: nodefs.available<10 %, imagefs.available<15 %
# (https://kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/#hard-eviction-thresholds).
# With RAID0 the images, pod data and the staged weights share one filesystem, so the larger
# one applies to all of it: staging must never eat into it or the node reports DiskPressure.
EVICTION_THRESHOLD_SHARE = 0.15
# Versions a node keeps per model: the current one and the previous one (a rollback).
VERSIONS_KEPT = 2


@dataclass(frozen=True)
class StagedModel:
    """A model whose weights are staged on a pool."""

    name: str
    weights_bytes: int
    compile_cache: bool


def usable_nvme_bytes(instance: GpuInstance) -> int:
    """NVMe bytes available to caches before the kubelet's eviction threshold."""
    return int(instance.nvme_total_bytes * (1 - EVICTION_THRESHOLD_SHARE))


def required_nvme_bytes(models: Sequence[StagedModel], compile_cache_models: int) -> int:
    """Images and pod scratch, the compile caches, and two versions of every staged model."""
    return (gpu_pools.NODE_EPHEMERAL_RESERVE_BYTES + compile_cache_models * gpu_pools.COMPILE_CACHE_RESERVE_BYTES
            + VERSIONS_KEPT * sum(m.weights_bytes for m in models))


def check_capacity(pool: str, instances: Sequence[GpuInstance], staged: Sequence[StagedModel],
                   compile_cache_models: int) -> None:
    """Every instance type of the pool holds two versions of each staged model plus the compile
    caches and the node's own data, below the eviction threshold; else NodeCacheError naming
    the numbers and the fix."""
    if not staged:
        return
    names = ", ".join(sorted(m.name for m in staged))
    missing = sorted(i.instance_type for i in instances if i.nvme_total_gb <= 0)
    if missing:
        raise NodeCacheError(
            f"pool {pool!r} stages {names} but {', '.join(missing)} has no local NVMe instance store",
            "use instance types with NVMe, or nodeCache: off for those models")
    need = required_nvme_bytes(staged, compile_cache_models)
    small = sorted((i for i in instances if usable_nvme_bytes(i) < need), key=lambda i: i.instance_type)
    if small:
        weights_gib = sum(m.weights_bytes for m in staged) / GIB
        have = ", ".join(f"{i.instance_type}: {i.nvme_total_gb} GB NVMe, {usable_nvme_bytes(i) / GIB:.0f} GiB "
                         f"usable below the {EVICTION_THRESHOLD_SHARE:.0%} eviction threshold" for i in small)
        raise NodeCacheError(
            f"pool {pool!r} needs {need / GIB:.0f} GiB of NVMe per node ({VERSIONS_KEPT} x {weights_gib:.0f} GiB "
            f"of staged weights for {names}, {compile_cache_models} x "
            f"{gpu_pools.COMPILE_CACHE_RESERVE_BYTES / GIB:.0f} GiB compile cache, "
            f"{gpu_pools.NODE_EPHEMERAL_RESERVE_BYTES / GIB:.0f} GiB images and pod scratch) but has {have}",
            "use a larger instance type, move a model to another pool, or set nodeCache: off on a model")


# --------------------------------------------------------------------------------------
# Warm spare nodes

# Priorities of the two PriorityClasses (values below zero preempt nothing and are preempted
# by every default-priority pod; https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/).
# Staging DaemonSet pods sit below serving pods so they never block one, but above the
# placeholders so a spare node keeps its staging pod while its placeholder is preempted.
STAGING_PRIORITY = -10
PLACEHOLDER_PRIORITY = -100


def check_warm_nodes(pool: str, warm_nodes: int, gpus_per_node: int, max_gpus: int, serving_gpus: int) -> None:
    """`warmNodes` spares, each holding a whole node's GPUs, fit under the pool's GPU limit next
    to the serving pods (Karpenter counts the spares' nodes against `limits`)."""
    if warm_nodes < 0:
        raise NodeCacheError("warmNodes must be >= 0", "set warmNodes to 0 or more")
    room = max_gpus - serving_gpus
    if warm_nodes * gpus_per_node > room:
        raise NodeCacheError(
            f"pool {pool!r}: warmNodes={warm_nodes} spares of {gpus_per_node} GPUs need {warm_nodes * gpus_per_node} "
            f"GPUs but maxGpus={max_gpus} leaves {room} after the serving pods' {serving_gpus}",
            f"set warmNodes <= {max(0, room // gpus_per_node)} or raise maxGpus to "
            f">= {serving_gpus + warm_nodes * gpus_per_node}")


def warm_nodes_cost_per_hour(warm_nodes: int, on_demand_usd_per_hour: float | None) -> float | None:
    """Cost of the spares: the instance table has no price column, so the price is an input
    (None: unknown, shown as such in the render table)."""
    if on_demand_usd_per_hour is None:
        return None if warm_nodes else 0.0
    return round(warm_nodes * on_demand_usd_per_hour, 2)


def deadline_seconds(weights_bytes: int) -> int:
    """Overall deadline of one staging copy: the weights at the start-up budget's pessimistic
    rate plus ten minutes; a copy that takes longer is abandoned and retried later."""
    return math.ceil(600 + weights_bytes / tuning.STARTUP_PESSIMISTIC_BYTES_PER_SECOND)


def rollout_timeout_seconds(deadline_seconds: int) -> int:
    """How long `pulumi up` waits for a staging DaemonSet's rollout (`pulumi.com/timeoutSeconds`):
    a copy's deadline, plus the time to launch a node and pull the image."""
    return deadline_seconds + tuning.NODE_LAUNCH_ALLOWANCE_SECONDS
