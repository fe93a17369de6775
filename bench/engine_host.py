#!/usr/bin/env python3
"""The engine host's supervisor measured on 127.0.0.1 (docs/scale-out.md, "Pooled standby").

The supervisor (warmstart/podside/engine_host) runs as a pod would run it, over fake engines
(tests/podside/fake_pooled_engine.py: vLLM 0.33.0's sleep API as tests/routing/fake_vllm.py serves
it, a load time, and a wake that takes the modelled time for the weights: about 3 s per 64 GiB at
sleep level 1, llm-d Fast Model Actuation's README). Measured side by side in one run:

1. Bring-up: `--engines` engines started one after another, each put to sleep before the next:
   the seconds until the host is a spare, against the sum of the engines' modelled load times
   (what the supervisor adds to a replacement host's window).
2. Wake: `--rounds` times, one engine woken through the supervisor's `/engines/<model>/wake_up`
   (the actuator's path: the one-awake check, then the engine) and, after it sleeps again, the
   same engine woken directly on its port; the medians and their difference, the supervisor's share
   of a pooled wake.

The last line is
`engine host: E engines a spare in B s (loads modelled L s); wake through the supervisor P s, direct D s (modelled W s): +X ms`.

    .venv/bin/python bench/engine_host.py [--engines 4] [--weights-gib 15] [--load-s 1.0] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.podside.servers import free_ports  # noqa: E402
from tests.routing.fake_vllm import WAKE_S_PER_GIB  # noqa: E402


def post(url: str, timeout: float = 60.0) -> int:
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", type=int, default=4)
    p.add_argument("--weights-gib", type=float, default=15.0)
    p.add_argument("--load-s", type=float, default=1.0, help="each fake engine's modelled load time")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        models = [f"m{i}" for i in range(a.engines)]
        ports = free_ports(len(models))
        env = {"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
        spec = {"sleepLevel": 1, "engines": [
            {"model": m, "port": port, "env": env,
             "argv": [sys.executable, "-m", "tests.podside.fake_pooled_engine", "--model", m, "--port", str(port),
                      "--events", str(events), "--load-s", str(a.load_s), "--weights-gib", str(a.weights_gib)]}
            for m, port in zip(models, ports)]}
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "warmstart.podside.engine_host", "--spec", f"{tmp}/spec.json",
                                 "--host", "127.0.0.1", "--port", "0", "--run-dir", f"{tmp}/run"],
                                stdout=subprocess.PIPE, text=True, cwd=str(ROOT), env={**os.environ, **env})
        port: list[int] = []
        listening = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if doc.get("event") == "warmstart.engine_host.listening":
                    port.append(doc["port"])
                    listening.set()

        threading.Thread(target=read, daemon=True).start()
        try:
            if not listening.wait(60):
                raise SystemExit("the supervisor never listened")
            url = f"http://127.0.0.1:{port[0]}"
            deadline = time.monotonic() + 60 + a.engines * (a.load_s + 10)
            while not get_json(url + "/engines")["spare"]:
                if time.monotonic() > deadline:
                    raise SystemExit("the host never became a spare")
                time.sleep(0.05)
            bring_up = time.monotonic() - started
            through, direct = [], []
            for r in range(a.rounds):
                m = models[r % len(models)]
                t = time.monotonic()
                assert post(f"{url}/engines/{m}/wake_up") == 200
                through.append(time.monotonic() - t)
                assert post(f"{url}/engines/{m}/sleep?level=1") == 200
                t = time.monotonic()
                assert post(f"http://127.0.0.1:{ports[models.index(m)]}/wake_up") == 200
                direct.append(time.monotonic() - t)
                assert post(f"http://127.0.0.1:{ports[models.index(m)]}/sleep?level=1") == 200
                # The supervisor learns of a direct wake and sleep from its health checks; wait until it
                # says spare again, so the next round's wake through it is not refused.
                while not get_json(url + "/engines")["spare"]:
                    time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    wake_model = a.weights_gib * WAKE_S_PER_GIB
    p_med, d_med = statistics.median(through), statistics.median(direct)
    print(f"bring-up per engine: {bring_up / a.engines:.2f} s (load modelled {a.load_s:.2f} s)")
    print(f"wake rounds through the supervisor: {', '.join(f'{x:.3f}' for x in through)}")
    print(f"wake rounds direct:                 {', '.join(f'{x:.3f}' for x in direct)}")
    print(f"engine host: {a.engines} engines a spare in {bring_up:.1f} s (loads modelled {a.engines * a.load_s:.1f} s); "
          f"wake through the supervisor {p_med:.2f} s, direct {d_med:.2f} s (modelled {wake_model:.2f} s): "
          f"+{(p_med - d_med) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
