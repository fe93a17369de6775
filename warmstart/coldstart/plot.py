"""A timeline picture of pod starts: one lane per pod, one coloured bar per phase, seconds from
the pod's creation, so a cold new-node start and a warm one are seen side by side.

matplotlib (the `report` extra) with the Agg backend: no display, a PNG (or SVG/PDF by suffix).
`--plot out.html` writes a small self-contained HTML page that embeds the PNG.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Sequence

from .parser import PodStart

# Phase -> (legend label, colour). Engine init and Ready overlap the vLLM phases, so Ready and the
# first token are drawn as markers, and engine init as the remainder after graph capture.
STYLE = {
    "capacity": ("capacity nominated", "#bdbdbd"),
    "node_launched": ("node launched", "#9e9e9e"),
    "node_registered": ("node registered", "#757575"),
    "node_ready": ("node ready", "#616161"),
    "scheduled": ("scheduled", "#d7ccc8"),
    "image_pull": ("image pull", "#8d6e63"),
    "init": ("init containers", "#ffcc80"),
    "weights": ("weights", "#1e88e5"),
    "compile": ("torch.compile", "#e53935"),
    "cuda_graphs": ("CUDA graphs", "#8e24aa"),
    "engine_init": ("engine init (rest)", "#43a047"),
}


def _lane_segments(start: PodStart) -> list[tuple[str, float, float]]:
    """(style key, start s, length s) from the pod's creation, for the phases that have both ends."""
    t0 = start.created
    if t0 is None:
        return []
    segs = []
    for p in start.phases:
        if p.start is None or p.end is None or p.missing or p.key in ("ready", "first_token"):
            continue
        if p.key.startswith("init:") and p.skipped:
            continue  # a sidecar runs for the pod's life
        a, b = (p.start - t0).total_seconds(), (p.end - t0).total_seconds()
        if b <= a:
            continue
        key = "init" if p.key.startswith("init:") else p.key
        if key == "engine_init":
            # The part of engine init after compile and graph capture.
            inner = [q for q in start.phases if q.key in ("compile", "cuda_graphs") and q.end is not None]
            if inner:
                a = max(a, max((q.end - t0).total_seconds() for q in inner))  # type: ignore[operator]
            if b <= a:
                continue
        segs.append((key, a, b - a))
    return segs


def _label(start: PodStart) -> str:
    f = start.flags
    node = "new node" if f.new_node else "warm node" if f.new_node is False else "node ?"
    return f"{start.pod}\n{node}, compile {f.compile_cache or '?'}, image {'present' if f.image_present else 'pulled'}"


def draw(starts: Sequence[PodStart], out: Path, title: str | None = None) -> Path:
    """Write the timeline of `starts` to `out` (.png, .svg, .pdf or .html)."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise RuntimeError("the timeline needs matplotlib: pip install 'warmstart[report]'") from exc
    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(12, 1.2 + 1.1 * len(starts)), dpi=110)
    used: list[str] = []
    for lane, start in enumerate(starts):
        y = len(starts) - 1 - lane
        for key, a, width in _lane_segments(start):
            ax.broken_barh([(a, width)], (y - 0.35, 0.7), facecolors=STYLE[key][1], edgecolor="white", linewidth=0.5)
            if key not in used:
                used.append(key)
            if width >= 8:
                ax.text(a + width / 2, y, f"{width:.0f}", ha="center", va="center", fontsize=7, color="white")
        t0 = start.created
        ready = next((p for p in start.phases if p.key == "ready"), None)
        ft = next((p for p in start.phases if p.key == "first_token"), None)
        if t0 is not None and ready is not None and ready.end is not None:
            x = (ready.end - t0).total_seconds()
            ax.plot([x], [y + 0.45], marker="v", color="black", markersize=7)
            ax.text(x, y + 0.5, f" Ready {x:.0f} s", fontsize=8, va="bottom")
        if t0 is not None and ft is not None and ft.end is not None and not ft.missing:
            ax.plot([(ft.end - t0).total_seconds()], [y - 0.45], marker="*", color="#fdd835",
                    markeredgecolor="black", markersize=10)
    ax.set_yticks(range(len(starts)))
    ax.set_yticklabels([_label(s) for s in reversed(starts)], fontsize=8)
    ax.set_xlabel("seconds since the pod was created")
    ax.set_xlim(left=0)
    ax.set_ylim(-0.8, len(starts) - 0.2 + 0.4)
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=STYLE[k][1], label=STYLE[k][0]) for k in STYLE if k in used]
    handles.append(plt.Line2D([], [], marker="v", color="black", linestyle="", label="Ready"))
    handles.append(plt.Line2D([], [], marker="*", color="#fdd835", markeredgecolor="black", linestyle="",
                              markersize=10, label="first token"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=7, fontsize=8, frameon=False)
    ax.set_title(title or "cold-start phases per pod")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() in (".html", ".htm"):
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        data = base64.b64encode(buf.getvalue()).decode()
        out.write_text(f"<!doctype html><meta charset='utf-8'><title>{html.escape(title or 'cold start')}</title>"
                       f"<img alt='cold-start timeline' src='data:image/png;base64,{data}'>\n")
    else:
        fig.savefig(out)
    plt.close(fig)
    return out
