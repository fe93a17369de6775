"""What the whole-render checks (reachability, node fit, image pulls) read off a render: its
workloads and where they are pinned, a model stack's platform, and the examples' programs."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

from warmstart import config, mocks, render
from warmstart.decisions import placement

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE_NAMES = sorted(p.parent.name for p in (ROOT / "examples").glob("*/__main__.py"))
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "Job")


class Program:
    """An example's registrations, shaped like a render (no stack plan)."""

    def __init__(self, resources: list[render.Registered]):
        self.resources = resources
        self.kubernetes_objects = [r.inputs for r in resources if render.is_kubernetes_object(r)]


@cache
def example(name: str) -> tuple[Program, dict[str, str]]:
    """An example program (components alone, on a cluster the user has) run under the mocks with
    its own `Pulumi.example.yaml`, and that config."""
    folder = ROOT / "examples" / name
    raw = config.read_stack_file(folder / "Pulumi.example.yaml")
    project = yaml.safe_load((folder / "Pulumi.yaml").read_text())["name"]
    return Program(mocks.run_program_file(folder, region=raw[f"{project}:region"], stack="example", config=raw,
                                          project=project)), raw


def platform_of(r: render.Rendered) -> render.Rendered | None:
    """A model stack's platform render (its network, cluster, nodes and roles); None for an
    environment stack."""
    from tests.conftest import render_stack  # the session's renders

    contract = getattr(r.stack_plan, "contract", None)
    return render_stack(contract.stack) if contract is not None else None


def node_group_of(selector: dict[str, str]) -> str | None:
    """Which nodes a pod's nodeSelector pins it to: `system` (the Karpenter-mode system group), a
    NodePool's name, nodes of one instance type (`type:<instance type>`, on a cluster the program
    does not own), or None (Auto Mode's built-in pools, which grow as needed)."""
    if selector.get(placement.NODE_GROUP_LABEL) == placement.SYSTEM_NODE_GROUP:
        return "system"
    pool = selector.get(placement.NODEPOOL_LABEL)
    if pool is None and selector.get("node.kubernetes.io/instance-type"):
        return f"type:{selector['node.kubernetes.io/instance-type']}"
    return None if pool in ("general-purpose", "system") else pool


def workloads(r: Any) -> list[tuple[str, str, dict[str, Any], int]]:
    """(kind, name, pod spec, pods at once) of every workload object: a Deployment at its replicas
    plus a rollout's surge pod, a DaemonSet's one pod per node, a Job's pod."""
    out = []
    for o in r.kubernetes_objects:
        kind, spec = o["kind"], o.get("spec", {})
        if kind not in WORKLOAD_KINDS:
            continue
        count = 1
        if kind == "Deployment":
            surge = spec.get("strategy", {}).get("rollingUpdate", {}).get("maxSurge", 1)
            count = spec.get("replicas", 1) + (surge if isinstance(surge, int) else 1)
        out.append((kind, o["metadata"]["name"], spec["template"]["spec"], count))
    return out
