"""Draws docs/stack.png, the README's picture of what one stack stands up:
`.venv/bin/python docs/draw_stack.py` (matplotlib, from the `report` extra)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent / "stack.png"


def box(ax, x, y, w, h, text, face, edge="#333333", size=9, weight="normal", va="center", dash=False):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.12", linewidth=1.2,
                                facecolor=face, edgecolor=edge, linestyle="--" if dash else "-"))
    ty = y + h / 2 if va == "center" else y + h - 0.18
    ax.text(x + w / 2, ty, text, ha="center", va="center" if va == "center" else "top", fontsize=size,
            weight=weight, wrap=True)


def arrow(ax, a, b, text="", color="#1f4e79", style="-|>", rad=0.0, at=None):
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=12, linewidth=1.4, color=color,
                                 connectionstyle=f"arc3,rad={rad}"))
    if text:
        x, y = at or ((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 0.12)
        ax.text(x, y, text, ha="center", va="center", fontsize=7.5, color=color, style="italic")


def main() -> None:
    fig, ax = plt.subplots(figsize=(12, 6.6), dpi=110)
    ax.set_xlim(0, 12)
    ax.set_ylim(0, 6.6)
    ax.axis("off")
    ax.text(6, 6.4, "One warmstart stack (stacks/Pulumi.<stack>.yaml -> warmstart up)", ha="center",
            fontsize=12, weight="bold")

    # The VPC and the cluster in it.
    box(ax, 0.2, 0.3, 8.3, 5.75, "", "#f3f6fa", va="top")
    ax.text(0.4, 5.85, "VPC (created, or yours): private subnets, NAT for the internet", fontsize=9, weight="bold")
    box(ax, 0.45, 0.55, 7.8, 5.0, "", "#e8f1e4", va="top")
    ax.text(0.65, 5.3, "EKS cluster: Auto Mode, or self-managed Karpenter", fontsize=9, weight="bold")

    box(ax, 0.7, 3.7, 2.3, 1.35, "Service <model>:8000\n(one URL per model)", "#ffffff")
    box(ax, 3.3, 3.7, 2.0, 1.35, "SMG router x2\nprefix_hash,\nload-bounded", "#fff4d6")
    box(ax, 5.6, 3.7, 2.4, 1.35, "KEDA ScaledObject\non vllm:num_requests_\nwaiting (AMP)", "#fde2e4")

    box(ax, 0.7, 0.8, 7.3, 2.6, "", "#dceefb", va="top")
    ax.text(0.9, 3.15, "GPU NodePool (tainted), node NVMe in RAID0", fontsize=9, weight="bold")
    box(ax, 0.95, 1.05, 2.6, 1.85, "vLLM pod\nRun:ai streamer, tuned:\nconcurrency, 4 GiB chunks,\ndistributed when TP > 1",
        "#ffffff", size=8.5)
    box(ax, 3.8, 1.05, 2.0, 1.85, "NVMe\ncompile cache\n(torch.compile)\n+ staged weights", "#eaf7ea", size=8.5)
    box(ax, 6.05, 1.05, 1.75, 1.85, "import Job\n(first up):\nweights into\nthe bucket", "#f4ecf7", size=8.5, dash=True)

    # Outside the VPC.
    box(ax, 9.1, 4.35, 2.7, 1.3, "S3 model bucket\nweights per model\n(private, TLS, versioned)", "#fff8e1")
    box(ax, 9.1, 2.55, 2.7, 1.3, "S3 compile-cache bucket\none key per GPU, TP,\nimage, vLLM args", "#fff8e1")
    box(ax, 9.1, 0.75, 2.7, 1.3, "IAM: one IRSA role per\nmodel (read its prefix,\nits cache keys only)", "#eeeeee")
    box(ax, 8.55, 2.95, 0.5, 1.2, "S3\nGW\nVPCe", "#ffe0b2", size=7.5)

    arrow(ax, (3.0, 4.37), (3.3, 4.37), "")
    arrow(ax, (4.3, 3.7), (2.4, 2.9), "same prefix -> same replica", rad=0.15, at=(2.0, 3.55))
    arrow(ax, (6.8, 3.7), (3.2, 2.9), "sets replicas", color="#a4161a", rad=-0.1, at=(6.9, 3.55))
    arrow(ax, (9.1, 5.0), (3.3, 2.9), "weights stream via the endpoint, not NAT", color="#7a4f01", rad=0.25,
          at=(10.45, 4.12))
    arrow(ax, (9.1, 3.2), (5.8, 2.2), "restores a new node's compile cache", color="#2d6a4f", rad=0.0,
          at=(10.45, 2.3))
    arrow(ax, (6.9, 2.9), (9.1, 4.6), "", color="#6c3483", rad=-0.2)
    ax.text(1.0, 0.35, "Every number in the plan (TP, concurrency, budgets) is decided offline: `warmstart render`.",
            fontsize=8.5, style="italic")
    fig.savefig(OUT, bbox_inches="tight")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
