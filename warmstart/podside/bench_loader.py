#!/usr/bin/env python3
"""Measure, in the user's own account and region, what the Run:ai streamer reaches from the
model's bucket: with the streamer's defaults, with warmstart's tuning, and a raw parallel
ranged GET of the same bytes (the ceiling), against the instance's network baseline.

Run by `warmstart bench-loader` as a Job on the model's GPU pool with the model's role; the
vLLM image's interpreter and its streamer are used, so the numbers are the serving pod's. The
result is one JSON line {"event":"warmstart.bench_loader",...}; the exit status is 0 unless
the model's files cannot be listed (then 1, with the reason in the line).

Environment:
    WARMSTART_MODEL_URI          s3://bucket/prefix of the safetensors. Required.
    WARMSTART_TUNED_ENV          JSON object of the RUNAI_STREAMER_* values the serving pod gets.
    WARMSTART_NETWORK_GBPS       the instance's network baseline, Gbps.
    WARMSTART_MAX_BYTES          stream at most this many bytes of the model (whole files, first
                                 ones first). Default 0: all.
    WARMSTART_CEILING_THREADS    default 32; WARMSTART_CEILING_PART_MIB default 64
    WARMSTART_CASE_TIMEOUT_S     deadline of each measurement. Default 1800.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from .common.shared import emit_line, make_s3_client

EVENT = "warmstart.bench_loader"

STREAMER_CHILD = r"""
import json, sys, time
from runai_model_streamer import SafetensorsStreamer
files = json.loads(sys.argv[1])
n = 0
t0 = time.perf_counter()
with SafetensorsStreamer() as st:
    st.stream_files(files)
    for _name, t in st.get_tensors():
        n += t.numel() * t.element_size()
print(json.dumps({"bytes": n, "seconds": time.perf_counter() - t0}))
"""

CEILING_CHILD = r"""
import json, sys, threading, time
import botocore.session
from botocore.config import Config
bucket, objs, threads, part = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = botocore.session.get_session().create_client("s3", config=Config(max_pool_connections=threads,
                                                 read_timeout=60, retries={"max_attempts": 3}))
jobs = [(k, a, min(s, a + part)) for k, s in objs for a in range(0, s, part)]
lock, total = threading.Lock(), [0]
def worker():
    buf = memoryview(bytearray(1 << 20))
    while True:
        with lock:
            if not jobs:
                return
            k, a, b = jobs.pop()
        raw = c.get_object(Bucket=bucket, Key=k, Range=f"bytes={a}-{b - 1}")["Body"]._raw_stream
        got = 0
        while (r := raw.readinto(buf)):
            got += r
        with lock:
            total[0] += got
t0 = time.perf_counter()
ts = [threading.Thread(target=worker) for _ in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps({"bytes": total[0], "seconds": time.perf_counter() - t0}))
"""


def _case(code: str, args: list[str], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {timeout_s:g} s"}
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:400]}
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "no result line"}
    out["gib_per_s"] = out["bytes"] / 2**30 / out["seconds"] if out.get("seconds") else None
    return out


def recommend(result: dict[str, Any]) -> str:
    """One sentence on what to change, from the three rates and the link's."""
    tuned, default, ceiling = (result.get(k, {}).get("gib_per_s") for k in ("tuned", "defaults", "ceiling"))
    link = result.get("network_gib_per_s")
    if not tuned or not ceiling:
        return "a measurement failed; see its error"
    if link and ceiling < 0.3 * link:
        return ("S3 delivers under 30 % of the instance's network baseline even with every range in flight: "
                "check that the GPU subnets route S3 through the gateway endpoint, not a NAT gateway, and that "
                "the bucket is in the cluster's region")
    if tuned < 0.8 * ceiling:
        return ("the tuned streamer reaches under 80 % of the ceiling: raise loader concurrency (more workers "
                "than shards only helps when shards are larger than the chunk) or lower the chunk size")
    if default and tuned < 1.2 * default:
        return "the tuning gains little here (small model or slow link); keep it for larger models"
    return "the tuned streamer is within 20 % of what S3 delivers: the loader is not the bottleneck"


def main() -> int:
    env = dict(os.environ)
    uri = env.get("WARMSTART_MODEL_URI", "")
    result: dict[str, Any] = {"event": EVENT, "model_uri": uri}
    try:
        if not uri.startswith("s3://"):
            raise ValueError("WARMSTART_MODEL_URI must be s3://bucket/prefix")
        bucket, _, prefix = uri[5:].partition("/")
        s3 = make_s3_client(connect_timeout_s=5, read_timeout_s=30, max_attempts=None)
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix.rstrip("/") + "/", Delimiter="/")
        objs = sorted((o["Key"], o["Size"]) for o in listed.get("Contents", []) if o["Key"].endswith(".safetensors"))
        if not objs:
            raise FileNotFoundError(f"no *.safetensors directly under {uri}")
    except Exception as exc:  # noqa: BLE001
        result.update(result="error", reason=f"{type(exc).__name__}: {exc}"[:600])
        emit_line(result)
        return 1
    limit = int(float(env.get("WARMSTART_MAX_BYTES") or 0))
    if limit:
        chosen, total = [], 0
        for k, s in objs:
            if chosen and total + s > limit:
                break
            chosen.append((k, s))
            total += s
        objs = chosen
    files = [f"s3://{bucket}/{k}" for k, _ in objs]
    timeout = float(env.get("WARMSTART_CASE_TIMEOUT_S") or 1800)
    base = {k: v for k, v in env.items() if not k.startswith("RUNAI_STREAMER_")}
    tuned_env = base | {k: str(v) for k, v in json.loads(env.get("WARMSTART_TUNED_ENV") or "{}").items()}
    gbps = float(env.get("WARMSTART_NETWORK_GBPS") or 0)
    result |= {"files": len(objs), "bytes": sum(s for _, s in objs),
               "network_gib_per_s": gbps * 1e9 / 8 / 2**30 if gbps else None}
    started = time.monotonic()
    # The order alternates nothing here: one run each, defaults first so a cold S3 prefix
    # penalises the baseline, not the tuning.
    result["defaults"] = _case(STREAMER_CHILD, [json.dumps(files)], base, timeout)
    result["tuned"] = _case(STREAMER_CHILD, [json.dumps(files)], tuned_env, timeout)
    result["ceiling"] = _case(CEILING_CHILD, [bucket, json.dumps(objs), env.get("WARMSTART_CEILING_THREADS") or "32",
                                              str(int(env.get("WARMSTART_CEILING_PART_MIB") or 64) << 20)], base, timeout)
    t, d, c = (result[k].get("gib_per_s") for k in ("tuned", "defaults", "ceiling"))
    result["tuned_over_defaults_time"] = (result["tuned"]["seconds"] / result["defaults"]["seconds"]
                                          if t and d else None)
    result["tuned_over_ceiling"] = t / c if t and c else None
    result["ceiling_over_network"] = c / result["network_gib_per_s"] if c and result["network_gib_per_s"] else None
    result["recommendation"] = recommend(result)
    result["result"] = "ok" if t and d and c else "partial"
    result["seconds"] = round(time.monotonic() - started, 3)
    emit_line(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
