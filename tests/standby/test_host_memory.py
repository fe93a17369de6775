"""A level-1 sleeper's host RAM as torch pins it (decisions/standby.py, PINNED_HOST_ALLOC_CONF).

vLLM 0.33.0 offloads each sleeping allocation into `torch.empty(size, device="cpu",
pin_memory=True)`; torch's CachingHostAllocator rounds such a request up to a power of two unless it
is above `pinned_max_cached_size_mb`. The setting is checked against torch's own parser here (the
venv's torch, `pyproject.toml`), the rounding against segment sizes of public model configs."""

from __future__ import annotations

import pytest

from warmstart.config import AutoscalingConfig, LoaderTuning, ModelSpec, StandbyConfig
from warmstart.decisions import standby
from warmstart.decisions.instances import GIB
from warmstart.manifests import serving
from warmstart.plan.model import plan_model

MIB = 2**20


def _plan(weights_gib=15.0, instance_type="g6e.xlarge", with_standby=True):
    spec = ModelSpec(name="m", source="s3://b-models/m", weights_gib=weights_gib,
                     autoscaling=AutoscalingConfig(min_replicas=1, max_replicas=3),
                     standby=StandbyConfig(count=1, sleep_level=1) if with_standby else None)
    return plan_model(spec, key="warmstart:models[0]", instance_type=instance_type, pool="p", loader=LoaderTuning(),
                      compile_cache=True, compile_cache_host_path="/mnt/k8s-disks/0/warmstart-compile-cache")


def _vllm(dep):
    return dep["spec"]["template"]["spec"]["containers"][0]


def _set(conf: str) -> None:
    torch = pytest.importorskip("torch")
    torch._C._accelerator_setAllocatorSettings(conf)


def test_torch_reads_the_setting_under_its_own_spelling():
    """A key torch's `AcceleratorAllocatorConfig::parseArgs` knows has its value parsed (a word
    where a number belongs is refused); one it does not know is ignored without a word. So the
    shipped key is one torch reads, and its value one torch accepts."""
    key, value = standby.PINNED_HOST_ALLOC_CONF.split(":")
    try:
        _set(standby.PINNED_HOST_ALLOC_CONF)
        with pytest.raises((RuntimeError, ValueError)):  # std::invalid_argument from stoull
            _set(f"{key}:not-a-number")
        # The control: a misspelt key passes silently, which is why the refusal above proves the spelling.
        _set(f"{key.replace('cached', 'cachd')}:not-a-number")
    finally:
        _set(f"{key}:{2**44}")  # back to no bound in practice (torch's default is SIZE_MAX)
    assert int(value) == standby.PINNED_MAX_CACHED_MIB


def test_every_standby_engine_runs_with_it_and_no_other_engine_does():
    for with_standby in (True, False):
        env = {e["name"]: e["value"] for e in _vllm(serving.deployment_spec(
            _plan(with_standby=with_standby).serving, "ns", "us-east-1"))["env"]}
        assert (env.get(standby.PINNED_HOST_ALLOC_ENV) == standby.PINNED_HOST_ALLOC_CONF) == with_standby


# Segment sizes of one decoder layer from public configs (bf16): the CUDA caching allocator gives a
# tensor above 10 MiB its own segment rounded up to 2 MiB (CUDACachingAllocator.cpp, kRoundLarge).
def _segment(n_bytes: int) -> int:
    return -(-n_bytes // (2 * MIB)) * (2 * MIB)


QWEN25_7B_LAYER = [_segment(b) for b in (
    3584 * (3584 + 2 * 512) * 2,  # qkv_proj (28 heads, 4 KV heads of 128)
    3584 * 3584 * 2,              # o_proj
    2 * 18944 * 3584 * 2,         # gate_up_proj
    18944 * 3584 * 2,             # down_proj
)]


def test_torch_default_pins_nearly_twice_a_qwen_layer_and_the_setting_pins_its_size():
    size = sum(QWEN25_7B_LAYER)
    default = sum(standby.pinned_bytes(s, None) for s in QWEN25_7B_LAYER)
    ours = sum(standby.pinned_bytes(s) for s in QWEN25_7B_LAYER)
    assert default / size > 1.8, "Qwen2.5's MLP tensors sit just past a power of two"
    assert ours == size


@pytest.mark.parametrize("n, default, ours", [
    (1, 1, 1), (2 * MIB, 2 * MIB, 2 * MIB), (2 * MIB + 1, 4 * MIB, 2 * MIB + 1), (20 * MIB, 32 * MIB, 20 * MIB),
    (129 * MIB, 256 * MIB, 129 * MIB), (0, 0, 0)])
def test_pinned_bytes_is_torchs_power_of_two_ceiling_up_to_the_cache_bound(n, default, ours):
    assert standby.pinned_bytes(n, None) == default
    assert standby.pinned_bytes(n) == ours


def test_the_refusal_names_the_setting_and_what_torchs_default_would_pin():
    rule = standby.check_host_memory(weights_bytes=60 * GIB, sleep_level=1, pod_memory_bytes=51 * GIB, shm_bytes=GIB)
    assert rule is not None
    assert standby.PINNED_HOST_ALLOC_CONF in rule and "120 GiB" in rule


def test_a_qwen_14b_sleeper_on_g6e_2xlarge_is_counted_at_what_it_pins():
    """The issue's shape: 27.5 GiB of weights on g6e.2xlarge (64 GiB, one GPU). Pinned at their own
    size the weights and the process fit the pod's limit; torch's default would pin up to twice
    the weights, which the limit would not hold, and the refusal says so when the setting cannot
    help (a model too large for it)."""
    m = _plan(weights_gib=27.5, instance_type="g6e.2xlarge")
    assert m.standby.sleeping_host_bytes == int(27.5 * GIB) + standby.PROCESS_HOST_BYTES
    env = {e["name"]: e["value"] for e in _vllm(serving.deployment_spec(m.serving, "ns", "us-east-1"))["env"]}
    assert env[standby.PINNED_HOST_ALLOC_ENV] == standby.PINNED_HOST_ALLOC_CONF
    assert 2 * int(27.5 * GIB) + standby.PROCESS_HOST_BYTES > 51 * GIB, "torch's default would not fit"
