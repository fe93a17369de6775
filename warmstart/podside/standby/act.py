"""The standby actuator's acts: a wake with its warm-up token, a drain out of the routers, a
sleep, the routing label put back. Part of the standby package (main.py says why)."""

from __future__ import annotations

import threading
import time

from . import observe
from .observe import ASLEEP, AWAKE, Engine, Kubernetes, READ_ERRORS, Static, log, parse_metrics

# Each pod's deletion cost by its engine's state (main.py's docstring says why): a scale-down
# removes an awake engine the load no longer needs (decide.py `surplus`) first, then a sleeper,
# then an awake engine.
COST = {"surplus": "-200", "sleeping": "-100", "loading": "100", "awake": "0"}


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
            code, text = observe.http(method, e.url + path, body, timeout=timeout)
            if code != 200:
                log("warmstart.wake_failed", pod=e.pod, url=e.url, step=path, status=code, body=text[:200].decode(errors="replace"))
                return False
        t1 = time.monotonic()
        code, text = observe.http("POST", e.url + "/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": 1},
                          timeout=timeout)
        t2 = time.monotonic()
    except READ_ERRORS as exc:
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


def drain(e: Engine, source: "Static | Kubernetes", routers: list[str], unlist_seconds: float, timeout: float,
          model: str | None, probe_timeout: float, cancel: threading.Event) -> bool:
    """Take `e` out of the routers and wait until it has nothing in flight, within `timeout`.
    True: it may sleep now. False: the pod is relabelled awake (it keeps serving)."""
    deadline = time.monotonic() + timeout
    reason = ""
    # Labelled asleep by this actuator while it loaded (a sleeper to be, main.py `reconcile`) and
    # never relabelled since: it was never Ready with the routers' label, so never in a router.
    never_routed = e.label == ASLEEP and e.prelabelled
    try:
        if not never_routed:
            source.set_label(e.pod, ASLEEP)
            e.label = ASLEEP
    except (OSError, ValueError) as exc:
        log("warmstart.sleep_skipped", pod=e.pod, url=e.url, reason="label", error=str(exc))
        return False
    # 1. Out of the routers: none lists it any more, or one discovery pass of theirs has passed.
    if never_routed:
        pass
    elif routers:
        while True:
            if cancel.is_set():
                reason = "cancelled"
                break
            if observe.listed(routers, e, probe_timeout) is False:
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
            code, body = observe.http("GET", e.url + "/metrics", timeout=probe_timeout)
            waiting, running = parse_metrics(body.decode(errors="replace"), model) if code == 200 else (1.0, 1.0)
        except READ_ERRORS:
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
        e.label, e.prelabelled = AWAKE, False
    except (OSError, ValueError) as exc:
        # The next tick's label reconcile retries it.
        e.label = None
        log("warmstart.standby_label_failed", pod=e.pod, error=str(exc))


def put_to_sleep(e: Engine, level: int, timeout: float) -> bool:
    try:
        code, _ = observe.http("POST", f"{e.url}/sleep?level={level}&mode=wait", timeout=timeout)
    except READ_ERRORS as exc:
        log("warmstart.sleep_failed", pod=e.pod, url=e.url, error=str(exc))
        return False
    log("warmstart.sleep", pod=e.pod, url=e.url, level=level, status=code)
    return code == 200
