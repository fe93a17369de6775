"""The rules of a model meeting its platform (warmstart/plan/platform_rules.py): an environment
stack's inline model, a model stack's model and a program's ServedModel break each rule with one
message, worded with the keys each one's user edits."""

from __future__ import annotations

import pytest

from tests.support.platforms import PLATFORM
from warmstart import config
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.plan import platform, platform_rules
from warmstart.plan import stack as plan_stack

ENV = "env"
MODEL_STACK = "env-a"
POOL = {"name": "l40s", "instanceTypes": ["g6e.2xlarge"], "maxGpus": 8}
MODEL = {"name": "a", "source": "org/a", "weightsGiB": 15, "pool": "l40s", "nodeCache": "off"}
# What a program adds to a platform's plan-made facts (platform.platform_facts).
RESOURCES = {k: PLATFORM[k] for k in ("vpc_cidrs", "service_cidr", "oidc_provider_arn", "oidc_issuer")}
MONITORING = {"server_address": "https://prometheus.example/api/v1"}


def _env(models: list[dict], pool: dict | None = None, **more) -> dict:
    return {"clusterMode": "auto", "region": "us-east-1", "gpuPools": [POOL | (pool or {})], "models": models} | more


def _errors(call) -> list[ConfigError]:
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        call()
    e = err.value
    return e.errors if isinstance(e, ConfigErrors) else [e]


def _inline(model: dict, pool: dict | None = None) -> ConfigError:
    """The error of `model` inline in the environment, keyed `warmstart:models[0]...`."""
    (e,) = [e for e in _errors(lambda: plan_stack.plan_stack(config.parse_config(_env([model], pool)), ENV))
            if e.key.startswith(f"{config.NAMESPACE}:models[0]")]
    return e


def _contract(pool: dict | None = None, **more) -> platform.Contract:
    """The environment with no model of its own, as its model stacks read it."""
    plan = plan_stack.plan_stack(config.parse_config(_env([], pool, **more)), ENV)
    monitoring = MONITORING if platform.plan_runs_autoscaling(plan) else None
    return platform.from_args(platform.platform_facts(plan) | RESOURCES | {"monitoring": monitoring})


def _on_platform(model: dict, contract: platform.Contract) -> list[ConfigError]:
    cfg = config.ModelStackConfig.model_validate({"platform": ENV, "model": model})
    return _errors(lambda: platform.plan_model_stack(cfg, contract, MODEL_STACK))


def _one(errors: list[ConfigError], suffix: str, prefix: str = f"{config.NAMESPACE}:model") -> ConfigError:
    (e,) = [e for e in errors if e.key == prefix + suffix]
    return e


def _template(e: ConfigError, side: platform_rules.Side) -> tuple[str, str]:
    """The rule and fix with the words of the side's keys taken out: what is left is the rule's own."""
    def out(text: str) -> str:
        for words, mark in ((side.pools, "<pools>"), (side.keda, "<keda>"), (side.staging, "<staging>"),
                            (side.platform, "<platform>")):
            text = text.replace(words, mark)
        return text.removeprefix(side.who)
    return out(e.rule), out(e.fix)


ENV_SIDE = platform_rules.environment(ENV)
MODEL_STACK_SIDE = platform_rules.model_stack(MODEL_STACK, ENV)


@pytest.mark.parametrize(("model", "pool", "suffix"), [
    (MODEL | {"pool": "a100"}, None, ".pool"),
    (MODEL, {"capacity": {"types": ["spot", "onDemand"]}}, ".replicas"),
    (MODEL | {"autoscaling": {"minReplicas": 1, "maxReplicas": 2}}, {"capacity": {"types": ["spot", "onDemand"]}},
     ".autoscaling.minReplicas"),
])
def test_an_inline_model_and_a_model_stack_break_a_rule_with_one_message(model, pool, suffix):
    inline = _inline(model, pool)
    assert inline.key == f"{config.NAMESPACE}:models[0]{suffix}"
    stacked = _one(_on_platform(model, _contract(pool, modelStacks={"autoscaling": True})), suffix)
    assert _template(inline, ENV_SIDE) == _template(stacked, MODEL_STACK_SIDE)
    assert inline.value == stacked.value
    # Each names the keys its own user edits: the stack's gpuPools, or the platform stack's file.
    assert f"{config.NAMESPACE}:gpuPools" in inline.fix and "stacks/Pulumi.env.yaml" not in inline.fix
    assert "stacks/Pulumi.env.yaml" in stacked.fix and f"'{MODEL_STACK}'" in stacked.rule


@pytest.mark.parametrize(("model", "suffix", "turn_on"), [
    (MODEL | {"autoscaling": {"minReplicas": 1, "maxReplicas": 2}}, ".autoscaling", "modelStacks: {autoscaling: true}"),
    (MODEL | {"nodeCache": "on"}, ".nodeCache", "modelStacks: {nodeCache: true}"),
])
def test_what_a_platform_does_not_run_is_one_rule_for_a_model_stack_and_a_program(model, suffix, turn_on):
    """An environment runs KEDA and node-feature-discovery for its own models, so the inline model
    plans; on that platform without them, a model stack's model and a ServedModel's are refused
    by one rule, whose fix names what each one's user sets."""
    plan = plan_stack.plan_stack(config.parse_config(_env([model])), ENV)
    assert plan.models[0].name == "a"
    contract = _contract()
    stacked = _one(_on_platform(model, contract), suffix)
    assert turn_on in stacked.fix and "stacks/Pulumi.env.yaml" in stacked.fix
    key = "ServedModelArgs.model"
    spec = config.ModelConfig.model_validate(model)
    served = _one(_errors(lambda: platform.check_platform_runs(platform.plan_on_platform(spec, contract, key),
                                                               contract, key)), suffix, key)
    program = platform_rules.program(ENV, "ServedModelArgs.platform")
    assert _template(stacked, MODEL_STACK_SIDE) == _template(served, program)
    assert "ServedModelArgs.platform." in served.fix
