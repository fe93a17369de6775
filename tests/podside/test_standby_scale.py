"""The standby actuator's pods figure and its scale-up on a wake (issue 37, "a sleeper for every
step"), run as its pod runs it (the built artifact, `python3 -I -S`) against stand-ins on
127.0.0.1: a vLLM engine asleep with requests queued on it, and a Kubernetes API that lists its
pod and serves the model Deployment's scale subresource. A wake must raise the Deployment's
replicas at once (the woken sleeper's replacement starts now, not a scrape and an HPA sync
later), and the figure KEDA's metrics-api scaler reads must count the woken engine at once, then
let it go after `--wake-hold-seconds`. Every run is bounded in ticks and in time."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.podside.servers import free_ports
from tests.support.loopback import LoopbackServer
from tests.support.pod_scripts import artifact
from tests.support.standby_engine import StandInEngine

pytestmark = pytest.mark.servers  # stand-ins and the actuator script

TIMEOUT_S = 90  # the most one bounded run takes on a loaded machine
SCALE = "/apis/apps/v1/namespaces/ns/deployments/m/scale"


class SleepingEngine(StandInEngine):
    """A vLLM engine asleep with `queued` requests waiting on it (vLLM 0.33 queues what reaches a
    paused engine); `POST /wake_up` wakes it and its queue drains."""

    def __init__(self, queued: int = 3) -> None:
        self.asleep, self.queued = True, queued
        super().__init__()

    def is_sleeping_body(self) -> bytes:
        return json.dumps({"is_sleeping": self.asleep}).encode()

    def metrics_body(self) -> bytes:
        return (f'vllm:num_requests_waiting{{model_name="m"}} {self.queued}\n'
                f'vllm:num_requests_running{{model_name="m"}} 0\n').encode()

    def on_post(self, path: str) -> None:
        if path == "/wake_up":
            self.asleep, self.queued = False, 0


class Api(LoopbackServer):
    """The Kubernetes API: one running pod of the model at 127.0.0.1, pod patches accepted, and the
    Deployment `m`'s scale subresource (`replicas`, resourceVersion "7"), answering its GET with
    `scale_status`. Records every call as (method, path, content type, body)."""

    def __init__(self, replicas: int, scale_status: int = 200, pod_lists: int | None = None) -> None:
        self.calls: list[tuple[str, str, str, object]] = []
        self.pod_lists = pod_lists  # answer this many pod lists, then 500
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def _send(self, status: int, doc: object) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _record(self) -> object:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else None
                api.calls.append((self.command, self.path, self.headers.get("Content-Type", ""), body))
                return body

            def do_GET(self) -> None:
                self._record()
                if self.path.startswith("/api/v1/namespaces/ns/pods") and api.pod_lists is not None:
                    api.pod_lists -= 1
                    if api.pod_lists < 0:
                        self._send(500, {})
                        return
                if self.path.startswith("/api/v1/namespaces/ns/pods"):
                    self._send(200, {"items": [{"metadata": {"name": "m-0"}, "status": {"podIP": "127.0.0.1"}}]})
                elif self.path == SCALE:
                    self._send(scale_status, {"metadata": {"resourceVersion": "7"}, "spec": {"replicas": replicas}}
                               if scale_status == 200 else {"kind": "Status", "code": scale_status})
                else:
                    self._send(404, {})

            def do_PATCH(self) -> None:
                self._record()
                self._send(200, {})

        self._serve(Handler)


def _run(tmp_path: Path, engine: SleepingEngine, api: Api, *extra: str) -> tuple[list[int | None], list[dict], str]:
    """Run the actuator (standby 1, min-awake 0) and read its figure while it runs: (the figures
    read in order, None for a 503 after the first figure, its log lines, its stderr)."""
    sa = tmp_path / "sa"
    sa.mkdir(exist_ok=True)
    (sa / "token").write_text("t0ken\n")
    port = free_ports(1)[0]
    args = [sys.executable, "-I", "-S", str(artifact("standby.pyz")), "--model", "m", "--namespace", "ns",
            "--selector", "app=m", "--port", engine.base_url.rsplit(":", 1)[1], "--standby", "1",
            "--min-awake", "0", "--period", "0.2", "--probe-timeout", "5", "--max-ticks", "40",
            "--figure-port", str(port), "--figure-address", "127.0.0.1", "--wake-hold-seconds", "3",
            "--deployment", "m", "--max-pods", "5", *extra]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": "/usr/bin:/bin", "WARMSTART_KUBE_API": api.base_url,
                                 "WARMSTART_SA_DIR": str(sa)})
    figures: list[int] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/warmstart/pods", timeout=5) as r:
                    figures.append(json.loads(r.read())["pods"])
            except urllib.error.HTTPError as exc:
                assert exc.code == 503, exc.code  # an error, never a low figure
                if figures:
                    figures.append(None)
            except OSError:
                pass  # not listening yet, or already closed
            time.sleep(0.05)
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = []
    for line in out.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pass
    return figures, lines, err


def test_a_wake_raises_the_replicas_and_the_figure_at_once(tmp_path: Path):
    with SleepingEngine() as engine, Api(replicas=1) as api:
        figures, lines, err = _run(tmp_path, engine, api)
    assert "Traceback" not in err, err
    assert engine.posts[:1] == ["/wake_up"], engine.posts
    # The scale subresource: read, then raised to standby 1 + the 1 woken engine, conditional on
    # the version read (a write of the HPA's in between fails it rather than being overwritten).
    scale = [(m, ct, body) for m, path, ct, body in api.calls if path == SCALE]
    assert [(m, b) for m, _, b in scale[:1]] == [("GET", None)], scale
    assert scale[1:2] == [("PATCH", "application/merge-patch+json",
                           {"metadata": {"resourceVersion": "7"}, "spec": {"replicas": 2}})], scale
    assert any(e["event"] == "warmstart.standby_scale" and e["replicas"] == 2 for e in lines), lines
    # The figure counts the woken engine at once (nothing else asks for an awake engine here:
    # min-awake 0, no --target-requests), then lets it go once the hold has passed.
    assert figures and 2 in figures and None not in figures, figures
    first_two = figures.index(2)
    assert set(figures[:first_two]) <= {1}, figures
    assert figures[-1] == 1, figures


def test_the_figure_counts_the_load_beside_the_sleepers(tmp_path: Path):
    """With --target-requests the figure is the engine-demand query's, read every period: 3
    requests queued at 1 per engine ask for 3 engines beside the sleeper, before the wake has
    emptied the queue."""
    with SleepingEngine(queued=3) as engine, Api(replicas=1) as api:
        figures, _, err = _run(tmp_path, engine, api, "--target-requests", "1")
    assert "Traceback" not in err, err
    assert figures and max(figures) == 4, figures


def test_a_figure_the_actuator_no_longer_reads_is_an_error(tmp_path: Path):
    """The pod list fails after a few ticks (the heartbeat still turns, by design): past
    --figure-max-age the figure answers 503, which the HPA holds on, not the last count."""
    with SleepingEngine() as engine, Api(replicas=1, pod_lists=5) as api:
        figures, lines, err = _run(tmp_path, engine, api, "--figure-max-age", "1")
    assert "Traceback" not in err, err
    assert any(e["event"] == "warmstart.standby_discovery_failed" for e in lines), lines
    assert figures and figures[0] is not None and figures[-1] is None, figures


def test_a_refused_scale_read_is_logged_and_the_wake_goes_on(tmp_path: Path):
    with SleepingEngine() as engine, Api(replicas=1, scale_status=403) as api:
        figures, lines, err = _run(tmp_path, engine, api)
    assert "Traceback" not in err, err
    assert engine.posts[:1] == ["/wake_up"], engine.posts
    assert not [c for c in api.calls if c[0] == "PATCH" and c[1] == SCALE], api.calls
    assert any(e["event"] == "warmstart.standby_scale_failed" for e in lines), lines
    assert 2 in figures, figures


def test_replicas_already_there_are_left_alone(tmp_path: Path):
    """A replacement the HPA already started: no write."""
    with SleepingEngine() as engine, Api(replicas=2) as api:
        _, _, err = _run(tmp_path, engine, api)
    assert "Traceback" not in err, err
    assert [c[0] for c in api.calls if c[1] == SCALE][:1] == ["GET"]
    assert not [c for c in api.calls if c[0] == "PATCH" and c[1] == SCALE], api.calls


def test_the_labels_file_stands_in_for_the_pods_labels(tmp_path: Path):
    """The bench's stand-in for SMG's pod watch (before: `os` was not imported where it is used,
    so every relabel raised NameError and the bench's actuator never woke a sleeper)."""
    from warmstart.podside.standby.observe import Static

    f = tmp_path / "labels.json"
    Static(["http://e0"], str(f)).set_label("http://e0", "asleep")
    assert json.loads(f.read_text()) == {"http://e0": "asleep"}
    scale = tmp_path / "scale.json"
    scale.write_text('{"replicas": 3}')
    s = Static(["http://e0"], "", str(scale))
    assert s.raise_replicas("m", 2) is None and s.raise_replicas("m", 4) == (3, 4)
    assert json.loads(scale.read_text()) == {"replicas": 4}
