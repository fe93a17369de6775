#!/usr/bin/env python3
"""A scale-out by waking a standby engine, measured end to end on 127.0.0.1 (docs/scale-out.md).

Everything but the engines is real: the pinned SMG router (PyPI `smg`, the binary the routing tests
run), warmstart's standby actuator (warmstart/podside/standby/) and front queue
(warmstart/podside/front_queue.py) run as their pods run them. What stands in for Kubernetes: the
serving pods' rendered readiness probe (warmstart/manifests/serving.py, `readiness_probe`: `/health`,
which a sleeping engine passes) run as the kubelet would, and the pods SMG's Kubernetes discovery
selects (Ready and labelled `warmstart.io/engine=awake`, the label the actuator writes, here to
its `--labels-file`) written to SMG's discovery file. The engines are tests/routing/fake_vllm.py in
dev mode: vLLM's sleep API as its 0.33.0 source defines it (`/sleep`, `/wake_up`, `/is_sleeping`,
503 on the inference routes while asleep), a wake that takes the modelled time for the model's
weights (about 3 s per 64 GiB at sleep level 1, llm-d Fast Model Actuation's README), and a
scheduler that runs `--max-num-seqs` requests at once and queues the rest
(`vllm:num_requests_waiting`).

1. Load step: one awake engine, one asleep (prod's qwen-67b: 67 GiB, one standby engine,
   targetWaitingPerReplica 5). `--clients` clients start at once and keep sending; the awake
   engine's queue passes the target, the actuator wakes the sleeper and labels it awake once its
   warm-up token is served, and SMG adds it. S: seconds from the load step to the first reply the
   woken engine served; W: its modelled wake. S - W is warmstart's own share (signal, actuation,
   the label, the router's discovery).
2. From zero: no awake engine, one asleep, the front queue in front of the router. `--clients`
   requests arrive at once: they are held (the actuator counts them as waiting and wakes the
   sleeper) and answered once it serves. Dropped: any answer that is not a 200.

The last line is
`scale-out: woken serves S s after the load step (wake modelled W s); failed F of N; from zero: held H, dropped D`.

    .venv/bin/python bench/scaleout.py [--weights-gib 67] [--clients 12] [--step-seconds 12]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.podside.servers import free_ports  # noqa: E402
from tests.support.pod_scripts import artifact  # noqa: E402
from tests.routing.fake_vllm import MODEL, WAKE_S_PER_GIB, FakeVllm  # noqa: E402
from tests.routing.router import SmgRouter, write_discovery_file  # noqa: E402
from warmstart.decisions import routing  # noqa: E402
from warmstart.manifests import serving  # noqa: E402
from warmstart.podside import front_queue
from warmstart.podside.standby import observe as standby  # noqa: E402

BOUND_S = 120.0  # the most any wait here takes


class Discovery(threading.Thread):
    """Kubernetes' part: the rendered readiness probe of each engine (its period), as the kubelet
    runs it, and the engines SMG's pod watch would select, Ready and labelled awake (the labels the
    actuator writes to `labels`), written to SMG's discovery file whenever they change."""

    def __init__(self, engines: list[FakeVllm], manifest: Path, labels: Path, asleep: set[str]) -> None:
        super().__init__(daemon=True)
        self.engines, self.manifest, self.labels, self.stop = engines, manifest, labels, threading.Event()
        # The sleepers were put to sleep by the actuator earlier: labelled asleep first (its drain).
        labels.write_text(json.dumps({e.url: standby.ASLEEP if e.url in asleep else standby.AWAKE for e in engines}))
        self.probe_spec = serving.readiness_probe()
        self.ready: set[str] = set()
        self.selected_at: dict[str, float] = {}
        write_discovery_file(manifest, [])

    def probe(self, url: str) -> bool:
        get = self.probe_spec["httpGet"]
        try:
            with urllib.request.urlopen(url + get["path"], timeout=self.probe_spec["timeoutSeconds"]) as r:
                return 200 <= r.status < 400
        except OSError:
            return False

    def run(self) -> None:
        last: list[str] | None = None
        next_probe = 0.0
        while not self.stop.is_set():
            if time.monotonic() >= next_probe:
                self.ready = {e.url for e in self.engines if self.probe(e.url)}
                next_probe = time.monotonic() + self.probe_spec["periodSeconds"]
            try:
                labels = json.loads(self.labels.read_text())
            except (OSError, ValueError):
                labels = {}
            selected = sorted(u for u in self.ready if labels.get(u) == standby.AWAKE)
            for u in selected:
                self.selected_at.setdefault(u, time.monotonic())
            if selected != last:
                write_discovery_file(self.manifest, selected)
                last = selected
            # The API server's watch delivers a label change at once; this poll stands in for it.
            self.stop.wait(0.05)


class Actuator:
    def __init__(self, engines: list[str], labels: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(artifact("standby.pyz")), "--model", MODEL,
             "--engines", ",".join(engines), "--labels-file", str(labels), "--period", "1", "--probe-timeout", "2", *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={"PATH": "/usr/bin:/bin"})
        self.lines: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                pass

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class FrontQueue:
    def __init__(self, upstream: str, ready_url: str, retry_after: int) -> None:
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(artifact("front_queue.pyz")), "--host", "127.0.0.1",
             "--port", str(self.port), "--upstream", upstream, "--ready-url", ready_url, "--max-held", "256", "--max-hold-seconds", "60",
             "--retry-after", str(retry_after)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.held()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the front queue did not start")

    def held(self) -> dict:
        with urllib.request.urlopen(self.url + front_queue.HELD_PATH, timeout=5) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def chat(url: str, i: int) -> tuple[int, str]:
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": f"request {i}"}]}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=BOUND_S) as r:
            return r.status, json.loads(r.read())["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError as e:
        return -1, repr(e)


def clients(url: str, n: int, until: float | None, t0: float) -> list[tuple[float, int, str]]:
    """`n` clients; each sends one request (until is None) or keeps sending until `until`.
    (seconds after t0 the reply came, status, engine)."""
    out: list[tuple[float, int, str]] = []
    lock = threading.Lock()

    def one(c: int) -> None:
        k = 0
        while True:
            status, by = chat(url, c * 10_000 + k)
            with lock:
                out.append((time.monotonic() - t0, status, by))
            k += 1
            if until is None or time.monotonic() >= until or k > 10_000:
                return

    threads = [threading.Thread(target=one, args=(c,), daemon=True) for c in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND_S)
    return out


def router_flags(manifest: Path) -> list[str]:
    return [*routing.policy_flags("prefix_hash"), "--discovery-provider", "file", "--discovery-file", str(manifest),
            "--discovery-check-interval-secs", "1"]


def load_step(a: argparse.Namespace, tmp: Path) -> tuple[float, float, int, int]:
    with ExitStack() as stack:
        awake = stack.enter_context(FakeVllm("awake", dev_mode=True, delay_ms=a.decode_ms, max_num_seqs=a.max_num_seqs,
                                             weights_gib=a.weights_gib, wake_s_per_gib=a.wake_s_per_gib))
        sleeper = stack.enter_context(FakeVllm("woken", dev_mode=True, asleep=True, delay_ms=a.decode_ms,
                                               max_num_seqs=a.max_num_seqs, weights_gib=a.weights_gib,
                                               wake_s_per_gib=a.wake_s_per_gib))
        manifest, labels = tmp / "step.json", tmp / "step-labels.json"
        ready = Discovery([awake, sleeper], manifest, labels, asleep={sleeper.url})
        ready.start()
        stack.callback(ready.stop.set)
        r = stack.enter_context(SmgRouter(router_flags(manifest), wait_for_workers=1, ready_timeout_s=60))
        act = Actuator([awake.url, sleeper.url], labels, "--standby", "1", "--min-awake", "1", "--target-waiting",
                       f"{a.target_waiting:g}", "--awake-idle-seconds", "600")
        stack.callback(act.stop)
        time.sleep(2.0)  # the actuator's first reads: no load, nothing to do
        t0 = time.monotonic()
        replies = clients(r.url, a.clients, t0 + a.step_seconds, t0)
        woken = sorted(t for t, s, by in replies if s == 200 and by == "woken")
        failed = sum(1 for _, s, _ in replies if s != 200)
        wakes = [e for e in act.lines if e.get("event") == "warmstart.wake"]
        print(f"load step: {len(replies)} replies from {a.clients} clients over {a.step_seconds:g} s; "
              f"woken engine's first reply at {woken[0]:.2f} s" if woken else "load step: the sleeper never served")
        if wakes:
            print(f"  actuator: {json.dumps(wakes[0]['phases'])} (signal measured from the tick that saw the queue)")
        if sleeper.url in ready.selected_at:
            print(f"  woken engine labelled awake, in SMG's discovery, {ready.selected_at[sleeper.url] - t0:.2f} s "
                  "after the step")
        return (woken[0] if woken else float("inf")), sleeper.stats()["wake_s"], failed, len(replies)


def from_zero(a: argparse.Namespace, tmp: Path) -> tuple[int, int, int]:
    with ExitStack() as stack:
        sleeper = stack.enter_context(FakeVllm("woken", dev_mode=True, asleep=True, delay_ms=a.decode_ms,
                                               max_num_seqs=a.max_num_seqs, weights_gib=a.weights_gib,
                                               wake_s_per_gib=a.wake_s_per_gib))
        manifest, labels = tmp / "zero.json", tmp / "zero-labels.json"
        ready = Discovery([sleeper], manifest, labels, asleep={sleeper.url})
        ready.start()
        stack.callback(ready.stop.set)
        r = stack.enter_context(SmgRouter(router_flags(manifest), ready_timeout_s=60))
        fq = FrontQueue(r.url, f"http://127.0.0.1:{r.probe_port}/readiness",
                        retry_after=int(sleeper.stats()["wake_s"]) + 3)
        stack.callback(fq.stop)
        act = Actuator([sleeper.url], labels, "--standby", "1", "--min-awake", "0", "--target-waiting",
                       f"{a.target_waiting:g}", "--awake-idle-seconds", "600", "--front-queue", fq.url)
        stack.callback(act.stop)
        time.sleep(2.0)
        t0 = time.monotonic()
        replies = clients(fq.url, a.clients, None, t0)
        held = fq.held()
        dropped = sum(1 for _, s, _ in replies if s != 200)
        print(f"from zero: {len(replies)} requests at once, no engine awake; all answered by "
              f"{max(t for t, _, _ in replies):.2f} s; front queue {held}")
        return held["total_held"], dropped, len(replies)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights-gib", type=float, default=67.0, help="the model's weights (prod's qwen-67b)")
    p.add_argument("--wake-s-per-gib", type=float, default=WAKE_S_PER_GIB,
                   help="modelled level-1 wake (FMA README: ~3 s per 64 GiB)")
    p.add_argument("--clients", type=int, default=12)
    p.add_argument("--step-seconds", type=float, default=12.0)
    p.add_argument("--decode-ms", type=float, default=200.0, help="time an engine takes per request")
    p.add_argument("--max-num-seqs", type=int, default=2, help="requests an engine runs at once")
    p.add_argument("--target-waiting", type=float, default=5.0, help="targetWaitingPerReplica (prod's default)")
    a = p.parse_args(argv)
    print(f"engines: fake vLLM in dev mode, {a.weights_gib:g} GiB of weights, wake modelled at "
          f"{a.wake_s_per_gib * 64:.1f} s per 64 GiB = {a.weights_gib * a.wake_s_per_gib:.2f} s; "
          f"{a.max_num_seqs} running at once, {a.decode_ms:g} ms each")
    with tempfile.TemporaryDirectory(prefix="scaleout-") as d:
        s, w, failed, n = load_step(a, Path(d))
        held, dropped, sent = from_zero(a, Path(d))
    print(f"warmstart's share (S - W): {s - w:.2f} s (bound 3 s); from zero: {sent} sent")
    print(f"scale-out: woken serves {s:.1f} s after the load step (wake modelled {w:.1f} s); failed {failed} of {n}; "
          f"from zero: held {held}, dropped {dropped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
