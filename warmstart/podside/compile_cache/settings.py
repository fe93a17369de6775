"""The compile-cache tool's constants, errors and Settings (read once from the environment).

Part of compile_cache.py, whose docstring has the commands, the environment and the object
layout; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path, PurePosixPath
from typing import Mapping

from ..common.env import EnvReader


#: Bump when the archive layout changes, or when a factor keeps its name but changes meaning:
#: old objects then stop matching. A factor added (or removed) changes every key by itself.
#: 2: the archive ends with the publisher's per-file manifest, and all metadata is required.
#: (Still 2 with the `weights` factor: every key changed when it was added.)
FORMAT_VERSION = 2


EVENT = "warmstart.compile_cache"


STATE_DIRNAME = ".warmstart"


DEFAULT_CACHE_PATHS = (
    "inductor", "triton", "vllm/torch_compile_cache", "vllm/torch_aot_compile",
    # vLLM's startup plan, $VLLM_CACHE_ROOT/startup_plan/startup_plan_<fingerprint>.json
    # (vllm/v1/worker/startup_plan.py, https://github.com/vllm-project/vllm/pull/47388). A plan
    # whose fingerprint or free-memory baseline does not match is ignored by vLLM, so a foreign
    # one costs nothing.
    "vllm/startup_plan",
    # DeepGEMM and vLLM's FlashInfer autotune results, both under $VLLM_CACHE_ROOT in vLLM 0.33.
    "vllm/deep_gemm", "vllm/flashinfer_autotune_cache",
    # $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch>: JIT ops, cubins, autotune.
    "flashinfer/.cache/flashinfer",
    # $CUDA_CACHE_PATH: the driver's PTX JIT cache (the driver version is a key factor).
    "nv/ComputeCache",
    # $TVM_FFI_CACHE_DIR and $TILELANG_CACHE_DIR (TileLang's scratch, tilelang/tmp, is not cache).
    "tvm-ffi", "tilelang/cache",
)


TRITON_DISTS = ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu")


CHUNK = 1 << 20


STABLE_TRIES = 3
#: The archive's last member: the files the publisher vouches for. Under .warmstart/, which no
#: restore ever installs.
MANIFEST_MEMBER = f"{STATE_DIRNAME}/manifest.json"
#: Largest pax extended header accepted. tarfile reads a whole one into memory; the publisher
#: writes one per long path (a few hundred bytes).
MAX_HEADER_BYTES = 16 << 10
#: Temp files of a dead process that carry no key lease (older layouts) are removed after this.
STALE_TEMP_S = 3600
#: The restore unpacks while it downloads, so each file it writes adds this to the download's
#: bound: at most WARMSTART_MAX_FILES x 5 ms (500 s for 100000 files). Writing an empty file took
#: about 1-2 ms on a loaded 2-core machine here.
EXTRACT_S_PER_FILE = 0.005


class ConfigError(ValueError):
    """The environment does not describe a usable configuration."""


class CacheError(RuntimeError):
    """An expected failure with a reason worth one log line (bad object, unsafe archive...)."""


class Misconfigured(CacheError):
    """The deployment names something that does not exist (the bucket): not a cache miss."""


class DeadlineExceeded(CacheError):
    """A network operation did not end within its bound."""


# --------------------------------------------------------------------------------------------
# Settings


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything this tool reads from the environment, validated once."""

    cache_dir: Path
    bucket: str
    prefix: str
    model: str
    tp: int
    image: str
    compile_fingerprint: str
    startup_plan_fingerprint: str
    accelerator: str | None
    gpu_driver: str | None
    state_file: Path | None
    weights_choice_file: Path | None
    cache_paths: tuple[str, ...]
    max_bytes: int
    max_files: int
    deadline_base_s: float
    floor_bytes_per_s: float
    lock_timeout_s: float
    health_url: str
    health_timeout_s: float
    poll_interval_s: float
    settle_s: float
    publish_retries: int
    publish_retry_s: float
    region: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        read = EnvReader(env)
        problems = read.problems
        text, number = read.text, read.number


        prefix = text("WARMSTART_CACHE_PREFIX", required=True)
        if prefix.startswith("/"):
            problems.append(f"WARMSTART_CACHE_PREFIX={prefix!r} must not start with '/'")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        paths = tuple(p.strip().strip("/") for p in text("WARMSTART_CACHE_PATHS").split(",") if p.strip())
        for p in paths:
            parts = PurePosixPath(p).parts
            if ".." in parts or p.startswith(STATE_DIRNAME) or not parts:
                problems.append(f"WARMSTART_CACHE_PATHS entry {p!r} must be a relative path inside the cache dir")
        state_file = text("WARMSTART_STATE_FILE")
        choice_file = text("WARMSTART_WEIGHTS_CHOICE_FILE")
        settings = cls(
            cache_dir=Path(text("WARMSTART_CACHE_DIR", "/compile-cache")),
            bucket=text("WARMSTART_CACHE_BUCKET"),
            prefix=prefix,
            model=text("WARMSTART_MODEL", required=True),
            tp=number("WARMSTART_TP", 1, integer=True, minimum=1),
            image=text("WARMSTART_IMAGE", required=True),
            compile_fingerprint=text("WARMSTART_COMPILE_FINGERPRINT", "none"),
            startup_plan_fingerprint=text("WARMSTART_STARTUP_PLAN_FINGERPRINT", "none"),
            accelerator=text("WARMSTART_ACCELERATOR") or None,
            gpu_driver=text("WARMSTART_GPU_DRIVER") or None,
            state_file=Path(state_file) if state_file else None,
            weights_choice_file=Path(choice_file) if choice_file else None,
            cache_paths=paths or DEFAULT_CACHE_PATHS,
            max_bytes=number("WARMSTART_MAX_BYTES", 4 << 30, integer=True, minimum=1),
            max_files=number("WARMSTART_MAX_FILES", 100_000, integer=True, minimum=1),
            deadline_base_s=number("WARMSTART_DEADLINE_BASE_S", 20, minimum=0.01),
            floor_bytes_per_s=number("WARMSTART_FLOOR_BYTES_PER_S", 16 << 20, minimum=1),
            lock_timeout_s=number("WARMSTART_LOCK_TIMEOUT_S", 600),
            health_url=text("WARMSTART_HEALTH_URL", "http://127.0.0.1:8000/health"),
            health_timeout_s=number("WARMSTART_HEALTH_TIMEOUT_S", 7200),
            poll_interval_s=number("WARMSTART_POLL_INTERVAL_S", 5, minimum=0.01),
            settle_s=number("WARMSTART_SETTLE_S", 10),
            publish_retries=number("WARMSTART_PUBLISH_RETRIES", 4, integer=True),
            publish_retry_s=number("WARMSTART_PUBLISH_RETRY_S", 120),
            region=text("AWS_REGION") or text("AWS_DEFAULT_REGION") or None,
        )
        if problems:
            raise ConfigError("; ".join(problems))
        return settings

    @property
    def state_dir(self) -> Path:
        return self.cache_dir / STATE_DIRNAME

    def bound_s(self, nbytes: int = 0) -> float:
        """The longest one S3 request moving `nbytes` may take (see WARMSTART_DEADLINE_BASE_S)."""
        return self.deadline_base_s + nbytes / self.floor_bytes_per_s

    def published_path(self, name: str) -> bool:
        """Whether a relative path is one the publisher publishes: a file strictly under one of
        WARMSTART_CACHE_PATHS, with no compiler temp or lock file on the way."""
        parts = name.split("/")
        return (any(name.startswith(top + "/") for top in self.cache_paths)
                and not any(ephemeral(part) for part in parts))


def ephemeral(name: str) -> bool:
    """Files a compiler is still writing or that only coordinate processes: inductor writes
    `.<pid>.<tid>.tmp` then renames, Triton stages in `tmp.pid_*` dirs, and both use `*.lock`;
    FlashInfer appends its build log, `flashinfer_jit.log`, to its workspace
    (flashinfer/jit/core.py), a log and not a cache."""
    return name.endswith((".tmp", ".lock", ".log")) or name.startswith("tmp.pid_")
