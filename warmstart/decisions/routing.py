"""Prefix-aware routing in front of a model's vLLM replicas: whether a model gets a router, and the
router's command line (pure).

The router is SMG (Shepherd Model Gateway, https://github.com/smg-project/smg), policy
`prefix_hash`: the first `prefixTokens` tokens of a request (4 characters per token for
untokenized requests) are hashed onto a consistent-hash ring of the Ready vLLM pods, so one prefix
keeps landing on the replica that holds its KV cache, and a pod joining or leaving moves only the
ring arcs next to it (about 1/N of the prefixes). The load bound is SMG's, from
`model_gateway/src/policies/prefix_hash.rs` (`load_ok`):

    overloaded  <=>  load > max(avg * loadFactor, avg + absThreshold),  avg = (total + 1) / N

where `load` is the router's own count of requests in flight to a replica; an overloaded ring
target is skipped for the least-loaded replica that is not overloaded (the `load_balance_walk`
branch of `smg_prefix_hash_policy_branch_total`). That is consistent hashing with bounded loads,
the semantics SageMaker HyperPod documents for its prefix-aware routing
(https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-model-deployment-caching-routing.html).

Two router replicas (for availability) each count only the requests they sent, about half of
each replica's load. The relative term scales with it and needs nothing; the absolute term does
not: a router that sees half the traffic sees half the excess, so with SMG's default of 10 per
router, two routers together would let a replica run 20 requests over the mean before either
walks. SMG's own comment on `balance_abs_threshold` names the effect ("its false-positive rate
grows as each router replica observes a smaller share of a worker's true load"). So warmstart's
knob is the excess over the mean in the whole fleet's terms (`maxExcessRequests`, default SMG's
10, which it chose for one router) and each router gets `ceil(maxExcessRequests / routers)`.
SMG's mesh mode (`--enable-mesh`) would share the counts instead, at the price of a StatefulSet,
another listener and peer TLS; the division gives the same bound without them.

vLLM's own queue is the second bound and needs no division, since every router polls the same
number from the engine: a replica with at least `--worker-overload-waiting-requests` requests
waiting (SMG's default 8) is left out of routing while another replica is below it
(https://github.com/smg-project/smg, `smg launch --help`, "Routing Policy").
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

from ..errors import Problems
from . import placement

RoutingMode = Literal["auto", "prefix_hash", "round_robin", "none"]
# `auto`: prefix_hash when the model can have more than one replica, else no router. The other
# names are SMG's `--policy` values (prefix-aware, plain load balancing) and `none`.
MODES: tuple[RoutingMode, ...] = ("auto", "prefix_hash", "round_robin", "none")
POLICY_OF: dict[str, str] = {"auto": "prefix_hash", "prefix_hash": "prefix_hash", "round_robin": "round_robin"}

# Two routers on two nodes: one can be drained or lost while the other serves.
ROUTER_REPLICAS = 2
# How long `up` waits for a router given no wait of its own to become Ready (its Deployment's
# `progressDeadlineSeconds` and `pulumi.com/timeoutSeconds`). A router is Ready once one vLLM pod
# is, so the real wait is its model's start-up allowance, which a ServedModel passes
# (`ModelPlan.router_ready_timeout_seconds`); a router used alone does not know it, and waits half
# an hour, three times Pulumi's own default for a Deployment
# (https://www.pulumi.com/registry/packages/kubernetes/api-docs/apps/v1/deployment/).
DEFAULT_READY_TIMEOUT_SECONDS = 1800
# SMG's defaults for prefix_hash (`smg launch --help`, 1.13.0). This one and the next are the
# config fields' defaults too (warmstart/config.py `RoutingConfig`).
DEFAULT_LOAD_FACTOR = 1.25
# Fleet-wide excess over the mean before a replica is skipped: 4 (2 per router), below SMG's
# 10. SMG places each worker 150 times on its ring, so one replica's slice is ~7.6 % off on
# average and often 12-19 % for one of seven; only the bound corrects that. Measured with
# bench/routing.py (7 replicas, 2 routers, 112 in flight), on rings of different pod addresses:
# 10 gave ~90 % KV hits but 12-17 % share spread; 6 gave 86-87 % hits but 18-20 % on two rings
# of six; 4 gave 82-83 % hits and 4-14 % on every ring measured.
DEFAULT_MAX_EXCESS_REQUESTS = 4
DEFAULT_PREFIX_TOKENS = 256
DEFAULT_WAITING_REQUESTS = 8

# Listeners in the router pod. SMG's defaults for serving (30000) and metrics (29000); the probe
# listener runs on its own runtime so probes answer while every request thread is busy.
ROUTER_PORT = 30000
# SMG's port behind a front queue, which then takes ROUTER_PORT (loopback only).
SMG_BEHIND_QUEUE_PORT = 8010
FRONT_QUEUE_MAX_HELD = 256
FRONT_QUEUE_HOLD_SECONDS = 120
# A model scaled to zero pods holds a request for up to twice its predicted cold start (the
# cold-start report's bar for a slow phase), at most 600 s: the OpenAI Python SDK's default
# request timeout (`DEFAULT_TIMEOUT`, https://github.com/openai/openai-python/blob/main/src/openai/_constants.py),
# past which the client has likely gone.
FRONT_QUEUE_MAX_HOLD_SECONDS = 600
# The held-count endpoint (warmstart/podside/front_queue.py, HELD_PATH): the standby actuator and
# KEDA's metrics-api scaler read it.
FRONT_QUEUE_HELD_PATH = "/warmstart/held"
# What a router pod's front-queue container requests besides SMG (ROUTER_REQUESTS).
FRONT_QUEUE_REQUESTS = {"cpu": "100m", "memory": "64Mi"}
# Its memory limit, and what it is spent on: request bodies in memory at once (held, or being
# forwarded) at most FRONT_QUEUE_MAX_HELD_BYTES, two bodies of the largest size the queue takes
# (front_queue.MAX_BODY_BYTES, 64 MiB); a body that would pass it is refused 429 from its headers.
# Each open connection buffers at most about 100 KiB besides its body (a 32 KiB head, 16 KiB
# reads, asyncio's reader pausing past twice its 16 KiB limit), so FRONT_QUEUE_MAX_CONNECTIONS
# take at most 50 MiB; the interpreter with asyncio and h11 about 20 MiB. 128 + 50 + 20 < 256:
# tests/podside/test_front_queue_hostile.py fills every bound at once and reads the peak RSS.
FRONT_QUEUE_MEMORY_LIMIT_MIB = 256
FRONT_QUEUE_MAX_HELD_BYTES = 128 * 1024 * 1024
FRONT_QUEUE_MAX_CONNECTIONS = 512
# A client has this long to send a whole request once it started it, and may stay idle this long
# between two: slow or stalled clients (half-sent headers, a short body) are cut, not held for
# ever. 60 s takes a 64 MiB body at 1.1 MB/s.
FRONT_QUEUE_READ_TIMEOUT_SECONDS = 60
PROBE_PORT = 30001
METRICS_PORT = 29000
# vLLM's port, which the router's discovery must use (SMG defaults to 80).
VLLM_PORT = 8000
# In-flight requests get this long to finish when a router pod stops (SMG's default is 180 s,
# longer than any pod would be given); Kubernetes gets a little more before it kills the pod,
# since SMG first keeps its listener open for 5 s so load balancers notice it is draining.
SHUTDOWN_GRACE_SECONDS = 60
DRAIN_SETTLE_SECONDS = 5


def wanted(mode: str, replicas: int, max_replicas: int | None = None) -> bool:
    """Whether a model gets a router: `auto` when it has, or autoscaling can give it, more than one
    replica; `none` never; a named policy always (one replica behind a router still gives the
    model a router's endpoint, metrics and drain behaviour, so it is allowed when asked)."""
    if mode not in MODES:
        raise ValueError(f"unknown routing mode {mode!r}; one of {MODES}")
    if mode == "none":
        return False
    if mode == "auto":
        return max(replicas, max_replicas or 0) > 1
    return True


def front_queue_hold_seconds(ready_seconds: float) -> int:
    """How long a front queue holds a request of a model whose engine takes `ready_seconds` to
    come (the predicted start): twice that, at least FRONT_QUEUE_HOLD_SECONDS, at most
    FRONT_QUEUE_MAX_HOLD_SECONDS."""
    return int(min(FRONT_QUEUE_MAX_HOLD_SECONDS, max(FRONT_QUEUE_HOLD_SECONDS, math.ceil(2 * ready_seconds))))


def per_router_threshold(max_excess_requests: int, routers: int) -> int:
    """SMG's `--prefix-hash-balance-abs-threshold` for each of `routers` routers that share the
    traffic evenly, so that together they walk at `max_excess_requests` over the mean (at least 1:
    at 0 the check is purely relative, and on a router's small counts it would fire on noise)."""
    return max(1, math.ceil(max_excess_requests / max(1, routers)))


# What one router pod requests: SMG is a Rust proxy (the CPU NodePool's limit counts it,
# warmstart/decisions/cpu_pool.py).
ROUTER_REQUESTS = {"cpu": "500m", "memory": "512Mi"}
ROUTER_MEMORY_LIMIT = "1Gi"


@dataclass(frozen=True)
class RoutingPlan:
    """Everything the router of one model is rendered from."""

    model: str
    namespace: str
    policy: str
    cluster_mode: placement.ClusterMode
    image: str
    router_replicas: int = ROUTER_REPLICAS
    load_factor: float = DEFAULT_LOAD_FACTOR
    max_excess_requests: int = DEFAULT_MAX_EXCESS_REQUESTS
    prefix_tokens: int = DEFAULT_PREFIX_TOKENS
    waiting_requests: int = DEFAULT_WAITING_REQUESTS
    # Who may call the serving port besides pods of the model's namespace (CIDRs); an exposed
    # router needs the load balancer's clients here.
    client_cidrs: tuple[str, ...] = ()
    # Who may scrape the router's metrics listener (CIDRs, and pods by namespace and labels);
    # none binds it to 127.0.0.1.
    metrics_cidrs: tuple[str, ...] = ()
    metrics_pods: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    # Who else may reach vLLM's port once only the router may (a metrics scraper: vLLM serves
    # /metrics on its serving port).
    vllm_scrape_cidrs: tuple[str, ...] = ()
    # Where the Kubernetes API's endpoints are (the router watches pods).
    api_server_cidrs: tuple[str, ...] = ("0.0.0.0/0",)
    # An internal load balancer in front of the router, for clients outside the cluster.
    expose: bool = False
    # How long a router may take to become Ready: it is Ready once one vLLM pod is, so this is the
    # model's own start-up allowance (its Deployment's progress deadline).
    ready_timeout_seconds: int = DEFAULT_READY_TIMEOUT_SECONDS
    # Where the router pods run: the platform's non-GPU nodes (placement.NonGpuPlacement).
    non_gpu: placement.NonGpuPlacement = placement.ANYWHERE_OFF_GPU
    # A front queue in each router pod (warmstart/podside/front_queue.py) takes the serving port
    # and holds requests while the model has no awake engine (scale from zero); SMG then listens
    # on the pod's loopback only. 0: no front queue. Else the Retry-After it answers past its bounds.
    front_queue_retry_after_seconds: int = 0
    # How long the front queue holds a request before the 429.
    front_queue_hold_seconds: int = FRONT_QUEUE_HOLD_SECONDS
    # KEDA's operator reads the front queues' held count (a model scaled to zero pods): its pods
    # are admitted to the serving port.
    front_queue_scaled: bool = False
    # The namespace of that KEDA operator (`monitoring.keda.namespace`: a KEDA of the user's own may
    # run elsewhere).
    keda_namespace: str = "keda"
    # The port the model's vLLM serves on (a pooled model's member port, decisions/standby_pool.py).
    worker_port: int = VLLM_PORT
    # The standby pool the model is a member of: its router also discovers the pool's engine hosts
    # while the model's engine on one is awake (the `warmstart.io/serves` label), on `worker_port`.
    standby_pool: str | None = None

    @property
    def front_queue(self) -> bool:
        return self.front_queue_retry_after_seconds > 0

    @property
    def abs_threshold(self) -> int:
        """The absolute margin each router applies (see per_router_threshold)."""
        return per_router_threshold(self.max_excess_requests, self.router_replicas)

    @property
    def name(self) -> str:
        """Name of the router's Deployment, ServiceAccount, Role and policies."""
        return f"{self.model}-router"

    @property
    def metrics_host(self) -> str:
        return "0.0.0.0" if self.scraped else "127.0.0.1"

    @property
    def scraped(self) -> bool:
        """Whether anything may scrape the metrics listener (then it is bound for them)."""
        return bool(self.metrics_cidrs or self.metrics_pods)


def _cidrs(problems: Problems, key: str, values: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    out = []
    for i, v in enumerate(values):
        try:
            out.append(str(ipaddress.ip_network(v, strict=False)))
        except ValueError:
            problems.add(f"{key}[{i}]", "is not a CIDR block", "write it as a.b.c.d/n, e.g. 10.0.0.0/16", v)
    return tuple(sorted(set(out)))


def plan(model: str, namespace: str, mode: str, cluster_mode: placement.ClusterMode, image: str, *,
         key: str = "routing", router_replicas: int = ROUTER_REPLICAS, load_factor: float = DEFAULT_LOAD_FACTOR,
         max_excess_requests: int = DEFAULT_MAX_EXCESS_REQUESTS, prefix_tokens: int = DEFAULT_PREFIX_TOKENS,
         waiting_requests: int = DEFAULT_WAITING_REQUESTS, client_cidrs: tuple[str, ...] | list[str] = (),
         metrics_cidrs: tuple[str, ...] | list[str] = (),
         metrics_pods: Sequence[tuple[str, Mapping[str, str]]] = (), vllm_scrape_cidrs: tuple[str, ...] | list[str] = (),
         api_server_cidrs: tuple[str, ...] | list[str] = ("0.0.0.0/0",), expose: bool = False,
         ready_timeout_seconds: int = DEFAULT_READY_TIMEOUT_SECONDS, front_queue_retry_after_seconds: int = 0,
         front_queue_hold_seconds: int = FRONT_QUEUE_HOLD_SECONDS, front_queue_scaled: bool = False,
         keda_namespace: str = "keda", worker_port: int = VLLM_PORT, standby_pool: str | None = None,
         non_gpu: placement.NonGpuPlacement = placement.ANYWHERE_OFF_GPU) -> RoutingPlan:
    """The router of one model, its inputs checked (ConfigErrors keyed `<key>.<field>`). `mode`
    is a policy here (`auto` means prefix_hash); whether to have a router at all is `wanted`."""
    p = Problems()
    if mode not in POLICY_OF:
        p.add(f"{key}.mode", f"must be one of {[m for m in MODES if m != 'none']} for a router",
              "use prefix_hash (prefix-aware), round_robin (plain load balancing), or none for no router", mode)
    if router_replicas < 1:
        p.add(f"{key}.routerReplicas", "must be at least 1", "use 2 (the default) so one router can be drained",
              router_replicas)
    if not (math.isfinite(load_factor) and load_factor >= 1.0):
        p.add(f"{key}.loadFactor", "must be a finite number >= 1.0 (SMG rejects less)",
              "use 1.25, SMG's default: walk when a replica carries 25 % over the mean", load_factor)
    if max_excess_requests < 0:
        p.add(f"{key}.maxExcessRequests", "must be >= 0", f"use {DEFAULT_MAX_EXCESS_REQUESTS}, warmstart's default", max_excess_requests)
    if prefix_tokens < 1:
        p.add(f"{key}.prefixTokens", "must be >= 1", "use 256, SMG's default (about 1 KiB of text)", prefix_tokens)
    if waiting_requests < 1:
        p.add(f"{key}.waitingRequests", "must be >= 1 (SMG compares inclusively; 0 vetoes every replica)",
              "use 8, SMG's default", waiting_requests)
    clients = _cidrs(p, f"{key}.clientCidrs", client_cidrs)
    metrics = _cidrs(p, f"{key}.metricsCidrs", metrics_cidrs)
    scrape = _cidrs(p, f"{key}.vllmScrapeCidrs", vllm_scrape_cidrs)
    api = _cidrs(p, f"{key}.apiServerCidrs", api_server_cidrs)
    if not api_server_cidrs:
        p.add(f"{key}.apiServerCidrs", "is empty, so the router could never reach the Kubernetes API to discover "
              "the vLLM pods", "give the cluster's Service CIDR (pods reach the API at the `kubernetes` Service's "
              "ClusterIP, which the network policy agent judges before DNAT) and the VPC CIDRs")
    pods = []
    for i, (ns, labels) in enumerate(metrics_pods):
        if not ns or not labels:
            p.add(f"{key}.metricsScrapers[{i}]", "needs a namespace and at least one pod label: an empty selector "
                  "would admit every pod", "name the scraper's namespace and its pods' labels", {"namespace": ns})
        pods.append((ns, tuple(sorted(labels.items()))))
    if expose and not client_cidrs:
        p.add(f"{key}.clientCidrs", "is empty but expose is on: the NetworkPolicy would let no load-balancer "
              "client in", "give the CIDRs the internal load balancer's clients (and its nodes) come from, "
              "e.g. the VPC CIDR")
    if not 1 <= front_queue_hold_seconds <= FRONT_QUEUE_MAX_HOLD_SECONDS:
        p.add(f"{key}.frontQueueHoldSeconds", f"must be 1-{FRONT_QUEUE_MAX_HOLD_SECONDS} s (a client's own timeout is "
              "likely past that)", f"use {FRONT_QUEUE_HOLD_SECONDS}", front_queue_hold_seconds)
    if ready_timeout_seconds < 60:
        p.add(f"{key}.readyTimeoutSeconds", "must be at least 60", "give the model's start-up allowance",
              ready_timeout_seconds)
    p.raise_if_any()
    return RoutingPlan(
        model=model, namespace=namespace, policy=POLICY_OF[mode], cluster_mode=cluster_mode, image=image,
        router_replicas=router_replicas, load_factor=float(load_factor), max_excess_requests=max_excess_requests,
        prefix_tokens=prefix_tokens, waiting_requests=waiting_requests, client_cidrs=clients, metrics_cidrs=metrics,
        metrics_pods=tuple(sorted(set(pods))),
        vllm_scrape_cidrs=scrape, api_server_cidrs=api, expose=expose, ready_timeout_seconds=ready_timeout_seconds,
        # The same non-GPU nodes as the weights-import Job: GPU nodes are tainted and costly.
        non_gpu=non_gpu, front_queue_retry_after_seconds=max(0, front_queue_retry_after_seconds),
        front_queue_hold_seconds=front_queue_hold_seconds,
        front_queue_scaled=front_queue_scaled and front_queue_retry_after_seconds > 0, keda_namespace=keda_namespace,
        worker_port=worker_port, standby_pool=standby_pool)


def policy_flags(policy: str, *, load_factor: float = DEFAULT_LOAD_FACTOR, abs_threshold: int = 10,
                 prefix_tokens: int = DEFAULT_PREFIX_TOKENS, waiting_requests: int = DEFAULT_WAITING_REQUESTS
                 ) -> list[str]:
    """The routing part of the command line (also what the tests and the benchmark run)."""
    out = ["--backend", "vllm", "--policy", policy]
    if policy == "prefix_hash":
        out += ["--prefix-token-count", str(prefix_tokens), "--prefix-hash-load-factor", f"{load_factor:g}",
                "--prefix-hash-balance-abs-threshold", str(abs_threshold)]
    out += ["--worker-overload-waiting-requests", str(waiting_requests)]
    return out


def flags(p: RoutingPlan, worker_selector: Mapping[str, str]) -> list[str]:
    """`smg launch` arguments of the router of `p`, discovering the pods `worker_selector` matches
    (exactly the model's vLLM pods) in its own namespace. The control-plane key is added by the
    container's entrypoint (it never appears in the object)."""
    if not worker_selector:
        raise ValueError("a router needs a non-empty worker selector")
    return [
        # Behind a front queue SMG serves the queue alone, over the pod's loopback.
        "--host", "127.0.0.1" if p.front_queue else "0.0.0.0", "--port", str(SMG_BEHIND_QUEUE_PORT if p.front_queue
                                                                              else ROUTER_PORT),
        "--health-check-port", str(PROBE_PORT),
        "--prometheus-host", p.metrics_host, "--prometheus-port", str(METRICS_PORT),
        *policy_flags(p.policy, load_factor=p.load_factor, abs_threshold=p.abs_threshold,
                      prefix_tokens=p.prefix_tokens, waiting_requests=p.waiting_requests),
        # A pod counts only when Ready and Running (service_discovery/kubernetes.rs, is_healthy),
        # so a loading vLLM pod never gets traffic. A namespaced watch needs only a Role.
        "--discovery-provider", "kubernetes",
        "--selector", *(f"{k}={v}" for k, v in sorted(worker_selector.items())),
        "--service-discovery-namespace", p.namespace,
        "--service-discovery-port", str(p.worker_port),
        "--shutdown-grace-period-secs", str(SHUTDOWN_GRACE_SECONDS),
        "--log-json",
    ]
