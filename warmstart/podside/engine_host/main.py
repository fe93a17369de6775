"""`engine_host --spec FILE [--host H] [--port P] [--run-dir D]`: run the host's engines until SIGTERM.

Exit codes: 0 after a SIGTERM (every engine stopped), 2 for a spec that cannot run (one line naming
the field)."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

from .server import make_server
from .spec import SpecError, load
from .supervisor import HEALTH_PERIOD_S, HEALTH_TIMEOUT_S, Supervisor, log

# warmstart/decisions/standby_pool.py SUPERVISOR_PORT: the pod's probes and the actuator reach it there.
DEFAULT_PORT = 8090
TICK_S = 0.2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="engine_host", description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, type=Path, help="the engines to run (JSON, see spec.py)")
    p.add_argument("--host", default="0.0.0.0", help="address of the supervisor's port")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--run-dir", type=Path, default=None, help="per-engine scratch folders (default: a temp folder)")
    p.add_argument("--stop-grace", type=float, default=20.0, help="seconds engines get after SIGTERM")
    p.add_argument("--wake-timeout", type=float, default=600.0)
    p.add_argument("--health-period", type=float, default=HEALTH_PERIOD_S,
                   help="seconds between an up engine's /health checks (three misses in a row restart it)")
    p.add_argument("--health-timeout", type=float, default=HEALTH_TIMEOUT_S)
    return p.parse_args(argv)


def main(argv: list[str] | None = None, stop: threading.Event | None = None) -> int:
    args = parse_args(argv)
    try:
        spec = load(args.spec)
    except SpecError as exc:
        print(f"engine_host: --spec {exc}", file=sys.stderr, flush=True)
        return 2
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="engine-host-"))
    sup = Supervisor(spec, run_dir, health_period_s=args.health_period, health_timeout_s=args.health_timeout)
    server = make_server(sup, args.host, args.port, args.wake_timeout)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    log("listening", port=server.server_address[1], engines=[e.model for e in spec.engines])
    try:
        while not stop.wait(TICK_S):
            sup.tick()
    finally:
        sup.stop(args.stop_grace)
        server.shutdown()
        server.server_close()
        log("stopped")
    return 0
