"""VllmModel takes its model as a nested `models[]` entry (`VllmModelArgs.model`, the generated
`ModelEntryArgs`) and plans it through the config model, so no key is mapped by hand:

- every leaf of `ModelEntryArgs`, set to a valid value other than the baseline's, changes the
  plan VllmModel makes, and that plan is the one ServedModel makes for the same entry;
- the deprecated flat keys plan exactly what the same values nested plan, and a key VllmModelArgs
  does not have is an error, never a value silently dropped (a Deployment given
  `maxModelLen: 120` runs with 120 either way);
- ServedModel hands VllmModel its entry as given, nested.
"""

from __future__ import annotations

import copy
import typing
from typing import Any

import pytest
from pydantic import BaseModel, Field, create_model
from pulumi.provider.experimental.util import camel_case
from pydantic.fields import FieldInfo

import components
from components import model_entry, serving
from components import schema as package_schema
from components.model_args import ModelEntryArgs
from components.platform import contract
from components.serving import FLAT_MODEL_KEYS, plan_serving
from tests.support.config_reach import field_values
from tests.support.platforms import KUBECONFIG, PLATFORM
from warmstart import mocks
from warmstart.config import ModelConfig, ModelSpec
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.plan.platform import plan_on_platform

KEY = "ServedModelArgs.model"
TYPES = ["g6e.12xlarge", "g6e.24xlarge"]
# A platform whose defaults are VllmModel's own (loader, compile cache on, no image cache), with
# a second pool for `pool`'s sample. The model is one of the platform's own (a ServedModel of its
# WarmstartStack): only those may join a standby pool (`standby.pool`).
ON = PLATFORM | {"pools": [{"name": "l40s", "instance_types": TYPES, "max_gpus": 64},
                           {"name": "l40s-b", "instance_types": TYPES, "max_gpus": 64}], "models": ["llama"]}
PLATFORM_FACTS = contract(ON)
# What VllmModel is wired with on that platform (what ServedModel wires).
WIRING: dict[str, Any] = {"region": ON["region"], "cluster_mode": ON["cluster_mode"]} | (
    {"non_gpu_placement": PLATFORM_FACTS.non_gpu_placement.args()} if PLATFORM_FACTS.non_gpu_placement.given else {})
# The baseline entry. `nodeCache` is given: its default differs between a model alone (off) and
# on a platform (auto), and the comparison is of the same entry.
BASE: dict[str, Any] = {"name": "llama", "source": "s3://team-models/meta-llama/Llama-3.1-8B-Instruct",
                        "weights_gib": 15.0, "instance_type": "g6e.12xlarge", "pool": "l40s", "node_cache": "off"}
# What a leaf needs beside it to act (the first matching prefix of its dotted path).
CONTEXT: dict[str, dict[str, Any]] = {
    "weights_import.s3": {"weights_import": {"s3": "s3://team-staging/llama-8b"}},
    "weights_import.hugging_face": {"weights_import": {"hugging_face": {
        "repo": "meta-llama/Llama-3.1-8B-Instruct", "revision": "0" * 40}}},
    "autoscaling": {"autoscaling": {"max_replicas": 4}},
    # Standby engines are pods KEDA keeps beside the awake ones: the model must autoscale.
    # A member port is a pooled model's.
    "standby.port": {"autoscaling": {"max_replicas": 2}, "standby": {"pool": "shared"}},
    "standby": {"autoscaling": {"max_replicas": 2}, "standby": {}},
}
# Samples the leaf's type and baseline value give none of (or none that fits the baseline).
SAMPLES: dict[str, list[Any]] = {
    "name": ["qwen"],
    "source": ["s3://team-models/meta-llama/Llama-3.1-8B-Instruct-v2"],
    "weights_gib": [30.0],
    "instance_type": ["g6e.24xlarge"],
    "tensor_parallel_size": [2],
    "image": ["vllm/vllm-openai:v0.33.1"],
    "max_model_len": [8192],
    "compile_cache": [False],
    "extra_args": [["--seed", "7"]],
    "priority_class_name": ["inference-high"],
    "pool": ["l40s-b"],
    "weights_import.s3": ["s3://team-staging/llama-8b-v2"],
    "weights_import.hugging_face.repo": ["meta-llama/Llama-3.1-8B"],
    "weights_import.hugging_face.revision": ["1" * 40],
    "autoscaling.max_replicas": [3],
    "autoscaling.kv_cache_usage_ceiling": [0.8],
    "standby.pool": ["shared"],
}


def _inner(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in typing.get_args(annotation) if (m := _inner(a)) is not None), None)


def _leaves(args: type, model: type[BaseModel], path: str = "") -> list[tuple[str, FieldInfo]]:
    """Every leaf key of the TypedDict `args` (dotted), with the config field it declares."""
    out: list[tuple[str, FieldInfo]] = []
    for name, hint in typing.get_type_hints(args).items():
        key = f"{path}{name}"
        info = model.model_fields[name]
        typed = [t for t in (hint, *typing.get_args(hint)) if typing.is_typeddict(t)]
        inner = _inner(info.annotation)
        out += _leaves(typed[0], inner, f"{key}.") if typed and inner else [(key, info)]
    return out


LEAVES = _leaves(ModelEntryArgs, ModelConfig)


def _set(entry: dict, path: str, value: Any) -> dict:
    out = copy.deepcopy(entry)
    *blocks, last = path.split(".")
    at = out
    for b in blocks:
        at = at.setdefault(b, {})
    at[last] = value
    return out


def _get(entry: dict, path: str, info: FieldInfo) -> Any:
    at: Any = entry
    for part in path.split("."):
        if not isinstance(at, dict) or part not in at:
            return None if info.is_required() else info.default
        at = at[part]
    return at


def _baseline(path: str) -> dict:
    extra = next((v for k, v in CONTEXT.items() if path == k or path.startswith(f"{k}.")), {})
    return BASE | copy.deepcopy(extra)


def _samples(path: str, info: FieldInfo, base: dict) -> list[Any]:
    values = SAMPLES.get(path) or field_values(info, _get(base, path, info))
    assert values, (f"ModelEntryArgs.{path} has no sample value: its type and the baseline give none to "
                    f"derive; add one to SAMPLES in {__name__.replace('.', '/')}.py")
    return values


def _alone(entry: dict):
    return plan_serving({"model": entry, **WIRING})  # type: ignore[typeddict-item]


def _on_platform(entry: dict):
    return plan_on_platform(model_entry.model_config(entry, KEY), PLATFORM_FACTS, KEY)


def test_every_leaf_of_the_entry_is_walked():
    # Leaves inside blocks too (loader, import, routing, autoscaling, standby), not only the top keys.
    paths = [p for p, _ in LEAVES]
    assert {"loader.chunk_bytes", "weights_import.hugging_face.revision", "routing.load_factor",
            "autoscaling.max_replicas", "standby.sleep_level", "pool", "priority_class_name"} <= set(paths)
    assert len(paths) == len(set(paths))
    assert sorted(set(SAMPLES) - set(paths)) == [], "a sample of no leaf"


@pytest.mark.parametrize("context", ["", *CONTEXT])
def test_each_baseline_plans_the_same_alone_and_on_the_platform(context):
    base = _baseline(context) if context else BASE
    assert _alone(base) == _on_platform(base)


@pytest.mark.parametrize("path, info", LEAVES, ids=[p for p, _ in LEAVES])
def test_each_leaf_reaches_the_plan_and_plans_as_on_a_platform(path, info):
    base = _baseline(path)
    before = _alone(base)
    changed = []
    for value in _samples(path, info, base):
        entry = _set(base, path, value)
        try:
            alone = _alone(entry)
        except (ConfigError, ConfigErrors) as err:
            raise AssertionError(f"ModelEntryArgs.{path}={value!r}: VllmModel refused it: {err}") from None
        # One planning of an entry, whichever component is handed it.
        assert alone == _on_platform(entry), f"ModelEntryArgs.{path}={value!r}"
        changed.append(alone != before)
    assert any(changed), (
        f"ModelEntryArgs.{path} set to {_samples(path, info, base)} changes nothing VllmModel plans: a key "
        "of the entry VllmModel takes and does not read. It reads the entry through the config model "
        "(components/model_entry.py model_spec) into plan_model (warmstart/plan/model.py): wire the field there")


# --------------------------------------------------------------------------------------
# The deprecated flat keys


FLAT_OF = {v: k for k, v in FLAT_MODEL_KEYS.items()}


def _flat(entry: dict) -> dict:
    return {FLAT_OF[k]: v for k, v in entry.items()} | WIRING


def test_the_flat_keys_are_a_frozen_alias_of_entry_keys():
    entry_keys = set(typing.get_type_hints(ModelEntryArgs))
    assert set(FLAT_MODEL_KEYS.values()) <= entry_keys
    args_keys = set(components.VllmModelArgs.__annotations__)
    assert set(FLAT_MODEL_KEYS) <= args_keys and "model" in args_keys
    # Beside `model` and the frozen aliases, VllmModelArgs holds wiring only: no key re-declares a
    # field of the config model (a new model key is the entry's, reaching VllmModel with it).
    wiring = args_keys - set(FLAT_MODEL_KEYS) - {"model"}
    assert sorted(wiring & set(ModelConfig.model_fields)) == []
    # Each flat key is documented as deprecated, naming the key of `model` it is folded into.
    inputs = package_schema.analyze()["component_definitions"]["VllmModel"].inputs
    for flat, key in FLAT_MODEL_KEYS.items():
        described = inputs[camel_case(flat)].description or ""
        assert described.startswith(f"Deprecated: `model.{camel_case(key)}`"), (flat, described)


@pytest.mark.parametrize("path, info", [(p, i) for p, i in LEAVES if p.split(".")[0] in FLAT_OF],
                         ids=[p for p, _ in LEAVES if p.split(".")[0] in FLAT_OF])
def test_the_flat_keys_plan_what_the_same_values_nested_plan(path, info):
    base, wired = _baseline(path), dict(WIRING)
    if "autoscaling" in base:
        # Flat, an autoscaler is wired (`autoscaled`), not declared; the same for both.
        del base["autoscaling"]
        wired["autoscaled"] = True
    assert set(base) <= set(FLAT_OF)
    for value in [_get(base, path, info), *_samples(path, info, base)]:
        entry = _set(base, path, value)
        nested = plan_serving({"model": entry, **wired})  # type: ignore[typeddict-item]
        assert plan_serving(_flat(entry) | wired) == nested, f"{path}={value!r}"  # type: ignore[arg-type]


def _deployment(args: dict) -> dict:
    built: dict = {}
    args = args | {"kubeconfig": KUBECONFIG}
    resources = mocks.run(lambda: built.setdefault("m", components.VllmModel("llama", args)),  # type: ignore[arg-type]
                          region="us-east-1", stack="alone")
    (dep,) = [r.inputs for r in resources if r.typ == "kubernetes:apps/v1:Deployment"]
    return dep


def test_a_value_given_flat_or_nested_reaches_the_pod():
    """The 120 a program passes is the pod's 120, whichever way it is written."""
    entry = BASE | {"max_model_len": 120}
    for args in ({"model": entry, **WIRING}, _flat(entry)):
        (c,) = [c for c in _deployment(args)["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
        assert "--max-model-len=120" in c["args"], c["args"]


@pytest.fixture
def probe_spec(monkeypatch) -> list[ModelSpec]:
    """The config model plus the int `throwaway_seconds` (default 60), as VllmModel reads its
    entry; the specs VllmModel hands the planner are recorded."""
    probe = create_model("ModelSpec", __base__=ModelSpec,
                         throwaway_seconds=(int, Field(60, description="A throw-away option.")))
    monkeypatch.setattr(model_entry, "ModelSpec", probe)
    seen: list[ModelSpec] = []
    real = serving.plan_model

    def recording(spec, **kw):
        seen.append(spec)
        return real(spec, **kw)

    monkeypatch.setattr(serving, "plan_model", recording)
    return seen


def test_a_key_added_to_the_entry_reaches_the_planner_nested_and_is_refused_flat(probe_spec):
    plan_serving({"model": BASE | {"throwaway_seconds": 120}, **WIRING})  # type: ignore[typeddict-item]
    assert [getattr(s, "throwaway_seconds") for s in probe_spec] == [120]
    # Flat, it is no key of VllmModelArgs: refused by name, never planned at the default 60.
    with pytest.raises(ConfigError, match=r"VllmModelArgs\.throwawaySeconds: is no key of VllmModelArgs"):
        plan_serving(_flat(BASE) | {"throwaway_seconds": 120})  # type: ignore[arg-type]
    assert len(probe_spec) == 1


@pytest.mark.parametrize("args, key, words", [
    # Errors are keyed as the program wrote the key: flat, or under `model`.
    (_flat(BASE | {"tensor_parallel_size": 8}), "VllmModelArgs.tensorParallelSize", "needs 8 GPUs"),
    ({"model": BASE | {"tensor_parallel_size": 8}, **WIRING}, "VllmModelArgs.model.tensorParallelSize", "needs 8 GPUs"),
    (_flat({k: v for k, v in BASE.items() if k != "name"}), "VllmModelArgs.modelName", "required"),
    ({"model": {k: v for k, v in BASE.items() if k != "name"}, **WIRING}, "VllmModelArgs.model.name", "required"),
    (_flat(BASE) | {"node_pool": ""}, "VllmModelArgs.nodePool", "NodePool"),
    ({"model": BASE | {"weights_import": {"s3": BASE["source"]}}, **WIRING}, "VllmModelArgs.model.weightsImport.s3",
     "overlaps"),
    (_flat(BASE | {"weights_import": {"s3": BASE["source"]}}), "VllmModelArgs.weightsImport.s3", "overlaps"),
    ({"model": {k: v for k, v in BASE.items() if k != "instance_type"}, **WIRING},
     "VllmModelArgs.model.instanceType", "no pool whose instance types"),
    ({"model": BASE | {"source": "meta-llama/Llama-3.1-8B-Instruct"}, **WIRING}, "VllmModelArgs.model.source",
     "must be s3://bucket/prefix"),
    ({"model": BASE, "replicas": 2, **WIRING}, "VllmModelArgs.replicas", "read only without `model`"),
    (WIRING, "VllmModelArgs.model", "is required"),
])
def test_bad_args_are_named_by_the_key_as_written(args, key, words):
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        plan_serving(args)
    found = err.value.errors if isinstance(err.value, ConfigErrors) else [err.value]
    assert any(e.key == key and words in str(e) for e in found), [str(e) for e in found]


def test_a_model_alone_without_a_pool_lands_on_any_node_of_its_type():
    entry = {k: v for k, v in BASE.items() if k != "pool"}
    plan = _alone(entry)
    assert plan.pool is None and plan == plan_serving(_flat(entry))  # type: ignore[arg-type]
    # Its node cache stays off unless asked for; asked for, it needs a pool.
    assert plan.load is not None and plan.load.mode == "off"
    assert _alone({k: v for k, v in entry.items() if k != "node_cache"}).load.mode == "off"


# --------------------------------------------------------------------------------------
# ServedModel hands VllmModel its entry


def test_served_model_hands_vllm_model_its_entry_nested(monkeypatch):
    handed: list[dict] = []
    real = components.served_model.VllmModel

    def recording(name, args, *a, **kw):
        handed.append(dict(args))
        return real(name, args, *a, **kw)

    monkeypatch.setattr(components.served_model, "VllmModel", recording)
    entry = BASE | {"autoscaling": {"max_replicas": 2}, "routing": {"policy": "round_robin"}}
    platform = ON | {"monitoring": {"server_address": "https://prometheus"}}
    built: dict = {}
    mocks.run(lambda: built.setdefault("s", components.ServedModel("research-llama", {"model": entry,
                                                                                        "platform": platform})),
              region="us-east-1", stack="alone")
    (args,) = handed
    assert args["model"] == entry and not set(args) & set(FLAT_MODEL_KEYS)
    served = built["s"]
    # The one plan of the model: the VllmModel holds ServedModel's, the entry's routing and autoscaling in it.
    assert served.model.plan == served.plan and served.plan.autoscaling is not None
    assert served.plan == _alone(entry)
