"""vLLM's startup plan on a node: kept while the memory settings it was measured under hold,
dropped before vLLM starts when they change (vLLM's own plan fingerprint leaves
--gpu-memory-utilization out), and a key factor, so S3 never hands a pod another setting's plan."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from tests.podside.pods import BASE_ENV, leftovers
from warmstart.decisions import cachekey
from warmstart.podside.compile_cache import main as cc

PLAN = "vllm/startup_plan/startup_plan_0123456789abcdef.json"


def node_pod(cache_dir: Path, fingerprint: str) -> cc.Settings:
    # No bucket: pre-warm off, which must not switch the node-local guard off.
    return cc.Settings.from_env({**BASE_ENV, "WARMSTART_CACHE_DIR": str(cache_dir), "WARMSTART_CACHE_BUCKET": "",
                                 "WARMSTART_STARTUP_PLAN_FINGERPRINT": fingerprint})


def write_plan(cache_dir: Path) -> Path:
    plan = cache_dir / PLAN
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_text(json.dumps({"schema": 1, "kv_cache_memory_bytes": 1 << 34}))
    return plan


def test_a_plan_survives_pods_with_the_same_memory_settings_and_not_a_change(tmp_path: Path) -> None:
    node = tmp_path / "node-a"
    util_90 = cachekey.startup_plan_fingerprint(["--gpu-memory-utilization=0.9"])
    util_80 = cachekey.startup_plan_fingerprint(["--gpu-memory-utilization=0.8"])
    first = cc.restore(node_pod(node, util_90), emit=False)
    assert first.result == "skipped"
    plan = write_plan(node)  # that pod's vLLM profiled and saved its plan
    assert cc.restore(node_pod(node, util_90), emit=False).reason.endswith("pre-warm is off")
    assert plan.is_file()  # the next pod with the same settings applies it
    changed = cc.restore(node_pod(node, util_80), emit=False)
    assert not plan.exists() and "startup plans of other memory settings removed" in changed.reason
    assert (node / "vllm").is_dir() and leftovers(node) == []


def test_plans_of_unknown_settings_are_dropped(tmp_path: Path) -> None:
    """A node whose plans predate the guard (no record): they may be any setting's."""
    node = tmp_path / "node-a"
    plan = write_plan(node)
    cc.restore(node_pod(node, "fp"), emit=False)
    assert not plan.exists()


def test_the_memory_settings_are_a_key_factor() -> None:
    def key(fp: str) -> str:
        s = cc.Settings.from_env({**BASE_ENV, "WARMSTART_STARTUP_PLAN_FINGERPRINT": fp})
        return cc.cache_key(s.prefix, cc.compute_factors(s))

    assert key("a") != key("b") and key("a") == key("a")


def test_the_fingerprint_follows_exactly_the_settings_vllm_leaves_out() -> None:
    fp = cachekey.startup_plan_fingerprint
    base = ["s3://m", "--gpu-memory-utilization=0.9", "--max-model-len=8192"]
    assert fp(base) != fp(["s3://m", "--gpu-memory-utilization=0.8", "--max-model-len=8192"])
    # In vLLM's own config hash, hence in the plan's fingerprint already: not needed here.
    assert fp(base) == fp(["s3://m", "--gpu-memory-utilization=0.9", "--max-model-len=4096"])
    assert fp(base) == fp(["s3://m", "--gpu-memory-utilization", "0.9", "--max-model-len=8192"])
    assert fp(base) != fp(base + ["--num-gpu-blocks-override=100"])


@pytest.mark.parametrize("how", ["fifo", "link"])
def test_a_planted_record_never_blocks_and_never_vouches_for_the_plans(tmp_path: Path, how: str) -> None:
    """Any pod of the node may plant a file beside the plans: a FIFO would hold the restore until
    a writer came, a link to a record of this pod's settings would keep plans of others."""
    node = tmp_path / "node-a"
    settings = node_pod(node, "fp")
    cc.restore(settings, emit=False)
    record = settings.state_dir / "startup-plan.json"
    elsewhere, original = tmp_path / "elsewhere.json", record.read_bytes()
    elsewhere.write_bytes(original)  # vouches for "fp"
    plan = write_plan(node)
    record.unlink()
    if how == "fifo":
        os.mkfifo(record)
    else:
        record.symlink_to(elsewhere)
    done = threading.Thread(target=cc.restore, args=(settings,), kwargs={"emit": False}, daemon=True)
    done.start()
    done.join(10)
    assert not done.is_alive(), "the restore is still blocked after 10 s"
    assert not plan.exists()  # nothing vouched for it
    assert not record.is_symlink() and json.loads(record.read_text()) == {"fingerprint": "fp"}
    assert elsewhere.read_bytes() == original  # never written through the link
