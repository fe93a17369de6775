"""Known-bad stack configs: each fails with its own message naming key, rule and fix."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from warmstart import cli

BAD = sorted((Path(__file__).parent / "bad_configs").glob("*.yaml"))


def _write_stack(tmp_path: Path, case: Path) -> Path:
    doc = yaml.safe_load(case.read_text())
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    (stacks / "Pulumi.bad.yaml").write_text(yaml.safe_dump({"config": doc["config"]}))
    return tmp_path


def test_there_are_at_least_ten_known_bad_configs():
    assert len(BAD) >= 10


@pytest.mark.parametrize("case", BAD, ids=[p.stem for p in BAD])
def test_bad_config_fails_with_its_message(case, tmp_path, monkeypatch, capsys):
    expect = yaml.safe_load(case.read_text())["expect"]
    monkeypatch.chdir(_write_stack(tmp_path, case))
    rc = cli.main(["render", "--stack", "bad"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_CONFIG
    assert re.search(expect, err), err
    assert "fix:" in err
    assert not (tmp_path / "build").exists(), "a failed render must not write output"


def test_messages_are_distinct():
    expects = [yaml.safe_load(p.read_text())["expect"] for p in BAD]
    assert len(set(expects)) == len(expects)


@pytest.mark.servers
def test_cli_exits_2_without_traceback(tmp_path):
    root = _write_stack(tmp_path, BAD[0])
    proc = subprocess.run([sys.executable, "-m", "warmstart.cli", "render", "--stack", "bad"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "invalid stack config" in proc.stderr


def test_missing_stack_file_is_a_config_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\n")
    (tmp_path / "stacks").mkdir()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["render", "--stack", "nope"]) == cli.EXIT_CONFIG
    assert "no stack 'nope' in stacks/" in capsys.readouterr().err


def _render_err(tmp_path: Path, monkeypatch, capsys, config: dict, stack: str = "bad") -> tuple[int, str, str]:
    stacks = tmp_path / "stacks"
    stacks.mkdir(exist_ok=True)
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    (stacks / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}))
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["validate", "--stack", stack])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_an_instance_without_a_gpu_is_one_line_naming_every_gpu_family(tmp_path, monkeypatch, capsys):
    """The one problem of a pool of m7i.2xlarge (a model on it, no instanceType of its own): one
    line, short, that says there is no GPU and names each family of the GPU table once."""
    from warmstart.decisions import instances

    doc = yaml.safe_load((Path(__file__).parent / "bad_configs" / "non-gpu-instance-type.yaml").read_text())
    rc, _, err = _render_err(tmp_path, monkeypatch, capsys, doc["config"])
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert rc == cli.EXIT_CONFIG and len(problems) == 1, err
    (line,) = problems
    assert "has no GPU" in line and len(line) < 400, line
    families = {i.family for i in instances.catalog().values()}
    assert all(f"{f} (" in line for f in families), line
    assert not any(t in line for t in instances.catalog() if t != next(iter(instances.catalog()))), \
        "families, not the table's every instance type"


def test_an_unknown_size_of_a_gpu_family_lists_that_familys_sizes(tmp_path, monkeypatch, capsys):
    from warmstart.decisions import instances

    doc = yaml.safe_load((Path(__file__).parent / "bad_configs" / "non-gpu-instance-type.yaml").read_text())
    doc["config"]["warmstart:gpuPools"][0]["instanceTypes"] = ["g6e.3xlarge"]
    rc, _, err = _render_err(tmp_path, monkeypatch, capsys, doc["config"])
    sizes = [t for t, i in instances.catalog().items() if i.family == "g6e"]
    assert rc == cli.EXIT_CONFIG and "warmstart's GPU table has no g6e.3xlarge" in err
    assert f"use one of {', '.join(sizes)}" in err


def test_a_router_in_front_of_a_model_that_never_has_two_replicas_is_a_note(tmp_path, monkeypatch, capsys,
                                                                             stack_doc):
    """Noted, not refused (why: warmstart/render.py, lone_router_notes): the note names the model
    and the fix, and appears exactly where the model can never have a second replica."""
    def note_for(model_keys: dict) -> list[str]:
        doc = stack_doc("dev")
        doc["config"]["warmstart:models"][0].update(model_keys)
        rc, out, err = _render_err(tmp_path, monkeypatch, capsys, doc["config"], stack="lone")
        assert rc == 0, err
        return [line for line in out.splitlines() if "can never have two replicas" in line]

    (note,) = note_for({"routing": {"policy": "prefix_hash"}})
    assert "'llama-3-1-8b'" in note and "replicas 1, no autoscaling" in note and "routing.policy: auto" in note
    (note,) = note_for({"routing": {"policy": "round_robin"}, "replicas": 0})
    assert "replicas 0, no autoscaling" in note
    assert note_for({"routing": {"policy": "prefix_hash"}, "replicas": 2}) == []
    assert note_for({"routing": {"policy": "prefix_hash"}, "autoscaling": {"maxReplicas": 2}}) == []
    assert note_for({}) == [], "auto puts no router in front of one replica"


def test_a_missing_stack_is_named_with_the_stacks_there(tmp_path, monkeypatch, capsys):
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\n")
    (tmp_path / "stacks").mkdir()
    for name in ("dev", "prod-eu"):
        (tmp_path / "stacks" / f"Pulumi.{name}.yaml").write_text("config: {}\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["render", "--stack", "dve"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "stack='dve': no stack 'dve' in stacks/; fix: use one of: dev, prod-eu" in err, err
    assert str(tmp_path) not in err and "Pulumi.dve.yaml" not in err, "the stack, not a file path"
