"""vLLM's dev routes through the real router: a standby model's engines run with
`VLLM_SERVER_DEV_MODE=1`, which exposes /sleep, /wake_up, /collective_rpc, /reset_prefix_cache and
more (vLLM 0.33.0 `vllm/entrypoints/serve/__init__.py`, `register_vllm_dev_api_routers`, and
`vllm/entrypoints/rl/`). Clients reach the engines only through SMG (the NetworkPolicies admit
the routers and the actuator alone, tests/network/test_reachability.py), so SMG must forward none of them:
its route table is fixed and anything else falls through to a 404 (smg-project/smg
`model_gateway/src/server.rs`, `sink_handler`). Checked here against the pinned SMG binary in
front of a fake engine in dev mode that counts every path it is sent."""

from __future__ import annotations

import http.client
from contextlib import ExitStack

import pytest

from tests.routing.fake_vllm import DEV_GET_ROUTES, DEV_POST_ROUTES, FakeVllm
from tests.routing.router import SmgRouter, chat, served_by
from warmstart.decisions import routing

pytestmark = [pytest.mark.slow, pytest.mark.servers]  # the real smg router

# Each dev route as a client would send it, and spellings that try to slip past a prefix match.
ATTEMPTS = ([("POST", p) for p in DEV_POST_ROUTES] + [("GET", p) for p in DEV_GET_ROUTES]
            + [("POST", "/sleep?level=1"), ("POST", "/wake_up?tags=weights"), ("POST", "//sleep"),
               ("POST", "/v1/../sleep"), ("POST", "/v1/completions/../../wake_up"), ("POST", "/%73leep"),
               ("GET", "/v1/../is_sleeping"), ("POST", "/v1/collective_rpc")])


def _send(port: int, method: str, path: str) -> int:
    """One raw request (the path exactly as written: no client-side normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        body = b'{"method": "reload_weights"}' if method == "POST" else None
        conn.putrequest(method, path, skip_accept_encoding=True)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body or b"")))
        conn.endheaders(body)
        return conn.getresponse().status
    finally:
        conn.close()


def test_no_dev_route_reaches_an_engine_through_the_router():
    with ExitStack() as stack:
        engine = stack.enter_context(FakeVllm("w0", dev_mode=True))
        r = stack.enter_context(SmgRouter([*routing.policy_flags("prefix_hash"), "--worker-urls", engine.url],
                                          wait_for_workers=1))
        # The router does forward inference, so a request that never arrives was refused, not lost.
        assert served_by(chat(r.url, "system", "hello")) == "w0"
        statuses = {f"{m} {p}": _send(r.port, m, p) for m, p in ATTEMPTS}
        seen = engine.stats()["paths"]
        dev = set(DEV_POST_ROUTES) | set(DEV_GET_ROUTES)
        assert not {p: n for p, n in seen.items() if p in dev or "sleep" in p or "wake" in p or "rpc" in p}, seen
        assert all(s >= 400 for s in statuses.values()), statuses
        # The engine itself has them (dev mode), so the refusal is the router's.
        assert _send(engine.port, "GET", "/is_sleeping") == 200
