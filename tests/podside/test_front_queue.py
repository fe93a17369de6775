"""The front queue (warmstart/podside/front_queue.py) run as its pod would run it, in front of the
real SMG router with no engine yet and a fake engine that comes up later: requests are held and
answered once the router has an engine; past either bound a client gets 429 with Retry-After,
never a reset or a bare 503. Bounded waits only; nothing is timed."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.podside import front_queue_pod
from tests.routing.fake_vllm import MODEL, FakeVllm
from tests.routing.router import SmgRouter, write_discovery_file
from tests.support.loopback import LoopbackServer
from warmstart.decisions import autoscaling, routing
from warmstart.podside import front_queue

pytestmark = [pytest.mark.slow, pytest.mark.servers]  # the real smg router, the script

# The script as its pod runs it: Queue(upstream, ready_url, *args).
Queue = front_queue_pod.FrontQueue


def _chat(url: str, out: list, timeout: float = 60.0) -> None:
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out.append((r.status, json.loads(r.read())["choices"][0]["message"]["content"], None))
    except urllib.error.HTTPError as e:
        out.append((e.code, e.read().decode(), e.headers.get("Retry-After")))


def _until(check, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def _router(stack: ExitStack, manifest: Path) -> SmgRouter:
    write_discovery_file(manifest, [])
    return stack.enter_context(SmgRouter([*routing.policy_flags("prefix_hash"), "--discovery-provider", "file",
                                          "--discovery-file", str(manifest), "--discovery-check-interval-secs", "1"]))


def test_requests_are_held_until_an_engine_serves_then_answered(tmp_path):
    with ExitStack() as stack:
        manifest = tmp_path / "w.json"
        r = _router(stack, manifest)
        q = Queue(r.url, f"http://127.0.0.1:{r.probe_port}/readiness", "--max-held", "16",
                  "--max-hold-seconds", "60", "--retry-after", "7")
        stack.callback(q.stop)
        # The router alone refuses: this is what a client would get without the queue.
        assert r.call("POST", "/v1/chat/completions", {"model": MODEL, "max_tokens": 1, "messages": [
            {"role": "user", "content": "hi"}]})[0] == 404
        out: list = []
        threads = [threading.Thread(target=_chat, args=(q.url, out), daemon=True) for _ in range(5)]
        for t in threads:
            t.start()
        _until(lambda: q.held()["held"] == 5, "five requests held")
        assert out == [], "nothing answered while no engine exists"
        engine = stack.enter_context(FakeVllm("late"))
        write_discovery_file(manifest, [engine.url])
        for t in threads:
            t.join(60)
        assert [(s, by) for s, by, _ in out] == [(200, "late")] * 5, out
        assert q.held() == {"held": 0, "in_flight": 0, "demand": 0, "total_held": 5, "refused": 0,
                            "body_bytes": 0}


def test_past_the_bounds_a_client_gets_429_with_retry_after(tmp_path):
    with ExitStack() as stack:
        r = _router(stack, tmp_path / "w.json")
        q = Queue(r.url, f"http://127.0.0.1:{r.probe_port}/readiness", "--max-held", "2",
                  "--max-hold-seconds", "2", "--retry-after", "9")
        stack.callback(q.stop)
        out: list = []
        threads = [threading.Thread(target=_chat, args=(q.url, out), daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(out) == 4 and all(s == 429 and ra == "9" for s, _, ra in out), out
        assert q.held()["refused"] == 4, "two over the count at once, two past the hold time"


def _demand(q: Queue) -> float:
    """The value KEDA's metrics-api scaler takes from the held endpoint: the JSON number at its
    `valueLocation` (a top-level GJSON path here), as `getValueFromJSONResponse` requires."""
    value = q.held()[autoscaling.FRONT_QUEUE_VALUE_LOCATION]
    assert isinstance(value, (int, float)) and not isinstance(value, bool)
    return value


def test_an_engine_ready_late_answers_the_held_and_the_over_bound_get_429(tmp_path):
    """Zero pods: the upstream's readiness fails until the engine is up. The first three requests
    are held (KEDA reads them as demand) and answered once it is; the two past the count bound get
    429 with the Retry-After given, at once."""
    with ExitStack() as stack:
        engine = stack.enter_context(FakeVllm("cold"))
        engine.set_healthy(False)  # a replica still starting: not ready
        q = Queue(engine.url, engine.url + "/health", "--max-held", "3", "--max-hold-seconds", "60",
                  "--retry-after", "283")
        stack.callback(q.stop)
        assert _demand(q) == 0
        out: list = []
        threads = [threading.Thread(target=_chat, args=(q.url, out), daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        _until(lambda: q.held()["held"] == 3, "three requests held")
        assert _demand(q) == 3 and out == []
        over = []
        late = [threading.Thread(target=_chat, args=(q.url, over), daemon=True) for _ in range(2)]
        for t in late:
            t.start()
        for t in late:
            t.join(30)
        assert [(s, ra) for s, _, ra in over] == [(429, "283")] * 2, over
        assert all(json.loads(body)["error"]["code"] == 429 for _, body, _ in over)
        engine.set_healthy(True)
        for t in threads:
            t.join(60)
        assert [(s, by) for s, by, _ in out] == [(200, "cold")] * 3, out
        assert q.held() == {"held": 0, "in_flight": 0, "demand": 0, "total_held": 3, "refused": 2,
                            "body_bytes": 0}


def test_a_request_being_answered_counts_as_demand_not_as_held():
    """KEDA keeps the last replica while a request is in flight (demand > 0), not only while one
    is held; the standby actuator's `held` does not count it as waiting."""
    with ExitStack() as stack:
        engine = stack.enter_context(FakeVllm("slow"))
        engine.set_delay(3000)
        q = Queue(engine.url, engine.url + "/health", "--retry-after", "5")
        stack.callback(q.stop)
        out: list = []
        t = threading.Thread(target=_chat, args=(q.url, out), daemon=True)
        t.start()
        _until(lambda: q.held()["in_flight"] == 1, "the request forwarded", timeout_s=10)
        counts = q.held()
        assert counts["held"] == 0 and _demand(q) == 1, counts
        t.join(30)
        assert [s for s, _, _ in out] == [200] and _demand(q) == 0


class Upstream(LoopbackServer):
    """A stand-in router that records each request (method, path, body) and answers with them,
    or, for a path under /drop, reads the request and closes the connection unanswered (a router
    that died mid-request). `/ready` answers 200."""

    def __init__(self) -> None:
        import http.server

        seen = self.seen = []

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/ready":
                    data = b"{}"
                else:
                    seen.append((self.command, self.path, body))
                    if self.path.startswith("/drop"):
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    data = json.dumps({"method": self.command, "path": self.path, "body": body.decode()}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = _any

        self._serve(H)


def _send(url: str, method: str, path: str, body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    import http.client
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        if headers and headers.get("Transfer-Encoding") == "chunked":
            conn.putrequest(method, path)
            for k, v in headers.items():
                conn.putheader(k, v)
            conn.endheaders()
            for part in (body[:5], body[5:]):
                conn.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            conn.send(b"0\r\n\r\n")
        else:
            conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_every_method_and_a_chunked_body_pass_through():
    """The OpenAI API's DELETE and GET by id, and a body sent chunked, reach the router as sent."""
    with ExitStack() as stack:
        up = stack.enter_context(Upstream())
        q = Queue(up.base_url, up.base_url + "/ready")
        stack.callback(q.stop)
        for method, path in (("DELETE", "/v1/responses/resp_1"), ("GET", "/v1/models"), ("PUT", "/x"),
                             ("PATCH", "/y")):
            status, body = _send(q.url, method, path)
            assert status == 200 and json.loads(body)["method"] == method, (method, body)
        status, body = _send(q.url, "HEAD", "/v1/models")
        assert status == 200 and body == b""
        payload = b'{"model": "m", "prompt": "chunked"}'
        status, body = _send(q.url, "POST", "/v1/completions", payload,
                             {"Transfer-Encoding": "chunked", "Content-Type": "application/json"})
        assert status == 200 and json.loads(body)["body"] == payload.decode()
        assert [(m, p) for m, p, _ in up.seen] == [("DELETE", "/v1/responses/resp_1"), ("GET", "/v1/models"),
                                                   ("PUT", "/x"), ("PATCH", "/y"), ("HEAD", "/v1/models"),
                                                   ("POST", "/v1/completions")]
        status, body = _send(q.url, "GET", "/v1/realtime", headers={"Upgrade": "websocket", "Connection": "Upgrade"})
        assert status == 501 and len(up.seen) == 6, "a protocol switch is refused, not half-carried"


def test_a_request_the_router_may_have_run_is_never_sent_twice():
    """The router read the request and died before answering: the client gets 502, and the
    router saw it once (a held-and-retried completion would run twice)."""
    with ExitStack() as stack:
        up = stack.enter_context(Upstream())
        q = Queue(up.base_url, up.base_url + "/ready", "--max-hold-seconds", "10")
        stack.callback(q.stop)
        status, body = _send(q.url, "POST", "/drop/v1/completions", b'{"prompt": "once"}',
                             {"Content-Type": "application/json"})
        assert status == 502 and "not retried" in json.loads(body)["error"]["message"], body
        assert [p for _, p, _ in up.seen] == ["/drop/v1/completions"]
        assert q.held()["in_flight"] == 0
