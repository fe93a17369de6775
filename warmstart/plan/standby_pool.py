"""A stack's standby pools (`warmstart:standbyPools`), planned from the stack's config and its
planned models (pure; no Pulumi).

Each pool is decided by `decisions/standby_pool.plan_pool` from its members' own model plans
(`ModelPlan.pooled`, plan/model.py): the one plan per model that per-model standby
(`ModelPlan.standby`) and pooled standby both read. What only the stack knows is checked here:
the GPU pool and instance type a pool names, the models that name a pool that does not exist,
and the pool names themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import NAMESPACE, StackConfig
from ..decisions import instances, prices
from ..decisions import standby_pool as pool_mod
from ..errors import Problems, listing
from . import cluster as plan_cluster
from .records import ModelPlan

KEY = f"{NAMESPACE}:standbyPools"


def pool_key(i: int) -> str:
    return f"{KEY}[{i}]"


def plan_standby_pools(cfg: StackConfig, models: Sequence[ModelPlan], problems: Problems) -> tuple[pool_mod.PoolPlan, ...]:
    """Every pool of the stack, decided; each broken rule is added to `problems` (key, rule with
    its figures, fix). A pool one of whose members failed its own plan is not planned (its
    member's error is already reported)."""
    names = [p.name for p in cfg.standby_pools]
    planned = {m.name: m for m in models}
    key_of = {m.name: f"{NAMESPACE}:models[{i}]" for i, m in enumerate(cfg.models)}
    for i, name in enumerate(names):
        if names.index(name) != i:
            problems.add(f"{pool_key(i)}.name", "duplicate standby pool name", "give every standby pool a unique name",
                         name)
    for i, m in enumerate(cfg.models):
        if m.standby is not None and m.standby.pool is not None and m.standby.pool not in names:
            problems.add(f"{key_of[m.name]}.standby.pool", f"{m.name}: names standby pool '{m.standby.pool}', which "
                         f"warmstart:standbyPools does not have ({listing(names) if names else 'none'})",
                         "add the pool to warmstart:standbyPools, or name one of its pools", m.standby.pool)
    names_of_models = {m.name for m in cfg.models}
    for i, name in enumerate(names):
        for clash in (pool_mod.host_deployment_name(name), pool_mod.pool_actuator_name(name)):
            if clash in names_of_models:
                problems.add(f"{pool_key(i)}.name", f"the pool's Deployment {clash} would have a model's name",
                             "rename the pool or the model", name)
    plans = []
    gpu_pools = {p.name: p for p in cfg.gpu_pools}
    for i, p in enumerate(cfg.standby_pools):
        key = pool_key(i)
        naming_models = [m for m in cfg.models if m.standby is not None and m.standby.pool == p.name]
        if any(m.name not in planned for m in naming_models):
            continue
        gpu = gpu_pools.get(p.gpu_pool)
        if gpu is None:
            problems.add(f"{key}.gpuPool", f"standby pool '{p.name}' names GPU pool '{p.gpu_pool}', which "
                         f"warmstart:gpuPools does not have ({listing(list(gpu_pools))})",
                         "name one of the stack's gpuPools", p.gpu_pool)
            continue
        if p.instance_type is None and len(gpu.instance_types) != 1:
            problems.add(f"{key}.instanceType", f"GPU pool '{gpu.name}' has several instance types "
                         f"({listing(list(gpu.instance_types))}) and standby pool '{p.name}' does not say which its "
                         "hosts run on", "set instanceType to one of the GPU pool's types")
            continue
        instance_type = p.instance_type or gpu.instance_types[0]
        if instance_type not in gpu.instance_types:
            problems.add(f"{key}.instanceType", f"not one of GPU pool '{gpu.name}''s instanceTypes "
                         f"({listing(list(gpu.instance_types))})", "add it to the GPU pool or pick one of its types",
                         instance_type)
            continue
        inst = instances.lookup(instance_type)
        listed = prices.pool_price(cfg.region, [instance_type])
        spec = pool_mod.PoolSpec(
            name=p.name, key=key, namespace=cfg.namespace, instance=inst, gpus=p.gpus, spares=p.spares,
            sleep_level=p.sleep_level,
            residue_bytes=None if p.sleeping_residue_gib is None else int(p.sleeping_residue_gib * instances.GIB),
            node_hourly_price_usd=gpu.hourly_price_usd if gpu.hourly_price_usd is not None else
            (listed.usd_per_hour if listed else None),
            capacity_types=plan_cluster.pool_capacity_types(gpu), gpu_pool=gpu.name, max_hosts=p.max_hosts,
            compile_cached=False)
        members = [pool_member(planned[m.name], key_of[m.name], cfg.namespace, gpu.name) for m in naming_models]
        with problems.collect():
            plans.append(pool_mod.plan_pool(spec, members))
    return tuple(plans)


def pool_member(m: ModelPlan, key: str, namespace: str, gpu_pool: str | None = None) -> pool_mod.PoolMember:
    """A pool's member, from its own model plan. Staged where the node cache stages its weights on
    the hosts' GPU pool (`gpu_pool`): its staging DaemonSet runs on its own pool's nodes only."""
    assert m.pooled is not None
    return pool_mod.PoolMember(
        name=m.name, key=key, namespace=namespace, instance_type=m.instance.instance_type,
        tensor_parallel_size=m.tensor_parallel_size, weights_bytes=m.weights_bytes,
        gpu_memory_utilization=m.gpu_memory_utilization, extra_args=m.extra_args,
        # The hosts mount the node cache's copy of a member staged on their GPU pool, and each engine
        # picks it at its start (manifests/standby_pool.py); they mount no compile cache (PoolSpec).
        autoscaled=m.autoscaling is not None, routed=m.routed,
        staged=m.staged and gpu_pool is not None and m.pool == gpu_pool, per_model_standby=m.standby is not None,
        image=m.image, given_port=m.pooled.port if m.pooled.port_given else None)

