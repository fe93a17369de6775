"""The serving pod's source picker against temporary node directories, run as the pod runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.weights_select import DIGEST, FILES, SOURCE, pick, write_copy
from warmstart.podside import weights_select

pytestmark = pytest.mark.servers  # the picker script as a subprocess


def _truncate(root: Path) -> None:
    (root / DIGEST / "model.safetensors").write_bytes(b"w" * 100)


@pytest.mark.parametrize("prepare, choice, reason", [
    (lambda r: write_copy(r), "local", "complete copy of this digest on the node"),
    (lambda r: write_copy(r, f"{DIGEST}.partial", marker=False), "s3",
     "staging in progress on this node (partial copy, not used)"),
    (lambda r: write_copy(r, marker=False), "s3", "incomplete: no completion marker"),
    (lambda r: r.mkdir(parents=True), "s3", "not staged on this node"),
    (lambda r: None, "s3", "not staged on this node"),
    (lambda r: write_copy(r, digest="ffffffffffff"), "s3", "wrong digest: the copy is s3://models/llama/v1@ffffffffffff"),
    (lambda r: write_copy(r, source="s3://models/llama/v0"), "s3", "wrong digest: the copy is s3://models/llama/v0@"),
    (lambda r: (write_copy(r), _truncate(r)), "s3",
     "wrong size: model.safetensors is 100 bytes, the source listed 4096"),
    (lambda r: (write_copy(r), (r / DIGEST / "config.json").unlink()), "s3", "missing file: config.json"),
    (lambda r: write_copy(r, files={"config.json": b"{}"}), "s3", "no safetensors files in the copy"),
    (lambda r: (r / DIGEST).mkdir(parents=True) or (r / DIGEST / weights_select.MARKER).write_text("{"), "s3",
     "unreadable completion marker"),
])
def test_the_choice_and_its_log_line(tmp_path: Path, prepare, choice: str, reason: str) -> None:
    prepare(tmp_path / "weights")
    rc, line, out = pick(tmp_path)
    assert rc == 0 and line["event"] == "warmstart.weights"
    assert line["choice"] == choice and line["reason"].startswith(reason), line
    expected_path = f"/weights/{DIGEST}" if choice == "local" else SOURCE
    assert line["path"] == expected_path == (out / "model-path").read_text()
    assert json.loads((out / "choice.json").read_text())["choice"] == choice
    if choice == "local":
        assert line["bytes"] == sum(map(len, FILES.values())) and line["files"] == len(FILES)


def test_missing_inputs_fall_back_to_the_source_and_exit_zero(tmp_path: Path) -> None:
    rc, line, out = pick(tmp_path, WARMSTART_WEIGHTS_DIGEST="")
    assert rc == 0 and line["choice"] == "s3" and "must be set" in line["reason"]
    assert (out / "model-path").read_text() == SOURCE


def test_an_unwritable_output_still_exits_zero_and_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc, line, _ = pick(tmp_path, WARMSTART_WEIGHTS_OUT=str(blocker / "sub"))
    assert rc == 0 and "model path not written" in line["reason"] and "choice not written" in line["reason"]


def test_a_local_choice_is_kept_only_with_both_files(tmp_path: Path) -> None:
    """vLLM reads model-path, the compile-cache key reads choice.json, and a missing file means
    S3 to both: a local choice whose choice.json cannot be written must not leave a local
    model-path behind (vLLM and the key would disagree, and one mode would miss its cache)."""
    write_copy(tmp_path / "weights")
    out = tmp_path / "run"
    out.mkdir()
    (out / weights_select.CHOICE_FILE).mkdir()  # a directory where the file goes: os.replace fails
    rc, line, _ = pick(tmp_path)
    assert rc == 0 and line["choice"] == "s3" and "choice not written" in line["reason"]
    assert not (out / weights_select.MODEL_PATH_FILE).exists()


def test_a_pod_that_streams_asks_the_node_copier_to_pause(tmp_path: Path) -> None:
    rc, line, _ = pick(tmp_path, WARMSTART_LOADING_HOLD_S="120", POD_UID="pod-1")
    request = json.loads((tmp_path / "weights" / weights_select.LOADING_DIR / "pod-1.json").read_text())
    assert line["choice"] == "s3" and request["pod"] == "pod-1" and request["until"] > 0
    write_copy(tmp_path / "weights")
    (tmp_path / "weights" / weights_select.LOADING_DIR / "pod-1.json").unlink()
    _, line, _ = pick(tmp_path, WARMSTART_LOADING_HOLD_S="120", POD_UID="pod-2")
    assert line["choice"] == "local"  # a pod that reads locally does not hold the copier back
    assert not (tmp_path / "weights" / weights_select.LOADING_DIR / "pod-2.json").exists()
