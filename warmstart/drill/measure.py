"""From what the cluster kept to the drill's lines: pure functions over plain API objects.

Every new replica's four times, from the API's own timestamps (not the drill's clock): requested
(the pod's `creationTimestamp`), scheduled and ready (the `PodScheduled` and `Ready` conditions'
`lastTransitionTime`), first successful inference (the kubelet's timestamp of the first-token
sidecar's `warmstart.first_token` line, `result: ok`). A woken standby engine's times come from
the standby actuator's `warmstart.wake` record (its signal, wake and first token). The path:
`wake` (a record), `new node` (the pod's node was created after the pod), `warm spare` (a node
that was there before), `cold` (the drill's cache-bypassed pod).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from . import plan as dp

FIRST_TOKEN_EVENT = "warmstart.first_token"
WAKE_EVENT = "warmstart.wake"
WEIGHTS_EVENT = "warmstart.weights"


def ts(value: str | None) -> datetime | None:
    """An API timestamp (RFC 3339, `Z` or an offset, with or without fractions)."""
    if not value:
        return None
    v = value.strip().replace("Z", "+00:00")
    if "." in v:  # the kubelet's nanoseconds: Python parses at most microseconds
        head, rest = v.split(".", 1)
        frac = "".join(c for c in rest if c.isdigit())
        tz = rest[len(frac):]
        v = f"{head}.{frac[:6]}{tz}"
    try:
        d = datetime.fromisoformat(v)
    except ValueError:
        return None
    return d if d.tzinfo else d.replace(tzinfo=timezone.utc)


def condition_time(pod: Mapping[str, Any], kind: str) -> datetime | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return ts(c.get("lastTransitionTime"))
    return None


def log_lines(text: str, event: str) -> list[tuple[datetime | None, dict[str, Any]]]:
    """The JSON lines of `event` in a log read with `timestamps=true` (each line `<RFC3339> <text>`)."""
    out = []
    for raw in (text or "").splitlines():
        stamp, _, rest = raw.partition(" ")
        when = ts(stamp)
        body = rest if when is not None else raw
        if not body.startswith("{") or event not in body:
            continue
        try:
            doc = json.loads(body)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("event") == event:
            out.append((when, doc))
    return out


def first_inference(log_text: str) -> datetime | None:
    for when, doc in log_lines(log_text, FIRST_TOKEN_EVENT):
        if doc.get("result") == "ok":
            return when
    return None


def weights_choice(log_text: str) -> dict[str, Any] | None:
    """The weights picker's `warmstart.weights` line (warmstart/podside/weights_select.py): its
    choice, `result` hit or miss, and the reason; None for a pod without the picker."""
    found = log_lines(log_text, WEIGHTS_EVENT)
    return found[-1][1] if found else None


@dataclass
class Line:
    """One line of the report: a replica (or the load) measured against its prediction."""

    what: str
    path: str
    measured: float | None
    predicted: float | None
    limit: float | None
    tolerance: str
    times: dict[str, float | None] = field(default_factory=dict)
    """requested, scheduled, ready, first inference: seconds after the load step started."""
    detail: str = ""
    basis: str = ""
    judged: bool = True
    """False: reported beside its reference, never failing the drill (the routing line)."""

    @property
    def passed(self) -> bool:
        if not self.judged:
            return True
        return self.measured is not None and (self.limit is None or self.measured <= self.limit)

    @property
    def result(self) -> str:
        if not self.judged:
            return "info" if self.measured is not None else "skipped"
        return "pass" if self.passed else "FAIL"

    def as_json(self) -> dict[str, Any]:
        return {"what": self.what, "path": self.path, "measured_s": self.measured, "predicted_s": self.predicted,
                "limit_s": self.limit, "tolerance": self.tolerance, "times": self.times, "detail": self.detail,
                "basis": self.basis, "pass": self.passed, "judged": self.judged}


def _rel(t: datetime | None, t0: datetime) -> float | None:
    return None if t is None else round((t - t0).total_seconds(), 2)


def pod_line(pod: Mapping[str, Any], path: str, pred: dp.Prediction | None, t0: datetime, first: datetime | None,
             detail: str = "") -> Line:
    req = ts(pod["metadata"].get("creationTimestamp"))
    sched, ready = condition_time(pod, "PodScheduled"), condition_time(pod, "Ready")
    times = {"requested": _rel(req, t0), "scheduled": _rel(sched, t0), "ready": _rel(ready, t0),
             "first_inference": _rel(first, t0)}
    measured = None if req is None or first is None else round((first - req).total_seconds(), 2)
    if measured is None:
        detail = (detail + "; " if detail else "") + ("never served a first inference within the run"
                                                       if ready is None or first is None else "")
    return Line(f"pod {pod['metadata']['name']}", path, measured, pred.seconds if pred else None,
                pred.limit() if pred else None, pred.tolerance() if pred else "no prediction for this path",
                times, detail.strip("; "), pred.basis if pred else "")


def classify(pod: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> str:
    """`new node` when the pod's node was created after the pod (a launch for it), else `warm spare`."""
    node = nodes.get((pod.get("spec") or {}).get("nodeName") or "")
    created, node_created = ts(pod["metadata"].get("creationTimestamp")), ts((node or {}).get("metadata", {}).get("creationTimestamp"))
    if node is None or created is None or node_created is None:
        return dp.NEW_NODE if node is None and (pod.get("spec") or {}).get("nodeName") else dp.WARM_SPARE
    return dp.NEW_NODE if node_created >= created else dp.WARM_SPARE


def wake_line(when: datetime | None, rec: Mapping[str, Any], pred: dp.Prediction | None, t0: datetime) -> Line:
    ph = rec.get("phases") or {}
    wake, first = float(ph.get("wake") or 0.0), float(ph.get("first_token") or 0.0)
    end = when or datetime.fromtimestamp(float(rec.get("time") or 0), timezone.utc)
    from datetime import timedelta

    start = end - timedelta(seconds=wake + first)
    times = {"requested": _rel(start, t0), "scheduled": None, "ready": _rel(end - timedelta(seconds=first), t0),
             "first_inference": _rel(end, t0)}
    return Line(f"pod {rec.get('pod')}", dp.WAKE, round(wake + first, 2), pred.seconds if pred else None,
                pred.limit() if pred else None, pred.tolerance() if pred else "no standby in the plan", times,
                f"wake {wake:.2f} s + first token {first:.2f} s (actuator's record; its signal {float(ph.get('signal') or 0):.2f} s)",
                pred.basis if pred else "")


def load_lines(result: Mapping[str, Any] | None) -> list[Line]:
    """The clients' side: failures must be none; TTFT percentiles are reported, not judged (the
    render predicts no TTFT under load)."""
    if result is None:
        return [Line("load", "clients", None, None, None, "a result line from the load Job",
                     detail="the load Job left no result (it failed, or its log is gone)")]
    failed, sent = int(result.get("failed") or 0), int(result.get("sent") or 0)
    skipped = int(result.get("skipped_busy") or 0)

    def f(k: str) -> str:
        v = result.get(k)
        return "-" if v is None else f"{v:.3f} s"

    errors = ", ".join(f"{k} x{v}" for k, v in sorted((result.get("errors") or {}).items()))
    return [Line("load: failed requests", "clients", float(failed + skipped), 0.0, 0.0, "0 failed or not sent",
                 detail=f"{sent} sent, {result.get('ok')} ok, {failed} failed, {skipped} not sent (all slots busy)"
                        + (f"; {errors}" if errors else "")
                        + f"; TTFT p50 {f('ttft_p50')}, p90 {f('ttft_p90')}, p99 {f('ttft_p99')}")]


def verdict(lines: Iterable[Line]) -> bool:
    return all(l.passed for l in lines)
