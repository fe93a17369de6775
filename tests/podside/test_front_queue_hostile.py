"""The front queue (warmstart/podside/front_queue.py) against hostile and careless clients and a
router that answers badly, over real sockets on 127.0.0.1, the script run as its pod runs it
(tests/podside/front_queue_pod.py). Every wait is bounded; nothing is timed tightly.

What is checked: memory stays under the container's limit with every bound full of the largest
bodies; slow clients are cut at the read deadline and connections are capped; framing the
parser refuses closes the connection so trailing bytes never reach the router; a client that
left is no longer held; a cut answer is cut to the client; every fault is answered, never a
reset; SIGTERM answers what is held."""

from __future__ import annotations

import http.client
import http.server
import json
import re
import signal
import socket
import subprocess
import threading
import time
from contextlib import ExitStack, closing
from pathlib import Path

import pytest

from tests.podside import front_queue_pod
from tests.support.loopback import LoopbackServer
from tests.support.stacks import load_stack_doc, render_doc
from warmstart.decisions import routing
from warmstart.podside import front_queue

pytestmark = [pytest.mark.slow, pytest.mark.servers]  # the script, real sockets

BOUND_S = 30.0


class Router(LoopbackServer):
    """A stand-in router: `/ready` answers 200 while `ready` is set (503 else, or garbage while
    `garbage_ready`); every other request is recorded and echoed, except the paths that answer
    badly: `/cut` (a Content-Length answer cut short), `/cutchunked`, `/garbage` (no status
    line), `/manyheaders` (150 header fields), `/sse` (two events, the second once `sse_go`)."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.garbage_ready = False
        self.sse_go = threading.Event()
        seen = self.seen = []
        router = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _raw(self, data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()
                self.close_connection = True

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/ready":
                    if router.garbage_ready:
                        return self._raw(b"\x00\xffnot http\r\n\r\n")
                    code = 200 if router.ready.is_set() else 503
                    self.send_response(code)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                seen.append((self.command, self.path, body))
                if self.path == "/cut":
                    return self._raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
                if self.path == "/cutchunked":
                    return self._raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n")
                if self.path == "/big":  # 32 MiB, for a client that reads none of it
                    self.send_response(200)
                    self.send_header("Content-Length", str(32 << 20))
                    self.end_headers()
                    try:
                        for _ in range(32):
                            self.wfile.write(b"x" * (1 << 20))
                    except OSError:
                        pass
                    return
                if self.path == "/garbage":
                    return self._raw(b"HTTP/1.1 abc\r\n\r\n")
                if self.path == "/sse":
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for n, event in enumerate((b"data: one\n\n", b"data: two\n\n")):
                        if n:
                            router.sse_go.wait(BOUND_S)
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    return
                data = json.dumps({"method": self.command, "path": self.path, "body": body.decode("latin-1")}).encode()
                self.send_response(200)
                if self.path == "/manyheaders":
                    for i in range(150):
                        self.send_header(f"X-H{i}", "v")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = do_HEAD = _any

        self._serve(H)

    def paths(self) -> list[str]:
        return [p for _, p, _ in self.seen]


class Queue(front_queue_pod.FrontQueue):
    """The script with `args` in front of `router`, on a free port; `stop()` sends SIGTERM and waits."""

    def __init__(self, router: Router, *args: str) -> None:
        super().__init__(router.base_url, router.base_url + "/ready", *args, stderr=subprocess.PIPE)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=BOUND_S)

    def peak_rss_bytes(self) -> int:
        """The process's peak resident set (VmHWM, proc(5)), what the kubelet's memory limit meets."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024


def _read_all(s: socket.socket, timeout: float = BOUND_S) -> bytes:
    """Everything the queue sends until it closes the connection (bounded by `timeout`)."""
    s.settimeout(timeout)
    out = bytearray()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            data = s.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            out += b"<RESET>"
            break
        if not data:
            break
        out += data
    return bytes(out)


def _statuses(data: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"^HTTP/1\.1 (\d{3}) ", data, re.M)]


def _until(check, what: str, timeout_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def _rendered_container() -> dict:
    """The front-queue container of prod's router pod with the model scaled from zero."""
    import tempfile

    doc = load_stack_doc("prod")
    doc["config"]["warmstart:models"][0]["autoscaling"]["minReplicas"] = 0
    rendered = render_doc(doc, Path(tempfile.mkdtemp()), "prod-zero")
    (dep,) = [o for o in rendered.kubernetes_objects
              if o["kind"] == "Deployment" and o["metadata"]["name"] == "qwen-67b-router"]
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "front-queue"]
    return c


def _mib(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2]) * 1024 * 1024


# ---- 1. memory ------------------------------------------------------------------------------


def test_every_bound_full_of_the_largest_bodies_stays_under_the_containers_memory_limit():
    """The rendered container's own bounds (its args, its memory limit): with no engine, the byte
    budget filled with 64 MiB bodies, the count bound filled, and every other connection sending
    the largest head it may, the process's peak RSS stays under the limit. A body that does not
    fit is refused 429 with Retry-After from its headers, before it is sent."""
    container = _rendered_container()
    limit = _mib(container["resources"]["limits"]["memory"])
    cmd = container["command"]
    arg = {cmd[i]: cmd[i + 1] for i in range(2, len(cmd) - 1) if cmd[i].startswith("--")}
    max_held, max_conns = int(arg["--max-held"]), int(arg["--max-connections"])
    budget = int(arg["--max-held-bytes"])
    fits = budget // front_queue.MAX_BODY_BYTES
    assert fits >= 1 and max_held + 4 <= max_conns, "the bounds this test fills"
    keep = [a for k in ("--max-held", "--max-held-bytes", "--max-connections", "--read-timeout-seconds",
                        "--max-hold-seconds", "--retry-after") for a in (k, arg[k])]
    small = b'{"prompt": "hi"}'
    # Bodies that fill the byte budget exactly once the count bound is full: 64 MiB ones, the last
    # a little shorter to leave room for the small ones.
    sizes = [front_queue.MAX_BODY_BYTES] * (fits - 1)
    sizes.append(budget - sum(sizes) - (max_held - fits) * len(small))
    assert 0 < sizes[-1] <= front_queue.MAX_BODY_BYTES
    with ExitStack() as stack:
        router = stack.enter_context(Router())
        q = Queue(router, *keep)
        stack.callback(q.stop)
        socks: list[socket.socket] = []
        stack.callback(lambda: [s.close() for s in socks])

        def post(size: int, body: bool = True) -> socket.socket:
            s = q.connect()
            socks.append(s)
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {size}\r\n\r\n".encode())
            if body:
                s.sendall(b"x" * size)
            return s

        for size in sizes:
            post(size)
        _until(lambda: q.held()["held"] == fits, f"{fits} of the largest bodies held")
        # The next one is refused from its headers alone: its body is never sent.
        refused = _read_all(post(front_queue.MAX_BODY_BYTES, body=False), 15)
        assert _statuses(refused) == [429] and f"Retry-After: {arg['--retry-after']}".lower().encode() in refused.lower()
        # The count bound, filled with small requests.
        for _ in range(max_held - fits):
            s = q.connect()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: q\r\nContent-Length: %d\r\n\r\n%s" % (len(small), small))
            socks.append(s)
        _until(lambda: q.held()["held"] == max_held, "the count bound full")
        assert q.held()["body_bytes"] == budget
        # Every other connection the cap allows sends a head just under the limit, unfinished.
        filler = b"GET / HTTP/1.1\r\nHost: q\r\n" + b"".join(b"X-F%d: %s\r\n" % (i, b"v" * 1000) for i in range(30))
        assert len(filler) < front_queue.MAX_HEAD_BYTES
        for _ in range(max_conns - len(socks) - 2):
            s = q.connect()
            s.sendall(filler)
            socks.append(s)
        time.sleep(2)  # the queue reads what was sent
        peak = q.peak_rss_bytes()
        print(f"front queue peak RSS with every bound full: {peak / 2**20:.0f} MiB of {limit / 2**20:.0f} MiB")
        assert peak < limit, f"peak RSS {peak / 2**20:.0f} MiB over the container's {limit / 2**20:.0f} MiB"
        assert q.proc.poll() is None


# ---- 2. slow clients, the connection cap ------------------------------------------------------


def test_slow_clients_meet_the_read_deadline_and_connections_are_capped():
    with ExitStack() as stack:
        router = stack.enter_context(Router())
        router.ready.set()
        q = Queue(router, "--read-timeout-seconds", "2", "--max-connections", "3")
        stack.callback(q.stop)
        time.sleep(1)  # the start-up check's own connection closed
        half_head, short_body, idle = q.connect(), q.connect(), q.connect()
        for s in (half_head, short_body, idle):
            stack.callback(s.close)
        half_head.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: q\r\n")
        short_body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: q\r\nContent-Length: 100\r\n\r\n0123456789")
        time.sleep(0.5)
        # The cap: a fourth connection is answered 503 with Retry-After and closed.
        over = q.connect()
        stack.callback(over.close)
        over_answer = _read_all(over, 15)
        assert _statuses(over_answer) == [503] and b"retry-after:" in over_answer.lower(), over_answer
        # Each slow one is cut at the deadline: a partial request answered 408, an idle one closed.
        assert _statuses(_read_all(half_head, 15)) == [408]
        assert _statuses(_read_all(short_body, 15)) == [408]
        assert _read_all(idle, 15) == b""
        assert router.paths() == [], "nothing half-received was forwarded"
        # The slots are free again once the clients closed.
        for s in (half_head, short_body, idle, over):
            s.close()
        _until(lambda: q.held().get("held") == 0, "a connection served again")


# ---- 3, 4. framing the parser refuses; nothing after it is read as a request ----------------

SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: q\r\n\r\n"


@pytest.mark.parametrize("request_bytes", [
    pytest.param(b"POST /a HTTP/1.1\r\nHost: q\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", id="chunk-size-minus-1"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: q\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n", id="chunk-0x5"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: q\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n", id="chunk-plus5"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: q\r\nTransfer-Encoding: chunked\r\n\r\n0_5\r\nhello\r\n0\r\n\r\n", id="chunk-0_5"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: q\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                 id="content-length-and-chunked"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: q\r\nTransfer-Encoding: gzip\r\n\r\n", id="transfer-encoding-gzip"),
    pytest.param(b"POST /a HTTP/1.1\r\nHost: q\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n", id="two-content-lengths"),
    pytest.param(b"GET /a HTTP/1.1\r\nHost: q\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", id="upgrade"),
    pytest.param(b"GET /a b c\r\n\r\n", id="bad-request-line"),
    pytest.param("GET /caf\u00e9 HTTP/1.1\r\nHost: q\r\n\r\n".encode(), id="non-ascii-path"),
])
def test_refused_framing_is_answered_and_the_connection_closed(request_bytes):
    """Each is answered (4xx/5xx), the connection is then closed, and the request pipelined after
    it never reaches the router: no request smuggling behind a proxy that reuses connections."""
    with ExitStack() as stack:
        router = stack.enter_context(Router())
        router.ready.set()
        q = Queue(router)
        stack.callback(q.stop)
        with closing(q.connect()) as s:
            s.sendall(request_bytes + SMUGGLED)
            answer = _read_all(s, 15)
        statuses = _statuses(answer)
        assert len(statuses) == 1 and 400 <= statuses[0] < 600, answer
        assert b"<RESET>" not in answer
        assert "/smuggled" not in router.paths() and "/a" not in router.paths(), router.paths()
        assert q.proc.poll() is None


def test_oversize_lines_get_414_and_431_and_pipelined_requests_are_answered_in_order():
    with ExitStack() as stack:
        router = stack.enter_context(Router())
        router.ready.set()
        q = Queue(router)
        stack.callback(q.stop)
        with closing(q.connect()) as s:
            s.sendall(b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: q\r\n\r\n")
            assert _statuses(_read_all(s, 15)) == [414]
        with closing(q.connect()) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: q\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(150)) + b"\r\n")
            assert _statuses(_read_all(s, 15)) == [431]
        with closing(q.connect()) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: q\r\nX: " + b"v" * 70000 + b"\r\n\r\n")
            assert _statuses(_read_all(s, 15)) == [431]
        with closing(q.connect()) as s:
            s.sendall(b"".join(b"GET /p%d HTTP/1.1\r\nHost: q\r\n\r\n" % i for i in range(3))
                      + b"GET /p3 HTTP/1.1\r\nHost: q\r\nConnection: close\r\n\r\n")
            answer = _read_all(s, 15)
        assert re.findall(rb'"path": "(/p\d)"', answer) == [b"/p0", b"/p1", b"/p2", b"/p3"], answer


# ---- 5. a client that left -------------------------------------------------------------------


def test_a_held_client_that_left_is_no_longer_held_and_never_forwarded():
    with ExitStack() as stack:
        router = stack.enter_context(Router())
        q = Queue(router, "--max-held", "1", "--max-hold-seconds", "60")
        stack.callback(q.stop)
        s = q.connect()
        s.sendall(b"POST /v1/gone HTTP/1.1\r\nHost: q\r\nContent-Length: 2\r\n\r\n{}")
        _until(lambda: q.held()["held"] == 1, "held")
        s.close()
        _until(lambda: q.held()["held"] == 0, "the client that left no longer held")
        # Its slot is free: a live client is held, not refused.
        live = q.connect()
        stack.callback(live.close)
        live.sendall(b"POST /v1/live HTTP/1.1\r\nHost: q\r\nContent-Length: 2\r\n\r\n{}")
        _until(lambda: q.held()["held"] == 1, "the live client held")
        router.ready.set()
        live.settimeout(BOUND_S)
        assert live.recv(12) == b"HTTP/1.1 200"
        _until(lambda: "/v1/live" in router.paths(), "the live request forwarded")
        time.sleep(1)
        assert router.paths() == ["/v1/live"], "the request of the client that left never ran"
        assert q.held()["refused"] == 0


# ---- 6, 7. the router's bad answers ----------------------------------------------------------


def test_an_answer_cut_short_is_never_a_complete_answer_to_the_client():
    with ExitStack() as stack:
        router = stack.enter_context(Router())
        router.ready.set()
        q = Queue(router)
        stack.callback(q.stop)
        for path in ("/cut", "/cutchunked"):
            conn = http.client.HTTPConnection("127.0.0.1", q.port, timeout=BOUND_S)
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                with pytest.raises(http.client.IncompleteRead):
                    resp.read()
            finally:
                conn.close()


def test_every_bad_answer_of_the_router_is_answered_to_the_client():
    """A malformed status line (502), more than 100 header fields (502), a readiness answer
    that is not HTTP (not ready: held, then 429 at the hold bound), a non-ASCII path (400)."""
    with ExitStack() as stack:
        router = stack.enter_context(Router())
        router.ready.set()
        q = Queue(router, "--max-hold-seconds", "2", "--retry-after", "4")
        stack.callback(q.stop)
        conn = http.client.HTTPConnection("127.0.0.1", q.port, timeout=BOUND_S)
        conn.request("GET", "/garbage")
        resp = conn.getresponse()
        assert resp.status == 502 and "not retried" in json.loads(resp.read())["error"]["message"]
        conn.request("GET", "/manyheaders")
        resp = conn.getresponse()
        assert resp.status == 502
        resp.read()
        conn.close()
        assert router.paths().count("/garbage") == 1, "sent once, never again"
        router.garbage_ready = True
        time.sleep(0.5)
        conn = http.client.HTTPConnection("127.0.0.1", q.port, timeout=BOUND_S)
        conn.request("POST", "/v1/held", body=b"{}")
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("Retry-After")) == (429, "4")
        conn.close()
        assert q.proc.poll() is None


def test_server_sent_events_are_streamed_not_buffered():
    with ExitStack() as stack:
        router = stack.enter_context(Router())
        router.ready.set()
        q = Queue(router)
        stack.callback(q.stop)
        conn = http.client.HTTPConnection("127.0.0.1", q.port, timeout=BOUND_S)
        stack.callback(conn.close)
        conn.request("GET", "/sse")
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.read1(64) == b"data: one\n\n", "the first event arrives before the router sends the second"
        router.sse_go.set()
        assert resp.read() == b"data: two\n\n"


# ---- 8. SIGTERM ------------------------------------------------------------------------------


def test_sigterm_answers_every_held_request_503_with_retry_after_and_exits():
    with ExitStack() as stack:
        router = stack.enter_context(Router())
        q = Queue(router, "--max-hold-seconds", "60")
        stack.callback(q.stop)
        socks = [q.connect() for _ in range(3)]
        for s in socks:
            stack.callback(s.close)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: q\r\nContent-Length: 2\r\n\r\n{}")
        _until(lambda: q.held()["held"] == 3, "three held")
        q.proc.send_signal(signal.SIGTERM)
        for s in socks:
            answer = _read_all(s, 15)
            assert _statuses(answer) == [503] and re.search(rb"(?i)retry-after: \d+", answer), answer
        assert q.proc.wait(timeout=15) == 0
        assert router.paths() == []


def test_a_body_past_the_byte_budget_is_refused_before_it_is_read_or_as_its_chunks_pass_it():
    """`Expect: 100-continue` with a Content-Length past the budget: 429 at once, no 100 Continue
    (the client never sends the body); within it, 100 Continue. A chunked body is counted as it
    comes: past the budget, 429 with Retry-After, and the connection closed."""
    with ExitStack() as stack:
        router = stack.enter_context(Router())
        q = Queue(router, "--max-held-bytes", "1000", "--retry-after", "6", "--max-hold-seconds", "30")
        stack.callback(q.stop)
        with closing(q.connect()) as s:
            s.sendall(b"POST /v1/big HTTP/1.1\r\nHost: q\r\nExpect: 100-continue\r\nContent-Length: 2000\r\n\r\n")
            answer = _read_all(s, 15)
        assert _statuses(answer) == [429] and b"retry-after: 6" in answer.lower(), answer
        with closing(q.connect()) as s:
            s.sendall(b"POST /v1/small HTTP/1.1\r\nHost: q\r\nExpect: 100-continue\r\nContent-Length: 500\r\n\r\n")
            s.settimeout(15)
            assert s.recv(64).startswith(b"HTTP/1.1 100 ")
        with closing(q.connect()) as s:
            s.sendall(b"POST /v1/chunked HTTP/1.1\r\nHost: q\r\nTransfer-Encoding: chunked\r\n\r\n"
                      + b"".join(b"190\r\n" + b"x" * 400 + b"\r\n" for _ in range(3)) + b"0\r\n\r\n")
            answer = _read_all(s, 15)
        assert _statuses(answer) == [429] and b"retry-after: 6" in answer.lower(), answer
        _until(lambda: q.held()["body_bytes"] == 0, "no body bytes left counted")
        assert router.paths() == []


def test_a_client_that_reads_none_of_its_answer_is_cut_at_the_deadline():
    """The router streams 32 MiB to a client that never reads: the queue buffers at most its
    socket's high-water mark, cuts the client after the read deadline without progress, and
    closes the router's connection (the request is no longer in flight)."""
    with ExitStack() as stack:
        router = stack.enter_context(Router())
        router.ready.set()
        q = Queue(router, "--read-timeout-seconds", "2")
        stack.callback(q.stop)
        s = q.connect()
        stack.callback(s.close)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /big HTTP/1.1\r\nHost: q\r\n\r\n")
        _until(lambda: q.held()["in_flight"] == 1, "the answer streaming")
        _until(lambda: q.held()["in_flight"] == 0, "the stalled client cut", timeout_s=60)
        assert q.peak_rss_bytes() < 100 << 20, "the answer was not buffered whole"
