"""Front queue: holds requests while a model has no awake engine, bounded in requests and bytes.

Scale from zero drops nothing only if something holds the requests that arrive while no engine
can serve them. SMG does not: with no worker it answers `404 model_not_found` ("No worker
available for model"), seen by running SMG 1.13.0, and its `--queue-size` queues only when its
rate-limit tokens run out. llm-d's Flow Control holds requests at zero replicas the same way this
does (llm-d/llm-d PR #1192).

Every request is forwarded to `--upstream` (the model's router) once `--ready-url` (the router's
`/readiness`: ready once one engine is) answers 200. Until then it is held, at most `--max-held`
requests for at most `--max-hold-seconds` each, their bodies together at most `--max-held-bytes`;
a request past a bound gets `429 Too Many Requests` with `Retry-After: --retry-after` (the
predicted seconds until an engine is ready,
https://www.rfc-editor.org/rfc/rfc9110#field.retry-after), never a reset or a bare 503, and a body
that cannot fit is refused from its headers, before it is read. A forward whose connection is
refused, or that is answered 503 (an engine that went to sleep between the check and the request:
vLLM's `RetryableRequestError` is "safe for clients to retry", `vllm/exceptions.py`), is held and
retried the same way; one that failed after it was sent is answered 502 and never sent twice.
Every method is passed on (the OpenAI API's DELETEs included), each response streamed through as
the upstream sends it (server-sent events included); an answer the upstream cut short is cut short
to the client too, never completed.

HTTP/1.1 is read and written by h11 (https://github.com/python-hyper/h11, pinned in pyproject.toml
and shipped with this script), both towards clients and towards the router: its parser refuses
ambiguous framing (two Content-Lengths, a chunk size of `-1`, `0x5` or `+5`, a transfer coding
other than chunked) where a hand-written one lets leftover bytes become a second request. A
request with both Content-Length and Transfer-Encoding is refused here too (RFC 9112 section 6.1:
a server "MAY reject" it and "MUST close the connection" after answering), and every refusal
closes its connection, so no byte after a refused request is ever read as a request.

One asyncio loop serves every connection: `--max-connections` are open at most (one more is
answered 503 with Retry-After and closed), a client gets `--read-timeout-seconds` to send each
whole request once its first byte came (and as long idle between requests; a partial request is
answered 408), and a client that reads nothing of its answer for as long is cut. A held client
that goes away is dropped: it no longer counts as held, and is never forwarded. SIGTERM (a router
pod rolled) answers every held request 503 with `Retry-After: 1`, so the client retries on
another router pod at once, lets the forwarded ones finish, and exits when none is left.

`GET /warmstart/held` answers `{"held": H, "in_flight": F, "demand": H + F, ...}`, JSON that
KEDA's `metrics-api` scaler reads by its `valueLocation` (a GJSON path, `getValueFromJSONResponse`
in https://github.com/kedacore/keda/blob/v2.20.2/pkg/scalers/metrics_api_scaler.go). `held`: the
requests waiting for an engine; the standby actuator counts them as waiting, so a held request
wakes a sleeper. `demand` adds the requests forwarded and not yet answered: a model scaled to zero
pods is activated by KEDA when it is above 0, and kept from going back to zero while any request
is held or still being answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
import urllib.parse

import h11

HELD_PATH = "/warmstart/held"
MAX_BODY_BYTES = 64 * 1024 * 1024
# A request line past this is answered 414, a head (line and headers) past MAX_HEAD_BYTES or with
# more than MAX_HEADERS fields 431: nginx's `large_client_header_buffers` default is 4 x 8k
# (https://nginx.org/en/docs/http/ngx_http_core_module.html#large_client_header_buffers).
MAX_LINE_BYTES = 8 * 1024
MAX_HEAD_BYTES = 32 * 1024
MAX_HEADERS = 100
# Bytes read from a socket at once; with the stream reader's limit this bounds what one connection
# buffers besides its body (the reader pauses the socket past twice its limit, asyncio/streams.py).
READ_BYTES = 16 * 1024
# The router's answer head (its headers) may be this long.
MAX_UPSTREAM_HEAD_BYTES = 64 * 1024
# Longest wait for the router's next bytes (per read, not per request): a streamed answer keeps
# sending; a generation that sends nothing for this long is cut.
UPSTREAM_TIMEOUT_S = 600
CONNECT_TIMEOUT_S = 5
READY_TIMEOUT_S = 2
# After answering a request whose body is left unread, the connection's input is read and thrown
# away this long before it is closed, so the client reads the answer instead of a reset (a socket
# closed with unread input sends RST, RFC 9112 section 9.6 "tear-down").
LINGER_S = 2.0
# Over-cap connections lingering at once; past this one is closed at once.
MAX_LINGERING = 64
# A held request's Retry-After when the pod stops: another router pod can take it now.
STOP_RETRY_AFTER_S = 1
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection", b"te",
              b"trailer", b"trailers", b"transfer-encoding", b"upgrade", b"content-length", b"host", b"expect"}


class Gone(Exception):
    """The client closed its connection (or it broke) before its answer."""


class Cut(Exception):
    """The answer was started and cannot be completed: the client's connection is closed unfinished."""


def _error(message: str, kind: str, code: int | None = None) -> bytes:
    err: dict[str, object] = {"message": message, "type": kind}
    if code is not None:
        err["code"] = code
    return json.dumps({"error": err}).encode()


def _connection_named(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    """The fields `Connection` names, hop-by-hop too (RFC 9110 section 7.6.1)."""
    return {n.strip().lower() for k, v in headers if k == b"connection" for n in v.split(b",")}


class Gate:
    """What is held (requests and body bytes), what is forwarded, and whether the upstream is
    ready (checked at most every `period` seconds, one check shared by every waiting request)."""

    def __init__(self, ready_url: str, max_held: int, max_bytes: int, period: float = 0.2) -> None:
        self.ready_url, self.max_held, self.max_bytes, self.period = ready_url, max_held, max_bytes, period
        self.held = self.in_flight = self.total_held = self.refused = self.body_bytes = 0
        self._ready, self._checked = False, float("-inf")
        self._check: asyncio.Future[bool] | None = None
        self.stopping = asyncio.Event()

    async def ready(self) -> bool:
        if time.monotonic() - self._checked < self.period:
            return self._ready
        if self._check is None or self._check.done():
            self._checked = time.monotonic()
            self._check = asyncio.ensure_future(self._probe())
        return await asyncio.shield(self._check)

    async def _probe(self) -> bool:
        try:
            status = await asyncio.wait_for(_status_of(self.ready_url), READY_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, h11.ProtocolError, ValueError):
            status = 0  # no answer, or not HTTP: not ready, never an error to a client
        self._ready = status == 200
        return self._ready

    def reserve(self, n: int) -> bool:
        """Count `n` more body bytes in memory, if they fit the budget."""
        if self.body_bytes + n > self.max_bytes:
            return False
        self.body_bytes += n
        return True

    def enter(self) -> bool:
        if self.held >= self.max_held:
            return False
        self.held += 1
        self.total_held += 1
        return True

    def counts(self) -> dict[str, int]:
        return {"held": self.held, "in_flight": self.in_flight, "demand": self.held + self.in_flight,
                "total_held": self.total_held, "refused": self.refused, "body_bytes": self.body_bytes}


class Upstream:
    """One request to the router over its own connection, framed by h11 as a client."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_UPSTREAM_HEAD_BYTES)

    @classmethod
    async def open(cls, host: str, port: int) -> Upstream:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=READ_BYTES), CONNECT_TIMEOUT_S)
        return cls(reader, writer)

    async def send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            self.writer.write(data)
            await asyncio.wait_for(self.writer.drain(), UPSTREAM_TIMEOUT_S)

    async def next_event(self) -> h11.Event:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            # b"" (the router closed) makes h11 raise on a message left incomplete.
            self.conn.receive_data(await asyncio.wait_for(self.reader.read(READ_BYTES), UPSTREAM_TIMEOUT_S))

    async def response(self) -> h11.Response:
        while True:
            event = await self.next_event()
            if isinstance(event, h11.Response):
                return event
            if not isinstance(event, h11.InformationalResponse):  # a 100 Continue is not the answer
                raise h11.RemoteProtocolError(f"unexpected {type(event).__name__} from the router")

    def close(self) -> None:
        self.writer.close()


async def _status_of(url: str) -> int:
    u = urllib.parse.urlsplit(url)
    up = await Upstream.open(u.hostname or "127.0.0.1", u.port or 80)
    try:
        await up.send(h11.Request(method="GET", target=(u.path or "/") + (f"?{u.query}" if u.query else ""),
                                  headers=[("Host", u.netloc), ("Connection", "close")]))
        await up.send(h11.EndOfMessage())
        return (await up.response()).status_code
    finally:
        up.close()


class Body:
    """A request's body as received (kept until it cannot be sent again) and the bytes it holds
    against the gate's budget."""

    def __init__(self, gate: Gate) -> None:
        self.gate, self.parts, self.size = gate, [], 0

    def add(self, data: bytes) -> bool:
        if not self.gate.reserve(len(data)):
            return False
        self.parts.append(data)
        self.size += len(data)
        return True

    def drop(self) -> None:
        self.gate.body_bytes -= self.size
        self.parts, self.size = [], 0


class Client:
    """One client connection: its requests read by h11 one at a time and answered in order."""

    def __init__(self, app: App, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.app, self.reader, self.writer = app, reader, writer
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.idle = False  # waiting for a request's first byte: closed at once on SIGTERM
        self.deadline: float | None = None  # when the request being read must be whole
        self._watch: asyncio.Future[bytes] | None = None
        self._watching = True

    # ---- reading ----------------------------------------------------------------------------
    async def _fill(self, timeout: float) -> None:
        try:
            data = await asyncio.wait_for(self.reader.read(READ_BYTES), max(timeout, 0.001))
        except asyncio.TimeoutError:
            raise  # (a subclass of OSError since Python 3.11)
        except (ConnectionError, OSError):
            data = b""
        self.conn.receive_data(data)

    async def next_event(self) -> h11.Event:
        """The next event of the client's request, within the read deadline (asyncio.TimeoutError
        past it)."""
        read_s = self.app.read_timeout_s
        if self.deadline is None and (self.conn.their_state is not h11.IDLE or self.conn.trailing_data[0]):
            self.deadline = time.monotonic() + read_s
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            if self.deadline is None:
                self.idle = True
                try:
                    await self._fill(read_s)
                finally:
                    self.idle = False
                self.deadline = time.monotonic() + read_s
            else:
                await self._fill(self.deadline - time.monotonic())
            if self.app.gate.stopping.is_set() and self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
                return h11.ConnectionClosed()

    async def _watch_once(self, timeout: float) -> None:
        """Wait up to `timeout` (or SIGTERM) while reading the client's connection: raise Gone when
        it is closed. Bytes it sends meanwhile (a pipelined request) are handed to h11 unparsed,
        up to one head's worth; past that it is no longer watched (the socket's backpressure)."""
        if not self._watching:
            await asyncio.wait([asyncio.ensure_future(self.app.gate.stopping.wait())], timeout=timeout)
            return
        if self._watch is None:
            self._watch = asyncio.ensure_future(self.reader.read(READ_BYTES))
        stop = asyncio.ensure_future(self.app.gate.stopping.wait())
        try:
            await asyncio.wait([self._watch, stop], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        self._take_watch()

    def _take_watch(self) -> None:
        if self._watch is None or not self._watch.done():
            return
        watch, self._watch = self._watch, None
        data = b"" if watch.cancelled() or watch.exception() else watch.result()
        if not data:
            raise Gone
        self.conn.receive_data(data)
        self._watching = len(self.conn.trailing_data[0]) <= MAX_HEAD_BYTES

    async def _end_watch(self) -> None:
        if self._watch is not None and not self._watch.done():
            self._watch.cancel()
            try:
                await self._watch
            except (asyncio.CancelledError, ConnectionError, OSError):
                pass
        if self._watch is not None and self._watch.done() and not self._watch.cancelled():
            try:
                self._take_watch()
            except Gone:
                self.conn.receive_data(b"")
        self._watch = None

    async def unless_gone(self, aw):  # type: ignore[no-untyped-def]
        """`aw`'s result, or Gone (and `aw` cancelled) if the client leaves first."""
        task = asyncio.ensure_future(aw)
        try:
            while not task.done():
                if self._watching and self._watch is None:
                    self._watch = asyncio.ensure_future(self.reader.read(READ_BYTES))
                waits = [task, *([self._watch] if self._watching and self._watch else [])]
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                self._take_watch()
            return task.result()
        finally:
            if not task.done():
                task.cancel()

    # ---- writing ----------------------------------------------------------------------------
    async def send(self, event: h11.Event) -> None:
        data = self.conn.send(event)
        if data:
            self.writer.write(data)
            try:
                # A client that takes none of its answer for the read deadline is cut.
                await asyncio.wait_for(self.writer.drain(), self.app.read_timeout_s)
            except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
                raise Gone from exc

    async def answer(self, status: int, body: bytes, headers: list[tuple[str, str]] | None = None,
                     close: bool = False) -> None:
        if self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            raise Cut
        hs = [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *(headers or [])]
        if close or self.app.gate.stopping.is_set():
            hs.append(("Connection", "close"))
        await self.send(h11.Response(status_code=status, headers=hs))
        await self.send(h11.Data(data=body))
        await self.send(h11.EndOfMessage())

    async def too_many(self, why: str, close: bool = False) -> None:
        self.app.gate.refused += 1
        ra = self.app.retry_after_s
        await self.answer(429, _error(f"no engine is ready yet ({why}); retry after {ra} s", "rate_limit_error", 429),
                          [("Retry-After", str(ra))], close=close)

    async def stopping(self) -> None:
        await self.answer(503, _error(f"this router pod is stopping; retry after {STOP_RETRY_AFTER_S} s", "api_error", 503),
                          [("Retry-After", str(STOP_RETRY_AFTER_S))], close=True)

    # ---- the connection ---------------------------------------------------------------------
    async def serve(self) -> None:
        try:
            while True:
                try:
                    event = await self.next_event()
                except asyncio.TimeoutError:
                    if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
                        return  # idle past the deadline: closed, as a kept-alive connection may be
                    await self.answer(408, _error(f"the request was not received within {self.app.read_timeout_s:g} s",
                                                  "invalid_request_error"), close=True)
                    return
                except h11.RemoteProtocolError as exc:
                    await self._refuse(exc)
                    return
                if isinstance(event, h11.ConnectionClosed):
                    return
                assert isinstance(event, h11.Request), event
                await self._request(event)
                await self._end_watch()
                if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
                    self.conn.start_next_cycle()
                    self.deadline = None
                else:
                    return  # MUST_CLOSE, or a request whose body was left unread
        except Gone:
            self.writer.transport.abort()
        except Cut:
            self.writer.transport.abort()
        finally:
            await self._linger()

    async def _refuse(self, exc: h11.RemoteProtocolError) -> None:
        status = exc.error_status_hint
        head = self.conn.trailing_data[0]
        if status == 431 and b"\r\n" not in head[:MAX_LINE_BYTES + 2]:
            status = 414
        message = {414: "request line too long", 431: "request head too large"}.get(status, f"malformed request ({exc})")
        await self.answer(status, _error(message, "invalid_request_error"), close=True)

    async def _linger(self) -> None:
        """Half-close, throw the client's remaining input away for LINGER_S, close."""
        await self._end_watch()
        transport = self.writer.transport
        if transport.is_closing():
            return
        try:
            if self.writer.can_write_eof():
                self.writer.write_eof()
            end = time.monotonic() + LINGER_S
            while time.monotonic() < end:
                if not await asyncio.wait_for(self.reader.read(65536), end - time.monotonic()):
                    break
        except (OSError, ConnectionError, asyncio.TimeoutError):
            pass
        finally:
            transport.close()

    async def _request(self, req: h11.Request) -> None:
        gate = self.app.gate
        headers = {}
        for name, value in req.headers:
            headers.setdefault(name, value)
        if len(req.headers) > MAX_HEADERS:
            return await self.answer(431, _error(f"more than {MAX_HEADERS} header fields", "invalid_request_error"), close=True)
        if len(req.method) + len(req.target) + 10 > MAX_LINE_BYTES:
            return await self.answer(414, _error("request line too long", "invalid_request_error"), close=True)
        if b"upgrade" in headers or req.method == b"CONNECT":
            # A protocol switch (a WebSocket) is not carried through the queue.
            return await self.answer(501, _error("protocol upgrades are not served through the front queue",
                                                 "invalid_request_error"), close=True)
        if b"content-length" in headers and b"transfer-encoding" in headers:
            return await self.answer(400, _error("Content-Length and Transfer-Encoding together", "invalid_request_error"),
                                     close=True)
        length = int(headers.get(b"content-length", b"0"))
        if req.method == b"GET" and req.target.split(b"?", 1)[0] == HELD_PATH.encode():
            return await self.answer(200, json.dumps(gate.counts()).encode(), close=length > 0)
        if gate.stopping.is_set():
            return await self.stopping()
        if length > MAX_BODY_BYTES:
            return await self.answer(413, _error(f"body over {MAX_BODY_BYTES} bytes", "invalid_request_error"), close=True)
        ready = await gate.ready()
        if not ready and gate.held >= gate.max_held:
            # Refused from its headers: its body is not waited for.
            return await self.too_many(f"{gate.max_held} requests are held already", close=True)
        body = Body(gate)
        try:
            if length and not gate.reserve(length):
                return await self.too_many(f"{gate.max_bytes} bytes of bodies are held already", close=True)
            body.size = length
            if self.conn.they_are_waiting_for_100_continue:
                await self.send(h11.InformationalResponse(status_code=100, headers=[]))
            if not await self._read_body(body, b"transfer-encoding" in headers):
                return
            await self._serve(req, body)
        finally:
            body.drop()

    async def _read_body(self, body: Body, chunked: bool) -> bool:
        """The body, within the deadline and the budgets; False when answered already. A body of
        a Content-Length was counted whole from its headers; a chunked one is counted as it comes."""
        while True:
            try:
                event = await self.next_event()
            except asyncio.TimeoutError:
                await self.answer(408, _error(f"the body was not received within {self.app.read_timeout_s:g} s",
                                              "invalid_request_error"), close=True)
                return False
            except h11.RemoteProtocolError as exc:
                await self._refuse(exc)
                return False
            if isinstance(event, h11.EndOfMessage):
                return True
            if not isinstance(event, h11.Data):
                raise Gone  # ConnectionClosed mid-body
            if not chunked:
                body.parts.append(event.data)
                continue
            if body.size + len(event.data) > MAX_BODY_BYTES:
                await self.answer(413, _error(f"body over {MAX_BODY_BYTES} bytes", "invalid_request_error"), close=True)
                return False
            if not body.add(event.data):
                await self.too_many(f"{self.app.gate.max_bytes} bytes of bodies are held already", close=True)
                return False

    async def _serve(self, req: h11.Request, body: Body) -> None:
        gate = self.app.gate
        deadline = time.monotonic() + self.app.max_hold_s
        holding = False
        try:
            while True:
                if gate.stopping.is_set():
                    return await self.stopping()
                if await self.unless_gone(gate.ready()):
                    # A forwarded request is in flight, no longer held: `demand` counts it once.
                    if holding:
                        gate.held -= 1
                        holding = False
                    if await self._forward(req, body):
                        return
                if not holding:
                    if not gate.enter():
                        return await self.too_many(f"{gate.max_held} requests are held already")
                    holding = True
                if time.monotonic() >= deadline:
                    return await self.too_many(f"held {self.app.max_hold_s:g} s")
                await self._watch_once(gate.period)
        finally:
            if holding:
                gate.held -= 1

    async def _forward(self, req: h11.Request, body: Body) -> bool:
        """Send upstream and stream the answer back. True when the client has its answer; False
        to hold and try again, only where the upstream cannot have acted on the request: the
        connection was refused, or it answered 503. Once the request may have reached the upstream
        (it was sent and the connection then failed), it is never sent again: a completion must
        not run twice, so the client gets 502."""
        app = self.app
        try:
            up = await Upstream.open(app.upstream_host, app.upstream_port)
        except (OSError, asyncio.TimeoutError):
            return False  # nothing was sent
        named = _connection_named(req.headers)
        headers = [(n, v) for n, v in req.headers if n not in HOP_BY_HOP and n not in named]
        headers.append((b"host", app.upstream_netloc.encode()))
        if body.size or req.method in (b"POST", b"PUT", b"PATCH"):
            headers.append((b"content-length", str(body.size).encode()))
        app.gate.in_flight += 1
        started = False
        try:
            try:
                await up.send(h11.Request(method=req.method, target=req.target, headers=headers))
                for part in body.parts:
                    await up.send(h11.Data(data=part))
                await up.send(h11.EndOfMessage())
                resp = await self.unless_gone(up.response())
            except (OSError, asyncio.TimeoutError, h11.ProtocolError) as exc:
                await self.answer(502, _error(f"the router failed mid-request ({type(exc).__name__}); it was not "
                                              "retried, as it may have run", "api_error"))
                return True
            if resp.status_code == 503:
                return False
            if len(resp.headers) > MAX_HEADERS:
                # Python's http.client refuses more than 100 (`_MAXHEADERS`): answered, not passed on.
                await self.answer(502, _error(f"the router answered more than {MAX_HEADERS} header fields; it was "
                                              "not retried", "api_error"))
                return True
            body.drop()  # never sent again
            named = _connection_named(resp.headers)
            out = [(n, v) for n, v in resp.headers
                   if (n not in HOP_BY_HOP or n == b"content-length") and n not in named]
            await self.send(h11.Response(status_code=resp.status_code, headers=out, reason=resp.reason))
            started = True
            while True:
                try:
                    event = await self.unless_gone(up.next_event())
                except (OSError, asyncio.TimeoutError, h11.ProtocolError) as exc:
                    raise Cut from exc  # the client must not read a cut answer as complete
                if isinstance(event, h11.Data):
                    await self.send(h11.Data(data=event.data))
                elif isinstance(event, h11.EndOfMessage):
                    await self.send(h11.EndOfMessage())
                    return True
        except h11.LocalProtocolError as exc:
            # The router's answer does not fit the client's framing (a body longer than its
            # Content-Length): before the answer started it is a 502, after, a cut.
            if started:
                raise Cut from exc
            await self.answer(502, _error(f"the router's answer was malformed ({exc}); it was not retried",
                                          "api_error"))
            return True
        finally:
            app.gate.in_flight -= 1
            up.close()


class App:
    def __init__(self, a: argparse.Namespace) -> None:
        up = urllib.parse.urlsplit(a.upstream)
        self.upstream_host, self.upstream_port = up.hostname or "127.0.0.1", up.port or 80
        self.upstream_netloc = up.netloc
        self.max_hold_s, self.retry_after_s = a.max_hold_seconds, a.retry_after
        self.read_timeout_s, self.max_connections = a.read_timeout_seconds, a.max_connections
        self.gate = Gate(a.ready_url, a.max_held, a.max_held_bytes)
        self.clients: set[Client] = set()
        self.lingering = 0

    async def connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.clients) >= self.max_connections or self.gate.stopping.is_set():
            return await self._over_cap(reader, writer)
        client = Client(self, reader, writer)
        self.clients.add(client)
        try:
            await client.serve()
        except Exception as exc:  # noqa: BLE001 - one connection's fault never stops the others
            print(json.dumps({"event": "warmstart.front_queue_error", "error": repr(exc)[:300]}), flush=True)
            writer.transport.abort()
        finally:
            self.clients.discard(client)

    async def _over_cap(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.lingering >= MAX_LINGERING:
            writer.transport.abort()
            return
        self.lingering += 1
        try:
            client = Client(self, reader, writer)
            why = "the router pod is stopping" if self.gate.stopping.is_set() else \
                f"{self.max_connections} connections are open already"
            await client.answer(503, _error(f"{why}; retry after {self.retry_after_s} s", "api_error", 503),
                                [("Retry-After", str(self.retry_after_s))], close=True)
            await client._linger()
        except Exception:  # noqa: BLE001
            writer.transport.abort()
        finally:
            self.lingering -= 1

    def stop(self) -> None:
        self.gate.stopping.set()
        for client in list(self.clients):
            if client.idle:
                client.writer.transport.close()


async def run(a: argparse.Namespace) -> int:
    app = App(a)
    server = await asyncio.start_server(app.connected, a.host, a.port, limit=READ_BYTES, backlog=1024)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, app.stop)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"event": "warmstart.front_queue_start", "port": port, "max_held": a.max_held,
                      "max_held_bytes": a.max_held_bytes, "max_connections": a.max_connections,
                      "read_timeout_seconds": a.read_timeout_seconds}), flush=True)
    await app.gate.stopping.wait()
    server.close()
    # Held requests are answered 503 as they wake; forwarded ones finish; the kubelet's grace
    # period bounds the wait.
    while app.clients:
        await asyncio.sleep(0.1)
    print(json.dumps({"event": "warmstart.front_queue_stop", **app.gate.counts()}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="the router's base URL")
    p.add_argument("--ready-url", required=True, help="200 once the upstream has an engine (SMG's /readiness)")
    p.add_argument("--max-held", type=int, default=256)
    p.add_argument("--max-held-bytes", type=int, default=128 * 1024 * 1024,
                   help="request bodies in memory at once, held or being forwarded")
    p.add_argument("--max-hold-seconds", type=float, default=120.0)
    p.add_argument("--max-connections", type=int, default=512)
    p.add_argument("--read-timeout-seconds", type=float, default=60.0,
                   help="time a client has to send a whole request once it started it (and idle between two)")
    p.add_argument("--retry-after", type=int, default=30, help="seconds a refused client is told to wait")
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
