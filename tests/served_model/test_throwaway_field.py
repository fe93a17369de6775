"""The Args check catches a field declared once: a throw-away per-model option added to the config
model only (no generated Args) is named as missing from components/model_args.py. (The config-reach
check's own throw-away keys: tests/stack/test_config_reach.py.)"""

from __future__ import annotations

import pytest
from pydantic import Field, create_model

from components import model_args_gen, model_entry
from components.model_args import ModelEntryArgs
from tests.support.model_entry import args_gaps
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


def test_the_args_check_names_it_missing_from_the_generated_file(probe_model):
    gaps = args_gaps(probe_model, ModelEntryArgs)
    assert len(gaps) == 1 and gaps[0].startswith(f"ModelConfig.{PROBE} (`throwawayProbe`) is missing from "
                                                 "components/model_args.py"), gaps
    assert "python -m tests.golden" in gaps[0]
    assert model_args_gen.source(probe_model) != model_args_gen.TARGET.read_text()
    assert f"    {PROBE}: NotRequired[bool]" in model_args_gen.source(probe_model)

