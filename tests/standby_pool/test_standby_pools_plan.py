"""A stack's standby pools (warmstart/plan/standby_pool.py): the config keys `standbyPools` and a
model's `standby: {pool: ...}`, each rule of docs/scale-out.md "Pooled standby" refused in the
stack's plan under the key that breaks it, with the rule's figures and a fix."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.standby_pool.pooled import MODELS, POOL, pooled_config
from warmstart import config
from warmstart.decisions import standby_pool as sp
from warmstart.errors import ConfigErrors
from warmstart.plan.stack import plan_stack

M = "warmstart:models"
P = "warmstart:standbyPools[0]"


def plan(cfg: dict[str, Any]):
    return plan_stack(config.parse_config(cfg), "pooled")


def errors(change: Callable[[dict[str, Any]], None]) -> dict[str, str]:
    cfg = pooled_config()
    change(cfg)
    with pytest.raises(ConfigErrors) as caught:
        plan(cfg)
    out = {e.key: f"{e.rule} | fix: {e.fix}" for e in caught.value.errors}
    assert all(e.fix for e in caught.value.errors)
    return out


def test_four_models_plan_one_pool_from_their_own_model_plans():
    p = plan(pooled_config())
    (pool,) = p.standby_pools
    assert pool.members == tuple(sorted(MODELS)) and pool.spares == 1 and pool.max_hosts == 1 + len(MODELS)
    by = {m.name: m for m in p.models}
    for m in by.values():
        # One plan per model: pooled, no per-model sleepers, no sleepers added to its first create.
        assert m.standby is None and m.pooled is not None and m.pooled.pool == POOL
        assert pool.engine(m.name).port == m.pooled.port == sp.member_port(m.name)
        assert m.replicas == m.autoscaling.min_replicas or m.autoscaling.min_replicas == 0
        assert m.routed, "a pooled model is routed: its router is what reaches the woken engine"
    assert pool.cost.pool_gpus == 1 and pool.cost.per_model_gpus == 4
    assert p.summary()["standbyPools"][0]["pool"] == POOL


def test_a_model_of_one_replica_at_most_is_routed_when_pooled():
    # Its own pod and the engine woken for it on a host: two engines, so a router (and at
    # minReplicas 0 its front queue) in front of them.
    cfg = pooled_config()
    cfg["models"][0]["autoscaling"] = {"minReplicas": 0, "maxReplicas": 1}
    assert next(m for m in plan(cfg).models if m.name == MODELS[0]).routed
    cfg["standbyPools"] = []
    for m in cfg["models"]:
        del m["standby"]
    with pytest.raises(ConfigErrors) as caught:
        plan(cfg)
    assert [e.key for e in caught.value.errors] == [f"{M}[0].autoscaling.minReplicas"]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(cfg: dict[str, Any]) -> None:
        *head, last = path.split(".")
        node: Any = cfg
        for part in head:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value
    return change


@pytest.mark.parametrize("change, key, words", [
    (_set("models.1.extraArgs", ["--trust-remote-code"]), f"{M}[1].extraArgs", "runs remote code"),
    (_set("models.2.image", "vllm/vllm-openai:v0.11.2"), f"{M}[2].image", "one image"),
    (_set("models.3.tensorParallelSize", 2), f"{M}[3].standby.pool", "tensorParallelSize=2"),
    (_set("models.0.standby", {"pool": POOL, "count": 1}), f"{M}[0].standby.count", "keeps no sleepers"),
    (_set("models.0.standby", {"pool": POOL, "sleepLevel": 2}), f"{M}[0].standby.sleepLevel", "pool's sleepLevel"),
    (_set("models.0.autoscaling", None), f"{M}[0].standby", "no autoscaling"),
    (_set("models.0.routing", {"policy": "none"}), f"{M}[0].routing.policy", "routing is none"),
    (_set("models.0.standby", {"pool": "elsewhere"}), f"{M}[0].standby.pool", "does not have (shared-h100)"),
    (_set("models.0.standby", {"count": 1, "port": 8500}), f"{M}[0].standby.port", "names no pool"),
    (_set("standbyPools.0.gpuPool", "a100"), f"{P}.gpuPool", "does not have (h100)"),
    (_set("gpuPools.0.capacity", {"types": ["spot"]}), f"{P}.gpuPool", "runs on spot only"),
    (_set("standbyPools.0.sleepLevel", 1), f"{P}.sleepLevel", "against the host pod's"),
    (_set("standbyPools.0.maxHosts", 1), None, None),
])
def test_each_pool_rule_is_refused_under_its_key_with_a_fix(change, key, words):
    if key is None:
        plan_ok = pooled_config()
        change(plan_ok)
        assert plan(plan_ok).standby_pools[0].max_hosts == 1
        return
    if key in (f"{P}.sleepLevel", f"{P}.gpuPool") and words != "does not have (h100)":
        def more(cfg, change=change):
            change(cfg)
            for m in cfg["models"]:
                # Level 1 forced on members whose weights the host's RAM cannot hold all at once;
                # on spot, models that may run there (two replicas at their fewest).
                m["weightsGiB"] = 60 if key.endswith("sleepLevel") else 15
                if key.endswith("gpuPool"):
                    m["autoscaling"] = {"minReplicas": 2, "maxReplicas": 3}
        change = more
    got = errors(change)
    assert key in got and words in got[key], got


def test_members_on_one_port_are_refused_and_the_fix_names_the_key():
    def same(cfg):
        cfg["models"][0]["standby"]["port"] = 8500
        cfg["models"][1]["standby"]["port"] = 8500
    got = errors(same)
    assert list(got) == [f"{M}[1].standby.port"] and "8500" in got[f"{M}[1].standby.port"]
    assert "set standby.port of chat-b" in got[f"{M}[1].standby.port"]


def test_too_many_large_sleepers_for_the_gpu_are_refused_with_the_figures():
    def large(cfg):
        for m in cfg["models"]:
            m["weightsGiB"] = 55
    got = errors(large)
    rule = next(v for k, v in got.items() if k.endswith(".standby.pool"))
    assert "4 engines on one NVIDIA H100 (80.0 GiB)" in rule and "--gpu-memory-utilization" in rule and "sleepingResidueGiB" in rule


def test_a_member_port_out_of_range_is_refused_by_the_config():
    cfg = pooled_config()
    cfg["models"][0]["standby"]["port"] = 8000
    with pytest.raises(ConfigErrors) as caught:
        plan(cfg)
    assert [e.key for e in caught.value.errors] == [f"{M}[0].standby.port"]


def test_a_model_beside_the_platform_cannot_join_its_pool_and_is_told_why_and_how():
    # Issue 38 item 6: a model stack's model (not one of the platform's own) naming a pool.
    from components.platform import contract
    from tests.support.platforms import PLATFORM
    from warmstart.config import ModelConfig
    from warmstart.errors import ConfigError
    from warmstart.plan.platform import plan_on_platform

    on = contract(PLATFORM | {"pools": [{"name": "l40s", "instance_types": ["g6e.2xlarge"], "max_gpus": 8}],
                              "models": ["own"]})
    entry = {"name": "joiner", "source": "s3://b-models/j", "weightsGiB": 15, "pool": "l40s",
             "autoscaling": {"minReplicas": 1, "maxReplicas": 2}, "standby": {"pool": "shared"}}
    with pytest.raises(ConfigError) as err:
        plan_on_platform(ModelConfig.model_validate(entry), on, "warmstart:model")
    e = err.value
    assert e.key == "warmstart:model.standby.pool" and "planned over its members" in e.rule
    assert "standby.count" in e.fix and "warmstart:models" in e.fix
    # The platform's own model plans as a member (its pool is checked by the platform's stack plan).
    own = plan_on_platform(ModelConfig.model_validate(entry | {"name": "own"}), on, "warmstart:models[0]")
    assert own.pooled is not None and own.pooled.pool == "shared"
