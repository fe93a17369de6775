"""A stand-in for one vLLM replica: its OpenAI-compatible HTTP surface and a bounded prefix cache.

Each backend is its own process on 127.0.0.1 (a port the kernel gave it, printed as its first
stdout line), so the router under test talks to it over real sockets, and a test can pause it
(SIGSTOP: it stops answering, as a wedged replica does) or kill it by pid.

What it answers, the endpoints SMG 1.13.0 calls on a worker (seen by running it):
`GET /health`, `/v1/models`, `/version`, `/metrics` (vLLM's gauge names:
https://docs.vllm.ai/en/latest/usage/metrics/), `POST /v1/completions`, `/v1/chat/completions`;
`/loads` and `/v1/loads` answer 404, as a server without them does. `GET /fake/stats` returns
what it counted, for the tests and bench/routing.py; `POST /fake/health` sets whether /health
succeeds; `POST /fake/delay` sets the request timing (bench/routing.py maps the router's hash ring
with it set to zero, after a measured run); `POST /fake/reset` empties the cache and the counters
(so one fleet, one set of URLs and so one hash ring, serves several measured runs).

The prefix cache, a model of vLLM's automatic prefix caching
(https://docs.vllm.ai/en/latest/design/prefix_caching/): the prompt is cut into blocks of
`BLOCK_TOKENS` tokens (vLLM's default block size, 16) of `CHARS_PER_TOKEN` characters; each block
is keyed by the hash of everything up to its end, so a block hits only when the whole prefix
before it was cached too. Hit tokens are the leading blocks found; the cache keeps at most
`--cache-blocks` blocks and evicts the least recently used. It is a stand-in, not vLLM: it holds
no KV tensors, only which prefixes a real replica would still have. A request takes `--delay-ms`
plus `--prefill-us-per-token` for each prompt token not found in the cache (a miss costs a
prefill).

    python -m tests.routing.fake_vllm --name w1 [--cache-blocks 4096] [--delay-ms 0] [--prefill-us-per-token 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "fake-model"
BLOCK_TOKENS = 16
CHARS_PER_TOKEN = 4
BLOCK_CHARS = BLOCK_TOKENS * CHARS_PER_TOKEN
MAX_BODY_BYTES = 4 * 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


class PrefixCache:
    """Which prompt blocks a replica still holds, least recently used evicted first."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self.blocks: OrderedDict[bytes, None] = OrderedDict()

    @staticmethod
    def block_keys(text: str) -> list[bytes]:
        """One key per full block: the digest of the text up to the block's end (a chain)."""
        keys, h = [], hashlib.blake2b(digest_size=16)
        for end in range(BLOCK_CHARS, len(text) + 1, BLOCK_CHARS):
            h.update(text[end - BLOCK_CHARS:end].encode())
            keys.append(h.copy().digest())
        return keys

    def lookup_and_fill(self, text: str) -> tuple[int, int]:
        """(hit tokens, prompt tokens) for one prompt; the prompt's blocks are then cached."""
        keys = self.block_keys(text)
        hit = 0
        for k in keys:
            if k not in self.blocks:
                break
            hit += 1
        for k in keys:
            self.blocks[k] = None
            self.blocks.move_to_end(k)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
        return hit * BLOCK_TOKENS, -(-len(text) // CHARS_PER_TOKEN)


def prompt_text(body: dict[str, Any]) -> str:
    """The text a chat or completion request would tokenize, in order."""
    if "messages" in body:
        return "".join(str(m.get("content", "")) for m in body.get("messages") or [])
    prompt = body.get("prompt", "")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


class State:
    def __init__(self, name: str, cache_blocks: int, delay_s: float, prefill_s_per_token: float = 0.0) -> None:
        self.name, self.delay_s, self.prefill_s_per_token = name, delay_s, prefill_s_per_token
        self.cache = PrefixCache(cache_blocks)
        self.lock = threading.Lock()
        self.healthy = True
        self.inflight = self.max_inflight = 0
        self.requests = self.hit_tokens = self.prompt_tokens = 0
        self.paths: dict[str, int] = {}

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"name": self.name, "requests": self.requests, "hit_tokens": self.hit_tokens,
                    "prompt_tokens": self.prompt_tokens, "inflight": self.inflight,
                    "max_inflight": self.max_inflight, "paths": dict(self.paths)}


def handler(state: State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            # Replies go out at once: with Nagle's algorithm a small reply waits for the peer's
            # delayed ACK (~40 ms on Linux), which would be charged to the router.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            head = (f"HTTP/1.1 {code} {self.responses.get(code, ('',))[0]}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n").encode()
            self.log_request(code)
            # One write: headers and body in the same segment.
            self.wfile.write(head + data)

        def _count(self, path: str) -> None:
            with state.lock:
                state.paths[path] = state.paths.get(path, 0) + 1

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            self._count(path)
            if path == "/health":
                return self._send(200 if state.healthy else 503, b"", "text/plain")
            if path == "/v1/models":
                return self._send(200, {"object": "list", "data": [
                    {"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 32768}]})
            if path == "/version":
                return self._send(200, {"version": "0.33.0"})
            if path == "/metrics":
                with state.lock:
                    running, queries, hits = state.inflight, state.prompt_tokens, state.hit_tokens
                label = f'{{model_name="{MODEL}"}}'
                text = (f"vllm:num_requests_running{label} {running}\n"
                        f"vllm:num_requests_waiting{label} 0\n"
                        f"vllm:kv_cache_usage_perc{label} 0.1\n"
                        f"vllm:prefix_cache_queries_total{label} {queries}\n"
                        f"vllm:prefix_cache_hits_total{label} {hits}\n")
                # vLLM's prometheus_client negotiates the format from Accept
                # (https://prometheus.io/docs/instrumenting/exposition_formats/): OpenMetrics ends in `# EOF`.
                if "application/openmetrics-text" in (self.headers.get("Accept") or ""):
                    return self._send(200, (text + "# EOF\n").encode(),
                                      "application/openmetrics-text; version=1.0.0; charset=utf-8")
                return self._send(200, text.encode(), "text/plain; version=0.0.4")
            if path == "/fake/stats":
                return self._send(200, state.stats())
            return self._send(404, {"error": "not found", "path": path})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            self._count(path)
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                return self._send(413, {"error": "body too large"})
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self._send(400, {"error": "not JSON"})
            if path == "/fake/health":
                state.healthy = bool(body.get("ok", True))
                return self._send(200, {"healthy": state.healthy})
            if path == "/fake/reset":
                with state.lock:
                    state.cache = PrefixCache(state.cache.capacity)
                    state.requests = state.hit_tokens = state.prompt_tokens = state.max_inflight = 0
                    state.paths = {}
                return self._send(200, {"reset": True})
            if path == "/fake/delay":
                state.delay_s = max(0.0, float(body.get("delay_ms", 0.0))) / 1000
                state.prefill_s_per_token = max(0.0, float(body.get("prefill_us_per_token", 0.0))) / 1e6
                return self._send(200, {"delay_ms": state.delay_s * 1000})
            if path not in ("/v1/completions", "/v1/chat/completions"):
                return self._send(404, {"error": "no route", "path": path})
            with state.lock:
                hit, total = state.cache.lookup_and_fill(prompt_text(body))
                state.inflight += 1
                state.max_inflight = max(state.max_inflight, state.inflight)
            try:
                pause = state.delay_s + state.prefill_s_per_token * (total - hit)
                if pause > 0:
                    time.sleep(pause)
                with state.lock:
                    state.requests += 1
                    state.hit_tokens += hit
                    state.prompt_tokens += total
            finally:
                with state.lock:
                    state.inflight -= 1
            usage = {"prompt_tokens": total, "completion_tokens": 1, "total_tokens": total + 1,
                     "prompt_tokens_details": {"cached_tokens": hit}}
            if path == "/v1/chat/completions":
                choice = {"index": 0, "message": {"role": "assistant", "content": state.name}, "finish_reason": "stop"}
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": state.name, "finish_reason": "stop"}
                obj = "text_completion"
            return self._send(200, {"id": f"{state.name}-{state.requests}", "object": obj, "model": MODEL,
                                    "choices": [choice], "usage": usage})

    return Handler


def serve(name: str, cache_blocks: int, delay_ms: float, prefill_us_per_token: float = 0.0) -> None:
    state = State(name, cache_blocks, delay_ms / 1000, prefill_us_per_token / 1e6)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(state))
    server.daemon_threads = True
    server.request_queue_size = 256
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    server.serve_forever(poll_interval=0.2)


# --------------------------------------------------------------------------------------
# The parent side: start, query, pause and stop one backend process


class FakeVllm:
    """One fake replica in its own process; use as a context manager or call stop()."""

    def __init__(self, name: str, cache_blocks: int = 4096, delay_ms: float = 0.0, prefill_us_per_token: float = 0.0,
                 start_timeout_s: float = 15.0):
        self.name = name
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.routing.fake_vllm", "--name", name, "--cache-blocks", str(cache_blocks),
             "--delay-ms", str(delay_ms), "--prefill-us-per-token", str(prefill_us_per_token)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=str(ROOT))
        line = _readline(self.proc, start_timeout_s)
        try:
            self.port = int(json.loads(line)["port"])
        except (ValueError, KeyError, TypeError):
            self.stop()
            raise RuntimeError(f"fake backend {name} did not start: {line!r}") from None
        self.url = f"http://127.0.0.1:{self.port}"
        self.wait_healthy(start_timeout_s)

    def get(self, path: str, timeout_s: float = 5.0) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as r:
            return json.loads(r.read())

    def stats(self) -> dict[str, Any]:
        return self.get("/fake/stats")

    def set_healthy(self, ok: bool) -> None:
        req = urllib.request.Request(self.url + "/fake/health", data=json.dumps({"ok": ok}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(req, timeout=5).read()

    def set_delay(self, delay_ms: float, prefill_us_per_token: float = 0.0) -> None:
        req = urllib.request.Request(self.url + "/fake/delay", data=json.dumps(
            {"delay_ms": delay_ms, "prefill_us_per_token": prefill_us_per_token}).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(req, timeout=5).read()

    def reset(self) -> None:
        req = urllib.request.Request(self.url + "/fake/reset", data=b"{}",
                                     headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(req, timeout=5).read()

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"fake backend {self.name} never answered /health")
            time.sleep(0.05)

    def pause(self) -> None:
        """Stop answering: the socket still accepts, nothing replies (a wedged replica)."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stdout:
            self.proc.stdout.close()

    def __enter__(self) -> "FakeVllm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _readline(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first stdout line of `proc`, or '' after `timeout_s`."""
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    t.start()
    t.join(timeout_s)
    return out[0] if out else ""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True)
    p.add_argument("--cache-blocks", type=int, default=4096)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--prefill-us-per-token", type=float, default=0.0)
    a = p.parse_args(argv)
    serve(a.name, a.cache_blocks, a.delay_ms, a.prefill_us_per_token)


if __name__ == "__main__":
    main()
