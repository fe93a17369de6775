"""A vLLM engine stand-in on 127.0.0.1 for the standby actuator's tests that need an answer no
fake vLLM gives (tests/podside/test_standby_answers.py: an odd `/is_sleeping`;
tests/podside/test_standby_scale.py: an engine asleep with requests queued on it). A subclass
says what the engine answers; the HTTP side lives here once."""

from __future__ import annotations

import http.server

from tests.support.loopback import LoopbackServer


class StandInEngine(LoopbackServer):
    """An engine that is up (/health and every other GET: 200, empty): `GET /is_sleeping` answers
    `is_sleeping_body()` (None: a garbage status line, the connection closed), `GET /metrics`
    answers `metrics_body()`; every POST's path is recorded in `posts`, its body read,
    `on_post(path)` called, and `{}` answered. Set a subclass's own state before calling
    `super().__init__()`."""

    def __init__(self) -> None:
        self.posts: list[str] = []
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/is_sleeping":
                    body = engine.is_sleeping_body()
                    if body is None:
                        self.wfile.write(b"NOT-HTTP garbage\r\n\r\n")
                        self.close_connection = True
                        return
                    self._send(body)
                elif self.path == "/metrics":
                    self._send(engine.metrics_body())
                else:
                    self._send(b"")

            def do_POST(self) -> None:
                engine.posts.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                engine.on_post(self.path)
                self._send(b"{}")

        self._serve(Handler)

    def is_sleeping_body(self) -> bytes | None:
        raise NotImplementedError

    def metrics_body(self) -> bytes:
        raise NotImplementedError

    def on_post(self, path: str) -> None:
        pass
