"""Node-local model cache: the real Run:ai streamer loading the same safetensors set from S3
and from the staged local directory, side by side in one run, plus the copier's contention.

    .venv/bin/python bench/node_cache.py [--mib-per-file 96] [--files 4] [--reps 3]

One rclone S3 server on 127.0.0.1 (tests/podside/servers.py). The set is staged with the real
staging script (warmstart/podside/weights_stage.py, s5cmd). The streamer (runai-model-streamer
0.17.1 + -s3) runs in a fresh process per load with warmstart's tuning (chunk bytes and
concurrency from warmstart.decisions.tuning, the request timeout and low-speed limit of the
Deployment). Measured: S3 load, local load, S3 load while s5cmd copies another version from the
same server (the first pod on a new node without the pause design), and the same while the
copier honours the serving pod's pause request (the design). Figures on a loopback server are
CPU-bound, not network-bound: they show the shape, not EC2 numbers. The last line is one JSON
object.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.podside.servers import BUCKET, RcloneS3  # noqa: E402
from tests.support.pod_scripts import artifact  # noqa: E402
from warmstart.decisions import node_cache, tuning  # noqa: E402
from warmstart.podside import weights_select  # noqa: E402
from warmstart.podside.weights_stage import main as weights_stage  # noqa: E402

STREAM = r"""
import json, sys, time
from runai_model_streamer import SafetensorsStreamer
paths = sys.argv[1:]
start = time.perf_counter()
n = 0
with SafetensorsStreamer() as s:
    s.stream_files(paths)
    for _, t in s.get_tensors():
        n += t.numel() * t.element_size()
print(json.dumps({"bytes": n, "seconds": time.perf_counter() - start}))
"""


def write_safetensors(path: Path, n_bytes: int, seed: int) -> None:
    """One safetensors file of float32 tensors (format: 8-byte header length, JSON header, data)."""
    tensors, offset, per = {}, 0, 16 << 20
    while offset < n_bytes:
        size = min(per, n_bytes - offset) // 4 * 4
        tensors[f"t{len(tensors)}"] = {"dtype": "F32", "shape": [size // 4], "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(tensors, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.write(os.urandom(offset) if seed else bytes(offset))


def stream(paths: list[str], env: dict[str, str], weights: int) -> dict:
    chunk = tuning.DEFAULT_CHUNK_BYTES
    env = env | {"RUNAI_STREAMER_CONCURRENCY": str(tuning.loader_concurrency(weights, chunk)),
                 "RUNAI_STREAMER_CHUNK_BYTESIZE": str(chunk),
                 "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0"} | tuning.streamer_s3_env()
    out = subprocess.run([sys.executable, "-c", STREAM, *paths], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib-per-file", type=int, default=96)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    s5 = glob.glob(str(Path(sys.executable).parent.parent / "lib/python*/site-packages/s5cmd/bin/s5cmd"))[0]
    work = Path(tempfile.mkdtemp(prefix="bench-node-cache-"))
    names = [f"model-{i + 1:05d}-of-{a.files:05d}.safetensors" for i in range(a.files)]
    for i, n in enumerate(names):
        write_safetensors(work / n, a.mib_per_file << 20, seed=i + 1)
    weights = sum((work / n).stat().st_size for n in names)
    with RcloneS3(work / "s3") as server:
        client = server.client()
        for version in ("v1", "v2"):  # v2: what the copier fetches while a pod streams v1
            for n in names:
                client.upload_file(str(work / n), BUCKET, f"bench/{version}/{n}")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RUNAI_"))} | server.env()
        source = f"s3://{BUCKET}/bench/v1"
        root = work / "node" / "weights" / "bench"
        base = env | {"WARMSTART_WEIGHTS_ROOT": str(root), "WARMSTART_S5CMD": s5, "WARMSTART_POLL_S": "0.1",
                      "WARMSTART_MIN_FREE_SHARE": "0"}

        def stage_env(version: str) -> dict[str, str]:
            src = f"s3://{BUCKET}/bench/{version}"
            return base | {"WARMSTART_WEIGHTS_SOURCE": src, "WARMSTART_WEIGHTS_DIGEST": node_cache.model_version_digest(src)}

        t0 = time.perf_counter()
        staged = weights_stage.stage(weights_stage.Settings.from_env(stage_env("v1")), emit_line=False)
        stage_s = time.perf_counter() - t0
        assert staged["result"] == "staged", staged
        local_dir = root / node_cache.model_version_digest(source)
        s3_paths = [f"{source}/{n}" for n in names]
        local_paths = [str(local_dir / n) for n in names]

        def copier(paused: bool) -> subprocess.Popen:
            import shutil
            v2 = root / node_cache.model_version_digest(f"s3://{BUCKET}/bench/v2")
            shutil.rmtree(v2, ignore_errors=True)
            shutil.rmtree(Path(f"{v2}.partial"), ignore_errors=True)
            if paused:
                weights_select.request_pause(root, "bench-pod", 3600)
            return subprocess.Popen([sys.executable, str(artifact("weights_stage.pyz")), "stage"],
                                    env=stage_env("v2"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        runs: dict[str, list[float]] = {"s3": [], "local": [], "s3_with_copier": [], "s3_copier_paused": []}
        for _ in range(a.reps):  # interleaved, so drift hits every variant alike
            runs["s3"].append(stream(s3_paths, env, weights)["seconds"])
            runs["local"].append(stream(local_paths, env, weights)["seconds"])
            for name, paused in (("s3_with_copier", False), ("s3_copier_paused", True)):
                proc = copier(paused)
                time.sleep(0.3)  # the copier is listing / copying
                try:
                    runs[name].append(stream(s3_paths, env, weights)["seconds"])
                finally:
                    proc.kill()
                    proc.wait(timeout=30)
                    for p in (root / weights_select.LOADING_DIR).glob("*.json"):
                        p.unlink()
    med = {k: statistics.median(v) for k, v in runs.items()}
    gib = weights / 2**30
    rate = {k: gib / v for k, v in med.items()}
    for k in runs:
        print(f"{k:18s} median {med[k]:7.3f} s  {rate[k]:6.2f} GiB/s  runs {[round(x, 3) for x in runs[k]]}")
    print(f"staging copy (s5cmd, verify, rename): {stage_s:.3f} s for {gib:.2f} GiB")
    print(f"local vs S3 speed-up: {med['s3'] / med['local']:.2f}x; copier contention slows S3 streaming "
          f"{med['s3_with_copier'] / med['s3']:.2f}x, paused copier {med['s3_copier_paused'] / med['s3']:.2f}x")
    print(json.dumps({"bench": "node_cache", "weights_bytes": weights, "files": a.files, "reps": a.reps,
                      "seconds": {k: round(v, 4) for k, v in med.items()},
                      "gib_per_s": {k: round(v, 3) for k, v in rate.items()},
                      "local_speedup": round(med["s3"] / med["local"], 3),
                      "contention_slowdown": round(med["s3_with_copier"] / med["s3"], 3),
                      "paused_slowdown": round(med["s3_copier_paused"] / med["s3"], 3),
                      "stage_seconds": round(stage_s, 3),
                      "concurrency": tuning.loader_concurrency(weights, tuning.DEFAULT_CHUNK_BYTES)},
                     sort_keys=True))


if __name__ == "__main__":
    main()
