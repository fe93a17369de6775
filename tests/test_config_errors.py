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
    assert "no stack file" in capsys.readouterr().err
