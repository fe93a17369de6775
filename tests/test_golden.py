"""Every stack renders exactly as its golden files say, and existing state keeps its URNs."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ALL_STACK_NAMES, render_stack
from tests.golden import RENDER, STATE
from warmstart import render

ROOT_STACK = "pulumi:pulumi:Stack"


def _files(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("stack", ALL_STACK_NAMES)
def test_render_matches_its_golden_files(stack, tmp_path):
    assert (RENDER / stack).is_dir(), f"no golden render for {stack}: run `python -m tests.golden`"
    render.write(render_stack(stack), tmp_path / stack)
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
    resources = render_stack(stack).resources
    # A StackReference is read, not registered: the engine gives it no URN of its own here.
    assert all(r.urn for r in resources if r.typ != "pulumi:pulumi:StackReference")
    resolves = {r.urn for r in resources} | {a for r in resources for a in r.aliases}
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
