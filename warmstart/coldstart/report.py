"""The cold-start table: each measured phase beside its prediction, and what a slow one means.

Predictions come from warmstart/decisions/phases.py for the model's plan (weights size, instance
type, compile cache on or off) and for what this start should have been (a new or a warm node, the
compile cache restored or not). A phase is flagged when it took more than SLOW_FACTOR times its
prediction and at least SLOW_MIN_EXTRA_S longer (a 0.3 s phase predicted at 0.1 s is noise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..decisions import phases as ph
from ..decisions.instances import GpuInstance
from .parser import Phase, PodStart

SLOW_FACTOR = 2.0
SLOW_MIN_EXTRA_S = 5.0
NODE_PHASES = ("capacity", "node_launched", "node_registered", "node_ready")


@dataclass(frozen=True)
class ModelFacts:
    """What the plan knows about the pod's model (from the stack's ModelPlan)."""

    name: str
    weights_bytes: int
    instance: GpuInstance
    compile_cache: bool
    parallel_pull: bool
    """The nodes pull images with SOCI parallel pull (EKS Auto Mode GPU nodes)."""
    compile_cold_seconds: float | None = None
    """The model's own cold-compile time, from its history, when known."""


@dataclass
class Row:
    phase: Phase
    predicted: ph.Prediction | None = None
    compared_s: float | None = None
    """The measured seconds compared with the prediction (the node rows compare their sum)."""
    flag: str | None = None
    causes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return self.phase.to_json() | {
            "predicted_s": None if self.predicted is None else round(self.predicted.seconds, 3),
            "predicted_basis": None if self.predicted is None else self.predicted.basis,
            "predicted_note": None if self.predicted is None else self.predicted.note,
            "flag": self.flag, "causes": self.causes}


def _short_key(key: str | None) -> str:
    if not key:
        return "?"
    head, _, tail = key.rpartition("/")
    return f"{head}/{tail[:12]}…" if len(tail) > 16 else key


def expected(start: PodStart, m: ModelFacts) -> dict[str, ph.Prediction]:
    """The prediction for each phase of this start."""
    f = start.flags
    out: dict[str, ph.Prediction] = {}
    if f.new_node:
        out["node_ready"] = ph.Prediction(ph.NODE_LAUNCH_SECONDS, ph.ASSUMPTION, "nominated -> GPUs registered, whole node")
    # On a warm node the image should be there; a new node pulls it.
    out["image_pull"] = ph.image_pull_prediction(present=not f.new_node, parallel_pull=m.parallel_pull)
    source = "node-cache" if f.node_cache == "hit" else "s3"
    out["weights"] = ph.weights_prediction(m.weights_bytes, m.instance, source=source)
    # The compile should be cached when the cache is on and the restore found an archive (or the
    # node had one); a restore that found none means this key's first compile anywhere.
    cached = m.compile_cache and f.compile_restore in ("hit", "restored")
    comp = ph.compile_prediction(cached, m.compile_cold_seconds)
    out["compile"] = comp
    # The engine state (startup plan, JIT caches) travels with the compile cache.
    graphs, engine = ph.cuda_graph_prediction(cached), ph.engine_init_prediction(cached)
    out["cuda_graphs"] = graphs
    out["engine_init"] = ph.Prediction(comp.seconds + graphs.seconds + engine.seconds, comp.basis,
                                       f"compile + graphs + profile and KV cache ({engine.note})")
    ready = ph.PROCESS_START_SECONDS + out["weights"].seconds + out["engine_init"].seconds
    out["ready"] = ph.Prediction(ready, out["weights"].basis, "process start + weights + engine init")
    out["first_token"] = ph.Prediction(ph.FIRST_TOKEN_SECONDS, ph.ASSUMPTION)
    return out


def _causes(key: str, start: PodStart) -> list[str]:
    f = start.flags
    if key == "weights":
        causes = list(ph.SLOW_CAUSES["weights"])
        if f.node_cache == "hit":  # read locally: the disk, not the network
            causes.insert(0, causes.pop(2))
        return causes
    if key in ("compile", "engine_init", "ready"):
        out: list[str] = []
        restore = next((p for p in start.phases if p.key.startswith("init:") and p.values.get("result")
                        and "key" in p.values), None)
        key_s = _short_key(restore.values.get("key")) if restore else "?"
        if f.compile_miss_cause:
            out.append(f"compile-cache miss after the restore of {key_s}: {f.compile_miss_cause}")
        elif f.compile_cache == "miss" and f.compile_restore in ("hit", "restored"):
            out.append(f"the restored archive {key_s} was not used: vLLM compiled anyway, so its own hash "
                       "differs from the key's factors (image, GPU, TP, vLLM args)")
        elif f.compile_cache == "miss":
            out.append(f"compile-cache miss (restore: {f.compile_restore or 'did not run'}; key {key_s})")
        out.extend(ph.SLOW_CAUSES["compile"][1:])
        if key != "compile":
            out.extend(ph.SLOW_CAUSES["weights"][:2] if key == "ready" else ph.SLOW_CAUSES["engine_init"])
        return out
    if key == "image_pull":
        causes = list(ph.SLOW_CAUSES["image_pull"])
        if f.new_node is False and f.image_present is False:
            causes.insert(0, "image pulled on a warm node: evicted by the kubelet's image GC, or a new tag")
        return causes
    if key == "node_ready":
        return list(ph.SLOW_CAUSES["node"])
    return list(ph.SLOW_CAUSES.get(key, ()))


def build_rows(start: PodStart, m: ModelFacts) -> list[Row]:
    preds = expected(start, m)
    rows = []
    for p in start.phases:
        row = Row(p, preds.get(p.key))
        if p.key == "node_ready" and row.predicted is not None:
            parts = [start.phase(k) for k in NODE_PHASES]
            if all(x.measured for x in parts):
                row.compared_s = sum(x.seconds or 0.0 for x in parts)
        elif p.measured:
            row.compared_s = p.seconds
        if p.key == "compile" and start.flags.compile_miss_cause:
            # Not a slow compile: the cache was there and vLLM did not use it. Said as a miss
            # whatever the time, with the cause vLLM's log gives.
            row.flag = (f"cache miss after the restore ({start.flags.compile_restore}): vLLM compiled"
                        + (f" for {p.seconds:.1f} s" if p.seconds is not None else ""))
            row.causes = _causes(p.key, start)
        elif row.predicted is not None and row.compared_s is not None:
            want = row.predicted.seconds
            if row.compared_s > SLOW_FACTOR * want and row.compared_s - want >= SLOW_MIN_EXTRA_S:
                ratio = row.compared_s / want if want > 0 else float("inf")
                row.flag = f"{row.compared_s:.1f} s is {ratio:.1f}x the predicted {want:.1f} s"
                row.causes = _causes(p.key, start)
        rows.append(row)
    return rows


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def table(start: PodStart, m: ModelFacts) -> str:
    """The report of one pod, as text."""
    rows = build_rows(start, m)
    f = start.flags
    head = [f"pod {start.namespace}/{start.pod} on {start.node or '?'} ({m.instance.instance_type}), "
            f"model {m.name}, vLLM {start.vllm_version or '?'}",
            f"node: {'new' if f.new_node else 'warm' if f.new_node is False else '?'}"
            f"{f' ({f.provisioner})' if f.provisioner else ''}; image: "
            f"{'present' if f.image_present else 'pulled' if f.image_present is False else '?'}; compile cache: "
            f"{'miss after restore' if f.compile_miss_cause else f.compile_cache or '?'} (restore: "
            f"{f.compile_restore or '-'}); startup plan: {f.startup_plan or '-'}; node weights cache: {f.node_cache or '-'}",
            ""]
    cells = [("phase", "measured", "predicted", "basis", "detail")]
    for r in rows:
        p = r.phase
        if p.missing:
            measured, detail = "missing", f"{p.missing}" + (f"; {p.detail}" if p.detail else "")
        elif p.skipped and p.seconds in (None, 0.0):
            measured, detail = "—", p.detail
        else:
            measured, detail = _fmt_s(p.seconds), p.detail
        if r.predicted is None:
            pred = basis = ""
        else:
            pred = _fmt_s(r.predicted.seconds) + ("  !" if r.flag else "")
            basis = "assumed" if r.predicted.basis == ph.ASSUMPTION else r.predicted.basis.split("/")[2]
            if r.predicted.note:
                detail = f"{detail}; plan: {r.predicted.note}" if detail else f"plan: {r.predicted.note}"
        cells.append((p.label, measured, pred, basis, detail))
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = head + ["  ".join(c[i].ljust(widths[i]) for i in range(4)) + "  " + c[4] for c in cells]
    lines.insert(len(head) + 1, "  ".join("-" * w for w in widths) + "  " + "-" * 6)
    flagged = [r for r in rows if r.flag]
    if flagged:
        lines.append("")
        for r in flagged:
            miss = r.phase.key == "compile" and f.compile_miss_cause
            lines.append(f"! {r.phase.label}: {r.flag}. {'Cause' if miss else 'Usually'}:")
            lines.extend(f"    - {c}" for c in r.causes)
    return "\n".join(line.rstrip() for line in lines)


def report_json(start: PodStart, m: ModelFacts) -> dict[str, Any]:
    """The whole record of one start, as the history keeps it."""
    return start.to_json() | {"model": m.name, "instance_type": m.instance.instance_type,
                              "rows": [r.to_json() for r in build_rows(start, m)]}
