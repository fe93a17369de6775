"""The cache-bypass switch of the drill's fallback pod: set on the clone, never on the template,
honoured by the compile-cache restore, visible in its outcome line (the cold-start record)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from warmstart import render
from warmstart.drill import manifests
from warmstart.drill import plan as dp
from warmstart.podside.compile_cache import main as compile_cache

ROOT = Path(__file__).resolve().parents[2]


def test_the_restore_skips_when_bypassed_and_says_so(monkeypatch, tmp_path, capsys):
    called = []
    monkeypatch.setattr(compile_cache, "_restore", lambda *a: called.append(a))
    monkeypatch.setattr(compile_cache.Settings, "from_env", classmethod(lambda cls: None))
    monkeypatch.setenv(manifests.BYPASS_ENV, "1")
    out = compile_cache.restore()
    assert out.result == "bypassed" and not called
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["result"] == "bypassed"
    monkeypatch.delenv(manifests.BYPASS_ENV)
    compile_cache.restore()
    assert called, "without the switch the restore runs"


def test_the_switch_is_the_same_name_on_both_sides():
    assert manifests.BYPASS_ENV == compile_cache.BYPASS_ENV


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_clone_bypasses_every_node_cache_and_leaves_the_template_alone(stack):
    r = render.run_program(ROOT / "stacks", stack)
    for m in r.stack_plan.models:
        dep = next(o for o in r.kubernetes_objects if o["kind"] == "Deployment" and o["metadata"]["name"] == m.name)
        before = json.dumps(dep, sort_keys=True)
        p = dp.plan(stack, m, r.stack_plan.config.namespace, 0, dp.Bounds(), now=datetime(2026, 1, 1, tzinfo=timezone.utc))
        pod = manifests.fallback_pod(p, dep)
        assert json.dumps(dep, sort_keys=True) == before
        assert not any("hostPath" in v for v in pod["spec"]["volumes"])
        for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
            assert {"name": manifests.BYPASS_ENV, "value": "1"} in c["env"]
        sel = dep["spec"]["selector"]["matchLabels"]
        assert not all(pod["metadata"]["labels"].get(k) == v for k, v in sel.items()), "a ReplicaSet would adopt it"
        assert manifests.ENGINE_LABEL not in pod["metadata"]["labels"]
        assert pod["spec"]["activeDeadlineSeconds"] == p.bounds.deadline_s
