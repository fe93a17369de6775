"""warmstart/decisions/hpa.py against cases taken from the upstream sources: the replica
calculator's external per-pod cases (kubernetes `pkg/controller/podautoscaler/replica_calculator_test.go`),
the scale-up and scale-down limits (`TestCalculateScaleUpLimitWithScalingRules`,
`TestCalculateScaleDownLimitWithBehaviors`, as karmada's FederatedHPA port of `horizontal.go`
carries them in `federatedhpa_controller_test.go`), and the deletion order's rules in
`ActivePodsWithRanks.Less` (`pkg/controller/controller_utils.go`)."""

from __future__ import annotations

import pytest

from warmstart.decisions import autoscaling as scaling
from warmstart.decisions import hpa


@pytest.mark.parametrize("name, current, total, target, expected", [
    ("TestReplicaCalcScaleUpPerPodCMExternal", 3, 8600, 2150, 4),
    ("TestReplicaCalcTolerancePerPodCMExternal", 3, 8600, 2900, 3),
    ("TestReplicaCalcScaleDownPerPodCMExternal", 5, 8600, 2867, 3),
])
def test_external_per_pod_cases_from_the_replica_calculator_tests(name, current, total, target, expected):
    assert hpa.external_per_pod_replicas(current, total, target) == expected, name


def test_a_zero_tolerance_moves_by_one_pod_at_any_size():
    # 11 pods asking for 12: within the default 10 %, so the HPA keeps 11; with tolerance 0 it adds one.
    assert hpa.external_per_pod_replicas(11, 12, 1) == 11
    assert hpa.external_per_pod_replicas(11, 12, 1, tolerance_up=0, tolerance_down=0) == 12
    assert hpa.external_per_pod_replicas(11, 10, 1, tolerance_up=0, tolerance_down=0) == 10


def _rules(*policies, select="Max", window=0):
    return hpa.Rules(window, tuple(hpa.Policy(*p) for p in policies), select)


def _limit(direction, current, rules, up=(), down=()):
    b = hpa.Behavior(rules, rules)
    h = hpa.Hpa(b, 0, 10_000, up_events=[(1000 + t, n) for t, n in up], down_events=[(1000 + t, n) for t, n in down])
    return h._up_limit(1000, current) if direction == "up" else h._down_limit(1000, current)


@pytest.mark.parametrize("case, current, rules, up, expected", [
    ("No previous events", 5, _rules(("Pods", 4, 60)), (), 9),
    ("With previous scale up event", 5, _rules(("Pods", 4, 60)), ((-30, 2),), 7),
    ("Disabled policy", 5, _rules(("Pods", 4, 60), select="Disabled"), (), 5),
    ("MinChange policy", 5, _rules(("Pods", 4, 60), ("Pods", 2, 60), select="Min"), (), 7),
    ("Percent scaling policy", 10, _rules(("Percent", 50, 60)), (), 15),
])
def test_scale_up_limits(case, current, rules, up, expected):
    assert _limit("up", current, rules, up=up) == expected, case


@pytest.mark.parametrize("case, current, rules, down, expected", [
    ("No previous events", 10, _rules(("Percent", 20, 60)), (), 8),
    ("With previous scale down event", 10, _rules(("Percent", 20, 60)), ((-30, 1),), 8),
    ("Multiple policies", 100, _rules(("Percent", 10, 60), ("Pods", 5, 60)), (), 90),
    ("Disabled policy", 10, _rules(("Percent", 20, 60), select="Disabled"), (), 10),
    ("MinChange policy", 100, _rules(("Percent", 10, 60), ("Pods", 15, 60), select="Min"), (), 90),
])
def test_scale_down_limits(case, current, rules, down, expected):
    assert _limit("down", current, rules, down=down) == expected, case


def _warmstart_hpa(window=300, period=300, lo=2, hi=5):
    plan = scaling.ScalingPlan(model="m", namespace="ns", deployment="m", min_replicas=lo, max_replicas=hi,
                               polling_interval_seconds=15, cooldown_period_seconds=window,
                               scale_down_stabilization_seconds=window, scale_down_period_seconds=period, triggers=())
    return hpa.Hpa(hpa.Behavior.from_spec(scaling.hpa_behavior(plan)), lo, hi)


def test_a_falling_load_is_back_at_the_floor_within_one_window():
    """Prod's qwen-67b: a 935 s budget, held whole by the window; 5 pods (4 awake + 1 sleeper) fall
    to 3 (2 + 1) one sync after the window, not one budget later."""
    budget = 935
    window, period = scaling.scale_down_hold_seconds(budget), scaling.scale_down_period_seconds(budget)
    h = _warmstart_hpa(window, period, lo=3, hi=5)
    assert h.step(0, 3, 5) == 5
    n, t = 5, 15
    while n > 3 and t < 3 * window:
        n = h.step(t, n, 3)
        t += 15
    assert n == 3 and t - 15 <= window + 2 * 15


def test_the_scale_down_window_holds_the_highest_recommendation_then_removes_one_pod_a_period():
    h = _warmstart_hpa()
    assert h.step(0, 2, 4) == 4, "scale-up: no window, up to 4 pods or double per 15 s"
    assert h.step(15, 4, 2) == 4 and h.step(285, 4, 2) == 4, "held while a higher recommendation is in the window"
    assert h.step(315, 4, 2) == 3, "past the window: one pod per period"
    assert h.step(330, 3, 2) == 3, "the next removal waits for the policy's period"
    assert h.step(615, 3, 2) == 2
    assert h.step(700, 2, 0) == 2, "never below minReplicas"


def test_a_metric_that_errors_holds_the_count():
    h = _warmstart_hpa()
    assert h.step(0, 4, None) == 4


@pytest.mark.parametrize("current, recs, expected", [
    (4, [3, 4], 4),          # the largest answer wins
    (4, [3, None], None),    # one errored and the other would scale down: no scaling
    (4, [4, None], 4),       # one errored, the other keeps the count: kept
    (4, [6, None], 6),       # one errored, the other scales up: up
    (4, [None, None], None),  # every metric errored
], ids=["largest", "errored-down", "errored-hold", "errored-up", "all-errored"])
def test_metrics_combine_as_compute_replicas_for_metrics(current, recs, expected):
    """`computeReplicasForMetrics` (horizontal.go): `invalidMetricsCount >= len(metricSpecs) ||
    (invalidMetricsCount > 0 && replicas < specReplicas)` returns an error, no rescale."""
    assert hpa.replicas_for_metrics(current, recs) == expected


def test_the_standby_actuator_down_holds_the_pods_up():
    """The standby figure (the actuator's metrics-api trigger) cannot be read while its pod restarts:
    a Prometheus figure that fell does not take a pod away (the sleeper stays), one that rose
    still adds one."""
    behavior = hpa.Behavior.from_spec(scaling.hpa_behavior(scaling.ScalingPlan(
        model="m", namespace="n", deployment="m", min_replicas=3, max_replicas=5, polling_interval_seconds=15,
        cooldown_period_seconds=300, scale_down_stabilization_seconds=0, scale_down_period_seconds=15, triggers=())))
    h = hpa.Hpa(behavior, 3, 5)
    assert h.step(0, 4, hpa.replicas_for_metrics(4, [3, None])) == 4
    assert h.step(15, 4, hpa.replicas_for_metrics(4, [5, None])) == 5
    # With the figure back, the same fall scales down (the window is 0 here).
    assert h.step(30, 5, hpa.replicas_for_metrics(5, [3, 3])) == 4


def test_the_replicaset_deletes_unassigned_pending_unready_then_the_lowest_cost():
    P = hpa.Pod
    order = [p.name for p in hpa.deletion_order([
        P("awake-busy", deletion_cost=0, ready_since=10, created=0),
        P("sleeper", deletion_cost=-100, ready_since=50, created=40),
        P("loading", ready=False, deletion_cost=100, created=60),
        P("pending", phase="Pending", ready=False, created=70),
        P("unscheduled", node="", phase="Pending", ready=False, created=5),
    ])]
    assert order == ["unscheduled", "pending", "loading", "sleeper", "awake-busy"]


def test_ties_go_to_the_doubled_up_then_the_newest_ready_then_the_most_restarted_then_the_newest():
    P = hpa.Pod
    assert hpa.deletion_order([P("a", colocated=1), P("b", colocated=2)])[0].name == "b"
    assert hpa.deletion_order([P("old", ready_since=1), P("new", ready_since=9)])[0].name == "new"
    assert hpa.deletion_order([P("a", restarts=0), P("b", restarts=3)])[0].name == "b"
    assert hpa.deletion_order([P("a", created=1), P("b", created=2)])[0].name == "b"


def test_the_rendered_behavior_asks_for_no_tolerance_so_one_pod_moves_at_any_size():
    plan = scaling.ScalingPlan(model="m", namespace="ns", deployment="m", min_replicas=2, max_replicas=20,
                               polling_interval_seconds=15, cooldown_period_seconds=300,
                               scale_down_stabilization_seconds=300, scale_down_period_seconds=300, triggers=())
    b = scaling.hpa_behavior(plan)
    assert b["scaleUp"]["tolerance"] == b["scaleDown"]["tolerance"] == "0"
    # With it, 11 pods (10 awake + a woken sleeper's replacement asked for) become 12.
    t = float(b["scaleUp"]["tolerance"])
    assert hpa.external_per_pod_replicas(11, 12, 1, tolerance_up=t, tolerance_down=t) == 12
