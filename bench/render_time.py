"""Render time of each stack, side by side with the floor every render pays.

Each run is a fresh `warmstart render` process, as a user or CI runs it. A stack's floor is a
process that imports exactly the Pulumi SDK modules that stack's render loads, and nothing else:
the bench first renders each stack once in a child process that reports every `pulumi` / `pulumi_*`
module it loaded (in its `sys.modules` at exit), and the floor process imports exactly those. The
list is derived, not written by hand, because the pinned SDKs load their submodules lazily: `import
pulumi_aws` alone costs a fraction of what a program that declares an `aws.ec2.LaunchTemplate`
pays, so a hand-listed `import pulumi, pulumi_aws, ...` floor sits far below what any program using
those SDK classes pays. The ratios thus show what warmstart itself adds (but for the exit, below):
its own imports, the pydantic config, the decisions, the program run under mocks, the built
pod-script zips and the YAML written. Both sides run from bytecode, as Python runs by default: the
SDKs' was compiled when pip installed them, and the bench's children write and read warmstart's own
under a pycache prefix in its temporary folder (the probe render writes it), so an environment with
PYTHONDONTWRITEBYTECODE set does not charge the program a compile of its ~110 modules on every run
that it never charges the SDKs. Runs are interleaved, so drift on a busy machine hits every series
alike; read the ratios, not the seconds.

The `warmstart` command freezes its objects before it exits (warmstart/cli.py `entry`), so the
interpreter's exit collections skip them, while the floor, a plain process, still pays those
passes over the SDKs' objects (about a quarter of its time). So `x floor` and `cpu x floor` count
that saving for the render, and the last column divides by a floor that freezes before it exits
as well: what the render adds besides the exit, the figure to watch as warmstart's work grows.

Usage: python bench/render_time.py [--runs N] [stacks...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in a child: one render, then the SDK modules it loaded, as JSON on the last stdout line.
# A module the SDKs registered lazily but the render never touched is still a LazyLoader stub
# (its class is not plain ModuleType) and cost nothing: it is left out.
PROBE = """
import json, sys, types
from warmstart import cli
code = cli.main(sys.argv[1:])
print(json.dumps(sorted(n for n, m in list(sys.modules.items())
                        if (n == "pulumi" or n.startswith(("pulumi.", "pulumi_"))) and type(m) is types.ModuleType)))
sys.exit(code)
"""
# Parents sort before their children; touching an attribute runs a lazily registered module now,
# in that order, as the program's `aws.ec2.X` does (pulumi/_utils.py `_LazyModule`).
FLOOR = """import importlib
for name in {modules!r}:
    getattr(importlib.import_module(name), "_warmstart_floor", None)
"""
# The same imports, then what the command does before it exits.
FROZEN = "import gc\ngc.freeze()\n"


def child_env(tmp: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return env | {"PYTHONPYCACHEPREFIX": str(Path(tmp) / "pycache")}


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one child process."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, env=env)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def sdk_modules(stack: str, out: Path, env: dict[str, str]) -> list[str]:
    """The Pulumi SDK modules one render of `stack` loads."""
    done = subprocess.run([sys.executable, "-c", PROBE, "render", "--stack", stack, "--out", str(out)],
                          cwd=ROOT, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("stacks", nargs="*", default=["dev", "prod"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = child_env(tmp)
        floors: dict[str, Path] = {}
        for s in args.stacks:
            modules = sdk_modules(s, Path(tmp) / f"{s}-probe", env)
            floors[s] = Path(tmp) / f"floor-{s}.py"
            floors[s].write_text(FLOOR.format(modules=modules))
            (Path(tmp) / f"frozen-{s}.py").write_text(FLOOR.format(modules=modules) + FROZEN)
            print(f"floor of {s}: the {len(modules)} Pulumi SDK modules its render loads")
        samples: dict[str, dict[str, list[tuple[float, float]]]] = {s: {"floor": [], "frozen": [], "render": []}
                                                                     for s in args.stacks}
        for i in range(args.runs):  # interleaved, so drift hits every series alike
            for s in args.stacks:
                samples[s]["floor"].append(timed([sys.executable, str(floors[s])], env))
                samples[s]["frozen"].append(timed([sys.executable, str(Path(tmp) / f"frozen-{s}.py")], env))
                out = Path(tmp) / f"{s}-{i}"
                samples[s]["render"].append(timed([sys.executable, "-m", "warmstart.cli", "render", "--stack", s,
                                                   "--out", str(out)], env))
    # Wall time is what the ratio is about; CPU time is printed beside it because it
    # moves far less than wall time when other processes share the cores.
    print(f"{'stack':<10} {'floor s':>8} {'render s':>9} {'x floor':>8} {'cpu x floor':>12} "
          f"{'cpu x frozen floor':>19}  (medians, n={args.runs})")
    for s, series in samples.items():
        (floor, floor_cpu), (_, frozen_cpu), (render, render_cpu) = (
            tuple(statistics.median(x[k] for x in series[side]) for k in (0, 1))
            for side in ("floor", "frozen", "render"))
        print(f"{s:<10} {floor:>8.2f} {render:>9.2f} {render / floor:>8.2f} {render_cpu / floor_cpu:>12.2f} "
              f"{render_cpu / frozen_cpu:>19.2f}")

if __name__ == "__main__":
    main()
