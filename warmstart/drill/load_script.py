#!/usr/bin/env python3
"""The drill's load: bounded parallel traffic with shared prefixes through the model's router.

Run by the load Job's pod (the router image's python3, standard library only):

    python3 -c "<this file>" --url http://<model>.<ns>.svc:8000 --model <served name> --rate 4
        --duration 600 --concurrency 32 --max-requests 2400 --max-tokens 32 --prefix-groups 8 --seed S

Requests start at `--rate` per second (evenly spaced) for `--duration` seconds, never more than
`--concurrency` in flight and `--max-requests` in all. Each is a streaming `POST /v1/completions`
whose prompt is one of `--prefix-groups` long shared prefixes (a system text about 1,000 tokens)
plus a short tail of its own, the traffic prefix-aware routing is for. The time to first token is
the first streamed `data:` chunk. Every request has one deadline (`--request-timeout`).

Output, one JSON object per line: `warmstart.drill_progress` every 10 s, then one
`warmstart.drill_load` with the counts, the TTFT percentiles and up to 5,000 samples
`[start offset s, ttft s or null, http status or 0]`, which the drill reads from the pod's log.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import math
import sys
import threading
import time
import urllib.parse

MAX_SAMPLES = 5000
MAX_ANSWER_BYTES = 1 << 20
WORDS = ("cache", "node", "replica", "router", "prefix", "weights", "engine", "token", "queue", "scale")


def log(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "time": round(time.time(), 3), **fields}, sort_keys=True), flush=True)


def prefix(group: int, seed: str) -> str:
    """About 1,000 tokens shared by every prompt of one group (four characters a token)."""
    out, i = [], 0
    while sum(len(w) + 1 for w in out) < 4000:
        h = hashlib.sha256(f"{seed}/{group}/{i}".encode()).digest()
        out.append(WORDS[h[0] % len(WORDS)])
        i += 1
    return f"System {group}: " + " ".join(out) + "\n"


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


class Load:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        u = urllib.parse.urlsplit(a.url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.prefixes = [prefix(g, a.seed) for g in range(a.prefix_groups)]
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(a.concurrency)
        self.samples: list[list] = []
        self.ok = self.failed = self.sent = self.skipped = 0
        self.ttfts: list[float] = []
        self.errors: dict[str, int] = {}

    def one(self, n: int, t0: float) -> None:
        start = time.monotonic()
        body = json.dumps({"model": self.a.model, "prompt": self.prefixes[n % len(self.prefixes)] + f"Question {n}: why?",
                           "max_tokens": self.a.max_tokens, "stream": True}).encode()
        ttft, status, err = None, 0, ""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.a.request_timeout)
        try:
            conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            status = r.status
            got = 0
            while got < MAX_ANSWER_BYTES and time.monotonic() - start < self.a.request_timeout:
                line = r.readline(65536)
                if not line:
                    break
                got += len(line)
                if ttft is None and line.startswith(b"data:") and not line.startswith(b"data: [DONE]"):
                    ttft = time.monotonic() - start
            if status != 200:
                err = f"http {status}"
        except (OSError, http.client.HTTPException) as exc:
            err = type(exc).__name__
        finally:
            conn.close()
            self.slots.release()
        with self.lock:
            good = status == 200 and ttft is not None
            self.ok += good
            self.failed += not good
            if good:
                self.ttfts.append(ttft)  # type: ignore[arg-type]
            else:
                self.errors[err or "no token"] = self.errors.get(err or "no token", 0) + 1
            if len(self.samples) < MAX_SAMPLES:
                self.samples.append([round(start - t0, 3), None if ttft is None else round(ttft, 4), status])

    def run(self) -> dict:
        a = self.a
        t0, wall0 = time.monotonic(), time.time()
        log("warmstart.drill_start", url=a.url, rate=a.rate, duration=a.duration, concurrency=a.concurrency,
            max_requests=a.max_requests, started=round(wall0, 3))
        threads: list[threading.Thread] = []
        next_progress = t0 + 10
        n = 0
        while n < a.max_requests:
            due = t0 + n / a.rate
            if due - t0 >= a.duration:
                break
            now = time.monotonic()
            if now < due:
                time.sleep(min(due - now, 0.5))
                continue
            if not self.slots.acquire(timeout=0.5):
                # Every slot busy: the request is not sent (the load stays bounded); counted.
                with self.lock:
                    self.skipped += 1
                n += 1
                continue
            t = threading.Thread(target=self.one, args=(n, t0), daemon=True)
            t.start()
            threads.append(t)
            self.sent += 1
            n += 1
            if time.monotonic() >= next_progress:
                with self.lock:
                    log("warmstart.drill_progress", sent=self.sent, ok=self.ok, failed=self.failed)
                next_progress += 10
            threads = [x for x in threads if x.is_alive()]
        for t in threads:
            t.join(timeout=max(0.0, a.request_timeout - (time.monotonic() - t0 - a.duration)) + 1)
        with self.lock:
            return {"url": a.url, "started": round(wall0, 3), "ended": round(time.time(), 3), "sent": self.sent,
                    "ok": self.ok, "failed": self.failed, "skipped_busy": self.skipped, "errors": self.errors,
                    "ttft_p50": percentile(self.ttfts, 50), "ttft_p90": percentile(self.ttfts, 90),
                    "ttft_p99": percentile(self.ttfts, 99), "samples": self.samples}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--duration", type=float, required=True)
    p.add_argument("--concurrency", type=int, required=True)
    p.add_argument("--max-requests", type=int, required=True)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prefix-groups", type=int, default=8)
    p.add_argument("--seed", default="drill")
    p.add_argument("--request-timeout", type=float, default=120.0)
    a = p.parse_args(argv)
    if not (0 < a.rate and 0 < a.duration and 0 < a.concurrency and 0 <= a.max_requests and a.prefix_groups > 0):
        log("warmstart.drill_load", result="error", reason="bounds out of range")
        return 2
    log("warmstart.drill_load", result="ok", **Load(a).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
