"""Awake engines the load no longer needs (issue 37, "the standby that holds", its last misses):

- a falling load returns to `minReplicas + count` pods at the end of the HPA's scale-down window:
  the idle surplus engines' pods get a deletion cost below the sleeper's, so the ReplicaSet
  removes them and keeps the sleeper (before: it removed the sleeper, and the actuator then had to
  drain an awake engine to get one back, a window plus a drain);
- a light load spread over every engine, none of them ever idle, still gets its sleeper back
  once a scale-down took it: the least loaded surplus engine is drained now, not after
  `awakeIdleSeconds` idle.

The decision and the costs are checked pure (decide.py, main.py `reconcile`, with the ReplicaSet's
own deletion order, decisions/hpa.py `deletion_order`); then the actuator as its pod runs it (the
built artifact) against fake vLLM engines under a spread load, and against idle ones with its
costs written to a file the ReplicaSet's order reads. Loops are bounded in count and time."""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.routing.fake_vllm import MODEL, FakeVllm
from tests.support.standby_actuator import Actuator
from warmstart.decisions import hpa
from warmstart.podside.standby import act, observe
from warmstart.podside.standby import decide as decision
from warmstart.podside.standby import main

BOUND_S = 60.0
# prod's shape in the bench: minReplicas 2, one sleeper, 5 waiting per engine, 7 requests per engine.
POLICY = decision.Policy(standby=1, min_awake=2, target_waiting=5, awake_idle_seconds=300, target_requests=7,
                         surplus_idle_seconds=60)


def _engine(url: str, running: float = 0, waiting: float = 0, *, sleeping: bool = False, idle_since: float = 0.0,
            served: bool = True) -> observe.Engine:
    return observe.Engine(url, pod=url, ready=True, sleeping=sleeping, running=running, waiting=waiting,
                          served=served, idle_since=idle_since, seen_ready=True)


# --------------------------------------------------------------------------------------
# A light, spread load: no engine idle, the sleeper gone


def _spread(per_engine: list[float]) -> list[observe.Engine]:
    # Every engine serves now and then (none idle for awakeIdleSeconds), no sleeper left.
    return [_engine(f"e{i}", running=r, idle_since=990.0) for i, r in enumerate(per_engine)]


def test_a_light_spread_load_gives_the_least_loaded_engine_back_to_the_standby():
    """Before: nothing slept (no engine idle for awakeIdleSeconds), and the model had no sleeper
    until the traffic stopped."""
    out = decision.decide(_spread([2, 1, 2, 1]), POLICY, now=1000.0)
    assert out.sleep == ["e1"], "6 requests need 1 engine (2 awake at least): the least loaded of 4 sleeps"
    assert not out.wake


def test_no_engine_sleeps_that_the_load_needs():
    # 4 x 7 = 28 requests: the demand is 4 engines, none to spare.
    assert decision.decide(_spread([7, 7, 7, 7]), POLICY, now=1000.0).sleep == []
    # 3 engines' worth on 4 (21 requests): one to spare, the least loaded.
    assert decision.decide(_spread([6, 5, 5, 5]), POLICY, now=1000.0).sleep == ["e1"]
    # Never below minReplicas awake engines, whatever the load.
    assert decision.decide(_spread([0.0, 1]), POLICY, now=1000.0).sleep == []


def test_no_engine_sleeps_whose_queue_the_others_could_not_hold():
    # The demand rule alone would spare one (20 requests / 7 = 3 of 4), but 19 wait: more than 5
    # per engine on three, so a sleep would be followed by a wake.
    es = _spread([0.0, 0, 0, 1])
    for e in es:
        e.waiting = 4.75
    assert decision.decide(es, POLICY, now=1000.0).sleep == []


def test_with_its_sleepers_there_or_without_a_demand_target_nothing_changes():
    es = _spread([2, 1, 2, 1]) + [_engine("s", sleeping=True)]
    assert decision.decide(es, POLICY, now=1000.0).sleep == [], "the standby is whole"
    no_target = decision.Policy(1, 2, 5, 300)
    assert decision.decide(_spread([2, 1, 2, 1]), no_target, now=1000.0).sleep == [], \
        "without targetRequestsPerReplica the load's demand is unknown: the idle rule alone"
    busy = _spread([2, 1, 2, 1])
    loading = busy + [observe.Engine("new", pod="new", ready=False)]
    assert decision.decide(loading, POLICY, now=1000.0).sleep == [], \
        "a pod loading is the sleeper to be (a wake's replacement): the woken engine keeps serving"
    assert decision.decide(busy, POLICY, now=1000.0, draining={"e3"}).sleep == [], "one drain at a time"
    assert decision.decide(busy, POLICY, now=1000.0, waking={"e3"}).sleep == [], "nothing while a wake runs"


# --------------------------------------------------------------------------------------
# After a fall: the idle surplus is what a scale-down removes


class Costs(observe.Static):
    """A pod source that records the deletion cost of each pod, as the ReplicaSet reads it."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(urls)
        self.costs: dict[str, str] = {}
        self.writes = 0

    def set_cost(self, pod: str, cost: str) -> None:
        self.costs[pod] = cost
        self.writes += 1


def _scale_down(engines: list[observe.Engine], costs: dict[str, str], n: int) -> list[str]:
    """The pods a ReplicaSet deletes on a scale-down by `n` (`ActivePodsWithRanks`)."""
    pods = [hpa.Pod(e.url, ready=e.ready, deletion_cost=int(costs.get(e.pod, "0")), ready_since=0.0) for e in engines]
    return [p.name for p in hpa.deletion_order(pods)[:n]]


def _tick(engines: list[observe.Engine], source: Costs, now: float) -> set[str]:
    """The cost part of one actuator tick (main.py `tick`): decide, then the surplus, then reconcile."""
    main.note(engines, now)
    actions = decision.decide(engines, POLICY, now)
    spare = decision.surplus(engines, POLICY, now, set(actions.wake), 0, set(actions.sleep))
    main.reconcile(engines, source, set(), now, 0.0, spare)
    return spare


def test_after_a_fall_the_scale_down_removes_idle_surplus_engines_and_keeps_the_sleeper():
    """Before: the sleeper (-100) went first, and a drain had to make another one."""
    es = [_engine(f"e{i}", idle_since=100.0 + i) for i in range(4)] + [_engine("s", sleeping=True)]
    source = Costs([e.url for e in es])
    assert _tick(es, source, now=1000.0) == {"e0", "e1"}, "4 awake, 2 needed: the two longest idle"
    assert source.costs == {"e0": act.COST["surplus"], "e1": act.COST["surplus"], "e2": "0", "e3": "0",
                            "s": act.COST["sleeping"]}
    assert int(act.COST["surplus"]) < int(act.COST["sleeping"]) < int(act.COST["awake"])
    # The HPA's scale-down from 5 pods to minReplicas + count = 3.
    assert sorted(_scale_down(es, source.costs, 2)) == ["e0", "e1"]


def test_an_engine_that_serves_again_gets_its_cost_back_at_once_and_costs_are_not_rewritten():
    es = [_engine(f"e{i}", idle_since=100.0 + i) for i in range(4)] + [_engine("s", sleeping=True)]
    source = Costs([e.url for e in es])
    _tick(es, source, now=1000.0)
    writes = source.writes
    _tick(es, source, now=1001.0)
    assert source.writes == writes, "an unchanged cost is not patched again (the docs ask for few patches)"
    es[0].running = 1  # a router sent it a request
    assert _tick(es, source, now=1002.0) == {"e1", "e2"}, "still two to spare: the next longest idle"
    assert source.costs["e0"] == act.COST["awake"]
    # A scale-down now takes the idle ones, never the one serving, and a sleeper before it.
    assert "e0" not in _scale_down(es, source.costs, 3)
    es[0].running = 0
    for e in es[1:4]:
        e.running = 1  # the others serve now: e0 alone is to spare
    assert _tick(es, source, now=1003.0) == set(), "marked again only after a whole idle hold"
    assert source.costs["e1"] == source.costs["e2"] == act.COST["awake"], "serving: back at once"
    assert _tick(es, source, now=1002.0 + 60.0 + 1) == {"e0"}
    assert source.costs["e0"] == act.COST["surplus"]


def test_engines_idle_less_than_the_hold_or_the_load_needs_are_not_surplus():
    es = [_engine(f"e{i}", idle_since=990.0) for i in range(4)] + [_engine("s", sleeping=True)]
    assert decision.surplus(es, POLICY, now=1000.0) == set(), "idle 10 s of a 60 s hold"
    busy = [_engine("a", running=7), _engine("b", running=7), _engine("c", running=7), _engine("d", idle_since=0.0)]
    assert decision.surplus(busy, POLICY, now=1000.0) == {"d"}, "21 requests need 3 engines of 4"
    busy[0].running = 0
    busy[0].idle_since = 0.0
    assert decision.surplus(busy, POLICY, now=1000.0) == {"a", "d"}, "14 requests need 2 of 4"
    fresh = [_engine("a"), _engine("b"), _engine("c"), _engine("new")]
    fresh[3].fresh_until = 2000.0
    assert decision.surplus(fresh, POLICY, now=1000.0, draining={"c"}) == {"a"}, \
        "the sleeper to be (fresh, or being drained) is not surplus; 3 awake, 2 needed"


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 9), st.integers(0, 9), st.floats(0, 1000)),
                max_size=7),
       st.integers(0, 2), st.integers(0, 3), st.integers(0, 20))
def test_a_sleeper_goes_before_any_awake_engine_with_requests_in_flight(spec, standby, min_awake, held):
    es = [observe.Engine(f"e{i}", pod=f"e{i}", ready=ready, sleeping=sleeping, running=r, waiting=w, served=True,
                         idle_since=idle)
          for i, (ready, sleeping, r, w, idle) in enumerate(spec)]
    policy = decision.Policy(standby, min_awake, 5, 300, target_requests=7, surplus_idle_seconds=60)
    spare = decision.surplus(es, policy, now=1000.0, held=held)
    by = {e.url: e for e in es}
    assert all(by[u].ready and not by[u].sleeping and by[u].running == 0 == by[u].waiting for u in spare)
    awake = [e for e in es if e.ready and not e.sleeping]
    assert len(awake) - len(spare) >= min(len(awake), min_awake), "never more than the engines to spare"
    source = Costs([e.url for e in es])
    main.reconcile(es, source, set(), 1000.0, 0.0, spare)
    order = _scale_down(es, source.costs, len(es))
    for e in es:
        if e.ready and e.sleeping:
            assert all(order.index(e.url) < order.index(b.url) for b in awake if b.running or b.waiting)


# --------------------------------------------------------------------------------------
# The actuator as its pod runs it, against fake engines


@pytest.mark.servers
def test_the_actuator_gives_a_spread_load_its_sleeper_back(tmp_path: Path):
    """Three awake engines, no sleeper, a light load a client spreads over the engines labelled
    awake (the routers' selection, read from the actuator's labels file): none is ever idle for
    awakeIdleSeconds (600 s), yet one is drained and put to sleep, and no request fails."""
    labels = tmp_path / "labels.json"
    with ExitStack() as stack:
        es = [stack.enter_context(FakeVllm(f"e{i}", dev_mode=True, delay_ms=150, max_num_seqs=2)) for i in range(3)]
        labels.write_text(json.dumps({e.url: observe.AWAKE for e in es}))
        done, statuses = threading.Event(), []
        rr = itertools.count()

        def client() -> None:
            for k in range(5000):
                if done.is_set():
                    return
                try:
                    awake = sorted(u for u, v in json.loads(labels.read_text()).items() if v == observe.AWAKE)
                except (OSError, ValueError):
                    continue
                url = awake[next(rr) % len(awake)]
                body = {"model": MODEL, "prompt": f"r{k}", "max_tokens": 1}
                req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=30) as r:
                        statuses.append(r.status)
                except urllib.error.HTTPError as e:
                    statuses.append(e.code)

        threads = [threading.Thread(target=client, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        stack.callback(lambda: [t.join(BOUND_S) for t in threads])
        stack.callback(done.set)
        a = Actuator([e.url for e in es], "--standby", "1", "--min-awake", "1", "--target-waiting", "5",
                     "--target-requests", "7", "--awake-idle-seconds", "600", "--labels-file", str(labels),
                     "--unlist-seconds", "0.5", "--drain-timeout", "20", ticks=150)
        stack.callback(a.stop)
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline and not a.events("warmstart.sleep"):
            time.sleep(0.2)
        time.sleep(1.0)  # the load goes on after the sleep
        done.set()
        for t in threads:
            t.join(BOUND_S)
        slept = [e for e in es if e.stats()["sleeping"]]
        assert len(slept) == 1, [e.stats() for e in es]
        assert slept[0].stats()["requests"] > 0, "it served before it slept: the load reached every engine"
        assert slept[0].stats()["refused_asleep"] == 0, "no request reached it once asleep"
        assert statuses and set(statuses) == {200}, statuses


@pytest.mark.servers
def test_the_actuator_writes_the_costs_a_scale_down_reads(tmp_path: Path):
    """Three idle awake engines and a sleeper, one awake engine needed: the two idle surplus pods
    carry the lowest cost in the costs file, so the ReplicaSet's order removes them first."""
    costs = tmp_path / "costs.json"
    with ExitStack() as stack:
        es = [stack.enter_context(FakeVllm(f"e{i}", dev_mode=True)) for i in range(3)]
        sleeper = stack.enter_context(FakeVllm("s", dev_mode=True, asleep=True))
        a = Actuator([*(e.url for e in es), sleeper.url], "--standby", "1", "--min-awake", "1", "--target-requests",
                     "7", "--surplus-idle-seconds", "0.5", "--costs-file", str(costs), ticks=200)
        stack.callback(a.stop)

        def marked() -> dict[str, str] | None:
            try:
                got = json.loads(costs.read_text())
            except (OSError, ValueError):
                return None
            return got if list(got.values()).count(act.COST["surplus"]) == 2 else None

        deadline = time.monotonic() + BOUND_S
        got = marked()
        while time.monotonic() < deadline and got is None:
            time.sleep(0.2)
            got = marked()
        assert got is not None, costs.read_text() if costs.exists() else "no costs written"
        assert got[sleeper.url] == act.COST["sleeping"]
        pods = [hpa.Pod(u, deletion_cost=int(c), ready_since=0.0) for u, c in got.items()]
        removed = [p.name for p in hpa.deletion_order(pods)[:2]]
        assert sleeper.url not in removed and len(removed) == 2
        assert not a.events("warmstart.sleep"), "the standby is whole: nothing is put to sleep"


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.integers(0, 9), st.integers(0, 12), st.booleans(),
                          st.floats(0, 1000)), max_size=7),
       st.integers(0, 2), st.integers(0, 3), st.integers(0, 20))
def test_no_sleep_leaves_fewer_engines_than_the_load_needs_or_a_queue_that_wakes_one(spec, standby, min_awake, held):
    es = [observe.Engine(f"e{i}", pod=f"e{i}", ready=ready, sleeping=sleeping, running=r, waiting=w, served=served,
                         idle_since=idle, seen_ready=True)
          for i, (ready, sleeping, r, w, served, idle) in enumerate(spec)]
    policy = decision.Policy(standby, min_awake, 5, 300, target_requests=7, surplus_idle_seconds=60)
    out = decision.decide(es, policy, now=1000.0, held=held)
    if not out.sleep:
        return
    awake = [e for e in es if e.ready and not e.sleeping]
    asleep = [e for e in es if e.ready and e.sleeping]
    (url,) = out.sleep
    assert url in {e.url for e in awake} and len(asleep) < standby
    assert len(awake) - 1 >= min_awake
    waiting = sum(e.waiting for e in awake) + held
    assert waiting <= 5 * (len(awake) - 1), "the queue on one engine fewer would wake a sleeper at once"
    slept = next(e for e in es if e.url == url)
    if slept.running or slept.waiting:
        # Only the surplus rule sleeps a busy engine: the load fits on the others.
        assert len(awake) - 1 >= decision.needed_awake(awake, policy, held)
        assert all(e.ready for e in es), "not while a pod loads (the sleeper to be)"
