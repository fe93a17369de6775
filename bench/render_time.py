"""Render time of each stack, side by side with the floor every render pays.

Each run is a fresh `warmstart render` process, as a user or CI runs it. The floor is a
process that only imports the Pulumi SDKs the program uses, so the ratio shows what the
program itself adds. Usage: python bench/render_time.py [--runs N] [stacks...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLOOR = "import pulumi, pulumi_aws, pulumi_eks, pulumi_kubernetes"


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("stacks", nargs="*", default=["dev", "prod"])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        samples: dict[str, list[float]] = {"sdk import floor": []} | {s: [] for s in args.stacks}
        for i in range(args.runs):  # interleaved, so drift hits every series alike
            samples["sdk import floor"].append(timed([sys.executable, "-c", FLOOR]))
            for s in args.stacks:
                out = Path(tmp) / f"{s}-{i}"
                samples[s].append(timed([sys.executable, "-m", "warmstart.cli", "render", "--stack", s,
                                         "--out", str(out)]))
    floor = statistics.median(samples["sdk import floor"])
    print(f"{'series':<18} {'median s':>9} {'x floor':>8}  (n={args.runs})")
    for name, xs in samples.items():
        med = statistics.median(xs)
        print(f"{name:<18} {med:>9.2f} {med / floor:>8.2f}")


if __name__ == "__main__":
    main()
