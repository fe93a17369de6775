#!/usr/bin/env python3
"""Pooled standby (issue 38) measured end to end on 127.0.0.1 (docs/scale-out.md, "The pool actuator").

Real: the pinned SMG router, one per model (PyPI `smg`, as bench/scaleout.py runs it), each model's
front queue (front_queue.pyz), the engine host's supervisor (warmstart/podside/engine_host, one
process per host) and the pool actuator (standby.pyz --pool-spec), as their pods run them. Stand-ins:

- the engines: a host runs one tests/podside/fake_pooled_engine.py per model (vLLM 0.33.0's sleep
  API, a load of `--engine-load-s` each, started one after another by the supervisor, and a wake
  of `--weights-gib` at about 3 s per 64 GiB at sleep level 1, llm-d Fast Model Actuation's
  README); a model's own pods are tests/routing/fake_vllm.py processes that answer /health only
  `--cold-start-s` after they were created (m1's after `--second-cold-start-s`: a smaller model),
  the model's cold start, modelled;
- Kubernetes: the host Deployment's ReplicaSet (reads `--scale-file`, which the actuator writes in
  place of the scale subresource, starts a host per missing replica, removes a starting or spare
  host on a lowering, never a serving one), each model's KEDA + ReplicaSet (reads the actuator's
  `GET /warmstart/pods/<model>` every second and creates the own pods it asks for), and SMG's pod
  watch: a model's router discovers its own pods once Ready and a host's engine of the model while
  the host is labelled `warmstart.io/serves=<model>`, `warmstart.io/engine=awake`.

`--models` models share `--spares` spare host(s). Two runs, each from a fresh pool:

1. A step on m0; once the replacement host is a spare, a step on m1 while m0 is still awake: both
   are served by a wake. S, S2: seconds from each step to its first reply; W, W2: the wakes the
   actuator recorded (`warmstart.wake`). S - W is warmstart's share (signal, actuation, warm-up,
   label, the router's discovery, the front queue's release).
2. A step on m0, then a step on m1 as soon as m0's wake is done, inside the replacement's start
   (its engines load one after another): m1 gets no spare; its figure asks for its own pod at once,
   which serves it, its requests held in its front queue meanwhile: never a hang.

Failed: replies that are not 200 in both runs; dropped: requests a front queue refused.
The last line is
`pooled standby: M models on K spare GPU sets (per-model standby: M); first step woken serves S s (wake W s); second model S2 s (wake W2 s); failed F of N; dropped D`.

    .venv/bin/python bench/pool.py [--models 4] [--clients 6] [--step-seconds 8] [--engine-load-s 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scaleout import FrontQueue, chat, router_flags  # noqa: E402
from tests.podside.servers import free_ports, stop_process  # noqa: E402
from tests.routing.fake_vllm import WAKE_S_PER_GIB, FakeVllm  # noqa: E402
from tests.routing.router import SmgRouter, write_discovery_file  # noqa: E402
from tests.support.pod_scripts import artifact  # noqa: E402

BOUND_S = 180.0  # the most any wait here takes
PY_ENV = {"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}


def get_json(url: str, timeout: float = 5.0) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


class World:
    """What the actuator's `--static` file says: the hosts, each model's own pods, its front queue."""

    def __init__(self, path: Path, models: list[str]) -> None:
        self.path, self.lock = path, threading.Lock()
        self.doc: dict = {"hosts": {}, "members": {m: {} for m in models}, "frontQueues": {}}
        self.write()

    def write(self) -> None:
        with self.lock:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.doc))
            tmp.replace(self.path)

    def set(self, section: str, key: str, value: object, model: str | None = None) -> None:
        with self.lock:
            where = self.doc[section] if model is None else self.doc[section][model]
            if value is None:
                where.pop(key, None)
            else:
                where[key] = value
        self.write()


class HostProc:
    def __init__(self, name: str, tmp: Path, models: list[str], load_s: float, weights_gib: float) -> None:
        self.name = name
        folder = tmp / name
        folder.mkdir()
        ports = free_ports(len(models))
        self.ports = dict(zip(models, ports))
        events = folder / "events.jsonl"
        spec = {"sleepLevel": 1, "engines": [
            {"model": m, "port": p, "env": PY_ENV,
             "argv": [sys.executable, "-m", "tests.podside.fake_pooled_engine", "--model", m, "--port", str(p),
                      "--events", str(events), "--load-s", str(load_s), "--weights-gib", str(weights_gib)]}
            for m, p in zip(models, ports)]}
        (folder / "spec.json").write_text(json.dumps(spec))
        (self.port,) = free_ports(1)
        self.url = f"http://127.0.0.1:{self.port}"
        self.started = time.monotonic()
        self.spare_at: float | None = None
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "warmstart.podside.engine_host", "--spec", str(folder / "spec.json"),
             "--host", "127.0.0.1", "--port", str(self.port), "--run-dir", str(folder / "run"), "--stop-grace", "5"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=str(ROOT), env={"PATH": "/usr/bin:/bin", **PY_ENV})

    def engines(self) -> dict | None:
        return get_json(self.url + "/engines", timeout=2)

    def stop(self) -> None:
        stop_process(self.proc, 30)


class HostReplicaSet(threading.Thread):
    """The host Deployment's ReplicaSet: the replicas in `scale_file` become host processes."""

    def __init__(self, tmp: Path, world: World, scale_file: Path, models: list[str], load_s: float,
                 weights_gib: float) -> None:
        super().__init__(daemon=True)
        self.tmp, self.world, self.scale_file, self.models = tmp, world, scale_file, models
        self.load_s, self.weights_gib = load_s, weights_gib
        self.hosts: dict[str, HostProc] = {}
        self.removed: list[str] = []
        self.stop_ev = threading.Event()
        self.n = 0

    def want(self) -> int:
        try:
            return int(json.loads(self.scale_file.read_text())["replicas"])
        except (OSError, ValueError, KeyError):
            return len(self.hosts)

    def run(self) -> None:
        while not self.stop_ev.is_set():
            want = self.want()
            while len(self.hosts) < want:
                h = HostProc(f"h{self.n}", self.tmp, self.models, self.load_s, self.weights_gib)
                self.n += 1
                self.hosts[h.name] = h
                self.world.set("hosts", h.name, h.url)
            views = {name: h.engines() for name, h in self.hosts.items()}
            for name, v in views.items():
                if v and v.get("spare") and self.hosts[name].spare_at is None:
                    self.hosts[name].spare_at = time.monotonic()
            if len(self.hosts) > want:
                # ActivePodsWithRanks: a pod not Ready (a host still starting) first, then the lowest
                # deletion cost (a spare, -100); never one serving.
                order = sorted((name for name, v in views.items() if not v or not v.get("awake")),
                               key=lambda n: (bool(views[n] and views[n].get("spare")), n))
                for name in order[:len(self.hosts) - want]:
                    self.world.set("hosts", name, None)
                    self.hosts.pop(name).stop()
                    self.removed.append(name)
            self.stop_ev.wait(0.1)

    def stop(self) -> None:
        self.stop_ev.set()
        self.join(10)
        for h in self.hosts.values():
            h.stop()


class Member:
    """One model: its router, its router's discovery, its front queue, its own pods (KEDA + ReplicaSet)."""

    def __init__(self, stack: ExitStack, tmp: Path, model: str, world: World, hosts: HostReplicaSet,
                 labels_file: Path, cold_start_s: float, decode_ms: float) -> None:
        self.model, self.world, self.hosts, self.labels_file = model, world, hosts, labels_file
        self.cold_start_s, self.decode_ms = cold_start_s, decode_ms
        self.manifest = tmp / f"{model}-workers.json"
        write_discovery_file(self.manifest, [])
        self.router = stack.enter_context(SmgRouter(router_flags(self.manifest), ready_timeout_s=60))
        self.fq = FrontQueue(self.router.url, f"http://127.0.0.1:{self.router.probe_port}/readiness",
                             retry_after=5)
        stack.callback(self.fq.stop)
        world.set("frontQueues", model, [self.fq.url])
        self.own: list[tuple[FakeVllm, float]] = []  # (engine, ready at)
        self.timers: list[threading.Timer] = []
        self.selected_at: dict[str, float] = {}
        self.figure_url = ""
        self.stop_ev = threading.Event()
        self.threads = [threading.Thread(target=self._discovery, daemon=True),
                        threading.Thread(target=self._keda, daemon=True)]

    def start(self, figure_url: str) -> None:
        self.figure_url = figure_url
        for t in self.threads:
            t.start()

    def _discovery(self) -> None:
        last: list[str] | None = None
        ready: set[str] = set()
        next_probe = 0.0
        while not self.stop_ev.is_set():
            if time.monotonic() >= next_probe:
                # The readiness probe's period (warmstart/manifests/serving.py readiness_probe: 1 s).
                ready = {e.url for e, at in list(self.own) if time.monotonic() >= at and healthy(e.url)}
                next_probe = time.monotonic() + 1.0
            try:
                labels = json.loads(self.labels_file.read_text())
            except (OSError, ValueError):
                labels = {}
            urls = set(ready)
            for name, h in list(self.hosts.hosts.items()):
                lab = labels.get(name) or {}
                if lab.get("warmstart.io/serves") == self.model and lab.get("warmstart.io/engine") == "awake":
                    urls.add(f"http://127.0.0.1:{h.ports[self.model]}")
            for u in urls:
                self.selected_at.setdefault(u, time.monotonic())
            if sorted(urls) != last:
                write_discovery_file(self.manifest, urls)
                last = sorted(urls)
            self.stop_ev.wait(0.05)

    def _keda(self) -> None:
        while not self.stop_ev.is_set():
            fig = get_json(self.figure_url, timeout=2)
            want = int(fig["pods"]) if fig and isinstance(fig.get("pods"), int) else None
            while want is not None and len(self.own) < want:
                e = FakeVllm(f"{self.model}-own{len(self.own)}", served_model=self.model, delay_ms=self.decode_ms)
                e.set_healthy(False)
                at = time.monotonic() + self.cold_start_s
                self.own.append((e, at))
                self.world.set("members", e.name, e.url, model=self.model)
                timer = threading.Timer(self.cold_start_s, e.set_healthy, args=(True,))
                timer.daemon = True
                self.timers.append(timer)
                timer.start()
            self.stop_ev.wait(1.0)

    def stop(self) -> None:
        self.stop_ev.set()
        for t in self.threads:
            t.join(10)
        for timer in self.timers:
            timer.cancel()
        for e, _ in self.own:
            e.stop()


class Step(threading.Thread):
    """`clients` clients sending to `url` from now for `seconds`: (seconds after the step, status, engine)."""

    def __init__(self, url: str, model: str, clients: int, seconds: float) -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.clients, self.seconds = url, model, clients, seconds
        self.replies: list[tuple[float, int, str]] = []
        self.t0 = time.monotonic()
        self.start()

    def run(self) -> None:
        lock = threading.Lock()

        def one(c: int) -> None:
            k = 0
            while True:
                status, by = chat(self.url, c * 10_000 + k, self.model, BOUND_S)
                with lock:
                    self.replies.append((time.monotonic() - self.t0, status, by))
                k += 1
                if time.monotonic() - self.t0 >= self.seconds or k > 10_000:
                    return

        threads = [threading.Thread(target=one, args=(c,), daemon=True) for c in range(self.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(BOUND_S)

    def first(self) -> float:
        return min((t for t, s, _ in self.replies if s == 200), default=float("inf"))

    def failed(self) -> int:
        return sum(1 for _, s, _ in self.replies if s != 200)


def wait_for(what: str, check, timeout: float = BOUND_S, dump=None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}" + (f"\n{dump()}" if dump else ""))
        time.sleep(0.05)


def run_pool(a: argparse.Namespace, tmp: Path, inside_window: bool) -> dict:
    models = [f"m{i}" for i in range(a.models)]
    with ExitStack() as stack:
        world = World(tmp / "static.json", models)
        labels, scale = tmp / "labels.json", tmp / "scale.json"
        scale.write_text(json.dumps({"replicas": a.spares}))
        hosts = HostReplicaSet(tmp, world, scale, models, a.engine_load_s, a.weights_gib)
        hosts.start()
        stack.callback(hosts.stop)
        members = {m: Member(stack, tmp, m, world, hosts, labels,
                             a.second_cold_start_s if m == "m1" else a.cold_start_s, a.decode_ms) for m in models}
        for mem in members.values():
            stack.callback(mem.stop)
        pool = {"pool": "bench", "namespace": "bench", "hostSelector": {"warmstart.io/standby-pool": "bench"},
                "hostDeployment": "bench-hosts", "spares": a.spares, "maxHosts": a.spares + a.models,
                "supervisorPort": 8090, "sleepLevel": 1,
                "members": [{"model": m, "port": 8100 + i, "deployment": m, "selector": {"app": m},
                             "minReplicas": 0, "targetWaiting": 5, "targetRequests": 0, "awakeIdleSeconds": 600,
                             "frontQueue": {"service": f"{m}-front", "port": 8081}} for i, m in enumerate(models)]}
        (tmp / "pool.json").write_text(json.dumps(pool))
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(artifact("standby.pyz")), "--pool-spec", str(tmp / "pool.json"),
             "--static", str(tmp / "static.json"), "--labels-file", str(labels), "--scale-file", str(scale),
             "--period", "1", "--probe-timeout", "2", "--unlist-seconds", "1", "--figure-address", "127.0.0.1",
             "--figure-port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={"PATH": "/usr/bin:/bin"})
        stack.callback(proc.wait, 10)
        stack.callback(proc.terminate)
        lines: list[dict] = []

        def read() -> None:
            for raw in proc.stdout:  # type: ignore[union-attr]
                try:
                    lines.append(json.loads(raw))
                except ValueError:
                    pass
        threading.Thread(target=read, daemon=True).start()
        wait_for("the actuator", lambda: any(x["event"] == "warmstart.pool_start" for x in lines), 30)
        port = next(x["figure_port"] for x in lines if x["event"] == "warmstart.pool_start")
        for m, mem in members.items():
            mem.start(f"http://127.0.0.1:{port}/warmstart/pods/{m}")
        wait_for("a spare host", lambda: any(h.spare_at for h in list(hosts.hosts.values())))
        # From the host's process start (the pod's container) to every engine asleep.
        bring_up = min(h.spare_at - h.started for h in list(hosts.hosts.values()) if h.spare_at)
        time.sleep(2.0)  # the actuator's first reads: nothing to do

        def wake_of(model: str) -> dict | None:
            return next((x for x in lines if x["event"] == "warmstart.wake" and x.get("model") == model), None)

        def dump() -> str:
            return "\n".join([json.dumps(x) for x in lines[-25:]] + [f"{n}: {h.engines()}" for n, h in list(hosts.hosts.items())]
                              + [f"scale {scale.read_text()}", f"labels {labels.read_text() if labels.exists() else ''}"])

        first = Step(members["m0"].fq.url, "m0", a.clients, a.step_seconds)
        wait_for("m0's wake", lambda: wake_of("m0") is not None)
        replacement_ready = None
        if not inside_window:
            # The replacement a wake asked for: a spare once its engines loaded one after another.
            wait_for("the replacement spare", lambda: sum(1 for h in list(hosts.hosts.values()) if h.spare_at) >= 2
                     and len(hosts.hosts) >= 2, dump=dump)
            replacement_ready = time.monotonic() - first.t0
        second = Step(members["m1"].fq.url, "m1", a.clients, a.step_seconds)
        first.join(BOUND_S)
        second.join(BOUND_S)
        window = [x for x in lines if x["event"] == "warmstart.pool_cold"]
        out = {"S": first.first(), "W": (wake_of("m0") or {}).get("wake_s", float("nan")),
               "S2": second.first(), "W2": (wake_of("m1") or {}).get("wake_s", float("nan")),
               "cold": bool([x for x in window if x.get("model") == "m1"]),
               "served_by_own": sorted({by for t, s, by in second.replies if s == 200 and "own" in by}),
               "failed": first.failed() + second.failed(), "n": len(first.replies) + len(second.replies),
               "dropped": sum(int((mem.fq.held() or {}).get("refused", 0)) for mem in members.values()),
               "hosts_started": hosts.n, "bring_up": bring_up, "replacement_ready": replacement_ready,
               "second_at": second.t0 - first.t0}
        return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=4)
    p.add_argument("--spares", type=int, default=1)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--step-seconds", type=float, default=8.0)
    p.add_argument("--weights-gib", type=float, default=15.0, help="each model's weights (its modelled wake)")
    p.add_argument("--engine-load-s", type=float, default=4.0, help="one engine's load on a host (modelled)")
    p.add_argument("--cold-start-s", type=float, default=30.0,
                   help="a model's own pod's cold start (modelled), but m1's: longer than a replacement host's "
                   "start, so m0's pooled engine still serves at run 1's second step")
    p.add_argument("--second-cold-start-s", type=float, default=10.0,
                   help="m1's own pod's cold start (a smaller model): shorter than a replacement host's start, so "
                   "run 2's second step is served by its own scale-up")
    p.add_argument("--decode-ms", type=float, default=20.0)
    a = p.parse_args()
    if a.models < 2:
        p.error("--models must be at least 2: the bench steps two of them")
    with tempfile.TemporaryDirectory(prefix="pool-bench-") as d:
        (Path(d) / "a").mkdir()
        (Path(d) / "b").mkdir()
        r1 = run_pool(a, Path(d) / "a", inside_window=False)
        r2 = run_pool(a, Path(d) / "b", inside_window=True)
    wake_model = a.weights_gib * WAKE_S_PER_GIB
    print(f"host bring-up: {a.models} engines a spare in {r1['bring_up']:.1f} s "
          f"(loads modelled {a.models * a.engine_load_s:.1f} s)")
    print(f"run 1, second step after the replacement: replacement a spare {r1['replacement_ready']:.1f} s after the "
          f"first step; m0 served {r1['S']:.2f} s (wake {r1['W']:.2f} s, modelled {wake_model:.2f} s; "
          f"warmstart's share {r1['S'] - r1['W']:.2f} s); m1 served {r1['S2']:.2f} s after its step (wake {r1['W2']:.2f} s; "
          f"share {r1['S2'] - r1['W2']:.2f} s); hosts started {r1['hosts_started']}")
    print(f"run 2, second step {r2['second_at']:.1f} s after the first, inside the replacement's start "
          f"({a.models} x {a.engine_load_s:g} s loads): m0 served {r2['S']:.2f} s (wake {r2['W']:.2f} s); m1 "
          f"{'found no spare (its own pod asked for at once)' if r2['cold'] else 'found a spare (NOT the case run 2 sets up)'}, "
          f"held, served {r2['S2']:.2f} s after its step by "
          f"{'its own pod ' + ', '.join(r2['served_by_own']) if r2['served_by_own'] else 'the replacement, woken once it was a spare'}"
          f" (its own cold start modelled {a.second_cold_start_s:g} s: served at {r2['S2'] / a.second_cold_start_s:.2f}x it); "
          f"failed {r2['failed']} of {r2['n']}")
    failed, n, dropped = r1["failed"] + r2["failed"], r1["n"] + r2["n"], r1["dropped"] + r2["dropped"]
    print(f"pooled standby: {a.models} models on {a.spares} spare GPU sets (per-model standby: {a.models}); "
          f"first step woken serves {r1['S']:.2f} s (wake {r1['W']:.2f} s); second model {r1['S2']:.2f} s "
          f"(wake {r1['W2']:.2f} s); failed {failed} of {n}; dropped {dropped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
