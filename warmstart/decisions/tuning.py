"""Loader and pod tuning decisions, derived from AWS's published guidance and measurements.

Sources: [EKS] AWS EKS User Guide, "Accelerate model loading on Amazon EKS",
https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html;
[blog] AWS Containers Blog, "Fast model loading for AI inference on Amazon EKS",
https://aws.amazon.com/blogs/containers/fast-model-loading-for-ai-inference-on-amazon-eks/.

Units: every size is in bytes (`*_bytes`), every duration in seconds (`*_seconds`) unless the
name says otherwise. Functions raise TuningError(rule, fix); the config layer adds the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import node_fit
from .instances import GIB, MIB, GpuInstance

# [EKS], [blog]: 4 GiB chunks (about one request per ~3.9 GiB safetensors shard); 8 GiB was
# 56 % slower, so the chunk should not exceed a shard.
DEFAULT_CHUNK_BYTES = 4 * GIB
# Run:ai streamer minimum S3 chunk
# (https://github.com/run-ai/runai-model-streamer/blob/master/docs/src/env-vars.md).
MIN_S3_CHUNK_BYTES = 5 * MIB
# Stalled transfers are cut and retried, since readiness waits on the slowest chunk ([EKS]).
# What a cut does, at the pinned runai-model-streamer 0.17.1:
# - the streamer's S3 client is the AWS CRT; aws-sdk-cpp turns lowSpeedLimit and requestTimeoutMs
#   into the connection monitor's minimum_throughput_bytes_per_second and
#   allowable_throughput_failure_interval_seconds = max(3, requestTimeoutMs / 1000)
#   (https://github.com/aws/aws-sdk-cpp/blob/main/generated/src/aws-cpp-sdk-s3-crt/source/S3CrtClient.cpp);
# - the monitor samples each connection once a second, judging only a request that spans two
#   samples (so only a part, 8 MiB in 0.17.1's log, that takes over a second), and shuts the
#   connection down (AWS_ERROR_HTTP_CHANNEL_THROUGHPUT_FAILURE) once consecutive samples under the
#   minimum add up to more than that interval; one sample at or above it resets the count
#   (https://github.com/awslabs/aws-c-http/blob/main/source/connection_monitor.c);
# - the CRT retries the cut part on a new connection a few times; when those retries are cut too,
#   the streamer fails the whole load (`File access error`, logged retryable=false) unless its own
#   per-chunk retry window RUNAI_STREAMER_S3_TIMEOUT is above 0, which is 0 by default
#   (https://github.com/run-ai/runai-model-streamer/blob/master/docs/src/env-vars.md).
# Measured on 127.0.0.1 through a proxy that paces connections (tests/serving/test_streamer_stall.py):
# with AWS's 1 MiB/s and 3000 ms, a load whose connections all ran at 256 KiB/s for 30 s failed
# after 48 cuts; one connection cut once was retried and the load completed; a connection that
# delivers nothing is cut after the window under any positive limit. So the limit only has to
# tell a dead connection from a slow one: at 64 KiB/s an 8 MiB part takes two minutes, far below
# a live S3 path. The 10 s window rides out a client starved of CPU for seconds (a busy node,
# many pods loading at once); the retry window turns a cut the CRT gives up on into a retry of
# that chunk instead of a crashed vLLM and a full reload.
DEFAULT_REQUEST_TIMEOUT_MS = 10_000
DEFAULT_LOW_SPEED_LIMIT_BYTES_PER_S = 64 * 1024
# Half the fixed start-up budget (STARTUP_FIXED_SECONDS): a chunk retried up to its deadline
# still leaves the start-up probe time to load the rest.
DEFAULT_RETRY_WINDOW_SECONDS = 300

TENSOR_PARALLEL_CANDIDATES = (1, 2, 4, 8)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.90
# The TP rule keeps at least this share of every GPU for KV cache, activations and CUDA
# graphs. With vLLM's 0.90 utilisation the weights may use 75 % of a GPU: a 67 GiB model on
# 80 GiB H100s needs TP=2 and Llama-4-Scout (203 GiB) needs TP=4, AWS's published choices.
MIN_KV_CACHE_FRACTION = 0.15


class TuningError(ValueError):
    def __init__(self, rule: str, fix: str) -> None:
        self.rule = rule
        self.fix = fix
        super().__init__(f"{rule}; fix: {fix}")


def streamer_s3_env(request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                     low_speed_limit_bytes_per_second: int = DEFAULT_LOW_SPEED_LIMIT_BYTES_PER_S,
                     retry_window_seconds: int = DEFAULT_RETRY_WINDOW_SECONDS) -> dict[str, str]:
    """The streamer's stall cut and retry, as environment variables
    (https://github.com/run-ai/runai-model-streamer/blob/master/docs/src/env-vars.md): the
    serving container, the bench-loader Job and the benchmarks all take them from here."""
    return {
        "RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS": str(request_timeout_ms),
        "RUNAI_STREAMER_S3_LOW_SPEED_LIMIT": str(low_speed_limit_bytes_per_second),
        "RUNAI_STREAMER_S3_TIMEOUT": str(retry_window_seconds),
    }


def loader_concurrency(weights_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Streamer workers: ceil(weights / chunk), at least 1 ([EKS]).

    Parallelism comes from distinct files, so more workers than chunks only adds idle
    connections (256 gave nothing over 17 for 67 GiB; [blog]).
    """
    if weights_bytes <= 0:
        raise TuningError("weights size must be positive", "set the model's weightsGiB")
    if chunk_bytes < MIN_S3_CHUNK_BYTES:
        raise TuningError(
            f"chunk must be at least {MIN_S3_CHUNK_BYTES} bytes (streamer S3 minimum)",
            "use the default 4 GiB chunk",
        )
    return max(1, math.ceil(weights_bytes / chunk_bytes))


def max_weights_per_gpu_bytes(instance: GpuInstance, gpu_memory_utilization: float) -> int:
    """Weight bytes one GPU may hold and still leave MIN_KV_CACHE_FRACTION for KV cache."""
    return int(instance.gpu_memory_bytes * (gpu_memory_utilization - MIN_KV_CACHE_FRACTION))


def valid_tensor_parallel_sizes(instance: GpuInstance) -> tuple[int, ...]:
    return tuple(
        n for n in TENSOR_PARALLEL_CANDIDATES
        if n <= instance.gpu_count and instance.gpu_count % n == 0
    )


def tensor_parallel_fits(
    weights_bytes: int, instance: GpuInstance, tp: int, gpu_memory_utilization: float
) -> bool:
    return weights_bytes / tp <= max_weights_per_gpu_bytes(instance, gpu_memory_utilization)


def choose_tensor_parallel(
    weights_bytes: int,
    instance: GpuInstance,
    requested: int | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
) -> int:
    """The tensor-parallel degree for a model on one node of `instance`.

    `requested=None` ("auto") picks the fewest GPUs in {1, 2, 4, 8} that divide the node's
    GPUs and hold the weights with room for KV cache ([EKS]: "the minimum number of GPUs
    required to fit the model"). An explicit value is checked against the same rule.
    """
    sizes = valid_tensor_parallel_sizes(instance)
    budget_gib = max_weights_per_gpu_bytes(instance, gpu_memory_utilization) / GIB
    weights_gib = weights_bytes / GIB
    if requested is not None:
        if requested not in sizes:
            raise TuningError(
                f"tensorParallelSize={requested} needs {requested} GPUs but "
                f"{instance.instance_type} has {instance.gpu_count}; valid: "
                f"{', '.join(map(str, sizes))}",
                f"use tensorParallelSize in ({', '.join(map(str, sizes))}) or 'auto', "
                "or an instance type with more GPUs",
            )
        if not tensor_parallel_fits(weights_bytes, instance, requested, gpu_memory_utilization):
            raise TuningError(
                f"{weights_gib:.1f} GiB of weights over tensorParallelSize={requested} is "
                f"{weights_gib / requested:.1f} GiB per GPU, above the {budget_gib:.1f} GiB a "
                f"{instance.gpu_model} may hold and keep {MIN_KV_CACHE_FRACTION:.0%} for KV cache",
                "use tensorParallelSize: auto, or a larger tensorParallelSize or GPU",
            )
        return requested
    for tp in sizes:
        if tensor_parallel_fits(weights_bytes, instance, tp, gpu_memory_utilization):
            return tp
    raise TuningError(
        f"{weights_gib:.1f} GiB of weights do not fit on one {instance.instance_type} "
        f"({instance.gpu_count} x {instance.gpu_model}, {budget_gib:.1f} GiB of weights per GPU)",
        "choose an instance type with more or larger GPUs, or a quantized model",
    )


# Startup budget. The startup probe must outlast the slowest honest start, or Kubernetes kills
# a pod that is still streaming weights and the restart starts over ([blog]: an
# untuned 203 GiB start took 463 s). Budget = fixed part + weights at a pessimistic rate:
#  - fixed: engine init, tokenizer/config pull, a cold torch.compile (34-80 s in [EKS] and
#    [blog]) and CUDA graph capture, with a wide margin;
#  - rate: 0.2 GiB/s, under half of the untuned default AWS measured (203 GiB in 429 s).
STARTUP_FIXED_SECONDS = 600
STARTUP_PESSIMISTIC_BYTES_PER_SECOND = 0.2 * GIB
PROBE_PERIOD_SECONDS = 10


def startup_budget_seconds(weights_bytes: int) -> int:
    """Seconds a pod may take from container start to a healthy /health."""
    return math.ceil(STARTUP_FIXED_SECONDS + weights_bytes / STARTUP_PESSIMISTIC_BYTES_PER_SECOND)


# Extra time, beyond the start-up budget, for Karpenter / Auto Mode to launch a GPU node and
# pull the image before the Deployment counts as stuck.
NODE_LAUNCH_ALLOWANCE_SECONDS = 900


def rollout_timeout_seconds(startup_budget_seconds: int) -> int:
    """How long a model's pods may take to roll out (a node launched, the image pulled, the
    start-up budget): the Deployment's `progressDeadlineSeconds`, and how long `pulumi up` waits
    for it (`pulumi.com/timeoutSeconds`, https://www.pulumi.com/registry/packages/kubernetes/api-docs/apps/v1/deployment/)."""
    return startup_budget_seconds + NODE_LAUNCH_ALLOWANCE_SECONDS


def startup_probe_failure_threshold(weights_bytes: int) -> int:
    return math.ceil(startup_budget_seconds(weights_bytes) / PROBE_PERIOD_SECONDS)


@dataclass(frozen=True)
class PodSize:
    """Requests for one serving pod: a GPU-proportional share of the node."""

    gpus: int
    cpu_millis: int
    memory_bytes: int
    shm_bytes: int


# Share of the node's CPU and memory a pod may request per GPU it uses; the rest is left for
# the kubelet reservation (~8 % of memory on these types) and daemonsets.
NODE_CPU_SHARE = 0.85
NODE_MEMORY_SHARE = 0.80
# What else a GPU node runs, taken off its allocatable first: the node's own DaemonSets
# (kube-proxy, the VPC CNI and its policy agent: node_fit.NODE_DAEMONS) and warmstart's (the node
# cache's staging pod, 500m / 512Mi, or the image pre-pull, 10m / 32Mi); and what the serving pod
# runs beside vLLM (the compile-cache, first-token and metrics sidecars, 160m / 416Mi today).
# On a 4-vCPU node the share above leaves too little for them (tests/node_fit/test_node_fit.py packs
# every GPU type), so the pod gets what is left instead.
GPU_NODE_RESERVE_CPU_MILLIS = 150 + 500 + 10
GPU_NODE_RESERVE_MEMORY_MIB = 512 + 32
POD_SIDECARS_CPU_MILLIS = 200
POD_SIDECARS_MEMORY_MIB = 512


def pod_size(instance: GpuInstance, tp: int) -> PodSize:
    """CPU, memory and /dev/shm for a pod using `tp` GPUs of one `instance`.

    /dev/shm: TP > 1 ranks exchange tensors through shared memory (NCCL, vLLM's custom
    all-reduce), so it gets 8 GiB per rank, capped at a quarter of the pod's memory because a
    memory-backed emptyDir counts against the pod's memory. TP = 1 needs only 2 GiB.
    """
    share = tp / instance.gpu_count
    cpu = int(instance.vcpu * 1000 * share * NODE_CPU_SHARE)
    memory = int(instance.memory_gib * GIB * share * NODE_MEMORY_SHARE) // MIB * MIB
    # Never more than the node can give once its DaemonSets and the pod's sidecars have theirs.
    known = instance.instance_type in node_fit.node_types()
    node = (node_fit.allocatable(instance.instance_type) if known
            else node_fit.allocatable_of(instance.vcpu, instance.memory_gib))
    cpu = min(cpu, int(share * (node.cpu_millis - GPU_NODE_RESERVE_CPU_MILLIS)) - POD_SIDECARS_CPU_MILLIS)
    memory = min(memory, (int(share * (node.memory_mib - GPU_NODE_RESERVE_MEMORY_MIB))
                          - POD_SIDECARS_MEMORY_MIB) * MIB)
    shm = 2 * GIB if tp == 1 else min(8 * GIB * tp, memory // 4 // GIB * GIB)
    return PodSize(gpus=tp, cpu_millis=cpu, memory_bytes=memory, shm_bytes=shm)
