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
3. Sustained: prod's qwen-67b shape (minReplicas 2, maxReplicas 4, one standby engine) with its
   scaling as Kubernetes would run it, on the bench's clock compressed `--compress` times: KEDA's
   two figures (the waiting-requests query and the engine-demand query, computed from the
   engines' own gauges as the rendered PromQL sums them, sampled every compressed 30 s scrape),
   the HPA's replica calculation, stabilization and rate limits at the rendered behavior
   (warmstart/decisions/hpa.py, every compressed 15 s sync), the ReplicaSet deleting by
   `ActivePodsWithRanks` with the costs the actuator writes (its `--costs-file`: -200 on an idle
   awake engine the load no longer needs, -100 on a sleeper), and a new pod that loads for the
   predicted warm-spare cold start (compressed) before its /health answers. A load step wakes the
   sleeper; the load then holds (a plateau longer than the rendered scale-down window) and steps
   again: S2, W2 are the second step's. Then the load falls to nothing and the bench waits for
   `minReplicas + count` pods, `count` of them asleep, and splits the time: the signal lag (the
   fall to the HPA's last recommendation above the floor, where the scale-down window starts: a
   scrape or an actuator period, then a sync), the window, and the removals (one pod per sync); it
   checks that against the bound those parts allow, which has no room for a drain. `pods - (awake + count)` is sampled while the load is up, awake
   meaning serving (not asleep and labelled awake: in the routers); a freshly loaded replacement
   that the actuator is taking out of the routers to sleep (its `--unlist-seconds` wait) is a
   sleeper in the making, and is counted apart on the same line. The actuator runs as the render
   runs it: KEDA's third figure is its own (`GET /warmstart/pods`, read at each HPA sync), and a
   wake raises the replicas (`--scale-file` standing in for the scale subresource).

The last line is
`scale-out: woken serves S s after the load step (wake modelled W s); failed F of N; from zero: held H, dropped D;
second step: woken serves S2 s after it (wake modelled W2 s)`.

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
from warmstart.decisions import autoscaling as scaling  # noqa: E402
from warmstart.decisions import hpa, routing  # noqa: E402
from warmstart.decisions import standby as standby_plan  # noqa: E402
from warmstart.manifests import serving  # noqa: E402
from warmstart.podside import front_queue  # noqa: E402
from warmstart.podside.standby import observe as standby  # noqa: E402
from warmstart.podside.standby.act import COST  # noqa: E402

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


def chat(url: str, i: int, model: str = MODEL, timeout: float = BOUND_S) -> tuple[int, str]:
    """One one-token chat request `i` to `model` at `url` (bench/pool.py's too): (status, the
    engine that answered); -1 and the error when no HTTP answer came."""
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": f"request {i}"}]}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
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


# --------------------------------------------------------------------------------------
# 3. Sustained load: KEDA, the HPA and the ReplicaSet on a compressed clock


def _metrics(url: str) -> tuple[float, float]:
    """(running, waiting) of one engine, as its /metrics reports them."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=2) as r:
            waiting, running = standby.parse_metrics(r.read().decode(errors="replace"), MODEL)
            return running, waiting
    except OSError:
        return 0.0, 0.0


def _sleeping(url: str) -> bool | None:
    try:
        with urllib.request.urlopen(url + "/is_sleeping", timeout=2) as r:
            return bool(json.loads(r.read())["is_sleeping"])
    except (OSError, ValueError, KeyError):
        return None


class Cluster(threading.Thread):
    """The model's pods, its ScaledObject's HPA and its ReplicaSet, on the bench's clock.

    `slots` are pre-started fake engines, one per pod the run may create; a slot not yet created,
    or deleted, is not in the pod list the actuator reads (`pods_file`) and answers /health 503
    (the readiness probe fails it; a pod still loading also answers 503 until it is up). The
    model's time runs `compress` times faster than the wall clock; the actuator, the router and
    the engines run at wall-clock speed."""

    def __init__(self, slots: list[FakeVllm], initial: int, plan: scaling.ScalingPlan, target_requests: float,
                 target_waiting: float, standby_count: int, load_s: float, compress: float, figure_url: str,
                 scale_file: Path, costs_file: Path, pods_file: Path) -> None:
        super().__init__(daemon=True)
        self.figure_url, self.scale_file, self.costs_file, self.pods_file = figure_url, scale_file, costs_file, pods_file
        # Model seconds of the last HPA sync whose recommendation (the largest of the triggers')
        # was above the floor: the scale-down window runs from there.
        self.last_high: float | None = None
        # (model s, pod name, its state, its deletion cost) of each pod the scale-down removed.
        self.removals: list[tuple[float, str, str, int]] = []
        self.figures: list[int | None] = []
        self.raised = 0
        self.slots, self.plan, self.compress = slots, plan, compress
        self.t_requests, self.t_waiting, self.count, self.load_s = target_requests, target_waiting, standby_count, load_s
        self.hpa = hpa.Hpa(hpa.Behavior.from_spec(scaling.hpa_behavior(plan)), plan.min_replicas, plan.max_replicas)
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.syncs: list[dict] = []  # each HPA sync's inputs and result (--actuator-log)
        self.t0_wall = time.time()  # model second 0 on the actuator's clock (its lines' `time`)
        self.pods: dict[str, dict] = {}  # url -> {"created": model s, "ready_at": wall s or None}
        self.next_slot = initial
        for e in slots[:initial]:
            self.pods[e.url] = {"created": 0.0, "ready_at": time.monotonic(), "name": e.name}
        for e in slots[initial:]:
            e.set_healthy(False)
        self.replicas = initial
        self._write_scale(initial)
        self._write_pods()
        self.sample: tuple[float, float] | None = None
        # (model s, pods, awake, asleep, serving, each pod's `name:state/label`): `awake` is every
        # engine not asleep (a replacement the actuator is putting to sleep included), `serving`
        # those also labelled awake, so in the routers.
        self.log: list[tuple[float, int, int, int, int, str]] = []
        self.labels: Path | None = None
        self.deleted: list[str] = []
        self.created: list[str] = []

    def _write_scale(self, n: int) -> None:
        tmp = self.scale_file.with_suffix(".cluster.tmp")
        tmp.write_text(json.dumps({"replicas": n}))
        tmp.replace(self.scale_file)

    def _write_pods(self) -> None:
        """The pods as the actuator lists them (its `--pods-file`)."""
        tmp = self.pods_file.with_suffix(".cluster.tmp")
        tmp.write_text(json.dumps(sorted(self.pods)))
        tmp.replace(self.pods_file)

    def _apply_scale(self) -> None:
        """The Deployment's controller: the replicas the actuator raised (its scale write) become pods."""
        try:
            want = int(json.loads(self.scale_file.read_text())["replicas"])
        except (OSError, ValueError, KeyError):
            return
        if want > len(self.pods):
            self.raised += want - len(self.pods)
            self._create(want - len(self.pods))

    def figure(self) -> int | None:
        """The actuator's figure, as KEDA's metrics-api scaler reads it when the HPA asks; None
        when it cannot be read (the HPA then holds a scale-down)."""
        try:
            with urllib.request.urlopen(self.figure_url, timeout=2) as r:
                return int(json.loads(r.read())["pods"])
        except (OSError, ValueError, KeyError):
            return None

    def model_now(self) -> float:
        return (time.monotonic() - self.t0) * self.compress

    def states(self) -> dict[str, str]:
        out = {}
        for url, p in self.pods.items():
            if p["ready_at"] is None or time.monotonic() < p["ready_at"]:
                out[url] = "loading"
            else:
                out[url] = "sleeping" if _sleeping(url) else "awake"
        return out

    def _create(self, n: int) -> None:
        for _ in range(n):
            if self.next_slot >= len(self.slots):
                raise RuntimeError("the bench ran out of pre-started engines: raise the slot count")
            e = self.slots[self.next_slot]
            self.next_slot += 1
            self.pods[e.url] = {"created": self.model_now(), "ready_at": time.monotonic() + self.load_s, "name": e.name}
            self.created.append(e.name)
        self._write_pods()

    def costs(self) -> dict[str, int]:
        """Each pod's `controller.kubernetes.io/pod-deletion-cost` as the actuator last wrote it
        (its `--costs-file`); a pod it has not annotated counts 0, as the ReplicaSet reads it."""
        try:
            written = json.loads(self.costs_file.read_text())
        except (OSError, ValueError):
            written = {}
        return {url: int(written.get(url, 0)) for url in self.pods}

    def _remove(self, n: int, states: dict[str, str]) -> None:
        # ActivePodsWithRanks over the pods as the ReplicaSet sees them: a loading pod is not
        # Ready; Ready ones carry the deletion cost the actuator wrote (act.py COST).
        costs = self.costs()
        pods = [hpa.Pod(url, ready=states[url] != "loading", deletion_cost=costs[url],
                        ready_since=p["ready_at"], created=p["created"]) for url, p in self.pods.items()]
        for victim in hpa.deletion_order(pods)[:n]:
            state = states[victim.name]
            if state == "awake" and costs[victim.name] == int(COST["surplus"]):
                state = "awake, surplus"
            self.deleted.append(f"{self.pods[victim.name]['name']} ({state})")
            self.removals.append((self.model_now(), self.pods[victim.name]["name"], state, costs[victim.name]))
            del self.pods[victim.name]
            next(e for e in self.slots if e.url == victim.name).set_healthy(False)
        self._write_pods()

    def run(self) -> None:
        scrape = scaling.SCRAPE_INTERVAL_SECONDS / self.compress
        sync = scaling.HPA_SYNC_SECONDS / self.compress
        next_scrape = next_sync = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            for url, p in self.pods.items():
                if p["ready_at"] is not None and now >= p["ready_at"] and p.get("healthy") is not True:
                    next(e for e in self.slots if e.url == url).set_healthy(True)
                    p["healthy"] = True
            if now >= next_scrape:
                # What AMP holds: the gauges of every pod that answers, summed.
                rw = [_metrics(u) for u, p in self.pods.items() if p.get("healthy") is not False]
                self.sample = (sum(r for r, _ in rw), sum(w for _, w in rw))
                next_scrape = now + scrape
            self._apply_scale()
            if now >= next_sync and self.sample is not None:
                running, waiting = self.sample
                current = len(self.pods)
                by_waiting = hpa.external_per_pod_replicas(current, waiting + self.count * self.t_waiting,
                                                           self.t_waiting, tolerance_up=0, tolerance_down=0)
                by_demand = hpa.external_per_pod_replicas(
                    current, scaling.demand_figure(running, waiting, self.t_requests, self.count), 1,
                    tolerance_up=0, tolerance_down=0)
                # The actuator's figure, read when the HPA asks (KEDA's metrics server calls the
                # scaler on each request unless useCachedMetrics is set).
                figure = self.figure()
                self.figures.append(figure)
                by_figure = None if figure is None else hpa.external_per_pod_replicas(
                    current, figure, 1, tolerance_up=0, tolerance_down=0)
                # computeReplicasForMetrics: the largest of the triggers' answers, none on a
                # scale-down while one errors.
                desired = hpa.replicas_for_metrics(current, [by_waiting, by_demand, by_figure])
                if desired is not None and desired > self.plan.min_replicas:
                    self.last_high = self.model_now()
                new = self.hpa.step(self.model_now(), current, desired)
                self.syncs.append({"event": "bench.hpa_sync", "model_s": round(self.model_now()), "current": current,
                                   "waiting": by_waiting, "demand": by_demand, "figure": by_figure, "new": new,
                                   "sample": self.sample})
                states = self.states()
                if new > current:
                    self._create(new - current)
                elif new < current:
                    self._remove(current - new, states)
                if new != current:
                    self._write_scale(new)
                next_sync = now + sync
            states = self.states()
            try:
                labels = json.loads(self.labels.read_text()) if self.labels else {}
            except (OSError, ValueError):
                labels = {}
            serving = sum(v == "awake" and labels.get(u) == standby.AWAKE for u, v in states.items())
            detail = " ".join(f"{self.pods[u]['name']}:{v}/{labels.get(u, '-')}" for u, v in states.items())
            self.log.append((self.model_now(), len(self.pods), sum(v == "awake" for v in states.values()),
                             sum(v == "sleeping" for v in states.values()), serving, detail))
            self.stop.wait(0.2)


class Load:
    """Closed-loop clients whose number follows a schedule (`set`)."""

    def __init__(self, url: str, t0: float) -> None:
        self.url, self.t0, self.target = url, t0, 0
        self.replies: list[tuple[float, int, str]] = []
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def set(self, n: int) -> None:
        self.target = n
        while len(self.threads) < n:
            c = len(self.threads)
            t = threading.Thread(target=self._client, args=(c,), daemon=True)
            self.threads.append(t)
            t.start()

    def _client(self, c: int) -> None:
        k = 0
        while k < 100_000:
            if c >= self.target:
                time.sleep(0.05)
                if self.target == -1:
                    return
                continue
            status, by = chat(self.url, c * 100_000 + k)
            with self.lock:
                self.replies.append((time.monotonic() - self.t0, status, by))
            k += 1

    def stop(self) -> None:
        self.target = -1
        for t in self.threads:
            t.join(BOUND_S)


def sustained(a: argparse.Namespace, tmp: Path) -> dict:
    min_awake, max_awake, count = a.min_replicas, a.max_replicas, 1
    # The rendered scale-down behavior of a model with this start-up budget (decisions/autoscaling.py).
    window = scaling.scale_down_hold_seconds(a.startup_budget)
    period = scaling.scale_down_period_seconds(a.startup_budget)
    plan = scaling.ScalingPlan(model=MODEL, namespace="inference", deployment=MODEL, min_replicas=min_awake + count,
                               max_replicas=max_awake + count, polling_interval_seconds=scaling.POLLING_INTERVAL_SECONDS,
                               cooldown_period_seconds=window, scale_down_stabilization_seconds=window,
                               scale_down_period_seconds=period, triggers=())
    # The per-engine load at which the actuator wakes another: max-num-seqs running plus
    # targetWaitingPerReplica waiting (docs/autoscaling.md, targetRequestsPerReplica).
    t_requests = a.max_num_seqs + a.target_waiting
    slots_n = max_awake + count + 3
    with ExitStack() as stack:
        slots = [stack.enter_context(FakeVllm(f"e{i}", dev_mode=True, asleep=(i == min_awake), delay_ms=a.decode_ms,
                                              max_num_seqs=a.max_num_seqs, weights_gib=a.weights_gib,
                                              wake_s_per_gib=a.wake_s_per_gib)) for i in range(slots_n)]
        initial = min_awake + count
        manifest, labels = tmp / "sustained.json", tmp / "sustained-labels.json"
        ready = Discovery(slots, manifest, labels, asleep={slots[min_awake].url})
        (figure_port,) = free_ports(1)
        scale_file, costs_file = tmp / "sustained-scale.json", tmp / "sustained-costs.json"
        pods_file = tmp / "sustained-pods.json"
        cluster = Cluster(slots, initial, plan, t_requests, a.target_waiting, count, a.load_seconds / a.compress,
                          a.compress, f"http://127.0.0.1:{figure_port}/warmstart/pods", scale_file, costs_file,
                          pods_file)
        cluster.labels = labels
        ready.start()
        stack.callback(ready.stop.set)
        r = stack.enter_context(SmgRouter(router_flags(manifest), wait_for_workers=min_awake, ready_timeout_s=60))
        act = Actuator([e.url for e in slots], labels, "--standby", str(count), "--min-awake", str(min_awake),
                       "--target-waiting", f"{a.target_waiting:g}",
                       "--awake-idle-seconds", f"{a.awake_idle_seconds / a.compress:g}",
                       # As the render runs it (manifests/standby.py), its times compressed as the model's.
                       "--target-requests", f"{t_requests:g}", "--figure-port", str(figure_port),
                       "--figure-address", "127.0.0.1", "--deployment", MODEL, "--max-pods", str(plan.max_replicas),
                       "--scale-file", str(scale_file), "--costs-file", str(costs_file), "--pods-file", str(pods_file),
                       "--surplus-idle-seconds", f"{a.surplus_idle_seconds / a.compress:g}",
                       "--wake-hold-seconds", f"{standby_plan.WAKE_HOLD_SECONDS / a.compress:g}")
        stack.callback(act.stop)
        if a.actuator_log:
            # Written last (callbacks run in reverse), once the actuator has stopped.
            stack.callback(lambda: Path(a.actuator_log).write_text("".join(
                json.dumps(x) + "\n" for x in [{"event": "bench.model_zero", "time": cluster.t0_wall}, *act.lines,
                                               *cluster.syncs])))
        time.sleep(3.0)
        cluster.start()
        stack.callback(cluster.stop.set)
        t0 = time.monotonic()
        load = Load(r.url, t0)
        stack.callback(load.stop)
        deficits: list[tuple[float, int]] = []
        unslept: list[tuple[float, int]] = []
        short: list[str] = []  # the pods at each sampled moment one short, `name:state/label`

        def hold(seconds: float, up: bool) -> None:
            end = time.monotonic() + seconds
            seen = None
            while time.monotonic() < end:
                if up and cluster.log and cluster.log[-1] is not seen:
                    # Each of the cluster's records once (it writes one every 0.2 s).
                    seen = cluster.log[-1]
                    m, pods, awake, _, serving, detail = seen
                    deficits.append((m, pods - (serving + count)))
                    unslept.append((m, pods - (awake + count)))
                    if pods - (serving + count) < 0:
                        short.append(f"{m:.0f}: {detail}")
                time.sleep(0.05)

        step1 = a.clients_step1
        load.set(step1)
        plateau = window / a.compress * 1.5 + 10
        hold(plateau, True)
        before2 = {u for u, v in cluster.states().items() if v == "sleeping"}
        t2 = time.monotonic() - t0
        load.set(a.clients_step2)
        hold(a.step2_seconds, True)
        load.set(0)
        fell = time.monotonic()
        fell_model = cluster.model_now()
        floor = min_awake + count
        returned = None
        deadline = fell + 2 * window / a.compress + 30
        while time.monotonic() < deadline:
            if len(cluster.pods) == floor and sum(v == "sleeping" for v in cluster.states().values()) == count:
                returned = (time.monotonic() - fell) * a.compress
                break
            time.sleep(0.5)
        names = {e.url: e.name for e in slots}
        woken2 = {names[u] for u in before2}
        s2 = sorted(t - t2 for t, st, by in load.replies if st == 200 and by in woken2 and t > t2)
        w2 = max((e.stats()["wake_s"] for e in slots if e.url in before2), default=float("nan"))
        failed = sum(1 for _, st, _ in load.replies if st != 200)
        # While the load is up, pods one short of awake + count: the longest such stretch, in
        # model seconds (before the actuator raised the replicas on a wake, a scrape and an HPA
        # sync long after each wake).
        def shortest(samples: list[tuple[float, int]]) -> tuple[int, float]:
            """(lowest, longest stretch short in model s): a stretch runs from its first short record
            to the first record that is not (one record alone: one record's 0.2 s, 6 model s); a
            stretch still short at the last record ends there."""
            worst, short_since, longest = 0, None, 0.0
            record = 0.2 * a.compress
            for m, d in samples:
                worst = min(worst, d)
                if d < 0 and short_since is None:
                    short_since = m
                elif d >= 0 and short_since is not None:
                    longest, short_since = max(longest, m - short_since), None
            if short_since is not None:
                longest = max(longest, samples[-1][0] - short_since + record)
            return worst, longest

        worst, longest = shortest(deficits)
        worst_unslept, longest_unslept = shortest(unslept)
        print(f"sustained: {step1} clients, then {a.clients_step2} from {t2:.1f} s; pods created {cluster.created}, "
              f"deleted {cluster.deleted}; {len(load.replies)} replies, {failed} failed")
        unread = sum(f is None for f in cluster.figures)
        print(f"  pods - (awake + count) while the load was up: lowest {worst}, longest short {longest:.0f} model s "
              f"(awake: serving, in the routers); counting a loaded replacement the actuator is taking out of "
              f"the routers to sleep as awake: lowest {worst_unslept}, longest {longest_unslept:.0f} model s")
        print(f"  pods the actuator's wakes raised at once: {cluster.raised}; its figure unread at {unread} of "
              f"{len(cluster.figures)} HPA syncs")
        if short:
            print(f"  records one short while the load was up ({len(short)}; model s: pod:state/label): "
                  + "; ".join(short[:4]))
        # The return, split. The window runs from the HPA's last recommendation above the floor,
        # which comes after the fall: the engine gauges reach the waiting and engine-demand queries
        # at the next scrape (30 s), the actuator's figure at its next period (1 s, 31 model s
        # here), and the HPA reads them at its next sync (15 s). Then the window, then one pod per
        # sync (a scale-down of one pod per period).
        sync = scaling.HPA_SYNC_SECONDS
        lag_bound = max(scaling.SCRAPE_INTERVAL_SECONDS, a.compress) + sync
        removed = [r for r in cluster.removals if r[0] >= fell_model]
        n_removed = len(removed)
        check = 0.5 * a.compress  # the bench looks every 0.5 s
        bound = lag_bound + window + sync + max(0, n_removed - 1) * max(period, sync) + check
        if returned is not None and cluster.last_high is not None:
            lag = max(0.0, cluster.last_high - fell_model)
            tail = removed[-1][0] - (cluster.last_high + window) if removed else 0.0
            back = (f"back to {floor} pods ({min_awake} awake + {count} asleep) after {returned:.0f} model s: the "
                    f"window's start {lag:.0f} s after the fall (its last recommendation above {floor} pods; signal "
                    f"lag at most one scrape or actuator period and one HPA sync, {lag_bound:.0f} s), the scale-down "
                    f"window {window} s, then {tail:.0f} s removing {n_removed} pods (the first at the next sync, "
                    f"then one per {max(period, sync)} s; the bench looks every {check:.0f} s); bound {bound:.0f} s: "
                    f"{'met' if returned <= bound else 'NOT met'}")
        else:
            back = f"NOT back to {floor} pods"
        print(f"  after the load fell: {back}")
        print(f"  removed after the fall: {[f'{name} ({state}, cost {cost})' for _, name, state, cost in removed]}")
        return {"s2": s2[0] if s2 else float("inf"), "w2": w2, "failed": failed, "n": len(load.replies),
                "worst": worst, "returned": returned, "woken": sorted(woken2)}


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
    p.add_argument("--min-replicas", type=int, default=2, help="prod's qwen-67b minReplicas")
    p.add_argument("--max-replicas", type=int, default=4, help="prod's qwen-67b maxReplicas")
    p.add_argument("--startup-budget", type=int, default=935,
                   help="the model's start-up budget, which sets the scale-down window (prod's qwen-67b: 935 s)")
    p.add_argument("--load-seconds", type=float, default=110.0,
                   help="a new pod's load on a warm spare (prod's render: ~110 s)")
    p.add_argument("--awake-idle-seconds", type=float, default=300.0, help="standby.awakeIdleSeconds (prod's)")
    p.add_argument("--surplus-idle-seconds", type=float, default=60.0,
                   help="the actuator's --surplus-idle-seconds (its default): idle this long, an awake engine the "
                        "load does not need gets a deletion cost below the sleeper's")
    p.add_argument("--compress", type=float, default=31.0, help="model seconds per bench second")
    p.add_argument("--clients-step1", type=int, default=16,
                   help="clients of the first step: two awake engines queue 12 past their 4 running (the actuator "
                        "wakes past 10), and the plateau is one three engines keep up with under prefix-hash routing, "
                        "which spreads unevenly (up to 10 apart before it balances, --prefix-hash-balance-abs-threshold"
                        "): even with all of it on one engine, 14 waiting keep KEDA's waiting query at 4 pods. With 20, "
                        "samples of 4 running and 16 waiting asked for 5 pods (maxReplicas + count) all plateau long, "
                        "and the second step's wake then had no room for a replacement")
    p.add_argument("--clients-step2", type=int, default=24,
                   help="clients of the second step: three awake engines queue 18 or more past their 6 running (the "
                        "actuator wakes past 15), and four engines carry it (4 x (max-num-seqs + target-waiting) = "
                        "28) with room for the routing's unevenness, so the woken sleeper's replacement sleeps")
    p.add_argument("--step2-seconds", type=float, default=12.0)
    p.add_argument("--skip-first", action="store_true", help="run the sustained phase only")
    p.add_argument("--actuator-log", default="", help="write the sustained phase's actuator lines (JSON) here")
    a = p.parse_args(argv)
    print(f"engines: fake vLLM in dev mode, {a.weights_gib:g} GiB of weights, wake modelled at "
          f"{a.wake_s_per_gib * 64:.1f} s per 64 GiB = {a.weights_gib * a.wake_s_per_gib:.2f} s; "
          f"{a.max_num_seqs} running at once, {a.decode_ms:g} ms each")
    with tempfile.TemporaryDirectory(prefix="scaleout-") as d:
        if a.skip_first:
            s, w, failed, n, held, dropped, sent = float("nan"), float("nan"), 0, 0, 0, 0, 0
        else:
            s, w, failed, n = load_step(a, Path(d))
            held, dropped, sent = from_zero(a, Path(d))
        sus = sustained(a, Path(d))
    print(f"warmstart's share (S - W): {s - w:.2f} s (bound 3 s); from zero: {sent} sent; second step's share "
          f"(S2 - W2): {sus['s2'] - sus['w2']:.2f} s (bound 3 s); sustained: failed {sus['failed']} of {sus['n']}")
    print(f"scale-out: woken serves {s:.1f} s after the load step (wake modelled {w:.1f} s); failed {failed} of {n}; "
          f"from zero: held {held}, dropped {dropped}; second step: woken serves {sus['s2']:.1f} s after it "
          f"(wake modelled {sus['w2']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
