"""The actuator's loop and its read-only JSON server, shared by the per-model actuator (main.py) and
the pool mode (pool_mode.py). Part of the standby package (main.py says why)."""

from __future__ import annotations

import argparse
import http.server
import json
import threading
import time
from typing import Callable

from .observe import log


def turn(args: argparse.Namespace, stop: threading.Event, step: Callable[[float], None]) -> None:
    """The actuator's loop, per-model and pool mode alike: `step(started)` every `--period` seconds
    until `stop` or `--max-ticks`. A failed step is logged, never the process's end; a step that ran
    its course rewrites `--heartbeat`, whose age the liveness probe reads, so a loop that stopped
    turning (or fails every step) is restarted."""
    ticks = 0
    while not stop.is_set() and (args.max_ticks is None or ticks < args.max_ticks):
        ticks += 1
        started = time.monotonic()
        try:
            step(started)
        except Exception as exc:  # noqa: BLE001 - one bad tick is logged, never the process's end
            log("warmstart.standby_tick_failed", error=f"{type(exc).__name__}: {exc}"[:300])
        else:
            if args.heartbeat:
                with open(args.heartbeat, "w") as f:
                    f.write(f"{time.time():.3f}\n")
        stop.wait(max(0.0, args.period - (time.monotonic() - started)))


def serve_json(address: str, port: int, answer: Callable[[str], tuple[int, dict]]) -> http.server.ThreadingHTTPServer:
    """A read-only JSON server on a daemon thread: each GET's path (its query left out) goes to
    `answer`, whose (status, object) is the reply; every other method gets the server's 501."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            code, doc = answer(self.path.split("?", 1)[0])
            body = json.dumps(doc, sort_keys=True).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    return server
