#!/usr/bin/env python3
"""Measure one wake of a vLLM engine in sleep mode, on its own pod (stdlib only).

`warmstart wake-bench` runs this in a standby model's vLLM container (its own interpreter, the
engine on the pod's loopback, so no NetworkPolicy is in the way) and files the record it prints
in the model's cold-start history. The steps, vLLM 0.33's dev routes
(`vllm/entrypoints/serve/dev/`, exposed by `--enable-sleep-mode` and `VLLM_SERVER_DEV_MODE=1`):

1. `GET /is_sleeping`: a 404 means the engine has no sleep mode (the model has no `standby`);
2. an awake engine is put to sleep first, only when it runs and queues nothing
   (`vllm:num_requests_running` and `vllm:num_requests_waiting` are 0 on `/metrics`):
   `POST /sleep?level=N&mode=wait`, then `/is_sleeping` until true;
3. the wake, timed: `POST /wake_up`; at level 2 also `POST /collective_rpc {"method":
   "reload_weights"}` and `POST /reset_prefix_cache` (the weights were dropped; vLLM
   docs/features/sleep_mode.md, "Level 2"), as the standby actuator wakes one;
4. the first token, timed: one `POST /v1/completions` with `max_tokens: 1`;
5. an engine found asleep is put back to sleep, so the pod is left as it was.

While the engine sleeps (before the wake) it reads the container's cgroup memory: `memory.current`
and `memory.peak` (cgroup v2, https://docs.kernel.org/admin-guide/cgroup-v2.html; v1's
`memory.usage_in_bytes` and `memory.max_usage_in_bytes` where v2 is absent). The sleeping weights
are pinned by the engine's worker processes, not by this process or the API server, so only the
container's cgroup sees them. Beside the render's prediction (`--predicted-host-bytes`, what the
pod's memory limit was checked against) it records the factor measured on the user's own node.

With `--residue-of SUPERVISOR` it measures instead what k sleeping engines keep on one engine host's
GPUs (issue 38; the host's supervisor, warmstart/podside/engine_host, on the pod's loopback): the
host must be a spare (`GET /engines`: every one of its k engines asleep); then each GPU the
container sees is read with `nvidia-smi --query-gpu=index,memory.used,memory.total
--format=csv,noheader,nounits` (MiB; https://docs.nvidia.com/deploy/nvidia-smi/, the query fields
of `nvidia-smi --help-query-gpu`), which the NVIDIA container runtime puts in a CUDA image's
container with its `utility` capability. What a sleeping engine keeps (its CUDA context, CUDA-graph
pools, NCCL and custom all-reduce buffers, anything outside vLLM's `weights` and `kv_cache` pool)
is not one number in vLLM's source; on a spare host nothing else holds the GPUs (no process runs on
a GPU its pod did not request, and the supervisor holds none), so the fullest GPU's memory in use
over k is each sleeper's residue per GPU, an upper bound the plan may use in place of its default
(`sleepingResidueGiB`). It prints one `warmstart.sleep_residue` line (`kind: residue`).

It prints one JSON line, the record shape the standby actuator logs for each wake and
`warmstart coldstart --history` reads as a `standby wake` split (warmstart/coldstart/history.py):
`{"event": "warmstart.wake", "kind": "wake", "phases": {"sleep", "wake", "first_token"},
"flags": {"sleep_level": N, "measured": true}, "weights_bytes", "wake_gib_per_s", ...}`, or
`"result": "error"` with the reason (exit status 1). Every call has a deadline.

    python3 wake_bench.py --model qwen-67b --level 1 --weights-bytes 71940702208 [--url http://127.0.0.1:8000]
    python3 wake_bench.py --residue-of http://127.0.0.1:8090
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import math
import re
import subprocess
import sys
import time
import urllib.parse

EVENT = "warmstart.wake"
RESIDUE_EVENT = "warmstart.sleep_residue"
MIB = 2**20
SMI_QUERY = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"]
FORMAT = 1
MAX_BODY = 1 << 20
GIB = 2**30
_METRIC = re.compile(r"^(vllm:num_requests_(?:running|waiting))(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$")


class BenchError(RuntimeError):
    pass


def call(method: str, url: str, body: object = None, timeout: float = 30.0) -> tuple[int, bytes]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, u.path + (f"?{u.query}" if u.query else ""), body=data,
                     headers={"Content-Type": "application/json"} if data is not None else {})
        resp = conn.getresponse()
        return resp.status, resp.read(MAX_BODY)
    finally:
        conn.close()


def _ok(method: str, url: str, body: object = None, timeout: float = 30.0) -> bytes:
    code, text = call(method, url, body, timeout)
    if code != 200:
        raise BenchError(f"{method} {urllib.parse.urlsplit(url).path} answered {code}: "
                         f"{text[:200].decode(errors='replace')}")
    return text


def sleeping(base: str, timeout: float) -> bool:
    code, text = call("GET", base + "/is_sleeping", timeout=timeout)
    if code == 404:
        raise BenchError("the engine has no sleep mode (GET /is_sleeping is 404): only a model with `standby` "
                         "runs with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1")
    if code != 200:
        raise BenchError(f"GET /is_sleeping answered {code}")
    return bool(json.loads(text).get("is_sleeping"))


def busy(base: str, timeout: float) -> float:
    """Requests the engine runs or queues (vLLM's gauges, summed over its engines)."""
    total = 0.0
    for line in _ok("GET", base + "/metrics", timeout=timeout).decode(errors="replace").splitlines():
        m = _METRIC.match(line)
        if m:
            total += float(m.group(2))
    return total


def _until_asleep(base: str, deadline: float, timeout: float) -> None:
    while not sleeping(base, timeout):
        if time.monotonic() > deadline:
            raise BenchError("the engine did not report sleeping in time")
        time.sleep(0.1)


CGROUP = "/sys/fs/cgroup"


def cgroup_memory(root: str = CGROUP) -> dict:
    """The container's memory now and at its peak, in bytes ({} where neither cgroup file is
    readable): v2's memory.current / memory.peak, else v1's usage / max usage."""
    out: dict = {}
    for key, names in (("current", ("memory.current", "memory/memory.usage_in_bytes")),
                       ("peak", ("memory.peak", "memory/memory.max_usage_in_bytes"))):
        for name in names:
            try:
                with open(os.path.join(root, name)) as f:
                    out[key] = int(f.read().split()[0])
                break
            except (OSError, ValueError, IndexError):
                continue
    return out


def measure(base: str, model: str, level: int, weights_bytes: int, timeout: float = 600.0,
            predicted_host_bytes: int = 0, cgroup_root: str = CGROUP) -> dict:
    """One wake of the engine at `base`, as a record (raises BenchError)."""
    if level not in (1, 2):
        raise BenchError("the sleep level is 1 or 2")
    deadline = time.monotonic() + timeout
    phases: dict[str, float] = {}
    was_asleep = sleeping(base, 10)
    if not was_asleep:
        if busy(base, 10):
            raise BenchError("the engine is serving (requests running or waiting): measure on a sleeping standby "
                             "engine, or when the model is idle")
        t = time.monotonic()
        _ok("POST", f"{base}/sleep?level={level}&mode=wait", timeout=timeout)
        _until_asleep(base, deadline, 10)
        phases["sleep"] = round(time.monotonic() - t, 3)
    # Asleep now: what the sleeping weights hold in the container (read before the wake frees them).
    asleep = cgroup_memory(cgroup_root)
    t0 = time.monotonic()
    _ok("POST", base + "/wake_up", timeout=timeout)
    if level == 2:
        _ok("POST", base + "/collective_rpc", {"method": "reload_weights"}, timeout=timeout)
        _ok("POST", base + "/reset_prefix_cache", timeout=timeout)
    t1 = time.monotonic()
    _ok("POST", base + "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 1}, timeout=timeout)
    t2 = time.monotonic()
    phases |= {"wake": round(t1 - t0, 3), "first_token": round(t2 - t1, 3)}
    if was_asleep:
        # Left as found: a standby engine goes back to sleep.
        _ok("POST", f"{base}/sleep?level={level}&mode=wait", timeout=timeout)
    return {
        "event": EVENT, "result": "ok", "format": FORMAT, "kind": "wake", "model": model,
        "pod": os.environ.get("POD_NAME") or os.environ.get("HOSTNAME"), "node": os.environ.get("NODE_NAME"),
        "level": level, "weights_bytes": weights_bytes, "phases": phases,
        "flags": {"sleep_level": level, "measured": True, "was_asleep": was_asleep},
        "wake_gib_per_s": round(weights_bytes / GIB / phases["wake"], 3) if phases["wake"] > 0 else None,
        "host_memory": {
            "asleep_bytes": asleep.get("current"), "peak_bytes": asleep.get("peak"),
            "predicted_bytes": predicted_host_bytes or None,
            # The factor over the weights the container holds asleep, against the render's count.
            "asleep_per_weight": round(asleep["current"] / weights_bytes, 3)
            if asleep.get("current") and weights_bytes else None,
            "peak_per_prediction": round(asleep["peak"] / predicted_host_bytes, 3)
            if asleep.get("peak") and predicted_host_bytes else None,
        },
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def gpu_memory(smi: list[str] | None = None, timeout: float = 30.0) -> list[dict]:
    """Each GPU the container sees: `{"index", "used_bytes", "total_bytes"}` (raises BenchError)."""
    try:
        out = subprocess.run(smi or SMI_QUERY, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchError(f"nvidia-smi could not run ({exc}): measure in the host's own container, whose CUDA "
                         "image the NVIDIA runtime gives nvidia-smi") from None
    if out.returncode != 0:
        raise BenchError(f"nvidia-smi exited {out.returncode}: {out.stderr.strip()[:200]}")
    gpus = []
    for line in out.stdout.splitlines():
        if not line.strip():
            continue
        try:
            index, used, total = (int(float(x.strip())) for x in line.split(","))
        except ValueError:
            raise BenchError(f"nvidia-smi printed {line[:80]!r}, not index, memory.used, memory.total") from None
        if used < 0 or total <= 0 or used > total:
            raise BenchError(f"nvidia-smi printed {line[:80]!r}: memory.used is not within memory.total")
        gpus.append({"index": index, "used_bytes": used * MIB, "total_bytes": total * MIB})
    if not gpus:
        raise BenchError("nvidia-smi listed no GPU: the container sees none")
    return gpus


def measure_residue(supervisor: str, timeout: float = 60.0, smi: list[str] | None = None) -> dict:
    """What the k sleeping engines of the spare host behind `supervisor` keep on its GPUs."""
    text = _ok("GET", supervisor + "/engines", timeout=min(timeout, 30.0))
    doc = json.loads(text)
    engines = doc.get("engines") if isinstance(doc, dict) else None
    if not isinstance(engines, list) or not engines or not all(isinstance(e, dict) for e in engines):
        raise BenchError("GET /engines is not the engine host's status: point --residue-of at its supervisor")
    states = {str(e.get("model")): e.get("state") for e in engines}
    if any(s != "asleep" for s in states.values()):
        raise BenchError("the host is not a spare (" + ", ".join(f"{m} {s}" for m, s in sorted(states.items()))
                         + "): measure on a host whose every engine sleeps")
    gpus = gpu_memory(smi, timeout)
    # Read again after: a host that woke an engine meanwhile measured an awake engine, not sleepers.
    doc = json.loads(_ok("GET", supervisor + "/engines", timeout=min(timeout, 30.0)))
    if not isinstance(doc, dict) or not doc.get("spare"):
        raise BenchError("the host stopped being a spare while it was measured (a wake): measure again")
    k = len(states)
    used = max(g["used_bytes"] for g in gpus)
    per = math.ceil(used / k)
    return {
        "event": RESIDUE_EVENT, "result": "ok", "format": FORMAT, "kind": "residue", "sleepers": k,
        "models": sorted(states), "sleep_level": doc.get("sleepLevel"), "gpus": gpus,
        "used_bytes_max": used, "residue_bytes_per_sleeper": per, "residue_gib_per_sleeper": round(per / GIB, 2),
        "pod": os.environ.get("POD_NAME") or os.environ.get("HOSTNAME"), "node": os.environ.get("NODE_NAME"),
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the engine's base URL")
    p.add_argument("--model", help="the served model name (a wake's measurement)")
    p.add_argument("--residue-of", default="", help="an engine host's supervisor URL: measure its k sleepers' "
                   "GPU residue instead of a wake")
    p.add_argument("--level", type=int, default=1)
    p.add_argument("--weights-bytes", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--predicted-host-bytes", type=int, default=0,
                   help="host memory the render counts for a sleeping engine (the pod's memory limit holds it)")
    a = p.parse_args(argv)
    if a.residue_of:
        try:
            record = measure_residue(a.residue_of.rstrip("/"), a.timeout)
        except (BenchError, OSError, ValueError) as exc:
            print(json.dumps({"event": RESIDUE_EVENT, "result": "error", "reason": str(exc)}), flush=True)
            return 1
        print(json.dumps(record, sort_keys=True), flush=True)
        return 0
    if not a.model:
        p.error("--model is required to measure a wake")
    try:
        record = measure(a.url.rstrip("/"), a.model, a.level, a.weights_bytes, a.timeout, a.predicted_host_bytes)
    except (BenchError, OSError, ValueError) as exc:
        print(json.dumps({"event": EVENT, "result": "error", "reason": str(exc)}), flush=True)
        return 1
    print(json.dumps(record, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
