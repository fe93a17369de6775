"""The pool's arbitration (warmstart/podside/engine_host/pool.py), pure: spare hosts are given to
rises in arrival order, one wake per host, the rest start cold; the pool keeps its spares beside
every serving host; a scale-down takes a spare first. Against live supervisors in
tests/podside/test_engine_host.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from warmstart.podside.engine_host import pool

MODELS = ["m0", "m1", "m2", "m3"]
STATES = ["asleep", "awake", "starting", "failed", "pending"]

hosts_st = st.lists(st.lists(st.sampled_from(STATES), min_size=4, max_size=4), max_size=6).map(
    lambda rows: [pool.HostView(name=f"h{i}", url=f"http://10.0.0.{i}:8090", states=dict(zip(MODELS, r)))
                  for i, r in enumerate(rows)])
rises_st = st.lists(st.tuples(st.floats(0, 100), st.sampled_from(MODELS)), max_size=8)


@given(hosts=hosts_st, rises=rises_st, taken=st.sets(st.sampled_from([f"h{i}" for i in range(6)])))
def test_each_spare_host_wakes_at_most_one_engine_and_only_spares_wake(hosts, rises, taken) -> None:
    wakes, cold = pool.assign(hosts, rises, taken)
    by_name = {h.name: h for h in hosts}
    assert len(wakes) + len(cold) == len(rises)
    assert len({w.host for w in wakes}) == len(wakes)  # one wake per host
    for w in wakes:
        h = by_name[w.host]
        assert h.spare and h.name not in taken
        assert w.engine_url == f"{h.url}/engines/{w.model}"
    spare = [h for h in hosts if h.spare and h.name not in taken]
    assert len(wakes) == min(len(rises), len(spare))  # every host has every model's engine here


@given(hosts=hosts_st, rises=rises_st)
def test_rises_are_served_in_arrival_order(hosts, rises) -> None:
    wakes, cold = pool.assign(hosts, rises)
    ordered = [m for _, m in sorted(rises)]
    # The wakes are the first rises in arrival order; the rest are cold.
    assert [w.model for w in wakes] == ordered[:len(wakes)]
    assert cold == ordered[len(wakes):]


def test_two_rises_inside_the_window_get_the_spare_and_then_a_cold_start() -> None:
    spare = pool.HostView("h0", "http://a:8090", dict.fromkeys(MODELS, "asleep"))
    replacement = pool.HostView("h1", "http://b:8090", {"m0": "asleep", "m1": "starting", "m2": "pending",
                                                         "m3": "pending"})
    wakes, cold = pool.assign([spare, replacement], [(2.0, "m3"), (1.0, "m1")])
    assert [(w.model, w.host) for w in wakes] == [("m1", "h0")] and cold == ["m3"]


@given(hosts=hosts_st, spares=st.integers(0, 3))
def test_the_pool_keeps_its_spares_beside_every_serving_host(hosts, spares) -> None:
    serving = sum(1 for h in hosts if h.serving)
    assert pool.desired_hosts(hosts, spares) == serving + spares
    costs = pool.deletion_costs(hosts)
    for h in hosts:
        # A scale-down takes a spare before a serving host, and a host still starting last.
        if h.spare:
            assert int(costs[h.name]) < 0
        elif h.serving:
            assert int(costs[h.name]) == 0
        else:
            assert int(costs[h.name]) > 0


def test_a_snapshot_that_is_not_the_supervisors_is_ignored() -> None:
    assert pool.parse_snapshot("h", "http://x:8090/", {"engines": [{"model": "m0", "state": "asleep"}]}).url == \
        "http://x:8090"
    for bad in (None, [], {"engines": "x"}, {"engines": [{"model": 1, "state": "asleep"}]}, {"engines": [3]}):
        assert pool.parse_snapshot("h", "http://x", bad) is None
