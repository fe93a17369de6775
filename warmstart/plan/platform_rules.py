"""The rules of a model meeting its platform, each written once (pure; no Pulumi).

A model meets a platform in three places: an environment stack's inline model
(`warmstart:models[i]` on its own `warmstart:gpuPools`), a model stack's model (`warmstart:model`
on its platform stack's exported contract) and a ServedModel of a program (`ServedModelArgs.model`
on its `ServedModelArgs.platform`). Each rule below is one function all three call; only the
words of the fix differ, and they name the keys the model's user edits (a `Side`):

- the model's pool is one of the platform's (`pool_problem`);
- a pool that may run on spot holds a model of two replicas at least (`spot_problem`);
- an autoscaled model needs a platform that runs KEDA and metrics collection (`keda_problem`);
- weights staged on the nodes need node-feature-discovery, whose node labels select them
  (`staging_problem`).

The Cluster component, which sizes its pools for the models it is told of
(`ClusterArgs.poolModels`), checks each one's pool by the first rule too (`cluster_component`).

An environment runs KEDA and node-feature-discovery whenever one of its own models needs them
(`cluster.runs_autoscaling`, `cluster.runs_node_feature_discovery`), so an inline model passes
the last two by construction; a model stack or a program meets a platform that decided without it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import NAMESPACE
from ..decisions import capacity
from .model import ModelPlan

Problem = tuple[str, str, str, Any]
"""(key, rule, fix, value), as `Problems.add` takes them."""


@dataclass(frozen=True)
class Side:
    """The platform a model meets, in the words of the keys its user edits."""

    platform: str
    """The platform, as a rule names it: `stack 'dev'`, `platform stack 'prod'`, `platform 'research'`."""
    pools: str
    """Where a GPU pool is added (`warmstart:gpuPools in stacks/Pulumi.prod.yaml`)."""
    keda: str
    """What makes the platform run KEDA and metrics collection."""
    staging: str
    """What makes the platform run node-feature-discovery."""
    who: str = ""
    """What begins each rule (`model stack 'prod-x': `)."""


def environment(stack: str) -> Side:
    """An environment stack's inline models, on its own pools."""
    return Side(platform=f"stack {stack!r}", pools=f"{NAMESPACE}:gpuPools",
                keda=f"set {NAMESPACE}:modelStacks: {{autoscaling: true}}",
                staging=f"set {NAMESPACE}:modelStacks: {{nodeCache: true}}")


def model_stack(stack: str, platform: str) -> Side:
    """A model stack's model, on its platform stack (whose stack file the fixes name)."""
    file = f"stacks/Pulumi.{platform.rsplit('/', 1)[-1]}.yaml"
    return Side(platform=f"platform stack {platform!r}", pools=f"{NAMESPACE}:gpuPools in {file}",
                keda=f"set {NAMESPACE}:modelStacks: {{autoscaling: true}} in {file}",
                staging=f"set {NAMESPACE}:modelStacks: {{nodeCache: true}} in {file}",
                who=f"model stack {stack!r}: ")


def program(platform: str, platform_key: str) -> Side:
    """A ServedModel on the `PlatformArgs` a program gave it (keyed `platform_key`)."""
    return Side(platform=f"platform {platform!r}", pools=f"{platform_key}.pools",
                keda=f"give {platform_key}.monitoring (a platform that runs KEDA and metrics collection)",
                staging=f"run node-feature-discovery and say so ({platform_key}.nodeCache: true)")


def cluster_component(cluster: str, args_key: str = "ClusterArgs") -> Side:
    """The models a Cluster component sizes its GPU pools for (`<args_key>.poolModels`): only the
    pool rule applies there; KEDA and node-feature-discovery are other components'."""
    return Side(platform=f"cluster {cluster!r}", pools=f"{args_key}.gpuPools",
                keda="run the Monitoring component for the cluster",
                staging="run a ServingPlatform whose platform has nodeCache: true")


def pool_problem(pool: str, pools: Collection[str], key: str, side: Side) -> Problem | None:
    """The model's `pool` is not one of the platform's `pools`."""
    if pool in pools:
        return None
    return (f"{key}.pool", f"{side.who}{side.platform} has no GPU pool {pool!r}",
            f"use one of its pools ({', '.join(sorted(pools)) or 'none'}), or add a pool of that name to {side.pools}",
            pool)


def spot_problem(plan: ModelPlan, capacity_types: Sequence[str], key: str, side: Side) -> Problem | None:
    """The model, at its fewest replicas, would go offline on a spot interruption of its pool
    (`capacity.spot_replicas_problem`): keyed by what sets its fewest replicas."""
    fewest = plan.autoscaling.min_replicas if plan.autoscaling else plan.replicas
    problem = capacity.spot_replicas_problem(plan.pool or "", capacity_types, plan.name, fewest)
    if problem is None:
        return None
    n = capacity.MIN_SPOT_REPLICAS
    return (f"{key}.{'autoscaling.minReplicas' if plan.autoscaling else 'replicas'}",
            f"{side.who}{problem} ({side.platform})",
            f"give it replicas >= {n} (or autoscaling.minReplicas >= {n}), move it to a pool without spot, or "
            f"remove spot from pool {plan.pool!r} ({side.pools})", fewest)


def keda_problem(plan: ModelPlan, runs_keda: bool, key: str, side: Side) -> Problem | None:
    """The model autoscales on a platform that runs no KEDA or metrics collection."""
    if plan.autoscaling is None or runs_keda:
        return None
    return (f"{key}.autoscaling", f"{side.who}{plan.name} autoscales, but {side.platform} runs no KEDA or metrics "
            "collection", f"{side.keda}, or remove autoscaling", True)


def staging_problem(plan: ModelPlan, runs_node_feature_discovery: bool, key: str, side: Side) -> Problem | None:
    """The model's weights would be staged on nodes that no node-feature-discovery labels."""
    if not plan.staged or runs_node_feature_discovery:
        return None
    return (f"{key}.nodeCache", f"{side.who}{plan.name}'s weights would be staged on the nodes, but {side.platform} "
            "runs no node-feature-discovery (the node labels that select them)", f"{side.staging}, or set "
            "nodeCache: off", plan.load.mode if plan.load else None)


def runs_problems(plan: ModelPlan, *, runs_keda: bool, runs_node_feature_discovery: bool, key: str,
                  side: Side) -> list[Problem]:
    """What the model needs that its platform does not run (`keda_problem`, `staging_problem`)."""
    found = (keda_problem(plan, runs_keda, key, side), staging_problem(plan, runs_node_feature_discovery, key, side))
    return [p for p in found if p is not None]
