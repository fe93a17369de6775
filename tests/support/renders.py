"""What the whole-render checks (reachability, node fit, image pulls) read off a render: its
workloads and where they are pinned, a model stack's platform, and the examples' programs."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any, Sequence

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
    from tests.support.stacks import render_stack  # the session's renders

    contract = getattr(r.stack_plan, "contract", None)
    return render_stack(contract.stack) if contract is not None else None


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


def example_platform(raw: dict[str, str]) -> dict[str, Any] | None:
    """An example's own PlatformArgs (its `<project>:platform` config), if it has one."""
    value = next((v for k, v in raw.items() if k.endswith(":platform")), None)
    if value is None:
        return None
    return json.loads(value) if isinstance(value, str) else dict(value)


def example_facts(raw: dict[str, str]) -> tuple[str, list[str], str]:
    """(cluster mode, VPC blocks, Service range) of the cluster an example runs on: its
    PlatformArgs' facts, else its `clusterMode` on a VPC like the shipped stacks' (10.0.0.0/16,
    Service range 172.20.0.0/16)."""
    platform = example_platform(raw)
    if platform is not None:
        return str(platform["cluster_mode"]), list(platform["vpc_cidrs"]), str(platform["service_cidr"])
    mode = next((v for k, v in raw.items() if k.endswith(":clusterMode")), "auto")
    return mode, ["10.0.0.0/16"], "172.20.0.0/16"


def cluster_from(name: str, platform: Any, model_stacks: Sequence[Any] = ()) -> Any:
    """One cluster: a platform's render and the renders of the model stacks on it, together."""
    from tests.support import cluster

    mode = platform.stack_plan.cluster_mode
    resources = list(platform.resources) + [r for m in model_stacks for r in m.resources]
    objects = list(platform.kubernetes_objects) + [o for m in model_stacks for o in m.kubernetes_objects]
    return cluster.view(name, mode, resources, objects)


def shipped_cluster(stack: str) -> Any:
    """The cluster a stack of stacks/ runs on: its platform (itself, or a model stack's) and every
    model stack of that platform in stacks/."""
    from tests.support.stacks import render_stack

    r = render_stack(stack)
    contract = getattr(r.stack_plan, "contract", None)
    platform = contract.stack if contract is not None else stack
    return cluster_from(platform, render_stack(platform), [render_stack(s) for s in model_stacks_of(platform)])


def model_stacks_of(platform: str) -> list[str]:
    """The model stacks of stacks/ whose platform is `platform`."""
    from tests.support.stacks import STACKS_DIR

    return sorted(s for s, (p, _) in render.sibling_model_stacks(STACKS_DIR).items() if p.rsplit("/", 1)[-1] == platform)


def example_cluster(name: str) -> Any:
    """The cluster an example runs on, as its own config describes it: its PlatformArgs, or (a
    component used alone) its cluster mode with a GPU node of each instance type a pod pins."""
    from tests.support import cluster

    program, raw = example(name)
    platform = example_platform(raw)
    if platform is None:
        mode, _, _ = example_facts(raw)
        types = sorted({spec.get("nodeSelector", {}).get(placement.INSTANCE_TYPE_LABEL)
                        for _, _, spec, _ in workloads(program)} - {None})
        platform = {"cluster_mode": mode, "pools": [{"name": f"type:{t}", "instance_types": [t], "max_gpus": 0}
                                                   for t in types]}
    return cluster.view(f"examples/{name}", str(platform["cluster_mode"]), program.resources,
                        program.kubernetes_objects, platform_args=platform)
