"""A sleeping engine never receives a request (docs/scale-out.md, "Out of the router before it
sleeps"): the actuator relabels the pod out of the routers' worker selector, waits until no
router lists it and it has nothing in flight, and only then calls `POST /sleep`; a drain that does
not finish relabels the pod awake and sleeps nothing.

The order is checked against a scripted engine, router and Kubernetes (the actuator's `http` and
its pod source replaced); then end to end with the pinned SMG router (file discovery standing in
for its pod watch: the relabelled pod leaves the file, as it leaves SMG's label-selected watch)
in front of two fake vLLM engines under steady traffic. Loops are bounded in count and time."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.routing.fake_vllm import MODEL, FakeVllm
from tests.routing.router import SmgRouter, write_discovery_file
from warmstart.decisions import routing
from warmstart.manifests import routing as router_objects
from warmstart.manifests import serving
from warmstart.podside.standby import act, observe
from warmstart.podside.standby import decide as decision
from warmstart.podside.standby import main as actuator

BOUND_S = 30.0


# --------------------------------------------------------------------------------------
# The label: on the serving pods, in the routers' selector, in no selector that must keep the pod


def test_the_label_is_the_one_the_actuator_writes_and_only_the_routers_select_on_it():
    assert (serving.ENGINE_LABEL, serving.ENGINE_AWAKE) == (observe.ENGINE_LABEL, observe.AWAKE)
    pod = serving.pod_labels("m")
    assert pod[serving.ENGINE_LABEL] == serving.ENGINE_AWAKE, "a fresh pod is awake (its readiness keeps it out)"
    assert serving.worker_selector("m").items() <= pod.items()
    asleep = pod | {observe.ENGINE_LABEL: observe.ASLEEP}
    assert not serving.worker_selector("m").items() <= asleep.items(), "an asleep pod leaves the routers"
    # What must keep selecting the pod once it sleeps: its ReplicaSet, its PDB, its policies.
    assert serving.selector("m").items() <= asleep.items() and serving.ENGINE_LABEL not in serving.selector("m")


def test_the_router_discovers_awake_engines_only():
    args = router_objects.container_args(routing.RoutingPlan(model="m", namespace="ns", policy="prefix_hash",
                                                             cluster_mode="karpenter", image="i"))
    i = args.index("--selector")
    sel = []
    for a in args[i + 1:]:
        if a.startswith("--"):
            break
        sel.append(a)
    assert f"{serving.ENGINE_LABEL}={serving.ENGINE_AWAKE}" in sel
    assert sorted(sel) == sorted(f"{k}={v}" for k, v in serving.worker_selector("m").items())


# --------------------------------------------------------------------------------------
# The order, against a scripted engine, router and Kubernetes


class Script:
    """The engine's /metrics, the router's /workers and the pod's label, with every call logged."""

    def __init__(self, running: list[float], listed_for: int) -> None:
        self.running, self.listed_for, self.calls = list(running), listed_for, []
        self.label = observe.AWAKE

    labels = True

    def set_label(self, pod: str, value: str) -> None:
        self.calls.append(("label", value))
        self.label = value

    def http(self, method: str, url: str, body: object = None, timeout: float = 2.0) -> tuple[int, bytes]:
        path = urllib.parse.urlsplit(url).path
        self.calls.append((method, path))
        if path == "/workers":
            listed = self.label == observe.AWAKE or self.listed_for > 0
            self.listed_for -= self.label != observe.AWAKE
            return 200, json.dumps({"workers": [{"url": "http://127.0.0.1:2"}] * listed}).encode()
        if path == "/metrics":
            r = self.running.pop(0) if len(self.running) > 1 else self.running[0]
            return 200, f"vllm:num_requests_running {r}\nvllm:num_requests_waiting 0\n".encode()
        if path.startswith("/sleep"):
            return 200, b'{"status": "sleeping"}'
        raise AssertionError(f"unexpected call {method} {url}")


def _drain(monkeypatch, script: Script, timeout: float = 5.0, cancel: threading.Event | None = None) -> bool:
    monkeypatch.setattr(observe, "http", script.http)
    e = observe.Engine("http://127.0.0.1:2", pod="p", ready=True)
    ok = act.drain(e, script, ["http://127.0.0.1:1"], 0.0, timeout, None, 0.5, cancel or threading.Event())
    if ok:
        act.put_to_sleep(e, 1, 5.0)
    return ok


def test_an_engine_sleeps_only_once_out_of_the_router_and_idle(monkeypatch):
    s = Script(running=[2, 1, 0], listed_for=3)
    assert _drain(monkeypatch, s)
    assert s.calls[0] == ("label", observe.ASLEEP), "out of the routers' selector first"
    sleep_at = s.calls.index(("POST", "/sleep"))
    assert sleep_at == len(s.calls) - 1
    workers = [i for i, c in enumerate(s.calls) if c == ("GET", "/workers")]
    metrics = [i for i, c in enumerate(s.calls) if c == ("GET", "/metrics")]
    assert len(workers) == 4, "polled until the router stopped listing it"
    assert max(workers) < min(metrics), "idle is read only once no router sends to it"
    assert len(metrics) == 3, "until nothing runs on it"
    assert s.label == observe.ASLEEP


def test_a_drain_that_times_out_sleeps_nothing_and_relabels_the_pod_awake(monkeypatch, capsys):
    s = Script(running=[1], listed_for=0)
    assert not _drain(monkeypatch, s, timeout=0.5)
    assert ("POST", "/sleep") not in s.calls
    assert s.calls[-1] == ("label", observe.AWAKE) and s.label == observe.AWAKE
    (line,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert line["event"] == "warmstart.sleep_skipped" and line["reason"] == "requests in flight"


def test_a_router_that_keeps_listing_the_engine_stops_the_sleep(monkeypatch):
    s = Script(running=[0], listed_for=10_000)
    assert not _drain(monkeypatch, s, timeout=0.5)
    assert ("POST", "/sleep") not in s.calls and ("GET", "/metrics") not in s.calls
    assert s.label == observe.AWAKE


def test_a_cancelled_drain_keeps_the_engine_awake(monkeypatch):
    cancel = threading.Event()
    cancel.set()
    s = Script(running=[0], listed_for=0)
    assert not _drain(monkeypatch, s, cancel=cancel)
    assert ("POST", "/sleep") not in s.calls and s.label == observe.AWAKE


def test_an_engine_being_drained_is_neither_awake_nor_a_sleeper_to_wake():
    es = [observe.Engine("a", ready=True, waiting=20), observe.Engine("d", ready=True),
          observe.Engine("s", ready=True, sleeping=True)]
    out = decision.decide(es, decision.Policy(1, 1, 5, 0), now=0.0, draining={"d"})
    assert out.wake == ["s"] and not out.sleep
    calm = [observe.Engine("a", ready=True), observe.Engine("b", ready=True), observe.Engine("d", ready=True)]
    assert not decision.decide(calm, decision.Policy(2, 1, 5, 0), now=0.0, draining={"d"}).sleep, \
        "one drain at a time"


# --------------------------------------------------------------------------------------
# End to end: the real router, two fake engines, steady traffic


class FileDiscovery(observe.Static):
    """The pods' labels as SMG's file discovery: a pod labelled asleep leaves the file, as it leaves
    the label-selected pod watch of SMG's Kubernetes discovery."""

    def __init__(self, urls: list[str], manifest: Path) -> None:
        super().__init__(urls)
        self.labels = True
        self.manifest, self.awake, self.lock = manifest, set(urls), threading.Lock()
        write_discovery_file(manifest, self.awake)

    def set_label(self, pod: str, value: str) -> None:
        with self.lock:
            (self.awake.add if value == observe.AWAKE else self.awake.discard)(pod)
            write_discovery_file(self.manifest, self.awake)


def _chat(url: str, i: int) -> int:
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": f"r{i}"}]}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=BOUND_S) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.servers
def test_no_request_reaches_an_engine_once_its_sleep_began(tmp_path):
    with ExitStack() as stack:
        engines = [stack.enter_context(FakeVllm(f"e{i}", dev_mode=True, delay_ms=30)) for i in range(2)]
        manifest = tmp_path / "workers.json"
        source = FileDiscovery([e.url for e in engines], manifest)
        router = stack.enter_context(SmgRouter(
            [*routing.policy_flags("round_robin"), "--discovery-provider", "file", "--discovery-file", str(manifest),
             "--discovery-check-interval-secs", "1"], wait_for_workers=2))
        statuses: list[int] = []
        done = threading.Event()

        def client() -> None:
            for i in range(2000):
                if done.is_set():
                    return
                statuses.append(_chat(router.url, i))
                time.sleep(0.05)

        t = threading.Thread(target=client, daemon=True)
        t.start()
        stack.callback(t.join, BOUND_S)
        stack.callback(done.set)
        time.sleep(1.0)  # both engines serve
        args = actuator.parse_args(["--model", MODEL, "--engines", ",".join(e.url for e in engines),
                                    "--standby", "1", "--min-awake", "1", "--awake-idle-seconds", "0",
                                    "--period", "0.2", "--probe-timeout", "2", "--drain-timeout", "20",
                                    "--router", router.url, "--max-ticks", "60"])
        stop = threading.Event()
        run = threading.Thread(target=actuator.run, args=(args, stop, source), daemon=True)
        run.start()
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline and not any(e.stats()["sleeping"] for e in engines):
            time.sleep(0.1)
        time.sleep(2.0)  # traffic goes on after the sleep
        stop.set()
        run.join(BOUND_S)
        done.set()
        t.join(BOUND_S)
        (slept,) = [e for e in engines if e.stats()["sleeping"]]
        (awake,) = [e for e in engines if not e.stats()["sleeping"]]
        assert slept.stats()["refused_asleep"] == 0, "a request reached the engine after its sleep began"
        assert slept.stats()["requests"] > 0, "it served before it slept (the router did send to it)"
        assert router.workers() and all(slept.url.split("//")[1] not in w["url"] for w in router.workers())
        assert statuses and set(statuses) == {200}, statuses
        assert awake.stats()["requests"] > slept.stats()["requests"]


# --------------------------------------------------------------------------------------
# A wake's replacement becomes the sleeper, even when the routers reached it first


def _served_replacement(fresh_until: float):
    # Three awake engines under load (one woken a moment ago), no sleeper, and the pod the figure
    # asked for as the sleeper, loaded and already sent requests by a router.
    return [observe.Engine("a", ready=True, running=2, waiting=3, served=True),
            observe.Engine("b", ready=True, running=2, waiting=3, served=True),
            observe.Engine("c", ready=True, running=2, waiting=3, served=True),
            observe.Engine("new", ready=True, running=2, waiting=1, served=True, fresh_until=fresh_until)]


def test_a_freshly_loaded_engine_is_the_missing_sleeper_whatever_it_serves():
    """Before: the idle rule kept a replacement that a router reached before the actuator's tick
    awake while the load held, and the next step found no sleeper (bench/scaleout.py's second
    step, no wake)."""
    policy = decision.Policy(1, 2, 5, 300)
    assert decision.decide(_served_replacement(fresh_until=10.0), policy, now=5.0).sleep == ["new"]
    # Past its freshness it is an awake engine like the others: the idle rule holds it.
    assert decision.decide(_served_replacement(fresh_until=10.0), policy, now=11.0).sleep == []
    # A queue the others could not hold without it (over 5 waiting per engine): it serves, rather
    # than sleep and be woken the next second.
    crowded = _served_replacement(fresh_until=10.0)
    for e in crowded[:3]:
        e.waiting = 6
    assert decision.decide(crowded, policy, now=5.0).sleep == []
    # With the sleepers all there, a fresh engine is capacity the load asked for: it stays awake.
    es = _served_replacement(fresh_until=10.0) + [observe.Engine("s", ready=True, sleeping=True)]
    assert decision.decide(es, policy, now=5.0).sleep == []


def test_reconcile_marks_an_engine_that_comes_up_awake_fresh_and_a_sleeper_never():
    from warmstart.podside.standby import main

    new, sleeper = observe.Engine("new", ready=True), observe.Engine("s", ready=True, sleeping=True)
    main.reconcile([new, sleeper], observe.Static(["new", "s"]), set(), now=100.0, fresh_seconds=30.0)
    assert (new.fresh_until, sleeper.fresh_until) == (130.0, 0.0)
    # At the actuator's first reading (fresh_seconds 0: a restart beside busy engines) none is fresh.
    old = observe.Engine("old", ready=True, running=3)
    main.reconcile([old], observe.Static(["old"]), set(), now=100.0, fresh_seconds=0.0)
    assert old.fresh_until <= 100.0
    assert decision.decide([old, observe.Engine("b", ready=True)], decision.Policy(1, 1, 5, 300), now=100.0).sleep != ["old"]
    # Woken later, the sleeper is not fresh; seen again, the new one keeps its first mark.
    sleeper.sleeping = False
    main.reconcile([new, sleeper], observe.Static(["new", "s"]), set(), now=110.0, fresh_seconds=30.0)
    assert (new.fresh_until, sleeper.fresh_until) == (130.0, 0.0)


def test_the_pods_figure_is_the_sleepers_beside_the_most_of_floor_demand_and_the_woken():
    policy = decision.Policy(1, 2, 5, 300)
    es = [observe.Engine("a", ready=True, running=6, waiting=8), observe.Engine("b", ready=True, running=6),
          observe.Engine("s", ready=True, sleeping=True), observe.Engine("loading", ready=False, waiting=99)]
    assert decision.pods_figure(es, policy) == 1 + 2, "no demand term without a per-engine target"
    assert decision.pods_figure(es, policy, target_requests=7) == 1 + 3, "ceil(20 / 7): a loading engine counts nothing"
    assert decision.pods_figure(es, policy, held=2, target_requests=7) == 1 + 4, "held requests are demand"
    assert decision.pods_figure(es, policy, woken=5, target_requests=7) == 1 + 5


# --------------------------------------------------------------------------------------
# A wake's replacement is out of the routers before it is Ready


def test_a_loading_pod_that_is_to_be_the_missing_sleeper_is_labelled_asleep_before_it_is_ready():
    """Before: the replacement came up Ready with its template's `awake` label, the routers sent it
    requests until the actuator's next period, and its drain waited for them (the bench counted
    the model one sleeper short meanwhile)."""
    policy = decision.Policy(1, 2, 5, 300)
    awake = [observe.Engine(u, pod=u, ready=True, running=2) for u in ("a", "b", "c")]
    new, other = observe.Engine("new", pod="new"), observe.Engine("other", pod="other")
    assert decision.sleepers_to_be(awake + [new, other], policy) == {"new"}, "one sleeper missing: one pod"
    assert decision.sleepers_to_be(awake + [new], policy, draining={"c"}) == set(), "a drain makes the sleeper"
    asleep = observe.Engine("s", pod="s", ready=True, sleeping=True)
    assert decision.sleepers_to_be(awake + [new, asleep], policy) == set(), "the standby is whole"
    assert decision.sleepers_to_be(awake + [new, asleep], policy, waking={"s"}) == {"new"}, "a wake spends it"
    was_ready = observe.Engine("flaky", pod="flaky", seen_ready=True)
    assert decision.sleepers_to_be(awake + [was_ready], policy) == set(), \
        "a pod once Ready that fails one /health read may be in the routers: its label is left alone"

    labels: dict[str, str] = {}

    class Source(observe.Static):
        def set_label(self, pod: str, value: str) -> None:
            labels[pod] = value

    engines = awake + [new, other]
    from warmstart.podside.standby import main
    main.reconcile(engines, Source([]), set(), now=100.0, to_be={"new"})
    assert labels == {"a": observe.AWAKE, "b": observe.AWAKE, "c": observe.AWAKE, "new": observe.ASLEEP}
    assert new.prelabelled and not other.prelabelled
    # Up, and the load needs it (not drained this period): it joins the routers on this period.
    new.ready = True
    main.reconcile(engines, Source([]), set(), now=101.0, fresh_seconds=30.0)
    assert labels["new"] == observe.AWAKE and not new.prelabelled


def test_a_drain_of_a_pod_never_in_the_routers_does_not_wait_for_them(monkeypatch):
    s = Script(running=[0], listed_for=10_000)  # a router that would list anything labelled awake
    s.label = observe.ASLEEP
    monkeypatch.setattr(observe, "http", s.http)
    e = observe.Engine("http://127.0.0.1:2", pod="p", ready=True, label=observe.ASLEEP, prelabelled=True)
    assert act.drain(e, s, ["http://127.0.0.1:1"], 3.0, 5.0, None, 0.5, threading.Event())
    assert ("GET", "/workers") not in s.calls and ("label", observe.ASLEEP) not in s.calls
    assert s.calls == [("GET", "/metrics")], "only that nothing runs on it"
    # Labelled asleep some other way (not before it was ever Ready): the routers are asked.
    s2 = Script(running=[0], listed_for=2)
    monkeypatch.setattr(observe, "http", s2.http)
    e2 = observe.Engine("http://127.0.0.1:2", pod="p", ready=True, label=observe.ASLEEP)
    assert act.drain(e2, s2, ["http://127.0.0.1:1"], 3.0, 5.0, None, 0.5, threading.Event())
    assert ("GET", "/workers") in s2.calls


def test_the_pods_file_stands_in_for_the_pod_list(tmp_path):
    """The bench's engines not created yet are no pods (before, they were read as pods loading, and
    the sleeper to be was labelled on one of them)."""
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps(["b"]))
    assert observe.Static(["a", "b", "c"], pods_file=str(pods)).engines() == [("b", "b")]
    pods.write_text(json.dumps({"b": 1}))
    with pytest.raises(ValueError, match="not a JSON list"):
        observe.Static(["a", "b"], pods_file=str(pods)).engines()
