"""The host's one HTTP port (the supervisor's): the folded health for the kubelet, the engines'
status, and the actuator's per-engine routes.

- `GET /health`: 200 when every engine is up (asleep or awake), else 503; the body lists each
  engine's state. The pod's startup and readiness probes: a host is a spare only once every
  pooled model's engine sleeps on it.
- `GET /livez`: 200 while the supervisor's loop runs. The liveness probe: one engine failing is
  the supervisor's to restart, not a reason for the kubelet to kill every engine of the pod.
- `GET /engines`: `{"spare": bool, "awake": model|null, "sleepLevel": N, "engines": [...]}`.
- `/engines/<model>/<route>`: the vLLM routes the standby actuator uses, passed to that engine on
  the pod's loopback, so the actuator's one wake/sleep path (warmstart/podside/standby) serves a
  pooled engine with the base URL `http://<host>:<port>/engines/<model>`, and the NetworkPolicy
  need admit the actuator to this port alone, never to an engine's dev routes: `GET health`,
  `is_sleeping`, `metrics`; `POST wake_up` (refused with 409 while another engine of the host is
  awake or starting: one awake engine per GPU set, as the render budgeted its memory), `sleep`
  (only at the host's level: the render sized host RAM for it), `collective_rpc` (only
  `{"method": "reload_weights"}`, the level-2 wake's), `reset_prefix_cache`, and `v1/completions`
  (the warm-up token, only to the awake engine). Anything else is 404: `/collective_rpc` runs any
  worker method, which no one but the engine's own process should reach.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .supervisor import AWAKE, Supervisor, http

MAX_BODY_BYTES = 1 << 20
LIVE_WITHIN_S = 10.0
GET_ROUTES = ("health", "is_sleeping", "metrics")
POST_ROUTES = ("wake_up", "sleep", "collective_rpc", "reset_prefix_cache", "v1/completions")


def make_server(sup: Supervisor, host: str, port: int, wake_timeout_s: float = 600.0) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _send(self, code: int, body: bytes | dict, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body, sort_keys=True).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype or "application/octet-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self) -> tuple[str, str, str] | None:
            """(model, route, query) of `/engines/<model>/<route>`, else None."""
            parts = urllib.parse.urlsplit(self.path)
            segs = parts.path.split("/", 3)
            if len(segs) == 4 and segs[1] == "engines" and segs[2]:
                return segs[2], segs[3], parts.query
            return None

        def do_GET(self) -> None:
            path = urllib.parse.urlsplit(self.path).path
            if path == "/health":
                snap = sup.snapshot()
                return self._send(200 if sup.all_up() else 503, snap)
            if path == "/livez":
                age = time.monotonic() - sup.last_tick
                return self._send(200 if age < LIVE_WITHIN_S else 503, {"loopAgeSeconds": round(age, 1)})
            if path == "/engines":
                return self._send(200, sup.snapshot())
            r = self._route()
            if r is None or r[1] not in GET_ROUTES or sup.engine(r[0]) is None:
                return self._send(404, {"error": "not found"})
            model, route, query = r
            e = sup.engine(model)
            code, body, ctype = http("GET", f"{e.url}/{route}" + (f"?{query}" if query else ""),
                                     headers={"Accept": self.headers.get("Accept", "*/*")})
            return self._send(code or 502, body if code else {"error": f"{model} did not answer"}, ctype)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length < 0 or length > MAX_BODY_BYTES:
                return self._send(413, {"error": "body too large"})
            body = self.rfile.read(length) if length else b""
            r = self._route()
            if r is None or r[1] not in POST_ROUTES or sup.engine(r[0]) is None:
                return self._send(404, {"error": "not found"})
            model, route, query = r
            e = sup.engine(model)
            url = f"{e.url}/{route}" + (f"?{query}" if query else "")
            headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
            if route == "wake_up":
                why = sup.begin_wake(model)
                if why is not None:
                    return self._send(409, {"error": why})
                code, out, ctype = http("POST", url, body, timeout=wake_timeout_s, headers=headers)
                sup.end_wake(model, code == 200, "" if code == 200 else f"wake_up answered {code}")
                return self._send(code or 502, out if code else {"error": f"{model} did not answer"}, ctype)
            if route == "sleep":
                level = (urllib.parse.parse_qs(query).get("level") or ["1"])[0]
                if level != str(sup.spec.sleep_level):
                    return self._send(422, {"error": f"this host sleeps its engines at level {sup.spec.sleep_level}"})
                code, out, ctype = http("POST", url, body, timeout=wake_timeout_s, headers=headers)
                if code == 200:
                    sup.slept(model)
                return self._send(code or 502, out if code else {"error": f"{model} did not answer"}, ctype)
            if route == "collective_rpc":
                try:
                    call = json.loads(body or b"{}")
                except ValueError:
                    call = None
                if not isinstance(call, dict) or call.get("method") != "reload_weights" or set(call) - {"method"}:
                    return self._send(403, {"error": "only {\"method\": \"reload_weights\"} is passed on"})
            if route == "v1/completions" and e.state != AWAKE:
                return self._send(409, {"error": f"{model} is {e.state}"})
            code, out, ctype = http("POST", url, body, timeout=wake_timeout_s, headers=headers)
            return self._send(code or 502, out if code else {"error": f"{model} did not answer"}, ctype)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
