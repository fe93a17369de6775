"""The drill's report: a table (each line predicted, measured, pass or fail with the tolerance it
used), a record for the cold-start history, and a picture in the cold-start timeline's style
(one lane per replica, seconds from the load step, the prediction's bound marked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from .measure import Line


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def table(lines: Sequence[Line]) -> str:
    head = ("line", "path", "requested", "scheduled", "ready", "1st inference", "measured", "predicted", "tolerance",
            "result")
    rows = []
    for l in lines:
        t = l.times
        if l.path in ("clients", "routing"):
            measured = f"{l.measured:g}" if l.measured is not None else "-"
            measured = f"{l.measured:.1%}" if l.path == "routing" and l.measured is not None else measured
            predicted = ("-" if l.predicted is None else f"{l.predicted:.1%}" if l.path == "routing" else f"{l.predicted:g}")
        else:
            measured, predicted = _s(l.measured), _s(l.predicted)
        rows.append((l.what, l.path, _s(t.get("requested")), _s(t.get("scheduled")), _s(t.get("ready")),
                     _s(t.get("first_inference")), measured, predicted, l.tolerance,
                     l.result))
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(head, widths)).rstrip(),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    notes = [f"  {l.what}: {l.detail}" for l in lines if l.detail]
    return "\n".join(out + ([""] + notes if notes else []))


def record(plan: Any, lines: Sequence[Line], load: dict[str, Any] | None) -> dict[str, Any]:
    """What goes beside the pods' cold-start records (`kind: drill`, which `--history` reports as
    a split of its own): each path's measured seconds as its phases."""
    phases: dict[str, float] = {}
    for l in lines:
        if l.measured is not None and l.path not in ("clients", "routing"):
            phases.setdefault(f"drill {l.path}", l.measured)
    return {"kind": "drill", "run": plan.run_id, "stack": plan.stack, "model": plan.model,
            "started_at": plan.started_at.isoformat(), "phases": phases,
            "lines": [l.as_json() for l in lines], "pass": all(l.passed for l in lines),
            "load": {k: v for k, v in (load or {}).items() if k != "samples"}}


# The cold-start timeline's colours (warmstart/coldstart/plot.py STYLE): grey waiting for a node,
# brown/blue for the start, green to the first inference.
SEGMENTS = (("requested", "scheduled", "waiting to be scheduled (node)", "#9e9e9e"),
            ("scheduled", "ready", "starting (image, weights, engine)", "#1e88e5"),
            ("ready", "first_inference", "ready -> first inference", "#43a047"))


def draw(lines: Sequence[Line], out: Path, title: str) -> Path:
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - only without the extra
        raise RuntimeError("the picture needs matplotlib: pip install 'warmstart[report]'") from exc
    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    lanes = [l for l in lines if l.path not in ("clients", "routing")]
    fig, ax = plt.subplots(figsize=(12, 1.4 + 0.9 * max(1, len(lanes))), dpi=110)
    for i, l in enumerate(lanes):
        y = len(lanes) - 1 - i
        t = l.times
        for a, b, _, colour in SEGMENTS:
            ta, tb = t.get(a), t.get(b)
            if a == "scheduled" and ta is None:
                ta = t.get("requested")  # a woken engine is never scheduled again
            if ta is not None and tb is not None and tb > ta:
                ax.broken_barh([(ta, tb - ta)], (y - 0.3, 0.6), facecolors=colour, edgecolor="white", linewidth=0.5)
        if t.get("first_inference") is not None:
            ax.plot([t["first_inference"]], [y - 0.4], marker="*", color="#fdd835", markeredgecolor="black", markersize=10)
        if l.limit is not None and t.get("requested") is not None:
            x = t["requested"] + l.limit
            ax.plot([x, x], [y - 0.42, y + 0.42], color="#212121" if l.passed else "#e53935", linewidth=2)
            ax.text(x, y + 0.45, f" {'pass' if l.passed else 'FAIL'}: limit {l.limit:.0f} s", fontsize=7, va="bottom")
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{l.what}\n{l.path}, predicted {_s(l.predicted)}" for l in reversed(lanes)], fontsize=8)
    ax.set_xlabel("seconds since the load step started")
    ax.set_xlim(left=0)
    ax.set_ylim(-0.8, max(1, len(lanes)) - 0.2 + 0.5)
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=c, label=lbl) for _, _, lbl, c in SEGMENTS]
    handles.append(plt.Line2D([], [], marker="*", color="#fdd835", markeredgecolor="black", linestyle="",
                              markersize=10, label="first inference"))
    handles.append(plt.Line2D([], [], color="#212121", label="tolerance (from requested)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=5, fontsize=8, frameon=False)
    ax.set_title(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
