"""Prediction functions: properties, and agreement with AWS's published per-step figures.

Published figures: EKS User Guide, "Accelerate model loading on Amazon EKS"
(https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html):
Llama-4-Scout 203 GiB TP=4 on p5.48xlarge, 429 s + 34 s = 463 s untuned, 26 s + 6 s = 32 s tuned
and cached, 59-60 s on a fresh node; AWS Containers Blog "Fast model loading for AI inference on
Amazon EKS" (https://aws.amazon.com/blogs/containers/fast-model-loading-for-ai-inference-on-amazon-eks/):
Qwen 67 GiB TP=2, 12 s + 53 s = 65 s tuned, 12 s + ~4 s = 16 s tuned and cached.

Stated tolerance: every published TOTAL within 15 %, every published tuned WEIGHTS step within
25 % (one tuned rate serves both models; the cold compile is the model's own published figure,
as `compile_cold_seconds` takes it from a model's history). The untuned 429 s is the figure the
default rate is calibrated on, so it is checked only for the total; the blog's untuned Qwen
weights (29 s) are five times faster per byte and are outside what one default rate can match,
which phases.py says.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmstart.decisions import instances, phases
from warmstart.decisions.instances import GIB

P5 = instances.lookup("p5.48xlarge")
TYPES = sorted(instances.catalog())

TOTAL_TOL, WEIGHTS_TOL = 0.15, 0.25


def close(got: float, want: float, tol: float) -> bool:
    return abs(got - want) <= tol * want


@pytest.mark.parametrize("gib, compile_cached, cold_s, tuned, published_total, published_weights", [
    (203, True, None, True, 32, 26),        # EKS: tuned + compile cache
    (203, False, 34, True, 59.5, 26),       # EKS: first pod on a fresh node, compile runs once
    (203, False, 34, False, 463, None),     # EKS: streamer defaults
    (67, False, 53, True, 65, 12),          # blog: tuned, first pod on a node
    (67, True, None, True, 16, 12),         # blog: tuned + compile cache
])
def test_agrees_with_the_published_steps(gib, compile_cached, cold_s, tuned, published_total, published_weights):
    weights = phases.weights_s3_seconds(gib * GIB, P5, tuned=tuned)
    load = weights + phases.compile_seconds(compile_cached, cold_s)
    assert close(load, published_total, TOTAL_TOL), (load, published_total)
    if published_weights is not None:
        assert close(weights, published_weights, WEIGHTS_TOL), (weights, published_weights)


def test_the_steps_shrink_in_the_published_order():
    scout = 203 * GIB
    untuned = phases.weights_s3_seconds(scout, P5, tuned=False) + phases.compile_seconds(False, 34)
    fresh = phases.weights_s3_seconds(scout, P5) + phases.compile_seconds(False, 34)
    warm = phases.weights_s3_seconds(scout, P5) + phases.compile_seconds(True)
    assert untuned > fresh > warm
    assert untuned / warm == pytest.approx(463 / 32, rel=0.15)


@given(a=st.integers(0, 2000 * GIB), b=st.integers(0, 2000 * GIB), itype=st.sampled_from(TYPES),
       tuned=st.booleans())
def test_weights_time_is_monotone_in_size(a, b, itype, tuned):
    inst = instances.lookup(itype)
    lo, hi = sorted((a, b))
    assert phases.weights_s3_seconds(lo, inst, tuned) <= phases.weights_s3_seconds(hi, inst, tuned)
    assert phases.weights_local_seconds(lo) <= phases.weights_local_seconds(hi)


@given(size=st.integers(1, 2000 * GIB), itype=st.sampled_from(TYPES), tuned=st.booleans())
def test_weights_never_beat_the_instance_bandwidth(size, itype, tuned):
    inst = instances.lookup(itype)
    seconds = phases.weights_s3_seconds(size, inst, tuned)
    assert seconds >= size / phases.network_bytes_per_s(inst)
    assert phases.s3_weights_bytes_per_s(inst, tuned) <= phases.NETWORK_EFFICIENCY * phases.network_bytes_per_s(inst)
    # Tuning never predicts slower than the defaults.
    assert phases.weights_s3_seconds(size, inst, True) <= phases.weights_s3_seconds(size, inst, False)


@given(size=st.integers(1, 2000 * GIB), itype=st.sampled_from(TYPES))
def test_a_warm_start_is_never_predicted_slower_than_a_cold_one(size, itype):
    inst = instances.lookup(itype)
    cold = phases.predict_cold_start(size, inst, new_node=True, compile_cached=False, image_present=False)
    warm = phases.predict_cold_start(size, inst, new_node=False, compile_cached=True, image_present=True)
    assert warm.total_seconds < cold.total_seconds
    assert cold.total_seconds == pytest.approx(sum(v for v in cold.__dict__.values()))
    # A new node never finds the image, whatever the caller says.
    assert phases.predict_cold_start(size, inst, new_node=True, compile_cached=True,
                                     image_present=True).image_pull > 0


def test_every_constant_names_its_basis():
    p = phases.weights_prediction(15 * GIB, instances.lookup("g6e.2xlarge"))
    assert p.basis.startswith("https://") and "Gbps" in p.note
    assert phases.compile_prediction(True).basis.startswith("https://")
    assert phases.image_pull_prediction(False, True).basis.startswith("https://")
