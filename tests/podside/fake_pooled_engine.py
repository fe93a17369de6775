"""One vLLM engine of an engine host, as the supervisor (warmstart/podside/engine_host) runs it: a
process it starts with an argv and a port, which loads for a while (its /health refuses until then),
and then serves vLLM 0.33.0's sleep API (tests/routing/fake_vllm.py's handler, in dev mode).

Every event is appended as one JSON line to `--events` (`start` when the process begins, `healthy`,
`sleep`, `wake_up`, and `worker <pid>` for a child it started with `--spawn-worker`), with the time and the model, so a test reads the order in which the supervisor
brought engines up. Each line is one write(2) of a few dozen bytes to a file opened O_APPEND, so
lines from several engines never interleave.

    python -m tests.podside.fake_pooled_engine --model m0 --port P --events FILE [--load-s 0.3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer

from tests.routing import fake_vllm


def record(path: str, model: str, event: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps({"model": model, "event": event, "t": time.time(), "pid": os.getpid()}) + "\n").encode())
    finally:
        os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--load-s", type=float, default=0.3, help="seconds /health refuses after start (loading)")
    p.add_argument("--weights-gib", type=float, default=0.0)
    p.add_argument("--spawn-worker", action="store_true",
                   help="start a child process, as vLLM's engine core and TP workers are, and record its pid")
    a = p.parse_args()
    record(a.events, a.model, "start")
    if a.spawn_worker:
        # Bounded, so that a test cut short leaves nothing running for long.
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        record(a.events, a.model, f"worker {worker.pid}")
    # It serves its member's model name, as the host's vLLM does (`--served-model-name`): the actuator
    # reads its gauges by `model_name` and its warm-up names the model.
    state = fake_vllm.State(a.model, 64, 0.0, dev_mode=True, weights_gib=a.weights_gib, served_model=a.model)
    state.healthy = False
    base = fake_vllm.handler(state)

    class Handler(base):  # type: ignore[misc, valid-type]
        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/sleep", "/wake_up"):
                record(a.events, a.model, path.lstrip("/"))
            super().do_POST()

    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True

    def loaded() -> None:
        state.healthy = True
        record(a.events, a.model, "healthy")

    threading.Timer(a.load_s, loaded).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    server.serve_forever(poll_interval=0.1)


if __name__ == "__main__":
    main()
