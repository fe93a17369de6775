"""The staging script with the real s5cmd against a real S3 server (rclone) on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.node_cache import (
    SELECT,
    STAGE,
    Node,
    Version,
    digest_of,
    model_files,
    tree,
    wait_for,
)
from warmstart.podside import weights_select
from warmstart.podside.weights_stage import node as weights_stage_node
from warmstart.podside.weights_stage import settings as weights_stage_settings
from warmstart.podside.weights_stage import main as weights_stage

pytestmark = pytest.mark.servers  # the staging script with s5cmd against rclone






def test_complete_copy_is_promoted_with_its_marker_and_selected(node: Node, upload) -> None:
    v = upload(model_files(1))
    d = digest_of(v)
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d))
    assert rc == 0 and [(l["phase"], l["result"]) for l in lines] == [("stage", "staged")]
    assert lines[0]["bytes"] == sum(map(len, v.files.values())) and lines[0]["files"] == len(v.files)
    assert tree(node.root / d) == v.files
    marker = json.loads((node.root / d / weights_stage_settings.MARKER).read_text())
    assert {f["key"]: f["size"] for f in marker["files"]} == {k: len(b) for k, b in v.files.items()}
    assert all(f["etag"] for f in marker["files"])
    assert sorted(p.name for p in node.root.iterdir() if not p.name.startswith(".")) == [d]  # no partial left
    rc, (line,) = node.run(SELECT, env=node.env(v, d) | {"WARMSTART_WEIGHTS_OUT": str(node.root.parent / "out")})
    assert (line["choice"], line["path"]) == ("local", str(node.root / d))


def test_a_rerun_copies_nothing(node: Node, upload, rclone_s3) -> None:
    v = upload(model_files(2))
    d = digest_of(v)
    assert weights_stage.stage(node.settings(v, d), emit_line=False)["result"] == "staged"
    gets = {k: rclone_s3.count_gets(f"{v.prefix}/{k}") for k in v.files}
    mtimes = {p: p.stat().st_mtime_ns for p in (node.root / d).rglob("*")}
    again = weights_stage.stage(node.settings(v, d), emit_line=False)
    assert again["result"] == "present"
    assert {k: rclone_s3.count_gets(f"{v.prefix}/{k}") for k in v.files} == gets
    assert {p: p.stat().st_mtime_ns for p in (node.root / d).rglob("*")} == mtimes




def _partial_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.glob("*.partial/**/*") if p.is_file())


def test_an_interrupted_copy_is_never_promoted_and_resumes(node: Node, upload) -> None:
    v = upload({"big.safetensors": os.urandom(160 << 20), "config.json": b"{}"})
    d = digest_of(v)
    # Throttle with one worker so the kill lands mid-copy.
    proc = subprocess.Popen([sys.executable, str(STAGE), "stage"], env=node.env(v, d, WARMSTART_STAGE_WORKERS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert wait_for(lambda: _partial_bytes(node.root) > 0), "the copy never started"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the node dies: no cleanup runs
        proc.wait(timeout=10)
    assert not (node.root / d).exists()
    out = node.root.parent / "out"
    _, (line,) = node.run(SELECT, env=node.env(v, d) | {"WARMSTART_WEIGHTS_OUT": str(out)})
    assert (line["choice"], line["reason"]) == ("s3", "staging in progress on this node (partial copy, not used)")
    again = weights_stage.stage(node.settings(v, d), emit_line=False)
    assert again["result"] == "staged" and tree(node.root / d) == v.files  # s5cmd's temp file removed


def test_a_deadline_defers_and_never_promotes(node: Node, upload) -> None:
    v = upload({"big.safetensors": os.urandom(160 << 20)})
    d = digest_of(v)
    out = weights_stage.stage(node.settings(v, d, WARMSTART_STAGE_DEADLINE_S="0.5", WARMSTART_STAGE_WORKERS="1"),
                              emit_line=False)
    assert out["result"] == "deferred" and not (node.root / d).exists()


def test_a_listing_cut_by_the_deadline_defers(node: Node, upload, tmp_path: Path) -> None:
    """A listing slower than the deadline (a loaded node, a slow endpoint) is a deadline, not an
    error: the s5cmd `ls` here never answers and is killed at its timeout."""
    v = upload(model_files(3))
    slow = tmp_path / "s5cmd-slow-ls"
    slow.write_text(f'#!/bin/sh\ncase " $* " in *" ls "*) exec sleep 30 ;; esac\nexec "{node.s5cmd}" "$@"\n')
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    started = time.monotonic()
    out = weights_stage.stage(node.settings(v, digest_of(v), WARMSTART_STAGE_DEADLINE_S="0.5",
                                            WARMSTART_S5CMD=str(slow)), emit_line=False)
    assert out["result"] == "deferred" and "listing" in out["reason"], out
    assert time.monotonic() - started < 15  # the listing's 1 s timeout, not the fake's 30 s


def _wrapper(tmp: Path, real: str, after_sync: str) -> str:
    """An s5cmd that runs the real one, then tampers (a corrupt copy, a source that changed)."""
    script = tmp / "s5cmd-wrapper"
    script.write_text(f'#!/bin/sh\n"{real}" "$@"\nrc=$?\ncase " $* " in *" sync "*) for last; do :; done; '
                      f'{after_sync} ;; esac\nexit $rc\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_size_mismatch_is_refused_and_the_copy_dropped(node: Node, upload, tmp_path: Path) -> None:
    v = upload(model_files(3))
    d = digest_of(v)
    s5 = _wrapper(tmp_path, node.s5cmd, 'truncate -s 100 "${last}model-00001-of-00002.safetensors"')
    out = weights_stage.stage(node.settings(v, d, WARMSTART_S5CMD=s5), emit_line=False)
    assert out["result"] == "refused" and out["reason"].startswith("size mismatch: model-00001-of-00002.safetensors")
    assert not (node.root / d).exists() and not (node.root / f"{d}.partial").exists()


def test_a_listing_that_changed_during_the_copy_is_refused(node: Node, upload, tmp_path: Path, rclone_s3) -> None:
    v = upload(model_files(4))
    d = digest_of(v)
    extra = tmp_path / "late.safetensors"
    extra.write_bytes(b"late")
    s5 = _wrapper(tmp_path, node.s5cmd, f'"{node.s5cmd}" --endpoint-url {rclone_s3.endpoint} cp "{extra}" '
                                        f'"{v.source}/late.safetensors" >/dev/null')
    out = weights_stage.stage(node.settings(v, d, WARMSTART_S5CMD=s5), emit_line=False)
    assert out["result"] == "refused" and out["reason"].startswith("listing mismatch") and "late.safetensors" in out["reason"]
    assert not (node.root / d).exists()


def test_refuses_a_source_without_safetensors_or_objects(node: Node, upload) -> None:
    v = upload({"config.json": b"{}"})
    assert "no .safetensors" in weights_stage.stage(node.settings(v, digest_of(v)), emit_line=False)["reason"]
    empty = Version("node-cache/nothing-here", {})
    assert weights_stage.stage(node.settings(empty, "abc"), emit_line=False)["result"] == "refused"


def test_old_digests_are_removed_only_after_the_new_one_is_complete(node: Node, upload, tmp_path: Path) -> None:
    v1, v2, v3 = (upload(model_files(10 + i, mib=1)) for i in range(3))
    d1, d2, d3 = map(digest_of, (v1, v2, v3))
    assert weights_stage.stage(node.settings(v1, d1), emit_line=False)["result"] == "staged"
    time.sleep(0.01)
    assert weights_stage.stage(node.settings(v2, d2), emit_line=False)["removed"] == []  # d1 kept: the rollback
    # A failed attempt at d3 touches neither d1 nor d2.
    bad = _wrapper(tmp_path, node.s5cmd, 'truncate -s 1 "${last}config.json"')
    assert weights_stage.stage(node.settings(v3, d3, WARMSTART_S5CMD=bad), emit_line=False)["result"] == "refused"
    assert tree(node.root / d1) == v1.files and tree(node.root / d2) == v2.files
    done = weights_stage.stage(node.settings(v3, d3), emit_line=False)
    assert (done["result"], done["removed"]) == ("staged", [d1])
    assert sorted(p.name for p in node.root.iterdir() if not p.name.startswith(".")) == sorted([d2, d3])
    # Rolling back to d2 is a hit, and d3 is then the one kept.
    back = weights_stage.stage(node.settings(v2, d2), emit_line=False)
    assert back["result"] == "present" and (node.root / d3).is_dir()


def test_a_full_disk_leaves_the_previous_copy_intact(node: Node, upload, small_disk, tmp_path: Path) -> None:
    disk = small_disk("24m")
    if disk is None:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    root = disk / "weights" / "llama"
    n = Node(root, node.server, node.s5cmd)
    v1 = upload({"a.safetensors": os.urandom(8 << 20)})
    v2 = upload({"a.safetensors": os.urandom(9 << 20), "b.safetensors": os.urandom(3 << 20)})
    d1, d2 = digest_of(v1), digest_of(v2)
    assert weights_stage.stage(n.settings(v1, d1), emit_line=False)["result"] == "staged"
    # With the eviction threshold kept free, the copy is refused before a byte is written.
    early = weights_stage.stage(n.settings(v2, d2, WARMSTART_MIN_FREE_SHARE="0.5"), emit_line=False)
    assert early["result"] == "refused" and early["reason"].startswith("disk: the copy needs")
    assert not (root / f"{d2}.partial").exists()
    # Something else on the node (an image pull) takes the space after the check: the disk
    # really fills, s5cmd fails, the partial copy is dropped.
    ballast = disk / "ballast"
    script = tmp_path / "s5cmd-filling"
    script.write_text(f'#!/bin/sh\ncase " $* " in *" sync "*) head -c 8388608 /dev/zero > "{ballast}" ;; esac\n'
                      f'exec "{node.s5cmd}" "$@"\n')
    script.chmod(0o755)
    late = weights_stage.stage(n.settings(v2, d2, WARMSTART_S5CMD=str(script)), emit_line=False)
    assert late["result"] == "refused" and "disk full" in late["reason"], late
    assert not (root / f"{d2}.partial").exists() and not (root / d2).exists()
    assert tree(root / d1) == v1.files and weights_stage.complete(n.settings(v1, d1))
    ballast.unlink()
    assert weights_stage.stage(n.settings(v2, d2), emit_line=False)["result"] == "staged"
    assert tree(root / d1) == v1.files  # kept as the previous version


def test_staging_waits_while_a_serving_pod_streams_from_s3(node: Node, upload) -> None:
    """The serving pod's picker asks for a pause; staging starts only after it expires."""
    v = upload(model_files(5, mib=1))
    d = digest_of(v)
    out = node.root.parent / "out"
    env = node.env(v, d) | {"WARMSTART_WEIGHTS_OUT": str(out), "WARMSTART_LOADING_HOLD_S": "1.5", "POD_UID": "uid-1"}
    _, (line,) = node.run(SELECT, env=env)
    assert line["choice"] == "s3"
    assert weights_stage_node.loading_pods(node.settings(v, d)) == ["uid-1"]
    record = weights_stage.stage(node.settings(v, d), emit_line=False)
    assert record["result"] == "staged" and 1.0 <= record["paused_s"] <= 5
    assert weights_stage_node.loading_pods(node.settings(v, d)) == []  # expired requests are cleaned up


def test_a_copy_in_flight_stops_for_a_serving_pod_and_resumes(node: Node, upload) -> None:
    v = upload({"big.safetensors": os.urandom(160 << 20)})
    d = digest_of(v)
    proc = subprocess.Popen([sys.executable, str(STAGE), "stage"], env=node.env(v, d, WARMSTART_STAGE_WORKERS="1"),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: _partial_bytes(node.root) > 0)
        weights_select.request_pause(node.root, "uid-2", 2.0)
        time.sleep(0.6)  # a poll period and the copier's stop
        frozen = _partial_bytes(node.root)
        time.sleep(0.8)
        assert _partial_bytes(node.root) == frozen, "the copier kept using the network"
        stdout, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    (line,) = [json.loads(x) for x in stdout.splitlines()]
    assert line["result"] == "staged" and line["paused_s"] >= 1.0
    assert (node.root / d / "big.safetensors").stat().st_size == 160 << 20


def test_a_bad_environment_is_one_error_line_and_exit_zero(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(STAGE), "stage"], env={"PATH": os.environ["PATH"]},
                          capture_output=True, text=True, timeout=30)
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    assert proc.returncode == 0 and line["result"] == "error" and "WARMSTART_WEIGHTS_SOURCE" in line["reason"]
