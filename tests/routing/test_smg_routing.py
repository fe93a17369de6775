"""The real router (SMG 1.13.0 from its PyPI wheel) on 127.0.0.1 in front of fake vLLM replicas
(tests/routing/fake_vllm.py), with the routing flags warmstart renders: a prefix sticks to one
replica, a hot prefix spills once its replica is over the bound, a replica joining or leaving
moves only its own share of prefixes, a replica that stops answering is taken out, and the
entrypoint of the router pod closes the control plane."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.podside.servers import free_ports
from tests.routing.fake_vllm import FakeVllm
from tests.routing.router import SmgRouter, chat, served_by, write_discovery_file
from warmstart.decisions import routing
from warmstart.manifests import routing as router_objects

pytestmark = [pytest.mark.slow, pytest.mark.servers]  # the real smg router

# Long enough that the hashed span (256 tokens = 1024 characters) is the shared prefix only.
def system_prompt(tenant: int) -> str:
    return f"You are the assistant of tenant {tenant}. " * 40


def _fleet(stack: ExitStack, n: int, **kw) -> list[FakeVllm]:
    return [stack.enter_context(FakeVllm(f"w{i}", **kw)) for i in range(n)]


def _mapping(url: str, prefixes: int) -> dict[int, str]:
    """Prefix -> replica, one request at a time (no load, so every request is a ring hit)."""
    return {t: served_by(chat(url, system_prompt(t), "hello")) for t in range(prefixes)}


def test_a_prefix_sticks_to_one_replica_and_prefixes_spread():
    with ExitStack() as stack:
        fleet = _fleet(stack, 3)
        r = stack.enter_context(SmgRouter(
            [*routing.policy_flags("prefix_hash"), "--worker-urls", *(b.url for b in fleet)], wait_for_workers=3))
        seen: dict[int, set[str]] = {}
        for round_ in range(4):
            for tenant in range(12):
                seen.setdefault(tenant, set()).add(served_by(chat(r.url, system_prompt(tenant), f"q{round_}")))
        assert all(len(s) == 1 for s in seen.values()), seen
        assert len({next(iter(s)) for s in seen.values()}) >= 2, "every prefix on one replica"
        assert r.metric_sum("smg_prefix_hash_policy_branch_total", branch="ring_hit") == 48
        # The replica a prefix sticks to is the one that holds its cache: all but the first hit.
        stats = [b.stats() for b in fleet]
        hit = sum(s["hit_tokens"] for s in stats) / sum(s["prompt_tokens"] for s in stats)
        assert hit > 0.6, stats


def test_a_hot_prefix_spills_once_its_replica_is_over_the_bound():
    lf, abs_threshold, n = 1.25, 2, 24
    with ExitStack() as stack:
        fleet = _fleet(stack, 3, delay_ms=1500)
        r = stack.enter_context(SmgRouter(
            [*routing.policy_flags("prefix_hash", load_factor=lf, abs_threshold=abs_threshold),
             "--worker-urls", *(b.url for b in fleet)], wait_for_workers=3))
        with ThreadPoolExecutor(n) as pool:
            # One hot prefix, all requests in flight together.
            served = list(pool.map(lambda i: served_by(chat(r.url, system_prompt(7), f"q{i}")), range(n)))
        walks = r.metric_sum("smg_prefix_hash_policy_branch_total", branch="load_balance_walk")
        hits = r.metric_sum("smg_prefix_hash_policy_branch_total", branch="ring_hit")
        assert walks > 0 and hits > 0 and walks + hits == n
        hot = max(set(served), key=served.count)
        assert served.count(hot) < n and len(set(served)) == 3
        # SMG's bound (prefix_hash.rs load_ok) for the last request: avg = n / 3 replicas.
        avg = n / 3
        bound = max(avg * lf, avg + abs_threshold)
        peak = {s["name"]: s["max_inflight"] for s in (b.stats() for b in fleet)}
        assert peak[hot] <= int(bound) + 1, (peak, bound)


def test_adding_and_removing_a_replica_moves_only_its_share(tmp_path: Path):
    prefixes = 120
    manifest = tmp_path / "workers.json"
    with ExitStack() as stack:
        fleet = _fleet(stack, 4)
        write_discovery_file(manifest, [b.url for b in fleet[:3]])
        r = stack.enter_context(SmgRouter(
            [*routing.policy_flags("prefix_hash"), "--discovery-provider", "file", "--discovery-file", str(manifest),
             "--discovery-check-interval-secs", "1"], wait_for_workers=3))
        before = _mapping(r.url, prefixes)
        write_discovery_file(manifest, [b.url for b in fleet])
        r.wait_workers(4, 20)
        after = _mapping(r.url, prefixes)
        moved = {t for t in before if before[t] != after[t]}
        assert moved and {after[t] for t in moved} == {"w3"}, "only to the new replica"
        assert len(moved) / prefixes <= 1 / 4 + 0.12, len(moved)

        write_discovery_file(manifest, [b.url for b in fleet if b.name != "w1"])
        r.wait_workers(3, 20)
        removed = _mapping(r.url, prefixes)
        moved = {t for t in after if after[t] != removed[t]}
        assert moved == {t for t in after if after[t] == "w1"}, "exactly the removed replica's prefixes"
        assert "w1" not in removed.values()


def test_a_replica_that_stops_answering_is_taken_out():
    with ExitStack() as stack:
        fleet = _fleet(stack, 3)
        r = stack.enter_context(SmgRouter(
            [*routing.policy_flags("prefix_hash"), "--worker-urls", *(b.url for b in fleet),
             "--health-check-interval-secs", "1", "--health-check-timeout-secs", "1",
             "--health-failure-threshold", "2"], wait_for_workers=3))
        before = _mapping(r.url, 12)
        victim = fleet[int(before[0][1:])]
        victim.pause()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if all(w["url"] != victim.url or not w.get("is_healthy", True) for w in r.workers()):
                    break
                time.sleep(0.25)
            else:
                pytest.fail(f"{victim.name} still counted healthy: {r.workers()}")
            with ThreadPoolExecutor(4) as pool:
                after = dict(zip(range(12), pool.map(
                    lambda t: served_by(chat(r.url, system_prompt(t), "again", timeout_s=10)), range(12))))
            assert victim.name not in after.values()
            # Prefixes of the healthy replicas stay where they were.
            assert all(after[t] == before[t] for t in before if before[t] != victim.name)
        finally:
            victim.resume()


def test_the_router_is_ready_only_with_a_healthy_replica():
    with FakeVllm("w0") as backend, SmgRouter(routing.policy_flags("prefix_hash")) as r:
        def readiness() -> int:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{r.probe_port}/readiness", timeout=2) as resp:
                    return resp.status
            except urllib.error.HTTPError as e:
                return e.code
        assert readiness() == 503
        # The open control plane of a bare router is what the pod's entrypoint closes (below).
        assert r.call("POST", "/workers", {"url": backend.url})[0] in (200, 201, 202)
        r.wait_workers(1, 20)
        deadline = time.monotonic() + 10
        while readiness() != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert readiness() == 200


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.mark.parametrize("secret_key", [None, "key-from-the-secret"])
def test_the_pod_entrypoint_closes_the_control_plane(tmp_path: Path, secret_key):
    """The container's own command (sh -c ENTRYPOINT) with the real binary as `python3 -m
    smg.launch_router`: with the Secret's key only that key opens /workers; without a Secret a
    random key does, which nobody has."""
    port, metrics_port, probe_port = free_ports(3)
    env = {k: v for k, v in os.environ.items() if k != router_objects.CONTROL_PLANE_KEY_FILE_ENV}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    # The Secret's volume: the key file, or (no Secret) an empty directory.
    key_file = tmp_path / "key"
    if secret_key:
        key_file.write_text(secret_key)
    env[router_objects.CONTROL_PLANE_KEY_FILE_ENV] = str(key_file)
    log = tmp_path / "router.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", router_objects.ENTRYPOINT, "smg", "--host", "127.0.0.1", "--port", str(port),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
             "--health-check-port", str(probe_port), *routing.policy_flags("prefix_hash")],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        def status(headers: dict[str, str]) -> int:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/workers", headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    return resp.status
            except urllib.error.HTTPError as e:
                return e.code

        # Wait on the port that is then called: SMG binds its probe listener and its serving
        # listener separately, so a live /liveness does not mean /workers answers yet (under CPU
        # load the serving port was still refusing). Any HTTP answer on it means it serves.
        deadline = time.monotonic() + 60
        while True:
            try:
                first = status({})
                break
            except OSError as e:  # refused or timed out: not listening yet
                assert proc.poll() is None and time.monotonic() < deadline, (repr(e), log.read_text())
                time.sleep(0.1)
        assert first == 401
        assert status({"Authorization": "Bearer guess"}) == 401
        if secret_key:
            assert status({"Authorization": f"Bearer {secret_key}"}) == 200
        text = _strip_ansi(log.read_text())
        assert "SECURITY POSTURE" in text or "posture" in text
        assert 'control_plane="OPEN' not in text and '"control_plane":"OPEN' not in text, text[-2000:]
    finally:
        proc.kill()
        proc.wait(timeout=10)
