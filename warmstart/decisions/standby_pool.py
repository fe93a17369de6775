"""Pooled standby: one spare engine host keeps every pooled model's engine asleep on one GPU set (pure).

Per-model standby (decisions/standby.py) keeps `count` sleepers per model, each holding its own
GPUs around the clock. A pool instead keeps `spares` engine hosts: pods that request one GPU set
(`gpus` GPUs of one instance type) and run, in one container, one vLLM engine per pooled model,
all asleep. A rise on any pooled model wakes that model's engine on a spare host. The pool's GPU
cost is `spares x gpus`, whatever the number of models; per-model standby of the same models costs
the sum of their tensor-parallel sizes.

The config this module plans (the YAML shape; `PoolSpec` and `PoolMember` carry it field for field,
with the keys their errors name):

    warmstart:standbyPools:
      - name: shared-h100          # a DNS label; the engine hosts' Deployment is `<name>-engine-host`
        gpuPool: h100              # the gpuPools entry the hosts run on
        instanceType: p5.48xlarge  # default: the GPU pool's only instance type
        gpus: 1                    # the GPU set of one host: every member's tensorParallelSize
        spares: 1                  # hosts kept with every member asleep
        sleepLevel: auto           # 1, 2, or auto: 1 where host RAM holds every member's weights
        sleepingResidueGiB: null   # GPU memory one sleeper keeps per GPU; default below, or measured
    warmstart:models:
      - name: qwen-7b
        ...
        autoscaling: {minReplicas: 0, maxReplicas: 3}
        standby: {pool: shared-h100}   # opts in; `count`/`sleepLevel` are the pool's then

Rules (each refusal names the key, the rule with its figures and the fix):

- A host is one trust domain: its engines share a ServiceAccount, a filesystem and a network
  namespace, and each reaches the others' dev routes (/collective_rpc ...) on localhost, which no
  NetworkPolicy separates. So a pool is opted into per model, a model that runs remote code
  (`--trust-remote-code` in its extraArgs) is refused, and every member is in the pool's namespace
  (SMG discovers workers in its own namespace; a host serves one namespace).
- Every member runs on the pool's GPU set: its instance type is the pool's and its
  tensorParallelSize is `gpus` (an engine's TP is the GPUs it uses: a larger one cannot run on
  the host's set, a smaller one would be sized for memory it does not have beside the sleepers of
  the GPUs it leaves out).
- Every member is autoscaled and routed: its own autoscaler owns its awake pods, the pool only the
  spares, and only the router keeps a sleeper out of traffic (as per-model standby).
- At most one engine is awake on a host at a time (the simplest budget that holds: every other
  engine sleeps, so the awake one's KV cache is sized against N-1 sleepers' residue).
- GPU memory (`gpu_budget`): what a sleeping engine keeps on each GPU (below), and each engine's
  `--gpu-memory-utilization` derived so the awake engine fits beside every other sleeper.
- Host RAM (`host_memory`): level 1 keeps every member's weights pinned in the host's memory at
  once; level 2 keeps none and reloads on wake from the node's NVMe-staged copy where the node
  cache stages it (else from S3). `sleepLevel: auto` picks 1 where it fits, else 2, else refuses.

What a sleeping engine keeps on the GPU, read from vLLM's source (vllm-project/vllm,
`vllm/device_allocator/cumem.py` and `vllm/v1/worker/gpu_worker.py`, as stored near v0.33.0; the
mechanism is the same in every version read, from 0.8 to the pluggable-backend refactor in
`vllm/device_allocator/sleep_mode_backend.py`): `CuMemAllocator.sleep` unmaps and releases only
the allocations made inside its memory pool, the tags "weights" (`Worker.load_model`) and
"kv_cache" (`initialize_from_config` / the KV-cache init), backing up the tags it is told to
(level 1: "weights" to pinned host memory; level 2: nothing, and the model's buffers are copied to
the CPU by `Worker.sleep`). Everything allocated outside that pool stays on the GPU while asleep:
each worker process's CUDA context, the NCCL communicators and vLLM's custom all-reduce buffers at
TP > 1 (made by `init_worker_distributed_environment`, before any pool; the sleep-mode backend's
own docstring: "NCCL buffers left untouched (they are allocated outside the allocator pool)"), the
CUDA graphs' memory pools (captured in `compile_or_warm_up_model`, outside the pool), and the
blocks torch's own caching allocator holds for the model runner's persistent buffers and sampler
(`torch.cuda.empty_cache` after the sleep returns only unused cached blocks). None of these is one
number in the source: they depend on the model, the capture sizes and the GPU, and llm-d FMA issue
#746 saw a level-1 sleep free only about half a GPU. So the residue is a stated, conservative
planning default per GPU (`DEFAULT_RESIDUE_BYTES`), which a measured figure overrides
(`sleepingResidueGiB`, from `warmstart wake-bench` with k sleepers on the user's own GPU node).

How the engine's memory is sized (the same stored `gpu_worker.py`): at start an engine refuses to
run when the GPU's free memory is below `total x gpu_memory_utilization` (`init_device`), and sizes
its KV cache as `total x gpu_memory_utilization` minus what its profile run measured (weights,
activation peak, non-torch memory: `determine_available_memory`). Its CUDA context exists before
that snapshot, so it sits outside the budget. Engines start one after another (the supervisor,
warmstart/podside/engine_host), each once the previous one sleeps; the awake engine and N-1
sleepers then hold at most `u x total + N x residue` (its own context counted as one residue), and
`derived_utilization` keeps that under the GPU's memory less `HEADROOM_FRACTION`. The same bound
covers every start: engine i starts beside i <= N-1 sleepers. Older engines that counted other
processes' memory as their own non-torch memory only size a smaller KV cache under this budget,
never a larger one.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from . import phases
from . import standby as standby_mod
from . import tuning
from ..errors import ConfigError, ConfigErrors
from .instances import GIB, GpuInstance

SleepLevelChoice = Literal[1, 2, "auto"]

# --- GPU memory a sleeper keeps -------------------------------------------------------------------
# Per GPU, per sleeping engine. A planning ASSUMPTION, deliberately above the sum of the parts the
# source names at common sizes: a CUDA context per worker process (hundreds of MiB on Hopper), the
# CUDA graphs' pools (vLLM logs 0.5-2 GiB for 7-70B models at the default capture sizes), torch's
# blocks for persistent buffers and the sampler (max_num_seqs x vocabulary x 4 bytes of logits,
# ~0.15 GiB at 256 x 152k); at TP > 1 also NCCL's and the custom all-reduce's buffers. A measured
# `sleepingResidueGiB` replaces it.
DEFAULT_RESIDUE_BYTES = 4 * GIB
DEFAULT_RESIDUE_BYTES_TP = 5 * GIB
# Kept free on every GPU beyond the awake engine and the sleepers: fragmentation, and allocations a
# wake makes before the allocator maps its pool back (an ASSUMPTION, as vLLM's own 0.92 default
# keeps 8 % free for a lone engine).
HEADROOM_FRACTION = 0.02
# vLLM's flag takes a fraction; the derived value is rounded down to this step so the flag is short
# and never rounds up past the budget.
UTILIZATION_STEP = 0.01
# Engines on one host: each has its own serving and distributed ports and its own processes, and a
# replacement host starts them one after another; past this the window with no spare is hours.
MAX_ENGINES_PER_HOST = 8

# --- ports of the engines on one host ---------------------------------------------------------------
# Engine i serves on its member's port (MEMBER_PORT_BASE, below) and takes its distributed ports from
# VLLM_PORT = DIST_PORT_BASE + i x DIST_PORT_STRIDE: "if VLLM_PORT is set, and some code asks for multiple
# ports, the VLLM_PORT will be used as the first port, and the rest will be generated by
# incrementing the VLLM_PORT value" (vllm/envs.py). Left unset, each engine would pick free ports
# itself, and two engines of one network namespace could pick the same one between its probe and
# its bind. Both ranges stay below the kernel's default ephemeral range (32768-60999,
# net.ipv4.ip_local_port_range), from which outgoing connections take ports. The distributed ports
# live on the host alone, so they may follow the start order.
DIST_PORT_BASE = 20000
DIST_PORT_STRIDE = 100
# The supervisor's own port: its folded /health for the kubelet and its /engines status for the actuator.
SUPERVISOR_PORT = 8090
# A member's port: its vLLM serves on it in its own pods and on every host, so its routers discover
# both with one `--service-discovery-port` (SMG takes one port per router). It must never change when
# another model joins or leaves the pool (that would roll the model's GPU pods), so it is derived from
# the model's own name alone (`standby.port` overrides it; two members on one port are refused, with
# that fix). The range is the config's (MEMBER_PORT_MIN..MAX): above vLLM's 8000, the metrics proxy's
# 8001, the router's 8010 and the supervisor's 8090, below DIST_PORT_BASE.
MEMBER_PORT_BASE = 8100
MEMBER_PORT_SPAN = 900
# The host pod's labels: the pool actuator selects the hosts by the pool label and moves `serves` and
# `engine` (a member's router selects `serves: <model>, engine: awake`).
POOL_LABEL = "warmstart.io/standby-pool"
SERVES_LABEL = "warmstart.io/serves"

# --- a replacement host -------------------------------------------------------------------------------
# A level-1 sleep copies the weights to host RAM: the reverse of the wake, at the same rate.
SLEEP_LEVEL1_BYTES_PER_S = phases.WAKE_LEVEL1_BYTES_PER_S

TRUST_REMOTE_CODE_FLAG = "--trust-remote-code"


@dataclass(frozen=True)
class PoolSpec:
    """One `standbyPools[]` entry, as configured."""

    name: str
    key: str
    """Its config key, e.g. `warmstart:standbyPools[0]`."""
    namespace: str
    instance: GpuInstance
    gpus: int
    spares: int = 1
    sleep_level: SleepLevelChoice = "auto"
    residue_bytes: int | None = None
    """Measured (or configured) GPU memory one sleeper keeps per GPU; None: the default."""
    node_hourly_price_usd: float | None = None
    """The GPU pool's price of one node per hour, for the spares' cost; None: unknown."""
    capacity_types: tuple[str, ...] = ("onDemand",)
    """The GPU pool's purchase options (reserved, spot, onDemand): the hosts run on the others than spot."""
    gpu_pool: str = ""
    """The GPU pool's name (`gpuPool`), for the refusals."""
    max_hosts: int | None = None
    """The most hosts at once; None: spares plus one per member."""
    compile_cached: bool = True
    """The hosts' engines restore their torch.compile cache (a stack's hosts mount none yet: False)."""


@dataclass(frozen=True)
class PoolMember:
    """One model that opted into the pool (`standby: {pool: <name>}`)."""

    name: str
    key: str
    """The model's config key, e.g. `warmstart:models[2]`."""
    namespace: str
    instance_type: str
    tensor_parallel_size: int
    weights_bytes: int
    gpu_memory_utilization: float = tuning.DEFAULT_GPU_MEMORY_UTILIZATION
    extra_args: tuple[str, ...] = ()
    autoscaled: bool = True
    routed: bool = True
    staged: bool = False
    """Its weights are staged on the pool's nodes' NVMe (the node cache), so an engine loads and a
    level-2 wake reloads them from there."""
    per_model_standby: bool = False
    """It also has per-model standby (`standby.count`); a model has one kind of standby."""
    image: str = ""
    """Its vLLM image: the hosts run one image, so every member's must be it."""
    given_port: int | None = None
    """Its `standby.port`; None: derived from its name (`member_port`)."""

    @property
    def port(self) -> int:
        return member_port(self.name, self.given_port)

    @property
    def port_key(self) -> str:
        return f"{self.key}.standby.port" if self.given_port is not None else f"{self.key}.standby.pool"


@dataclass(frozen=True)
class GpuBudget:
    """One GPU of a host: the awake engine beside the sleepers."""

    gpu_bytes: int
    residue_bytes: int
    """What one sleeping engine keeps on this GPU."""
    residue_measured: bool
    engines: int
    headroom_bytes: int
    utilization: float
    """The derived `--gpu-memory-utilization` (before each member's own cap)."""

    @property
    def awake_bytes(self) -> int:
        """What the awake engine may use under its utilization (its KV cache included)."""
        return int(self.gpu_bytes * self.utilization)

    @property
    def sleepers_bytes(self) -> int:
        """The residue of every engine, the awake one's own CUDA context counted as one."""
        return self.engines * self.residue_bytes

    def start_fits(self, started_before: int) -> bool:
        """Whether vLLM's start check passes for the engine started after `started_before` sleepers:
        free memory (the GPU less their residue and this engine's own context) >= total x u."""
        free = self.gpu_bytes - (started_before + 1) * self.residue_bytes
        return free >= self.awake_bytes


@dataclass(frozen=True)
class HostMemory:
    """The host pod's memory with every engine asleep."""

    sleep_level: int
    pod_memory_bytes: int
    shm_bytes: int
    per_engine_bytes: tuple[tuple[str, int], ...]
    """(model, host bytes while asleep): its process, plus its weights at level 1."""

    @property
    def need_bytes(self) -> int:
        return sum(b for _, b in self.per_engine_bytes) + self.shm_bytes

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.pod_memory_bytes


@dataclass(frozen=True)
class PooledPath:
    """A pooled model's scale-out by waking its engine on a spare host, phase by phase (seconds)."""

    model: str
    signal: float
    wake: float
    wake_source: Literal["host RAM", "node NVMe", "S3"]
    first_token: float
    join: float

    @property
    def total_seconds(self) -> float:
        return self.signal + self.wake + self.first_token + self.join


@dataclass(frozen=True)
class EngineSlot:
    """One engine on a host: what the supervisor starts, in this order."""

    model: str
    order: int
    port: int
    dist_port: int
    gpu_memory_utilization: float
    weights_bytes: int
    staged: bool = False
    """Its model's weights are staged on the hosts' nodes (the node cache): the engine's command
    picks the node's copy at its start where it is complete, else S3 (manifests/standby_pool.py)."""


@dataclass(frozen=True)
class ReplacementWindow:
    """A replacement host from nothing to every engine asleep: no spare of the pool until its end."""

    node_launch: float
    image_pull: float
    pod_start: float
    engines: tuple[tuple[str, float], ...]
    """(model, seconds): process start, weights, compile, graphs, engine init, sleep; one after another."""

    @property
    def total_seconds(self) -> float:
        return self.node_launch + self.image_pull + self.pod_start + sum(s for _, s in self.engines)


@dataclass(frozen=True)
class PoolCost:
    """GPUs held around the clock for standby: the pool's spares against per-model standby (one
    sleeper per model) of the same models."""

    pool_gpus: int
    per_model_gpus: int
    gpu_hourly_price_usd: float | None
    max_gpus: int = 0
    """GPUs of `maxHosts` hosts: what the pool holds while every host but the spares serves a woken
    engine (each a replica of its model until its own pods take over)."""

    @property
    def max_hourly_usd(self) -> float | None:
        return None if self.gpu_hourly_price_usd is None else self.max_gpus * self.gpu_hourly_price_usd

    @property
    def pool_hourly_usd(self) -> float | None:
        return None if self.gpu_hourly_price_usd is None else self.pool_gpus * self.gpu_hourly_price_usd

    @property
    def per_model_hourly_usd(self) -> float | None:
        return None if self.gpu_hourly_price_usd is None else self.per_model_gpus * self.gpu_hourly_price_usd


@dataclass(frozen=True)
class PoolPlan:
    """One standby pool, decided."""

    name: str
    namespace: str
    instance_type: str
    gpus: int
    spares: int
    sleep_level: int
    sleep_level_reason: str
    gpu: GpuBudget
    host: HostMemory
    engines: tuple[EngineSlot, ...]
    paths: tuple[PooledPath, ...]
    replacement: ReplacementWindow
    cost: PoolCost
    max_hosts: int = 0
    """The most hosts at once (the host Deployment's replicas never exceed it)."""
    host_capacity_types: tuple[str, ...] = ("onDemand",)
    """Where the hosts' nodes come from: the GPU pool's purchase options without spot."""
    image: str = ""
    """The members' one vLLM image, which the hosts run."""
    gpu_pool: str = ""

    @property
    def deployment_name(self) -> str:
        return host_deployment_name(self.name)

    @property
    def actuator_name(self) -> str:
        return pool_actuator_name(self.name)

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(e.model for e in self.engines)

    def engine(self, model: str) -> EngineSlot:
        return next(e for e in self.engines if e.model == model)

    def path(self, model: str) -> PooledPath:
        return next(p for p in self.paths if p.model == model)

    def summary(self) -> dict:
        """What the render prints and `warmstart render --json` carries."""
        return {
            "pool": self.name, "instanceType": self.instance_type, "gpus": self.gpus, "spares": self.spares,
            "sleepLevel": self.sleep_level, "sleepLevelReason": self.sleep_level_reason,
            "gpuMemoryUtilization": self.gpu.utilization,
            "sleepingResidueGiB": round(self.gpu.residue_bytes / GIB, 2), "residueMeasured": self.gpu.residue_measured,
            "hostMemoryGiB": round(self.host.need_bytes / GIB, 1),
            "hostMemoryLimitGiB": round(self.host.pod_memory_bytes / GIB, 1),
            "paths": {p.model: {"signal": p.signal, "wake": round(p.wake, 2), "wakeFrom": p.wake_source,
                                "firstToken": p.first_token, "join": p.join, "total": round(p.total_seconds, 1)}
                      for p in self.paths},
            "noSpareWindowSeconds": round(self.replacement.total_seconds),
            "standbyGpus": {"pool": self.cost.pool_gpus, "perModel": self.cost.per_model_gpus},
            "standbyHourlyUsd": {"pool": self.cost.pool_hourly_usd, "perModel": self.cost.per_model_hourly_usd},
        }


# --- the pieces -----------------------------------------------------------------------------------


def host_deployment_name(pool: str) -> str:
    """The engine hosts' Deployment (and their ServiceAccount and spec ConfigMap)."""
    return f"{pool}-engine-host"


def pool_actuator_name(pool: str) -> str:
    """The pool actuator's Deployment, ServiceAccount and Service."""
    return f"{pool}-standby-pool"


def figure_url(pool: str, namespace: str, model: str) -> str:
    """Where KEDA's metrics-api scaler of a pooled member reads its pods figure: the pool actuator's
    Service, one path per member (the per-model actuator's FIGURE_PATH plus the model)."""
    return (f"http://{pool_actuator_name(pool)}.{namespace}.svc:{standby_mod.FIGURE_PORT}"
            f"{standby_mod.FIGURE_PATH}/{model}")


def member_port(model: str, given: int | None = None) -> int:
    """A pooled member's serving port: `given` (its `standby.port`), else a function of its name
    alone (CRC-32, stable across Python runs unlike `hash`), so it never moves when the pool's other
    members change."""
    return given if given is not None else MEMBER_PORT_BASE + zlib.crc32(model.encode()) % MEMBER_PORT_SPAN


@dataclass(frozen=True)
class PooledStandby:
    """A model's standby when it is a pool's member (`standby: {pool: <name>}`): what its own
    objects need of the pool (its port, its router's selector, its ScaledObject's figure)."""

    pool: str
    port: int
    awake_idle_seconds: int
    port_given: bool = False

    def summary(self) -> dict:
        return {"pool": self.pool, "port": self.port, "awakeIdleSeconds": self.awake_idle_seconds}


def default_residue_bytes(gpus: int) -> int:
    """The planning default a sleeper keeps per GPU: more at TP > 1 (NCCL, custom all-reduce)."""
    if gpus < 1:
        raise ValueError("gpus must be >= 1")
    return DEFAULT_RESIDUE_BYTES if gpus == 1 else DEFAULT_RESIDUE_BYTES_TP


def derived_utilization(gpu_bytes: int, engines: int, residue_bytes: int,
                        headroom_fraction: float = HEADROOM_FRACTION) -> float:
    """The largest `--gpu-memory-utilization` (a multiple of UTILIZATION_STEP) under which the awake
    engine (its context counted as one residue) and `engines - 1` sleepers fit on a GPU of
    `gpu_bytes` with `headroom_fraction` left free: u x total + engines x residue <= (1 - h) x total.
    0 or less means nothing fits."""
    if gpu_bytes <= 0 or engines < 1 or residue_bytes < 0:
        raise ValueError("gpu_bytes > 0, engines >= 1, residue_bytes >= 0")
    room = gpu_bytes * (1 - headroom_fraction) - engines * residue_bytes
    steps = math.floor(room / gpu_bytes / UTILIZATION_STEP + 1e-9)
    return round(steps * UTILIZATION_STEP, 4)


def gpu_budget(instance: GpuInstance, gpus: int, engines: int, residue_bytes: int | None = None) -> GpuBudget:
    residue = default_residue_bytes(gpus) if residue_bytes is None else residue_bytes
    total = instance.gpu_memory_bytes
    return GpuBudget(gpu_bytes=total, residue_bytes=residue, residue_measured=residue_bytes is not None,
                     engines=engines, headroom_bytes=int(total * HEADROOM_FRACTION),
                     utilization=derived_utilization(total, engines, residue))


def host_memory(instance: GpuInstance, gpus: int, members: list[PoolMember] | tuple[PoolMember, ...],
                sleep_level: int) -> HostMemory:
    """Every engine asleep at `sleep_level`: each holds its process, plus at level 1 its weights
    pinned in host memory (counted at their own size: the engines run with the pinned-allocator
    setting of per-model standby, `standby.sleeping_host_bytes`), against the host pod's memory
    limit, which also holds its memory-backed /dev/shm."""
    pod = tuning.pod_size(instance, gpus)
    per = tuple((m.name, standby_mod.sleeping_host_bytes(m.weights_bytes, sleep_level)) for m in members)
    return HostMemory(sleep_level=sleep_level, pod_memory_bytes=pod.memory_bytes, shm_bytes=pod.shm_bytes,
                      per_engine_bytes=per)


def wake_path(member: PoolMember, instance: GpuInstance, sleep_level: int) -> PooledPath:
    """The actuator's signal, the wake (level 1: the weights back from host RAM at FMA's rate; level
    2: reloaded from the node's NVMe where staged, else streamed from S3), the warm-up token and the
    router's join: the same phases as per-model standby (phases.predict_standby_start)."""
    if sleep_level == 1:
        wake, source = phases.wake_seconds(member.weights_bytes, 1, instance), "host RAM"
    elif member.staged:
        wake, source = phases.weights_local_seconds(member.weights_bytes), "node NVMe"
    else:
        wake, source = phases.weights_s3_seconds(member.weights_bytes, instance), "S3"
    return PooledPath(model=member.name, signal=phases.STANDBY_SIGNAL_SECONDS, wake=wake, wake_source=source,
                      first_token=phases.FIRST_TOKEN_SECONDS, join=phases.STANDBY_JOIN_SECONDS)


def replacement_window(members: list[PoolMember] | tuple[PoolMember, ...], instance: GpuInstance,
                       sleep_level: int, *, new_node: bool = True, compile_cached: bool = True) -> ReplacementWindow:
    """From a spare being taken to its replacement holding every member asleep: a node (new by
    default: a taken host's node stays busy), the image, the pod, then each engine in turn (vLLM
    sizes its KV cache from the free memory it sees, so the next starts only once this one sleeps)."""
    engines = []
    for m in members:
        # A new node holds no staged copy yet (its staging pod starts beside the host): every engine
        # there streams from S3, as a model's own pod on a new node does (render.scale_out_line).
        source = "node-cache" if m.staged and not new_node else "s3"
        c = phases.predict_cold_start(m.weights_bytes, instance, new_node=False, compile_cached=compile_cached,
                                      image_present=True, weights_source=source)
        sleep = m.weights_bytes / SLEEP_LEVEL1_BYTES_PER_S if sleep_level == 1 else 0.0
        engines.append((m.name, c.ready_seconds + sleep))
    # A new node pulls the image (SOCI parallel pull where the mode has it: the cold-start figure);
    # a warm spare node already has it (the node cache pre-pulls every staged model's image).
    return ReplacementWindow(node_launch=phases.NODE_LAUNCH_SECONDS if new_node else 0.0,
                             image_pull=phases.image_pull_seconds(not new_node, True),
                             pod_start=phases.POD_START_SECONDS, engines=tuple(engines))


def max_hosts(spec: PoolSpec, members: list[PoolMember] | tuple[PoolMember, ...]) -> int:
    """`maxHosts`, by default the spares plus one host per member (each member woken at once)."""
    return spec.max_hosts if spec.max_hosts is not None else spec.spares + len(members)


def pool_cost(spec: PoolSpec, members: list[PoolMember] | tuple[PoolMember, ...]) -> PoolCost:
    price = (None if spec.node_hourly_price_usd is None
             else spec.node_hourly_price_usd / spec.instance.gpu_count)
    return PoolCost(pool_gpus=spec.spares * spec.gpus, per_model_gpus=sum(m.tensor_parallel_size for m in members),
                    gpu_hourly_price_usd=price, max_gpus=max_hosts(spec, members) * spec.gpus)


# --- the whole pool ---------------------------------------------------------------------------------


def check_members(spec: PoolSpec, members: list[PoolMember] | tuple[PoolMember, ...]) -> list[ConfigError]:
    """The placement and trust rules, each member on its own."""
    errors: list[ConfigError] = []
    if not members:
        errors.append(ConfigError(spec.key, f"standby pool '{spec.name}' has no member: no model names it in "
                                f"`standby.pool`, so its {spec.spares} spare host(s) would hold GPUs for nothing",
                                f"add `standby: {{pool: {spec.name}}}` to the models it serves, or remove the pool",
                                spec.name))
    if len(members) > MAX_ENGINES_PER_HOST:
        errors.append(ConfigError(spec.key, f"standby pool '{spec.name}' has {len(members)} members, above the "
                                f"{MAX_ENGINES_PER_HOST} engines one host runs (a replacement host starts them one "
                                "after another)", "split the models over two pools", len(members)))
    images = sorted({m.image for m in members if m.image})
    if len(images) > 1:
        first = members[0]
        for m in members[1:]:
            if m.image != first.image:
                errors.append(ConfigError(f"{m.key}.image", f"{m.name}: runs {m.image} but {first.name}, also in pool "
                                        f"'{spec.name}', runs {first.image}; a host runs every member's engine in one "
                                        "container, of one image", f"give every member of pool '{spec.name}' one "
                                        "image, or move this model to a pool of its own", m.image))
    by_port: dict[int, PoolMember] = {}
    for m in members:
        other = by_port.setdefault(m.port, m)
        if other is not m:
            errors.append(ConfigError(m.port_key, f"{m.name}: serves on port {m.port}, as {other.name} does in pool "
                                    f"'{spec.name}'; the members' engines share one host's network",
                                    f"set standby.port of {m.name} to a free port in {MEMBER_PORT_BASE}-"
                                    f"{MEMBER_PORT_BASE + MEMBER_PORT_SPAN - 1} (taken: "
                                    f"{', '.join(str(p) for p in sorted(by_port))})", m.port))
    if not [t for t in spec.capacity_types if t != "spot"]:
        errors.append(ConfigError(f"{spec.key}.gpuPool", f"pool '{spec.name}': GPU pool '{spec.gpu_pool}' runs on spot "
                                f"only; a spare host on spot is taken by an interruption (two minutes' notice) and "
                                f"its replacement starts every member's engine in turn", "put the pool on a GPU "
                                "pool whose capacity.types include onDemand or reserved", spec.gpu_pool))
    for m in members:
        pool_key = f"{m.key}.standby.pool"
        if any(a.split("=", 1)[0] == TRUST_REMOTE_CODE_FLAG for a in m.extra_args):
            errors.append(ConfigError(f"{m.key}.extraArgs", f"{m.name}: runs remote code ({TRUST_REMOTE_CODE_FLAG}), "
                                    f"and the engines of pool '{spec.name}' share one container: its code could read "
                                    "the other models' files and reach their engines' admin routes on localhost",
                                    "use per-model standby (`standby.count`) for this model, or drop "
                                    f"{TRUST_REMOTE_CODE_FLAG}", TRUST_REMOTE_CODE_FLAG))
        if m.per_model_standby:
            errors.append(ConfigError(f"{m.key}.standby", f"{m.name}: names pool '{spec.name}' and also keeps its own "
                                    "sleepers (`count`); a model has one kind of standby",
                                    "remove `count` and `sleepLevel` (the pool's apply), or remove `pool`"))
        if m.namespace != spec.namespace:
            errors.append(ConfigError(pool_key, f"{m.name}: serves in namespace '{m.namespace}' but pool '{spec.name}' "
                                    f"hosts engines in '{spec.namespace}'; a host serves one namespace (each model's "
                                    "router discovers workers in its own)",
                                    f"deploy the model in '{spec.namespace}', or give its namespace a pool of its own",
                                    spec.name))
        if m.instance_type != spec.instance.instance_type:
            errors.append(ConfigError(pool_key, f"{m.name}: runs on {m.instance_type} but pool '{spec.name}' hosts run "
                                    f"on {spec.instance.instance_type}; its engine would run on other GPUs than it "
                                    "was sized for", f"set the model's instanceType to {spec.instance.instance_type}, "
                                    "or use a pool of its instance type", spec.name))
        if m.tensor_parallel_size != spec.gpus:
            errors.append(ConfigError(pool_key, f"{m.name}: tensorParallelSize={m.tensor_parallel_size} but pool "
                                    f"'{spec.name}' hosts have a GPU set of {spec.gpus}; an engine uses exactly the "
                                    "host's GPUs", f"set tensorParallelSize: {spec.gpus}, or use a pool with "
                                    f"gpus: {m.tensor_parallel_size}", spec.name))
        if not m.autoscaled:
            errors.append(ConfigError(pool_key, f"{m.name}: a pooled engine is woken for a rise its autoscaler sees, and "
                                    "the model has no autoscaling", "add autoscaling (minReplicas, maxReplicas), or "
                                    "remove standby", spec.name))
        if not m.routed:
            errors.append(ConfigError(pool_key, f"{m.name}: only the model's router keeps the host's sleeping engines "
                                    "out of traffic, and routing is none",
                                    "set routing.policy: auto (or a named policy), or remove standby", spec.name))
    return errors


def choose_sleep_level(spec: PoolSpec, members: list[PoolMember] | tuple[PoolMember, ...]
                       ) -> tuple[int, str, HostMemory, ConfigError | None]:
    """The pool's sleep level, why, and the host memory at it; or the refusal with the figures."""
    key = f"{spec.key}.sleepLevel"
    one = host_memory(spec.instance, spec.gpus, members, 1)
    two = host_memory(spec.instance, spec.gpus, members, 2)

    def figures(h: HostMemory) -> str:
        return (f"{h.need_bytes / GIB:.1f} GiB ({', '.join(f'{n} {b / GIB:.1f}' for n, b in h.per_engine_bytes)}, "
                f"/dev/shm {h.shm_bytes / GIB:.0f}) against the host pod's {h.pod_memory_bytes / GIB:.1f} GiB limit")

    where = f"{spec.instance.instance_type} ({spec.instance.memory_gib} GiB of RAM for {spec.instance.gpu_count} GPUs)"
    if spec.sleep_level == 1 and not one.fits:
        return 1, "", one, ConfigError(key, f"pool '{spec.name}': at sleepLevel 1 every member's weights stay in the "
                                     f"host's memory at once: {figures(one)} on {where}",
                                     "set sleepLevel: 2 or auto (weights reloaded on wake, from the node's NVMe where "
                                     "staged), move a model out of the pool, or use an instance with more RAM per GPU", 1)
    if spec.sleep_level == 1:
        return 1, "configured", one, None
    if spec.sleep_level == "auto" and one.fits:
        return 1, f"host RAM holds every member's weights ({figures(one)})", one, None
    if not two.fits:
        return 2, "", two, ConfigError(key, f"pool '{spec.name}': even at sleepLevel 2 the engines' processes need "
                                     f"{figures(two)} on {where}", "move models out of the pool, or use an instance "
                                     "with more RAM per GPU", spec.sleep_level)
    reason = "configured" if spec.sleep_level == 2 else f"level 1 would need {figures(one)}"
    return 2, reason, two, None


def check_gpu(spec: PoolSpec, members: list[PoolMember] | tuple[PoolMember, ...], budget: GpuBudget) -> list[ConfigError]:
    """Each member's weights and a KV cache fit under the derived utilization (the TP rule's own
    MIN_KV_CACHE_FRACTION, tuning.tensor_parallel_fits)."""
    errors = []
    fix = ("move a model out of the pool, use a pool with more GPUs per host (a larger GPU set spreads every "
           "engine over more memory), or measure the residue on your node (`warmstart wake-bench`) and set "
           f"`standbyPools[].sleepingResidueGiB`")
    head = (f"pool '{spec.name}': {budget.engines} engines on one {spec.instance.gpu_model} "
            f"({budget.gpu_bytes / GIB:.1f} GiB) leave the awake one --gpu-memory-utilization {budget.utilization:.2f} "
            f"beside {budget.engines - 1} sleepers of {budget.residue_bytes / GIB:.1f} GiB each "
            f"({'measured' if budget.residue_measured else 'the planning default'}) and "
            f"{HEADROOM_FRACTION:.0%} headroom")
    if budget.utilization <= tuning.MIN_KV_CACHE_FRACTION:
        return [ConfigError(f"{spec.key}", f"{head}: no room for any model", fix, len(members))]
    for m in members:
        u = min(budget.utilization, m.gpu_memory_utilization)
        if not tuning.tensor_parallel_fits(m.weights_bytes, spec.instance, spec.gpus, u):
            errors.append(ConfigError(f"{m.key}.standby.pool", f"{head}; {m.name}'s {m.weights_bytes / GIB:.1f} GiB of "
                                    f"weights over {spec.gpus} GPU(s) is {m.weights_bytes / spec.gpus / GIB:.1f} GiB per "
                                    f"GPU, above the {spec.instance.gpu_memory_bytes * (u - tuning.MIN_KV_CACHE_FRACTION) / GIB:.1f} "
                                    f"GiB that leave {tuning.MIN_KV_CACHE_FRACTION:.0%} of the GPU for its KV cache", fix,
                                    spec.name))
    return errors


def plan_pool(spec: PoolSpec, members: list[PoolMember] | tuple[PoolMember, ...]) -> PoolPlan:
    """The pool decided, or ConfigErrors naming every broken rule (the CLI prints each as one line, exit 2)."""
    if spec.gpus < 1 or spec.instance.gpu_count % spec.gpus or spec.gpus > spec.instance.gpu_count:
        raise ConfigErrors([ConfigError(f"{spec.key}.gpus", f"pool '{spec.name}': a GPU set of {spec.gpus} does not "
                                    f"divide {spec.instance.instance_type}'s {spec.instance.gpu_count} GPUs",
                                    "use gpus in (" + ", ".join(map(str, tuning.valid_tensor_parallel_sizes(spec.instance)))
                                    + ")", spec.gpus)])
    if spec.spares < 1:
        raise ConfigErrors([ConfigError(f"{spec.key}.spares", "a pool keeps at least one spare host",
                                    "set spares >= 1, or remove the pool", spec.spares)])
    if spec.max_hosts is not None and spec.max_hosts < spec.spares:
        raise ConfigErrors([ConfigError(f"{spec.key}.maxHosts", f"pool '{spec.name}': maxHosts {spec.max_hosts} is below "
                                    f"its {spec.spares} spares", f"set maxHosts >= {spec.spares}", spec.max_hosts)])
    members = tuple(sorted(members, key=lambda m: m.name))
    errors = check_members(spec, members)
    level, reason, host, level_error = choose_sleep_level(spec, members)
    if level_error is not None:
        errors.append(level_error)
    budget = gpu_budget(spec.instance, spec.gpus, max(1, len(members)), spec.residue_bytes)
    if members:
        errors.extend(check_gpu(spec, members, budget))
    if errors:
        raise ConfigErrors(errors)
    engines = tuple(EngineSlot(model=m.name, order=i, port=m.port,
                               dist_port=DIST_PORT_BASE + i * DIST_PORT_STRIDE,
                               gpu_memory_utilization=min(budget.utilization, m.gpu_memory_utilization),
                               weights_bytes=m.weights_bytes, staged=m.staged)
                    for i, m in enumerate(members))
    return PoolPlan(name=spec.name, namespace=spec.namespace, instance_type=spec.instance.instance_type, gpus=spec.gpus,
                    spares=spec.spares, sleep_level=level, sleep_level_reason=reason, gpu=budget, host=host,
                    engines=engines, paths=tuple(wake_path(m, spec.instance, level) for m in members),
                    replacement=replacement_window(members, spec.instance, level,
                                                               compile_cached=spec.compile_cached),
                    cost=pool_cost(spec, members),
                    max_hosts=max_hosts(spec, members),
                    host_capacity_types=tuple(t for t in spec.capacity_types if t != "spot"),
                    image=members[0].image if members else "", gpu_pool=spec.gpu_pool)


def rises_served(arrivals: list[float], spares: int, window_s: float) -> list[Literal["wake", "cold"]]:
    """How a sequence of rises on different pooled models (their times, seconds) is met: each takes a
    spare host while one is free (a wake), else a cold start (a new pod of the model, never a wait
    on the pool); a taken spare comes back `window_s` after it was taken (its replacement host
    started every engine). Deterministic, for the render's note and the bench's expectation."""
    free_at: list[float] = [0.0] * spares
    out: list[Literal["wake", "cold"]] = []
    for t in sorted(arrivals):
        ready = [i for i, f in enumerate(free_at) if f <= t]
        if ready:
            free_at[ready[0]] = t + window_s
            out.append("wake")
        else:
            out.append("cold")
    return out


# --- what the supervisor runs ---------------------------------------------------------------------
# Every engine runs with per-model standby's pinned-allocator setting (decisions/standby.py
# PINNED_HOST_ALLOC_CONF: a level-1 sleeper's pinned copy is the weights' own size, not each segment
# rounded up to a power of two and kept after the wake); `host_memory` counts the weights at 1.0x
# only because of it. One constant, read by both kinds of standby.
# What the pool decides for each engine in place of the model's own value (a model's own pods keep theirs).
POOL_FLAGS = ("--port", "--tensor-parallel-size", "--gpu-memory-utilization", standby_mod.SLEEP_MODE_FLAG)


def host_spec(plan: PoolPlan, serve_argv: dict[str, list[str] | tuple[str, ...]],
              engine_env: Mapping[str, Mapping[str, str]] | None = None) -> dict:
    """The engine host's spec file (warmstart/podside/engine_host/spec.py reads it), engines in start
    order. Each engine runs its model's own `vllm serve` command (`serve_argv`, as the model's pods
    run it: manifests/serving.py `vllm_args`) with the flags the pool decides put in place of the
    model's: its port on the host, the host's GPU set as its TP, the derived utilization, sleep mode;
    and in its environment its distributed ports, the dev routes the actuator's wake needs, and the
    pinned-allocator setting host RAM was counted under; `engine_env` adds an engine's own settings
    (a staged member's weights picker: manifests/standby_pool.py)."""
    startup = 0
    engines = []
    for slot in plan.engines:
        argv = [a for a in serve_argv[slot.model] if a.split("=", 1)[0] not in POOL_FLAGS]
        argv += [f"--port={slot.port}", f"--tensor-parallel-size={plan.gpus}",
                 f"--gpu-memory-utilization={slot.gpu_memory_utilization:.2f}", standby_mod.SLEEP_MODE_FLAG]
        engines.append({"model": slot.model, "port": slot.port, "argv": argv,
                        "env": {"VLLM_PORT": str(slot.dist_port), standby_mod.DEV_MODE_ENV: "1",
                                standby_mod.PINNED_HOST_ALLOC_ENV: standby_mod.PINNED_HOST_ALLOC_CONF,
                                **(engine_env or {}).get(slot.model, {})}})
        startup = max(startup, tuning.startup_budget_seconds(slot.weights_bytes))
    # The supervisor takes at most a day per engine (its spec's bound); no honest start is longer.
    return {"sleepLevel": plan.sleep_level, "engines": engines, "startupTimeoutSeconds": min(startup, 86400)}
