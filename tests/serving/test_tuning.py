"""Decision functions: published figures and properties.

Figures from https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html
and https://aws.amazon.com/blogs/containers/fast-model-loading-for-ai-inference-on-amazon-eks/.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, strategies as st

from warmstart.decisions import instances, tuning
from warmstart.decisions.instances import GIB

P5 = instances.lookup("p5.48xlarge")
ALL = sorted(instances.catalog().values(), key=lambda i: i.instance_type)


@pytest.mark.parametrize("weights_gib, expected", [(10, 3), (67, 17), (140, 35)])
def test_concurrency_reproduces_published_table(weights_gib, expected):
    assert tuning.loader_concurrency(weights_gib * GIB) == expected


@given(weights=st.integers(1, 2000 * GIB), chunk=st.integers(tuning.MIN_S3_CHUNK_BYTES, 16 * GIB))
def test_concurrency_covers_weights_with_no_idle_worker(weights, chunk):
    n = tuning.loader_concurrency(weights, chunk)
    assert n >= 1
    assert n * chunk >= weights  # every byte has a worker
    assert (n - 1) * chunk < weights  # no worker without a chunk


@given(a=st.integers(1, 1000 * GIB), b=st.integers(1, 1000 * GIB))
def test_concurrency_is_monotonic_in_weights(a, b):
    lo, hi = sorted((a, b))
    assert tuning.loader_concurrency(lo) <= tuning.loader_concurrency(hi)


def test_tensor_parallel_published_choices():
    assert tuning.choose_tensor_parallel(67 * GIB, P5) == 2
    assert tuning.choose_tensor_parallel(203 * GIB, P5) == 4


@given(inst=st.sampled_from(ALL), weights=st.integers(1 * GIB, 2500 * GIB))
def test_auto_tensor_parallel_is_the_fewest_gpus_that_fit(inst, weights):
    util = tuning.DEFAULT_GPU_MEMORY_UTILIZATION
    try:
        tp = tuning.choose_tensor_parallel(weights, inst)
    except tuning.TuningError:
        assert not any(tuning.tensor_parallel_fits(weights, inst, n, util)
                       for n in tuning.valid_tensor_parallel_sizes(inst))
        return
    assert inst.gpu_count % tp == 0 and tp in (1, 2, 4, 8)
    assert weights / tp <= inst.gpu_memory_bytes * util  # weights fit, with KV room
    for smaller in tuning.valid_tensor_parallel_sizes(inst):
        if smaller < tp:
            assert not tuning.tensor_parallel_fits(weights, inst, smaller, util)


@given(inst=st.sampled_from(ALL), tp=st.integers(1, 16))
def test_explicit_tensor_parallel_must_divide_the_node(inst, tp):
    small = 1 * GIB
    if tp in tuning.valid_tensor_parallel_sizes(inst):
        assert tuning.choose_tensor_parallel(small, inst, tp) == tp
    else:
        with pytest.raises(tuning.TuningError, match="tensorParallelSize"):
            tuning.choose_tensor_parallel(small, inst, tp)


def test_startup_budget_outlasts_the_published_worst_start():
    # 203 GiB untuned: 429 s of weights + 34 s compile = 463 s (AWS Containers Blog, above).
    assert tuning.startup_budget_seconds(203 * GIB) >= 2 * 463
    # 67 GiB untuned: 82 s.
    assert tuning.startup_budget_seconds(67 * GIB) >= 5 * 82


@given(a=st.integers(1, 2000 * GIB), b=st.integers(1, 2000 * GIB))
def test_startup_budget_grows_with_weights(a, b):
    lo, hi = sorted((a, b))
    assert tuning.startup_budget_seconds(lo) <= tuning.startup_budget_seconds(hi)
    thr = tuning.startup_probe_failure_threshold(hi)
    assert thr * tuning.PROBE_PERIOD_SECONDS >= tuning.startup_budget_seconds(hi)


@given(inst=st.sampled_from(ALL), data=st.data())
def test_pod_fits_its_share_of_the_node(inst, data):
    tp = data.draw(st.sampled_from(tuning.valid_tensor_parallel_sizes(inst)))
    size = tuning.pod_size(inst, tp)
    share = tp / inst.gpu_count
    assert size.gpus == tp
    assert 0 < size.cpu_millis <= inst.vcpu * 1000 * share
    assert 0 < size.memory_bytes <= inst.memory_gib * GIB * share
    assert size.shm_bytes <= max(2 * GIB, size.memory_bytes // 4)
    if tp > 1:
        assert size.shm_bytes >= 2 * GIB


def test_unknown_instance_type_lists_known_ones():
    with pytest.raises(instances.UnknownInstanceType, match="p5.48xlarge"):
        instances.lookup("p9.96xlarge")


def test_catalog_agrees_with_gpu_memory_units():
    # MiB per GPU from EC2: an H100 reports 81920 MiB = 80 GiB.
    assert P5.gpu_memory_bytes == 80 * GIB
    assert all(math.isclose(i.gpu_memory_bytes / GIB, i.gpu_memory_mib / 1024) for i in ALL)
