"""Every field of a `models[]` entry changes what is deployed: set to a valid value other than
the dev stack's, some registered cloud resource or Kubernetes object differs from the baseline
render (plan.json alone does not count). Samples: tests/support/model_entry.py."""

from __future__ import annotations

import pytest

from tests.support.model_entry import SAMPLES, FieldReach
from warmstart.config import ModelConfig


@pytest.fixture(scope="module")
def reach(tmp_path_factory) -> FieldReach:
    """One checker, so every field's render is compared with one baseline (per setup)."""
    return FieldReach("dev", tmp_path_factory.mktemp("field-reach"))


@pytest.mark.parametrize("field", list(ModelConfig.model_fields))
def test_the_field_changes_a_deployed_object(reach, field):
    result = reach.check(ModelConfig, field)
    assert result.changed, result.message(ModelConfig)


def test_every_sample_is_of_a_field():
    assert sorted(set(SAMPLES) - set(ModelConfig.model_fields)) == []
