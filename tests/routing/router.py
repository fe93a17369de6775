"""The real SMG router (the `smg` binary of its PyPI wheel) on 127.0.0.1, for the routing tests and
bench/routing.py.

`SmgRouter(flags)` starts `smg launch` with warmstart's flags for a plan (or any flags), on ports
the kernel reported free, waits (bounded) until it serves, and stops it by pid. Helpers send
OpenAI requests, read its Prometheus metrics and its worker list.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterable

from tests.podside.servers import find_binary, free_ports

_METRIC = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def smg_binary() -> str:
    found = find_binary("smg")
    if not found:
        raise RuntimeError("the `smg` binary is missing: install the test extra (PyPI smg==1.13.0)")
    return found


class SmgRouter:
    """One `smg launch` process. `flags` are everything but the listeners, which it chooses."""

    def __init__(self, flags: Iterable[str], env: dict[str, str] | None = None, ready_timeout_s: float = 30.0,
                 wait_for_workers: int = 0):
        self.port, self.metrics_port, self.probe_port = free_ports(3)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="smg-", suffix=".log", delete=False)
        self.argv = [smg_binary(), "launch", "--host", "127.0.0.1", "--port", str(self.port),
                     "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
                     "--health-check-port", str(self.probe_port), *flags]
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, **(env or {})))
        try:
            self.wait_ready(ready_timeout_s)
            if wait_for_workers:
                self.wait_workers(wait_for_workers, ready_timeout_s)
        except BaseException:
            self.stop()
            raise

    # -- lifecycle

    def wait_ready(self, timeout_s: float) -> None:
        """Until the probe listener answers /liveness and the serving listener accepts
        connections. SMG binds them separately (the probe listener runs on its own runtime), so a
        live probe does not yet mean the serving port is open: under CPU load the gap was long
        enough for GET /workers to be refused."""
        deadline = time.monotonic() + timeout_s
        live = False
        last: object = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"smg exited with {self.proc.returncode}:\n{self.logs()[-4000:]}")
            try:
                if not live:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.probe_port}/liveness", timeout=1) as r:
                        live = r.status == 200
                if live:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                        return
            except OSError as e:
                last = e
            time.sleep(0.1)
        raise RuntimeError(f"smg did not come up in {timeout_s}s (probe live: {live}, last error: {last!r}):\n"
                           f"{self.logs()[-4000:]}")

    def wait_workers(self, count: int, timeout_s: float, healthy: bool = True) -> list[dict]:
        """Wait until exactly `count` (healthy) workers are registered; return them. A refused or
        timed-out GET /workers is retried until the same deadline (a loaded machine can be slow to
        answer), and the last error is reported if it never succeeds."""
        deadline = time.monotonic() + timeout_s
        workers: list[dict] = []
        last: object = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"smg exited with {self.proc.returncode}:\n{self.logs()[-4000:]}")
            try:
                workers = [w for w in self.workers(timeout_s=max(0.5, min(5.0, deadline - time.monotonic())))
                           if not healthy or w.get("is_healthy", True)]
            except OSError as e:
                last = e
            else:
                if len(workers) == count:
                    return workers
            time.sleep(0.1)
        raise AssertionError(f"expected {count} workers, have {workers} (last error: {last!r})\n"
                             f"{self.logs()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            # SMG drains for 5 s on SIGTERM; a test router has nothing in flight.
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()

    def logs(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def __enter__(self) -> "SmgRouter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        os.unlink(self.log.name)

    # -- HTTP

    def call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
             timeout_s: float = 10.0) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw.decode(errors="replace")

    def workers(self, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> list[dict]:
        status, body = self.call("GET", "/workers", headers=headers, timeout_s=timeout_s)
        if status != 200:
            raise AssertionError(f"GET /workers: {status} {body}")
        return body.get("workers", []) if isinstance(body, dict) else body

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = []
        for line in text.splitlines():
            m = _METRIC.match(line)
            if m and not line.startswith("#"):
                out.append((m[1], dict(_LABEL.findall(m[2] or "")), float(m[3])))
        return out

    def metric_sum(self, name: str, **labels: str) -> float:
        return sum(v for n, ls, v in self.metrics() if n == name and all(ls.get(k) == x for k, x in labels.items()))


def chat(url: str, system: str, user: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """One chat completion against `url` (the router or a backend); the parsed reply."""
    body = {"model": "fake-model", "max_tokens": 1,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def served_by(reply: dict[str, Any]) -> str:
    """The fake backend that answered (its name is the reply)."""
    return reply["choices"][0]["message"]["content"]


def write_discovery_file(path: Path, urls: Iterable[str]) -> None:
    """SMG's file-discovery manifest, replaced atomically so the router never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": 1, "workers": [{"url": u} for u in sorted(urls)]}))
    os.replace(tmp, path)
