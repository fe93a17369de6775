"""The platform contract: what an environment stack exports for its model stacks, and a model
stack's plan against it (pure; no Pulumi).

An environment stack (`stacks/Pulumi.<env>.yaml`) exports one output, `warmstartPlatform`: a
versioned document of the facts a model's decisions need (cluster mode, namespace, pools with
their instance types and the GPUs its inline models take, loader and compile-cache settings, the
model bucket) and the identifiers its resources need (OIDC provider, buckets, metrics endpoint),
plus the kubeconfig as a secret output of its own. A model stack
(`stacks/Pulumi.<env>-<model>.yaml`, `warmstart:platform: <env>`) reads it through a
`pulumi.StackReference` and plans its one model exactly as the environment plans an inline one
(`plan_model`), so a model stack is validated offline like an inline model. Every error names
both stacks. https://www.pulumi.com/docs/iac/concepts/stacks/#stackreferences
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, make_dataclass
from typing import Any

from .. import versions
from ..config import NAMESPACE, GpuPool, ModelConfig, ModelStackConfig
from ..decisions import cpu_pool, gpu_pools, image_cache, instances, placement
from ..decisions import node_cache as staging
from ..errors import ConfigError, ConfigErrors, Problems
from .stack import StackPlan, plan_in_pool
from . import cluster as plan_cluster
from . import platform_args as platform_args_spec
from . import platform_rules
from .cluster import pool_model
from .model import ModelPlan

CONTRACT_VERSION = 2
"""Bump on any change a model stack of the previous version would misread."""
OUTPUT = "warmstartPlatform"
"""The platform's output that holds the contract."""
KUBECONFIG_OUTPUT = "kubeconfig"
"""The platform's secret output a model stack's Kubernetes provider uses."""
MODEL_KEY = f"{NAMESPACE}:model"


def platform_facts(plan: StackPlan) -> dict[str, Any]:
    """The plan-derived part of an environment's `PlatformArgs` (snake_case keys, as the
    components' TypedDict has them): every `PlatformArgsSpec` fact but its version and those the
    program adds from its resources (`platform_args.resource_facts()`: the VPC's CIDRs, the OIDC
    provider, the compile-cache bucket, the monitoring, ...)."""
    cfg = plan.config
    by_pool: dict[str, list[ModelPlan]] = {}
    for m in plan.models:
        by_pool.setdefault(m.pool or "", []).append(m)
    pools = []
    for p in plan.cluster.pools:
        inline = [pool_model(m) for m in by_pool.get(p.name, [])]
        pools.append({
            "name": p.name, "instance_types": list(p.instance_types), "capacity_types": list(p.capacity_types),
            "max_gpus": p.max_gpus,
            # What the inline models take at their ceiling plus a rollout's surge pod each, and
            # the warm spares.
            "inline_gpus": (gpu_pools.gpus_needed(inline, gpu_pools.SURGE_PODS) if inline else 0)
                           + (p.warm_nodes * p.warm_instance.gpu_count if p.warm_instance else 0),
            "staged_bytes": sum(m.staged_bytes for m in inline),
            "compile_cache_models": p.compile_cache_models,
        })
    return {
        "stack": plan.stack,
        "region": cfg.region,
        "cluster_mode": cfg.cluster_mode,
        "cluster_name": plan.cluster.name,
        "kubernetes_version": cfg.kubernetes_version,
        "name_prefix": plan.name_prefix,
        "namespace": cfg.namespace,
        "model_bucket": plan.aws.buckets.model_bucket,
        "loader": cfg.loader.model_dump(),
        "compile_cache": cfg.compile_cache.model_dump(),
        "nvme_check": cfg.cluster.nvme_check,
        "models": sorted(m.name for m in plan.models),
        "pools": pools,
        "node_cache": plan_stages(plan),
        # The account whose ECR pull-through cache serves Docker Hub images; None: no cache.
        "image_cache_account": cfg.account_id if cfg.image_cache.ecr_pull_through else None,
        # Its routers and import Jobs go to the platform's elastic CPU NodePool (either mode).
        "non_gpu_placement": placement.own_platform_placement().args(),
        "pod_scripts": True,
    }


# Keys whose values are label maps: their keys are Kubernetes label keys, never renamed.
_LABEL_MAPS = ("pod_labels", "podLabels", "node_selector", "nodeSelector")


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def _rekey(value: Any, how: Callable[[str], str]) -> Any:
    if isinstance(value, Mapping):
        return {how(k): (dict(v) if k in _LABEL_MAPS and isinstance(v, Mapping) else _rekey(v, how))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rekey(v, how) for v in value]
    return value


def document(args: Mapping[str, Any]) -> dict[str, Any]:
    """The `warmstartPlatform` output: a `PlatformArgs` with camelCase keys (as Pulumi's schema
    names them, so a program in any language can pass it to `ServedModel` as its `platform`), and
    its version, and the warmstart version that exported it (a model stack refuses another major
    version). The kubeconfig is not in it: it is a secret output of its own. An unset fact (None)
    is left out, as a program leaves the key out."""
    body = {k: v for k, v in args.items() if k != "kubeconfig" and v is not None}
    return {"contractVersion": CONTRACT_VERSION, "warmstartVersion": versions.WARMSTART_VERSION, **_rekey(body, _camel)}


def plan_runs_node_cache(plan: StackPlan) -> bool:
    """Whether the platform runs the node cache's PriorityClasses (warm spares or staging), and
    node-feature-discovery when it stages (see `plan_stages`)."""
    return plan_stages(plan) or any(p.warm_nodes for p in plan.cluster.pools)


def plan_stages(plan: StackPlan) -> bool:
    """Whether the platform runs node-feature-discovery, which a staged model's node labels need."""
    return plan_cluster.runs_node_feature_discovery(plan.config, plan.models)


def plan_runs_autoscaling(plan: StackPlan) -> bool:
    """Whether the platform runs KEDA and metrics collection."""
    return plan_cluster.runs_autoscaling(plan.config, plan.models)


class _ContractViews:
    """What the planners read of a `Contract` besides its facts."""

    monitoring: Mapping[str, Any] | None

    @property
    def scraper_pods(self) -> list[tuple[str, dict[str, str]]]:
        """A Prometheus of the platform's own, by namespace and pod labels (admitted to metrics ports)."""
        return [(str(s["namespace"]), dict(s["pod_labels"])) for s in (self.monitoring or {}).get("scraper_pods") or []]

    @property
    def managed_scraper(self) -> bool:
        """The AMP managed collector scrapes the pods from its ENIs in the VPC."""
        return bool((self.monitoring or {}).get("managed_scraper"))


# The facts of a PlatformArgs the planners do not read: the document's versions, and the
# kubeconfig, which only a Kubernetes provider does.
_UNPLANNED = ("contract_version", "warmstart_version", "kubeconfig")
# How the planners read a fact where it is not as validated: `monitoring` as its mapping (its
# server address as wired), `non_gpu_placement` as the placement it decides; any other list as a
# tuple (the contract is frozen and compared).
_READ: dict[str, Callable[[Any], Any]] = {
    "monitoring": lambda m: None if m is None else platform_args_spec._dumped(m),
    "non_gpu_placement": lambda p: placement.placement_from_args(None if p is None else p.model_dump()),
}


def _read(name: str, value: Any) -> Any:
    if name in _READ:
        return _READ[name](value)
    return tuple(value) if isinstance(value, list) else value


Contract = make_dataclass(
    "Contract", [(name, Any) for name in platform_args_spec.PlatformArgsSpec.model_fields if name not in _UNPLANNED],
    bases=(_ContractViews,), frozen=True)
Contract.__module__ = __name__
Contract.__doc__ = """A platform's `PlatformArgs`, checked: a field per `PlatformArgsSpec` fact the planners read
(platform_args.py declares them, `from_args` fills them), each as validated but for `_READ`'s:
sequences as tuples, `pools` of `PoolArgsSpec`, `monitoring` a mapping (`{"server_address": ...,
"region": ..., "managed_scraper": ..., "scraper_pods": [...]}` when the platform runs KEDA, None
otherwise), `non_gpu_placement` a `placement.NonGpuPlacement` (anywhere off the GPU nodes when
none is given). Identifiers a program wires (`oidc_provider_arn`, ...) may be Pulumi Outputs."""


ARGS_KEY = "ServedModelArgs.platform"
"""The key a ServedModel's platform errors are named by."""


def checked_args(args: Any, key: str = ARGS_KEY) -> dict[str, Any]:
    """A `PlatformArgs` validated as strictly as a stack file (`platform_args.check`: snake_case
    or camelCase keys, strict types), as a dict of snake_case keys; ConfigErrors keyed
    `<key>.<camelCaseKey>`."""
    return platform_args_spec.as_args(platform_args_spec.check(args, key, CONTRACT_VERSION))


def from_args(args: Any, key: str = ARGS_KEY) -> Any:
    """The checked view of a `PlatformArgs` (a `Contract`); ConfigErrors keyed
    `<key>.<camelCaseKey>` on a missing, unknown or malformed fact (`platform_args.check`)."""
    spec = platform_args_spec.check(args, key, CONTRACT_VERSION)
    return Contract(**{f.name: _read(f.name, getattr(spec, f.name)) for f in fields(Contract)})


def parse(doc: Any, platform: str, model_stack: str) -> Contract:
    """The `PlatformArgs` document a platform stack exported (`document`), checked, or a
    ConfigError naming both stacks."""
    return from_args(platform_args(doc, platform, model_stack))


def platform_args(doc: Any, platform: str, model_stack: str) -> dict[str, Any]:
    """The `PlatformArgs` (snake_case keys) of the document a platform stack exported, once
    every fact in it has been checked (`from_args`), or a ConfigError naming both stacks."""
    key = f"{NAMESPACE}:platform"
    if not isinstance(doc, Mapping) or not doc:
        raise ConfigError(key, f"model stack {model_stack!r}: platform stack {platform!r} exports no {OUTPUT} "
                          "(it does not exist, is not deployed yet, or predates model stacks)",
                          f"run `warmstart up --stack {platform}` first (or `warmstart up --env {platform}`)", platform)
    # The major version first: a platform of another one may mean something else by the same keys.
    problem = versions.platform_version_problem(doc.get("warmstartVersion"))
    if problem:
        raise ConfigError(key, f"model stack {model_stack!r} runs warmstart {versions.WARMSTART_VERSION}, but "
                          f"platform stack {platform!r}'s {OUTPUT} {problem}",
                          f"up {platform!r} with warmstart {versions.major(versions.WARMSTART_VERSION)}.x first, "
                          "then this stack (docs/upgrading.md)", platform)
    version = doc.get("contractVersion")
    if not isinstance(version, (int, float)) or int(version) != CONTRACT_VERSION:
        raise ConfigError(key, f"model stack {model_stack!r} reads platform contract version {CONTRACT_VERSION}, "
                          f"but platform stack {platform!r} exports version {version!r}",
                          f"deploy both with the same warmstart version (up {platform!r} first, then this stack)",
                          platform)
    # A version-2 platform exported before `podScripts` existed always shipped the scripts.
    args = {"pod_scripts": True} | _rekey({k: v for k, v in doc.items()
                                           if k not in ("contractVersion", "warmstartVersion")}, _snake)
    try:
        return checked_args(args, OUTPUT)
    except (ConfigError, ConfigErrors) as err:
        first = err.errors[0] if isinstance(err, ConfigErrors) else err
        raise ConfigError(key, f"model stack {model_stack!r}: platform stack {platform!r}'s {OUTPUT} is not a "
                          f"version-{CONTRACT_VERSION} contract ({first.key}: {first.rule})",
                          f"up {platform!r} again with this warmstart version", platform) from None


@dataclass(frozen=True)
class ModelStackPlan:
    """Every decision of a model stack."""

    stack: str
    config: ModelStackConfig
    contract: Contract
    model: ModelPlan

    @property
    def models(self) -> tuple[ModelPlan, ...]:
        return (self.model,)

    @property
    def cluster_mode(self) -> str:
        return self.contract.cluster_mode

    @property
    def kubernetes_version(self) -> str:
        return self.contract.kubernetes_version

    def summary(self) -> dict:
        return {"stack": self.stack, "platform": self.config.platform, "clusterMode": self.contract.cluster_mode,
                "region": self.contract.region, "models": [self.model.summary()]}


# What a command reads of "its platform": an environment stack (a StackPlan) is its own, a model
# stack (a ModelStackPlan) has its platform's through the contract, as its config
# (ModelStackConfig) holds one model and no region, namespace or bucket. Every command that takes
# either kind reads these through the three functions below, not through `stack_plan.config`.


def platform_stack(stack_plan: Any) -> str | None:
    """The platform stack a model stack runs on (its `warmstart:platform`); None for an
    environment stack."""
    return stack_plan.config.platform if getattr(stack_plan, "contract", None) is not None else None


def platform_fact(stack_plan: Any, key: str) -> Any:
    """`region`, `namespace`, `model_bucket` or `compile_cache_bucket` (any contract field, for
    a model stack): an environment stack's own, or a model stack's from its platform's contract."""
    contract = getattr(stack_plan, "contract", None)
    if contract is not None:
        return getattr(contract, key)
    if key == "model_bucket":
        return stack_plan.aws.buckets.model_bucket
    if key == "compile_cache_bucket":
        return stack_plan.aws.compile_cache_bucket
    return getattr(stack_plan.config, key)


def config_models(stack_plan: Any) -> list[tuple[str, ModelConfig, ModelPlan]]:
    """Each model of a stack as (its config key, its config, its plan): `warmstart:models[i]` of
    an environment stack, the one `warmstart:model` of a model stack. The plan's `bucket` and
    `prefix` are the resolved source (a relative source in the platform's model bucket)."""
    if getattr(stack_plan, "contract", None) is not None:
        return [(MODEL_KEY, stack_plan.config.model, stack_plan.model)]
    return [(f"{NAMESPACE}:models[{i}]", m, plan)
            for i, (m, plan) in enumerate(zip(stack_plan.config.models, stack_plan.models))]


def plan_on_platform(m: ModelConfig, contract: Contract, key: str, side: platform_rules.Side | None = None) -> ModelPlan:
    """A model on a platform, by the rules every model has (those of an inline model): its pool
    and instance type, the platform's defaults, its image through the platform's image cache,
    a relative source in the platform's model bucket, enough replicas for a pool that may run
    on spot (platform_rules.py). What only a model added to a platform can break (a duplicate, a
    pool's GPU room) is `plan_model_stack`'s. `side`: the words of the fixes (default: a
    program's `PlatformArgs`, keyed `<key>` less its last part, plus `.platform`)."""
    side = side or platform_rules.program(contract.stack, _platform_key(key))
    if m.standby is not None and m.standby.pool is not None and m.name not in contract.models:
        # Issue 38 item 6: joining cannot be done from here. A pool's hosts run every member's engine
        # from one spec the platform renders, and the pool's GPU budget and host RAM are planned over
        # all its members: a model added beside the platform cannot put its engine on hosts it does
        # not own without the platform stack's own plan and render changing.
        raise ConfigError(f"{key}.standby.pool", f"{m.name}: names standby pool '{m.standby.pool}', but a pool's "
                          f"engine hosts are the platform's ({contract.stack}): they run each member's engine from "
                          "the spec the platform stack renders, and the pool's GPU and host memory are planned over "
                          "its members, so a model added beside the platform cannot join without the platform stack "
                          "changing", f"serve {m.name} as one of platform {contract.stack}'s own models "
                          "(warmstart:models, with standby.pool), or keep per-model standby here (standby.count)",
                          m.standby.pool)
    pools = {p.name: p for p in contract.pools}
    problem = platform_rules.pool_problem(m.pool, pools, key, side)
    if problem:
        raise ConfigError(*problem)
    facts_ = pools[m.pool]
    # The pool's purchase options are the platform's to decide; a model plans on its instance
    # types and GPU limit only.
    pool = GpuPool(name=facts_.name, instance_types=list(facts_.instance_types), max_gpus=facts_.max_gpus)
    if m.relative:
        m = m.in_bucket(contract.model_bucket)
    if contract.image_cache_account:
        m = m.model_copy(update={"image": image_cache.cached_image(m.image, contract.image_cache_account,
                                                                    contract.region)})
    plan = plan_in_pool(m, key=key, pool=pool, loader=contract.loader, compile_cache=contract.compile_cache,
                        cluster_mode=contract.cluster_mode, non_gpu=contract.non_gpu_placement)
    problem = platform_rules.spot_problem(plan, facts_.capacity_types, key, side)
    if problem:
        raise ConfigError(*problem)
    return plan


def _platform_key(key: str) -> str:
    """The key of a model's PlatformArgs beside the model's own (`ServedModelArgs.platform`)."""
    return f"{key.rsplit('.', 1)[0]}.platform"


def non_gpu_room_problems(plan: ModelPlan, contract: Contract, key: str, platform_key: str,
                          where: str = "") -> list[tuple[str, str, str, Any]]:
    """(key, rule, fix, value) for each way the model's non-GPU pods (routers, import Job) would
    have nowhere to run on the platform's `non_gpu_placement`: a GPU pool or the Karpenter-mode
    system node group named as their nodes, a pod larger than a node of the platform's
    `general-purpose` pool, or (Karpenter mode) more at their peak than that pool's CPU limit keeps
    for model stacks. A placement on nodes warmstart does not know is the platform's to size."""
    pods = plan_cluster.model_non_gpu_pods(plan)
    if not pods:
        return []
    pl = contract.non_gpu_placement
    sel = pl.selector
    own = pl == placement.own_platform_placement()
    what = " and ".join(p.name for p in pods)
    total = sum(p.cpu_millis * p.count for p in pods)
    pods_key = f"{key}.{'routing' if plan.routed else 'import'}"
    pool = sel.get(placement.NODEPOOL_LABEL)
    gpu_tolerated = any(t.key in (placement.GPU_TAINT_KEY, None) for t in pl.tolerations)
    out: list[tuple[str, str, str, Any]] = []
    if pool in {p.name for p in contract.pools}:
        out.append((f"{platform_key}.nonGpuPlacement", f"{where}platform {contract.stack!r} places non-GPU pods on "
                    f"its GPU pool {pool!r}: {plan.name}'s {what} ({total}m CPU) would "
                    + ("hold GPU nodes up" if gpu_tolerated else "stay Pending behind the GPU taint"),
                    "give nonGpuPlacement a node selector of non-GPU nodes, or leave it out (anywhere off the "
                    "GPU nodes)", sel))
    elif sel.get(placement.NODE_GROUP_LABEL) == placement.SYSTEM_NODE_GROUP:
        out.append((f"{platform_key}.nonGpuPlacement", f"{where}platform {contract.stack!r} places non-GPU pods on "
                    f"its Karpenter system node group, which is sized for the controller and CoreDNS alone: "
                    f"{plan.name}'s {what} ({total}m CPU) would stay Pending",
                    f"use the platform's elastic pool: nonGpuPlacement: {{nodeSelector: "
                    f"{{{placement.NODEPOOL_LABEL}: {placement.GENERAL_PURPOSE_POOL}}}}}", sel))
    elif own:
        room = cpu_pool.check_pods(contract.cluster_mode, pods,  # type: ignore[arg-type]
                                   budget_millis=cpu_pool.MODEL_STACKS_CPU_MILLIS
                                   if contract.cluster_mode == "karpenter" else None)
        for problem in room.problems:
            out.append((pods_key, f"{where}{plan.name} on platform {contract.stack!r}: {problem}",
                        "turn the router off (routing.policy: none) or drop the import (copy the weights into "
                        "source first), or give the platform's general-purpose NodePool more CPU "
                        "(ClusterArgs.cpuPoolCpuLimit)", total))
    return out


def platform_problems(plan: ModelPlan, contract: Contract, key: str, platform_key: str,
                      side: platform_rules.Side, where: str = "") -> list[platform_rules.Problem]:
    """What a model needs that its platform does not run or has no room for: KEDA and metrics
    for `autoscaling`, node-feature-discovery for weights staged on the nodes
    (`platform_rules.runs_problems`), room for its routers and import Job off the GPU nodes
    (`non_gpu_room_problems`)."""
    return (non_gpu_room_problems(plan, contract, key, platform_key, where=where)
            + platform_rules.runs_problems(plan, runs_keda=contract.monitoring is not None,
                                           runs_node_feature_discovery=contract.node_cache, key=key, side=side))


def check_platform_runs(plan: ModelPlan, contract: Contract, key: str, platform_key: str = "") -> None:
    """ConfigErrors when a program's model needs what its platform does not run or has no room
    for (`platform_problems`; `platform_key`: the key of the PlatformArgs, default `<key>` less
    its last part, plus `.platform`)."""
    platform_key = platform_key or _platform_key(key)
    problems = Problems()
    for problem in platform_problems(plan, contract, key, platform_key, platform_rules.program(contract.stack,
                                                                                               platform_key)):
        problems.add(*problem)
    problems.raise_if_any()


def plan_model_stack(cfg: ModelStackConfig, contract: Contract, stack: str) -> ModelStackPlan:
    """A model stack's one model on its platform, with the rules an inline model has, plus the
    ones only a model stack can break (a duplicate, a missing pool, a pool its platform cannot
    grow, a feature the platform does not run). ConfigErrors name both stacks."""
    key = MODEL_KEY
    platform = cfg.platform
    side = platform_rules.model_stack(stack, platform)
    m = cfg.model
    problems = Problems()
    if m.name in contract.models:
        problems.add(f"{key}.name", f"model {m.name!r} of model stack {stack!r} is also inline in platform stack "
                     f"{platform!r} (warmstart:models): two Deployments would own one name",
                     f"remove it from stacks/Pulumi.{platform}.yaml's models or delete this model stack", m.name)
    pools = {p.name: p for p in contract.pools}
    problem = platform_rules.pool_problem(m.pool, pools, key, side)
    if problem:
        problems.add(*problem)
    problems.raise_if_any()
    facts_ = pools[m.pool]
    # The rules of every model on a platform (a spot pool's replicas among them).
    plan = plan_on_platform(m, contract, key, side)
    pool = facts_
    # The pool's GPU limit is the platform's: what its inline models leave must hold this model
    # at its ceiling plus a surge pod (other model stacks on the pool are not known here).
    need = gpu_pools.gpus_needed([pool_model(plan)], gpu_pools.SURGE_PODS)
    room = facts_.max_gpus - facts_.inline_gpus
    if need > room:
        what = "maxReplicas" if plan.autoscaling else "replicas"
        problems.add(f"{key}.{'autoscaling.maxReplicas' if plan.autoscaling else 'replicas'}",
                     f"model stack {stack!r}: {m.name}'s {what}={plan.max_replicas} plus a surge pod need {need} GPUs "
                     f"on pool {pool.name!r}, but platform stack {platform!r} allows maxGpus={facts_.max_gpus} and its "
                     f"inline models take {facts_.inline_gpus}, leaving {room}",
                     f"set gpuPools[{pool.name}].maxGpus >= {facts_.inline_gpus + need} in "
                     f"stacks/Pulumi.{platform}.yaml, or lower {what}", plan.max_replicas)
    if plan.staged:
        insts = [instances.lookup(t) for t in facts_.instance_types]
        staged = [staging.StagedModel(m.name, plan.weights_bytes, plan.compile_cache)]
        if facts_.staged_bytes:
            staged.append(staging.StagedModel(f"{platform}'s inline models", facts_.staged_bytes, False))
        try:
            staging.check_capacity(pool.name, insts, staged, facts_.compile_cache_models + int(plan.compile_cache))
        except staging.NodeCacheError as err:
            problems.add(f"{key}.nodeCache", f"model stack {stack!r} on platform {platform!r}: {err.rule}", err.fix,
                         plan.load.mode if plan.load else None)
    for problem in platform_problems(plan, contract, key, f"{NAMESPACE}:platform", side,
                                     where=f"model stack {stack!r}: "):
        problems.add(*problem)
    problems.raise_if_any()
    return ModelStackPlan(stack=stack, config=cfg, contract=contract, model=plan)


def check_sibling_model_stacks(cfg: ModelStackConfig, stack: str, siblings: Mapping[str, tuple[str, str]]) -> None:
    """A ConfigError when another model stack on the same platform serves a model of the same
    name (two Deployments, Services and IRSA roles would own one name in one namespace).

    The platform's contract cannot know this: a platform stack has no view of the stacks that
    read it (a StackReference is one-way, https://www.pulumi.com/docs/iac/concepts/stacks/#stackreferences),
    so its `models` lists its inline models only (checked in plan_model_stack). `siblings` is
    what can be known offline: {stack: (platform, model name)} of the other model stack files in
    the same stacks/ folder. A model stack kept elsewhere is not seen."""
    mine = cfg.platform.rsplit("/", 1)[-1]
    clash = sorted(other for other, (platform, name) in siblings.items()
                   if other != stack and platform.rsplit("/", 1)[-1] == mine and name == cfg.model.name)
    if clash:
        raise ConfigError(f"{MODEL_KEY}.name", f"model {cfg.model.name!r} of model stack {stack!r} is also the model "
                          f"of model stack(s) {', '.join(repr(c) for c in clash)} on platform {cfg.platform!r}: "
                          "two Deployments would own one name", f"rename the model in one of them, or delete "
                          f"stacks/Pulumi.{clash[0]}.yaml", cfg.model.name)
