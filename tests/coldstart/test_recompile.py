"""A pod that restored its compile cache and still compiled is a cache miss with a cause, not a
slow compile; the startup plan's outcome is read from vLLM's own lines.

The logs are the automode-new-node fixture (a restored cache that vLLM loaded) with vLLM 0.33's
own miss lines put in (vllm/compilation/decorators.py, backends.py, v1/worker/startup_plan.py).
"""

from __future__ import annotations

import json

from tests.coldstart.cases import load, parse
from warmstart.coldstart import report
from warmstart.decisions import phases as ph
from warmstart.decisions.instances import lookup

HASH = "3f2a9c1b7e"
HIT = "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 2.201 s"
MISS = "Compiling a graph for compile range (1, 8192) takes 4.10 s"
AOT = "/compile-cache/vllm/torch_compile_cache/torch_aot_compile/" + "ab" * 32 + "/rank_0_0/model"


def logs(*, vllm_extra: str = "", hit: bool = False, dirs: list[str] | None = None, result: str = "restored",
         cache_dir_hash: str = HASH) -> dict[str, str]:
    f = load("automode-new-node")
    vllm = f["logs"]["vllm"].replace(HASH, cache_dir_hash)
    if not hit:
        vllm = vllm.replace(HIT, MISS)
    if vllm_extra:
        first, rest = vllm.split("\n", 1)
        vllm = first + "\n" + vllm_extra + rest
    line = json.loads(f["logs"]["compile-cache-restore"].split(" ", 1)[1])
    line["result"] = result
    if dirs is not None:
        line["compile_dirs"] = dirs
    restore = "2026-05-04T12:02:14.950000000Z " + json.dumps(line) + "\n"
    return f["logs"] | {"vllm": vllm, "compile-cache-restore": restore}


def vllm_line(text: str, at: str = "12:03:02.500") -> str:
    return f"2026-05-04T{at}000000Z (EngineCore pid=230) WARNING 05-04 12:03:02 [decorators.py:340] {text}\n"


def facts() -> report.ModelFacts:
    return report.ModelFacts("llama-3-1-8b", 15 * 2**30, lookup("g6e.2xlarge"), compile_cache=True,
                             parallel_pull=True)


def test_a_failed_aot_load_after_a_restore_is_a_miss_with_vllms_reason() -> None:
    warning = vllm_line(f"Compiling model again due to a load failure from {AOT}, reason: Source code has changed "
                        "since the last compilation. Recompiling the model.")
    s = parse("automode-new-node", logs=logs(vllm_extra=warning, dirs=[f"torch_compile_cache/{HASH}"]))
    assert s.flags.compile_cache == "miss" and s.flags.compile_restore == "restored"
    assert AOT in s.flags.compile_miss_cause and "Source code has changed" in s.flags.compile_miss_cause
    text = report.table(s, facts())
    assert "compile cache: miss after restore" in text
    # Flagged as a miss although the compile took less than twice its prediction: not "slow".
    (row,) = [r for r in report.build_rows(s, facts()) if r.phase.key == "compile"]
    assert row.compared_s < report.SLOW_FACTOR * row.predicted.seconds
    assert row.flag and "cache miss after the restore" in row.flag and "x the predicted" not in row.flag
    assert "Cause:" in text and "Source code has changed" in text


def test_a_hash_the_restored_cache_lacks_is_named_as_the_cause() -> None:
    s = parse("automode-new-node", logs=logs(dirs=["torch_compile_cache/0000000000"], cache_dir_hash="9e9e9e9e9e"))
    cause = s.flags.compile_miss_cause
    assert "torch_compile_cache/9e9e9e9e9e" in cause and "does not hold" in cause and "0000000000" in cause


def test_a_hash_the_restored_cache_holds_but_did_not_serve() -> None:
    s = parse("automode-new-node", logs=logs(dirs=[f"torch_compile_cache/{HASH}"]))
    assert "holds vLLM's torch_compile_cache/" + HASH in s.flags.compile_miss_cause


def test_a_node_hit_that_recompiles_is_a_miss_too_and_an_older_restore_line_still_reads() -> None:
    s = parse("automode-new-node", logs=logs(result="hit"))  # no compile_dirs: an older script's line
    assert s.flags.compile_restore == "hit" and "log does not say why" in s.flags.compile_miss_cause


def test_a_first_compile_anywhere_is_no_miss_after_restore() -> None:
    s = parse("automode-new-node", logs=logs(result="miss"))
    assert s.flags.compile_cache == "miss" and s.flags.compile_miss_cause is None
    assert "miss after restore" not in report.table(s, facts())


def test_a_restored_cache_that_vllm_loads_is_a_hit() -> None:
    s = parse("automode-new-node", logs=logs(hit=True, dirs=[f"torch_compile_cache/{HASH}"]))
    assert s.flags.compile_cache == "hit" and s.flags.compile_miss_cause is None


def test_the_startup_plans_outcome_is_read_from_vllms_lines() -> None:
    applied = ("2026-05-04T12:03:09.000000000Z (EngineCore pid=230) INFO 05-04 12:03:09 [startup_plan.py:154] "
               "Applying persisted startup plan (fingerprint 0123456789abcdef): kv_cache_memory_bytes=1 (0.00 GiB), "
               "recorded free-memory baseline 40.00 GiB, current 40.10 GiB. Memory profiling will be skipped.\n")
    s = parse("automode-new-node", logs=logs(hit=True, vllm_extra=applied))
    assert s.flags.startup_plan == "applied" and "startup plan applied" in s.phase("engine_init").detail
    saved = ("2026-05-04T12:03:12.000000000Z (EngineCore pid=230) INFO 05-04 12:03:12 [startup_plan.py:189] "
             "Saved startup plan to /compile-cache/vllm/startup_plan/startup_plan_0123456789abcdef.json\n")
    assert parse("automode-new-node", logs=logs(hit=True, vllm_extra=saved)).flags.startup_plan == "saved"
    assert parse("automode-new-node", logs=logs(hit=True)).flags.startup_plan is None


def test_a_warm_engine_is_predicted_faster_than_a_cold_one_and_says_why() -> None:
    warm, cold = ph.engine_init_prediction(True), ph.engine_init_prediction(False)
    assert warm.seconds < cold.seconds and warm.basis.startswith("https://") and cold.basis == ph.ASSUMPTION
    graphs_warm, graphs_cold = ph.cuda_graph_prediction(True), ph.cuda_graph_prediction(False)
    assert graphs_warm.seconds <= graphs_cold.seconds and graphs_warm.basis.startswith("https://")
    s = parse("automode-new-node", logs=logs(hit=True))  # restored: the engine state came with it
    assert report.expected(s, facts())["cuda_graphs"] == graphs_warm
    restored_engine = report.expected(s, facts())["engine_init"].seconds
    s_miss = parse("automode-new-node", logs=logs(result="miss"))
    assert report.expected(s_miss, facts())["engine_init"].seconds > restored_engine
