"""components/model_args.py is what components/model_args_gen.py makes of `ModelConfig`: current,
key for key, readable by Pulumi's schema inference, and validated back into a `ModelConfig`."""

from __future__ import annotations

import ast

import pytest
from pulumi.provider.experimental.analyzer import Analyzer

from components import model_args_gen
from components.model_args import ModelEntryArgs
from components.model_entry import model_config
from tests.support.model_entry import args_gaps
from warmstart.config import ModelConfig
from warmstart.errors import ConfigErrors

HF_REVISION = "0e9e39f249a16976918f6564b8830bc894c89659"


def test_the_generated_file_is_the_generators_output():
    assert model_args_gen.TARGET.read_text() == model_args_gen.source(), (
        "components/model_args.py is stale (warmstart.config.ModelConfig changed since it was generated): "
        "regenerate it with `python -m tests.golden` and commit it")


def test_every_model_field_is_a_key_and_every_key_a_field():
    assert args_gaps(ModelConfig, ModelEntryArgs) == []


def test_schema_inference_reads_every_key_with_its_description():
    """Analyzed as the package's other types are (their names must not collide with these)."""
    from components.__main__ import HOSTED, PACKAGE

    analyzer = Analyzer(PACKAGE)
    analyzer.analyze(HOSTED)
    props, mapping = analyzer.analyze_type(ModelEntryArgs, is_component_output=False)
    assert set(mapping.values()) == set(ModelConfig.model_fields)
    assert [k for k, p in props.items() if not p.description] == []
    nested = {n: t for n, t in analyzer.type_definitions.items() if n.startswith("ModelEntry")}
    # ModelEntryArgs itself is ServedModel's `model` input.
    assert set(nested) == {"ModelEntryArgs", "ModelEntryLoaderArgs", "ModelEntryWeightsImportArgs", "ModelEntryHuggingFaceArgs",
                           "ModelEntryRoutingArgs", "ModelEntryAutoscalingArgs", "ModelEntryStandbyArgs"}
    assert [f"{n}.{k}" for n, t in nested.items() for k, p in t.properties.items() if not p.description] == []
    assert props["weightsImport"].ref.endswith(":ModelEntryWeightsImportArgs")
    assert props["tensorParallelSize"].type.value == "integer" and props["tensorParallelSize"].optional
    assert "Omit the key for `auto`" in props["tensorParallelSize"].description


def test_generated_names_are_apart_from_the_components_types():
    existing = model_args_gen.existing_type_names()
    assert {"LoaderArgs", "WeightsImportArgs", "HuggingFaceSourceArgs", "ModelAutoscalingArgs"} <= existing
    generated = {n.name for n in ast.walk(ast.parse(model_args_gen.source())) if isinstance(n, ast.ClassDef)}
    assert len(generated) == 7 and not existing & generated


def test_a_union_the_schema_cannot_express_is_refused():
    with pytest.raises(model_args_gen.Unsupported, match="X.y: union"):
        model_args_gen.type_of(int | str, None, "X.y", [], ModelConfig)


def _entry(**extra) -> dict:
    return {"name": "m", "source": "meta-llama/Llama-3.1-8B-Instruct", "weights_gib": 15, "pool": "l40s", **extra}


def test_an_entry_becomes_the_model_config_a_stack_file_gives():
    from components.enums import ClusterMode  # any enum member: it is passed as its value

    got = model_config(_entry(weights_import={"hugging_face": {"repo": "a/b", "revision": HF_REVISION}},
                              routing={"policy": "round_robin"}, node_cache=ClusterMode.AUTO, instance_type=None),
                       "ServedModelArgs.model")
    want = ModelConfig.model_validate({"name": "m", "source": "meta-llama/Llama-3.1-8B-Instruct", "weightsGiB": 15,
                                       "pool": "l40s", "import": {"huggingFace": {"repo": "a/b",
                                                                                  "revision": HF_REVISION}},
                                       "routing": {"policy": "round_robin"}, "nodeCache": "auto"})
    assert got == want


def test_an_invalid_entry_is_keyed_by_the_schemas_names():
    with pytest.raises(ConfigErrors) as err:
        model_config(_entry(weights_gib=0, weights_import={"hugging_face": {"repo": "a/b", "revision": "main"}},
                            extra_args=["--x", 1], tensor_parallel_size=0), "ServedModelArgs.model")
    keys = {e.key for e in err.value.errors}
    assert keys == {"ServedModelArgs.model.weightsGib", "ServedModelArgs.model.weightsImport.huggingFace.revision",
                    "ServedModelArgs.model.extraArgs[1]", "ServedModelArgs.model.tensorParallelSize"}, keys
