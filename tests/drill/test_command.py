"""`warmstart drill` without a cluster: the dry run, the bounds, the production marker."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from warmstart import cli, render
from warmstart.decisions import autoscaling, capacity, prices
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


def _stack_copy(tmp_path, monkeypatch):
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    return tmp_path / "stacks"


def test_the_dry_run_prices_the_drills_own_replicas_beside_the_bounds(tmp_path, capsys, monkeypatch):
    """prod's qwen-67b: TP=2 on p5.48xlarge (8 GPUs, 4 pods a node), autoscaled 2-4: the drill can
    add 2 pods and the bypassed one, 6 GPUs, for the run (1500 s by default) and the HPA's hold;
    at $98.32 a node-hour, $12.29 a GPU-hour."""
    stacks = _stack_copy(tmp_path, monkeypatch)
    f = stacks / "Pulumi.prod.yaml"
    doc = yaml.safe_load(f.read_text())
    pool = next(x for x in doc["config"]["warmstart:gpuPools"] if x["name"] == "h100")
    pool["hourlyPriceUsd"] = 98.32
    f.write_text(yaml.safe_dump(doc))
    m = next(x for x in render.run_program(stacks, "prod", program_dir=ROOT).stack_plan.models if x.name == "qwen-67b")
    hours = (1500 + autoscaling.scale_down_hold_seconds(m.startup_budget_seconds)) / 3600
    assert cli.main(["drill", "--stack", "prod", "--model", "qwen-67b"]) == EXIT_OK
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.strip().startswith("cost")]
    assert out.index("bounds:") < out.index(line) < out.index("predicted")
    assert f"at most 6 GPU(s) (3 pod(s)) for up to {hours:.2f} h" in line, line
    assert "$98.32/node-hour (hourlyPriceUsd)" in line, line
    gpu_usd = float(re.search(r"= \$([\d,.]+);", line)[1].replace(",", ""))
    assert abs(gpu_usd - 6 * hours * 98.32 / 8) < 0.01, line
    # Without --no-fallback and --lose-prepared-node: one node launched for the two pods and the
    # bypassed one (4 fit a node); losing a node adds the evicted pods' node.
    assert "(1 node(s) launched)" in line
    assert cli.main(["drill", "--stack", "prod", "--model", "qwen-67b", "--lose-prepared-node"]) == EXIT_OK
    assert "(2 node(s) launched)" in capsys.readouterr().out


def test_the_dry_run_prices_like_the_render_and_says_why_a_price_is_unknown(tmp_path, capsys, monkeypatch):
    """With no hourlyPriceUsd the drill's node-hour is the render's (the shipped list price, named
    as such); in a region the table does not cover it is unknown and says why and what to set."""
    monkeypatch.chdir(ROOT)
    assert cli.main(["drill", "--stack", "prod", "--model", "qwen-67b"]) == EXIT_OK
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("cost")]
    listed = prices.on_demand("us-east-1", "p5.48xlarge")
    assert f"{capacity.usd(listed.usd_per_hour)}/node-hour (on-demand list price, {listed.as_of})" in line, line
    # A model stack's pool is its platform's, priced as the render prices it.
    assert cli.main(["drill", "--stack", "staging-llama-3-1-8b"]) == EXIT_OK
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("cost")]
    assert "(on-demand list price," in line, line
    stacks = _stack_copy(tmp_path, monkeypatch)
    f = stacks / "Pulumi.prod.yaml"
    doc = yaml.safe_load(f.read_text())
    doc["config"]["warmstart:region"] = "ap-southeast-3"
    assert prices.on_demand("ap-southeast-3", "p5.48xlarge") is None
    f.write_text(yaml.safe_dump(doc))
    assert cli.main(["drill", "--stack", "prod", "--model", "qwen-67b"]) == EXIT_OK
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("cost")]
    assert "price unknown (ap-southeast-3 is not in warmstart's price table" in line and "$" not in line, line
    assert "set gpuPools[].hourlyPriceUsd" in line, line
