"""The engine host's supervisor (warmstart/podside/engine_host) run as a pod runs it, for the tests
that need one: its own process on 127.0.0.1, starting fake engines (tests/podside/fake_pooled_engine.py)
on ports the test chose, its stdout lines collected. The `host_factory` fixture (tests/podside/conftest.py)
starts them and stops every one, and every engine child they left, after the test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.podside.servers import free_ports, stop_process

ROOT = Path(__file__).resolve().parents[2]
# Generous on a busy two-core machine: four engines each load in 0.3 s plus a Python start.
UP_TIMEOUT_S = 60.0


def call(method: str, url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, code = r.read(), r.status
    except urllib.error.HTTPError as e:
        raw, code = e.read(), e.code
    try:
        return code, json.loads(raw)
    except ValueError:
        return code, raw


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(what: str, check: Callable[[], bool], timeout: float = UP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Host:
    """The supervisor in its own process, its stdout lines collected."""

    def __init__(self, tmp: Path, models: list[str], *, level: int = 1, load_s: dict[str, float] | None = None,
                 extra: dict | None = None, argv: dict[str, list[str]] | None = None) -> None:
        self.events_file = tmp / "events.jsonl"
        self.events_file.touch()
        ports = free_ports(len(models))
        engines = [{"model": m, "port": p,
                    "argv": [sys.executable, "-m", "tests.podside.fake_pooled_engine", "--model", m, "--port", str(p),
                             "--events", str(self.events_file), "--load-s", str((load_s or {}).get(m, 0.3)),
                             "--spawn-worker"],
                    "env": {"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}}
                   for m, p in zip(models, ports)]
        for e in engines:
            e["argv"] = (argv or {}).get(e["model"], e["argv"])
        spec = {"sleepLevel": level, "engines": engines, "backoffInitialSeconds": 0.5, "backoffMaxSeconds": 2,
                **(extra or {})}
        self.spec_file = tmp / "spec.json"
        self.spec_file.write_text(json.dumps(spec))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "warmstart.podside.engine_host", "--spec", str(self.spec_file), "--host", "127.0.0.1",
             "--port", "0", "--run-dir", str(tmp / "run"), "--stop-grace", "5", "--health-period", "0.5",
             "--health-timeout", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT),
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"})
        self.lines: list[dict] = []
        self.listening = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.listening.wait(UP_TIMEOUT_S):
            self.stop()
            raise AssertionError("the supervisor never listened")
        port = next(line["port"] for line in self.lines if line["event"] == "warmstart.engine_host.listening")
        self.url = f"http://127.0.0.1:{port}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            self.lines.append(line)
            if line.get("event") == "warmstart.engine_host.listening":
                self.listening.set()

    def status(self) -> dict:
        return call("GET", self.url + "/engines")[1]

    def state(self, model: str) -> str:
        return next(e["state"] for e in self.status()["engines"] if e["model"] == model)

    def pid(self, model: str) -> int | None:
        return next(e["pid"] for e in self.status()["engines"] if e["model"] == model)

    def events(self) -> list[dict]:
        return [json.loads(x) for x in self.events_file.read_text().splitlines() if x.strip()]

    def workers(self, model: str) -> list[int]:
        """The pids of the child processes `model`'s engines started, oldest first."""
        return [int(e["event"].split()[1]) for e in self.events() if e["model"] == model
                and e["event"].startswith("worker ")]

    def wait_all_asleep(self) -> None:
        wait_until("every engine asleep", lambda: self.status()["spare"])

    def stop(self) -> None:
        stop_process(self.proc, 30)


def hosts_in(tmp_path: Path) -> Iterator[Callable[..., Host]]:
    """What the `host_factory` fixture yields: a function starting a Host in a folder of its own."""
    hosts: list[Host] = []

    def make(models: list[str], **kw: Any) -> Host:
        folder = tmp_path / f"h{len(hosts)}"
        folder.mkdir()
        hosts.append(Host(folder, models, **kw))
        return hosts[-1]

    yield make
    pids = []
    for h in hosts:
        if h.proc.poll() is None:
            pids += [e["pid"] for e in h.status()["engines"] if e["pid"]]
        h.stop()
    for h in hosts:  # a test that failed half-way may have left an engine's child: end it (ours, by pid)
        for pid in [w for m in {e["model"] for e in h.events()} for w in h.workers(m)]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    for pid in pids:  # the supervisor's SIGTERM stopped its engines; nothing of them is left
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)

