"""`warmstart wake-bench` (warmstart/coldstart/command.py, warmstart/podside/wake_bench.py): the
script run exactly as the command runs it in the vLLM container (`python3 -c <source> ...`),
against a fake engine implementing vLLM's sleep API (tests/routing/fake_vllm.py, wake modelled per
GiB), and its record filed in a real S3 server (rclone) where `warmstart coldstart --history`
reads it as a `standby wake`. Bounded waits only; nothing is timed against a bound."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import types
import urllib.request

import pytest

from tests.podside.servers import BUCKET
from tests.routing.fake_vllm import MODEL, FakeVllm
from warmstart.coldstart import command, history
from warmstart.decisions.standby import plan_standby
from warmstart.manifests.first_token import record_prefix

pytestmark = [pytest.mark.slow, pytest.mark.servers]  # fake engines, the script as a subprocess

GIB = 2**30
WEIGHTS_GIB = 2.0
S_PER_GIB = 0.25  # a modelled 0.5 s wake, long enough to be seen above the calls' own time


def _model(level: int = 1):
    standby = plan_standby(count=1, sleep_level=level, awake_idle_seconds=300, weights_bytes=int(WEIGHTS_GIB * GIB))
    return types.SimpleNamespace(name=MODEL, weights_bytes=int(WEIGHTS_GIB * GIB), standby=standby)


def _run(engine: FakeVllm, level: int = 1) -> tuple[int, dict]:
    cmd = command.wake_bench_command(_model(level), timeout=60)
    assert cmd[:2] == ["python3", "-c"]
    proc = subprocess.run([sys.executable, *cmd[1:], "--url", engine.url], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "HOSTNAME": "m-abc12"})
    record = command.parse_wake_output(proc.stdout)
    assert record is not None, proc.stdout + proc.stderr
    return proc.returncode, record


def _engine(**kw) -> FakeVllm:
    return FakeVllm("w", dev_mode=True, weights_gib=WEIGHTS_GIB, wake_s_per_gib=S_PER_GIB, **kw)


def test_an_idle_awake_engine_is_slept_woken_and_served_and_left_awake():
    with _engine() as engine:
        code, record = _run(engine)
        assert code == 0 and record["result"] == "ok", record
        assert record["kind"] == "wake" and record["flags"] == {"sleep_level": 1, "measured": True, "was_asleep": False}
        assert set(record["phases"]) == {"sleep", "wake", "first_token"}
        assert record["phases"]["wake"] >= WEIGHTS_GIB * S_PER_GIB, "the modelled wake is inside the wake phase"
        assert record["weights_bytes"] == int(WEIGHTS_GIB * GIB) and record["pod"] == "m-abc12"
        assert record["wake_gib_per_s"] == pytest.approx(WEIGHTS_GIB / record["phases"]["wake"], rel=0.01)
        assert engine.get("/is_sleeping") == {"is_sleeping": False}, "left as it was found"
        # The same split as the actuator's wakes in the cold-start history.
        assert history.split_key(record) == ("standby wake", "sleep level 1", "-")


def test_a_sleeping_standby_engine_is_woken_measured_and_put_back_to_sleep():
    with _engine(asleep=True) as engine:
        code, record = _run(engine, level=2)
        assert code == 0, record
        assert set(record["phases"]) == {"wake", "first_token"}, "nothing to put to sleep first"
        assert record["flags"]["was_asleep"] is True and record["level"] == 2
        assert engine.get("/is_sleeping") == {"is_sleeping": True}
        # the level-2 wake reloads the weights, as the actuator's does
        assert "/collective_rpc" in engine.stats()["paths"]


def test_an_engine_without_sleep_mode_is_one_clear_error():
    with FakeVllm("plain") as engine:
        code, record = _run(engine)
        assert code == 1 and record["result"] == "error" and "no sleep mode" in record["reason"]


def test_an_engine_that_is_serving_is_not_put_to_sleep():
    with _engine() as engine:
        engine.set_delay(4000)
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1}).encode()
        req = urllib.request.Request(engine.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"}, method="POST")
        t = threading.Thread(target=lambda: urllib.request.urlopen(req, timeout=30).read(), daemon=True)
        t.start()
        for _ in range(100):
            text = urllib.request.urlopen(engine.url + "/metrics", timeout=5).read().decode()
            if any(line.startswith("vllm:num_requests_running") and not line.rstrip().endswith(" 0")
                   for line in text.splitlines()):
                break
            t.join(0.05)
        code, record = _run(engine)
        t.join(30)
        assert code == 1 and "serving" in record["reason"]
        assert engine.get("/is_sleeping") == {"is_sleeping": False}


def test_the_record_is_filed_where_the_history_reads_it(rclone_s3):
    with _engine(asleep=True) as engine:
        _, record = _run(engine)
    plan = types.SimpleNamespace(aws=types.SimpleNamespace(compile_cache_bucket=BUCKET),
                                 config=types.SimpleNamespace(region="us-east-1"))
    m = _model()
    s3 = rclone_s3.client()
    assert command._upload_wake(plan, m, record, s3=s3) == 0
    key = command.wake_record_key(m.name, record)
    assert key.startswith(record_prefix(m.name)) and key.endswith(".json")
    records = history.read_records(s3, BUCKET, record_prefix(m.name))
    (filed,) = [r for r in records if r.get("kind") == "wake" and r.get("written_at") == record["written_at"]]
    summary = history.summarise([filed])
    assert set(summary[("standby wake", "sleep level 1", "-")]) == {"wake", "first_token"}


def test_the_sleeper_picked_by_default_is_a_ready_pod_the_actuator_labelled_asleep():
    from warmstart.manifests import serving
    from warmstart.podside.standby import observe as standby

    def pod(name, phase, ready, engine):
        return {"metadata": {"name": name, "labels": {serving.ENGINE_LABEL: engine}},
                "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    assert command._pick_sleeper([pod("a", "Running", True, standby.AWAKE), pod("b", "Pending", False, standby.ASLEEP),
                                  pod("c", "Running", False, standby.AWAKE), pod("d", "Running", True, standby.ASLEEP)]
                                 ) == "d"
    assert command._pick_sleeper([pod("a", "Running", True, standby.AWAKE), pod("c", "Running", False, standby.AWAKE)]
                                 ) is None, "awake, or still loading: not a sleeper"


def test_the_command_fails_clearly_without_standby_or_a_cluster(tmp_path, capsys):
    from warmstart import cli

    assert cli.main(["wake-bench", "--stack", "dev", "--kubeconfig", str(tmp_path / "none")]) == cli.EXIT_FAILED
    assert "no standby engines" in capsys.readouterr().err
    assert cli.main(["wake-bench", "--stack", "prod", "--model", "qwen-67b",
                     "--kubeconfig", str(tmp_path / "none")]) == cli.EXIT_PREREQUISITES
    err = capsys.readouterr().err
    assert err.startswith("warmstart: ") and "Traceback" not in err


def test_the_sleepers_host_memory_is_read_from_the_containers_cgroup_while_it_sleeps(tmp_path):
    """memory.current and memory.peak of the container, read after the sleep and before the wake
    (the weights are pinned by vLLM's worker processes, which only the cgroup sees), beside the
    render's prediction."""
    from warmstart.podside import wake_bench

    (tmp_path / "memory.current").write_text(f"{int(2.4 * GIB)}\n")
    (tmp_path / "memory.peak").write_text(f"{int(2.6 * GIB)}\n")
    predicted = _model().standby.sleeping_host_bytes
    with _engine() as engine:
        record = wake_bench.measure(engine.url, MODEL, 1, int(WEIGHTS_GIB * GIB), 60, predicted, str(tmp_path))
    mem = record["host_memory"]
    assert (mem["asleep_bytes"], mem["peak_bytes"], mem["predicted_bytes"]) == (int(2.4 * GIB), int(2.6 * GIB),
                                                                                 predicted)
    assert mem["asleep_per_weight"] == pytest.approx(1.2, abs=0.001)
    assert mem["peak_per_prediction"] == pytest.approx(2.6 * GIB / predicted, abs=0.001)
    # A cgroup v1 node: the same figures from its own files; none readable: no figure, no failure.
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.usage_in_bytes").write_text("100\n")
    (v1 / "memory.max_usage_in_bytes").write_text("200\n")
    assert wake_bench.cgroup_memory(str(tmp_path / "v1")) == {"current": 100, "peak": 200}
    assert wake_bench.cgroup_memory(str(tmp_path / "none")) == {}


def test_the_command_passes_the_renders_prediction_to_the_script():
    cmd = command.wake_bench_command(_model(), timeout=60)
    assert cmd[cmd.index("--predicted-host-bytes") + 1] == str(_model().standby.sleeping_host_bytes)


# --- k sleepers on one engine host (issue 38): `wake-bench --pool` ------------------------------

MIB = 2**20


def _fake_smi(folder, lines: str, code: int = 0):
    """A stand-in `nvidia-smi` on PATH printing the query's CSV lines (index, memory.used MiB, memory.total MiB)."""
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{lines}\nEOF\nexit {code}\n")
    smi.chmod(0o755)
    return {"PATH": f"{folder}:/usr/bin:/bin", "HOSTNAME": "pool-host-1"}


def _residue(url: str, env: dict) -> tuple[int, dict]:
    cmd = command.residue_command(timeout=60)
    assert cmd[:2] == ["python3", "-c"]
    proc = subprocess.run([sys.executable, *cmd[1:], "--residue-of", url], capture_output=True, text=True,
                          timeout=120, env=env)
    record = command.parse_residue_output(proc.stdout)
    assert record is not None, proc.stdout + proc.stderr
    return proc.returncode, record


@pytest.fixture
def engine_host(tmp_path):
    from tests.podside.engine_hosts import hosts_in

    hosts = hosts_in(tmp_path)
    yield next(hosts)
    next(hosts, None)


def test_k_sleepers_residue_is_the_fullest_gpus_use_over_k_on_a_spare_host(engine_host, tmp_path):
    host = engine_host(["m0", "m1", "m2"])
    host.wait_all_asleep()
    env = _fake_smi(tmp_path / "bin", "0, 15000, 81559\n1, 15360, 81559")
    code, record = _residue(host.url, env)
    assert code == 0 and record["result"] == "ok", record
    assert record["kind"] == "residue" and record["sleepers"] == 3 and record["models"] == ["m0", "m1", "m2"]
    assert record["used_bytes_max"] == 15360 * MIB
    assert record["residue_bytes_per_sleeper"] == 5120 * MIB and record["residue_gib_per_sleeper"] == 5.0
    assert [g["index"] for g in record["gpus"]] == [0, 1] and record["pod"] == "pool-host-1"
    line = command.residue_summary(record, 4 * GIB)
    assert "3 sleepers (m0, m1, m2) keep 15.0 GiB of GPU 1's 80 GiB: 5.00 GiB per sleeper per GPU" in line
    assert "1.25x the planning default 4 GiB" in line and "sleepingResidueGiB to 5.0" in line

    # An engine awake on the host: not sleepers alone, refused rather than measured.
    assert call_post(host.url + "/engines/m1/wake_up") == 200
    code, record = _residue(host.url, env)
    assert code == 1 and "not a spare" in record["reason"] and "m1 awake" in record["reason"]


def test_the_residue_bench_says_what_is_wrong_with_nvidia_smi(engine_host, tmp_path):
    host = engine_host(["m0"])
    host.wait_all_asleep()
    code, record = _residue(host.url, {"PATH": str(tmp_path / "empty")})
    assert code == 1 and "nvidia-smi could not run" in record["reason"]
    code, record = _residue(host.url, _fake_smi(tmp_path / "bad", "0, N/A, 81559"))
    assert code == 1 and "not index, memory.used, memory.total" in record["reason"]
    code, record = _residue(host.url, _fake_smi(tmp_path / "fails", "", code=9))
    assert code == 1 and "exited 9" in record["reason"]
    code, record = _residue("http://127.0.0.1:9", _fake_smi(tmp_path / "ok", "0, 1, 2"))
    assert code == 1 and record["result"] == "error"


def call_post(url: str) -> int:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status


def test_the_pool_bench_fails_clearly_without_a_cluster(tmp_path, capsys):
    from warmstart import cli

    assert cli.main(["wake-bench", "--stack", "prod", "--pool", "shared", "--kubeconfig",
                     str(tmp_path / "none")]) == cli.EXIT_PREREQUISITES
    err = capsys.readouterr().err
    assert err.startswith("warmstart: ") and "Traceback" not in err
