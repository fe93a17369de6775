"""`warmstart drill` without a cluster: the dry run, the bounds, the production marker."""

from __future__ import annotations

import shutil
from pathlib import Path

from warmstart import cli
from warmstart.exit_codes import EXIT_CONFIG, EXIT_OK

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_lists_every_change_and_touches_nothing(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.main(["drill", "--stack", "prod", "--model", "qwen-67b"]) == EXIT_OK
    out = capsys.readouterr().out
    for what in ("create Job", "create Pod", "drill-restore-", "wake", "new node", "warm spare", "cold",
                 "dry run: nothing was changed"):
        assert what in out, what


def test_bounds_out_of_range_are_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli.main(["drill", "--stack", "dev", "--duration", "100000"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "--duration" in err and "Traceback" not in err


def test_a_production_stack_is_refused_without_confirmation(tmp_path, capsys, monkeypatch):
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    f = tmp_path / "stacks" / "Pulumi.dev.yaml"
    f.write_text(f.read_text().replace("config:\n", "config:\n  warmstart:production: true\n", 1))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["drill", "--stack", "dev", "--apply"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "production" in err and "--confirm-production" in err
    # The dry run still shows what it would do, and says it.
    assert cli.main(["drill", "--stack", "dev"]) == EXIT_OK
    assert "marked production" in capsys.readouterr().out
