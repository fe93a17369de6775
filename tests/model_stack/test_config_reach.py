"""Every leaf of a model stack's config (`ModelStackConfig`, the model entry's nested keys
included) changes what the model stack deploys, on its shipped platform: see
tests/stack/test_config_reach.py and tests/support/config_reach.py."""

from __future__ import annotations

import pytest

from tests.support import config_reach as reach
from warmstart.config import ModelStackConfig


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> reach.Renders:
    """One folder, so the platform is rendered once per setup and baselines are shared."""
    return reach.Renders(tmp_path_factory.mktemp("config-reach-model-stack"), model_stack=True)


@pytest.mark.parametrize("leaf", reach.params(reach.leaves(ModelStackConfig)))
def test_the_key_changes_a_deployed_object(renders, leaf):
    reach.assert_reaches(leaf, renders)
