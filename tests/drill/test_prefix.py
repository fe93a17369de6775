"""The drill's routing line: the prefix-cache hit rate queried from a stand-in of the managed
Prometheus workspace (tests/support/prometheus.py) that scrapes real fake-engine counters, signs
checked; and what the line says when it cannot be measured."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from tests.routing.fake_vllm import FakeVllm
from tests.support.prometheus import StandInPrometheus, increase
from warmstart.drill import prefix

NS, MODEL, REGION = "inference", "qwen-67b", "us-west-2"
AK, SK = "AKIDSTANDIN", "standin-secret"


def test_increase_extrapolates_as_prometheus_does():
    # 0, 10, 20 at 10 s, 20 s, 30 s in (5, 35]: 5 s to each edge, under 1.1 x 10 s, but a counter
    # is never extrapolated below zero (the first sample is 0): 20 x (20 + 0 + 5) / 20 = 25.
    assert increase([(10, 0), (20, 10), (30, 20)], 5, 35) == pytest.approx(25)
    # A reset (30 -> 5) adds the value before it back: 5 + 30 - 10 = 25 raw, 40 x 25/20 ... edges
    # 2 s and 3 s away, first sample 10 > 0 limits nothing here: 25 x (20 + 2 + 3) / 20.
    assert increase([(12, 10), (22, 30), (32, 5)], 10, 35) == pytest.approx(25 * 25 / 20)
    # One sample in the window: no result (dropped, as Prometheus drops the series).
    assert increase([(10, 0), (50, 5)], 40, 60) is None


def _send(url: str, prompt: str) -> None:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=30).read()  # noqa: S310


@pytest.fixture()
def engines():
    es = [FakeVllm(f"e{i}", served_model=MODEL) for i in range(2)]
    try:
        yield {f"{MODEL}-rs-{i}": e for i, e in enumerate(es)}
    finally:
        for e in es:
            e.stop()


@pytest.fixture()
def creds(monkeypatch, tmp_path):
    """The user's credentials, as botocore's default chain finds them."""
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AK)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SK)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))


def _load(engines, prefixes: int, per_prefix: int) -> dict:
    """Each prefix always to the same engine (what prefix_hash routing does): every prefix misses
    once, then hits."""
    started = time.time()
    urls = [e.url for e in engines.values()]
    for j in range(per_prefix):
        for p in range(prefixes):
            _send(urls[p % len(urls)], f"shared prefix {p} " + "lorem ipsum dolor sit amet " * 60 + f"tail {j}")
    return {"started": started, "ended": time.time()}


@pytest.mark.servers
def test_the_line_is_the_engines_own_counters_over_the_loads_window(engines, creds):
    before = {n: e.stats() for n, e in engines.items()}
    with StandInPrometheus(lambda: {n: e.url for n, e in engines.items()}, NS, interval_s=1.0, region=REGION,
                           access_key=AK, secret_key=SK) as prom:
        time.sleep(2.5)
        load = _load(engines, prefixes=4, per_prefix=5)
        line = prefix.line(prefix.Endpoint(prom.url, REGION), MODEL, NS, load, 1.0)
    after = {n: e.stats() for n, e in engines.items()}
    hits = sum(after[n]["hit_tokens"] - before[n]["hit_tokens"] for n in engines)
    looked = sum(after[n]["prompt_tokens"] - before[n]["prompt_tokens"] for n in engines)
    assert prom.refused == [], prom.refused
    assert line.measured is not None, line.detail
    assert 0.5 < hits / looked < 0.95
    # increase() extrapolates each engine's hits and queries by the same factor: the ratio holds.
    assert line.measured == pytest.approx(hits / looked, abs=0.02), (line.as_json(), hits, looked)
    assert line.passed and not line.judged and line.result == "info"
    assert line.predicted == prefix.ROUTING_BENCH_HIT_RATE and "routing bench: 83 %" in line.detail.replace("83%", "83 %")
    (rate_q, at), _ = prom.queries
    range_s, when = prefix.window(load["started"], load["ended"], 1.0)
    assert rate_q == (f'sum(increase(vllm:prefix_cache_hits_total{{namespace="{NS}",model_name="{MODEL}"}}[{range_s}s]))'
                      f' / sum(increase(vllm:prefix_cache_queries_total{{namespace="{NS}",model_name="{MODEL}"}}'
                      f'[{range_s}s]))')
    assert at == pytest.approx(when, abs=0.01)


@pytest.mark.servers
def test_a_query_the_workspace_refuses_is_a_skipped_line_not_a_failed_drill(engines, creds, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with StandInPrometheus(lambda: {n: e.url for n, e in engines.items()}, NS, interval_s=1.0, region=REGION,
                           access_key=AK, secret_key=SK) as prom:
        now = time.time()
        line = prefix.line(prefix.Endpoint(prom.url, REGION), MODEL, NS, {"started": now - 3, "ended": now - 2}, 1.0)
    assert len(prom.refused) == 1
    assert line.measured is None and line.result == "skipped" and line.passed
    assert "HTTP 403" in line.detail and "aps:QueryMetrics" in line.detail, line.detail


def test_a_prometheus_of_your_own_is_skipped_with_the_query_to_run_there():
    so = {"spec": {"triggers": [{"type": "prometheus", "metadata": {
        "serverAddress": "http://prometheus-operated.monitoring.svc:9090", "query": "sum(x)"}}]}}
    ep = prefix.endpoint(lambda path: so, NS, MODEL)
    assert ep == prefix.Endpoint("http://prometheus-operated.monitoring.svc:9090", None)
    line = prefix.line(ep, MODEL, NS, {"started": 1000.0, "ended": 1600.0}, 30)
    assert line.result == "skipped" and line.passed
    assert "monitoring.prometheusUrl" in line.detail and "not reachable from here" in line.detail
    assert "sum(increase(vllm:prefix_cache_hits_total" in line.detail and "[660s]" in line.detail, line.detail


def test_a_model_without_a_scaled_object_is_skipped_saying_why():
    ep = prefix.endpoint(lambda path: None, NS, MODEL)
    line = prefix.line(ep, MODEL, NS, {"started": 1.0, "ended": 2.0}, 30)
    assert line.result == "skipped" and "without autoscaling" in line.detail
