"""The standby actuator in pool mode (issue 38): one actuator per standby pool, for every model that
opted into the pool's spare engine hosts (`python3 standby.pyz --pool-spec /etc/warmstart/pool/pool.json`).

A pool keeps `spares` engine hosts at rest: pods that run, in one container on the pool's GPU set,
one vLLM engine per member, all asleep (warmstart/podside/engine_host). Every `--period` seconds it
reads:

- the hosts: pods of `hostSelector`, and each one's `GET http://<pod>:<supervisorPort>/engines`
  (engine_host/server.py; a host that does not answer is left out of that tick);
- each member's own engines (pods of its `selector`, on its member port) as the per-model actuator
  reads them (observe.py `probe`), its pooled engine through the host's
  `/engines/<model>/{health,is_sleeping,metrics}`, and its front queue's held count.

Then `pool_decide.decide_pool` (pure) says which member rises onto which spare host, which pooled
engine sleeps, each member's figure and the hosts the pool keeps, and this module acts, through the
per-model actuator's own acts (act.py: one wake path, one drain, one sleep, one `warmstart.wake`
record of `kind: wake`) with the engine's base URL `http://<host>:<port>/engines/<model>`:

- a **wake**: `wake_up` (plus the level-2 reload), the warm-up token, then the host pod labelled
  `warmstart.io/serves=<model>`, `warmstart.io/engine=awake` (the member's routers select on
  both: its first token already served, it joins them); the host Deployment's replicas are raised
  to `desired_hosts` in the same tick, so the replacement spare starts at once;
- a **sleep**: the labels set back (`engine=asleep`, `serves` removed), one discovery pass of the
  routers (`--unlist-seconds`), nothing running or waiting, then `sleep?level=N`; the host is a
  spare again and the Deployment is lowered to `desired_hosts`. Before a lowering every host's
  `controller.kubernetes.io/pod-deletion-cost` is set (engine_host/pool.py `deletion_costs`: a spare
  first, the replacement still starting last).

`GET /warmstart/pods/<model>` on `--figure-port` (9400 in the pod) answers each member's figure,
`{"pods": N, ...}`, which its ScaledObject's metrics-api trigger reads; 503 until a tick has read
the pool, or when the last reading is older than `--figure-max-age`.

The Role this needs: pods list/watch/get/patch in the namespace, and `deployments/scale`
get/patch/update of the host Deployment alone (its resourceNames). Without a cluster (tests,
benchmarks) `--static FILE` names the hosts, the members' engines and front queues (re-read every
tick, so a stand-in ReplicaSet may add hosts), `--labels-file` receives the host pods' labels and
`--scale-file` stands in for the host Deployment's scale subresource.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..common.kube import InCluster
from ..engine_host.pool import HostView, parse_snapshot
from .act import drain, put_to_sleep, restore, wake
from .loop import serve_json, turn
from .observe import (
    ASLEEP, AWAKE, ENGINE_LABEL, READ_ERRORS, Engine, Kubernetes, held_requests, json_object, log, parse_metrics, probe,
)
from .observe import http as call
from .pool_decide import MemberView, Memory, decide_pool
from .pool_spec import Member, PoolSpec, PoolSpecError, load, selector_text

# The label a host pod carries while one member's engine on it is awake and routed (POOL.md,
# "Routing"): the member's routers select `{warmstart.io/serves: <model>, warmstart.io/engine: awake}`.
SERVES_LABEL = "warmstart.io/serves"
FIGURE_PREFIX = "/warmstart/pods/"


class PoolKubernetes:
    """The pool's pods and its host Deployment's scale, through the per-model actuator's client
    (observe.py `Kubernetes`: the same pod list, patches and scale subresource)."""

    labels = True
    """Relabelling a host takes its engine out of the routers' discovery."""

    def __init__(self, spec: PoolSpec, api: InCluster | None = None) -> None:
        self.spec = spec
        self.k = Kubernetes(spec.namespace, selector="", port=spec.supervisor_port, api=api)

    def _running(self, selector: str) -> list[tuple[str, str]]:
        return self.k.running(selector)

    def hosts(self) -> list[tuple[str, str]]:
        """(pod, supervisor URL) of every running host."""
        return [(n, f"http://{ip}:{self.spec.supervisor_port}") for n, ip in self._running(selector_text(self.spec.host_selector))]

    def member_engines(self, m: Member) -> list[tuple[str, str]]:
        return [(n, f"http://{ip}:{m.port}") for n, ip in self._running(selector_text(m.selector))]

    def front_queues(self, m: Member) -> list[str]:
        fq = m.front_queue
        if fq is None:
            return []
        if fq.selector:
            return [f"http://{ip}:{fq.port}" for _, ip in self._running(selector_text(fq.selector))]
        return [f"http://{fq.service}.{self.spec.namespace}.svc:{fq.port}"]

    def set_cost(self, pod: str, cost: str) -> None:
        self.k.set_cost(pod, cost)

    def set_host_labels(self, pod: str, model: str | None) -> None:
        # A JSON merge patch removes a key given as null (RFC 7386), so `serves` goes with the asleep label.
        self.k.patch(pod, {"metadata": {"labels": {SERVES_LABEL: model, ENGINE_LABEL: AWAKE if model else ASLEEP}}})

    def set_replicas(self, want: int) -> tuple[int, int] | None:
        """The host Deployment's replicas to `want`, up or down: (before, after), or None when they
        were there (observe.py `Kubernetes.scale`)."""
        return self.k.scale(self.spec.host_deployment, want, lower=True)


def _write_json(path: str, doc: object) -> None:
    tmp = f"{path}.actuator.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, sort_keys=True)
    os.replace(tmp, path)


class PoolStatic:
    """The pool without a cluster (tests, benchmarks). `static_file` is JSON, re-read every tick:
    `{"hosts": {pod: supervisor URL}, "members": {model: {pod: engine URL}}, "frontQueues": {model: [URL]}}`.
    Host labels go to `labels_file` (`{pod: {label: value}}`, replaced whole on every change), the
    host Deployment's replicas to `scale_file` (`{"replicas": n}`)."""

    def __init__(self, static_file: str, labels_file: str = "", scale_file: str = "") -> None:
        self.static_file, self.labels_file, self.scale_file = static_file, labels_file, scale_file
        self.labels = bool(labels_file)
        self._labels: dict[str, dict[str, str]] = {}
        self._doc: dict = {}

    def _read(self) -> dict:
        with open(self.static_file) as f:
            doc = json.load(f)
        if not isinstance(doc, dict):
            raise ValueError(f"{self.static_file}: not a JSON object")
        self._doc = doc
        return doc

    def hosts(self) -> list[tuple[str, str]]:
        return sorted((str(k), str(v)) for k, v in (self._read().get("hosts") or {}).items())

    def member_engines(self, m: Member) -> list[tuple[str, str]]:
        return sorted((str(k), str(v)) for k, v in ((self._doc.get("members") or {}).get(m.model) or {}).items())

    def front_queues(self, m: Member) -> list[str]:
        return [str(u) for u in (self._doc.get("frontQueues") or {}).get(m.model) or []]

    def set_cost(self, pod: str, cost: str) -> None:
        pass

    def set_host_labels(self, pod: str, model: str | None) -> None:
        if not self.labels_file:
            return
        self._labels[pod] = {ENGINE_LABEL: AWAKE, SERVES_LABEL: model} if model else {ENGINE_LABEL: ASLEEP}
        _write_json(self.labels_file, self._labels)

    def set_replicas(self, want: int) -> tuple[int, int] | None:
        if not self.scale_file:
            return None
        with open(self.scale_file) as f:
            have = int(json.load(f)["replicas"])
        if have == want:
            return None
        _write_json(self.scale_file, {"replicas": want})
        return have, want


class HostLabels:
    """One host's routing labels for one member, in the shape act.py's drain and restore write them
    (`set_label(pod, awake|asleep)`): awake also names the member the host serves."""

    def __init__(self, source: "PoolKubernetes | PoolStatic", model: str, written: dict[str, str | None]) -> None:
        self.source, self.model, self.written = source, model, written
        self.labels = source.labels

    def set_label(self, pod: str, value: str) -> None:
        model = self.model if value == AWAKE else None
        self.source.set_host_labels(pod, model)
        self.written[pod] = model


@dataclass
class PoolState:
    memory: Memory = field(default_factory=Memory)
    waking: dict[str, str] = field(default_factory=dict)
    draining: dict[str, tuple[str, threading.Event]] = field(default_factory=dict)
    own: dict[str, Engine] = field(default_factory=dict)
    """(member's own engines by URL)"""
    pooled: dict[tuple[str, str], Engine] = field(default_factory=dict)
    """(host, model) -> the pooled engine's Engine (its base URL the host's `/engines/<model>`)."""
    labels: dict[str, str | None] = field(default_factory=dict)
    """host -> the member its labels were last written to serve (None: asleep)."""
    costs: dict[str, str] = field(default_factory=dict)
    replicas: int | None = None
    """The host Deployment's replicas as last written (None: not yet this run)."""
    cold: set[str] = field(default_factory=set)
    """Members whose rise found no spare on the last tick."""
    unread: int = 0
    """Running hosts whose `/engines` this tick could not read."""
    figures: dict[str, dict] | None = None
    figures_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def serve_figures(state: PoolState, address: str, port: int, max_age: float) -> http.server.ThreadingHTTPServer:
    """`GET /warmstart/pods/<model>` -> that member's figure; 404 for anything else, 503 before the
    first reading or past `max_age`. Nothing served acts on anything."""

    def answer(path: str) -> tuple[int, dict]:
        model = path[len(FIGURE_PREFIX):] if path.startswith(FIGURE_PREFIX) else ""
        with state.lock:
            figures = dict(state.figures) if state.figures is not None else None
            age = time.monotonic() - state.figures_at
        if figures is None:
            return (503, {"error": "the pool has not been read yet"}) if model else (404, {"error": "not found"})
        if model not in figures:
            return 404, {"error": "not found"}
        if age > max_age:
            return 503, {"error": "the pool has not been read lately"}
        return 200, figures[model]

    return serve_json(address, port, answer)


def read_host(name: str, url: str, timeout: float) -> HostView | None:
    try:
        code, body = call("GET", url + "/engines", timeout=timeout)
        doc = json_object(body) if code == 200 else None
    except READ_ERRORS as exc:
        log("warmstart.pool_host_unreadable", pod=name, url=url, reason=f"{type(exc).__name__}: {exc}"[:200])
        return None
    view = parse_snapshot(name, url, doc)
    if view is None:
        log("warmstart.pool_host_unreadable", pod=name, url=url, reason=f"GET /engines answered HTTP {code}, not its status")
    return view


def probe_own(e: Engine, model: str, timeout: float) -> str | None:
    """A member's own engine: `/health`, then its gauges. A pooled member's own pods are never put to
    sleep (no per-model actuator runs for it) and need not run vLLM's dev mode, whose
    `/is_sleeping` a plain vLLM answers 404 (vllm/entrypoints/serve/dev/sleep/api_router.py is
    mounted only in dev mode, VLLM_SERVER_DEV_MODE=1): an engine that answers is awake."""
    try:
        up = call("GET", e.url + "/health", timeout=timeout)[0] == 200
    except READ_ERRORS:
        up = False
    if not up:
        e.ready = False
        return None
    try:
        code, body = call("GET", e.url + "/metrics", timeout=timeout)
    except READ_ERRORS as exc:
        return f"{type(exc).__name__}: {exc}"[:200]
    if code != 200:
        return f"/metrics answered HTTP {code}"
    e.waiting, e.running = parse_metrics(body.decode(errors="replace"), model)
    e.ready, e.sleeping = True, False
    return None


def observe(args: argparse.Namespace, spec: PoolSpec, source: "PoolKubernetes | PoolStatic", state: PoolState,
            pool: ThreadPoolExecutor) -> tuple[list[HostView], dict[str, MemberView]] | None:
    try:
        found = source.hosts()
        members = {m.model: source.member_engines(m) for m in spec.members}
    except (OSError, ValueError) as exc:
        log("warmstart.standby_discovery_failed", error=str(exc)[:300])
        return None
    read = list(pool.map(lambda nu: read_host(nu[0], nu[1].rstrip("/"), args.probe_timeout), found))
    hosts = [h for h in read if h]
    state.unread = len(read) - len(hosts)
    for url in set(state.own) - {u for ms in members.values() for _, u in ms}:
        del state.own[url]
    views: dict[str, MemberView] = {}
    jobs: list[tuple[Engine, str]] = []
    with state.lock:
        waking = dict(state.waking)
    for m in spec.members:
        own = [state.own.setdefault(u, Engine(u, pod, idle_since=time.time())) for pod, u in members[m.model]]
        views[m.model] = MemberView(own=own)
        jobs += [(e, m.model) for e in own]
        for h in hosts:
            if h.serving == m.model or waking.get(h.name) == m.model:
                e = state.pooled.setdefault((h.name, m.model), Engine(f"{h.url}/engines/{m.model}", h.name))
                views[m.model].pooled[h.name] = e
                jobs.append((e, m.model))
    hosts_by_name = {h.name for h in hosts}
    live = {(h, model) for model, v in views.items() for h in v.pooled}
    for key in set(state.pooled) - live:
        del state.pooled[key]
    reasons = list(pool.map(lambda j: (probe(j[0], j[1], args.probe_timeout) if j[0].pod in hosts_by_name
                                       else probe_own(j[0], j[1], args.probe_timeout)), jobs))
    for (e, model), why in zip(jobs, reasons):
        if why:
            log("warmstart.standby_unreadable", model=model, pod=e.pod, url=e.url, reason=why)
            # Unreadable this tick: not counted (the per-model actuator leaves such an engine alone too).
            views[model].own = [x for x in views[model].own if x is not e]
            views[model].pooled = {h: x for h, x in views[model].pooled.items() if x is not e}
    for m in spec.members:
        try:
            queues = source.front_queues(m)
        except (OSError, ValueError) as exc:
            log("warmstart.standby_discovery_failed", model=m.model, error=str(exc)[:300])
            queues = []
        for u in queues:
            count, why = held_requests(u, args.probe_timeout)
            if why:
                log("warmstart.standby_unreadable", model=m.model, url=u, reason=why)
            views[m.model].held += count
    return hosts, views


def set_replicas(source: "PoolKubernetes | PoolStatic", state: PoolState, want: int) -> None:
    try:
        done = source.set_replicas(want)
    except (OSError, ValueError) as exc:
        log("warmstart.standby_scale_failed", deployment="hosts", error=str(exc)[:300])
        return
    state.replicas = want
    if done:
        log("warmstart.pool_hosts", replicas_before=done[0], replicas=done[1])


def tick(args: argparse.Namespace, spec: PoolSpec, source: "PoolKubernetes | PoolStatic", state: PoolState,
         pool: ThreadPoolExecutor) -> None:
    seen = observe(args, spec, source, state, pool)
    if seen is None:
        return
    hosts, views = seen
    now = time.monotonic()
    with state.lock:
        waking = dict(state.waking)
        draining = {h: model for h, (model, _) in state.draining.items()}
        actions = decide_pool(spec, hosts, views, state.memory, now, waking, draining, args.wake_hold_seconds)
        state.figures, state.figures_at = actions.figures, time.monotonic()
        for h in actions.cancel:
            state.draining[h][1].set()
    busy = set(waking) | set(draining) | {w.host for w in actions.wakes}
    # Costs first: a lowering of the Deployment must find them in place.
    for h, cost in actions.costs.items():
        if state.costs.get(h) != cost:
            try:
                source.set_cost(h, cost)
                state.costs[h] = cost
            except (OSError, ValueError) as exc:
                log("warmstart.standby_cost_failed", pod=h, error=str(exc)[:300])
    # Labels put right on hosts no wake or drain owns: an engine awake that this actuator did not
    # label (its warm-up failed, or the actuator restarted mid-wake) is routed, a spare is not.
    for h in hosts:
        if h.name in busy:
            continue
        want = h.serving
        if state.labels.get(h.name, "unknown") != want:
            try:
                source.set_host_labels(h.name, want)
                state.labels[h.name] = want
            except (OSError, ValueError) as exc:
                log("warmstart.standby_label_failed", pod=h.name, error=str(exc)[:300])
    for h in set(state.costs) - {h.name for h in hosts}:
        state.costs.pop(h, None)
        state.labels.pop(h, None)
    if actions.hosts != state.replicas:
        if state.replicas is not None and actions.hosts < state.replicas and state.unread:
            # A host that did not answer may be one that serves: no lowering on a partial reading
            # (the ReplicaSet would remove a spare, and the next tick raise another).
            pass
        else:
            # A raise is the replacement spare: written before the wakes start, so it starts now.
            set_replicas(source, state, actions.hosts)
    for model in sorted(set(actions.cold) - state.cold):
        # Once per rise, not every tick it stands.
        log("warmstart.pool_cold", model=model, reason="no spare host", figure=actions.figures[model]["pods"])
    state.cold = set(actions.cold)
    for w in actions.wakes:
        start_wake(args, spec, source, state, pool, w.host, w.model, w.engine_url, actions.rise_at.get(w.model, now))
    for h, model in actions.sleeps:
        start_sleep(args, spec, source, state, pool, h, model)


def start_wake(args: argparse.Namespace, spec: PoolSpec, source: "PoolKubernetes | PoolStatic", state: PoolState,
               pool: ThreadPoolExecutor, host: str, model: str, url: str, signal_at: float) -> None:
    e = state.pooled.setdefault((host, model), Engine(url, host))
    e.sleeping = True
    with state.lock:
        state.waking[host] = model
    log("warmstart.pool_wake", model=model, host=host)

    def run() -> None:
        try:
            if wake(e, model, spec.sleep_level, signal_at, args.wake_timeout):
                restore(e, HostLabels(source, model, state.labels))
        finally:
            with state.lock:
                state.waking.pop(host, None)
    pool.submit(run)


def start_sleep(args: argparse.Namespace, spec: PoolSpec, source: "PoolKubernetes | PoolStatic", state: PoolState,
                pool: ThreadPoolExecutor, host: str, model: str) -> None:
    e = state.pooled.get((host, model))
    if e is None:
        return
    cancel = threading.Event()
    with state.lock:
        state.draining[host] = (model, cancel)
    labels = HostLabels(source, model, state.labels)

    def run() -> None:
        try:
            if drain(e, labels, [], args.unlist_seconds, args.drain_timeout, model, args.probe_timeout, cancel):
                if put_to_sleep(e, spec.sleep_level, args.wake_timeout):
                    e.sleeping = True
                else:
                    restore(e, labels)
        finally:
            with state.lock:
                state.draining.pop(host, None)
    pool.submit(run)


def run(args: argparse.Namespace, spec: PoolSpec, stop: threading.Event | None = None,
        source: "PoolKubernetes | PoolStatic | None" = None) -> None:
    source = source or (PoolStatic(args.static, args.labels_file, args.scale_file) if args.static
                        else PoolKubernetes(spec))
    state = PoolState()
    pool = ThreadPoolExecutor(max_workers=16)
    stop = stop or threading.Event()
    server = serve_figures(state, args.figure_address, args.figure_port, args.figure_max_age) if args.figure_port >= 0 else None
    log("warmstart.pool_start", pool=spec.pool, members=[m.model for m in spec.members], spares=spec.spares,
        max_hosts=spec.max_hosts, level=spec.sleep_level, period_s=args.period,
        figure_port=server.server_address[1] if server else None)
    turn(args, stop, lambda _started: tick(args, spec, source, state, pool))
    pool.shutdown(wait=True)
    if server is not None:
        server.shutdown()
        server.server_close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="standby --pool-spec", description=__doc__.splitlines()[0])
    p.add_argument("--pool-spec", required=True, help="the pool's pool.json (its ConfigMap)")
    p.add_argument("--static", default="", help="a JSON file naming hosts, member engines and front queues "
                   "instead of the Kubernetes API (tests, benchmarks)")
    p.add_argument("--labels-file", default="", help="with --static: where the host pods' labels are written")
    p.add_argument("--scale-file", default="", help="with --static: a JSON {\"replicas\": n} standing in for the "
                   "host Deployment's scale subresource")
    p.add_argument("--period", type=float, default=1.0)
    p.add_argument("--probe-timeout", type=float, default=0.5)
    p.add_argument("--wake-timeout", type=float, default=300.0)
    p.add_argument("--unlist-seconds", type=float, default=3.0,
                   help="wait after relabelling a host asleep: SMG reconciles 1 s after a pod watch event "
                   "(smg service_discovery/kubernetes.rs), plus the watch's delivery")
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--wake-hold-seconds", type=float, default=60.0,
                   help="how long a cold rise's figure holds the pod it asked for")
    p.add_argument("--figure-port", type=int, default=-1, help="serve GET /warmstart/pods/<model> here "
                   "(0: any free one; -1: off)")
    p.add_argument("--figure-address", default="0.0.0.0")
    p.add_argument("--figure-max-age", type=float, default=30.0)
    p.add_argument("--heartbeat", default="", help="file rewritten every period (the liveness probe reads it)")
    p.add_argument("--max-ticks", type=int, default=None, help="stop after this many periods (tests)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        spec = load(args.pool_spec)
    except PoolSpecError as exc:
        print(f"standby: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        run(args, spec)
    except KeyboardInterrupt:
        pass
    return 0
