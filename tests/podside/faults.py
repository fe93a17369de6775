"""A fault-injecting HTTP proxy in front of a real S3 server, on 127.0.0.1, for pod-side tests.

Every request is forwarded unchanged (method, path, query, headers and body, the Host header
too), so the client's SigV4 signature stays valid at the real server; the first rule that
matches a request changes what happens to it:

    error     answer with an S3 error document (status, Code, Message) instead of forwarding;
    delay     hold the request this long, then forward it (an in-flight transfer);
    hold      forward the request, then hold its response this long (the server has done it,
              the client does not know yet);
    truncate  forward, then send back only part of the body with a matching Content-Length
              (a body cut short that the framing does not reveal: only a size check can);
    flip      forward, then flip one byte in the middle of the body (same length: only a
              content check can tell);
    rewrite   forward, then `rewrite(method, path, headers, body) -> (headers, body)` changes the
              response (headers as a dict; the body's framing follows the new body): what a
              server of other features would answer (an SSE-KMS ETag, no PartsCount);
    chunked   forward, then send the body with `Transfer-Encoding: chunked`, no Content-Length
              (as a proxy or a gateway that streams may);
    trickle   forward, then send the body `trickle_bytes` at a time every `delay_s` (a stalled
              connection that is never quite idle);

each rule for at most `times` requests (None: every one). `seen` records (method, path, matched
rule) of each request. Plain classes (no pytest), like servers.py; the listening socket binds
port 0, so the port is the kernel's free one by construction. stop() releases every delayed
request and closes the server.
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import threading
import time
from typing import Callable
from urllib.parse import unquote, urlsplit

from tests.support.loopback import LoopbackServer

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclasses.dataclass
class Rule:
    """What to do to requests `match(method, path, headers)` selects."""

    match: Callable[[str, str, dict[str, str]], bool]
    action: str
    times: int | None = None
    status: int = 403
    code: str = "AccessDenied"
    message: str = "Access Denied"
    delay_s: float = 0.0
    keep: float = 0.5
    rewrite: Callable[[str, str, dict[str, str], bytes], tuple[dict[str, str], bytes]] | None = None
    trickle_bytes: int = 1
    hits: int = 0

    def take(self) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        self.hits += 1
        return True


def copy_of(key_suffix: str) -> Callable[[str, str, dict[str, str]], bool]:
    """Server-side copies (CopyObject, UploadPartCopy) whose source key ends with `key_suffix`."""
    return lambda method, path, headers: method == "PUT" and \
        unquote(headers.get("x-amz-copy-source", "")).split("?")[0].endswith(key_suffix)


def get_of(key_suffix: str) -> Callable[[str, str, dict[str, str]], bool]:
    return lambda method, path, headers: method == "GET" and unquote(urlsplit(path).path).endswith(key_suffix)


class FaultProxy(LoopbackServer):
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 80
        self.rules: list[Rule] = []
        self.seen: list[tuple[str, str, str | None]] = []
        # (method, path, request body bytes) of every PUT and POST: what a client uploaded.
        self.sent: list[tuple[str, str, int]] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any  # noqa: N815

        self._serve(Handler)

    @property
    def url(self) -> str:
        return self.base_url

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def wait_for(self, predicate: Callable[[tuple[str, str, str | None]], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if any(predicate(s) for s in self.seen):
                    return True
            time.sleep(0.05)
        return False

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        super().__exit__()

    # ---- one request ------------------------------------------------------------------

    def _handle(self, h: http.server.BaseHTTPRequestHandler) -> None:
        headers = {k.lower(): v for k, v in h.headers.items()}
        length = int(headers.get("content-length") or 0)
        body = h.rfile.read(length) if length else b""
        with self._lock:
            rule = next((r for r in self.rules if r.match(h.command, h.path, headers) and r.take()), None)
            self.seen.append((h.command, h.path, rule.action if rule else None))
            if h.command in ("PUT", "POST"):
                self.sent.append((h.command, h.path, len(body)))
        if rule is not None and rule.action == "error":
            doc = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{rule.code}</Code>'
                   f"<Message>{rule.message}</Message></Error>").encode()
            return self._reply(h, rule.status, {"Content-Type": "application/xml"}, doc)
        if rule is not None and rule.action == "delay":
            self._stop.wait(rule.delay_s)
        try:
            conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)
            forward = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
            conn.request(h.command, h.path, body=body if body or h.command in ("PUT", "POST") else None,
                         headers=forward)
            resp = conn.getresponse()
            data = resp.read()
            out = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP | {"content-length"}}
            conn.close()
        except OSError as exc:
            return self._reply(h, 502, {}, str(exc).encode())
        if rule is not None and rule.action == "hold":
            with self._lock:
                self.seen.append((h.command, h.path, "held"))
            self._stop.wait(rule.delay_s)
        if rule is not None and rule.action == "truncate" and h.command == "GET":
            data = data[: int(len(data) * rule.keep)]
        if rule is not None and rule.action == "flip" and h.command == "GET" and data and resp.status < 300:
            i = len(data) // 2
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        if rule is not None and rule.action == "rewrite" and rule.rewrite is not None:
            out, data = rule.rewrite(h.command, h.path, out, data)
        if rule is not None and rule.action in ("chunked", "trickle") and h.command == "GET":
            return self._stream(h, resp.status, out, data, rule)
        self._reply(h, resp.status, out, b"" if h.command == "HEAD" else data,
                    length=None if h.command != "HEAD" else int(resp.getheader("Content-Length") or 0))

    def _stream(self, h: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes,
                rule: Rule) -> None:
        """The body in HTTP/1.1 chunks, without a Content-Length; `trickle`: a few bytes at a time."""
        step = max(1, rule.trickle_bytes) if rule.action == "trickle" else max(1, len(body))
        try:
            h.send_response(status)
            for k, v in headers.items():
                h.send_header(k, v)
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            for i in range(0, len(body), step):
                if rule.action == "trickle" and self._stop.wait(rule.delay_s):
                    return
                piece = body[i:i + step]
                h.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except OSError:
            pass

    def _reply(self, h: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes,
               length: int | None = None) -> None:
        try:
            h.send_response(status)
            for k, v in headers.items():
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(body) if length is None else length))
            h.end_headers()
            if body:
                h.wfile.write(body)
        except OSError:
            pass
