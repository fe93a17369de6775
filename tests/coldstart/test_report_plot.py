"""Predicted beside measured, the 2x flags and their causes, and the timeline picture."""

from __future__ import annotations

from pathlib import Path

import matplotlib.font_manager  # noqa: F401  (see below)
import pytest

from tests.coldstart.cases import CASES, parse
from warmstart.coldstart import plot, report
from warmstart.decisions import instances, phases

# matplotlib builds its font list once per config dir by running `fc-list` (font_manager's
# `_get_fontconfig_fonts`, https://github.com/matplotlib/matplotlib/blob/v3.11.2/lib/matplotlib/font_manager.py).
# Imported here it is built at collection, so on a fresh machine the timeline test, which is not
# marked `servers`, starts no process of its own.
G6E = instances.lookup("g6e.2xlarge")


def facts(**kw):
    return report.ModelFacts(**({"name": "llama-3-1-8b", "weights_bytes": 15 * 2**30, "instance": G6E,
                                 "compile_cache": True, "parallel_pull": True} | kw))


def test_slow_weights_are_flagged_with_the_network_causes():
    rows = {r.phase.key: r for r in report.build_rows(parse("cold-new-node"), facts())}
    w = rows["weights"]
    # 15 GiB on a 5 Gbps baseline: the link, not the streamer, bounds the prediction.
    assert w.predicted.seconds == pytest.approx(15 * 2**30 / (0.8 * 5e9 / 8))
    assert w.flag and any("NAT" in c for c in w.causes)
    assert rows["compile"].flag is None  # a miss the restore announced is predicted as cold
    text = report.table(parse("cold-new-node"), facts())
    assert "! weights loaded" in text and "2.3x" in text


def test_a_warm_pod_raises_no_flag():
    assert not [r for r in report.build_rows(parse("warm-node"), facts()) if r.flag]


def test_a_restored_cache_that_vllm_ignored_names_the_key():
    s = parse("automode-new-node")
    s.flags.compile_cache = "miss"
    comp = s.phase("compile")
    comp.seconds = 60.0
    rows = {r.phase.key: r for r in report.build_rows(s, facts())}
    assert rows["compile"].predicted.seconds == phases.COMPILE_CACHED_SECONDS
    assert rows["compile"].flag and "llama-3-1-8b/5e0c2f4b8a9d" in rows["compile"].causes[0]


def test_a_pull_without_parallel_pull_is_predicted_slower():
    s = parse("cold-new-node")
    fast = {r.phase.key: r for r in report.build_rows(s, facts(parallel_pull=True))}["image_pull"]
    slow = {r.phase.key: r for r in report.build_rows(s, facts(parallel_pull=False))}["image_pull"]
    assert slow.predicted.seconds > fast.predicted.seconds
    assert fast.flag is None  # 95 s is under 2 x 60 s
    assert slow.flag is None


def test_missing_phase_says_missing_in_the_table():
    text = report.table(parse("automode-new-node"), facts())
    line = next(x for x in text.splitlines() if x.startswith("weights loaded"))
    assert "missing" in line and "RUNAI_STREAMER_LOG_TO_STDERR" in line


@pytest.mark.parametrize("suffix", [".png", ".html"])
def test_timeline_picture_is_a_valid_image(tmp_path: Path, suffix: str):
    from matplotlib import image as mpimg

    out = plot.draw([parse(c) for c in CASES], tmp_path / f"t{suffix}")
    if suffix == ".png":
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(out)
        assert img.shape[0] > 200 and img.shape[1] > 800
        # Not a blank canvas: the bars put many distinct colours in it.
        assert len({tuple(px) for px in img.reshape(-1, img.shape[2])[::97]}) > 10
    else:
        assert "data:image/png;base64," in out.read_text()


def test_timeline_lanes_put_the_cold_start_far_right_of_the_warm_one():
    cold, warm = (plot._lane_segments(parse(c)) for c in ("cold-new-node", "warm-node"))
    end = lambda segs, key: max(a + w for k, a, w in segs if k == key)  # noqa: E731
    assert end(cold, "weights") > end(warm, "weights") + 100
    assert "image_pull" in {k for k, _, _ in cold} and "image_pull" not in {k for k, _, _ in warm}
