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

It prints one JSON line, the record shape the standby actuator logs for each wake and
`warmstart coldstart --history` reads as a `standby wake` split (warmstart/coldstart/history.py):
`{"event": "warmstart.wake", "kind": "wake", "phases": {"sleep", "wake", "first_token"},
"flags": {"sleep_level": N, "measured": true}, "weights_bytes", "wake_gib_per_s", ...}`, or
`"result": "error"` with the reason (exit status 1). Every call has a deadline.

    python3 wake_bench.py --model qwen-67b --level 1 --weights-bytes 71940702208 [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import re
import sys
import time
import urllib.parse

EVENT = "warmstart.wake"
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the engine's base URL")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--level", type=int, default=1)
    p.add_argument("--weights-bytes", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--predicted-host-bytes", type=int, default=0,
                   help="host memory the render counts for a sleeping engine (the pod's memory limit holds it)")
    a = p.parse_args(argv)
    try:
        record = measure(a.url.rstrip("/"), a.model, a.level, a.weights_bytes, a.timeout, a.predicted_host_bytes)
    except (BenchError, OSError, ValueError) as exc:
        print(json.dumps({"event": EVENT, "result": "error", "reason": str(exc)}), flush=True)
        return 1
    print(json.dumps(record, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
