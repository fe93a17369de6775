"""Autoscaled models fit their GPU pool: KEDA's `maxReplicaCount` against the NodePool's GPU limit.

The same rule the config enforces (`decisions.autoscaling.check_pool_capacity`), re-checked on
what a preview is about to deploy, so a hand-edited stack or a component used alone is caught
too: for every GPU NodePool, the sum over the vLLM Deployments that select it of (pods at their
ceiling + one rollout surge pod), counted in whole nodes of the Deployment's instance type as
Karpenter counts them against `limits` (https://karpenter.sh/v1.14/concepts/nodepools/#speclimits),
must not exceed `spec.limits["nvidia.com/gpu"]`. The ceiling is the ScaledObject's
`maxReplicaCount` when one targets the Deployment, else the Deployment's `replicas`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ..decisions import gpu_pools, instances, placement
from ..decisions.gpu_pools import SURGE_PODS
from .records import Resource, Violation, as_list, is_unknown, k8s
from .vllm import _int, vllm_container, vllm_deployments

POLICY = "autoscaling-max-replicas-fit-gpu-pool"
SCALED_OBJECT = ("keda.sh", "ScaledObject")


def scaled_objects(resources: Sequence[Resource]) -> list[Resource]:
    return k8s(resources, SCALED_OBJECT[1], SCALED_OBJECT[0])


def _target(so: Resource, deployments: Sequence[Resource]) -> Resource | None:
    ref = so.get("spec", "scaleTargetRef", default={})
    if not isinstance(ref, Mapping) or ref.get("kind", "Deployment") != "Deployment":
        return None
    ns = so.get("metadata", "namespace")
    for d in deployments:
        if d.get("metadata", "name") == ref.get("name") and d.get("metadata", "namespace") == ns:
            return d
    return None


def _gpus_per_pod(d: Resource) -> int | None:
    c = vllm_container(d)
    if c is None:
        return None
    res = c.get("resources") if isinstance(c.get("resources"), Mapping) else {}
    for part in ("limits", "requests"):
        v = (res.get(part) or {}).get(placement.GPU_RESOURCE) if isinstance(res.get(part), Mapping) else None
        n = _int(v)
        if n is not None:
            return n
    return None


def _instance(d: Resource) -> Any:
    sel = d.get("spec", "template", "spec", "nodeSelector", default={})
    itype = sel.get(placement.INSTANCE_TYPE_LABEL) if isinstance(sel, Mapping) else None
    return instances.catalog().get(itype) if isinstance(itype, str) else None


def _gpus_at(d: Resource, pods: int) -> tuple[int, str] | None:
    """GPUs of the nodes `pods` pods of `d` occupy, and how that was counted."""
    per_pod = _gpus_per_pod(d)
    if per_pod is None or per_pod < 1:
        return None
    sel = d.get("spec", "template", "spec", "nodeSelector", default={})
    itype = sel.get(placement.INSTANCE_TYPE_LABEL) if isinstance(sel, Mapping) else None
    inst = instances.catalog().get(itype) if isinstance(itype, str) else None
    if inst is not None and inst.gpu_count >= per_pod:
        nodes = math.ceil(pods / (inst.gpu_count // per_pod))
        return nodes * inst.gpu_count, f"{pods} pods x {per_pod} GPUs on {nodes} x {itype} ({inst.gpu_count} GPUs each)"
    # Instance type unknown: pods' GPUs, a lower bound of what the nodes hold.
    return pods * per_pod, f"{pods} pods x {per_pod} GPUs"


def _limit(np: Resource) -> Any:
    limits = np.get("spec", "limits", default={})
    if is_unknown(limits):
        return limits
    return limits.get(placement.GPU_RESOURCE) if isinstance(limits, Mapping) else None


def check_autoscaling_fits_pool(resources: Sequence[Resource]) -> list[Violation]:
    """Every GPU NodePool's `nvidia.com/gpu` limit holds each of its Deployments at its ceiling
    (KEDA `maxReplicaCount`, else `replicas`) plus one surge pod."""
    deployments = vllm_deployments(resources)
    ceilings: dict[str, tuple[Any, Resource]] = {}
    for so in scaled_objects(resources):
        d = _target(so, deployments)
        if d is not None:
            ceilings[d.key] = (so.get("spec", "maxReplicaCount"), so)
    found: list[Violation] = []
    for np in k8s(resources, "NodePool", "karpenter.sh"):
        name = np.get("metadata", "name")
        on_pool = [d for d in deployments
                   if (d.get("spec", "template", "spec", "nodeSelector", default={}) or {}).get(placement.NODEPOOL_LABEL) == name]
        scaled = [d for d in on_pool if d.key in ceilings]
        if not scaled:
            continue
        limit = _int(_limit(np))
        if is_unknown(_limit(np)) or limit is None:
            if not is_unknown(_limit(np)):
                found.append(Violation(POLICY, np, f"{np.label()} runs autoscaled models but sets no "
                                       f"{placement.GPU_RESOURCE} limit, so KEDA's maxReplicaCount is not checked "
                                       "against anything; fix: set spec.limits"))
            continue
        total, parts, skip = 0, [], False
        packed: list[tuple[gpu_pools.PoolModel, int]] = []
        for d in on_pool:
            ceiling = ceilings[d.key][0] if d.key in ceilings else d.get("spec", "replicas", default=1)
            if is_unknown(ceiling):
                skip = True
                break
            n = _int(ceiling)
            counted = _gpus_at(d, (n or 0) + SURGE_PODS) if n is not None else None
            if counted is None:
                skip = True
                break
            gpus, how = counted
            inst, per_pod = _instance(d), _gpus_per_pod(d)
            if inst is not None and per_pod is not None and inst.gpu_count >= per_pod:
                # Packed with the pool's other pods of its type (gpu_pools.packed_gpus).
                packed.append((gpu_pools.PoolModel(inst, per_pod, 0, name=d.label()), (n or 0) + SURGE_PODS))
            else:
                total += gpus
            kind = "maxReplicaCount" if d.key in ceilings else "replicas"
            parts.append(f"{d.label()} {kind}={n}+{SURGE_PODS}: {how} = {gpus}")
        if skip:
            continue
        total += gpu_pools.packed_gpus(packed)
        if total <= limit:
            continue
        for d in scaled:
            so = ceilings[d.key][1]
            found.append(Violation(POLICY, so, f"{so.label()}: {np.label()} allows {limit} GPUs but its models at "
                                   f"their ceiling plus one surge pod need {total} packed on whole nodes ({'; '.join(parts)}), so KEDA "
                                   f"would ask for pods Karpenter can never place; fix: lower maxReplicaCount or "
                                   f"raise the NodePool's {placement.GPU_RESOURCE} limit to >= {total}"))
    return found
