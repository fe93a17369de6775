"""Standby engines: vLLM engines kept started and asleep, woken on load (pure).

What is decided here, from the model and its `standby:` block alone:

- whether a sleeping engine's weights fit in its pod's memory at sleep level 1 (`check_host_memory`):
  level 1 moves the weights to host RAM (vLLM `docs/features/sleep_mode.md`: "Level 1 sleep will
  offload the model weights and discard the KV cache"), into the pod's memory limit, beside its
  memory-backed /dev/shm;
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
# The actuator reads every engine this often: the 1-2 s signal, against AMP's 30 s scrape.
ACTUATOR_PERIOD_SECONDS = 1.0
# What the actuator pod requests on the non-GPU nodes (a stdlib loop of a few HTTP reads a second);
# the non-GPU nodes are sized with it (plan/cluster.py, model_non_gpu_pods).
ACTUATOR_REQUESTS = {"cpu": "50m", "memory": "64Mi"}


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


def sleeping_host_bytes(weights_bytes: int, sleep_level: int) -> int:
    """Host memory a sleeping engine holds: the process, plus the weights at level 1 (level 2
    discards them)."""
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
            "(its share of the instance's RAM)")


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

    @property
    def name(self) -> str:
        return f"{self.model}-standby"

    def script_config_map(self, shared: str, own: bool) -> str:
        """The ConfigMap the actuator mounts its script from: the namespace's (`shared`) or, `own`,
        the model's own copy (`naming.script_config_map`)."""
        return naming.script_config_map(shared, self.model, own)


def plan_actuator(*, model: str, namespace: str, image: str, standby: StandbyPlan, min_awake: int,
                  target_waiting: float, non_gpu: placement.NonGpuPlacement, api_server_cidrs: tuple[str, ...] | list[str],
                  front_queue: bool = False) -> ActuatorPlan:
    if min_awake < 0:
        raise ValueError("min_awake must be >= 0")
    if not api_server_cidrs:
        raise ValueError("the actuator needs the Kubernetes API's CIDRs to list the model's pods")
    return ActuatorPlan(model=model, namespace=namespace, image=image, standby=standby.count, min_awake=min_awake,
                        sleep_level=standby.sleep_level, target_waiting=target_waiting,
                        awake_idle_seconds=standby.awake_idle_seconds,
                        non_gpu=non_gpu, api_server_cidrs=tuple(api_server_cidrs),
                        front_queue=front_queue)
