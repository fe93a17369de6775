"""The HorizontalPodAutoscaler's replica decision and the ReplicaSet's choice of which pod to delete,
as Kubernetes computes them (pure).

KEDA hands its ScaledObject's triggers to an HPA it creates, so what a warmstart model's pod count
does under load is decided by the HPA controller and the ReplicaSet controller, not by KEDA. This
module restates their rules for the parts a KEDA `AverageValue` external metric uses, so the
scale-out bench (bench/scaleout.py) and the tests can run a model's scaling on the bench's clock.
Nothing here is tuned to a result; each rule names its upstream function:

- `external_per_pod_replicas`: `GetExternalPerPodMetricReplicas`
  (kubernetes `pkg/controller/podautoscaler/replica_calculator.go`): the metric's values summed,
  `ceil(sum / target)` unless `sum / (target x current)` lies within the tolerance (10 % by
  default, `--horizontal-pod-autoscaler-tolerance`; per direction with `behavior.*.tolerance`,
  KEP-4951, beta and on by default since Kubernetes 1.35), then the current count is kept;
- `Hpa.step`: `normalizeDesiredReplicasWithBehaviors` (`horizontal.go`): the stabilization windows
  (`stabilizeRecommendationWithBehaviors`: the lowest recommendation of the scale-up window and
  the highest of the scale-down window bound the new count), then the policies' rate limits
  (`convertDesiredReplicasWithBehaviorRate`, `calculateScaleUpLimitWithScalingRules`,
  `calculateScaleDownLimitWithBehaviors`, counting the replicas changed within each policy's
  period), then min and max;
- the metrics together: `replicas_for_metrics`, as `computeReplicasForMetrics` (`horizontal.go`)
  combines them: the largest recommendation of the metrics that answered; when every metric
  errored, or one errored and the others would scale down, no count at all (None: `Hpa.step`
  then keeps the current count). So a KEDA trigger that cannot be read (the standby actuator's
  figure while its pod restarts) can hold the pods up, never take them down;
- `deletion_order`: `ActivePodsWithRanks.Less` (`pkg/controller/controller_utils.go`), the
  order in which a ReplicaSet deletes pods on a scale-down (`getPodsToDelete`,
  `pkg/controller/replicaset/replica_set.go`). The logarithmic bucketing of ready and creation
  times (`Now` set) is left out: the bench's pods differ by seconds, where it would tie.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_TOLERANCE = 0.1


def external_per_pod_replicas(current: int, total: float, target_per_pod: float, *,
                              tolerance_up: float = DEFAULT_TOLERANCE,
                              tolerance_down: float = DEFAULT_TOLERANCE) -> int:
    """The replica count an `AverageValue` external metric asks for (`GetExternalPerPodMetricReplicas`);
    `total` is the sum of the metric's values, as KEDA's metrics server returns them."""
    if target_per_pod <= 0:
        raise ValueError("target_per_pod must be > 0")
    if current <= 0:
        # The HPA is not consulted at zero replicas: KEDA's operator scales 0 -> 1 itself.
        return math.ceil(total / target_per_pod)
    ratio = total / (target_per_pod * current)
    # `tolerances.isWithin`: 1 - down <= ratio <= 1 + up keeps the current count.
    if 1.0 - tolerance_down <= ratio <= 1.0 + tolerance_up:
        return current
    return math.ceil(total / target_per_pod)


def replicas_for_metrics(current: int, recommendations: list[int | None]) -> int | None:
    """The HPA's recommendation from each metric's (None: that metric errored), as
    `computeReplicasForMetrics` combines them: the largest of those that answered, or None (no
    scaling this sync) when every metric errored or one did and the rest would scale down."""
    valid = [r for r in recommendations if r is not None]
    invalid = len(recommendations) - len(valid)
    best = max(valid, default=0)
    if invalid >= len(recommendations) or (invalid and best < current):
        return None
    return best


@dataclass(frozen=True)
class Policy:
    kind: str  # "Pods" or "Percent"
    value: int
    period_seconds: int


@dataclass(frozen=True)
class Rules:
    """One direction of `behavior` (HPAScalingRules)."""

    stabilization_seconds: int
    policies: tuple[Policy, ...]
    select: str = "Max"  # "Max", "Min" or "Disabled"


@dataclass(frozen=True)
class Behavior:
    scale_up: Rules
    scale_down: Rules

    @classmethod
    def from_spec(cls, behavior: dict) -> "Behavior":
        """From an autoscaling/v2 `behavior` mapping (as decisions/autoscaling.py `hpa_behavior` writes it)."""
        def rules(d: dict) -> Rules:
            return Rules(int(d.get("stabilizationWindowSeconds", 0)),
                         tuple(Policy(p["type"], int(p["value"]), int(p["periodSeconds"])) for p in d["policies"]),
                         d.get("selectPolicy", "Max"))
        return cls(rules(behavior["scaleUp"]), rules(behavior["scaleDown"]))


@dataclass
class Hpa:
    """One HPA's memory between syncs: its recent recommendations and scale events."""

    behavior: Behavior
    min_replicas: int
    max_replicas: int
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    up_events: list[tuple[float, int]] = field(default_factory=list)
    down_events: list[tuple[float, int]] = field(default_factory=list)

    def _changed_within(self, events: list[tuple[float, int]], now: float, period: int) -> int:
        return sum(n for t, n in events if t > now - period)

    def _stabilize(self, now: float, current: int, desired: int) -> int:
        up_cut = now - self.behavior.scale_up.stabilization_seconds
        down_cut = now - self.behavior.scale_down.stabilization_seconds
        up_rec, down_rec = desired, desired
        for t, rec in self.recommendations:
            if t > up_cut:
                up_rec = min(rec, up_rec)
            if t > down_cut:
                down_rec = max(rec, down_rec)
        # Samples older than both windows are dropped (upstream reuses one such slot).
        self.recommendations = [(t, r) for t, r in self.recommendations if t > up_cut or t > down_cut]
        self.recommendations.append((now, desired))
        return min(max(current, up_rec), down_rec)

    def _up_limit(self, now: float, current: int) -> int:
        r = self.behavior.scale_up
        if r.select == "Disabled":
            return current
        pick, out = (min, math.inf) if r.select == "Min" else (max, -math.inf)
        for p in r.policies:
            start = current - self._changed_within(self.up_events, now, p.period_seconds) + \
                self._changed_within(self.down_events, now, p.period_seconds)
            proposed = start + p.value if p.kind == "Pods" else math.ceil(start * (1 + p.value / 100))
            out = pick(out, proposed)
        return int(out)

    def _down_limit(self, now: float, current: int) -> int:
        r = self.behavior.scale_down
        if r.select == "Disabled":
            return current
        pick, out = (max, -math.inf) if r.select == "Min" else (min, math.inf)
        for p in r.policies:
            start = current - self._changed_within(self.up_events, now, p.period_seconds) + \
                self._changed_within(self.down_events, now, p.period_seconds)
            proposed = start - p.value if p.kind == "Pods" else int(start * (1 - p.value / 100))
            out = pick(out, proposed)
        return int(out)

    def step(self, now: float, current: int, desired: int | None) -> int:
        """One sync: the replica count the HPA writes, given the metric's recommendation
        (`desired`; None: the metric errored, so the count holds)."""
        if desired is None:
            return current
        stabilized = self._stabilize(now, current, desired)
        if stabilized > current:
            limit = max(self._up_limit(now, current), current)
            new = min(stabilized, self.max_replicas, limit)
        elif stabilized < current:
            limit = min(self._down_limit(now, current), current)
            new = max(stabilized, self.min_replicas, limit)
        else:
            new = stabilized
        new = min(max(new, self.min_replicas), self.max_replicas)
        if new > current:
            self.up_events.append((now, new - current))
        elif new < current:
            self.down_events.append((now, current - new))
        return new


@dataclass(frozen=True)
class Pod:
    """What `ActivePodsWithRanks.Less` compares."""

    name: str
    node: str = "node"
    phase: str = "Running"  # Pending, Unknown, Running
    ready: bool = True
    deletion_cost: int = 0
    colocated: int = 1
    """Active pods of the same ReplicaSet on this pod's node (`getPodsRankedByRelatedPodsOnSameNode`)."""
    ready_since: float | None = None
    restarts: int = 0
    created: float = 0.0


_PHASE = {"Pending": 0, "Unknown": 1, "Running": 2}


def _key(p: Pod) -> tuple:
    return (
        p.node != "",                        # 1. unassigned first
        _PHASE.get(p.phase, 0),              # 2. Pending < Unknown < Running
        p.ready,                             # 3. not ready first
        p.deletion_cost,                     # 4. lower pod-deletion-cost first
        -p.colocated,                        # 5. doubled up first
        # 6. ready for less time first (both ready; an unknown ready time first)
        -(p.ready_since if p.ready_since is not None else math.inf) if p.ready else 0,
        -p.restarts,                         # 7. more restarts first
        -p.created,                          # 8. newer first
        p.name,                              # upstream: UID, a pseudo-random tie-break
    )


def deletion_order(pods: list[Pod]) -> list[Pod]:
    """The pods in the order a ReplicaSet deletes them (the first `n` go on a scale-down by `n`)."""
    return sorted(pods, key=_key)
