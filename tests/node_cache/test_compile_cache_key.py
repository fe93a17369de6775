"""The compile-cache key across load modes: a cache published by a pod that streamed from S3
must not be a silent, permanent miss for pods that load the same model from NVMe.

vLLM hashes the model path into its torch.compile cache directory (`ModelConfig.compute_hash`
keeps `model`; https://github.com/vllm-project/vllm/blob/main/vllm/config/model.py, and
`vllm/compilation/backends.py` builds `torch_compile_cache/<hash>`). A pod that streams from
S3 and one that reads `/weights/<digest>` therefore compile into different directories. If
both modes share one warmstart key, whichever publishes first wins the key (a conditional
write) and the other mode restores a cache it cannot use, compiles, and can never publish.

`vllm_dir()` below stands in for vLLM's directory choice (a hash of the model path); the
restore and publish are the real pod-side tool against the session's S3 server.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.podside.pods import pod_factory
from warmstart.decisions.node_cache import container_model_path, model_version_digest
from warmstart.podside.compile_cache import key as compile_cache_key
from warmstart.podside.compile_cache import main as cc

pytestmark = pytest.mark.servers  # pod scripts as subprocesses

SOURCE = "s3://team-models/llama/v1"
LOCAL = container_model_path(model_version_digest(SOURCE))


def vllm_dir(model_path: str) -> str:
    return f"vllm/torch_compile_cache/{hashlib.sha256(model_path.encode()).hexdigest()[:10]}"


def compile_into(cache_dir: Path, model_path: str) -> None:
    d = cache_dir / vllm_dir(model_path) / "rank_0_0"
    d.mkdir(parents=True, exist_ok=True)
    (d / "artifact").write_bytes(model_path.encode())


def pod_in_mode(make, node: str, mode: str, tmp_path: Path, path: str | None = None):
    choice = tmp_path / f"{node}-choice.json"
    choice.write_text(json.dumps({"choice": mode, "path": path or (LOCAL if mode == "local" else SOURCE)}))
    # What the pod wiring sets (manifests.node_cache.compile_cache_choice_wiring).
    return make(node, WARMSTART_WEIGHTS_CHOICE_FILE=str(choice))


def test_the_load_mode_is_in_the_key_and_a_missing_choice_means_s3(tmp_path: Path, rclone_s3) -> None:
    make = pod_factory(tmp_path, rclone_s3, "http://127.0.0.1:9/health")
    s3_pod, local_pod = pod_in_mode(make, "node-a", "s3", tmp_path), pod_in_mode(make, "node-b", "local", tmp_path)
    assert s3_pod.key() != local_pod.key()
    assert cc.compute_factors(local_pod.settings())["weights"] == f"local:{LOCAL}"
    # A pod without the node cache streams from S3, as an S3-mode pod does: one key for both.
    assert make("node-c").key() == s3_pod.key()
    # Two staged versions are two vLLM directories, so two keys.
    other = pod_in_mode(make, "node-d", "local", tmp_path, path=container_model_path("0" * 12))
    assert other.key() != local_pod.key()


@pytest.mark.parametrize("content", [
    None,  # the picker never ran (no node cache, or it failed before writing)
    b"",
    b"{not json",
    b"\xff\xfe",
    b"[]",
    b'{"choice": "nvme", "path": "/weights/x"}',
    b'{"choice": "local"}',
    b'{"choice": "local", "path": "weights/relative"}',
    b'{"choice": "local", "path": 7}',
    b'{"choice": "local", "path": "/weights/x", "pad": "' + b"x" * (70 << 10) + b'"}',  # past the 64 KiB bound
], ids=["missing", "empty", "malformed", "not-utf8", "not-an-object", "unknown-choice", "no-path", "relative",
        "path-not-a-string", "too-large"])
def test_anything_but_a_well_formed_local_choice_is_s3(tmp_path: Path, content: bytes | None) -> None:
    f = tmp_path / "choice.json"
    if content is not None:
        f.write_bytes(content)
    assert compile_cache_key.weights_factor(f) == "s3"


def test_an_unreadable_choice_is_s3_and_the_tool_still_runs(tmp_path: Path, rclone_s3) -> None:
    make = pod_factory(tmp_path, rclone_s3, "http://127.0.0.1:9/health")
    (tmp_path / "a-directory").mkdir()
    pod = make("node-a", WARMSTART_WEIGHTS_CHOICE_FILE=str(tmp_path / "a-directory"))
    assert cc.compute_factors(pod.settings())["weights"] == "s3"
    line = pod.run("restore").line  # the command as the pod runs it: one line, exit 0
    assert line["result"] == "miss"


def test_the_picker_output_is_what_the_key_reads(tmp_path: Path) -> None:
    """The real picker's choice.json, for a complete copy and for none, gives the two factors."""
    from tests.support.weights_select import DIGEST, pick, write_copy

    write_copy(tmp_path / "weights")
    _, line, out = pick(tmp_path)
    assert line["choice"] == "local"
    assert compile_cache_key.weights_factor(out / "choice.json") == f"local:/weights/{DIGEST}"
    assert (out / "model-path").read_text() == f"/weights/{DIGEST}"
    _, line, out = pick(tmp_path, WARMSTART_WEIGHTS_DIGEST="ffffffffffff")
    assert line["choice"] == "s3" and compile_cache_key.weights_factor(out / "choice.json") == "s3"


def test_a_cache_of_the_other_mode_is_not_a_permanent_miss(tmp_path: Path, rclone_s3) -> None:
    make = pod_factory(tmp_path, rclone_s3, "http://127.0.0.1:9/health")
    # Pod A streams from S3, compiles and publishes first.
    a = pod_in_mode(make, "node-a", "s3", tmp_path)
    compile_into(a.cache_dir, SOURCE)
    assert cc.publish(a.settings(), client=rclone_s3.client(), wait=False, emit=False).result == "published"
    # Pod B loads from NVMe on another node: restore, compile what vLLM did not find, publish.
    b = pod_in_mode(make, "node-b", "local", tmp_path)
    assert cc.restore(b.settings(), client=rclone_s3.client(), emit=False).result == "miss"
    if not (b.cache_dir / vllm_dir(LOCAL)).is_dir():
        compile_into(b.cache_dir, LOCAL)
    assert cc.publish(b.settings(), client=rclone_s3.client(), wait=False, emit=False).result == "published"
    # Pod C, NVMe mode on a third node, must now start warm.
    c = pod_in_mode(make, "node-c", "local", tmp_path)
    assert cc.restore(c.settings(), client=rclone_s3.client(), emit=False).result == "restored"
    assert (c.cache_dir / vllm_dir(LOCAL)).is_dir(), "NVMe-mode pods miss the compile cache forever"
    # And the S3 mode still hits its own.
    d = pod_in_mode(make, "node-d", "s3", tmp_path)
    assert cc.restore(d.settings(), client=rclone_s3.client(), emit=False).result == "restored"
    assert (d.cache_dir / vllm_dir(SOURCE)).is_dir()
    assert not (d.cache_dir / vllm_dir(LOCAL)).exists()
