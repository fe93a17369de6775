#!/usr/bin/env python3
"""Side by side: the first torch.compile call on a cold node, on a warm node, and on a new node
pre-warmed from the bucket by warmstart/podside/compile_cache.py.

Each measurement is a fresh process, as a new pod is. Three cases per round, interleaved so
that machine noise hits all three alike:

    cold       empty cache dir: inductor compiles everything
    warm       the same node again: the cache it just wrote (what the hostPath gives). Every
               warmstart pod runs the restore init container first, and on this node it
               answers "hit" from its node marker; its wall time is added, as for prewarmed
    prewarmed  a new, empty node: `compile_cache.py restore` from a local S3 server (rclone),
               then the compile; the restore's whole wall time, interpreter start and S3
               client included, is added to the compile

Target: prewarmed <= 1.15 x warm and <= 0.2 x cold. The bare warm compile (without
the restore a warmstart pod runs) is printed too, with its ratio. The workload is the small
transformer of tests/podside/compile_workload.py, the same one the test proves hits the cache.
The archive is the whole engine state a vLLM 0.33 start leaves: beside that compile, the cold
node's "engine" (tests/podside/fake_engine.py, with the serving pod's env) writes the startup
plan and the FlashInfer, CUDA, DeepGEMM, TVM-FFI and TileLang JIT trees at the sizes that
module's docstring sources (`--engine-scale 1`: about 27 MB, with FlashInfer's ops loaded from
the image's flashinfer-jit-cache; `--flashinfer-jit` adds the 38 MiB of `.so` FlashInfer builds
for ops outside it), so the restore moves what a real pod's does. A CPU cannot replay those JIT
caches, so the measured workload gains nothing from them: the ratios bound what the larger
archive costs.

    python bench/compile_cache.py [--rounds 3] [--engine-scale 1.0] [--flashinfer-jit]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.podside.pods import IMAGE, MODULE, clean_environ, run_engine  # noqa: E402
from tests.podside.servers import BUCKET, HealthServer, RcloneS3  # noqa: E402

WORKLOAD = ROOT / "tests" / "podside" / "compile_workload.py"


def compile_on(cache: Path) -> dict:
    env = {**clean_environ(), "XDG_CACHE_HOME": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
           "TRITON_CACHE_DIR": str(cache / "triton")}
    proc = subprocess.run([sys.executable, str(WORKLOAD)], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tool(command: list[str], env: dict[str, str]) -> tuple[float, dict]:
    """Run the pod-side tool as the pod does; (wall seconds, its log line)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(MODULE), *command], env={**clean_environ(), **env},
                          capture_output=True, text=True, check=True)
    return time.perf_counter() - start, json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine-scale", type=float, default=1.0,
                        help="size of the JIT trees the fake engine writes (1: about 27 MB; 0: none)")
    parser.add_argument("--flashinfer-jit", action="store_true",
                        help="the model's FlashInfer ops are not in flashinfer-jit-cache: their .so travel too")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="warmstart-bench-") as tmp, \
            RcloneS3(Path(tmp) / "s3") as s3, HealthServer() as vllm:
        def pod_env(cache: Path) -> dict[str, str]:
            return {**s3.env(), "WARMSTART_CACHE_DIR": str(cache), "WARMSTART_CACHE_BUCKET": BUCKET,
                    "WARMSTART_CACHE_PREFIX": "bench/", "WARMSTART_MODEL": "tiny-lm", "WARMSTART_TP": "1",
                    "WARMSTART_IMAGE": IMAGE, "WARMSTART_HEALTH_URL": vllm.url}

        rows = []
        for r in range(args.rounds):
            cold_node = Path(tmp) / f"cold-{r}" / "compile-cache"
            new_node = Path(tmp) / f"new-{r}" / "compile-cache"
            cold_node.mkdir(parents=True)
            new_node.mkdir(parents=True)

            cold = compile_on(cold_node)
            if args.engine_scale > 0:  # the rest of the engine's start on that node
                run_engine(cold_node, Path(tmp) / f"home-{r}", scale=args.engine_scale, seed=0,
                           flashinfer_jit=args.flashinfer_jit)
            # Its sidecar then publishes (the first node) or finds the key published already
            # (later ones); either way the node remembers it holds the cache.
            _, published = tool(["publish", "--once"], pod_env(cold_node))
            assert published["result"] == ("published" if r == 0 else "exists"), published

            def warm_pod() -> tuple[float, dict]:
                wall, line = tool(["restore"], pod_env(cold_node))
                assert line["result"] == "hit", line
                return wall, compile_on(cold_node)

            def prewarmed() -> tuple[float, dict, dict]:
                wall, line = tool(["restore"], pod_env(new_node))
                assert line["result"] == "restored", line
                return wall, line, compile_on(new_node)

            # Alternate which of the two runs straight after the cold compile, so neither
            # always inherits its aftermath (page cache, CPU clocks, a neighbour's load).
            if r % 2 == 0:
                hit_wall, warm = warm_pod()
                restore_wall, restored, pre = prewarmed()
            else:
                restore_wall, restored, pre = prewarmed()
                hit_wall, warm = warm_pod()

            assert cold["fxgraph_cache_miss"] > 0
            for case in (warm, pre):
                assert case["fxgraph_cache_hit"] > 0 and case["fxgraph_cache_miss"] == 0, case
            rows.append({"cold": cold["first_call_s"], "warm_compile": warm["first_call_s"],
                         "hit": hit_wall, "warm": hit_wall + warm["first_call_s"],
                         "restore": restore_wall, "restore_tool": restored["seconds"],
                         "prewarmed_compile": pre["first_call_s"],
                         "prewarmed": restore_wall + pre["first_call_s"], "bytes": restored["bytes"]})
            row = rows[-1]
            print(f"round {r + 1}: cold {row['cold']:.2f} s  warm {row['warm']:.2f} s (restore hit "
                  f"{row['hit']:.2f} s + compile {row['warm_compile']:.2f} s)  prewarmed "
                  f"{row['prewarmed']:.2f} s (restore {row['restore']:.2f} s wall, {row['restore_tool']:.3f} s "
                  f"in the tool, {row['bytes']} bytes; compile {row['prewarmed_compile']:.2f} s)", flush=True)

    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    to_warm, to_cold = med["prewarmed"] / med["warm"], med["prewarmed"] / med["cold"]
    print(f"\nmedians over {len(rows)} rounds (first torch.compile call, fresh process each; engine scale "
          f"{args.engine_scale:g}{', FlashInfer ops JIT-built' if args.flashinfer_jit else ''}, archive "
          f"{med['bytes'] / 1e6:.1f} MB):")
    print(f"  cold                {med['cold']:7.2f} s")
    print(f"  warm (same node)    {med['warm']:7.2f} s  = restore hit {med['hit']:.2f} s "
          f"+ compile {med['warm_compile']:.2f} s")
    print(f"  prewarmed (new node){med['prewarmed']:7.2f} s  = restore {med['restore']:.2f} s "
          f"+ compile {med['prewarmed_compile']:.2f} s")
    print(f"  prewarmed / warm = {to_warm:.2f}  (target <= 1.15: {'met' if to_warm <= 1.15 else 'MISSED'})")
    print(f"  prewarmed / cold = {to_cold:.3f} (target <= 0.20: {'met' if to_cold <= 0.2 else 'MISSED'})")
    print(f"  prewarmed / bare warm compile (no restore step on the warm node) = "
          f"{med['prewarmed'] / med['warm_compile']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
