"""components/section_args.py is what components/model_args_gen.py makes of the stack config's
platform sections: current, key for key, readable by Pulumi's schema inference, apart from the
components' hand-written Args (every component's, found by walking components/: none re-declares
a field of a section it takes nested, none copies a config model), and read back by Network,
Cluster, ModelStorage and Monitoring as the config model it came from."""

from __future__ import annotations

import ast
import importlib
import inspect
import typing

import pulumi
import pytest
from pulumi.provider.experimental.analyzer import Analyzer
from pydantic import BaseModel

from components import cluster as cluster_component
from components import model_args, model_args_gen, routing, section_args, serving, standby
from components.cluster import ClusterArgs
from components.sections import nested_section, section_config, section_entry
from tests.support.model_entry import args_gaps
from tests.support.stacks import ALL_STACK_NAMES, MODEL_STACK_NAMES, STACKS_DIR
from warmstart import config
from warmstart.config import ClusterConfig, GpuPool, NetworkConfig
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.plan import platform_rules

# Each section and the TypedDict generated for it.
SECTIONS = {m: getattr(section_args, model_args_gen.section_name(m)) for m in model_args_gen.SECTIONS}
# Keys the Args once had for a section's field under another name (still read, deprecated, never
# declared again).
RENAMED = {routing.ModelRouterArgs: {"expose": "internal_load_balancer"},
           standby.ModelStandbyArgs: {k: v for k, v in standby.FLAT_AUTOSCALING.items() if k != v}}
# Keys an Args still declares beside the section that holds their field: VllmModel's frozen
# deprecated flat model keys (removed in 2.0.0, docs/upgrading.md).
FROZEN = {serving.VllmModelArgs: frozenset(serving.FLAT_MODEL_KEYS)}
POOL = {"name": "l40s", "instance_types": ["g6e.2xlarge"]}
# The shipped stacks that have a platform (and so these sections).
ENVIRONMENTS = [s for s in ALL_STACK_NAMES if s not in MODEL_STACK_NAMES]


def _cluster(**extra) -> ClusterArgs:
    return {"cluster_name": "unit", "mode": "karpenter", "region": "us-east-1", "vpc_id": "vpc-0123456789abcdef0",
            "private_subnet_ids": ["subnet-0a"], "gpu_pools": [dict(POOL)], **extra}  # type: ignore[typeddict-item]


@pytest.fixture
def warned(monkeypatch) -> list[str]:
    import pulumi

    seen: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, resource=None, **_: seen.append(msg))
    return seen


def test_the_generated_file_is_the_generators_output():
    assert model_args_gen.SECTIONS_TARGET.read_text() == model_args_gen.source(model_args_gen.sections_target()), (
        "components/section_args.py is stale (a platform section of warmstart.config changed since it was "
        "generated): regenerate it with `python -m tests.golden` and commit it")


@pytest.mark.parametrize("model", list(SECTIONS), ids=lambda m: m.__name__)
def test_every_section_field_is_a_key_and_every_key_a_field(model):
    assert args_gaps(model, SECTIONS[model]) == []


def test_a_section_field_without_its_key_is_named_with_the_file_to_regenerate():
    from pydantic import Field, create_model

    probe = create_model("NetworkConfig", __base__=NetworkConfig,
                         throwaway_probe=(bool, Field(False, description="A throw-away option.")))
    gaps = args_gaps(probe, section_args.NetworkSectionArgs)
    assert gaps == [f"NetworkConfig.throwaway_probe (`throwawayProbe`) is missing from components/section_args.py "
                    "(NetworkSectionArgs); regenerate it with `python -m tests.golden`"]
    assert "    throwaway_probe: NotRequired[bool]" in model_args_gen.source(model_args_gen.Target(
        model_args_gen.SECTIONS_TARGET, model_args_gen.SECTIONS_HEADER, (probe,), model_args_gen.section_name,
        lambda m: ""))


def _closure(roots, children, skip=()) -> list[type]:
    """`roots` and everything `children` reaches from them, each once, in the order first met
    (breadth first); nothing in `skip` is entered."""
    found: list[type] = []
    todo = list(roots)
    while todo:
        t = todo.pop(0)
        if t in found or t in skip:
            continue
        found.append(t)
        todo += children(t)
    return found


def _reachable(roots) -> list[type[BaseModel]]:
    """The config models `roots` are, and those their fields nest, at every depth."""
    from tests.support.model_entry import _models_in

    return _closure(roots, lambda m: [x for info in m.model_fields.values() for x in _models_in(info.annotation)])


def _reachable_typeddicts(roots, skip=()) -> list[type]:
    """The TypedDicts `roots` are, and those their keys nest, at every depth (none in `skip`)."""
    return _closure(roots, lambda t: [x for a in t.__annotations__.values() for x in _typeddicts(a)], skip)


def _generated_models() -> dict[type, type[BaseModel]]:
    """Each generated TypedDict (components/model_args.py, section_args.py) and the config model it
    is generated from."""
    entries = {getattr(model_args, model_args_gen.args_name(m)): m for m in _reachable([config.ModelConfig])}
    return entries | {getattr(section_args, model_args_gen.section_name(m)): m
                      for m in _reachable(model_args_gen.SECTIONS)}


def _typeddicts(annotation) -> list[type]:
    from tests.support.model_entry import _typeddicts_in

    return _typeddicts_in(annotation)


def _hand_args() -> list[type]:
    """Every hand-written TypedDict in components/ that is a component's Args (the `args` of each
    ComponentResource's __init__, hosted or not) or nested in one, found by walking the modules:
    no list to keep."""
    generated = set(_generated_models())
    roots = []
    for path in sorted(model_args_gen.HERE.glob("*.py")):
        module = importlib.import_module(f"components.{path.stem}")
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, pulumi.ComponentResource) and obj.__module__ == module.__name__:
                args = obj.__init__.__annotations__.get("args")
                if typing.is_typeddict(args):
                    roots.append(args)
    return _reachable_typeddicts(roots, skip=generated)


HAND_ARGS = _hand_args()


def _sections_taken(args: type) -> list[type[BaseModel]]:
    """The config models whose generated Args `args` holds nested (its keys' types)."""
    generated = _generated_models()
    return [generated[t] for a in args.__annotations__.values() for t in _typeddicts(a) if t in generated]


def test_the_hand_args_are_every_components_and_the_sections_they_take_are_read_from_their_types():
    from components.__main__ import HOSTED

    hosted = {c.__init__.__annotations__["args"] for c in HOSTED}
    assert hosted <= set(HAND_ARGS), "every hosted component's Args is checked"
    taken = {a.__name__: {m.__name__ for m in _sections_taken(a)} for a in HAND_ARGS}
    # A sample of what the types say, so the derivation cannot go quietly blind.
    assert taken["ModelStandbyArgs"] == {"StandbyConfig", "AutoscalingConfig"}
    assert taken["MonitoringArgs"] == {"MonitoringConfig"}
    assert taken["ClusterArgs"] == {"ClusterConfig", "GpuPool"}
    assert taken["VllmModelArgs"] == taken["ServedModelArgs"] == {"ModelConfig"}


@pytest.mark.parametrize("args", HAND_ARGS, ids=lambda a: a.__name__)
def test_no_component_args_redeclares_a_field_of_its_section(args):
    """The one declaration of a section's field is the config model's: the Args that take the
    section hold it nested, and no key of theirs is a field of it (which the deprecated flat
    spelling would also misread as the section's)."""
    sections = _sections_taken(args)
    keys = (set(args.__annotations__) - FROZEN.get(args, frozenset())) | set(RENAMED.get(args, {}))
    assert {f"{m.__name__}.{k}" for m in sections for k in keys & set(m.model_fields)} == set(), (
        f"{args.__name__} ({args.__module__.replace('.', '/')}.py) declares a field of a section it takes nested: "
        "remove the key (read it flat as a deprecated alias, as components/sections.py nested_section does)")
    # A field of the section under another name: declared again by hand, whatever its key.
    assert not set(args.__annotations__) & set(RENAMED.get(args, {}))
    assert all(any(f in m.model_fields for m in sections) for f in RENAMED.get(args, {}).values())


def _config_models() -> set[type[BaseModel]]:
    from warmstart.plan import platform_args

    return _reachable([config.StackConfig, config.ModelStackConfig, platform_args.PlatformArgsSpec])


def _held_by_hand_check() -> set[tuple[type, type]]:
    """(TypedDict, model) pairs another test holds key for key: PlatformArgs and its nested types
    against PlatformArgsSpec's (tests/platform/test_platform.py, tests/support/hand_args.py), and
    the types of VllmModel's frozen flat keys (tests/serving/test_vllm_model_entry.py)."""
    from components.platform import PlatformArgs
    from warmstart.plan import platform_args

    platform = _reachable_typeddicts([PlatformArgs])
    frozen = _reachable_typeddicts([t for k, a in serving.VllmModelArgs.__annotations__.items()
                                    if k in serving.FLAT_MODEL_KEYS for t in _typeddicts(a)])
    return ({(t, m) for t in platform for m in _reachable([platform_args.PlatformArgsSpec, config.ScraperPodsConfig])}
            | {(t, m) for t in frozen for m in _reachable([config.ModelConfig])})


@pytest.mark.parametrize("args", HAND_ARGS, ids=lambda a: a.__name__)
def test_no_hand_args_copies_a_config_model(args):
    """A hand-written TypedDict with every field of a config model (two or more) is that model
    declared a second time: generate it (components/model_args_gen.py) and take it nested, unless
    another test holds the copy key for key (PlatformArgs' family, VllmModel's frozen flat keys)."""
    keys, held = set(args.__annotations__), _held_by_hand_check()
    copied = [m for m in _config_models()
              if len(m.model_fields) >= 2 and set(m.model_fields) <= keys and (args, m) not in held]
    assert copied == [], (
        f"{args.__name__} ({args.__module__.replace('.', '/')}.py) re-declares every field of "
        f"{[m.__name__ for m in copied]}: add the model to components/model_args_gen.py's SECTIONS (or take a "
        "model entry's section from components/model_args.py) and nest it")


def test_schema_inference_reads_the_sections_as_types_of_the_components():
    from components.__main__ import HOSTED, PACKAGE

    analyzer = Analyzer(PACKAGE)
    result = analyzer.analyze(HOSTED)
    types = result["type_definitions"]
    generated = {n.name for n in ast.walk(ast.parse(model_args_gen.source(model_args_gen.sections_target())))
                 if isinstance(n, ast.ClassDef)}
    assert generated <= set(types)
    assert [f"{n}.{k}" for n in generated for k, p in types[n].properties.items() if not p.description] == []
    inputs = {c.name: c.inputs for c in result["component_definitions"].values()}
    assert inputs["Network"]["network"].ref.endswith(":NetworkSectionArgs")
    assert inputs["Cluster"]["cluster"].ref.endswith(":ClusterSectionArgs")
    assert inputs["Cluster"]["gpuPools"].items.ref.endswith(":GpuPoolSectionArgs")
    assert inputs["ModelStorage"]["modelBucket"].ref.endswith(":ModelBucketSectionArgs")
    # The component's own name for the nodes' tags, not the stack config's `tags`.
    assert "nodeTags" in inputs["Cluster"] and "tags" not in inputs["Cluster"]
    # A datetime is its ISO 8601 text, an integer Literal an integer.
    assert types["CapacityBlockSectionArgs"].properties["endsAt"].type.value == "string"
    assert types["ClusterSectionArgs"].properties["logRetentionDays"].type.value == "integer"


def test_generated_names_are_apart_from_the_components_types_and_each_other():
    existing = model_args_gen.existing_type_names()
    sections = {n.name for n in ast.walk(ast.parse(model_args_gen.SECTIONS_TARGET.read_text()))
                if isinstance(n, ast.ClassDef)}
    entries = {n.name for n in ast.walk(ast.parse(model_args_gen.TARGET.read_text())) if isinstance(n, ast.ClassDef)}
    assert {"ClusterArgs", "NetworkArgs", "ModelStorageArgs", "PoolModelArgs"} <= existing
    # One TypedDict per section and per model nested in one, none named like another type.
    assert sections == {model_args_gen.section_name(m) for m in _reachable(model_args_gen.SECTIONS)}
    assert not existing & sections and not entries & sections



def test_a_literal_of_mixed_kinds_is_refused():
    with pytest.raises(model_args_gen.Unsupported, match="X.y: Literal"):
        model_args_gen.type_of(typing.Literal[1, "a"], None, "X.y", [], model_args_gen.sections_target())


@pytest.mark.parametrize("stack", ENVIRONMENTS)
def test_every_shipped_sections_entry_reads_back_as_the_section(stack):
    cfg = config.from_pulumi_config(config.read_stack_file(config.stack_file(STACKS_DIR, stack)))
    sections = [cfg.network, cfg.cluster, cfg.model_bucket, cfg.compile_cache_bucket, cfg.monitoring, *cfg.gpu_pools]
    assert {type(s) for s in sections} == set(model_args_gen.SECTIONS)
    for section in sections:
        back = section_config(type(section), section_entry(section), "Args.section")
        assert back == section and back.model_fields_set == section.model_fields_set


def test_a_capacity_block_reads_back_from_its_iso_text():
    pool = GpuPool.model_validate({"name": "p5", "instanceTypes": ["p5.48xlarge"], "capacity": {
        "types": ["reserved"], "reservations": [{"id": "cr-0123456789abcdef0"}],
        "capacityBlock": {"endsAt": "2031-03-01T11:30:00Z"}}})
    entry = section_entry(pool)
    assert entry["capacity"]["capacity_block"]["ends_at"] == "2031-03-01T11:30:00Z"
    assert section_config(GpuPool, entry, "ClusterArgs.gpuPools[0]") == pool


def test_a_sections_errors_are_keyed_in_the_schemas_names():
    with pytest.raises(ConfigErrors) as err:
        cluster_component.plan(_cluster(
            cluster={"log_retention_days": 10},
            gpu_pools=[POOL | {"ephemeral_storage_gib": 0}]))
    assert {e.key for e in err.value.errors} == {"ClusterArgs.cluster.logRetentionDays"}
    with pytest.raises(ConfigErrors) as err:
        cluster_component.plan(_cluster(gpu_pools=[POOL | {"ephemeral_storage_gib": 0}]))
    assert {e.key for e in err.value.errors} == {"ClusterArgs.gpuPools[0].ephemeralStorageGib"}


def test_the_flat_keys_of_before_read_as_the_section_with_a_warning(warned):
    nested = cluster_component.plan(_cluster(cluster={"admins": ["arn:aws:iam::123456789012:role/ops"],
                                                      "log_retention_days": 30}))
    assert warned == []
    flat = cluster_component.plan(_cluster(admins=["arn:aws:iam::123456789012:role/ops"], log_retention_days=30))
    assert flat == nested and flat.log_retention_days == 30
    assert len(warned) == 1 and "admins, logRetentionDays" in warned[0] and "`cluster`" in warned[0]


def test_a_key_given_flat_and_the_section_too_is_refused():
    with pytest.raises(ConfigError) as err:
        nested_section(ClusterConfig, _cluster(admins=[], cluster={"viewers": []}), "cluster", "ClusterArgs")
    assert err.value.key == "ClusterArgs.admins" and "cluster" in err.value.fix


def _model(**extra) -> dict:
    return {"name": "llama", "instance_type": "g6e.2xlarge", "tensor_parallel_size": 1, "replicas": 3, **extra}


def test_pool_models_size_their_pool_as_a_pools_models_did(warned):
    by_pool = cluster_component.plan(_cluster(pool_models=[_model(pool="l40s")]))
    assert warned == []
    legacy = cluster_component.plan(_cluster(gpu_pools=[POOL | {"models": [_model()]}]))
    alone = cluster_component.plan(_cluster())
    assert by_pool == legacy and by_pool.pools[0].max_gpus > alone.pools[0].max_gpus
    assert len(warned) == 1 and "gpuPools[0].models" in warned[0]


def test_a_pool_model_on_no_pool_is_refused():
    with pytest.raises(ConfigError) as err:
        cluster_component.plan(_cluster(pool_models=[_model(pool="h100")]))
    assert err.value.key == "ClusterArgs.poolModels[0].pool" and "l40s" in err.value.fix
    # The one rule every model meeting its pools is checked by (warmstart/plan/platform_rules.py),
    # in the words of the Args the fix edits.
    side = platform_rules.cluster_component("unit")
    assert (err.value.rule, err.value.fix) == platform_rules.pool_problem("h100", ["l40s"], "k", side)[1:3]
    assert "ClusterArgs.gpuPools" in err.value.fix


def test_the_derived_system_size_applies_only_where_the_section_leaves_it_unset():
    derived = cluster_component.plan(_cluster(system_node_group_size=4))
    assert derived.system_node_group is not None and derived.system_node_group.size == 4
    own = cluster_component.plan(_cluster(cluster={"system_node_group": {"size": 3}}, system_node_group_size=4))
    assert own.system_node_group is not None and own.system_node_group.size == 3


def test_node_tags_were_once_tags(warned):
    tags = {"team": "ml"}
    assert cluster_component.node_tags(_cluster(node_tags=tags)) == tags and warned == []
    assert cluster_component.node_tags(_cluster(tags=tags)) == tags and len(warned) == 1
    with pytest.raises(ConfigError) as err:
        cluster_component.node_tags(_cluster(tags=tags, node_tags=tags))
    assert err.value.key == "ClusterArgs.tags"
