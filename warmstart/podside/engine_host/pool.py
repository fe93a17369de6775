"""The pool's arbitration (pure): which spare host wakes which model's engine, how many hosts the
pool keeps, and which host a scale-down may take. For the standby actuator's pool mode, which reads
every host's `GET /engines` (server.py) and each pooled model's demand; no I/O here.

- `assign`: rises are served in the order they arrived, each by a spare host (every engine on it
  asleep, nothing starting): at most one wake per host, since a host's GPU memory is budgeted for
  one awake engine (warmstart/decisions/standby_pool.py). A rise with no spare left is `cold`: the
  model's own autoscaler starts a pod of it, so a second rise inside the replacement's window gets a
  cold start, never a wait on the pool.
- `desired_hosts`: the spares the pool keeps plus every host that serves (an engine awake or
  waking). A host taken by a wake is replaced at once; one whose engine went back to sleep is a
  spare again, and the extra spare is what a scale-down removes.
- `deletion_costs`: `controller.kubernetes.io/pod-deletion-cost` per host, as per-model standby
  sets it on its pods: a spare -100 (removed first), a serving host 0, a host still starting its
  engines 100 (kept: it is the replacement on its way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ASLEEP, AWAKE, STARTING = "asleep", "awake", "starting"
COST = {"spare": "-100", "serving": "0", "starting": "100"}


@dataclass(frozen=True)
class HostView:
    """One host as its supervisor's `/engines` described it (None: it did not answer)."""

    name: str
    url: str
    states: dict[str, str]
    """model -> engine state."""

    @property
    def spare(self) -> bool:
        return bool(self.states) and all(s == ASLEEP for s in self.states.values())

    @property
    def serving(self) -> str | None:
        return next((m for m, s in sorted(self.states.items()) if s == AWAKE), None)

    @property
    def kind(self) -> Literal["spare", "serving", "starting"]:
        if self.serving is not None:
            return "serving"
        return "spare" if self.spare else "starting"


def parse_snapshot(name: str, url: str, doc: object) -> HostView | None:
    """A host from its `/engines` document; None for one that is not what server.py answers."""
    if not isinstance(doc, dict) or not isinstance(doc.get("engines"), list):
        return None
    states = {}
    for e in doc["engines"]:
        if not isinstance(e, dict) or not isinstance(e.get("model"), str) or not isinstance(e.get("state"), str):
            return None
        states[e["model"]] = e["state"]
    return HostView(name=name, url=url.rstrip("/"), states=states)


@dataclass(frozen=True)
class Wake:
    model: str
    host: str
    engine_url: str
    """The base URL the actuator's one wake path calls (`/wake_up`, `/v1/completions`, ...)."""


def assign(hosts: list[HostView], rises: list[tuple[float, str]], taken: set[str] = frozenset()
           ) -> tuple[list[Wake], list[str]]:
    """(wakes, cold): each rise `(arrived_at, model)` in arrival order gets a spare host that has the
    model's engine, one wake per host, hosts in name order (so two actuators agree); `taken`: hosts
    whose wake is already in flight. A model may rise twice (it needs two more engines) and take two
    hosts. A rise with no spare left that has the model's engine is `cold`."""
    free = sorted((h for h in hosts if h.spare and h.name not in taken), key=lambda h: h.name)
    wakes: list[Wake] = []
    cold: list[str] = []
    for _, model in sorted(rises):
        host = next((h for h in free if model in h.states), None)
        if host is None:
            cold.append(model)
            continue
        free.remove(host)
        wakes.append(Wake(model=model, host=host.name, engine_url=f"{host.url}/engines/{model}"))
    return wakes, cold


def desired_hosts(hosts: list[HostView], spares: int, waking: set[str] = frozenset()) -> int:
    """Hosts the pool's Deployment should have: one per host serving (or whose wake is in flight)
    plus `spares`."""
    if spares < 0:
        raise ValueError("spares must be >= 0")
    return sum(1 for h in hosts if h.serving is not None or h.name in waking) + spares


def deletion_costs(hosts: list[HostView], waking: set[str] = frozenset()) -> dict[str, str]:
    return {h.name: COST["serving" if h.name in waking else h.kind] for h in hosts}
