"""The pool's GPU limit packs every model's pods onto whole nodes (gpu_pools.packed_gpus): Karpenter
launches nodes only for pods the scheduler cannot place, whichever model they belong to."""

from __future__ import annotations

import pytest

from warmstart.decisions import autoscaling as scaling
from warmstart.decisions import gpu_pools, instances
from warmstart.errors import ConfigErrors, ConfigError


def _m(name, replicas, tp=1, t="p5.48xlarge"):
    return gpu_pools.PoolModel(instances.lookup(t), tp, replicas, name=name)


def test_fifteen_one_gpu_pods_of_three_models_fit_two_8_gpu_nodes():
    models = [_m("a", 4), _m("b", 4), _m("c", 4)]  # 4 + 1 surge pod each = 15 pods
    assert gpu_pools.gpus_needed(models, gpu_pools.SURGE_PODS) == 16
    spec = {n: scaling.AutoscalingSpec(1, 4) for n in "abc"}
    assert scaling.pool_gpus_needed([_m(n, 1) for n in "abc"], spec) == 16
    scaling.check_pool_capacity("p", 16, [_m(n, 1) for n in "abc"], spec,
                                model_keys={n: f"warmstart:models[{i}]" for i, n in enumerate("abc")},
                                pool_key="warmstart:gpuPools[0]")


def test_mixed_tensor_parallel_sizes_pack_first_fit_decreasing():
    # 1 pod of TP 4, 2 of TP 2, 4 of TP 1 on 8-GPU nodes: 4 + 4 + 4 = 12 GPUs -> 2 nodes.
    assert gpu_pools.packed_gpus([(_m("a", 0, 4), 1), (_m("b", 0, 2), 2), (_m("c", 0, 1), 4)]) == 16
    # Different instance types never share a node.
    assert gpu_pools.packed_gpus([(_m("a", 0, 1), 1), (_m("b", 0, 1, "g6e.2xlarge"), 1)]) == 9


def test_a_pool_too_small_even_packed_is_still_refused_with_the_packed_figure():
    spec = {n: scaling.AutoscalingSpec(1, 8) for n in "ab"}
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        scaling.check_pool_capacity("p", 16, [_m("a", 1), _m("b", 1)], spec,
                                    model_keys={"a": "warmstart:models[0]", "b": "warmstart:models[1]"},
                                    pool_key="warmstart:gpuPools[0]")
    assert "need 24 GPUs packed on whole nodes" in str(err.value)
