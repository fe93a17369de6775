"""The engine host's supervisor (warmstart/podside/engine_host) run for real: its own process on
127.0.0.1, starting fake engines (tests/podside/fake_pooled_engine.py: vLLM 0.33.0's sleep API and
a load time) as the subprocesses it supervises, on ports the test chose.

What is checked: engines start one at a time in order, each asleep before the next starts; the
folded /health; one engine killed is restarted alone (the others keep their processes); a restart
waits while another engine is awake; the actuator's routes (one awake engine per host, the host's
sleep level, only `reload_weights` through /collective_rpc); a bad spec is one line and exit 2; a
SIGTERM stops every engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.podside.engine_hosts import ROOT, alive, call, wait_until

pytestmark = pytest.mark.servers  # the supervisor and its fake engines are real processes


def test_engines_start_one_at_a_time_each_asleep_before_the_next_and_health_folds_them(host_factory) -> None:
    models = ["m0", "m1", "m2", "m3"]
    h = host_factory(models)
    assert call("GET", h.url + "/health")[0] == 503  # not a spare until every engine sleeps
    assert call("GET", h.url + "/livez")[0] == 200
    h.wait_all_asleep()
    code, body = call("GET", h.url + "/health")
    assert code == 200 and [e["state"] for e in body["engines"]] == ["asleep"] * 4
    ev = h.events()
    starts = {e["model"]: e["t"] for e in ev if e["event"] == "start"}
    sleeps = {e["model"]: e["t"] for e in ev if e["event"] == "sleep"}
    assert sorted(starts, key=starts.get) == models  # in order
    for before, after in zip(models, models[1:]):
        # vLLM sizes its KV cache from the free memory it sees at start: the next engine starts only
        # once the one before sleeps.
        assert sleeps[before] <= starts[after], (before, after, ev)
    assert all(e["event"] != "wake_up" for e in ev)


def test_one_engine_killed_is_restarted_alone(host_factory) -> None:
    h = host_factory(["m0", "m1", "m2"])
    h.wait_all_asleep()
    before = {m: h.pid(m) for m in ("m0", "m1", "m2")}
    os.kill(before["m1"], signal.SIGKILL)
    wait_until("m1 failed", lambda: h.state("m1") in ("failed", "starting"))
    assert call("GET", h.url + "/health")[0] == 503
    h.wait_all_asleep()
    after = {m: h.pid(m) for m in ("m0", "m1", "m2")}
    assert after["m1"] != before["m1"]
    assert (after["m0"], after["m2"]) == (before["m0"], before["m2"])  # never restarted with it
    m1 = next(e for e in h.status()["engines"] if e["model"] == "m1")
    assert m1["restarts"] == 1 and "exited" in m1["lastError"]
    # The dead engine's own children (vLLM's engine core and TP workers, which hold its GPU memory)
    # went with it; the other engines' did not.
    old_worker, new_worker = h.workers("m1")
    assert not alive(old_worker) and alive(new_worker)
    assert all(alive(h.workers(m)[0]) for m in ("m0", "m2"))


def test_the_actuators_routes_keep_one_awake_engine_per_host(host_factory) -> None:
    h = host_factory(["m0", "m1", "m2"])
    h.wait_all_asleep()
    e = h.url + "/engines"
    assert call("POST", f"{e}/m1/v1/completions", {"prompt": "x", "max_tokens": 1})[0] == 409  # asleep
    code, body = call("POST", f"{e}/m1/wake_up")
    assert code == 200 and body["status"] == "awake"
    wait_until("m1 awake", lambda: h.state("m1") == "awake")
    snap = h.status()
    assert snap["awake"] == "m1" and not snap["spare"]
    assert call("GET", f"{e}/m1/is_sleeping")[1] == {"is_sleeping": False}
    # A second wake on the same GPU set is refused, never sent to the engine.
    code, body = call("POST", f"{e}/m2/wake_up")
    assert code == 409 and "m1 is awake" in body["error"]
    assert not any(x["event"] == "wake_up" and x["model"] == "m2" for x in h.events())
    # The warm-up token reaches the awake engine; its metrics pass through for the actuator.
    code, body = call("POST", f"{e}/m1/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert code == 200 and body["choices"][0]["text"] == "m1"
    code, text = call("GET", f"{e}/m1/metrics")
    assert code == 200 and b"vllm:num_requests_waiting" in text
    # Only the host's own level, and only the level-2 wake's reload through /collective_rpc.
    assert call("POST", f"{e}/m1/sleep?level=2")[0] == 422
    assert call("POST", f"{e}/m1/collective_rpc", {"method": "execute_model"})[0] == 403
    assert call("POST", f"{e}/m1/collective_rpc", {"method": "reload_weights"})[0] == 200
    assert call("POST", f"{e}/m1/server_info")[0] == 404
    assert call("GET", f"{e}/nope/health")[0] == 404
    code, _ = call("POST", f"{e}/m1/sleep?level=1&mode=wait")
    assert code == 200 and h.state("m1") == "asleep" and h.status()["spare"]
    assert call("POST", f"{e}/m2/wake_up")[0] == 200


def test_a_wedged_engine_is_restarted_after_three_missed_health_checks_and_the_loop_keeps_running(host_factory) -> None:
    h = host_factory(["m0", "m1"])
    h.wait_all_asleep()
    wedged = h.pid("m1")
    os.kill(wedged, signal.SIGSTOP)  # its socket still accepts; nothing answers (a hung engine)
    try:
        wait_until("m1 restarted", lambda: h.pid("m1") not in (None, wedged))
        assert call("GET", h.url + "/livez")[0] == 200
        h.wait_all_asleep()
        m1 = next(e for e in h.status()["engines"] if e["model"] == "m1")
        assert "/health failed 3 times in a row" in m1["lastError"] and m1["restarts"] == 1
    finally:
        try:
            os.kill(wedged, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_failed_engine_waits_for_the_awake_one_to_sleep_before_it_starts_again(host_factory) -> None:
    h = host_factory(["m0", "m1"])
    h.wait_all_asleep()
    assert call("POST", h.url + "/engines/m0/wake_up")[0] == 200
    old = h.pid("m1")
    os.kill(old, signal.SIGKILL)
    wait_until("m1 failed", lambda: h.state("m1") == "failed")
    time.sleep(3.0)  # past its backoff (0.5 s, at most 2 s): still not started beside the awake engine
    assert h.state("m1") == "failed"
    assert [x for x in h.events() if x["model"] == "m1" and x["event"] == "start"][-1]["pid"] == old
    assert call("POST", h.url + "/engines/m0/sleep?level=1")[0] == 200
    h.wait_all_asleep()
    assert h.pid("m1") not in (None, old)


def test_an_engine_that_never_loads_is_cut_at_its_timeout_and_the_next_one_still_starts(host_factory) -> None:
    h = host_factory(["m0", "m1"], load_s={"m0": 600}, extra={"startupTimeoutSeconds": 2})
    wait_until("m1 asleep", lambda: h.state("m1") == "asleep")
    m0 = next(e for e in h.status()["engines"] if e["model"] == "m0")
    assert m0["state"] in ("failed", "starting") and "no /health within 2 s" in m0["lastError"]


def test_an_engine_that_cannot_be_started_is_reported_and_the_others_still_start(host_factory, tmp_path: Path) -> None:
    h = host_factory(["m0", "m1"], argv={"m0": [str(tmp_path / "no-such-vllm")]})
    wait_until("m1 asleep", lambda: h.state("m1") == "asleep")
    m0 = next(e for e in h.status()["engines"] if e["model"] == "m0")
    assert m0["state"] in ("failed", "starting") and "could not start" in m0["lastError"]
    assert call("GET", h.url + "/health")[0] == 503


def test_a_sigterm_stops_every_engine_and_exits_0(host_factory) -> None:
    h = host_factory(["m0", "m1"])
    h.wait_all_asleep()
    pids = [h.pid("m0"), h.pid("m1"), *h.workers("m0"), *h.workers("m1")]
    assert len(pids) == 4
    h.stop()
    assert h.proc.returncode == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("spec, words", [
    ({"engines": []}, "engines must be a list of 1 to"),
    ({"engines": [{"model": "A_b", "port": 9000, "argv": ["x"]}]}, "engines[0].model"),
    ({"engines": [{"model": "a", "port": 80, "argv": ["x"]}]}, "engines[0].port"),
    ({"sleepLevel": 3, "engines": [{"model": "a", "port": 9000, "argv": ["x"]}]}, "sleepLevel must be 1 or 2"),
    ({"engines": [{"model": "a", "port": 9000, "argv": ["x"]}], "extra": 1}, "unknown field"),
])
def test_a_bad_spec_is_one_line_naming_the_field_and_exit_2(tmp_path: Path, spec: dict, words: str) -> None:
    f = tmp_path / "spec.json"
    f.write_text(json.dumps(spec))
    r = subprocess.run([sys.executable, "-m", "warmstart.podside.engine_host", "--spec", str(f), "--port", "0",
                        "--host", "127.0.0.1"], capture_output=True, text=True, cwd=str(ROOT), timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_two_hosts_serve_rises_in_order_and_a_third_gets_a_prompt_no(host_factory) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from warmstart.podside.engine_host import pool

    a, b = host_factory(["m0", "m1", "m2"]), host_factory(["m0", "m1", "m2"])
    a.wait_all_asleep()
    b.wait_all_asleep()
    views = [pool.parse_snapshot(name, h.url, h.status()) for name, h in (("ha", a), ("hb", b))]
    wakes, cold = pool.assign(views, [(1.0, "m0"), (2.0, "m1"), (3.0, "m2")])
    assert [(w.model, w.host) for w in wakes] == [("m0", "ha"), ("m1", "hb")] and cold == ["m2"]
    with ThreadPoolExecutor(2) as ex:  # both wakes at once, through each host's supervisor
        codes = list(ex.map(lambda w: call("POST", w.engine_url + "/wake_up")[0], wakes))
    assert codes == [200, 200]
    assert (a.status()["awake"], b.status()["awake"]) == ("m0", "m1")
    # The cold one is told no at once by either host, never held.
    started = time.monotonic()
    assert call("POST", a.url + "/engines/m2/wake_up", timeout=5)[0] == 409
    assert time.monotonic() - started < 5
    views = [pool.parse_snapshot(name, h.url, h.status()) for name, h in (("ha", a), ("hb", b))]
    assert pool.desired_hosts(views, spares=1) == 3
    assert pool.deletion_costs(views) == {"ha": "0", "hb": "0"}


def test_the_spec_is_read_through_a_configmaps_links(tmp_path: Path) -> None:
    """The kubelet mounts a ConfigMap key as `spec.json -> ..data/spec.json`, `..data -> ..<timestamp>`
    (kubernetes pkg/volume/util/atomic_writer.go): the supervisor reads the file they name."""
    from warmstart.podside.engine_host.spec import load

    stamped = tmp_path / "..2026_12_05_00_00_00.1"
    stamped.mkdir()
    (stamped / "spec.json").write_text(json.dumps({"engines": [{"model": "a", "port": 9000, "argv": ["x"]}]}))
    (tmp_path / "..data").symlink_to(stamped.name)
    (tmp_path / "spec.json").symlink_to("..data/spec.json")
    assert [e.model for e in load(tmp_path / "spec.json").engines] == ["a"]
