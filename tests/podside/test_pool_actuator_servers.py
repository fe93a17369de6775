"""The pool actuator (standby.pyz --pool-spec, the built artifact a pod runs) against the real engine
host supervisor (warmstart/podside/engine_host) over fake engines, on 127.0.0.1.

`--static` names the hosts and the members' own engines (re-read every tick: the test adds a host as
a ReplicaSet would), `--labels-file` receives the host pods' labels, `--scale-file` stands in for the
host Deployment's scale subresource, and a stand-in front queue answers each member's held count.

One story, checked step by step: requests held for m0 with no engine wake m0's engine on the spare
host (its warm-up token served, the host labelled to serve m0, a replacement host asked for, m0's
figure one pod); m1 rising with no spare left is a cold start (its figure asks for its own pod, no
wake, nothing refused by the host); the replacement host turns up and m1, still held, wakes on it;
m0's own pod comes up and carries it, so m0's pooled engine is drained and put to sleep and the
pool lowered; m1 idle past its awakeIdleSeconds sleeps too."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.podside.engine_hosts import call, wait_until
from tests.routing.fake_vllm import FakeVllm
from tests.support.pod_scripts import artifact

pytestmark = pytest.mark.servers

TIMEOUT_S = 60.0


class HeldCounts:
    """Each member's front queue, as the actuator reads it: `GET /<model>/warmstart/held`."""

    def __init__(self) -> None:
        self.held: dict[str, int] = {}
        counts = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                model = self.path.strip("/").split("/", 1)[0]
                body = json.dumps({"held": counts.held.get(model, 0)}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


class PoolActuator:
    def __init__(self, tmp: Path, pool: dict, static: dict) -> None:
        self.static_file, self.labels_file, self.scale_file = tmp / "static.json", tmp / "labels.json", tmp / "scale.json"
        (tmp / "pool.json").write_text(json.dumps(pool))
        self.write_static(static)
        self.scale_file.write_text(json.dumps({"replicas": pool["spares"]}))
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(artifact("standby.pyz")), "--pool-spec", str(tmp / "pool.json"),
             "--static", str(self.static_file), "--labels-file", str(self.labels_file), "--scale-file",
             str(self.scale_file), "--period", "0.5", "--probe-timeout", "3", "--unlist-seconds", "0.5",
             "--figure-address", "127.0.0.1", "--figure-port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin"})
        self.lines: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        wait_until("the actuator's start line", lambda: any(x["event"] == "warmstart.pool_start" for x in self.lines))
        port = next(x["figure_port"] for x in self.lines if x["event"] == "warmstart.pool_start")
        self.url = f"http://127.0.0.1:{port}"

    def _read(self) -> None:
        for raw in self.proc.stdout:  # type: ignore[union-attr]
            try:
                self.lines.append(json.loads(raw))
            except ValueError:
                pass

    def write_static(self, doc: dict) -> None:
        tmp = self.static_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.static_file)

    def labels(self) -> dict:
        try:
            return json.loads(self.labels_file.read_text())
        except (OSError, ValueError):
            return {}

    def replicas(self) -> int:
        return json.loads(self.scale_file.read_text())["replicas"]

    def figure(self, model: str) -> tuple[int, Any]:
        return call("GET", f"{self.url}/warmstart/pods/{model}")

    def events(self, name: str, **match: Any) -> list[dict]:
        return [x for x in list(self.lines) if x["event"] == name and all(x.get(k) == v for k, v in match.items())]

    def stop(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        return self.proc.stderr.read() if self.proc.stderr else ""


def member(model: str, port: int, fq: str, idle_s: float) -> dict:
    return {"model": model, "port": port, "deployment": model, "selector": {"app.kubernetes.io/instance": model},
            "minReplicas": 0, "targetWaiting": 5, "targetRequests": 0, "awakeIdleSeconds": idle_s,
            "frontQueue": {"service": f"{model}-front", "port": 8081}}


def test_the_pool_wakes_on_a_spare_raises_a_replacement_goes_cold_past_it_and_sleeps_again(
        tmp_path: Path, host_factory) -> None:
    h0 = host_factory(["m0", "m1"])
    h0.wait_all_asleep()
    held = HeldCounts()
    pool = {"pool": "p", "namespace": "inference", "hostSelector": {"warmstart.io/standby-pool": "p"},
            "hostDeployment": "p-hosts", "spares": 1, "maxHosts": 3, "supervisorPort": 8090, "sleepLevel": 1,
            "members": [member("m0", 8100, held.url, 600), member("m1", 8101, held.url, 2)]}
    static: dict = {"hosts": {"h0": h0.url}, "members": {"m0": {}, "m1": {}},
                    "frontQueues": {m: [f"{held.url}/{m}"] for m in ("m0", "m1")}}
    act = PoolActuator(tmp_path, pool, static)
    own: FakeVllm | None = None
    try:
        wait_until("the first figures", lambda: act.figure("m0")[0] == 200)
        assert act.figure("m0")[1]["pods"] == 0 and act.figure("nope")[0] == 404
        wait_until("the idle host labelled asleep", lambda: act.labels().get("h0") == {"warmstart.io/engine": "asleep"})
        assert act.replicas() == 1

        # 1. Held requests, no engine: m0 wakes on the spare, joins its routers, a replacement is asked for.
        held.held["m0"] = 3
        wait_until("m0 labelled awake on h0", lambda: act.labels().get("h0") == {
            "warmstart.io/engine": "awake", "warmstart.io/serves": "m0"})
        assert h0.state("m0") == "awake"
        (woke,) = act.events("warmstart.wake", model="m0")
        assert woke["kind"] == "wake" and woke["warmup_status"] == 200 and woke["pod"] == "h0"
        assert act.replicas() == 2
        assert act.figure("m0")[1]["pods"] == 1  # its own Deployment scales up behind the pooled engine

        # 2. m1 rises with no spare left: a cold start (its own pod asked for), never a wake refused.
        held.held["m1"] = 2
        wait_until("m1 cold", lambda: act.events("warmstart.pool_cold", model="m1"))
        wait_until("m1's figure", lambda: act.figure("m1")[1]["pods"] == 1)
        assert not act.events("warmstart.wake_failed") and h0.state("m1") == "asleep"

        # 3. The replacement host turns up (the ReplicaSet's doing): m1, still held, wakes on it.
        h1 = host_factory(["m0", "m1"])
        h1.wait_all_asleep()
        static["hosts"]["h1"] = h1.url
        act.write_static(static)
        wait_until("m1 labelled awake on h1", lambda: act.labels().get("h1") == {
            "warmstart.io/engine": "awake", "warmstart.io/serves": "m1"})
        assert h1.state("m1") == "awake" and h0.state("m0") == "awake"
        assert len(act.events("warmstart.pool_cold", model="m1")) == 1  # once per rise, not once per tick
        wait_until("a third host asked for", lambda: act.replicas() == 3)

        # 4. m0's own pod comes up and carries its load: the pooled engine drains and sleeps, the
        #    host is a spare again.
        held.held["m0"] = 0
        own = FakeVllm("m0-own", served_model="m0")
        static["members"]["m0"] = {"m0-own": own.url}
        act.write_static(static)
        wait_until("m0 asleep on h0", lambda: h0.state("m0") == "asleep" and h0.status()["spare"])
        assert act.labels()["h0"] == {"warmstart.io/engine": "asleep"}
        assert act.events("warmstart.sleep", pod="h0")
        wait_until("the pool lowered", lambda: act.replicas() == 2)

        # 5. m1's queue empties; idle past its awakeIdleSeconds, it sleeps too.
        held.held["m1"] = 0
        wait_until("m1 asleep on h1", lambda: h1.status()["spare"] and act.labels()["h1"] == {"warmstart.io/engine": "asleep"})
        wait_until("the pool at its spare", lambda: act.replicas() == 1)
    finally:
        err = act.stop()
        held.server.shutdown()
        if own is not None:
            own.stop()
    assert "Traceback" not in err, err
    assert not act.events("warmstart.standby_tick_failed")
