"""Every stack renders exactly as its golden files say, and existing state keeps its URNs."""

from __future__ import annotations

import json

import pytest

from tests.golden import RENDER, STATE, golden_form
from tests.support.stacks import ALL_STACK_NAMES, STACKS_DIR, render_stack
from warmstart import render

ROOT_STACK = "pulumi:pulumi:Stack"


def _files(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("stack", ALL_STACK_NAMES)
def test_render_matches_its_golden_files(stack, tmp_path):
    assert (RENDER / stack).is_dir(), f"no golden render for {stack}: run `python -m tests.golden`"
    render.write(render_stack(stack), tmp_path / stack)
    golden_form(tmp_path / stack)
    got, want = _files(tmp_path / stack), _files(RENDER / stack)
    assert sorted(got) == sorted(want), "objects appeared or disappeared; see `python -m tests.golden`"
    changed = [name for name in want if got[name] != want[name]]
    assert not changed, f"render changed in {changed}; if deliberate, refresh with `python -m tests.golden`"


@pytest.mark.parametrize("snapshot", sorted(p.stem.removeprefix("urns-") for p in STATE.glob("urns-*.json")))
def test_every_resource_of_existing_state_still_resolves(snapshot):
    """Each URN of a cloud or Kubernetes resource a deployed stack holds is today's URN of a
    resource, or one of its aliases (resolved as the engine does, parents' aliases included):
    `pulumi up` then updates in place instead of deleting and recreating. A warmstart
    component of the old layout may drop out of the state (the per-stack ModelRoles became one
    ModelRole per model): a component owns nothing in the cloud, so that deletes nothing."""
    stack = snapshot.split("@")[0]
    old = [u for u in json.loads((STATE / f"urns-{snapshot}.json").read_text()) if f"::{ROOT_STACK}::" not in u]
    # The upgrade run as the engine runs it: each resource adopts the first of its URN and its
    # aliases the old state holds, and a child inherits only the old URN its parent adopted.
    resources = render.run_program(STACKS_DIR, stack, olds=old).resources
    # A StackReference is read, not registered: the engine gives it no URN of its own here.
    assert all(r.urn for r in resources if r.typ != "pulumi:pulumi:StackReference")
    adopted = [r.old_urn for r in resources if r.old_urn]
    assert len(adopted) == len(set(adopted)), "two resources adopt one old URN (the engine refuses it)"
    resolves = {r.urn for r in resources} | set(adopted)
    lost = [u for u in old if u not in resolves and not _own_type(u).startswith("warmstart:")]
    assert not lost, f"{len(lost)} resources of existing state would be replaced: {lost[:5]}"
    dropped = sorted(_own_type(u) for u in old if u not in resolves)
    assert dropped in ([], ["warmstart:aws:ModelRoles"]), dropped


def _own_type(urn: str) -> str:
    return urn.split("::")[2].split("$")[-1]


def test_aliases_are_checked_at_all():
    """The check above must be able to fail: a URN nobody answers to is reported lost."""
    resources = render_stack("dev").resources
    resolves = {r.urn for r in resources} | {a for r in resources for a in r.aliases}
    assert "urn:pulumi:dev::warmstart::warmstart:index:Stack$warmstart:gone:Thing::x" not in resolves
    assert len({r.urn for r in resources}) == len(resources), "two resources share a URN"


def test_a_child_inherits_only_the_old_urn_its_parent_was_found_by():
    """The engine's rule (pulumi/pulumi pkg/resource/deploy/step_generator.go `generateAliases`):
    a parent's aliases reach its children only through the one old URN the parent was matched
    by. Multiplying every alias of the parent onto the child (the harness before) would let a
    child "resolve" to a URN under the parent's other old name, which the engine never adopts."""
    import pulumi

    from warmstart import mocks

    class Parent(pulumi.ComponentResource):
        def __init__(self, name, opts=None):
            super().__init__("test:index:Parent", name, None, opts)
            self.child = pulumi.ComponentResource("test:index:Child", f"{name}-x", None,
                                                  pulumi.ResourceOptions(parent=self))

    def program():
        Parent("new", pulumi.ResourceOptions(aliases=[pulumi.Alias(name="old-a"), pulumi.Alias(name="old-b")]))

    urn = "urn:pulumi:s::p::test:index:Parent{}::{}"
    old_parent, under_a, under_b = urn.format("", "old-a"), urn.format("$test:index:Child", "old-a-x"), \
        urn.format("$test:index:Child", "old-b-x")

    def child(olds):
        rs = mocks.run(program, region="us-east-1", stack="s", project="p", olds=olds)
        return next(r for r in rs if r.typ == "test:index:Child"), next(r for r in rs if r.typ == "test:index:Parent")

    # The parent was found as old-a: the child follows it there, and only there.
    c, p = child([old_parent, under_b])
    assert p.old_urn == old_parent
    assert c.aliases == (under_a,) and c.old_urn is None  # old-b-x is not adopted: the engine replaces it
    c, _ = child([old_parent, under_a])
    assert c.old_urn == under_a
    # A first deployment: nothing matched, nothing inherited.
    c, p = child([])
    assert p.old_urn is None and c.aliases == ()

