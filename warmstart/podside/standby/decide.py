"""The standby actuator's decision (pure): which sleepers to wake and which awake engine to put
to sleep this tick, from what `observe` read. Part of the standby package (main.py says why)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .observe import Engine


@dataclass(frozen=True)
class Policy:
    standby: int
    min_awake: int
    target_waiting: float
    awake_idle_seconds: float
    target_requests: float = 0.0
    """Requests (running plus waiting) one engine carries (`--target-requests`): the load's
    demand in engines, as the figure and KEDA's engine-demand query count it (0: no demand term)."""
    surplus_idle_seconds: float = 60.0
    """How long an awake engine the load does not need must be idle before `surplus` marks it."""


def load_demand(engines: list[Engine], held: int, target_requests: float) -> int:
    """The engines the load needs, ceil((running + waiting + held) / `target_requests`) over the
    ready engines (KEDA's engine-demand query, decisions/autoscaling.py `demand_query`, read here
    every period); 0 without a per-engine target."""
    load = sum(e.waiting + e.running for e in engines if e.ready) + held
    return math.ceil(load / target_requests) if target_requests > 0 else 0


def needed_awake(engines: list[Engine], policy: Policy, held: int = 0) -> int:
    """The awake engines the load needs: the most of `min_awake` and the load's demand."""
    return max(policy.min_awake, load_demand(engines, held, policy.target_requests))


@dataclass
class Actions:
    wake: list[str] = field(default_factory=list)
    sleep: list[str] = field(default_factory=list)


def decide(engines: list[Engine], policy: Policy, now: float, waking: set[str] = frozenset(),
           held: int = 0, draining: set[str] = frozenset()) -> Actions:
    """What to do this tick. `waking`: engines whose wake is in flight (they count as awake);
    `held`: requests a front queue holds for want of an awake engine (they count as waiting);
    `draining`: engines being taken out of the router to sleep (neither awake nor a sleeper to
    wake: the router no longer sends to them)."""
    awake = [e for e in engines if e.ready and e.url not in draining and (not e.sleeping or e.url in waking)]
    asleep = [e for e in engines if e.ready and e.sleeping and e.url not in waking and e.url not in draining]
    waiting = sum(e.waiting for e in awake) + held
    out = Actions()
    # Sleepers to wake: enough that the queue is within the target per awake engine.
    need = max(0, policy.min_awake - len(awake))
    if waiting > policy.target_waiting * len(awake):
        # KEDA's own rule for an AverageValue target: ceil(waiting / target) engines.
        need = max(need, math.ceil(waiting / policy.target_waiting) - len(awake), 1)
    # A sleeper with requests queued: vLLM 0.33 queues what reaches a paused engine ("All pause
    # modes queue new adds", vllm/v1/engine/core.py) instead of refusing it, and a request can
    # reach one in the second before its readiness turns false; wake it first, so no request
    # waits longer than a wake.
    queued = [e for e in asleep if e.waiting or e.running]
    need = max(need, len(queued))
    if need and asleep:
        out.wake = [e.url for e in sorted(asleep, key=lambda e: (not (e.waiting or e.running), e.url))[:need]]
        return out
    if waking or draining or len(asleep) >= policy.standby or len(awake) <= policy.min_awake:
        return out
    # A sleeper is missing and a freshly loaded engine that never slept is there: it is the pod
    # the figure asked for as the sleeper (a wake's replacement), so it sleeps now, whatever it
    # serves. The routers may have sent it requests in the second between its readiness and this
    # tick; the drain takes it out of them and lets those finish. Left to the idle rule below it
    # would stay awake while the load holds, and the model would have no sleeper for the next step.
    # Not when the others' queue would wake a sleeper at once without it (it then serves, and the
    # figure's demand asks for the next pod, fresh in its turn).
    fresh = [e for e in awake if e.fresh_until > now]
    others_hold = waiting <= policy.target_waiting * (len(awake) - 1)
    if fresh and others_hold:
        out.sleep = [min(fresh, key=lambda e: (e.waiting + e.running, e.url)).url]
        return out

    def idle_for(e: Engine) -> float:
        return now - e.idle_since

    idle = [e for e in awake if e.waiting == 0 and e.running == 0 and e.url not in waking
            and (not e.served or idle_for(e) >= policy.awake_idle_seconds)]
    if idle and others_hold:
        out.sleep = [max(idle, key=lambda e: (not e.served, idle_for(e), e.url)).url]
        return out
    # A sleeper is missing and the awake engines are more than the load needs (its demand at
    # `target_requests` each, and the queue within the target on one engine fewer): the least
    # loaded sleeps now, its requests drained first. Routing spreads a light load over every
    # engine (prefix hash, round robin), so none is ever idle for `awake_idle_seconds`: left to the
    # idle rule, a model whose sleeper a scale-down removed (the load fell to what fewer engines
    # carry) would have no sleeper until the traffic stopped entirely. Not while a pod loads: it is
    # the sleeper to be (a wake's replacement, which the fresh rule above puts to sleep), and an
    # engine just woken must not be drained again while the load's reading dips.
    loading = [e for e in engines if not e.ready]
    if (policy.target_requests > 0 and others_hold and len(asleep) + len(loading) < policy.standby
            and len(awake) > needed_awake(awake, policy, held)):
        spare = [e for e in awake if e.url not in waking]
        if spare:
            out.sleep = [min(spare, key=lambda e: (e.waiting + e.running, e.served, e.idle_since, e.url)).url]
    return out


def surplus(engines: list[Engine], policy: Policy, now: float, waking: set[str] = frozenset(),
            held: int = 0, draining: set[str] = frozenset()) -> set[str]:
    """Awake engines the load no longer needs, whose pods get a deletion cost below a sleeper's
    (act.py `COST["surplus"]`), so that a scale-down removes them and keeps the sleeper.

    At most awake - max(`min_awake`, the load's demand) of them; only engines with nothing running
    or waiting, idle for `surplus_idle_seconds`, the longest idle first; never one waking, being
    drained to sleep, or freshly loaded (the sleeper to be). An engine seen serving again leaves
    the set on that tick, and its cost goes back to an awake one's at once.

    Why marks, not sleeps: when a load falls, the HPA's scale-down window (the highest
    recommendation of the last `stabilizationWindowSeconds`) holds the pods for the window, and
    then removes the lowest deletion cost first. With the sleeper at -100 below every awake engine,
    it removed the sleeper, the actuator then drained and slept an idle awake engine to get one
    back, and the next sync removed another pod: the window plus a drain. Marking the idle surplus
    below the sleeper makes the scale-down itself take the right pods, so the model is back at
    `minReplicas + count` pods, `count` of them asleep, at the window's end. The other way, putting
    surplus engines to sleep ahead of the window's end, would leave a load that returns within the
    window (the start-up budget, minutes long) a wake behind instead of served at once, and sleep
    and wake each such engine once more. A mark is a pod patch, which the
    Kubernetes docs ask not to make often ("avoid updating the annotation frequently, such as
    updating it based on a metric value",
    https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/#pod-deletion-cost): the
    idle hold bounds it to two patches per engine per `surplus_idle_seconds` at worst, and an
    engine under steady traffic is never marked.

    The guarantee stays: a sleeper is removed before an awake engine with requests in flight (a
    marked engine has had none for the hold; one that a router reaches is unmarked at the next
    period)."""
    awake = [e for e in engines if e.ready and e.url not in draining and (not e.sleeping or e.url in waking)]
    extra = len(awake) - needed_awake(awake, policy, held)
    if extra <= 0:
        return set()
    idle = [e for e in awake if e.url not in waking and e.fresh_until <= now and e.waiting == 0 and e.running == 0
            and now - e.idle_since >= policy.surplus_idle_seconds]
    return {e.url for e in sorted(idle, key=lambda e: (e.idle_since, e.url))[:extra]}


def sleepers_to_be(engines: list[Engine], policy: Policy, waking: set[str] = frozenset(),
                   draining: set[str] = frozenset()) -> set[str]:
    """Pods still loading that are to be the missing sleepers: while fewer than `standby` engines
    sleep or are being drained to sleep, that many of the loading pods (by name). The actuator
    labels them `asleep` before they are Ready, so no router adds them on their readiness: before,
    a wake's replacement came up Ready and labelled `awake` by its template, the routers sent it
    requests until the actuator's next period relabelled it, and its drain then waited for those
    and for the routers to let it go (`bench/scaleout.py` counted the model a sleeper short
    meanwhile). If the load needs it once it is up, the fresh rule in `decide` leaves it awake and
    the label goes back to `awake` on that period."""
    asleep = [e for e in engines if e.ready and e.sleeping and e.url not in waking]
    missing = policy.standby - len(asleep) - len(draining)
    # Never Ready yet (a pod that was Ready and fails one /health read may be in the routers).
    loading = sorted((e for e in engines if not e.ready and not e.seen_ready), key=lambda e: (e.pod, e.url))
    return {e.url for e in loading[:max(0, missing)]}


def pods_figure(engines: list[Engine], policy: Policy, held: int = 0, woken: int = 0, target_requests: float = 0.0) -> int:
    """The pods the model needs now, the figure the actuator serves to KEDA's metrics-api scaler
    (an `AverageValue` target of 1 pod, so the HPA's recommendation is the figure itself):
    `standby` sleepers beside the most of

    - `min_awake`;
    - the engines the load needs, ceil((running + waiting + held) / `target_requests`), as the
      Prometheus engine-demand query (decisions/autoscaling.py `demand_query`) computes it, read
      here every period instead of every 30 s scrape (0 without `target_requests`);
    - `woken`: the engines awake or waking right after the latest wake, while it is recent
      (main.py holds it for `--wake-hold-seconds`). A wake takes a sleeper out of the standby at
      once; counting the woken engine at once is what starts its replacement at the HPA's next
      sync instead of a scrape later, and the HPA's scale-down window then keeps the highest
      recommendation it saw."""
    return policy.standby + max(policy.min_awake, load_demand(engines, held, target_requests), woken)
