"""Node-cache decisions: digest, whether staging pays, capacity, warm nodes."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from warmstart.decisions import gpu_pools, instances, node_cache as nc, phases
from warmstart.decisions.instances import GIB

TYPES = sorted(instances.catalog())


def test_the_digest_changes_with_every_version_input_and_only_with_them() -> None:
    base = nc.model_version_digest("s3://m/llama/v1")
    assert base == nc.model_version_digest("s3://m/llama/v1/")  # a trailing slash is the same prefix
    variants = {nc.model_version_digest("s3://m/llama/v2"), nc.model_version_digest("s3://m/llama/v1", "abc"),
                nc.model_version_digest("s3://m/llama/v1", import_source="hf://meta/llama", import_revision="a" * 40),
                nc.model_version_digest("s3://m/llama/v1", import_source="hf://meta/llama", import_revision="b" * 40)}
    assert base not in variants and len(variants) == 4
    assert re.fullmatch(r"[0-9a-f]{12}", base)  # a valid label value and directory name
    with pytest.raises(nc.NodeCacheError):
        nc.model_version_digest("llama/v1")


def test_auto_stages_a_small_model_on_a_slow_nic_and_not_a_large_one_on_p5() -> None:
    small = nc.predict(instances.lookup("g6e.xlarge"), 15 * GIB)
    assert small.staged and small.s3_seconds > 4 * small.nvme_seconds
    # AWS: ~200 GB staged to NVMe on p5.48xlarge lost to tuned direct streaming.
    large = nc.predict(instances.lookup("p5.48xlarge"), 203 * GIB)
    assert not large.staged and large.s3_seconds <= large.nvme_seconds * 1.25
    assert nc.predict(instances.lookup("p5.48xlarge"), 203 * GIB, "on").staged
    assert not nc.predict(instances.lookup("g6e.xlarge"), 15 * GIB, "off").staged


@given(st.sampled_from(TYPES), st.integers(1, 400), st.integers(1, 400))
def test_load_times_grow_with_size_and_staging_is_decided_by_the_saving(t: str, a: int, b: int) -> None:
    inst = instances.lookup(t)
    small, large = sorted((a, b))
    p, q = nc.predict(inst, small * GIB), nc.predict(inst, large * GIB)
    assert p.nvme_seconds <= q.nvme_seconds
    # S3 time grows with size: the tuned rate of an instance is one figure.
    assert p.s3_seconds <= q.s3_seconds * (1 + 1e-9)
    # Never faster than the NIC allows, never faster than the measured tuned ceiling.
    assert p.s3_bytes_per_second <= inst.network_baseline_gbps * 1e9 / 8
    assert p.s3_bytes_per_second <= phases.TUNED_STREAMER_BYTES_PER_S
    saving = p.s3_seconds - p.nvme_seconds
    assert p.staged == (inst.nvme_total_gb > 0 and saving >= max(nc.MIN_SAVING_SECONDS, nc.MIN_SAVING_SHARE * p.s3_seconds))


def test_nvme_too_small_is_an_error_naming_the_numbers_and_the_fix() -> None:
    inst = instances.lookup("g6e.xlarge")  # 250 GB NVMe
    with pytest.raises(nc.NodeCacheError) as err:
        nc.check_capacity("l40s", [inst], [nc.StagedModel("llama", 70 * GIB, True)], compile_cache_models=1)
    text = str(err.value)
    assert "needs 245 GiB" in text and "2 x 70 GiB" in text and "g6e.xlarge: 250 GB NVMe" in text
    assert "fix: use a larger instance type" in text and "nodeCache: off" in text


@given(st.sampled_from(TYPES), st.integers(1, 2000))
def test_capacity_accepts_exactly_what_fits_below_the_eviction_threshold(t: str, gib: int) -> None:
    inst = instances.lookup(t)
    models = [nc.StagedModel("m", gib * GIB, True)]
    need = gpu_pools.NODE_EPHEMERAL_RESERVE_BYTES + gpu_pools.COMPILE_CACHE_RESERVE_BYTES + 2 * gib * GIB
    fits = inst.nvme_total_gb > 0 and need <= inst.nvme_total_bytes * (1 - nc.EVICTION_THRESHOLD_SHARE)
    try:
        nc.check_capacity("p", [inst], models, 1)
        assert fits
    except nc.NodeCacheError:
        assert not fits


def test_staging_on_an_instance_type_without_nvme_is_an_error() -> None:
    no_nvme = instances.GpuInstance("x1.fake", "x1", "none", 1, 1, 0, 4, 16, "none", 10, True)
    with pytest.raises(nc.NodeCacheError, match="x1.fake has no local NVMe"):
        nc.check_capacity("p", [no_nvme], [nc.StagedModel("m", GIB, False)], 0)
    assert not nc.predict(no_nvme, 15 * GIB).staged


def test_warm_nodes_above_the_pool_limit_is_an_error_with_the_largest_allowed() -> None:
    nc.check_warm_nodes("l40s", 2, gpus_per_node=4, max_gpus=16, serving_gpus=8)
    with pytest.raises(nc.NodeCacheError) as err:
        nc.check_warm_nodes("l40s", 3, gpus_per_node=4, max_gpus=16, serving_gpus=8)
    assert "warmNodes=3" in str(err.value) and "set warmNodes <= 2 or raise maxGpus to >= 20" in str(err.value)


def test_warm_node_cost_needs_a_price_the_table_does_not_have() -> None:
    assert not hasattr(instances.lookup("g6e.xlarge"), "on_demand_usd_per_hour")
    assert nc.warm_nodes_cost_per_hour(2, 1.861) == 3.72
    assert nc.warm_nodes_cost_per_hour(2, None) is None and nc.warm_nodes_cost_per_hour(0, None) == 0.0
