"""Every private Pulumi SDK use (pulumi, pulumi-policy) is in warmstart/sdk_private.py, and
still there in the installed SDKs: an upgrade that removes one fails here, naming what to do."""

from __future__ import annotations

import ast
import asyncio
import importlib

import pytest

from tests.support.stacks import ROOT
from warmstart import sdk_private as sdk_private

FIX = ("the installed Pulumi SDK no longer has {use}, which warmstart/sdk_private.py uses; pin that SDK in "
       "pyproject.toml to the last version that has it, or replace the use there (and only there) with the "
       "public API that took its place")


@pytest.mark.parametrize("use", sdk_private.USES)
def test_each_private_use_still_exists(use):
    module, _, attr = use.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError):
        pytest.fail(FIX.format(use=use))
    assert found is not None, FIX.format(use=use)


def test_sync_await_waits_for_an_awaitable():
    async def answer():
        await asyncio.sleep(0)
        return 42

    assert sdk_private.sync_await(answer()) == 42


def test_program_config_is_the_flat_config_map():
    import pulumi

    pulumi.runtime.set_all_config({"warmstart:region": "us-east-1"})
    try:
        assert sdk_private.program_config()["warmstart:region"] == "us-east-1"
    finally:
        pulumi.runtime.set_all_config({})


def test_no_other_module_uses_them():
    """Outside the one module: no import of `pulumi.runtime.config`, `pulumi.runtime.sync_await`
    or an underscore name of the SDK."""
    private = {u.rpartition(".")[0] for u in sdk_private.USES}
    found = []
    for path in [*(ROOT / "components").rglob("*.py"), *(ROOT / "warmstart").rglob("*.py"), ROOT / "__main__.py"]:
        if path.name == "sdk_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pulumi"):
                names = [a.name for a in node.names]
                if node.module in private or any(n.startswith("_") for n in names) or \
                        any(f"{node.module}.{n}" in private for n in names):
                    found.append(f"{path.relative_to(ROOT)}: from {node.module} import {', '.join(names)}")
    assert found == [], f"private Pulumi SDK uses outside warmstart/sdk_private.py: {found}"
