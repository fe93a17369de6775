"""The pool actuator's decision (pure): which member rises onto which spare host, which pooled engine
goes back to sleep, each member's pods figure, the hosts the pool keeps and their deletion costs.
Part of the standby package (pool_mode.py says what the pool mode does); the host arbitration itself
is engine_host/pool.py's (`assign`, `desired_hosts`, `deletion_costs`), shared with nothing else.

A member's engines are of two kinds: its own pods (its Deployment, scaled by KEDA on this actuator's
figure), always awake, and at most one pooled engine, awake on a host. Per member:

- **rise**: no pooled engine awake or waking, and the queue (waiting on its engines plus what its
  front queue holds) passes `targetWaiting` per awake own engine; with no own engine awake, any held
  or waiting request is a rise. Rises take spares in the order they were first seen; a rise with no
  spare left is `cold`: its figure asks for one more own pod at once, and the member's own start
  serves it (never a wait on the pool). A cold rise keeps rising, so a spare that turns ready before
  the member's own pod still serves it. A rise while the member's pooled engine is being drained
  cancels the drain instead (the engine stays awake; no second host).
- **sleep**: its pooled engine, once its own awake engines carry the load without it (the queue
  within `targetWaiting` per own engine, and with `targetRequests` the requests within it per own
  engine), or once it has been idle `awakeIdleSeconds` with nothing held.
- **figure** (`GET /warmstart/pods/<model>`, KEDA's metrics-api trigger, an AverageValue of 1 pod):
  the most of `minReplicas`, the engines the requests need at `targetRequests` each, the engines the
  queue needs at `targetWaiting` each, and while a pooled engine serves it the own engines awake at
  its wake plus one: the pooled engine counts as awake, so the member's own Deployment scales up
  behind it and takes its place. A cold rise holds the own engines awake plus one for
  `hold` seconds (the HPA's next sync and the scale-down window keep it past that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..engine_host import pool as hosts_pool
from ..engine_host.pool import HostView, Wake
from .observe import Engine
from .pool_spec import Member, PoolSpec


@dataclass
class MemberView:
    """What one tick read of a member: its own engines (ready or not), its pooled engines' readings
    by host (the `/engines/<model>/metrics` of each host serving it), its front queue's held count."""

    own: list[Engine]
    pooled: dict[str, Engine] = field(default_factory=dict)
    held: int = 0


@dataclass
class Memory:
    """What the decision keeps between ticks (pool_mode.py owns it, behind its lock)."""

    rise_since: dict[str, float] = field(default_factory=dict)
    """model -> when (monotonic) its current rise was first seen: the order spares are given in."""
    floors: dict[str, tuple[float, int, bool]] = field(default_factory=dict)
    """model -> (since, pods, pooled): the figure's floor from a wake (held while its pooled engine
    serves) or a cold rise (held `hold` seconds)."""
    idle_since: dict[str, float] = field(default_factory=dict)
    """host -> when (monotonic) its pooled engine was last seen with a request, or woke."""


@dataclass
class PoolActions:
    wakes: list[Wake] = field(default_factory=list)
    cold: list[str] = field(default_factory=list)
    sleeps: list[tuple[str, str]] = field(default_factory=list)
    """(host, model) to drain and put to sleep."""
    cancel: list[str] = field(default_factory=list)
    """Hosts whose drain a new rise of their member cancels (an awake engine is cheaper than a wake
    on another host)."""
    figures: dict[str, dict] = field(default_factory=dict)
    rise_at: dict[str, float] = field(default_factory=dict)
    """model -> when its woken rise was first seen: the wake record's `signal` phase starts there."""
    hosts: int = 0
    costs: dict[str, str] = field(default_factory=dict)


def _awake(engines: list[Engine]) -> list[Engine]:
    return [e for e in engines if e.ready and not e.sleeping]


def decide_pool(spec: PoolSpec, hosts: list[HostView], views: dict[str, MemberView], memory: Memory, now: float,
                waking: dict[str, str] | None = None, draining: dict[str, str] | None = None,
                hold: float = 60.0) -> PoolActions:
    """This tick's actions. `waking`/`draining`: host -> model of the wakes and drains in flight.
    Updates `memory` (rise order, figure floors, idle clocks)."""
    waking, draining = dict(waking or {}), dict(draining or {})
    out = PoolActions()
    busy = set(waking) | set(draining)
    serving = {h.name: h.serving for h in hosts if h.serving is not None}
    rises: list[tuple[float, str]] = []
    for m in spec.members:
        view = views.get(m.model, MemberView(own=[]))
        own = _awake(view.own)
        pooled_hosts = sorted(h for h, model in serving.items() if model == m.model and h not in draining)
        pooled_hosts += sorted(h for h, model in waking.items() if model == m.model and h not in pooled_hosts)
        pooled = [view.pooled[h] for h in pooled_hosts if h in view.pooled]
        waiting = sum(e.waiting for e in own + pooled) + view.held
        load = waiting + sum(e.running for e in own + pooled)
        for h in pooled_hosts:
            e = view.pooled.get(h)
            if h not in memory.idle_since or (e is not None and (e.waiting or e.running)):
                memory.idle_since[h] = now
        rising = not pooled_hosts and waiting > m.target_waiting * len(own)
        draining_own = sorted(h for h, model in draining.items() if model == m.model)
        if rising and draining_own:
            # Its pooled engine is being drained: it stays awake (cheaper than a wake on another
            # host); a drain already past its last check sleeps, and the next tick rises again.
            out.cancel += draining_own
            memory.rise_since.setdefault(m.model, now)
        elif rising:
            memory.rise_since.setdefault(m.model, now)
            rises.append((memory.rise_since[m.model], m.model))
        else:
            memory.rise_since.pop(m.model, None)
        for h in pooled_hosts:
            if h in busy:
                continue
            carried = bool(own) and waiting <= m.target_waiting * len(own) and (
                m.target_requests <= 0 or load <= m.target_requests * len(own))
            idle = (view.held == 0 and (e := view.pooled.get(h)) is not None and not (e.waiting or e.running)
                    and now - memory.idle_since[h] >= m.awake_idle_seconds)
            if carried or idle:
                out.sleeps.append((h, m.model))
        floor = memory.floors.get(m.model)
        if floor is not None and (floor[2] and not pooled_hosts and m.model not in draining.values()
                                  or not floor[2] and now - floor[0] > hold):
            memory.floors.pop(m.model)
        out.figures[m.model] = _figure(m, len(own), len(pooled_hosts), view.held, waiting, load)
    cancelled = set(out.cancel)
    out.sleeps = [(h, model) for h, model in out.sleeps if h not in cancelled]
    # A wake in flight or a drain holds its host; a host being drained is not a spare until it sleeps.
    wakes, cold = hosts_pool.assign(hosts, rises, taken=busy)
    out.wakes, out.cold = wakes, cold
    for w in wakes:
        out.rise_at[w.model] = memory.rise_since.get(w.model, now)
        own = len(_awake(views.get(w.model, MemberView(own=[])).own))
        memory.floors[w.model] = (now, own + 1, True)
        memory.idle_since[w.host] = now
        memory.rise_since.pop(w.model, None)
    for model in cold:
        if model not in memory.floors:
            memory.floors[model] = (now, len(_awake(views.get(model, MemberView(own=[])).own)) + 1, False)
    for model, fig in out.figures.items():
        floor = memory.floors.get(model)
        if floor is not None and floor[1] > fig["pods"]:
            fig["pods"] = floor[1]
        fig["floor"] = floor[1] if floor else 0
    for h in list(memory.idle_since):
        if h not in serving and h not in waking and h not in {w.host for w in wakes}:
            memory.idle_since.pop(h)
    in_flight = set(waking) | {w.host for w in wakes}
    out.hosts = min(spec.max_hosts, hosts_pool.desired_hosts(hosts, spec.spares, in_flight))
    out.costs = hosts_pool.deletion_costs(hosts, in_flight)
    return out


def _figure(m: Member, own: int, pooled: int, held: int, waiting: float, load: float) -> dict:
    demand = math.ceil(load / m.target_requests) if m.target_requests > 0 else 0
    queue = math.ceil(waiting / m.target_waiting)
    pods = max(m.min_replicas, demand, queue)
    return {"pods": pods, "own": own, "pooled": pooled, "held": held,
            "waiting": waiting, "demand": demand, "queue": queue, "min_replicas": m.min_replicas}
