"""The cache key: everything that invalidates a compile cache separates keys, nothing else does."""

from __future__ import annotations

import os
import platform
import stat
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from tests.podside.pods import BASE_ENV
from warmstart.podside.compile_cache import key as compile_cache_key
from warmstart.podside.compile_cache import settings as compile_cache_settings
from warmstart.podside.compile_cache import main as cc


factor_values = st.one_of(st.text(max_size=20), st.integers(), st.booleans())
factor_dicts = st.dictionaries(st.text(min_size=1, max_size=12), factor_values, min_size=1, max_size=8)
prefixes = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}/", fullmatch=True)


def key_for(**env: str) -> str:
    settings = cc.Settings.from_env({**BASE_ENV, **env})
    return cc.cache_key(settings.prefix, cc.compute_factors(settings))


@given(prefixes, factor_dicts)
def test_key_lives_under_the_prefix_and_names_a_full_sha256(prefix: str, factors: dict) -> None:
    key = cc.cache_key(prefix, factors)
    assert key.startswith(prefix)
    digest = key[len(prefix):].removesuffix(".tar.gz")
    assert len(digest) == 64 and set(digest) <= set("0123456789abcdef")
    assert cc.manifest_key(key) == f"{prefix}{digest}.json"


@given(prefixes, factor_dicts, st.randoms())
def test_key_ignores_the_order_factors_were_gathered_in(prefix: str, factors: dict, rnd) -> None:
    items = list(factors.items())
    rnd.shuffle(items)
    assert cc.cache_key(prefix, dict(items)) == cc.cache_key(prefix, factors)


@given(prefixes, factor_dicts, st.data())
def test_any_changed_factor_changes_the_key(prefix: str, factors: dict, data) -> None:
    name = data.draw(st.sampled_from(sorted(factors)))
    new = data.draw(factor_values.filter(lambda v: v != factors[name] or type(v) is not type(factors[name])))
    assert cc.cache_key(prefix, {**factors, name: new}) != cc.cache_key(prefix, factors)


@pytest.mark.parametrize("env", [
    {"WARMSTART_TP": "4"},
    {"WARMSTART_MODEL": "meta-llama/Llama-3.1-70B-Instruct"},
    {"WARMSTART_IMAGE": "registry.example/vllm/vllm-openai:v0.11.1@sha256:" + "cd" * 32},
    {"WARMSTART_COMPILE_FINGERPRINT": "fp-2"},
    {"WARMSTART_ACCELERATOR": "NVIDIA L4, 8.9"},
    {"WARMSTART_ACCELERATOR": "NVIDIA H100 NVL, 9.0"},
    {"WARMSTART_GPU_DRIVER": "580.65.06"},
], ids=lambda env: next(iter(env)))
def test_every_pod_setting_that_invalidates_a_cache_is_in_the_key(env: dict) -> None:
    assert key_for(**env) != key_for()


def test_runtime_versions_are_factors_and_read_without_importing_torch() -> None:
    import sys

    torch_loaded_before = "torch" in sys.modules
    factors = cc.compute_factors(cc.Settings.from_env(BASE_ENV))
    assert ("torch" in sys.modules) == torch_loaded_before
    for name in ("torch", "torch_git", "triton", "vllm", "cuda", "python", "format"):
        assert factors[name], name
    assert factors["python"].endswith(platform.python_version())


def test_image_digest_is_the_identity_when_present() -> None:
    digest = "@sha256:" + "ab" * 32
    assert key_for(WARMSTART_IMAGE="mirror.example/vllm" + digest) == key_for(WARMSTART_IMAGE="vllm/vllm-openai:v1" + digest)
    assert key_for(WARMSTART_IMAGE="vllm/vllm-openai:v0.11.1") != key_for(WARMSTART_IMAGE="vllm/vllm-openai:v0.11.2")


def test_prefix_gets_its_slash_so_keys_stay_inside_the_iam_scope() -> None:
    assert key_for(WARMSTART_CACHE_PREFIX="llama-8b").startswith("llama-8b/")


@pytest.mark.parametrize("env, message", [
    ({"WARMSTART_MODEL": ""}, "WARMSTART_MODEL is not set"),
    ({"WARMSTART_IMAGE": ""}, "WARMSTART_IMAGE is not set"),
    ({"WARMSTART_CACHE_PREFIX": ""}, "WARMSTART_CACHE_PREFIX is not set"),
    ({"WARMSTART_TP": "two"}, "WARMSTART_TP='two' is not an integer"),
    ({"WARMSTART_TP": "0"}, "WARMSTART_TP='0' must be >= 1"),
    ({"WARMSTART_CACHE_PATHS": "inductor,../etc"}, "'../etc' must be a relative path"),
])
def test_bad_environment_is_named(env: dict, message: str) -> None:
    with pytest.raises(cc.ConfigError, match=message.replace("(", r"\(")):
        cc.Settings.from_env({**BASE_ENV, **env})


def fake_nvidia_smi(tmp_path: Path, output: str, code: int = 0) -> str:
    script = tmp_path / f"nvidia-smi-{abs(hash(output))}-{code}"
    script.write_text(f"#!/bin/sh\nprintf '{output}'\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.servers
def test_gpu_identity_is_name_and_compute_capability(tmp_path: Path) -> None:
    one = fake_nvidia_smi(tmp_path, "NVIDIA H100 80GB HBM3, 9.0\\n")
    ident = compile_cache_key.detect_accelerator(None, "12.8", which=lambda _: one)
    assert "NVIDIA H100 80GB HBM3" in ident and "9.0" in ident
    # A pod that sees all eight GPUs of the node (a sidecar) and one that sees its own agree.
    eight = fake_nvidia_smi(tmp_path, "NVIDIA H100 80GB HBM3, 9.0\\n" * 8)
    assert compile_cache_key.detect_accelerator(None, "12.8", which=lambda _: eight) == ident
    l4 = fake_nvidia_smi(tmp_path, "NVIDIA L4, 8.9\\n")
    assert compile_cache_key.detect_accelerator(None, "12.8", which=lambda _: l4) != ident


@pytest.mark.servers
def test_a_failing_nvidia_smi_is_an_error_not_a_guess(tmp_path: Path) -> None:
    broken = fake_nvidia_smi(tmp_path, "NVIDIA-SMI has failed", code=9)
    with pytest.raises(cc.CacheError, match="nvidia-smi exited 9"):
        compile_cache_key.detect_accelerator(None, "12.8", which=lambda _: broken)


def test_cuda_torch_without_a_visible_gpu_refuses_a_cpu_identity() -> None:
    with pytest.raises(cc.CacheError, match="cannot be identified"):
        compile_cache_key.detect_accelerator(None, "12.8", which=lambda _: None)
    assert compile_cache_key.detect_accelerator(None, None, which=lambda _: None) == f"cpu-{platform.machine()}"
    assert compile_cache_key.detect_accelerator("test-gpu", "12.8", which=lambda _: None) == "test-gpu"


@given(st.text(alphabet="ab./\\\x00-", max_size=30))
def test_archive_names_never_leave_the_staging_dir(name: str) -> None:
    try:
        safe = cc.safe_name(name)
    except cc.CacheError:
        return
    root = Path("/staging")
    resolved = Path(os.path.normpath(root / safe))
    assert resolved.is_relative_to(root) and resolved != root
    assert not safe.startswith(compile_cache_settings.STATE_DIRNAME)


def test_the_driver_version_is_a_key_factor() -> None:
    def key(**env: str) -> str:
        s = cc.Settings.from_env({**BASE_ENV, **env})
        return cc.cache_key(s.prefix, cc.compute_factors(s))

    assert key(WARMSTART_GPU_DRIVER="570.86.15") != key(WARMSTART_GPU_DRIVER="580.65.06")
    assert key(WARMSTART_GPU_DRIVER="570.86.15") == key(WARMSTART_GPU_DRIVER="570.86.15")


def test_the_driver_version_is_read_from_the_kernel_module(tmp_path: Path) -> None:
    sysfs, proc = tmp_path / "version", tmp_path / "proc-version"
    proc.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Fri Jan 24 2025\n"
                    "GCC version:  gcc version 11.4.1\n")
    assert compile_cache_key.detect_gpu_driver(None, None, (tmp_path / "absent", proc)) == "570.86.15"
    sysfs.write_text("580.65.06\n")
    assert compile_cache_key.detect_gpu_driver(None, None, (sysfs, proc)) == "580.65.06"
    assert compile_cache_key.detect_gpu_driver(None, None, (tmp_path / "absent",)) == "none"  # no NVIDIA driver: a CPU node
    garbled = tmp_path / "garbled"
    garbled.write_text("no version here\n")
    assert compile_cache_key.detect_gpu_driver(None, None, (garbled,)) == "unknown"
    assert compile_cache_key.detect_gpu_driver("1.2.3", None, (sysfs,)) == "1.2.3"
    assert compile_cache_key.detect_gpu_driver(None, "test-gpu", (sysfs,)) == "unspecified"


# ---- what the key reads from files a pod does not trust -------------------------------------

import json  # noqa: E402 - the section's own imports
import threading  # noqa: E402
from typing import Any, Callable  # noqa: E402


def within_10_s(fn: Callable[[], Any]) -> Any:
    """fn() on a daemon thread, waited for 10 s: opening a FIFO for reading blocks until a writer
    comes, which here is never."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - shown by the assertion below
            box["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "still blocked after 10 s"
    assert "error" not in box, box.get("error")
    return box["value"]


def plant(path: Path, how: str, real: Path) -> None:
    """A FIFO, a symbolic link to `real` (a file that would be trusted), or a document inside the
    64 KiB bound nested far past Python's recursion limit, under `path`."""
    if how == "fifo":
        os.mkfifo(path)
    elif how == "link":
        path.symlink_to(real)
    else:
        path.write_text('{"choice": "local", "path": "/weights/abc", "factors": ' + "[" * 20_000 + "]" * 20_000
                        + "}")


@pytest.mark.parametrize("how", ["fifo", "link", "deep"])
def test_a_planted_choice_file_is_s3_and_never_blocks(tmp_path: Path, how: str) -> None:
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"choice": "local", "path": "/weights/abc"}))
    assert compile_cache_key.weights_factor(real) == "local:/weights/abc"  # as a regular file, it is read
    plant(tmp_path / "choice.json", how, real)
    assert within_10_s(lambda: compile_cache_key.weights_factor(tmp_path / "choice.json")) == "s3"


@pytest.mark.parametrize("how", ["fifo", "link", "deep", "not-an-object"])
def test_a_planted_state_file_is_not_taken_for_the_factors(tmp_path: Path, how: str) -> None:
    real, state = tmp_path / "real.json", tmp_path / "key.json"
    real.write_text(json.dumps({"key": "k", "factors": {"forged": True}}))
    settings = cc.Settings.from_env({**BASE_ENV, "WARMSTART_STATE_FILE": str(state)})
    fresh = cc.compute_factors(settings)
    state.write_bytes(real.read_bytes())
    assert cc.resolve_factors(settings, prefer_state_file=True) == {"forged": True}  # a regular file is read
    state.unlink()
    if how == "not-an-object":
        state.write_text("[]")
    else:
        plant(state, how, real)
    assert within_10_s(lambda: cc.resolve_factors(settings, prefer_state_file=True)) == fresh
