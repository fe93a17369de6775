"""The standby actuator (warmstart/podside/standby/) run as its pod runs it (the artifact, the
interpreter isolated, standard library only) against fake vLLM engines that implement vLLM's
sleep API (tests/routing/fake_vllm.py, `--dev-mode`) on 127.0.0.1, and the serving pods'
readiness probe (warmstart/manifests/serving.py) run against the same engines as the kubelet would.
Every loop is bounded in ticks and in time; nothing here is timed."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.podside.servers import free_ports
from tests.routing.fake_vllm import MODEL, FakeVllm
from tests.support import kubelet
from tests.support.loopback import LoopbackServer
from tests.support.standby_actuator import Actuator
from warmstart.manifests import serving
from warmstart.podside.standby import decide as decision
from warmstart.podside.standby import observe

pytestmark = pytest.mark.servers  # fake engines and the actuator script

BOUND_S = 30.0  # the most any wait here takes on a loaded machine


def _post(url: str, path: str, body: dict | None = None, timeout: float = 30.0) -> int:
    req = urllib.request.Request(url + path, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _ready(port: int) -> bool:
    """The rendered readiness probe of a standby model's vLLM container, as the kubelet runs it
    against the engine listening on `port` (its container port is vLLM's). vLLM listens on every
    address of the pod (`--host` unset), so the fake engine on 127.0.0.1 stands in for the pod's IP."""
    from warmstart.manifests.serving import deployment_spec

    (c,) = [c for c in deployment_spec(_standby_plan(), "ns", "us-east-1")["spec"]["template"]["spec"]["containers"]
            if c["name"] == "vllm"]
    return kubelet.run_probe(c, "readinessProbe", {serving.HTTP_PORT: port}, pod_ip="127.0.0.1")


def _standby_plan():
    from warmstart.config import AutoscalingConfig, LoaderTuning, ModelSpec, StandbyConfig
    from warmstart.plan.model import plan_model
    spec = ModelSpec(name="m", source="s3://b-models/m", weights_gib=15,
                     autoscaling=AutoscalingConfig(min_replicas=1, max_replicas=2), standby=StandbyConfig())
    return plan_model(spec, key="k", instance_type="g6e.xlarge", pool="p", loader=LoaderTuning(), compile_cache=True,
                      compile_cache_host_path="/mnt/k8s-disks/0/c").serving


def _until(check, what: str, timeout_s: float = BOUND_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def _load(url: str, n: int) -> list[threading.Thread]:
    """`n` requests at once to one engine (each waits its turn there)."""
    body = {"model": MODEL, "prompt": "load", "max_tokens": 1}

    def one() -> None:
        try:
            _post(url, "/v1/completions", body)
        except OSError:
            pass  # the engine was stopped at the end of the test with this request in flight

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


# --------------------------------------------------------------------------------------
# The readiness probe


def test_a_sleeping_engine_stays_ready_and_a_loading_one_is_not():
    """Every standby pod counts as available, so the Deployment completes (Pulumi's await, a
    rollout with maxUnavailable 0, the disruption budget); the routing label, not readiness,
    keeps a sleeper out of the traffic (tests/standby/test_sleep_drain.py)."""
    with FakeVllm("e", dev_mode=True, asleep=True) as e:
        assert _ready(e.port), "asleep, and Ready"
        assert _post(e.url, "/wake_up") == 200
        assert _ready(e.port), "awake, and Ready"
        e.set_healthy(False)
        assert not _ready(e.port), "/health failing: not Ready"
    (port,) = free_ports(1)
    assert not _ready(port), "still loading (nothing listens yet)"


# --------------------------------------------------------------------------------------
# The actuator against fake engines


def test_a_load_step_wakes_the_sleeper_and_warms_it_up():
    with ExitStack() as stack:
        awake = stack.enter_context(FakeVllm("awake", dev_mode=True, delay_ms=3000, max_num_seqs=1))
        sleeper = stack.enter_context(FakeVllm("sleeper", dev_mode=True, asleep=True, weights_gib=4))
        a = Actuator([awake.url, sleeper.url], "--standby", "1", "--min-awake", "1", "--target-waiting", "1",
                     "--awake-idle-seconds", "600")
        stack.callback(a.stop)
        time.sleep(1.0)
        assert not a.events("warmstart.wake"), "no load, no wake"
        _load(awake.url, 3)  # one running, two waiting: over 1 waiting per awake engine
        (woke,) = _until(lambda: a.events("warmstart.wake"), "the sleeper woken")
        assert woke["url"] == sleeper.url and woke["warmup_status"] == 200
        assert woke["wake_s"] >= sleeper.stats()["wake_s"] * 0.9, woke
        assert sleeper.get("/is_sleeping") == {"is_sleeping": False}
        paths = sleeper.stats()["paths"]
        assert paths.get("/wake_up") == 1 and paths.get("/v1/completions", 0) >= 1, paths
        assert "/wake_up" not in awake.stats()["paths"] and "/sleep" not in awake.stats()["paths"]


def test_a_loading_engine_is_never_touched():
    with ExitStack() as stack:
        awake = stack.enter_context(FakeVllm("awake", dev_mode=True, delay_ms=3000, max_num_seqs=1))
        loading = stack.enter_context(FakeVllm("loading", dev_mode=True, asleep=True))
        loading.set_healthy(False)  # /health fails: vLLM is still loading (or dead)
        idle = stack.enter_context(FakeVllm("idle", dev_mode=True))
        a = Actuator([awake.url, loading.url, idle.url], "--standby", "2", "--min-awake", "1",
                     "--target-waiting", "1", "--awake-idle-seconds", "0", ticks=40)
        stack.callback(a.stop)
        _load(awake.url, 3)
        _until(lambda: a.proc.poll() is not None, "the actuator's 40 ticks", 60)
        touched = {k for k in loading.stats()["paths"] if k not in ("/health", "/fake/stats", "/fake/health")}
        assert not touched, f"a loading engine was sent {touched}"
        assert loading.get("/is_sleeping") == {"is_sleeping": True}


def test_the_idlest_awake_engine_goes_back_to_sleep_and_no_more():
    with ExitStack() as stack:
        e1 = stack.enter_context(FakeVllm("e1", dev_mode=True))
        e2 = stack.enter_context(FakeVllm("e2", dev_mode=True))
        busy = stack.enter_context(FakeVllm("busy", dev_mode=True, delay_ms=20000, max_num_seqs=4))
        _load(busy.url, 1)
        a = Actuator([e1.url, e2.url, busy.url], "--standby", "1", "--min-awake", "1", "--awake-idle-seconds",
                     "600", ticks=25)
        stack.callback(a.stop)
        _until(lambda: a.proc.poll() is not None, "the actuator's 25 ticks", 60)
        slept = a.events("warmstart.sleep")
        assert len(slept) == 1, slept
        assert slept[0]["url"] in (e1.url, e2.url), "the busy engine is never put to sleep"
        assert [x.get("/is_sleeping")["is_sleeping"] for x in (e1, e2)].count(True) == 1
        assert busy.get("/is_sleeping") == {"is_sleeping": False}


def test_a_level_2_wake_reloads_the_weights_before_the_warm_up():
    with ExitStack() as stack:
        awake = stack.enter_context(FakeVllm("awake", dev_mode=True, delay_ms=3000, max_num_seqs=1))
        sleeper = stack.enter_context(FakeVllm("sleeper", dev_mode=True))
        assert _post(sleeper.url, "/sleep?level=2") == 200
        a = Actuator([awake.url, sleeper.url], "--standby", "1", "--min-awake", "1", "--target-waiting", "1",
                     "--sleep-level", "2", "--awake-idle-seconds", "600")
        stack.callback(a.stop)
        _load(awake.url, 3)
        (woke,) = _until(lambda: a.events("warmstart.wake"), "the level-2 sleeper woken")
        assert woke["warmup_status"] == 200, "the warm-up ran on reloaded weights"
        paths = sleeper.stats()["paths"]
        assert paths.get("/collective_rpc") == 1 and paths.get("/reset_prefix_cache") == 1, paths


# --------------------------------------------------------------------------------------
# The decision (pure)


engines = st.lists(st.builds(observe.Engine, url=st.uuids().map(str), ready=st.booleans(), sleeping=st.booleans(),
                             waiting=st.integers(0, 50).map(float), running=st.integers(0, 8).map(float),
                             served=st.booleans(), idle_since=st.floats(0, 1000)), max_size=8,
                   unique_by=lambda e: e.url)


@given(engines, st.integers(0, 3), st.integers(0, 3), st.integers(1, 10), st.integers(0, 20))
def test_the_decision_never_touches_a_loading_engine_nor_goes_below_the_minimum(es, standby, min_awake, target, held):
    out = decision.decide(es, decision.Policy(standby, min_awake, target, 300), now=1000.0, held=held)
    by_url = {e.url: e for e in es}
    assert all(by_url[u].ready and by_url[u].sleeping for u in out.wake)
    assert all(by_url[u].ready and not by_url[u].sleeping for u in out.sleep)
    assert not (out.wake and out.sleep) and len(out.sleep) <= 1
    awake = [e for e in es if e.ready and not e.sleeping]
    if out.sleep:
        assert len(awake) > min_awake and all(by_url[u].waiting == 0 == by_url[u].running for u in out.sleep)
    waiting = sum(e.waiting for e in awake) + held
    if waiting > target * len(awake) and any(e.ready and e.sleeping for e in es):
        assert out.wake, "a queue over the target wakes a sleeper"
    queued = {e.url for e in es if e.ready and e.sleeping and (e.waiting or e.running)}
    assert queued <= set(out.wake), "a sleeper that requests reached is woken at once"


def test_metrics_are_read_per_model():
    text = ('vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="other"} 9.0\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n# HELP x\n')
    assert observe.parse_metrics(text, "m") == (3.0, 2.0)


def test_an_answer_is_read_within_its_bound(monkeypatch):
    """A peer that sends without end (a wedged or hostile /metrics) costs the actuator at most
    MAX_READ_BYTES of memory: the read stops there, and a cut document fails to parse."""
    import http.server

    class Endless(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(256):  # 4 MiB, far past the bound below
                    self.wfile.write(b"#" * 16384)
            except OSError:
                pass

    class Server(LoopbackServer):
        def __init__(self) -> None:
            self._serve(Endless)

    monkeypatch.setattr(observe, "MAX_READ_BYTES", 64 << 10)
    with Server() as server:
        code, body = observe.http("GET", f"{server.base_url}/metrics", timeout=10)
    assert code == 200 and len(body) == 64 << 10
