"""The phase parser on recorded objects and vLLM 0.33 transcripts (tests/coldstart/fixtures/).

Expected figures are read off the fixtures by hand (event and condition timestamps, the numbers
in the log lines), not computed by the parser's own helpers.
"""

from __future__ import annotations

import pytest

from tests.coldstart.cases import CASES, load, parse
from warmstart.coldstart import parser


def test_cold_new_node_karpenter():
    s = parse("cold-new-node")
    assert s.flags.new_node is True and s.flags.provisioner == "karpenter"
    assert s.flags.image_present is False
    assert (s.flags.compile_cache, s.flags.compile_restore) == ("miss", "miss")
    # created 10:00:00, Nominated 10:00:02; NodeClaim 10:00:02 -> Launched 10:00:09 -> Registered
    # 10:01:20 -> Initialized 10:01:48; PodScheduled 10:01:50.
    assert s.phase("capacity").seconds == 2.0
    assert s.phase("capacity").values["nodeclaim"] == "l40s-x7k2p"
    assert [s.phase(k).seconds for k in ("node_launched", "node_registered", "node_ready")] == [7.0, 71.0, 28.0]
    assert s.phase("scheduled").seconds == 2.0
    pull = s.phase("image_pull")
    assert pull.seconds == pytest.approx(95.208) and pull.values["bytes"] == 10512345678
    assert "already present" not in pull.detail  # the later "already present" events are not the pull
    w = s.phase("weights")
    assert w.seconds == pytest.approx(75.31) and w.values["bytes"] == 15 * 2**30
    assert w.values["gib_per_s"] == pytest.approx(15 / 75.31)
    assert s.phase("compile").seconds == pytest.approx(56.12) and s.phase("compile").values["graphs_compiled"] == 1
    assert s.phase("cuda_graphs").seconds == 12.0
    assert s.phase("engine_init").values["compilation_s"] == pytest.approx(56.12)
    assert s.phase("ready").seconds == 180.0  # vllm started 10:03:34, Ready 10:06:34
    assert s.phase("first_token").seconds == pytest.approx(0.184)
    assert s.vllm_version == "0.33.0" and s.model_uri.startswith("s3://")
    restore = s.phase("init:compile-cache-restore")
    assert restore.seconds == 1.0 and restore.values["result"] == "miss"
    assert s.phase("init:nvme-check").detail.startswith("OK: ")
    assert s.phase("init:compile-cache-publish").skipped  # a sidecar is not a start-up step


def test_warm_node_skips_the_node_and_the_pull():
    s = parse("warm-node")
    assert s.flags.new_node is False and s.flags.image_present is True
    for key in ("capacity", "node_launched", "node_registered", "node_ready"):
        assert s.phase(key).skipped and s.phase(key).missing is None
    assert s.phase("image_pull").skipped and s.phase("image_pull").seconds == 0.0
    assert s.flags.compile_cache == "hit" and s.phase("compile").values["graphs_loaded"] == 1
    assert s.phase("compile").seconds == pytest.approx(5.87)
    assert s.phase("weights").seconds == pytest.approx(30.18)


def test_auto_mode_source_old_kubelet_and_missing_loader_line():
    s = parse("automode-new-node")
    assert s.flags.provisioner == "eks-auto-mode" and s.flags.new_node is True
    # events.k8s.io-style: eventTime only, reportingComponent instead of source.component
    assert s.phase("capacity").seconds == 1.0
    pull = s.phase("image_pull")
    assert pull.seconds == pytest.approx(38.1) and pull.values["bytes"] is None
    assert "size not reported" in pull.detail
    w = s.phase("weights")
    assert w.seconds is None and "RUNAI_STREAMER_LOG_TO_STDERR=1" in w.missing
    assert w.values["model_loading_s"] == pytest.approx(31.288001)  # kept, not passed off as weights
    assert (s.flags.compile_restore, s.flags.compile_cache) == ("restored", "hit")
    assert s.phase("first_token").missing and "first-token" in s.phase("first_token").missing


def test_expired_events_say_so_instead_of_guessing():
    s = parse("cold-new-node", events=[])
    assert s.phase("image_pull").missing and "expire" in s.phase("image_pull").missing
    # The node object still tells a new node from a warm one; the NodeClaim still times it.
    assert s.flags.new_node is True
    assert s.phase("node_registered").seconds == 71.0
    s = parse("cold-new-node", events=[], node=None, nodeclaim=None)
    assert s.phase("capacity").missing and s.phase("node_launched").missing


def test_missing_log_is_reported_for_every_vllm_phase():
    f = load("cold-new-node")
    s = parse("cold-new-node", logs={k: v for k, v in f["logs"].items() if k != "vllm"})
    for key in ("weights", "compile", "cuda_graphs", "engine_init"):
        assert s.phase(key).missing and "no vllm log" in s.phase(key).missing


@pytest.mark.parametrize("case", CASES)
def test_phases_are_ordered_and_non_negative(case):
    s = parse(case)
    for p in s.phases:
        if p.measured:
            assert p.seconds >= 0, p
        if p.start and p.end:
            assert p.start <= p.end, p
    got = {p.key for p in s.phases}
    assert {"capacity", "image_pull", "weights", "compile", "cuda_graphs", "engine_init", "ready", "first_token"} <= got


def test_vllm_011_spelling_is_recognised():
    text = ("2026-05-04T10:00:00.000000000Z INFO 05-04 10:00:00 [api_server.py:1] vLLM API server version 0.11.1\n"
            "2026-05-04T10:01:00.000000000Z (EngineCore pid=2) INFO 05-04 10:01:00 [monitor.py:34] "
            "torch.compile takes 41.20 s in total\n")
    f = load("warm-node")
    s = parse("warm-node", logs=f["logs"] | {"vllm": text})
    assert s.vllm_version == "0.11.1" and s.phase("compile").seconds == pytest.approx(41.2)


def test_go_durations():
    assert parser.go_duration_s("1m35.208s") == pytest.approx(95.208)
    assert parser.go_duration_s("812ms") == pytest.approx(0.812)
    assert parser.go_duration_s("1h2m3s") == 3723
