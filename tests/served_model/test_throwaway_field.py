"""The checks catch a field that reaches nothing: a throw-away per-model option added to the
config model only (no plan, no manifest, no generated Args) is named by the field-reach check
as changing no deployed object, and by the Args check as missing from components/model_args.py."""

from __future__ import annotations

import pytest
from pydantic import Field, create_model

from components import model_args_gen, model_entry
from components.model_args import ModelEntryArgs
from tests.support.model_entry import FieldReach, args_gaps
from warmstart import config
from warmstart.config import ModelConfig, StackConfig

PROBE = "throwaway_probe"


@pytest.fixture
def probe_model(monkeypatch) -> type[ModelConfig]:
    """`ModelConfig` plus the bool `throwaway_probe`, read as a stack's `models[]` entry: the
    module's `StackConfig`, which `parse_config` (every stack file's way in, the Pulumi program's
    included) validates with, becomes one whose models are the probe model. The config models
    forbid unknown keys, so a render that sets `throwawayProbe` proves the patch took."""
    probe = create_model("ModelConfig", __base__=ModelConfig,
                         throwaway_probe=(bool, Field(False, description="A throw-away option that reaches nothing.")))
    stack = create_model("StackConfig", __base__=StackConfig, models=(list[probe], Field([], description="Models.")))
    monkeypatch.setattr(config, "StackConfig", stack)
    # ServedModel reads its `model` entry through the same config model (components/model_entry.py).
    monkeypatch.setattr(model_entry, "ModelConfig", probe)
    return probe


def test_the_field_reach_check_names_exactly_the_throwaway_field(probe_model, tmp_path):
    reach = FieldReach("dev", tmp_path)
    # The probe beside a field that reaches the Deployment (every field is test_field_reach's).
    results = {f: reach.check(probe_model, f) for f in (PROBE, "max_model_len")}
    assert [f for f, r in results.items() if not r.changed] == [PROBE]
    message = results[PROBE].message(probe_model)
    assert message.startswith(f"ModelConfig.{PROBE} (`models[].throwawayProbe`) set to true changes no deployed "
                              "object"), message
    for place in ("warmstart/config.py", "warmstart/plan/model.py", "warmstart/manifests/"):
        assert place in message, message


def test_the_args_check_names_it_missing_from_the_generated_file(probe_model):
    gaps = args_gaps(probe_model, ModelEntryArgs)
    assert len(gaps) == 1 and gaps[0].startswith(f"ModelConfig.{PROBE} (`throwawayProbe`) is missing from "
                                                 "components/model_args.py"), gaps
    assert "python -m tests.golden" in gaps[0]
    assert model_args_gen.source(probe_model) != model_args_gen.TARGET.read_text()
    assert f"    {PROBE}: NotRequired[bool]" in model_args_gen.source(probe_model)



def test_a_field_without_a_sample_is_named_with_where_to_add_one(tmp_path):
    """A field whose type and dev value give no sample (here an unset `str | None`) fails the
    check itself, before any render."""
    probe = create_model("ModelConfig", __base__=ModelConfig,
                         throwaway_note=(str | None, Field(None, description="A throw-away note.")))
    with pytest.raises(AssertionError, match=r"ModelConfig.throwaway_note \(`models\[\].throwawayNote`\) has no "
                                             r"sample value .* add one to SAMPLES in tests/support/model_entry.py"):
        FieldReach("dev", tmp_path).check(probe, "throwaway_note")
