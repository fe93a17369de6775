"""What each phase of a cold start should take: the one place of sourced prediction constants.

The cold-start report (warmstart/coldstart/) prints these beside what a pod measured and flags a
phase that took more than twice its prediction; the scale-out planning reuses them to predict
how long a new replica takes. Every function is plain arithmetic on bytes and seconds, so it can
be reasoned about and property-tested.

Sources:
  [EKS]  AWS EKS User Guide, "Accelerate model loading on Amazon EKS",
         https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html
         Llama-4-Scout (203 GiB, TP=4, p5.48xlarge): weights 429 s + compile 34 s = 463 s with the
         streamer's defaults; tuned streamer + compile cache 26 s + 6 s = 32 s; the first pod on a
         fresh node, compile not cached, 59-60 s.
  [blog] AWS Containers Blog, "Fast model loading for AI inference on Amazon EKS",
         https://aws.amazon.com/blogs/containers/fast-model-loading-for-ai-inference-on-amazon-eks/
         Qwen 64-67 GiB, TP=2: default 29 s + 53 s = 82 s; tuned 12 s + 53 s = 65 s; tuned and
         cached 12 s + ~4 s = 16 s; cached compile 4-6 s for 60 GB to 640 GB models.
  [SOCI] AWS Containers Blog, "Introducing Seekable OCI Parallel Pull Mode for Amazon EKS",
         https://aws.amazon.com/blogs/containers/introducing-seekable-oci-parallel-pull-mode-for-amazon-eks/
         large AI/ML images: 2-4 min with the default pull, 30-60 s with parallel pull/unpack,
         which EKS Auto Mode uses on GPU instances.
  [HyperPod] Amazon SageMaker HyperPod model caching,
         https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-model-deployment-model-caching.html
         weights read from the node's NVMe at ~7 GB/s; image pulls of 5-7 min without caching.
  [plan] vLLM's startup plan, https://github.com/vllm-project/vllm/pull/47388 (in the pinned
         0.33.0 as vllm/v1/worker/startup_plan.py): a boot whose fingerprint matches a saved
         plan skips memory profiling and the throwaway CUDA-graph capture of the memory
         estimate; the real graph capture still runs on every boot.
  [roadmap] vLLM's cold-start roadmap, https://github.com/vllm-project/vllm/issues/48193:
         initialised-engine reuse took an engine start from 23.91 s to 9.42 s.

A figure no public source gives (a GPU node's launch, vLLM's engine start-up) is a planning
ASSUMPTION, marked `basis="assumption"`: the report says so beside the number, and a model's own
history (`warmstart coldstart --history`) is the better prediction once it has records.

Units: bytes (`*_bytes`), seconds (`*_seconds`), bytes per second (`*_bytes_per_s`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .instances import GB, GIB, GpuInstance
from .tuning import PROBE_PERIOD_SECONDS

EKS_GUIDE = "https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html"
BLOG = "https://aws.amazon.com/blogs/containers/fast-model-loading-for-ai-inference-on-amazon-eks/"
SOCI_BLOG = "https://aws.amazon.com/blogs/containers/introducing-seekable-oci-parallel-pull-mode-for-amazon-eks/"
HYPERPOD = "https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-model-deployment-model-caching.html"
ASSUMPTION = "assumption"

# --- weights -----------------------------------------------------------------------------------
# The tuned streamer's aggregate rate, over the published tuned loads: 203 GiB in 26 s [EKS] and
# 67 GiB in 12 s [blog], i.e. (203 + 67) GiB / (26 + 12) s = 7.1 GiB/s. With `distributed` each
# TP rank streams its own share, so the node's rate does not grow with TP; it is one figure.
TUNED_STREAMER_BYTES_PER_S = (203 + 67) * GIB / (26 + 12)
# The streamer's defaults (8 workers, 8 MiB ranges), from the [EKS] untuned run: 203 GiB in 429 s.
# The [blog]'s untuned 67 GiB TP=2 run was 29 s, five times faster per byte, so the defaults do not
# have one rate; this one is used only to explain a slow load ("the tuning did not reach the
# pod"), never as the plan.
DEFAULT_STREAMER_BYTES_PER_S = 203 * GIB / 429
# Share of the instance's network baseline an S3 download can use. AWS reached 33-39 Gbps on a
# 40 Gbps link with every range in flight at once [blog]: ~0.85; 0.8 keeps a margin.
NETWORK_EFFICIENCY = 0.8
# Reading from the node's NVMe RAID [HyperPod]; decimal GB as published.
NVME_READ_BYTES_PER_S = 7 * GB
# A cache that silently landed on the root EBS volume instead of the NVMe [EKS]: "~1 GB/s".
EBS_READ_BYTES_PER_S = 1 * GB

# --- compile -----------------------------------------------------------------------------------
# A cold torch.compile: 34 s (Llama-4-Scout) to 53-80 s (dense 60-640 GB) [EKS], [blog]. The
# middle published figure is the default; a model's own history replaces it.
COMPILE_COLD_SECONDS = 53.0
# A compile served from the cache: 4-6 s over 60-640 GB models [blog]; 6 s for Scout [EKS].
COMPILE_CACHED_SECONDS = 6.0

# --- image, node, engine -----------------------------------------------------------------------
# Large AI/ML images: 30-60 s with SOCI parallel pull (Auto Mode GPU nodes), 2-4 min without
# [SOCI]; the upper ends, so that a normal pull is not flagged.
IMAGE_PULL_PARALLEL_SECONDS = 60.0
IMAGE_PULL_DEFAULT_SECONDS = 240.0
# Capacity nominated -> node Ready for a GPU instance. No AWS figure is published; this is a
# planning assumption (EC2 launch, boot, kubelet join, the NVIDIA device plugin advertising GPUs).
NODE_LAUNCH_SECONDS = 150.0
# Pod scheduled on a Ready node -> its containers start, excluding the image pull: sandbox and
# volume set-up, a few seconds (assumption).
POD_START_SECONDS = 5.0
# vLLM container start -> "Starting to load model": Python imports, config and tokenizer pulled
# from the model's S3 prefix, worker start-up (assumption).
PROCESS_START_SECONDS = 20.0
# vLLM's engine init beyond compile and graph capture: the profile run and KV-cache allocation
# (assumption; the "init engine ... took" log line measures all three together). This is the
# uncached figure: no startup plan and empty JIT caches (FlashInfer, CUDA, DeepGEMM, ...).
ENGINE_INIT_SECONDS = 10.0
# The same with the engine state warm (the startup plan applied, the JIT caches on the node or
# restored with the compile cache): the [roadmap]'s reuse ratio, 9.42 s / 23.91 s, applied to
# the uncached figure. The closest published measurement of reused engine state; a model's own
# history replaces it.
ENGINE_REUSE_RATIO = 9.42 / 23.91
ENGINE_INIT_CACHED_SECONDS = ENGINE_INIT_SECONDS * ENGINE_REUSE_RATIO
# CUDA graph capture (assumption; the "Graph capturing finished" log line measures it).
CUDA_GRAPH_SECONDS = 15.0
# Warm engine state does not shorten the capture itself at vLLM 0.33: the startup plan skips
# only the estimate's throwaway capture, which the engine-init figure counts [plan].
CUDA_GRAPH_CACHED_SECONDS = CUDA_GRAPH_SECONDS
STARTUP_PLAN = "https://github.com/vllm-project/vllm/pull/47388"
COLD_START_ROADMAP = "https://github.com/vllm-project/vllm/issues/48193"
# /health up -> the first token of a one-token request (assumption: one prefill on an idle engine).
FIRST_TOKEN_SECONDS = 1.0


@dataclass(frozen=True)
class Prediction:
    """One phase's expected duration and where the figure comes from (a URL, or ASSUMPTION)."""

    seconds: float
    basis: str
    note: str = ""


def network_bytes_per_s(instance: GpuInstance) -> float:
    """The instance's network baseline in bytes per second (the table's Gbps, decimal)."""
    return instance.network_baseline_gbps * 1e9 / 8


def s3_weights_bytes_per_s(instance: GpuInstance, tuned: bool = True) -> float:
    """What the streamer reaches from S3 on `instance`: the tuned (or default) streamer rate,
    capped by NETWORK_EFFICIENCY of the instance's network baseline."""
    streamer = TUNED_STREAMER_BYTES_PER_S if tuned else DEFAULT_STREAMER_BYTES_PER_S
    return min(streamer, NETWORK_EFFICIENCY * network_bytes_per_s(instance))


def weights_s3_seconds(weights_bytes: int, instance: GpuInstance, tuned: bool = True) -> float:
    """Seconds to stream `weights_bytes` from S3 into the GPUs of one `instance` node."""
    if weights_bytes < 0:
        raise ValueError("weights_bytes must be >= 0")
    return weights_bytes / s3_weights_bytes_per_s(instance, tuned)


def weights_local_seconds(weights_bytes: int, on_nvme: bool = True) -> float:
    """Seconds to read `weights_bytes` from a node-local copy: the NVMe RAID, or the root EBS
    volume where a hostPath silently lands when the NVMe is not mounted."""
    if weights_bytes < 0:
        raise ValueError("weights_bytes must be >= 0")
    return weights_bytes / (NVME_READ_BYTES_PER_S if on_nvme else EBS_READ_BYTES_PER_S)


def weights_prediction(weights_bytes: int, instance: GpuInstance, source: Literal["s3", "node-cache"] = "s3",
                       tuned: bool = True) -> Prediction:
    """The weights phase for a pod that loads from S3 or from the node's NVMe copy."""
    if source == "node-cache":
        return Prediction(weights_local_seconds(weights_bytes), HYPERPOD,
                          f"node NVMe at {NVME_READ_BYTES_PER_S / GB:.0f} GB/s")
    rate = s3_weights_bytes_per_s(instance, tuned)
    capped = rate < (TUNED_STREAMER_BYTES_PER_S if tuned else DEFAULT_STREAMER_BYTES_PER_S)
    why = (f"{instance.instance_type}'s {instance.network_baseline_gbps:g} Gbps baseline" if capped
           else f"{'tuned' if tuned else 'default'} streamer rate")
    return Prediction(weights_bytes / rate, EKS_GUIDE, f"{rate / GIB:.2f} GiB/s, {why}")


def compile_seconds(cached: bool, cold_seconds: float | None = None) -> float:
    """torch.compile seconds: cached, or cold (`cold_seconds` from the model's own history when
    known, else COMPILE_COLD_SECONDS)."""
    if cached:
        return COMPILE_CACHED_SECONDS
    return COMPILE_COLD_SECONDS if cold_seconds is None else cold_seconds


def compile_prediction(cached: bool, cold_seconds: float | None = None) -> Prediction:
    note = "cache hit" if cached else ("cold, from this model's history" if cold_seconds is not None else "cold")
    return Prediction(compile_seconds(cached, cold_seconds), BLOG, note)


def engine_init_seconds(cached: bool) -> float:
    """Engine init beyond compile and graphs: with the engine state warm, or cold."""
    return ENGINE_INIT_CACHED_SECONDS if cached else ENGINE_INIT_SECONDS


def engine_init_prediction(cached: bool) -> Prediction:
    if cached:
        return Prediction(ENGINE_INIT_CACHED_SECONDS, COLD_START_ROADMAP,
                          f"startup plan and JIT caches warm ({ENGINE_REUSE_RATIO:.2f} x the cold figure)")
    return Prediction(ENGINE_INIT_SECONDS, ASSUMPTION, "profiled, JIT caches empty")


def cuda_graph_seconds(cached: bool) -> float:
    """CUDA graph capture: the same either way at vLLM 0.33 (see CUDA_GRAPH_CACHED_SECONDS)."""
    return CUDA_GRAPH_CACHED_SECONDS if cached else CUDA_GRAPH_SECONDS


def cuda_graph_prediction(cached: bool) -> Prediction:
    if cached:
        return Prediction(CUDA_GRAPH_CACHED_SECONDS, STARTUP_PLAN, "capture still runs; only the estimate's is skipped")
    return Prediction(CUDA_GRAPH_SECONDS, ASSUMPTION)


def image_pull_seconds(present: bool, parallel_pull: bool) -> float:
    """Image pull: 0 when the node has the image, else SOCI parallel pull or the default pull."""
    if present:
        return 0.0
    return IMAGE_PULL_PARALLEL_SECONDS if parallel_pull else IMAGE_PULL_DEFAULT_SECONDS


def image_pull_prediction(present: bool, parallel_pull: bool) -> Prediction:
    note = "already on the node" if present else ("SOCI parallel pull" if parallel_pull else "default pull")
    return Prediction(image_pull_seconds(present, parallel_pull), SOCI_BLOG, note)


@dataclass(frozen=True)
class ColdStart:
    """A whole cold start, phase by phase (seconds)."""

    node_launch: float
    image_pull: float
    pod_start: float
    process_start: float
    weights: float
    compile: float
    cuda_graphs: float
    engine_init: float
    first_token: float

    @property
    def total_seconds(self) -> float:
        return (self.node_launch + self.image_pull + self.pod_start + self.process_start + self.weights + self.compile
                + self.cuda_graphs + self.engine_init + self.first_token)

    @property
    def engine_init_seconds(self) -> float:
        """What vLLM's "init engine ... took" line covers: compile, graph capture, profile, KV cache."""
        return self.compile + self.cuda_graphs + self.engine_init

    @property
    def ready_seconds(self) -> float:
        """vLLM container start -> /health answers."""
        return self.process_start + self.weights + self.engine_init_seconds

    @property
    def load_seconds(self) -> float:
        """Weights plus compile: the part AWS's published figures measure."""
        return self.weights + self.compile


def predict_cold_start(weights_bytes: int, instance: GpuInstance, *, new_node: bool, compile_cached: bool,
                       image_present: bool, parallel_pull: bool = True, weights_source: Literal["s3", "node-cache"] = "s3",
                       tuned: bool = True, compile_cold_seconds: float | None = None) -> ColdStart:
    """Every phase of one replica's start. `new_node`: the pod waits for a node launch (and
    then the image is not present, whatever `image_present` says)."""
    present = image_present and not new_node
    if weights_source == "node-cache":
        weights = weights_local_seconds(weights_bytes)
    else:
        weights = weights_s3_seconds(weights_bytes, instance, tuned)
    return ColdStart(
        node_launch=NODE_LAUNCH_SECONDS if new_node else 0.0,
        image_pull=image_pull_seconds(present, parallel_pull),
        pod_start=POD_START_SECONDS,
        process_start=PROCESS_START_SECONDS,
        weights=weights,
        compile=compile_seconds(compile_cached, compile_cold_seconds),
        # The engine state (startup plan, JIT caches) lives and travels with the compile cache.
        cuda_graphs=cuda_graph_seconds(compile_cached),
        engine_init=engine_init_seconds(compile_cached),
        first_token=FIRST_TOKEN_SECONDS,
    )


# --- standby: a sleeping engine woken --------------------------------------------------------
# [FMA] llm-d Fast Model Actuation README, https://github.com/llm-d-incubation/llm-d-fast-model-actuation
#       (at commit 553c7b73): waking a level-1 sleeper takes "about 3 seconds for a model with 64
#       GiB of tensor data"; the weights come back from host RAM, so the rate is per byte.
FMA_README = "https://github.com/llm-d-incubation/llm-d-fast-model-actuation#readme"
WAKE_LEVEL1_BYTES_PER_S = 64 * GIB / 3.0
# The standby actuator reads every engine once per period (warmstart/decisions/standby.py,
# ACTUATOR_PERIOD_SECONDS): the signal is at most one period old.
STANDBY_SIGNAL_SECONDS = 1.0
# A woken engine rejoins the router when the actuator labels its pod awake again: SMG's pod watch
# delivers the change and SMG rebuilds its workers one second after a watch event
# (smg model_gateway/src/service_discovery/kubernetes.rs, at 1.13.0).
STANDBY_JOIN_SECONDS = 1.0


@dataclass(frozen=True)
class StandbyStart:
    """A scale-out by waking a standby engine, phase by phase (seconds)."""

    signal: float
    wake: float
    first_token: float
    join: float

    @property
    def total_seconds(self) -> float:
        return self.signal + self.wake + self.first_token + self.join


def wake_seconds(weights_bytes: int, sleep_level: int, instance: GpuInstance) -> float:
    """Level 1: the weights copied back from host RAM [FMA]. Level 2: they were dropped and are
    reloaded from their source, as a pod's load from S3 streams them (`weights_s3_seconds`)."""
    if weights_bytes < 0:
        raise ValueError("weights_bytes must be >= 0")
    if sleep_level == 1:
        return weights_bytes / WAKE_LEVEL1_BYTES_PER_S
    if sleep_level == 2:
        return weights_s3_seconds(weights_bytes, instance)
    raise ValueError("sleep_level must be 1 or 2")


def wake_prediction(weights_bytes: int, sleep_level: int, instance: GpuInstance) -> Prediction:
    if sleep_level == 1:
        return Prediction(wake_seconds(weights_bytes, 1, instance), FMA_README, "level 1: weights from host RAM")
    return Prediction(wake_seconds(weights_bytes, 2, instance), EKS_GUIDE, "level 2: weights reloaded from S3")


def predict_standby_start(weights_bytes: int, instance: GpuInstance, sleep_level: int = 1) -> StandbyStart:
    """From the load rising to a woken standby engine serving through the router."""
    return StandbyStart(signal=STANDBY_SIGNAL_SECONDS, wake=wake_seconds(weights_bytes, sleep_level, instance),
                        first_token=FIRST_TOKEN_SECONDS, join=STANDBY_JOIN_SECONDS)


# --- from zero pods: the first request held while a whole replica starts --------------------
# KEDA's operator polls the routers' front queues at the ScaledObject's pollingInterval
# (warmstart/decisions/autoscaling.py, FROM_ZERO_POLLING_INTERVAL_SECONDS) and scales 0 -> 1
# itself, with no HPA sync in between (`RequestScale`, scaleFromZeroOrIdle:
# https://github.com/kedacore/keda/blob/v2.20.2/pkg/scaling/executor/scale_scaledobjects.go).
FROM_ZERO_SIGNAL_SECONDS = 1.0
# The new pod joins the router when its readiness passes (one period of its /health probe,
# warmstart/decisions/tuning.py) and SMG's pod watch sees it; the front queue then forwards.
FROM_ZERO_JOIN_SECONDS = float(PROBE_PERIOD_SECONDS)


@dataclass(frozen=True)
class FromZeroStart:
    """A scale-out from zero pods, phase by phase (seconds): the signal, a whole cold start, the
    router join."""

    signal: float
    start: ColdStart
    join: float

    @property
    def total_seconds(self) -> float:
        return self.signal + self.start.total_seconds + self.join


def predict_from_zero(weights_bytes: int, instance: GpuInstance, *, compile_cached: bool, warm_spare: bool = False,
                      staged: bool = False) -> FromZeroStart:
    """From the first request held at zero pods to a new replica answering it: on a warm spare
    node (up, image pulled; weights from its NVMe when `staged`), else on a new node (launched,
    image pulled with SOCI parallel pull, weights streamed from S3)."""
    start = predict_cold_start(weights_bytes, instance, new_node=not warm_spare, compile_cached=compile_cached,
                               image_present=warm_spare, parallel_pull=True,
                               weights_source="node-cache" if warm_spare and staged else "s3")
    return FromZeroStart(signal=FROM_ZERO_SIGNAL_SECONDS, start=start, join=FROM_ZERO_JOIN_SECONDS)


# --- why a phase is slow -----------------------------------------------------------------------
# What usually makes a phase take more than twice its prediction, keyed by phase. The report
# prints the first cause whose condition it can see, else all of them.
SLOW_CAUSES: dict[str, tuple[str, ...]] = {
    "weights": (
        "S3 traffic through a NAT gateway instead of the S3 gateway endpoint (shared NAT ceiling; check "
        "the GPU subnets' route tables for the endpoint's prefix list)",
        "the streamer tuning did not reach the pod (RUNAI_STREAMER_CHUNK_BYTESIZE / concurrency missing: "
        "the defaults are ~15x slower on large models)",
        "a node-cache read from the root EBS volume (~1 GB/s) instead of the NVMe RAID",
    ),
    "compile": (
        "compile-cache miss: the key (image digest, GPU, TP, vLLM args) differs from every published "
        "archive, or none was published yet",
        "the compile cache directory is on EBS, not NVMe (nvme-check init container says so)",
    ),
    "image_pull": (
        "image not pre-pulled and no SOCI parallel pull (Karpenter nodes need it enabled in the "
        "EC2NodeClass userData)",
        "image pulled through a NAT gateway or from another region's registry",
    ),
    "node": (
        "no capacity of the instance type in the zone (Karpenter retries other zones / types)",
        "the NVIDIA device plugin slow to advertise nvidia.com/gpu on a new node",
    ),
    "engine_init": ("a large max-model-len or gpu-memory-utilization profile run",),
    "cuda_graphs": ("many capture sizes (max-num-seqs); --enforce-eager skips capture at a throughput cost",),
}
