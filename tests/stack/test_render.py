"""`warmstart render`: outputs, determinism, and the published prod decisions."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.support.stacks import STACK_NAMES, STACKS_DIR
from warmstart import cli, render

PLAN_KEYS = {"name", "instanceType", "gpuName", "gpusPerNode", "tensorParallelSize", "weightsBytes",
             "chunkBytes", "concurrency", "distributed", "compileCacheHostPath"}


def _render_to(stack: str, out: Path) -> dict[str, bytes]:
    render.write(render.run_program(STACKS_DIR, stack), out)
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_every_stack_renders_byte_identically(tmp_path):
    assert {"dev", "prod"} <= set(STACK_NAMES)
    for stack in STACK_NAMES:
        first = _render_to(stack, tmp_path / stack / "a")
        second = _render_to(stack, tmp_path / stack / "b")
        assert first == second
        assert "plan.json" in first and "cloud.json" in first
        assert any(k.startswith("kubernetes/") for k in first)


def test_outputs_are_what_kubectl_and_ci_read(tmp_path, rendered):
    out = tmp_path / "out"
    render.write(rendered, out)
    docs = [yaml.safe_load(p.read_text()) for p in sorted((out / "kubernetes").glob("*.yaml"))]
    assert len(docs) == len(rendered.kubernetes_objects)
    assert all({"apiVersion", "kind", "metadata"} <= d.keys() for d in docs)
    assert docs[0]["kind"] == "Namespace"  # applied first
    cloud = json.loads((out / "cloud.json").read_text())
    assert all(set(r) == {"type", "name", "inputs"} for r in cloud)
    assert not any(r["type"].startswith("kubernetes:") and "kind" in r["inputs"] for r in cloud)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["stack"] == rendered.stack_plan.stack
    assert plan["clusterMode"] == rendered.stack_plan.cluster_mode
    assert all(PLAN_KEYS <= m.keys() for m in plan["models"])


def test_prod_shows_the_published_67gb_decisions(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(STACKS_DIR.parent)
    assert cli.main(["render", "--stack", "prod", "--out", str(tmp_path / "prod")]) == 0
    table = capsys.readouterr().out
    plan = json.loads((tmp_path / "prod" / "plan.json").read_text())
    assert plan["clusterMode"] == "karpenter"
    (qwen,) = [m for m in plan["models"] if round(m["weightsBytes"] / 2**30) == 67]
    assert qwen["tensorParallelSize"] == 2 and qwen["concurrency"] == 17 and qwen["distributed"] is True
    assert qwen["compileCacheHostPath"] == "/mnt/k8s-disks/0/compile-cache"
    assert qwen["instanceType"] == "p5.48xlarge" and qwen["gpusPerNode"] == 8
    row = next(line for line in table.splitlines() if line.startswith(qwen["name"]))
    assert "17" in row.split() and "yes" in row.split()


def test_rerender_replaces_stale_output(tmp_path):
    out = tmp_path / "out"
    rendered = render.run_program(STACKS_DIR, "dev")
    render.write(rendered, out)
    (out / "kubernetes" / "stale.yaml").write_text("kind: Gone\n")
    render.write(rendered, out)
    assert not (out / "kubernetes" / "stale.yaml").exists()


def test_never_deletes_a_folder_it_did_not_write(tmp_path, monkeypatch, capsys):
    precious = tmp_path / "home"
    (precious / "kubernetes").mkdir(parents=True)
    (precious / "kubernetes" / "mine.yaml").write_text("keep: me\n")
    monkeypatch.chdir(STACKS_DIR.parent)
    assert cli.main(["render", "--stack", "dev", "--out", str(precious)]) == cli.EXIT_FAILED
    assert (precious / "kubernetes" / "mine.yaml").read_text() == "keep: me\n"
    assert "not written by warmstart render" in capsys.readouterr().err
