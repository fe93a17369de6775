"""The `create` switches of the parts a user may own already (`namespaceCreate`,
`nodeFeatureDiscovery.create`, `monitoring.keda.create`): off, the stack registers none of that
part, everything else exactly as with it on, and the render says what `up` then assumes."""

from __future__ import annotations

import json

import pytest

from tests.support.stacks import load_stack_doc, render_doc, render_stack
from tests.support.validation import validate_rendered
from warmstart import render

# staging runs all three: its model stacks may autoscale (KEDA) and be staged (node-feature-discovery).
STACK = "staging"
SWITCHES = {
    "namespaceCreate": ({"warmstart:namespaceCreate": False}, {"kubernetes:core/v1:Namespace": ["inference"]}),
    "nodeFeatureDiscovery.create": ({"warmstart:nodeFeatureDiscovery": {"create": False}},
                                    {"kubernetes:helm.sh/v3:Release": ["node-feature-discovery"]}),
    "monitoring.keda.create": ({"warmstart:monitoring": {"keda": {"create": False}}},
                               {"kubernetes:core/v1:Namespace": ["keda"], "kubernetes:helm.sh/v3:Release": ["keda"]}),
}


def _name(r) -> str:
    return (r.inputs.get("metadata") or {}).get("name") or r.inputs.get("name")


def _objects(rendered: render.Rendered) -> dict[str, tuple[str, str]]:
    """Every resource but the components (whose inputs carry the switch itself), by URN."""
    return {r.urn: (r.typ, json.dumps(r.inputs, sort_keys=True, default=str))
            for r in rendered.resources if not r.typ.startswith("warmstart:")}


def _off(tmp_path, *keys: str) -> render.Rendered:
    doc = load_stack_doc(STACK)
    for key in keys:
        doc["config"] |= SWITCHES[key][0]
    return render_doc(doc, tmp_path, stack=STACK)


@pytest.mark.parametrize("key", sorted(SWITCHES))
def test_off_registers_none_of_the_part_and_the_rest_unchanged(tmp_path, key):
    on, off = render_stack(STACK), _off(tmp_path, key)
    a, b = _objects(on), _objects(off)
    removed = [r for r in on.resources if r.urn in set(a) - set(b)]
    found: dict[str, list[str]] = {}
    for r in removed:
        found.setdefault(r.typ, []).append(_name(r))
    assert found == SWITCHES[key][1] and set(b) <= set(a)
    assert {u: v for u, v in a.items() if u in b} == b
    validate_rendered(off)
    gone = {r.urn for r in removed}
    assert not [r.name for r in off.resources if gone & set(r.dependencies)]


def test_all_off_still_autoscales_and_stages_and_says_what_it_assumes(tmp_path):
    off = _off(tmp_path, *SWITCHES)
    # The platform still offers autoscaling and staging to its model stacks: the parts are
    # there, only not warmstart's.
    doc = off.outputs["warmstartPlatform"]
    assert doc["nodeCache"] is True and doc["monitoring"]["serverAddress"]
    assert not off.of_type("kubernetes:core/v1:Namespace") and not off.of_type("kubernetes:helm.sh/v3:Release")
    notes = render.table(off.stack_plan)
    assert "namespace inference must exist before `up`" in notes
    assert "your node-feature-discovery" in notes and "weights.warmstart.io" in notes
    assert "your KEDA in namespace keda" in notes and "keda/keda-operator" in notes
    assert "your KEDA" not in render.table(render_stack(STACK).stack_plan)


def test_the_users_keda_elsewhere_is_the_query_roles_subject(tmp_path):
    doc = load_stack_doc(STACK)
    doc["config"]["warmstart:monitoring"] = {"keda": {"create": False, "namespace": "autoscaling",
                                                      "operatorServiceAccount": "keda-op"}}
    off = render_doc(doc, tmp_path, stack=STACK)
    (role,) = [r for r in off.of_type("aws:iam/role:Role") if "keda" in r.inputs["name"]]
    (stmt,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert [v for k, v in stmt["Condition"]["StringEquals"].items() if k.endswith(":sub")] == [
        "system:serviceaccount:autoscaling:keda-op"]
    assert "autoscaling/keda-op" in render.table(off.stack_plan)
    # The stack exports the role that KEDA's operator is annotated with.
    assert off.outputs["kedaOperatorRoleArn"].endswith(f":role/{role.inputs['name']}")
