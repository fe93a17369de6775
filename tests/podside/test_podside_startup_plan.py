"""vLLM's startup plan on a node: kept while the memory settings it was measured under hold,
dropped before vLLM starts when they change (vLLM's own plan fingerprint leaves
--gpu-memory-utilization out), and a key factor, so S3 never hands a pod another setting's plan."""

from __future__ import annotations

import json
from pathlib import Path

from tests.podside.pods import BASE_ENV, leftovers
from warmstart.decisions import cachekey
from warmstart.podside import compile_cache as cc

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
