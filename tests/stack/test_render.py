"""`warmstart render`: outputs, determinism, and the published prod decisions."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.support.stacks import ROOT, STACK_NAMES, STACKS_DIR
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


def _plain_dump(obj: dict) -> str:
    """What object_yaml wrote before its stand-in for long base64 lines: PyYAML walking every scalar."""
    head = {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}
    rest = {k: v for k, v in obj.items() if k not in head}
    doc = {k: render._ordered(v) for k, v in head.items()} | render._ordered(rest)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100)


def test_a_built_scripts_line_is_written_as_pyyaml_writes_it_without_the_walk(rendered, monkeypatch):
    """The built pod scripts ride as base64 lines of up to ~200 kB; the YAML is byte-for-byte
    PyYAML's, but its emitter never analyses such a line character by character (most of a
    render's YAML time before)."""
    maps = [o for o in rendered.kind("ConfigMap") if o.get("binaryData")]
    assert maps, "no ConfigMap carries a built script"
    expected = [_plain_dump(o) for o in maps]
    walked: list[int] = []
    analyze = yaml.emitter.Emitter.analyze_scalar
    monkeypatch.setattr(yaml.emitter.Emitter, "analyze_scalar",
                        lambda self, scalar: (walked.append(len(scalar)), analyze(self, scalar))[1])
    assert [render.object_yaml(o) for o in maps] == expected
    assert max(walked) < min(len(v) for o in maps for v in o["binaryData"].values())


def test_only_a_plain_blob_is_stood_in_for():
    """Strings PyYAML would not write as one plain line keep PyYAML's own treatment: a long run of
    digits resolves to an int (so it is quoted), a stand-in's text that also occurs in the object
    falls back to the plain dump; a blob in a list and under a long key is written verbatim."""
    blob = "UEsDB" + "Ab+/" * 200 + "=="
    cases = [
        {"apiVersion": "v1", "kind": "ConfigMap", "binaryData": {"a.pyz": blob, "digits": "1" * 400}},
        {"apiVersion": "v1", "kind": "ConfigMap", "data": {"note": "warmstartblob0z"}, "binaryData": {"a": blob}},
        {"apiVersion": "v1", "kind": "List", "items": [blob, {"k" * 120: blob}], "spec": {blob: "key"}},
    ]
    for obj in cases:
        assert render.object_yaml(obj) == _plain_dump(obj)
    assert "'" + "1" * 400 + "'" in render.object_yaml(cases[0])


def test_every_config_field_has_the_description_pydantic_would_read():
    """warmstart.docstrings reads the attribute docstrings in one pass per module instead of
    pydantic's use_attribute_docstrings (half of `import warmstart.config`); every field of
    every model gets what pydantic's own extractor reads from the class that declares it."""
    from pydantic import BaseModel
    from pydantic._internal._docs_extraction import extract_docstrings_from_cls

    from warmstart import config
    from warmstart.plan import platform_args

    seen = 0
    for module in (config, platform_args):
        for cls in vars(module).values():
            if not (isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__module__ == module.__name__):
                continue
            for name, info in cls.model_fields.items():
                owner = next(k for k in cls.__mro__ if name in vars(k).get("__annotations__", {}))
                pydantic_doc = extract_docstrings_from_cls(owner, use_inspect=True).get(name)
                if pydantic_doc is not None and "description" not in info._attributes_set:
                    assert info.description == pydantic_doc, f"{cls.__name__}.{name}"
                    seen += 1
    assert seen > 100


# What the console script runs at exit: atexit handlers run before the interpreter's last
# collections, so one that reads the freeze count sees what those collections will skip.
_AT_EXIT = """import atexit, gc, importlib, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
sys.argv = ["warmstart", *sys.argv[1:]]
module, name = {entry!r}.split(":")
getattr(importlib.import_module(module), name)()
"""


@pytest.mark.servers  # subprocesses of the command
def test_the_command_exits_without_collecting_what_it_loaded(monkeypatch):
    # The installed `warmstart` command (pyproject's [project.scripts]) freezes the process's
    # objects once the command is done, so the exit collections skip the SDKs' objects; it
    # exits with the command's own code.
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["warmstart"]
    for argv, code in ((["validate", "--stack", "dev"], 0), (["validate", "--stack", "nosuch"], cli.EXIT_CONFIG)):
        done = subprocess.run([sys.executable, "-c", _AT_EXIT.format(entry=entry), *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == code, done.stderr
        assert done.stdout.splitlines()[-1] == "frozen at exit: True"
    # `main` itself, which tests and programs call in a process that goes on, freezes nothing.
    monkeypatch.chdir(ROOT)
    assert cli.main(["validate", "--stack", "dev"]) == 0
    assert gc.get_freeze_count() == 0
