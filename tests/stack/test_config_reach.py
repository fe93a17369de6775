"""Every leaf of an environment stack's config (`StackConfig`, nested keys and `models[0]`
included) changes what is deployed: set to a valid value other than its baseline's, some
registered cloud resource, provider or Kubernetes object differs from the baseline render
(plan.json alone does not count). The leaves, their values and the hand tables:
tests/support/config_reach.py."""

from __future__ import annotations

import pytest

from tests.support import config_reach as reach
from warmstart.config import ModelConfig, ModelStackConfig, StackConfig

LEAVES = reach.leaves(StackConfig)


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> reach.Renders:
    """One folder of renders, so the leaves of one stack and setup share their baseline."""
    return reach.Renders(tmp_path_factory.mktemp("config-reach"))


@pytest.mark.parametrize("leaf", reach.params(LEAVES))
def test_the_key_changes_a_deployed_object(renders, leaf):
    reach.assert_reaches(leaf, renders)


def test_the_leaves_are_every_key_at_every_depth():
    keys = {leaf.key for leaf in LEAVES}
    # One of each kind of place: top level, a nested section, a list of mappings, a model entry's nested key.
    assert {"region", "cluster.logTypes", "gpuPools[0].capacity.reservations[0].id",
            "models[0].routing.policy", "models[0].import.huggingFace.repo"} <= keys
    model_keys = {leaf.key.removeprefix("models[0].") for leaf in LEAVES if leaf.key.startswith("models[0].")}
    assert model_keys == {leaf.key for leaf in reach.leaves(ModelConfig)}
    assert len(keys) == len(LEAVES)


def test_every_hand_entry_names_a_leaf():
    """A hand sample, allow-list or xfail entry for a key that no longer exists fails here."""
    env = {leaf.key for leaf in LEAVES}
    model_stack = {leaf.key for leaf in reach.leaves(ModelStackConfig)}
    model = {leaf.key for leaf in reach.leaves(ModelConfig)}
    known = env | model_stack
    assert sorted(set(reach.SAMPLES) - known) == []
    assert sorted(set(reach.MODEL_SAMPLES) - model) == []
    assert sorted(set(reach.NO_REACH) - known) == []
    assert sorted(set(reach.KNOWN_UNREACHED) - known) == []
    assert not set(reach.NO_REACH) & set(reach.KNOWN_UNREACHED)


# A throw-away key, added to the config model only (no Args, no plan, no object), is named by the
# check with where to wire it: nested in a model entry's section, in the cluster's, in the network's,
# in the monitoring's KEDA.
PROBES = {
    "models[0].routing.throwawayProbe": ("dev", "components/model_args.py"),
    "cluster.throwawayProbe": ("staging", "ClusterArgs (components/cluster.py"),
    "network.throwawayProbe": ("staging", "NetworkArgs (components/network.py"),
    # Not refused by the Monitoring component (it reads the section back through the config model).
    "monitoring.keda.throwawayProbe": ("staging", "MonitoringArgs.monitoring (components/monitoring.py"),
}


@pytest.fixture
def probe_config(monkeypatch, request) -> type[StackConfig]:
    """`StackConfig` with a throw-away bool where the param says, as every stack file is read:
    the module's `StackConfig` (which `parse_config` validates with) becomes it, and so does the
    model entry ServedModel reads (components/model_entry.py) and the section the component reads
    back (components/cluster.py, network.py, monitoring.py). The config models forbid unknown keys,
    so a render that sets the probe proves the patch took."""
    from components import cluster as cluster_component
    from components import model_entry
    from components import monitoring as monitoring_component
    from components import network as network_component
    from warmstart import config
    from warmstart.config import ClusterConfig, KedaConfig, MonitoringConfig, NetworkConfig, RoutingConfig

    where = request.param
    if where.startswith("models[0]."):
        model = reach.replace_field(ModelConfig, "routing", reach.with_probe(RoutingConfig))
        stack = reach.replace_field(StackConfig, "models", list[model])
        monkeypatch.setattr(model_entry, "ModelConfig", model)
    elif where.startswith("monitoring."):
        section = reach.replace_field(MonitoringConfig, "keda", reach.with_probe(KedaConfig))
        stack = reach.replace_field(StackConfig, "monitoring", section)
        monkeypatch.setattr(monitoring_component, "MonitoringConfig", section)
    elif where.startswith("cluster."):
        section = reach.with_probe(ClusterConfig)
        stack = reach.replace_field(StackConfig, "cluster", section)
        monkeypatch.setattr(cluster_component, "ClusterConfig", section)
    else:
        section = reach.with_probe(NetworkConfig)
        stack = reach.replace_field(StackConfig, "network", section)
        monkeypatch.setattr(network_component, "NetworkConfig", section)
    monkeypatch.setattr(config, "StackConfig", stack)
    return stack


@pytest.mark.parametrize("probe_config", list(PROBES), indirect=True, ids=list(PROBES))
def test_a_config_only_key_is_named_with_where_to_wire_it(probe_config, request, tmp_path):
    key = request.node.callspec.params["probe_config"]
    stack, place = PROBES[key]
    leaf = next(leaf for leaf in reach.leaves(probe_config) if leaf.name == reach.PROBE)
    assert leaf.key == key
    result = reach.check(leaf, reach.Renders(tmp_path), only=(stack,))
    assert result.tried == [(stack, True)], result.message()  # the stack took the key: the patch held
    assert not result.changed
    message = result.message()
    assert message.startswith(f"`{key}` changes no deployed object"), message
    assert place in message, message


def test_a_key_without_a_sample_is_named_with_where_to_add_one(tmp_path):
    """A key whose type and stacks give no value (here an unset free-text `str | None`) fails the
    check itself, before any render."""
    from pydantic import Field, create_model

    from warmstart.config import ClusterConfig

    cluster = create_model("ClusterConfig", __base__=ClusterConfig,
                           throwaway_note=(str | None, Field(None, description="A throw-away note.")))
    stack = reach.replace_field(StackConfig, "cluster", cluster)
    leaf = next(leaf for leaf in reach.leaves(stack) if leaf.name == "throwaway_note")
    renders = reach.Renders(tmp_path)
    result = reach.check(leaf, renders)
    assert not result.changed and renders.count == 0
    assert result.message().startswith("`cluster.throwawayNote` has no valid sample"), result.message()
    assert "add one to SAMPLES" in result.message()
