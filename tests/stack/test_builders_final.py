"""Builders build, components register: no component changes an object a builder in
warmstart/manifests returned (an affinity, a command, a selector patched in after the fact is
a second source of truth the builder's own tests never see)."""

from __future__ import annotations

import ast

import pytest

from tests.support.stacks import ROOT

MUTATORS = {"update", "append", "extend", "insert", "pop", "setdefault", "clear", "remove"}


def _keyed(node: ast.AST) -> bool:
    """A subscript by a string key somewhere in the chain (`x["spec"]...`)."""
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            return True
        node = node.value
    return False


def edits(source: str) -> list[int]:
    """Lines that write into a keyed object: `o["a"]["b"] = v`, `o["a"] |= v`, `del o["a"]`,
    `o["a"].append(v)`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value] if _keyed(node.func.value) else []
        lines += [node.lineno for t in targets if isinstance(t, ast.Subscript) and _keyed(t) or
                  (isinstance(node, ast.Call) and targets)]
    return sorted(set(lines))


def test_no_component_edits_what_a_builder_returned():
    found = [f"components/{p.name}:{line}" for p in sorted((ROOT / "components").glob("*.py"))
             for line in edits(p.read_text())]
    assert found == [], f"move these edits into the builder in warmstart/manifests: {found}"


def test_the_check_sees_each_kind_of_edit():
    code = ('dep = build()\ndep["spec"]["template"]["affinity"] = a\nsvc["spec"]["selector"] |= s\n'
            'del pod["affinity"]\npod["containers"].append(c)\nfine = {"a": 1}\nfine["a"]\n')
    assert edits(code) == [2, 3, 4, 5]


@pytest.mark.servers  # a fresh interpreter: what importing the builders loads, nothing else
def test_builders_take_plan_records_without_loading_a_planner():
    """warmstart/manifests imports what a plan is (warmstart/plan/records.py), never how one is made."""
    import subprocess
    import sys

    code = ("import importlib, pkgutil, sys, warmstart.manifests as m\n"
            "for i in pkgutil.iter_modules(m.__path__): importlib.import_module(f'warmstart.manifests.{i.name}')\n"
            "print(sorted(n for n in sys.modules if n.startswith('warmstart.plan.') and n != 'warmstart.plan.records'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", f"builders load planners: {out.stdout.strip()}"
