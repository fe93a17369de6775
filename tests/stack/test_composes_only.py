"""The warmstart stack and the model stack compose components: neither registers a cloud or
Kubernetes resource of its own (only their providers, and a model stack's StackReference)."""

from __future__ import annotations

import pytest

from tests.support.stacks import ALL_STACK_NAMES, render_stack

OWNERS = ("warmstart:index:Stack", "warmstart:index:ModelStack")


def _own_children(resources):
    """(type, name) of every resource whose parent is the stack component itself."""
    out = []
    for r in resources:
        chain = r.urn.split("::")[2].split("$") if r.urn else []
        if len(chain) == 2 and chain[0] in OWNERS:
            out.append((r.typ, r.name))
    return out


@pytest.mark.parametrize("stack", ALL_STACK_NAMES)
def test_the_stack_component_registers_only_components_and_providers(stack):
    own = _own_children(render_stack(stack).resources)
    assert own, "the check saw no child of the stack component"
    resources = [(t, n) for t, n in own if not t.startswith(("warmstart:", "pulumi:providers:", "pulumi:pulumi:"))]
    assert resources == [], f"registered by the stack itself, not by a component: {resources}"


def test_the_check_can_fail():
    from warmstart.mocks import Registered

    stray = Registered("kubernetes:core/v1:Namespace", "x", {},
                       urn="urn:pulumi:dev::warmstart::warmstart:index:Stack$kubernetes:core/v1:Namespace::x")
    assert _own_children([stray]) == [("kubernetes:core/v1:Namespace", "x")]
