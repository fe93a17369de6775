"""Standby actuator: wakes a sleeping vLLM engine on load, puts the idlest back to sleep (stdlib only).

One pod per model with `standby:` runs this package (shipped as one zip application in a
ConfigMap, run by the model's own vLLM image, so no image to pull or pin). Every `--period` seconds (1 s: a signal in seconds,
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
  once); or, with `--target-requests` and no pod loading, the least loaded one as soon as the
  awake engines are more than the load needs (decide.py). A pod still loading that is to be a
  missing sleeper is labelled asleep before it is Ready, so no router ever adds it
  (decide.py `sleepers_to_be`). A sleeping engine must never receive a request. Its pod stays Ready (vLLM's /health
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
scale-down by KEDA deletes among the Ready pods the lower cost first, so an idle awake engine the
load no longer needs (-200, decide.py `surplus`, after `--surplus-idle-seconds` idle) before a
sleeper (-100) before an awake engine (0); where a sleeper went anyway, the actuator puts an awake
engine to sleep to keep `--standby` sleepers. A ReplicaSet deletes a pod that is not Ready (still loading) before any Ready one,
whatever its cost (`ActivePodsWithRanks` in kubernetes pkg/controller/controller_utils.go): what
keeps a pod that a scale-up started from being scaled down while it loads is the ScaledObject's
scale-down stabilization window, at least the model's start-up budget
(warmstart/decisions/autoscaling.py), within which the startup probe has either seen it load or
restarted it. The cost 100 written on a loading pod ranks it last among the not-Ready ones.

With `--figure-port` it serves the model's pods figure on `GET /warmstart/pods` (decide.py
`pods_figure`: the sleepers plus the most of `--min-awake`, the engines the load needs at
`--target-requests` each, and the engines awake right after a wake for `--wake-hold-seconds`),
which KEDA's metrics-api scaler hands to the HPA (warmstart/decisions/autoscaling.py
`StandbyTrigger`); 503 until the first tick has read the engines. With `--deployment`, a wake
raises that Deployment's replicas to the figure through its scale subresource (never down, never
past `--max-pods`), so the woken sleeper's replacement starts at once.

Each wake is one JSON line on stdout (`warmstart.wake`: signal, wake and first-token seconds),
each sleep `warmstart.sleep`. Engines come from the Kubernetes API (pods of `--selector` in the
namespace; the ServiceAccount may list and patch pods there, nothing else) or from
`--engines URL,...` (tests, benchmarks).

The loop is `observe` (observe.py: each engine, the front queues, the pods), `decide`
(decide.py, pure) and `act` (act.py). An answer it cannot read is that tick's, never the
process's: an engine whose answers are not of the expected shape is left alone that tick and
logged (`warmstart.standby_unreadable`), a front queue's odd count counts nothing, a pod list that
fails skips the tick (`warmstart.standby_discovery_failed`); the heartbeat the liveness probe
reads is written on every tick that ran its course, a failed pod list included, so an API outage
never gets the actuator restarted.
"""

from __future__ import annotations

import argparse
import http.server
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .act import COST, drain, put_to_sleep, restore, wake
from .decide import Policy, decide, pods_figure, sleepers_to_be, surplus
from .loop import serve_json, turn
from .observe import (
    ASLEEP, AWAKE, Engine, Kubernetes, Static, held_requests, log, probe,
)


@dataclass
class State:
    """What the loop keeps between ticks: the engines it knows, the wakes and drains in flight
    (each owned by a worker thread, so behind `lock`)."""

    known: dict[str, Engine] = field(default_factory=dict)
    waking: set[str] = field(default_factory=set)
    draining: dict[str, threading.Event] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ticked: bool = False
    """A tick has read the engines (`reconcile` marks only engines Ready after it fresh)."""
    woken: tuple[float, int] = (0.0, 0)
    """(monotonic time, engines awake or waking) at the latest wake: `pods_figure`'s `woken`."""
    figure: dict | None = None
    """What `GET /warmstart/pods` answers: the pods figure and its parts; None before the first
    tick that read the engines (the endpoint then answers 503, an error the HPA holds on)."""
    figure_at: float = 0.0
    """When `figure` was computed (monotonic): past `--figure-max-age` (the pod list failing, say)
    the endpoint answers 503 rather than a count it no longer reads."""


FIGURE_PATH = "/warmstart/pods"


def serve_figure(state: State, address: str, port: int, max_age: float) -> http.server.ThreadingHTTPServer:
    """`GET /warmstart/pods` -> `{"pods": N, ...}` (KEDA's metrics-api scaler reads `pods`, its
    `valueLocation`); 503 until a tick has read the engines or when the last reading is older
    than `max_age` seconds, 404 for any other path. Nothing else is served: no route acts on
    anything."""

    def answer(path: str) -> tuple[int, dict]:
        with state.lock:
            figure = dict(state.figure) if state.figure is not None else None
            age = time.monotonic() - state.figure_at
        if path != FIGURE_PATH:
            return 404, {"error": "not found"}
        if figure is None:
            return 503, {"error": "no engines read yet"}
        if age > max_age:
            return 503, {"error": "the engines have not been read lately"}
        return 200, figure

    return serve_json(address, port, answer)


def observe(args: argparse.Namespace, source: "Static | Kubernetes", state: State,
            pool: ThreadPoolExecutor) -> tuple[list[Engine], int] | None:
    """The engines readable this tick (state read in) and the requests the front queues hold;
    None when the pod list failed (logged)."""
    try:
        found = source.engines()
    except (OSError, ValueError) as exc:
        log("warmstart.standby_discovery_failed", error=str(exc)[:300])
        return None
    engines = [state.known.setdefault(url, Engine(url, pod, idle_since=time.time())) for pod, url in found]
    for url in set(state.known) - {u for _, u in found}:
        del state.known[url]
    reasons = list(pool.map(lambda e: probe(e, args.model, args.probe_timeout), engines))
    readable = []
    for e, why in zip(engines, reasons):
        if why:
            log("warmstart.standby_unreadable", pod=e.pod, url=e.url, reason=why)
        else:
            readable.append(e)
    queues = [u for u in args.front_queue.split(",") if u]
    if args.front_queue_selector and isinstance(source, Kubernetes):
        try:
            queues = source.front_queues(args.front_queue_selector, args.front_queue_port)
        except (OSError, ValueError) as exc:
            log("warmstart.standby_discovery_failed", error=str(exc)[:300])
    held = 0
    for u in queues:
        count, why = held_requests(u, args.probe_timeout)
        if why:
            log("warmstart.standby_unreadable", url=u, reason=why)
        held += count
    return readable, held


def note(engines: list[Engine], now: float, fresh_seconds: float = 0.0) -> None:
    """What this tick's reading says of each engine over time: freshly loaded (the sleeper to be,
    for `fresh_seconds`), and when it last served."""
    for e in engines:
        if e.ready and not e.seen_ready:
            e.seen_ready = True
            # A pod that comes up awake is new (a scale-up, a rollout, a restart): the sleeper to be,
            # while one is missing, for as long as a drain may take.
            e.fresh_until = now + fresh_seconds if not e.sleeping else 0.0
        if e.sleeping:
            e.fresh_until = 0.0
        if e.ready and not e.sleeping and (e.waiting or e.running):
            e.served, e.idle_since = True, now


def reconcile(engines: list[Engine], source: "Static | Kubernetes", busy: set[str], now: float,
              fresh_seconds: float = 0.0, surplus: set[str] = frozenset(), to_be: set[str] = frozenset()) -> None:
    """Each readable engine's pod: its deletion cost (`surplus`: awake engines the load no longer
    needs, decide.py `surplus`), and its routing label (except while a wake or a drain of this
    actuator owns it: a wake whose warm-up failed, an actuator restarted mid-drain are put right
    here); a pod still loading is labelled only when it is one of `to_be`, the sleepers to be
    (decide.py `sleepers_to_be`): `asleep`, so that its readiness does not add it to the routers."""
    note(engines, now, fresh_seconds)
    for e in engines:
        state = ("loading" if not e.ready else "sleeping" if e.sleeping
                 else "surplus" if e.url in surplus else "awake")
        if e.cost != COST[state]:
            try:
                source.set_cost(e.pod, COST[state])
                e.cost = COST[state]
            except (OSError, ValueError) as exc:
                log("warmstart.standby_cost_failed", pod=e.pod, error=str(exc))
        if not e.ready:
            want = ASLEEP if e.url in to_be else None
        else:
            want = None if e.url in busy else ASLEEP if e.sleeping else AWAKE
        if want and e.label != want:
            try:
                source.set_label(e.pod, want)
                e.label = want
                e.prelabelled = want == ASLEEP and not e.ready and not e.seen_ready
            except (OSError, ValueError) as exc:
                log("warmstart.standby_label_failed", pod=e.pod, error=str(exc))


def act(args: argparse.Namespace, source: "Static | Kubernetes", state: State, pool: ThreadPoolExecutor,
        wakes: list[str], sleeps: list[str], routers: list[str], started: float) -> None:
    """Start this tick's wakes and drains on the pool (each clears its own mark when done)."""
    if wakes:
        # The queue rose during a drain: that engine stays awake (cheaper than a wake).
        with state.lock:
            for ev in state.draining.values():
                ev.set()
    for url in wakes:
        e = state.known[url]
        with state.lock:
            state.waking.add(url)

        def _wake(e: Engine = e, at: float = started) -> None:
            try:
                if wake(e, args.model, args.sleep_level, at, args.wake_timeout):
                    # Back into the routers, with its first token served and Ready.
                    restore(e, source)
            finally:
                with state.lock:
                    state.waking.discard(e.url)
        pool.submit(_wake)
    for url in sleeps:
        e = state.known[url]
        cancel = threading.Event()
        with state.lock:
            state.draining[url] = cancel

        def _sleep(e: Engine = e, cancel: threading.Event = cancel) -> None:
            try:
                if drain(e, source, routers, args.unlist_seconds, args.drain_timeout, args.model,
                         args.probe_timeout, cancel):
                    if put_to_sleep(e, args.sleep_level, args.wake_timeout):
                        e.sleeping = True
                    else:
                        restore(e, source)
            finally:
                with state.lock:
                    state.draining.pop(e.url, None)
        pool.submit(_sleep)


def update_figure(args: argparse.Namespace, state: State, policy: Policy, engines: list[Engine], held: int) -> int:
    """Recompute the pods figure (`pods_figure`) into `state.figure`; returns it."""
    with state.lock:
        at, count = state.woken
    woken = count if at and time.monotonic() - at < args.wake_hold_seconds else 0
    pods = pods_figure(engines, policy, held, woken, args.target_requests)
    if args.max_pods:
        pods = min(pods, args.max_pods)
    with state.lock:
        state.figure_at = time.monotonic()
        state.figure = {"pods": pods, "woken": woken, "standby": policy.standby, "min_awake": policy.min_awake,
                        "awake": sum(1 for e in engines if e.ready and not e.sleeping),
                        "asleep": sum(1 for e in engines if e.ready and e.sleeping)}
    return pods


def raise_replicas(args: argparse.Namespace, source: "Static | Kubernetes", want: int) -> None:
    """Start the woken sleeper's replacement now: the Deployment's replicas up to the figure
    (never down, never past `--max-pods`). The HPA's next sync reads the same figure, so it keeps
    them; a failed or conflicting write is logged and left to that sync."""
    if not args.deployment:
        return
    try:
        done = source.raise_replicas(args.deployment, min(want, args.max_pods) if args.max_pods else want)
    except (OSError, ValueError) as exc:
        log("warmstart.standby_scale_failed", deployment=args.deployment, error=str(exc)[:300])
        return
    if done:
        log("warmstart.standby_scale", deployment=args.deployment, replicas_before=done[0], replicas=done[1])


def tick(args: argparse.Namespace, source: "Static | Kubernetes", state: State, pool: ThreadPoolExecutor,
         policy: Policy, routers: list[str], started: float) -> None:
    seen = observe(args, source, state, pool)
    if seen is None:
        return
    engines, held = seen
    with state.lock:
        busy = set(state.waking) | set(state.draining)
    now = time.time()
    # Engines already up at the actuator's first reading are of unknown age (it may have been
    # restarted beside busy engines): only one that turns Ready later is fresh.
    fresh_seconds = args.drain_timeout if state.ticked else 0.0
    note(engines, now, fresh_seconds)
    state.ticked = True
    with state.lock:
        waking, draining = set(state.waking), set(state.draining)
    actions = decide(engines, policy, now, waking, held, draining)
    # The engine this tick sends to sleep is the sleeper to be, not a surplus one to remove.
    spare = surplus(engines, policy, now, waking | set(actions.wake), held, draining | set(actions.sleep))
    to_be = sleepers_to_be(engines, policy, waking | set(actions.wake), draining | set(actions.sleep))
    # This tick's wakes and drains own their pods' labels from now on.
    reconcile(engines, source, busy | set(actions.wake) | set(actions.sleep), now, fresh_seconds, spare, to_be)
    if actions.wake:
        # The figure counts the engines being woken at once, and their replacement sleepers start
        # now (the raise is submitted before the wakes), not a scrape and an HPA sync later.
        with state.lock:
            # (an engine being drained to sleep is a sleeper in the making, not an awake one)
            state.woken = (time.monotonic(), sum(1 for e in engines if e.ready and e.url not in draining
                                                 and (not e.sleeping or e.url in waking))
                           + len(set(actions.wake) - waking))
    pods = update_figure(args, state, policy, engines, held)
    if actions.wake:
        pool.submit(raise_replicas, args, source, pods)
    act(args, source, state, pool, actions.wake, actions.sleep, routers, started)


def run(args: argparse.Namespace, stop: threading.Event | None = None, source: "Static | Kubernetes | None" = None) -> None:
    source = source or (Static([u for u in args.engines.split(",") if u], args.labels_file, args.scale_file,
                                   args.costs_file, args.pods_file)
                        if args.engines else Kubernetes(args.namespace, args.selector, args.port))
    routers = [u for u in args.router.split(",") if u]
    policy = Policy(args.standby, args.min_awake, args.target_waiting, args.awake_idle_seconds, args.target_requests,
                    args.surplus_idle_seconds)
    state = State()
    pool = ThreadPoolExecutor(max_workers=16)
    stop = stop or threading.Event()
    server = serve_figure(state, args.figure_address, args.figure_port, args.figure_max_age) if args.figure_port >= 0 else None
    log("warmstart.standby_start", standby=args.standby, min_awake=args.min_awake, period_s=args.period,
        level=args.sleep_level, figure_port=server.server_address[1] if server else None)
    turn(args, stop, lambda started: tick(args, source, state, pool, policy, routers, started))
    pool.shutdown(wait=True)
    if server is not None:
        server.shutdown()
        server.server_close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the served model name (vLLM's model_name label)")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    p.add_argument("--selector", default="", help="label selector of the model's vLLM pods")
    p.add_argument("--port", type=int, default=8000, help="vLLM's serving port on each pod")
    p.add_argument("--engines", default="", help="comma-separated engine URLs instead of the Kubernetes API")
    p.add_argument("--labels-file", default="", help="with --engines: where each engine's routing label is "
                   "written (JSON {url: label}), standing in for the pods' labels")
    p.add_argument("--pods-file", default="", help="with --engines: a JSON list of the engine URLs that are pods "
                   "now, standing in for the pod list (benchmarks)")
    p.add_argument("--costs-file", default="", help="with --engines: where each engine's deletion cost is "
                   "written (JSON {url: cost}), standing in for the pods' annotations (benchmarks)")
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
    p.add_argument("--target-requests", type=float, default=0.0,
                   help="requests (running plus waiting) one engine carries: the figure's demand term (0: none)")
    p.add_argument("--surplus-idle-seconds", type=float, default=60.0,
                   help="how long an awake engine the load does not need is idle before its pod's deletion cost "
                   "goes below a sleeper's, so a scale-down removes it and keeps the sleeper")
    p.add_argument("--figure-port", type=int, default=-1,
                   help="serve the pods figure on GET /warmstart/pods at this port (0: any free one; -1: off)")
    p.add_argument("--figure-address", default="0.0.0.0", help="the figure's listening address")
    p.add_argument("--figure-max-age", type=float, default=30.0,
                   help="answer 503 when the engines were last read longer ago than this (the pod list failing)")
    p.add_argument("--wake-hold-seconds", type=float, default=60.0,
                   help="how long the figure counts the engines awake right after a wake: past the HPA's "
                   "next sync (15 s) and the next scrape of the engines' gauges (30 s)")
    p.add_argument("--deployment", default="", help="the model's Deployment: a wake raises its replicas "
                   "(scale subresource) to the figure, so the woken sleeper's replacement starts at once")
    p.add_argument("--max-pods", type=int, default=0, help="most pods (maxReplicaCount): the figure and a "
                   "raise never ask for more (0: no bound)")
    p.add_argument("--scale-file", default="", help="with --engines: a JSON {\"replicas\": n} standing in "
                   "for the Deployment's scale subresource (benchmarks)")
    p.add_argument("--heartbeat", default="", help="file rewritten every period (the liveness probe reads it)")
    p.add_argument("--max-ticks", type=int, default=None, help="stop after this many periods (tests)")
    a = p.parse_args(argv)
    if not a.engines and not a.selector:
        p.error("give --selector (Kubernetes) or --engines")
    return a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--pool-spec" or a.startswith("--pool-spec=") for a in argv):
        # Pool mode (issue 38): one actuator for a standby pool's members (pool_mode.py).
        from .pool_mode import main as pool_main
        return pool_main(argv)
    args = parse_args(argv)
    try:
        run(args)
    except KeyboardInterrupt:
        pass
    return 0

