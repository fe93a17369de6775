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

Sleep mode (`--dev-mode`, what vLLM exposes with `--enable-sleep-mode` and
`VLLM_SERVER_DEV_MODE=1`; routes as in vLLM 0.33.0's `vllm/entrypoints/serve/dev/`):
`POST /sleep?level=1|2[&mode=abort|wait|keep]` answers `{"status": "sleeping", "level": N}`;
`POST /wake_up[?tags=weights&tags=kv_cache]` waits the modelled wake time, then answers
`{"status": "awake", "tags": ...}`; `GET /is_sleeping` answers `{"is_sleeping": bool}`;
`POST /collective_rpc` (`{"method": "reload_weights"}` after a level-2 wake),
`/reset_prefix_cache`, `/release_kv_cache_memory` and `GET /server_info` answer 200. Without
`--dev-mode` every one of them is 404, as in vLLM. While asleep `/health` still answers 200 (vLLM's
only checks the engine is alive, `vllm/entrypoints/serve/instrumentator/health.py`) and the
inference routes answer 503 `ServiceUnavailableError` (vLLM `docs/features/sleep_mode.md`); after a
level-2 wake they answer 503 until the weights are reloaded. The wake time is modelled from the
published level-1 figure, about 3 s per 64 GiB of weights (llm-d-incubation/llm-d-fast-model-actuation
README): `--weights-gib` x `--wake-s-per-gib` (default 3/64). `--max-num-seqs N` runs at most N
requests at once; the rest wait (`vllm:num_requests_waiting`), as vLLM's scheduler queues them.

    python -m tests.routing.fake_vllm --name w1 [--cache-blocks 4096] [--delay-ms 0] [--prefill-us-per-token 0]
        [--dev-mode] [--start-asleep] [--weights-gib 0] [--wake-s-per-gib 0.046875] [--max-num-seqs 0]
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
import urllib.parse
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
# About 3 s per 64 GiB at sleep level 1 (llm-d-incubation/llm-d-fast-model-actuation README).
WAKE_S_PER_GIB = 3 / 64
# The inference routes a sleeping engine refuses (vLLM docs/features/sleep_mode.md).
INFERENCE_ROUTES = ("/v1/completions", "/v1/chat/completions")
DEV_POST_ROUTES = ("/sleep", "/wake_up", "/collective_rpc", "/reset_prefix_cache", "/release_kv_cache_memory",
                   "/reset_mm_cache", "/reset_encoder_cache", "/pause", "/resume")
DEV_GET_ROUTES = ("/is_sleeping", "/server_info", "/is_paused")


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
    def __init__(self, name: str, cache_blocks: int, delay_s: float, prefill_s_per_token: float = 0.0, *,
                 dev_mode: bool = False, asleep: bool = False, weights_gib: float = 0.0,
                 wake_s_per_gib: float = WAKE_S_PER_GIB, max_num_seqs: int = 0, served_model: str = MODEL) -> None:
        self.name, self.delay_s, self.prefill_s_per_token = name, delay_s, prefill_s_per_token
        self.served_model = served_model
        self.dev_mode, self.sleeping, self.sleep_level = dev_mode, dev_mode and asleep, 1
        self.weights_dropped = False
        self.wake_s = weights_gib * wake_s_per_gib
        self.slots = threading.BoundedSemaphore(max_num_seqs) if max_num_seqs > 0 else None
        self.running = 0
        self.refused = 0
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
                    "max_inflight": self.max_inflight, "paths": dict(self.paths), "sleeping": self.sleeping,
                    "refused_asleep": self.refused, "wake_s": self.wake_s}


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
                    {"id": state.served_model, "object": "model", "owned_by": "vllm", "max_model_len": 32768}]})
            if path == "/version":
                return self._send(200, {"version": "0.33.0"})
            if path in DEV_GET_ROUTES:
                if not state.dev_mode:
                    return self._send(404, {"detail": "Not Found"})
                if path == "/is_sleeping":
                    return self._send(200, {"is_sleeping": state.sleeping})
                return self._send(200, {"fake": True})
            if path == "/metrics":
                with state.lock:
                    queries, hits = state.prompt_tokens, state.hit_tokens
                    running = state.running if state.slots is not None else state.inflight
                    waiting = state.inflight - running
                label = f'{{model_name="{state.served_model}"}}'
                text = (f"vllm:num_requests_running{label} {running}\n"
                        f"vllm:num_requests_waiting{label} {waiting}\n"
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
            if path in DEV_POST_ROUTES:
                return self._dev(path, body)
            if path not in INFERENCE_ROUTES:
                return self._send(404, {"error": "no route", "path": path})
            if state.sleeping or state.weights_dropped:
                with state.lock:
                    state.refused += 1
                return self._send(503, {"error": {"message": "The engine is sleeping", "type": "ServiceUnavailableError",
                                                  "param": None, "code": 503}})
            with state.lock:
                hit, total = state.cache.lookup_and_fill(prompt_text(body))
                state.inflight += 1
                state.max_inflight = max(state.max_inflight, state.inflight)
            try:
                if state.slots is not None:
                    state.slots.acquire()
                    with state.lock:
                        state.running += 1
                try:
                    pause = state.delay_s + state.prefill_s_per_token * (total - hit)
                    if pause > 0:
                        time.sleep(pause)
                finally:
                    if state.slots is not None:
                        with state.lock:
                            state.running -= 1
                        state.slots.release()
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
            doc = {"id": f"{state.name}-{state.requests}", "object": obj, "model": state.served_model, "choices": [choice],
                   "usage": usage}
            if body.get("stream"):
                # vLLM's streaming answer: server-sent events, one `data:` chunk per delta, then
                # `data: [DONE]` (https://platform.openai.com/docs/api-reference/completions/create).
                return self._send(200, f"data: {json.dumps(doc)}\n\ndata: [DONE]\n\n".encode(), "text/event-stream")
            return self._send(200, doc)

        def _dev(self, path: str, body: dict[str, Any]) -> None:
            """vLLM's dev routes (`vllm/entrypoints/serve/dev/*/api_router.py` at v0.33.0)."""
            if not state.dev_mode:
                return self._send(404, {"detail": "Not Found"})
            query = urllib.parse.parse_qs(self.path.partition("?")[2])
            if path == "/sleep":
                level = int((query.get("level") or ["1"])[0])
                if level not in (0, 1, 2):
                    return self._send(422, {"detail": "level must be 0, 1 or 2"})
                state.sleeping, state.sleep_level = True, level
                state.cache = PrefixCache(state.cache.capacity)  # level >= 1 frees the KV cache
                return self._send(200, {"status": "sleeping", "level": level})
            if path == "/wake_up":
                tags = query.get("tags") or None
                if state.sleeping and state.wake_s > 0:
                    time.sleep(state.wake_s)
                state.weights_dropped = state.sleeping and state.sleep_level == 2
                state.sleeping = False
                return self._send(200, {"status": "awake", "tags": tags})
            if path == "/collective_rpc":
                if body.get("method") == "reload_weights":
                    state.weights_dropped = False
                return self._send(200, {"results": [None]})
            return self._send(200, {"status": "ok"})

    return Handler


def serve(name: str, cache_blocks: int, delay_ms: float, prefill_us_per_token: float = 0.0, **sleep: Any) -> None:
    state = State(name, cache_blocks, delay_ms / 1000, prefill_us_per_token / 1e6, **sleep)
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
                 start_timeout_s: float = 15.0, *, dev_mode: bool = False, asleep: bool = False,
                 weights_gib: float = 0.0, wake_s_per_gib: float = WAKE_S_PER_GIB, max_num_seqs: int = 0,
                 served_model: str = MODEL):
        self.name = name
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
        sleep_flags = [*(["--dev-mode"] if dev_mode else []), *(["--start-asleep"] if asleep else []),
                       "--weights-gib", str(weights_gib), "--wake-s-per-gib", str(wake_s_per_gib),
                       "--max-num-seqs", str(max_num_seqs), "--served-model-name", served_model]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.routing.fake_vllm", "--name", name, "--cache-blocks", str(cache_blocks),
             "--delay-ms", str(delay_ms), "--prefill-us-per-token", str(prefill_us_per_token), *sleep_flags],
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
    p.add_argument("--dev-mode", action="store_true", help="expose vLLM's dev routes (sleep mode)")
    p.add_argument("--start-asleep", action="store_true", help="start asleep at level 1 (with --dev-mode)")
    p.add_argument("--weights-gib", type=float, default=0.0, help="weights the wake copies back")
    p.add_argument("--wake-s-per-gib", type=float, default=WAKE_S_PER_GIB)
    p.add_argument("--max-num-seqs", type=int, default=0, help="requests run at once (0: no limit)")
    p.add_argument("--served-model-name", default=MODEL, help="the name /v1/models lists (vLLM's flag)")
    a = p.parse_args(argv)
    serve(a.name, a.cache_blocks, a.delay_ms, a.prefill_us_per_token, dev_mode=a.dev_mode, asleep=a.start_asleep,
          weights_gib=a.weights_gib, wake_s_per_gib=a.wake_s_per_gib, max_num_seqs=a.max_num_seqs,
          served_model=a.served_model_name)


if __name__ == "__main__":
    main()
