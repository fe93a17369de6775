"""Standby engines: vLLM engines kept started and asleep, woken on load (pure).

What is decided here, from the model and its `standby:` block alone:

- whether a sleeping engine's weights fit in its pod's memory at sleep level 1 (`check_host_memory`):
  level 1 moves the weights to host RAM (vLLM `docs/features/sleep_mode.md`: "Level 1 sleep will
  offload the model weights and discard the KV cache"), into the pod's memory limit, beside its
  memory-backed /dev/shm; and the allocator setting that makes that copy the weights' own size
  (`PINNED_HOST_ALLOC_CONF`, below);
- the pod count KEDA works with (awake plus standby) and the waiting-requests query's constant
  that keeps `count` sleepers beside the awake pods the queue asks for (`keda_standby_offset`);
- what the actuator (warmstart/podside/standby.py) is told: its period, threshold and idle time.

vLLM 0.33's API (https://github.com/vllm-project/vllm/tree/v0.33.0): `--enable-sleep-mode`, and the
routes `POST /sleep?level=N`, `POST /wake_up[?tags=...]`, `GET /is_sleeping` exist only with
`VLLM_SERVER_DEV_MODE=1` (`vllm/entrypoints/launchers/api_server/routers.py` registers
`register_vllm_dev_api_routers` only then; `vllm/entrypoints/serve/dev/sleep/api_router.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import naming, placement
from .instances import GIB

# The flag and the variable that enable sleep mode and its HTTP routes. The variable also
# exposes /collective_rpc, /reset_prefix_cache, /server_info and the RL routes
# (`vllm/entrypoints/serve/__init__.py`, `register_vllm_dev_api_routers`), which is why only the
# actuator may reach an engine's serving port besides the router (manifests/standby.py).
SLEEP_MODE_FLAG = "--enable-sleep-mode"
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
# Host memory a vLLM server process takes besides the sleeping weights (Python, torch, the
# tokenizer, pinned staging buffers). No public figure; a planning ASSUMPTION that keeps the rule
# from passing a pod that holds the weights and nothing else.
PROCESS_HOST_BYTES = 8 * GIB
# How torch pins the sleeping weights. vLLM 0.33.0 copies each offloaded allocation to
# `torch.empty(size, device="cpu", pin_memory=True)` (`vllm/device_allocator/cumem.py`, `sleep`),
# and torch's CachingHostAllocator rounds a pinned request up to a power of two while it is at most
# both `pinned_max_round_threshold` and `pinned_max_cached_size`, which are unbounded by default,
# and keeps a freed block in its cache rather than returning it to the OS
# (`aten/src/ATen/core/CachingHostAllocator.h`, `allocate` and `maybe_cache_block`;
# `c10/core/AllocatorConfig.h`). Left so, a sleeping Qwen2.5-7B pins 1.89x its weights, and the
# copy stays pinned after the wake. `pinned_max_cached_size_mb:N` (its spelling in
# `AcceleratorAllocatorConfig::parseArgs`, read from PYTORCH_ALLOC_CONF) bounds both at once:
# a request above N MiB is neither rounded nor cached ("allocations above
# pinned_max_cached_size_mb are never rounded up", torch's own warning), so the copy is the
# allocation's size and is freed on wake. The weights' allocations are segments of torch's CUDA
# caching allocator (2 MiB, 20 MiB, or a large tensor rounded to 2 MiB, `CUDACachingAllocator.cpp`):
# at 2 MiB the small segments are already powers of two and every larger one is copied exactly.
# Not `pinned_max_round_threshold_mb` alone: below the cache bound an unrounded block is cached in
# its power-of-two bucket and `get_free_block` hands a bucket's block out without comparing sizes.
# vLLM's own pinned buffers are allocated once at start (its persistent input buffers), so not
# caching those above 2 MiB costs nothing per step. vLLM 0.33.0 has no
# VLLM_SLEEP_MODE_RELEASE_HOST_MEMORY (vllm PR #55206 is not in it; `vllm/envs.py` at v0.33.0).
PINNED_HOST_ALLOC_ENV = "PYTORCH_ALLOC_CONF"
PINNED_MAX_CACHED_MIB = 2
PINNED_HOST_ALLOC_CONF = f"pinned_max_cached_size_mb:{PINNED_MAX_CACHED_MIB}"
# What torch's default would pin instead: every segment rounded up to a power of two, at most
# (never quite) twice its size. Named in the refusal, for a user who overrides the setting.
DEFAULT_PINNED_ROUNDING_FACTOR = 2.0
# The actuator reads every engine this often: the 1-2 s signal, against AMP's 30 s scrape.
ACTUATOR_PERIOD_SECONDS = 1.0
# What the actuator pod requests on the non-GPU nodes (a stdlib loop of a few HTTP reads a second);
# the non-GPU nodes are sized with it (plan/cluster.py, model_non_gpu_pods).
ACTUATOR_REQUESTS = {"cpu": "50m", "memory": "64Mi"}
# The actuator serves its pods figure (awake engines the load needs plus the sleepers, counting
# the engines it has just woken at once) on this port, path FIGURE_PATH, as JSON whose `pods`
# KEDA's metrics-api scaler reads (decisions/autoscaling.py `StandbyTrigger`). Only KEDA's
# operator may reach it (manifests/standby.py).
FIGURE_PORT = 9400
FIGURE_PATH = "/warmstart/pods"
FIGURE_VALUE_LOCATION = "pods"
# How long the figure counts the engines awake right after a wake: past the HPA's next sync
# (15 s, kube-controller-manager's default) and the next scrape of the engines' own gauges (AMP's
# 30 s), so the HPA records the woken engine in its scale-down window even when the load per
# engine stays under `targetRequestsPerReplica` (the window then keeps the pods), and twice the
# sync so one failed read of the figure does not miss it.
WAKE_HOLD_SECONDS = 30 + 2 * 15


@dataclass(frozen=True)
class StandbyPlan:
    """A model's standby engines, decided."""

    count: int
    """Engines kept asleep."""
    sleep_level: int
    """vLLM sleep level, 1 or 2."""
    awake_idle_seconds: int
    """Idle time after which an awake engine may go back to sleep."""
    sleeping_host_bytes: int
    """Host memory one sleeping engine holds (the weights at level 1, the process alone at 2)."""

    def summary(self) -> dict:
        return {"count": self.count, "sleepLevel": self.sleep_level, "awakeIdleSeconds": self.awake_idle_seconds,
                "sleepingHostBytes": self.sleeping_host_bytes}


def pinned_bytes(segment_bytes: int, max_cached_bytes: int | None = PINNED_MAX_CACHED_MIB * 2**20) -> int:
    """What torch's CachingHostAllocator pins for one offloaded segment: its size rounded up to a
    power of two while it is at most the cache bound (`max_cached_bytes`, None: torch's default,
    unbounded), else its size (CachingHostAllocator.h, `allocate`, `c10::llvm::PowerOf2Ceil`)."""
    if segment_bytes <= 0:
        return 0
    if max_cached_bytes is not None and segment_bytes > max_cached_bytes:
        return segment_bytes
    return 1 << (segment_bytes - 1).bit_length()


def sleeping_host_bytes(weights_bytes: int, sleep_level: int) -> int:
    """Host memory a sleeping engine holds: the process, plus the weights at level 1 (level 2
    discards them), copied at their own size under `PINNED_HOST_ALLOC_CONF`, which every standby
    engine runs with (manifests/serving.py)."""
    if sleep_level not in (1, 2):
        raise ValueError("sleep_level must be 1 or 2")
    if weights_bytes < 0:
        raise ValueError("weights_bytes must be >= 0")
    return PROCESS_HOST_BYTES + (weights_bytes if sleep_level == 1 else 0)


def check_host_memory(*, weights_bytes: int, sleep_level: int, pod_memory_bytes: int, shm_bytes: int) -> str | None:
    """None when a sleeping engine fits its pod's memory limit (which also holds the
    memory-backed /dev/shm); else the rule with the numbers."""
    need = sleeping_host_bytes(weights_bytes, sleep_level) + shm_bytes
    if need <= pod_memory_bytes:
        return None
    return (f"at sleepLevel {sleep_level} a sleeping engine holds {need / GIB:.1f} GiB of host memory "
            f"({weights_bytes / GIB:.1f} GiB of weights + {PROCESS_HOST_BYTES // GIB} GiB for the process + "
            f"{shm_bytes / GIB:.0f} GiB of /dev/shm) but its pod's memory limit is {pod_memory_bytes / GIB:.1f} GiB "
            "(its share of the instance's RAM)"
            + (f"; the weights are counted at their own size because every standby engine runs with "
               f"{PINNED_HOST_ALLOC_ENV}={PINNED_HOST_ALLOC_CONF} (torch's default would pin up to "
               f"{DEFAULT_PINNED_ROUNDING_FACTOR:g}x, {weights_bytes * DEFAULT_PINNED_ROUNDING_FACTOR / GIB:.0f} GiB)"
               if sleep_level == 1 else ""))


def plan_standby(*, count: int, sleep_level: int, awake_idle_seconds: int, weights_bytes: int) -> StandbyPlan:
    if count < 1:
        raise ValueError("count must be >= 1")
    return StandbyPlan(count=count, sleep_level=sleep_level, awake_idle_seconds=awake_idle_seconds,
                       sleeping_host_bytes=sleeping_host_bytes(weights_bytes, sleep_level))


def keda_standby_offset(count: int, target_waiting_per_replica: float) -> float:
    """What the waiting-requests query adds so that KEDA's answer (for an `AverageValue` target,
    ceil(value / target), https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details)
    is the awake pods the queue needs plus `count` sleepers."""
    if count < 0:
        raise ValueError("count must be >= 0")
    return count * target_waiting_per_replica


@dataclass(frozen=True)
class ActuatorPlan:
    """The standby actuator of one model (warmstart/podside/standby.py, one pod on non-GPU nodes)."""

    model: str
    namespace: str
    image: str
    """An image with python3 that the non-GPU nodes already pull: the router's (SMG)."""
    standby: int
    min_awake: int
    sleep_level: int
    target_waiting: float
    awake_idle_seconds: int
    non_gpu: placement.NonGpuPlacement
    """The non-GPU nodes the actuator runs on (the platform's, as its routers)."""
    api_server_cidrs: tuple[str, ...]
    """Where the pod reaches the Kubernetes API (the `kubernetes` Service's ClusterIP /32)."""
    period_seconds: float = ACTUATOR_PERIOD_SECONDS
    front_queue: bool = False
    """The model's routers hold requests in a front queue (minReplicas 0): held requests count as
    waiting, so one wakes a sleeper."""
    deployment: str = ""
    """The model's Deployment, whose replicas a wake raises (its scale subresource); default the model's name."""
    max_pods: int = 0
    """The ScaledObject's maxReplicaCount (maxReplicas + standby): no raise asks for more."""
    target_requests: float = 0.0
    """`targetRequestsPerReplica`: the figure's demand term, as the engine-demand query's."""
    keda_namespace: str = "keda"
    """Where KEDA's operator runs: its pods alone may read the figure."""

    @property
    def name(self) -> str:
        return actuator_name(self.model)

    @property
    def deployment_name(self) -> str:
        return self.deployment or self.model

    def script_config_map(self, shared: str, own: bool) -> str:
        """The ConfigMap the actuator mounts its script from: the namespace's (`shared`) or, `own`,
        the model's own copy (`naming.script_config_map`)."""
        return naming.script_config_map(shared, self.model, own)


def plan_actuator(*, model: str, namespace: str, image: str, standby: StandbyPlan, min_awake: int,
                  target_waiting: float, non_gpu: placement.NonGpuPlacement, api_server_cidrs: tuple[str, ...] | list[str],
                  front_queue: bool = False, deployment: str = "", max_pods: int = 0, target_requests: float = 0.0,
                  keda_namespace: str = "keda") -> ActuatorPlan:
    if min_awake < 0:
        raise ValueError("min_awake must be >= 0")
    if not api_server_cidrs:
        raise ValueError("the actuator needs the Kubernetes API's CIDRs to list the model's pods")
    return ActuatorPlan(model=model, namespace=namespace, image=image, standby=standby.count, min_awake=min_awake,
                        sleep_level=standby.sleep_level, target_waiting=target_waiting,
                        awake_idle_seconds=standby.awake_idle_seconds,
                        non_gpu=non_gpu, api_server_cidrs=tuple(api_server_cidrs),
                        front_queue=front_queue, deployment=deployment, max_pods=max_pods,
                        target_requests=target_requests, keda_namespace=keda_namespace)


def actuator_name(model: str) -> str:
    """The actuator's name (its Deployment, ServiceAccount and Service): `ActuatorPlan.name`."""
    return f"{model}-standby"


def figure_url(model: str, namespace: str) -> str:
    """Where KEDA's metrics-api scaler reads the actuator's figure: its Service in the model's namespace."""
    return f"http://{actuator_name(model)}.{namespace}.svc:{FIGURE_PORT}{FIGURE_PATH}"
