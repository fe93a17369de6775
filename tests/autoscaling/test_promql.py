"""The exact PromQL every ScaledObject carries, run by Prometheus's own `promtool test rules` on
synthetic series, and the managed collector's scrape configuration through `promtool check config`.

promtool (Debian bookworm's, pinned in tests/support/tools.py) is installed before pytest starts, by
`python -m tests.install`; where it is missing these tests skip, naming that command.
The rules under test are generated from warmstart.decisions.autoscaling, never copied.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import tools
from warmstart.decisions import autoscaling as decide
from warmstart.manifests import autoscaling as objects

MODEL, NAMESPACE = "llama", "inference"


@pytest.fixture(scope="session")
def promtool() -> Path:
    binary = tools.require("promtool")
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    assert "2.42.0" in out.stdout + out.stderr
    return binary


def _run(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def _rules(plan: decide.ScalingPlan) -> dict:
    """One recording rule per trigger, whose expression is the trigger's query, verbatim."""
    return {"groups": [{"name": "warmstart-keda-triggers", "rules": [
        {"record": f"warmstart:trigger:{t.name.replace('-', '_')}", "expr": t.query} for t in plan.triggers]}]}


def _series(metric: str, values: str, model: str = MODEL, namespace: str = NAMESPACE, pod: str = "a",
            engine: str = "0") -> dict:
    labels = f'namespace="{namespace}",model_name="{model}",engine="{engine}",pod="{pod}"'
    return {"series": f"{metric}{{{labels}}}", "values": values}


W, KV = decide.WAITING_METRIC, decide.KV_CACHE_METRIC


def _unit_tests(plan: decide.ScalingPlan) -> dict:
    by = {t.name: t.query for t in plan.triggers}
    waiting, kv = by["waiting-requests"], by["kv-cache-usage"]
    series = [
        # The model's two pods; pod b runs two engines (data parallel), each its own series.
        _series(W, "0 2 6 10 stale", pod="a"),
        _series(W, "0 1 3 5 5", pod="b"),
        _series(W, "1 1 1 1 1", pod="b", engine="1"),
        _series(KV, "0.1 0.5 0.85 0.9 stale", pod="a"),
        _series(KV, "0.2 0.3 0.4 0.6 0.7", pod="b"),
        # What must never count: another model in the namespace, the same model elsewhere.
        _series(W, "100 100 100 100 100", model="other", pod="c"),
        _series(KV, "0.99 0.99 0.99 0.99 0.99", model="other", pod="c"),
        _series(W, "50 50 50 50 50", namespace="team-b", pod="d"),
        _series(KV, "0.98 0.98 0.98 0.98 0.98", namespace="team-b", pod="d"),
    ]
    return {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": series,
            "promql_expr_test": [
                # One sample, no labels: KEDA refuses a result with more than one element.
                {"expr": waiting, "eval_time": "45s", "exp_samples": [{"labels": "{}", "value": 16}]},
                {"expr": waiting, "eval_time": "0s", "exp_samples": [{"labels": "{}", "value": 1}]},
                # Pod a went away (stale): its queue no longer counts.
                {"expr": waiting, "eval_time": "60s", "exp_samples": [{"labels": "{}", "value": 6}]},
                {"expr": kv, "eval_time": "45s", "exp_samples": [{"labels": "{}", "value": 0.9}]},
                {"expr": kv, "eval_time": "60s", "exp_samples": [{"labels": "{}", "value": 0.7}]},
                {"expr": "warmstart:trigger:waiting_requests", "eval_time": "30s",
                 "exp_samples": [{"labels": "warmstart:trigger:waiting_requests", "value": 10}]},
                {"expr": "warmstart:trigger:kv_cache_usage", "eval_time": "30s",
                 "exp_samples": [{"labels": "warmstart:trigger:kv_cache_usage", "value": 0.85}]},
            ],
        }],
    }


def _plan() -> decide.ScalingPlan:
    return decide.plan_scaling(MODEL, NAMESPACE, decide.AutoscalingSpec(1, 6, 5.0, 0.8), 1300)


def test_every_trigger_query_sums_only_its_model_and_namespace(promtool, tmp_path):
    plan = _plan()
    assert [t.name for t in plan.triggers] == ["waiting-requests", "engine-demand", "kv-cache-usage"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(_rules(plan)))
    (tmp_path / "test.yml").write_text(yaml.safe_dump(_unit_tests(plan)))
    check = _run(promtool, "check", "rules", "rules.yml", cwd=tmp_path)
    assert check.returncode == 0 and "SUCCESS: 3 rules found" in check.stdout, check.stdout + check.stderr
    result = _run(promtool, "test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_the_unit_test_catches_a_query_that_leaks_another_model(promtool, tmp_path):
    """The same expectations fail for a query without the model selector: the test can fail."""
    plan = _plan()
    leaky = [decide.Trigger(t.name, t.query.replace(f',model_name="{MODEL}"', ""), t.threshold, t.metric_type)
             for t in plan.triggers]
    broken = decide.ScalingPlan(**{**plan.__dict__, "triggers": tuple(leaky)})
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(_rules(broken)))
    (tmp_path / "test.yml").write_text(yaml.safe_dump(_unit_tests(broken)))
    result = _run(promtool, "test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr


def test_the_standby_query_adds_the_sleepers_and_answers_with_no_series(promtool, tmp_path):
    """With one standby engine at target 5, KEDA's ceil(value / 5) is the awake pods the queue
    needs plus one; with no series at all (no pod reports yet) the answer is the sleepers alone."""
    plan = decide.plan_scaling(MODEL, NAMESPACE, decide.AutoscalingSpec(0, 4, 5.0, None, standby=1), 1300)
    waiting = plan.triggers[0].query
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(_rules(plan)))
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [_series(W, "0 2 12", pod="a"), _series(W, "100 100 100", model="other", pod="c")],
        "promql_expr_test": [
            {"expr": waiting, "eval_time": "0s", "exp_samples": [{"labels": "{}", "value": 5}]},
            {"expr": waiting, "eval_time": "30s", "exp_samples": [{"labels": "{}", "value": 17}]},
            # Pod a is gone (stale after 5 minutes): the sleepers' share is still asked for.
            {"expr": waiting, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 5}]},
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    result = _run(promtool, "test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


R = decide.RUNNING_METRIC


def test_the_engine_demand_counts_what_the_awake_engines_carry_plus_the_sleepers(promtool, tmp_path):
    """One awake engine and one sleeper (standby 1, 4 requests per engine). The step: 4 running,
    6 waiting (10: 3 engines + the sleeper). After the wake the queue is gone but the two awake
    engines carry 8: the figure stays 2 + 1, so the HPA starts a replacement sleeper and keeps it.
    A load one engine carries (3) asks for 1 + 1; no series at all (every pod asleep) asks for the
    sleeper alone; another model's load never counts."""
    plan = decide.plan_scaling(MODEL, NAMESPACE, decide.AutoscalingSpec(
        1, 4, 5.0, None, standby=1, target_requests_per_replica=4), 1300)
    demand = plan.triggers[1]
    assert (demand.name, demand.threshold, demand.metric_type) == ("engine-demand", 1, "AverageValue")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(_rules(plan)))
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [
            _series(R, "0 4 4 4 3 stale", pod="a"), _series(W, "0 6 0 0 0 stale", pod="a"),
            _series(R, "0 0 4 4 0 stale", pod="b"), _series(W, "0 0 0 0 0 stale", pod="b"),
            _series(R, "50 50 50 50 50 50", model="other", pod="c"),
        ],
        "promql_expr_test": [
            {"expr": demand.query, "eval_time": "0s", "exp_samples": [{"labels": "{}", "value": 1}]},
            {"expr": demand.query, "eval_time": "15s", "exp_samples": [{"labels": "{}", "value": 4}]},
            {"expr": demand.query, "eval_time": "30s", "exp_samples": [{"labels": "{}", "value": 3}]},
            {"expr": demand.query, "eval_time": "60s", "exp_samples": [{"labels": "{}", "value": 2}]},
            {"expr": demand.query, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 1}]},
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    result = _run(promtool, "test", "rules", "test.yml", cwd=tmp_path)
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    # The same figure as the bench computes it from its engines' gauges.
    assert decide.demand_figure(8, 0, 4, 1) == 3 and decide.demand_figure(0, 0, 4, 1) == 1


# Debian builds Prometheus without the Kubernetes service discovery (its promtool answers
# "field kubernetes_sd_configs not found in type config.ScrapeConfig"), so the check swaps that
# one block for a static target and checks everything else (global, jobs, every relabel rule
# and regex) with promtool; the swapped block is asserted to hold only fields of Prometheus's
# kubernetes_sd_config (`role`, `namespaces.names`,
# https://prometheus.io/docs/prometheus/latest/configuration/configuration/#kubernetes_sd_config).
K8S_SD_FIELDS = {"role", "namespaces"}


def _checkable(cfg: dict) -> dict:
    out = yaml.safe_load(yaml.safe_dump(cfg))
    for job in out["scrape_configs"]:
        for sd in job.pop("kubernetes_sd_configs"):
            assert set(sd) <= K8S_SD_FIELDS and sd["role"] == "pod" and set(sd["namespaces"]) == {"names"}
        job["static_configs"] = [{"targets": ["127.0.0.1:8000"]}]
    return out


def _check_config(promtool: Path, cfg: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "scrape.yml").write_text(yaml.safe_dump(_checkable(cfg)))
    return _run(promtool, "check", "config", "scrape.yml", cwd=tmp_path)


@pytest.mark.parametrize("router", [False, True])
def test_the_scrape_configuration_passes_promtool(promtool, tmp_path, router):
    text = objects.scrape_configuration_yaml(["inference", "team-b"], router=router)
    result = _check_config(promtool, yaml.safe_load(text), tmp_path)
    assert result.returncode == 0 and "SUCCESS" in result.stdout + result.stderr, result.stdout + result.stderr


def test_promtool_rejects_a_broken_scrape_configuration(promtool, tmp_path):
    cfg = objects.scrape_configuration(["inference"], router=False)
    cfg["scrape_configs"][0]["relabel_configs"][0]["regex"] = "vllm;(http"
    result = _check_config(promtool, cfg, tmp_path)
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr
