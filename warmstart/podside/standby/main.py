"""Standby actuator: wakes a sleeping vLLM engine on load, puts the idlest back to sleep (stdlib only).

One pod per model with `standby:` runs this script (shipped as a ConfigMap, run by the model's
own vLLM image, so no image to pull or pin). Every `--period` seconds (1 s: a signal in seconds,
not the 30 s of a managed scrape) it reads each engine of the model in the cluster:

- `GET /health`: an engine that does not answer is still loading (vLLM binds its port only once
  the engine is up) or dead, and is never touched;
- `GET /is_sleeping` (vLLM dev mode, `vllm/entrypoints/serve/dev/sleep/api_router.py` at v0.33.0);
- `GET /metrics`: `vllm:num_requests_waiting` and `vllm:num_requests_running`
  (https://docs.vllm.ai/en/latest/usage/metrics/).

Then (`decide`, pure):

- **wake** as many sleepers as the awake engines' queue asks for: more than `--target-waiting`
  requests waiting per awake engine, or fewer awake engines than `--min-awake`. A wake is
  `POST /wake_up`, at sleep level 2 also `POST /collective_rpc {"method": "reload_weights"}` and
  `POST /reset_prefix_cache` (vLLM `docs/features/sleep_mode.md`), then a one-token completion;
  only then is its pod labelled `warmstart.io/engine=awake` again, so it rejoins the routers with
  its first token already served, at the same address, so on the same arcs of the prefix-hash
  ring;
- **sleep** one awake engine when fewer than `--standby` engines sleep and more than
  `--min-awake` are awake: the idlest, nothing running or waiting, idle for
  `--awake-idle-seconds` once it has served (a freshly loaded engine that never served sleeps at
  once). A sleeping engine must never receive a request. Its pod stays Ready (vLLM's /health
  answers while it sleeps, and a Deployment whose sleepers were unready would never complete:
  warmstart/manifests/serving.py `readiness_probe`), so the routing label is what keeps it out:
  the actuator first takes it out of the router (`drain`): it labels the pod
  `warmstart.io/engine=asleep`, which the routers'
  worker selector requires to be `awake` (SMG drops a pod that stops matching its selector:
  `compute_desired_state` in smg `model_gateway/src/service_discovery/kubernetes.rs`); waits
  until no `--router` lists the engine in `GET /workers`, or `--unlist-seconds` (one discovery
  pass of SMG's) without one; waits until the engine runs and queues nothing; only then
  `POST /sleep?level=N&mode=wait`. A drain that does not finish within `--drain-timeout`, or that
  a rising queue cancels, relabels the pod `awake` and sleeps nothing this round. A wake labels
  the pod `awake` once its warm-up token is served.

On Kubernetes it also sets each pod's `controller.kubernetes.io/pod-deletion-cost`
(https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/#pod-deletion-cost): a
scale-down by KEDA deletes among the Ready pods the lower cost first, so a sleeper (-100) before an
awake engine (0); the actuator then puts the idlest awake engine to sleep to keep `--standby`
sleepers. A ReplicaSet deletes a pod that is not Ready (still loading) before any Ready one,
whatever its cost (`ActivePodsWithRanks` in kubernetes pkg/controller/controller_utils.go): what
keeps a pod that a scale-up started from being scaled down while it loads is the ScaledObject's
scale-down stabilization window, at least the model's start-up budget
(warmstart/decisions/autoscaling.py), within which the startup probe has either seen it load or
restarted it. The cost 100 written on a loading pod ranks it last among the not-Ready ones.

Each wake is one JSON line on stdout (`warmstart.wake`: signal, wake and first-token seconds),
each sleep `warmstart.sleep`. Engines come from the Kubernetes API (pods of `--selector` in the
namespace; the ServiceAccount may list and patch pods there, nothing else) or from
`--engines URL,...` (tests, benchmarks).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..common.shared import emit_line

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# The label the routers' worker selector requires to be AWAKE (warmstart/manifests/serving.py puts
# it on every serving pod's template; the Deployment's, the Service's and the PDB's selectors
# leave it out, so relabelling a pod never orphans it nor takes it out of its budget).
ENGINE_LABEL = "warmstart.io/engine"
AWAKE, ASLEEP = "awake", "asleep"
COST = {"sleeping": "-100", "loading": "100", "awake": "0"}
_SAMPLE = re.compile(r'^(vllm:num_requests_(?:waiting|running))(\{[^}]*\})?\s+([0-9.eE+-]+|NaN)\s*$')


def log(event: str, **fields: object) -> None:
    emit_line({"event": event, "time": round(time.time(), 3), **fields}, sort_keys=True)


# --------------------------------------------------------------------------------------
# What one engine says


@dataclass
class Engine:
    url: str
    pod: str = ""
    ready: bool = False
    """/health answered: loaded (else loading or dead: never touched)."""
    sleeping: bool = False
    waiting: float = 0.0
    running: float = 0.0
    served: bool = False
    """Seen with a request running or waiting since it last woke."""
    idle_since: float = 0.0
    cost: str | None = None
    """The deletion cost last written to its pod."""
    label: str | None = None
    """The ENGINE_LABEL value last written to its pod."""


def parse_metrics(text: str, model: str | None = None) -> tuple[float, float]:
    """(waiting, running) summed over `text`'s samples (of `model_name=model` when given)."""
    out = {"vllm:num_requests_waiting": 0.0, "vllm:num_requests_running": 0.0}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or m[3] == "NaN":
            continue
        if model is not None and m[2] and f'model_name="{model}"' not in m[2]:
            continue
        out[m[1]] += float(m[3])
    return out["vllm:num_requests_waiting"], out["vllm:num_requests_running"]


# Most bytes read of one answer: an engine's /metrics is tens of KiB, a pod list of a namespace a
# few MiB at most; a peer that sends more is cut there (the read then fails to parse: a tick's
# error, never the actuator's memory).
MAX_READ_BYTES = 16 << 20


def http(method: str, url: str, body: object = None, timeout: float = 2.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(MAX_READ_BYTES)
    except urllib.error.HTTPError as e:
        return e.code, e.read(MAX_READ_BYTES)


def probe(e: Engine, model: str | None, timeout: float) -> None:
    """Read one engine's state into `e` (loading when /health does not answer 200)."""
    try:
        ok = http("GET", e.url + "/health", timeout=timeout)[0] == 200
        if ok:
            code, body = http("GET", e.url + "/is_sleeping", timeout=timeout)
            sleeping = code != 200 or bool(json.loads(body or b"{}").get("is_sleeping", True))
            code, body = http("GET", e.url + "/metrics", timeout=timeout)
            waiting, running = parse_metrics(body.decode(errors="replace"), model) if code == 200 else (0.0, 0.0)
    except (OSError, ValueError):
        ok = False
    if not ok:
        e.ready = False
        return
    e.ready, e.sleeping, e.waiting, e.running = True, sleeping, waiting, running


# --------------------------------------------------------------------------------------
# The decision (pure)


@dataclass(frozen=True)
class Policy:
    standby: int
    min_awake: int
    target_waiting: float
    awake_idle_seconds: float


@dataclass
class Actions:
    wake: list[str] = field(default_factory=list)
    sleep: list[str] = field(default_factory=list)


def decide(engines: list[Engine], policy: Policy, now: float, waking: set[str] = frozenset(),
           held: int = 0, draining: set[str] = frozenset()) -> Actions:
    """What to do this tick. `waking`: engines whose wake is in flight (they count as awake);
    `held`: requests a front queue holds for want of an awake engine (they count as waiting);
    `draining`: engines being taken out of the router to sleep (neither awake nor a sleeper to
    wake: the router no longer sends to them)."""
    awake = [e for e in engines if e.ready and e.url not in draining and (not e.sleeping or e.url in waking)]
    asleep = [e for e in engines if e.ready and e.sleeping and e.url not in waking and e.url not in draining]
    waiting = sum(e.waiting for e in awake) + held
    out = Actions()
    # Sleepers to wake: enough that the queue is within the target per awake engine.
    need = max(0, policy.min_awake - len(awake))
    if waiting > policy.target_waiting * len(awake):
        # KEDA's own rule for an AverageValue target: ceil(waiting / target) engines.
        need = max(need, math.ceil(waiting / policy.target_waiting) - len(awake), 1)
    # A sleeper with requests queued: vLLM 0.33 queues what reaches a paused engine ("All pause
    # modes queue new adds", vllm/v1/engine/core.py) instead of refusing it, and a request can
    # reach one in the second before its readiness turns false; wake it first, so no request
    # waits longer than a wake.
    queued = [e for e in asleep if e.waiting or e.running]
    need = max(need, len(queued))
    if need and asleep:
        out.wake = [e.url for e in sorted(asleep, key=lambda e: (not (e.waiting or e.running), e.url))[:need]]
        return out
    if waking or draining or len(asleep) >= policy.standby or len(awake) <= policy.min_awake:
        return out

    def idle_for(e: Engine) -> float:
        return now - e.idle_since

    idle = [e for e in awake if e.waiting == 0 and e.running == 0 and e.url not in waking
            and (not e.served or idle_for(e) >= policy.awake_idle_seconds)]
    if idle and waiting <= policy.target_waiting * (len(awake) - 1):
        out.sleep = [max(idle, key=lambda e: (not e.served, idle_for(e), e.url)).url]
    return out


# --------------------------------------------------------------------------------------
# Acting


def wake(e: Engine, model: str, level: int, signal_at: float, timeout: float) -> bool:
    """Wake `e` and serve one token; log the phases. False when a step failed."""
    t0 = time.monotonic()
    steps = [("POST", "/wake_up", None)]
    if level == 2:
        # Level 2 dropped the weights: reload them, and drop the prefix cache they no longer match
        # (vLLM docs/features/sleep_mode.md, "Level 2").
        steps += [("POST", "/collective_rpc", {"method": "reload_weights"}), ("POST", "/reset_prefix_cache", None)]
    try:
        for method, path, body in steps:
            code, text = http(method, e.url + path, body, timeout=timeout)
            if code != 200:
                log("warmstart.wake_failed", pod=e.pod, url=e.url, step=path, status=code, body=text[:200].decode(errors="replace"))
                return False
        t1 = time.monotonic()
        code, text = http("POST", e.url + "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 1},
                          timeout=timeout)
        t2 = time.monotonic()
    except OSError as exc:
        log("warmstart.wake_failed", pod=e.pod, url=e.url, error=str(exc))
        return False
    # The record shape `warmstart coldstart --history` reads (warmstart/coldstart/history.py): a
    # wake is its own kind of start, with its own phases.
    phases = {"signal": round(t0 - signal_at, 3), "wake": round(t1 - t0, 3), "first_token": round(t2 - t1, 3)}
    log("warmstart.wake", kind="wake", model=model, pod=e.pod, url=e.url, level=level, phases=phases,
        flags={"sleep_level": level}, signal_s=phases["signal"], wake_s=phases["wake"],
        first_token_s=phases["first_token"], warmup_status=code)
    e.sleeping, e.served, e.idle_since = False, False, time.time()
    return code == 200


def listed(routers: list[str], e: Engine, timeout: float) -> bool | None:
    """Whether any router lists `e` among its workers (SMG `GET /workers`); None when none answered."""
    want = e.url.split("://", 1)[-1].rstrip("/")
    answered = False
    for r in routers:
        try:
            code, body = http("GET", r.rstrip("/") + "/workers", timeout=timeout)
            if code != 200:
                continue
            got = json.loads(body)
        except (OSError, ValueError):
            continue
        answered = True
        workers = got.get("workers", []) if isinstance(got, dict) else got
        if any(str(w.get("url", "")).split("://", 1)[-1].rstrip("/") == want for w in workers if isinstance(w, dict)):
            return True
    return False if answered else None


def drain(e: Engine, source: "Static | Kubernetes", routers: list[str], unlist_seconds: float, timeout: float,
          model: str | None, probe_timeout: float, cancel: threading.Event) -> bool:
    """Take `e` out of the routers and wait until it has nothing in flight, within `timeout`.
    True: it may sleep now. False: the pod is relabelled awake (it keeps serving)."""
    deadline = time.monotonic() + timeout
    reason = ""
    try:
        source.set_label(e.pod, ASLEEP)
        e.label = ASLEEP
    except (OSError, ValueError) as exc:
        log("warmstart.sleep_skipped", pod=e.pod, url=e.url, reason="label", error=str(exc))
        return False
    # 1. Out of the routers: none lists it any more, or one discovery pass of theirs has passed.
    if routers:
        while True:
            if cancel.is_set():
                reason = "cancelled"
                break
            if listed(routers, e, probe_timeout) is False:
                break
            if time.monotonic() >= deadline:
                reason = "still routed"
                break
            cancel.wait(0.1)
    elif source.labels:
        cancel.wait(min(unlist_seconds, max(0.0, deadline - time.monotonic())))
    # 2. Nothing running or queued on it (vllm:num_requests_running/_waiting on its /metrics).
    while not reason:
        if cancel.is_set():
            reason = "cancelled"
            break
        try:
            code, body = http("GET", e.url + "/metrics", timeout=probe_timeout)
            waiting, running = parse_metrics(body.decode(errors="replace"), model) if code == 200 else (1.0, 1.0)
        except (OSError, ValueError):
            waiting, running = 1.0, 1.0
        if waiting == 0 and running == 0:
            return True
        if time.monotonic() >= deadline:
            reason = "requests in flight"
            break
        cancel.wait(0.1)
    log("warmstart.sleep_skipped", pod=e.pod, url=e.url, reason=reason, drain_timeout_s=timeout)
    restore(e, source)
    return False


def restore(e: Engine, source: "Static | Kubernetes") -> None:
    try:
        source.set_label(e.pod, AWAKE)
        e.label = AWAKE
    except (OSError, ValueError) as exc:
        # The next tick's label reconcile retries it.
        e.label = None
        log("warmstart.standby_label_failed", pod=e.pod, error=str(exc))


def put_to_sleep(e: Engine, level: int, timeout: float) -> bool:
    try:
        code, _ = http("POST", f"{e.url}/sleep?level={level}&mode=wait", timeout=timeout)
    except OSError as exc:
        log("warmstart.sleep_failed", pod=e.pod, url=e.url, error=str(exc))
        return False
    log("warmstart.sleep", pod=e.pod, url=e.url, level=level, status=code)
    return code == 200


# --------------------------------------------------------------------------------------
# Where the engines are


class Kubernetes:
    """The pods of one selector in one namespace, through the in-cluster API."""

    def __init__(self, namespace: str, selector: str, port: int) -> None:
        host, api_port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        self.base = f"https://{host}:{api_port}/api/v1/namespaces/{namespace}/pods"
        self.selector, self.port = selector, port
        self.ctx = ssl.create_default_context(cafile=f"{SA_DIR}/ca.crt")

    def _call(self, method: str, url: str, body: object = None, ctype: str = "application/json") -> dict:
        # The bound token is rotated by the kubelet: read it on every call.
        with open(f"{SA_DIR}/token") as f:
            token = f.read().strip()
        req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": ctype})
        with urllib.request.urlopen(req, timeout=5, context=self.ctx) as r:
            return json.loads(r.read(MAX_READ_BYTES))

    def engines(self) -> list[tuple[str, str]]:
        """(pod name, engine URL) of every running pod not being deleted."""
        q = urllib.parse.urlencode({"labelSelector": self.selector, "fieldSelector": "status.phase=Running"})
        pods = self._call("GET", f"{self.base}?{q}").get("items", [])
        return sorted((p["metadata"]["name"], f"http://{p['status']['podIP']}:{self.port}") for p in pods
                      if p.get("status", {}).get("podIP") and not p["metadata"].get("deletionTimestamp"))

    def front_queues(self, selector: str, port: int) -> list[str]:
        """The front-queue URLs of the router pods `selector` matches."""
        q = urllib.parse.urlencode({"labelSelector": selector, "fieldSelector": "status.phase=Running"})
        pods = self._call("GET", f"{self.base}?{q}").get("items", [])
        return sorted(f"http://{p['status']['podIP']}:{port}" for p in pods if p.get("status", {}).get("podIP"))

    labels = True
    """Relabelling a pod takes it out of the routers' discovery."""

    def set_cost(self, pod: str, cost: str) -> None:
        self._call("PATCH", f"{self.base}/{pod}", {"metadata": {"annotations": {DELETION_COST: cost}}},
                   "application/merge-patch+json")

    def set_label(self, pod: str, value: str) -> None:
        # The same `patch pods` the deletion cost uses; nothing broader.
        self._call("PATCH", f"{self.base}/{pod}", {"metadata": {"labels": {ENGINE_LABEL: value}}},
                   "application/merge-patch+json")


class Static:
    """Engines by URL (tests, benchmarks). With `labels_file`, the routing label of each (its URL
    standing for its pod) is written there as JSON, `{url: "awake" | "asleep"}`, replaced whole
    on every change: what a stand-in for SMG's label-selected pod watch reads."""

    def __init__(self, urls: list[str], labels_file: str = "") -> None:
        self.urls, self.labels_file = urls, labels_file
        self.labels = bool(labels_file)
        self._written: dict[str, str] = {}
        if labels_file and os.path.exists(labels_file):
            with open(labels_file) as f:
                self._written = {str(k): str(v) for k, v in json.load(f).items()}

    def engines(self) -> list[tuple[str, str]]:
        return [(u, u) for u in self.urls]

    def set_cost(self, pod: str, cost: str) -> None:
        pass

    def set_label(self, pod: str, value: str) -> None:
        if not self.labels_file:
            return
        self._written[pod] = value
        tmp = f"{self.labels_file}.tmp"
        with open(tmp, "w") as f:
            json.dump(self._written, f, sort_keys=True)
        os.replace(tmp, self.labels_file)


def held_requests(url: str | None, timeout: float) -> int:
    """Requests a front queue holds (warmstart/podside/front_queue.py, `GET /warmstart/held`); 0
    without one."""
    if not url:
        return 0
    try:
        code, body = http("GET", url.rstrip("/") + "/warmstart/held", timeout=timeout)
        return int(json.loads(body).get("held", 0)) if code == 200 else 0
    except (OSError, ValueError):
        return 0


def run(args: argparse.Namespace, stop: threading.Event | None = None, source: "Static | Kubernetes | None" = None) -> None:
    source = source or (Static([u for u in args.engines.split(",") if u], args.labels_file) if args.engines else
                        Kubernetes(args.namespace, args.selector, args.port))
    routers = [u for u in args.router.split(",") if u]
    policy = Policy(args.standby, args.min_awake, args.target_waiting, args.awake_idle_seconds)
    known: dict[str, Engine] = {}
    waking: set[str] = set()
    draining: dict[str, threading.Event] = {}
    lock = threading.Lock()
    pool = ThreadPoolExecutor(max_workers=16)
    stop = stop or threading.Event()
    ticks = 0
    log("warmstart.standby_start", standby=args.standby, min_awake=args.min_awake, period_s=args.period,
        level=args.sleep_level)
    while not stop.is_set() and (args.max_ticks is None or ticks < args.max_ticks):
        ticks += 1
        started = time.monotonic()
        try:
            found = source.engines()
        except (OSError, ValueError, KeyError) as exc:
            log("warmstart.standby_discovery_failed", error=str(exc))
            stop.wait(args.period)
            continue
        with lock:
            busy = set(waking) | set(draining)
        engines = []
        for pod, url in found:
            e = known.setdefault(url, Engine(url, pod, idle_since=time.time()))
            engines.append(e)
        for url in set(known) - {u for _, u in found}:
            del known[url]
        list(pool.map(lambda e: probe(e, args.model, args.probe_timeout), engines))
        now = time.time()
        for e in engines:
            if e.ready and not e.sleeping and (e.waiting or e.running):
                e.served, e.idle_since = True, now
            state = "loading" if not e.ready else "sleeping" if e.sleeping else "awake"
            if e.cost != COST[state]:
                try:
                    source.set_cost(e.pod, COST[state])
                    e.cost = COST[state]
                except (OSError, ValueError) as exc:
                    log("warmstart.standby_cost_failed", pod=e.pod, error=str(exc))
            # The routing label follows the engine (a wake whose warm-up failed, an actuator
            # restarted mid-drain), except while a wake or a drain of this actuator owns it.
            want = None if not e.ready or e.url in busy else ASLEEP if e.sleeping else AWAKE
            if want and e.label != want:
                try:
                    source.set_label(e.pod, want)
                    e.label = want
                except (OSError, ValueError) as exc:
                    log("warmstart.standby_label_failed", pod=e.pod, error=str(exc))
        with lock:
            busy = set(waking)
            draining_now = set(draining)
        queues = [u for u in args.front_queue.split(",") if u]
        if args.front_queue_selector and isinstance(source, Kubernetes):
            try:
                queues = source.front_queues(args.front_queue_selector, args.front_queue_port)
            except (OSError, ValueError, KeyError) as exc:
                log("warmstart.standby_discovery_failed", error=str(exc))
        held = sum(held_requests(u, args.probe_timeout) for u in queues)
        actions = decide(engines, policy, now, busy, held, draining_now)
        if actions.wake and draining_now:
            # The queue rose during a drain: that engine stays awake (cheaper than a wake).
            with lock:
                for ev in draining.values():
                    ev.set()
        for url in actions.wake:
            e = known[url]
            with lock:
                waking.add(url)

            def _wake(e: Engine = e, at: float = started) -> None:
                try:
                    if wake(e, args.model, args.sleep_level, at, args.wake_timeout):
                        # Back into the routers, with its first token served and Ready.
                        restore(e, source)
                finally:
                    with lock:
                        waking.discard(e.url)
            pool.submit(_wake)
        for url in actions.sleep:
            e = known[url]
            cancel = threading.Event()
            with lock:
                draining[url] = cancel

            def _sleep(e: Engine = e, cancel: threading.Event = cancel) -> None:
                try:
                    if drain(e, source, routers, args.unlist_seconds, args.drain_timeout, args.model,
                             args.probe_timeout, cancel):
                        if put_to_sleep(e, args.sleep_level, args.wake_timeout):
                            e.sleeping = True
                        else:
                            restore(e, source)
                finally:
                    with lock:
                        draining.pop(e.url, None)
            pool.submit(_sleep)
        if args.heartbeat:
            # The liveness probe reads this file's age: a loop that stopped turning is restarted.
            with open(args.heartbeat, "w") as f:
                f.write(f"{time.time():.3f}\n")
        stop.wait(max(0.0, args.period - (time.monotonic() - started)))
    pool.shutdown(wait=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the served model name (vLLM's model_name label)")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    p.add_argument("--selector", default="", help="label selector of the model's vLLM pods")
    p.add_argument("--port", type=int, default=8000, help="vLLM's serving port on each pod")
    p.add_argument("--engines", default="", help="comma-separated engine URLs instead of the Kubernetes API")
    p.add_argument("--labels-file", default="", help="with --engines: where each engine's routing label is "
                   "written (JSON {url: label}), standing in for the pods' labels")
    p.add_argument("--standby", type=int, required=True, help="engines to keep asleep")
    p.add_argument("--min-awake", type=int, required=True, help="fewest awake engines")
    p.add_argument("--sleep-level", type=int, choices=(1, 2), default=1)
    p.add_argument("--target-waiting", type=float, default=5.0, help="requests waiting per awake engine")
    p.add_argument("--awake-idle-seconds", type=float, default=300.0)
    p.add_argument("--period", type=float, default=1.0)
    p.add_argument("--probe-timeout", type=float, default=0.5)
    p.add_argument("--wake-timeout", type=float, default=300.0)
    p.add_argument("--front-queue", default="", help="URLs of front queues whose held requests count as waiting")
    p.add_argument("--front-queue-selector", default="", help="label selector of the router pods with front queues")
    p.add_argument("--front-queue-port", type=int, default=30000)
    p.add_argument("--router", default="", help="router URLs whose GET /workers must stop listing an engine "
                   "before it sleeps (tests, benchmarks; in a cluster --unlist-seconds stands in)")
    p.add_argument("--unlist-seconds", type=float, default=3.0,
                   help="wait after relabelling a pod asleep without --router: SMG reconciles 1 s after a pod "
                   "watch event (smg service_discovery/kubernetes.rs), plus the watch's delivery")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="most seconds to take an engine out of the routers and see it idle; past it, no sleep")
    p.add_argument("--heartbeat", default="", help="file rewritten every period (the liveness probe reads it)")
    p.add_argument("--max-ticks", type=int, default=None, help="stop after this many periods (tests)")
    a = p.parse_args(argv)
    if not a.engines and not a.selector:
        p.error("give --selector (Kubernetes) or --engines")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except KeyboardInterrupt:
        pass
    return 0

