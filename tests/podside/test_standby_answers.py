"""The standby actuator against odd answers (issue 39, items 9-11), run as its pod runs it (the
built artifact, `python3 -I -S`) against stand-ins on 127.0.0.1: an engine whose `/is_sleeping`
says something other than a JSON boolean, a garbage status line, a front queue whose `held` is
not a count, a Kubernetes API whose pod list fails. The actuator never exits on one of them: the
engine is left alone that tick (never woken, never put to sleep) and the answer logged, and the
liveness heartbeat keeps turning. Every run is bounded in ticks and in time."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.loopback import LoopbackServer
from tests.support.pod_scripts import artifact
from tests.support.standby_engine import StandInEngine

pytestmark = pytest.mark.servers  # stand-ins and the actuator script

TIMEOUT_S = 60  # the most one bounded run takes on a loaded machine
METRICS = b'vllm:num_requests_waiting{model_name="m"} 0\nvllm:num_requests_running{model_name="m"} 0\n'


class Engine(StandInEngine):
    """A vLLM engine that is up (/health 200) and answers `/is_sleeping` with `sleeping` (raw
    bytes, or None for a garbage status line); records every POST it receives."""

    def __init__(self, sleeping: bytes | None) -> None:
        self.sleeping = sleeping
        super().__init__()

    def is_sleeping_body(self) -> bytes | None:
        return self.sleeping

    def metrics_body(self) -> bytes:
        return METRICS


class Answer(LoopbackServer):
    """Answers every GET with `status` and `body` (a front queue's /warmstart/held, a Kubernetes
    API's pod list); counts the GETs."""

    def __init__(self, body: bytes, status: int = 200) -> None:
        self.gets = 0
        answer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                answer.gets += 1
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._serve(Handler)


def _run(*args: str, env: dict[str, str] | None = None, ticks: int = 6) -> tuple[subprocess.CompletedProcess[str],
                                                                                    list[dict]]:
    proc = subprocess.run([sys.executable, "-I", "-S", str(artifact("standby.pyz")), "--model", "m",
                           "--period", "0.2", "--probe-timeout", "5", "--max-ticks", str(ticks), *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})
    lines = []
    for line in proc.stdout.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pass
    return proc, lines


# What a wrong reading would do: with no standby wanted and one engine to keep awake, an engine
# read as asleep is woken (POST /wake_up), one read as awake is left as it is.
AWAKE_WANTED = ("--standby", "0", "--min-awake", "1")


@pytest.mark.parametrize("answer", [b"[]", b"true", b"null", b'"no"', b'{"is_sleeping": "false"}',
                                    b'{"is_sleeping": null}', b'{"is_sleeping": 1}', b"{}", b"not json", None],
                         ids=["list", "true", "null", "string", "string-false", "key-null", "number", "no-key",
                              "not-json", "garbage-status-line"])
def test_an_unreadable_is_sleeping_leaves_the_engine_alone_and_the_actuator_running(answer):
    with Engine(answer) as engine:
        proc, lines = _run("--engines", engine.base_url, *AWAKE_WANTED)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert engine.posts == [], f"an engine whose answer could not be read was acted on: {engine.posts}"
    unreadable = [e for e in lines if e["event"] == "warmstart.standby_unreadable"]
    assert unreadable and all(e["url"] == engine.base_url and e["reason"] for e in unreadable), lines


def test_a_json_boolean_is_an_answer():
    """The same stand-in with a real answer: asleep is woken, awake is left awake (so the test
    above cannot pass by the actuator acting on nothing)."""
    with Engine(b'{"is_sleeping": true}') as asleep, Engine(b'{"is_sleeping": false}') as awake:
        _run("--engines", asleep.base_url, *AWAKE_WANTED, ticks=3)
        _run("--engines", awake.base_url, *AWAKE_WANTED, ticks=3)
    assert asleep.posts and asleep.posts[0] == "/wake_up", asleep.posts
    assert awake.posts == []


@pytest.mark.parametrize("held", [b'{"held": null}', b'{"held": "3"}', b'{"held": true}', b'{"held": -4}',
                                  b'{"held": 1e400}', b'{"held": 2.5}', b"[]", b"null"],
                         ids=["null", "string", "bool", "negative", "inf", "fraction", "list", "json-null"])
def test_an_odd_held_count_from_a_front_queue_counts_nothing_and_is_logged(held):
    with Engine(b'{"is_sleeping": true}') as engine, Answer(held) as queue:
        # Standby 1, one engine asleep, nothing waiting: nothing to do unless `held` counted.
        proc, lines = _run("--engines", engine.base_url, "--standby", "1", "--min-awake", "0",
                           "--front-queue", queue.base_url)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert queue.gets >= 2 and engine.posts == [], (queue.gets, engine.posts)
    assert any(e["event"] == "warmstart.standby_unreadable" and e["url"] == queue.base_url for e in lines), lines


@pytest.mark.parametrize("status,body,fails", [(500, b"{}", True), (200, b"[]", True), (200, b'{"items": 5}', True),
                                               (200, b'{"items": [{"metadata": null}, 7]}', False),
                                               (200, b"garbage", True)],
                         ids=["500", "list", "items-number", "pods-without-metadata", "not-json"])
def test_the_heartbeat_turns_while_the_pod_list_fails(tmp_path: Path, status, body, fails):
    """The liveness probe restarts an actuator whose heartbeat is older than its bound: an API
    outage must not look like a stuck loop (before: no heartbeat until a pod list answered). A
    list whose pod entries are not pods is a list of no engines, not a failure."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t0ken\n")
    beat = tmp_path / "heartbeat"
    with Answer(body, status) as api:
        stamps: list[str] = []
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.05):
                if beat.exists():
                    text = beat.read_text()
                    if text and (not stamps or stamps[-1] != text):
                        stamps.append(text)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            proc, lines = _run("--selector", "app=m", "--namespace", "ns", "--standby", "1", "--min-awake", "0",
                               "--heartbeat", str(beat), ticks=8,
                               env={"WARMSTART_KUBE_API": api.base_url, "WARMSTART_SA_DIR": str(sa)})
        finally:
            stop.set()
            watcher.join(timeout=5)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert api.gets >= 4, api.gets
    failed = sum(e["event"] == "warmstart.standby_discovery_failed" for e in lines)
    assert failed >= 4 if fails else failed == 0, lines
    assert beat.exists() and len(stamps) >= 2, stamps


def test_a_sample_that_is_not_a_finite_count_counts_nothing():
    """`1e400` reads as an infinity, and ceil(inf / target) engines to wake raised OverflowError."""
    from warmstart.podside.standby.observe import parse_metrics

    text = ('vllm:num_requests_waiting{model_name="m"} 1e400\nvllm:num_requests_waiting{model_name="m"} -3\n'
            'vllm:num_requests_waiting{model_name="m"} 2\nvllm:num_requests_running{model_name="m"} NaN\n')
    assert parse_metrics(text, "m") == (2.0, 0.0)
