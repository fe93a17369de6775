"""One planning path: a model entry planned inline by its stack (`plan_stack`) and planned by
ServedModel on that stack's PlatformArgs (`plan_on_platform`) decide the same, for the shipped
stacks and for generated model entries."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.stacks import STACK_NAMES, load_stack_doc
from tests.support.strategies import config_entries, key_paths
from warmstart import config
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.plan import platform
from warmstart.plan.stack import plan_stack

# What a program adds to the plan-derived facts (resource outputs); no decision reads them.
WIRED = {"vpc_cidrs": ["10.0.0.0/16"], "service_cidr": "172.20.0.0/16",
         "oidc_provider_arn": "arn:aws:iam::123456789012:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/ABC",
         "oidc_issuer": "oidc.eks.us-east-1.amazonaws.com/id/ABC",
         "compile_cache_bucket": "cache"}


def _both(doc: dict, stack: str):
    cfg = config.from_pulumi_config({k: v if isinstance(v, str) else __import__("json").dumps(v)
                                     for k, v in doc["config"].items()})
    plan = plan_stack(cfg, stack)
    facts = platform.from_args(platform.platform_facts(plan) | WIRED | (
        {"monitoring": {"server_address": "https://prometheus"}} if platform.plan_runs_autoscaling(plan) else {}))
    served = [platform.plan_on_platform(spec, facts, "ServedModelArgs.model") for spec in plan.config.models]
    return list(plan.models), served


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_the_shipped_stacks_models_plan_the_same_either_way(stack):
    inline, served = _both(load_stack_doc(stack), stack)
    assert served == inline


# Every key of a `models[]` entry is drawn, from its type (tests/support/strategies.py), so a new
# key is in the property without an edit here; these replace a key's strategy where the stack's
# rules would refuse most draws (the pool is the generated stack's one, its types in the GPU table).
OVERRIDES = {
    "name": st.sampled_from(["m", "llama", "qwen-7b"]),
    "source": st.sampled_from(["team/m", "org/model-a"]),
    "weightsGiB": st.floats(min_value=0.5, max_value=120, allow_nan=False),
    "pool": st.just("gpu"),
    "instanceType": st.sampled_from(["g6e.2xlarge", "g6e.12xlarge", "p5.48xlarge"]),
    "tensorParallelSize": st.sampled_from(["auto", 1, 2, 4, 8]),
    "replicas": st.integers(min_value=0, max_value=4),
    "maxModelLen": st.integers(min_value=1, max_value=131072),
    "image": st.sampled_from(["vllm/vllm-openai:v0.33.0", "vllm/vllm-openai:v0.33.1"]),
    # Free text: arguments vLLM takes that warmstart does not manage.
    "extraArgs": st.sampled_from([[], ["--seed", "7"]]),
    "loader.chunkBytes": st.integers(min_value=2**29, max_value=2**33),
    "import": st.sampled_from([{"s3": "s3://registry-bucket/weights"},
                               {"huggingFace": {"repo": "org/model-a", "revision": "0" * 40}}]),
    # maxReplicas above minReplicas (KEDA must have room), minReplicas 0 only with standby.
    "autoscaling.maxReplicas": st.integers(min_value=2, max_value=4),
    "autoscaling.minReplicas": st.just(1),
    "priorityClassName": st.sampled_from(["inference-high", "batch"]),
    # Per-model standby: the generated stack has no standby pool (tests/standby_pool/ plans those).
    "standby.pool": st.none(),
    "standby.port": st.none(),
}
# The generated pool has several instance types: an entry must name one.
ALWAYS = frozenset({"instanceType"})
ENTRIES = config_entries(config.ModelConfig, OVERRIDES, always=ALWAYS)


def test_every_override_is_a_key_of_a_model_entry():
    assert sorted((set(OVERRIDES) | ALWAYS) - key_paths(config.ModelConfig)) == []


# derandomize: the share of entries that plan varies with the seed (45 to 80 of 150 seen), and a
# threshold on a random share is a flaky test; a fixed seed keeps the guard meaningful and stable.
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(entry=ENTRIES, mode=st.sampled_from(["auto", "karpenter"]))
def _plan_the_same(planned: list[bool], entry: dict, mode: str) -> None:
    doc = copy.deepcopy(load_stack_doc("dev"))
    c = doc["config"]
    c["warmstart:clusterMode"] = mode
    c["warmstart:gpuPools"] = [{"name": "gpu", "instanceTypes": ["g6e.2xlarge", "g6e.12xlarge", "p5.48xlarge"],
                                "maxGpus": 64}]
    c["warmstart:models"] = [entry]
    try:
        inline, served = _both(doc, "generated")
    except (ConfigError, ConfigErrors):
        # A broken combination (eager with TP > 1, too big for the type, ...): the stack refuses
        # it before a component sees it; nothing to compare.
        planned.append(False)
        return
    planned.append(True)
    assert served == inline


def test_generated_model_entries_plan_the_same_either_way():
    planned: list[bool] = []
    _plan_the_same(planned)
    # Plans are compared only for entries that plan: most must, or the property says little.
    assert sum(planned) >= len(planned) // 3, f"only {sum(planned)} of {len(planned)} generated entries planned"
