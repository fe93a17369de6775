"""`models[].nodeCacheContentCheck`: one set of values from the stack file to the stager, and the
stack's choice rendered into the staging DaemonSet, so the next `up` keeps it (a hand edit of
WARMSTART_CONTENT_CHECK on the DaemonSet was reverted by it)."""

from __future__ import annotations

import typing

import pytest

from tests.support.stacks import load_stack_doc, render_doc
from warmstart.config import ModelSpec
from warmstart.decisions import node_cache as decide
from warmstart.manifests import node_cache as objects
from warmstart.podside.weights_stage import settings as weights_stage_settings
from warmstart.podside.weights_stage import main as weights_stage


def test_the_stack_key_the_plan_and_the_stager_accept_the_same_values():
    accepted = typing.get_args(ModelSpec.model_fields["node_cache_content_check"].annotation)
    assert accepted == decide.CONTENT_CHECKS == weights_stage_settings.CONTENT_CHECKS
    assert ModelSpec.model_fields["node_cache_content_check"].default == "auto"


def _stage_env(rendered, model: str, pool: str) -> dict[str, str]:
    (ds,) = [x for x in rendered.resources if x.inputs.get("kind") == "DaemonSet"
             and x.inputs["metadata"]["name"] == objects.daemonset_name(model, pool)]
    (stage,) = [c for c in ds.inputs["spec"]["template"]["spec"]["initContainers"] if "stage" in c["command"]]
    return {e["name"]: e.get("value") for e in stage["env"]}


@pytest.mark.parametrize("value", [None, "size", "sha256"])
def test_the_stack_choice_reaches_the_staging_pods(tmp_path, value):
    doc = load_stack_doc("dev")
    (entry,) = doc["config"]["warmstart:models"]
    if value is not None:
        entry["nodeCacheContentCheck"] = value
    r = render_doc(doc, tmp_path)
    (m,) = r.stack_plan.models
    assert m.staged
    assert _stage_env(r, m.name, m.pool)["WARMSTART_CONTENT_CHECK"] == (value or "auto")
