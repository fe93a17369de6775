"""The engines' lifecycle on one host: started one at a time, each put to sleep before the next
starts, restarted alone with a bounded backoff, never started beside an awake engine.

Why one at a time: vLLM sizes an engine's memory from the GPU it sees at start. It refuses to
start when free memory is below `total x --gpu-memory-utilization`, and sizes its KV cache from
what its profile run measured (vllm `vllm/v1/worker/gpu_worker.py`, `init_device` and
`determine_available_memory`). An engine started while another loads or is awake would either
fail that check or measure the other's transient memory as its own; started while every other
engine sleeps, it sees exactly the sleepers' residue the render budgeted
(warmstart/decisions/standby_pool.py). The same gate holds for a restart: a failed engine starts
again only while no other engine is awake or starting, so a crash of one never takes the awake
engine's memory from under it.

States, as `GET /engines` reports them: `pending` (not started yet), `starting` (process up,
loading, then put to sleep), `asleep`, `awake`, `failed` (exited or stuck; started again after its
backoff), `stopped` (the host is shutting down).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..common.shared import json_line
from .spec import EngineSpec, HostSpec

PENDING, STARTING, ASLEEP, AWAKE, FAILED, STOPPED = "pending", "starting", "asleep", "awake", "failed", "stopped"
# An engine that has been up answers /health within this; three misses in a row (one period
# apart) mean it is wedged, and it is restarted like one that exited.
HEALTH_TIMEOUT_S = 2.0
HEALTH_PERIOD_S = 5.0
HEALTH_MISSES = 3
# Most bytes read of an engine's answer to the supervisor's own calls.
MAX_READ_BYTES = 1 << 20


def log(event: str, **fields: object) -> None:
    print(json_line({"event": f"warmstart.engine_host.{event}", "time": round(time.time(), 3), **fields},
                    sort_keys=True), flush=True)


def http(method: str, url: str, body: bytes | None = None, timeout: float = 2.0,
         headers: dict[str, str] | None = None) -> tuple[int, bytes, str]:
    """(status, body, content type); status 0 when the engine did not answer."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(MAX_READ_BYTES), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(MAX_READ_BYTES), e.headers.get("Content-Type", "") if e.headers else ""
    except (OSError, ValueError):
        return 0, b"", ""


@dataclass
class Engine:
    spec: EngineSpec
    state: str = PENDING
    proc: subprocess.Popen | None = None
    restarts: int = 0
    """Times it was started again after a failure."""
    failures: int = 0
    """Failures since it was last asleep: the backoff's exponent."""
    next_start: float = 0.0
    since: float = field(default_factory=time.monotonic)
    last_error: str = ""
    misses: int = 0
    checked: float = 0.0
    waking: bool = False
    checking: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.spec.port}"

    def status(self, now: float) -> dict:
        return {"model": self.spec.model, "port": self.spec.port, "state": self.state, "restarts": self.restarts,
                "pid": self.proc.pid if self.proc and self.proc.poll() is None else None,
                "sinceSeconds": round(now - self.since, 1), "lastError": self.last_error}


class Supervisor:
    """Runs `spec`'s engines; `tick` is the loop's one step (the caller's thread calls it every period)."""

    def __init__(self, spec: HostSpec, run_dir: Path, *, clock: Callable[[], float] = time.monotonic,
                 health_period_s: float = HEALTH_PERIOD_S, health_timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        self.spec = spec
        self.health_period_s, self.health_timeout_s = health_period_s, health_timeout_s
        self.run_dir = run_dir
        self.clock = clock
        self.engines = [Engine(e) for e in spec.engines]
        self.lock = threading.Lock()
        self.bringup: threading.Thread | None = None
        self.stopping = threading.Event()
        self.last_tick = clock()

    # --- what the server reads ------------------------------------------------------------------

    def engine(self, model: str) -> Engine | None:
        return next((e for e in self.engines if e.spec.model == model), None)

    def snapshot(self) -> dict:
        now = self.clock()
        with self.lock:
            states = [e.status(now) for e in self.engines]
            awake = [e.spec.model for e in self.engines if e.state == AWAKE]
        return {"spare": all(s["state"] == ASLEEP for s in states), "awake": awake[0] if awake else None,
                "sleepLevel": self.spec.sleep_level, "engines": states}

    def all_up(self) -> bool:
        with self.lock:
            return all(e.state in (ASLEEP, AWAKE) for e in self.engines)

    def _set(self, e: Engine, state: str, error: str = "") -> None:
        if e.state != state:
            e.state, e.since = state, self.clock()
            log("state", model=e.spec.model, state=state, **({"error": error} if error else {}))
        if error:
            e.last_error = error

    # --- waking and sleeping, for the actuator's routes ----------------------------------------------

    def begin_wake(self, model: str) -> str | None:
        """Claim the one awake place for `model`; None, or why not (the host is not a spare)."""
        with self.lock:
            e = self.engine(model)
            if e is None:
                return "no such engine"
            if e.state != ASLEEP:
                return f"{model} is {e.state}"
            busy = [o.spec.model for o in self.engines if o is not e and (o.state in (AWAKE, STARTING) or o.waking)]
            if busy:
                return f"{busy[0]} is {self.engine(busy[0]).state}: one engine awake or starting per host"
            e.waking = True
            return None

    def end_wake(self, model: str, ok: bool, error: str = "") -> None:
        with self.lock:
            e = self.engine(model)
            if e is None:
                return
            e.waking = False
            if ok and e.state == ASLEEP:
                self._set(e, AWAKE)
            elif not ok:
                e.last_error = error

    def slept(self, model: str) -> None:
        with self.lock:
            e = self.engine(model)
            if e is not None and e.state == AWAKE:
                self._set(e, ASLEEP)

    # --- the loop -------------------------------------------------------------------------------------

    def tick(self) -> None:
        now = self.clock()
        self.last_tick = now
        with self.lock:
            for e in self.engines:
                if e.proc is not None and e.proc.poll() is not None and e.state not in (FAILED, STOPPED):
                    self._fail(e, f"exited with {e.proc.returncode}", now)
            due = [e for e in self.engines if e.state in (ASLEEP, AWAKE) and not e.checking
                   and now - e.checked >= self.health_period_s]
            for e in due:
                e.checking = True
        # Each check on its own thread: a wedged engine's timeouts never hold the loop (and /livez) up.
        for e in due:
            threading.Thread(target=self._check, args=(e, now), name=f"check-{e.spec.model}", daemon=True).start()
        with self.lock:
            if self.stopping.is_set() or (self.bringup is not None and self.bringup.is_alive()):
                return
            if any(e.state in (AWAKE, STARTING) or e.waking for e in self.engines):
                return
            nxt = next((e for e in self.engines if e.state == PENDING
                        or (e.state == FAILED and e.next_start <= now)), None)
            if nxt is None:
                return
            self._set(nxt, STARTING)
            self.bringup = threading.Thread(target=self._bring_up, args=(nxt,), name=f"bringup-{nxt.spec.model}",
                                            daemon=True)
            self.bringup.start()

    def _fail(self, e: Engine, why: str, now: float) -> None:
        """Under the lock: mark `e` failed, stop what is left of it, schedule its restart."""
        _kill(e.proc)
        e.failures += 1
        delay = min(self.spec.backoff_max_s, self.spec.backoff_initial_s * 2 ** (e.failures - 1))
        e.next_start = now + delay
        e.waking = False
        self._set(e, FAILED, f"{why}; restart in {delay:g} s")

    def _check(self, e: Engine, now: float) -> None:
        """A running engine's /health and /is_sleeping (the actuator may have woken or slept it
        directly); three misses in a row and it is restarted."""
        code, _, _ = http("GET", e.url + "/health", timeout=self.health_timeout_s)
        sleeping = None
        if code == 200:
            c, body, _ = http("GET", e.url + "/is_sleeping", timeout=self.health_timeout_s)
            try:
                sleeping = bool(json.loads(body)["is_sleeping"]) if c == 200 else None
            except (ValueError, KeyError, TypeError):
                sleeping = None
        with self.lock:
            e.checked, e.checking = now, False
            if e.state not in (ASLEEP, AWAKE):
                return
            if code != 200:
                e.misses += 1
                if e.misses >= HEALTH_MISSES:
                    self._fail(e, f"/health failed {e.misses} times in a row", now)
                return
            e.misses = 0
            if sleeping is not None and not e.waking:
                self._set(e, ASLEEP if sleeping else AWAKE)

    def _bring_up(self, e: Engine) -> None:
        """Start `e`, wait for /health, put it to sleep: the next engine starts only after."""
        spec = self.spec
        restart = e.failures > 0
        scratch = self.run_dir / e.spec.model
        scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Each engine's own IPC socket folder: vLLM's front end and engine core meet on sockets under
        # VLLM_RPC_BASE_PATH (vllm/envs.py, default the temp folder), which engines of one container share.
        env = {**os.environ, "VLLM_RPC_BASE_PATH": str(scratch), **e.spec.env}
        try:
            proc = subprocess.Popen(list(e.spec.argv), env=env, start_new_session=True, stdin=subprocess.DEVNULL)
        except OSError as exc:
            with self.lock:
                self._fail(e, f"could not start: {exc.strerror or exc}", self.clock())
            return
        with self.lock:
            e.proc = proc
            if restart:
                e.restarts += 1
        log("starting", model=e.spec.model, port=e.spec.port, pid=proc.pid, restart=restart)
        started = self.clock()
        deadline = started + spec.startup_timeout_s
        while True:
            if self.stopping.is_set():
                return
            if proc.poll() is not None:
                return  # the loop marks it failed
            if http("GET", e.url + "/health", timeout=HEALTH_TIMEOUT_S)[0] == 200:
                break
            if self.clock() > deadline:
                with self.lock:
                    self._fail(e, f"no /health within {spec.startup_timeout_s:g} s", self.clock())
                return
            self.stopping.wait(0.2)
        code, body, _ = http("POST", f"{e.url}/sleep?level={spec.sleep_level}", b"", timeout=spec.sleep_timeout_s)
        c, answer, _ = http("GET", e.url + "/is_sleeping", timeout=HEALTH_TIMEOUT_S)
        try:
            asleep = c == 200 and json.loads(answer)["is_sleeping"] is True
        except (ValueError, KeyError, TypeError):
            asleep = False
        with self.lock:
            if e.state != STARTING:
                return
            if code != 200 or not asleep:
                self._fail(e, f"sleep at level {spec.sleep_level} failed ({code}: {body[:200]!r})", self.clock())
                return
            e.failures, e.misses, e.checked = 0, 0, self.clock()
            self._set(e, ASLEEP)
        log("asleep", model=e.spec.model, seconds=round(self.clock() - started, 2))

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop every engine: SIGTERM to each process group, SIGKILL to what is left after `grace_s`."""
        self.stopping.set()
        with self.lock:
            procs = [e.proc for e in self.engines if e.proc is not None and e.proc.poll() is None]
            for e in self.engines:
                self._set(e, STOPPED)
        for p in procs:
            _signal(p, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            _kill(p)


def _signal(proc: subprocess.Popen, sig: int) -> None:
    """`sig` to the engine's whole process group (vLLM's API server, engine core and TP workers)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    _signal(proc, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
