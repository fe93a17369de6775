#!/usr/bin/env python3
"""Pre-warm vLLM's torch.compile cache on a new node from S3, and publish it once.

Why: the first vLLM pod on a node compiles for 50-80 s; pods that find the node's NVMe cache
start the compile phase in 4-6 s (AWS, "Accelerate model loading on Amazon EKS":
https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html). This file
carries that warm start across nodes. It is shipped into pods through a ConfigMap and run with
the vLLM image's own interpreter, so it uses only the standard library and boto3/botocore
(which the vLLM image ships for the Run:ai streamer):

    python3 /opt/warmstart/compile_cache.py restore   # init container, before vLLM
    python3 /opt/warmstart/compile_cache.py publish   # sidecar, next to vLLM
    python3 /opt/warmstart/compile_cache.py key       # print the object key (debugging)

Neither command can make a pod fail: every outcome, including every error, is one JSON line on
stdout and exit status 0, and vLLM then simply compiles as it would without this tool.

Environment (read once, in Settings.from_env):

    WARMSTART_CACHE_DIR            node cache directory (the hostPath mount). Default /compile-cache.
    WARMSTART_CACHE_BUCKET         compile-cache bucket. Empty: restore and publish are skipped.
    WARMSTART_CACHE_PREFIX         the model's key prefix, e.g. "llama-8b/" (a missing trailing "/"
                                   is added). Required. Every key this tool touches starts with it,
                                   because the pod's IAM role only allows reads and writes under it.
    WARMSTART_MODEL                model name. Required (a key factor).
    WARMSTART_TP                   tensor-parallel degree. Default 1, vLLM's default (a key factor).
    WARMSTART_IMAGE                container image reference. Required (a key factor). With
                                   "@sha256:" only the digest counts: it pins vLLM, torch, Triton, CUDA.
    WARMSTART_COMPILE_FINGERPRINT  hash of the compile-relevant vLLM arguments, computed at render
                                   time (a key factor). Default "none".
    WARMSTART_STARTUP_PLAN_FINGERPRINT
                                   hash of the `vllm serve` arguments vLLM's startup plan depends on but
                                   does not fingerprint (--gpu-memory-utilization), computed at render
                                   time (a key factor). Default "none". Before anything else, restore
                                   removes the node's startup plans (<cache dir>/vllm/startup_plan) when
                                   the last pod of the model on the node had another value, so vLLM
                                   never applies a KV-cache size measured under other memory settings.
    WARMSTART_ACCELERATOR          accelerator identity, replacing detection (tests; containers that
                                   cannot see the GPU). Default: detected with nvidia-smi.
    WARMSTART_GPU_DRIVER           NVIDIA driver version, replacing detection (tests). Default: read from
                                   /sys/module/nvidia/version or /proc/driver/nvidia/version (a key factor:
                                   the CUDA driver's JIT cache is only valid for the driver that wrote it).
    WARMSTART_STATE_FILE           optional pod-local file (an emptyDir shared by the init container
                                   and the sidecar): restore writes the key factors it computed there
                                   and publish reuses them, so a sidecar that cannot see the GPU still
                                   publishes under the key the GPU-holding init container derived.
    WARMSTART_WEIGHTS_CHOICE_FILE  the node cache's `choice.json` (warmstart/podside/weights_select.py writes it
                                   before vLLM starts): where this pod's vLLM loads its weights from, a key
                                   factor (`weights`), because vLLM hashes the model path into its compile
                                   cache directory, so an NVMe-loaded and an S3-streamed pod never share one.
                                   `local:<path>` when the file says `local` with an absolute path, else `s3`
                                   (unset, missing, unreadable, larger than 64 KiB or malformed: vLLM then
                                   streams the URI, and the S3 URI is already in the fingerprint).
    WARMSTART_CACHE_PATHS          comma-separated directories under the cache dir that are
                                   published. Default DEFAULT_CACHE_PATHS: Inductor, Triton, vLLM's
                                   torch.compile cache, its startup plan, the DeepGEMM, FlashInfer,
                                   CUDA driver, TVM-FFI and TileLang JIT caches (the serving pod points
                                   each at its directory here, warmstart/manifests/serving.py). An
                                   allow-list because XDG_CACHE_HOME points at the cache dir, so other
                                   tools' caches (a Hugging Face download, say) can land there too and
                                   must never be uploaded.
    WARMSTART_MAX_BYTES            largest cache published or restored, uncompressed, and largest object
                                   downloaded. Default 4 GiB (AWS measured about 15 MB of artifacts for a
                                   60 GB model). An object whose Content-Length is larger is refused
                                   before a byte of it is read.
    WARMSTART_MAX_FILES            most files an archive may hold. Default 100000. tarfile keeps a header
                                   object per member, so an archive of millions of empty members (a few
                                   MB compressed) would otherwise grow the restore past its memory limit.
    WARMSTART_DEADLINE_BASE_S      every S3 request must end within this many seconds plus its bytes at
    WARMSTART_FLOOR_BYTES_PER_S    the floor rate: a HEAD or the factors manifest within the base, the
                                   download within base + object bytes / floor (from its Content-Length)
                                   + 5 ms per file it unpacks (the restore unpacks as it downloads),
                                   the upload within base + archive bytes / floor. Defaults 20 s and
                                   16 MiB/s, so the largest cache (4 GiB) is bounded by 20 + 256 s. A
                                   request past its bound is abandoned and reported as `error`.
    WARMSTART_LOCK_TIMEOUT_S       how long a restore waits for another pod on the node that is fetching
                                   the same key, and then for the node lock (held only while files are
                                   renamed into place, never across network I/O). Default 600.
    WARMSTART_HEALTH_URL           publish waits for HTTP 200 here. Default http://127.0.0.1:8000/health.
    WARMSTART_HEALTH_TIMEOUT_S     how long publish waits for it, and then for the other vLLMs on the node
                                   that compile the same key; 0 waits forever. Default 7200.
    WARMSTART_POLL_INTERVAL_S      longest gap between health polls (they start at 1 s). Default 5.
    WARMSTART_SETTLE_S             a file is published only if it did not change over this interval,
                                   measured before it is archived, nor while it was archived (3 tries,
                                   then `skipped`). Default 10.
    WARMSTART_PUBLISH_RETRIES      how often the sidecar tries again after a cache that kept changing
    WARMSTART_PUBLISH_RETRY_S      (a JIT cache a first request still fills), waiting RETRY_S, then twice
                                   that, and so on. Defaults 4 and 120 (the last try about 30 min after
                                   vLLM got healthy).
    AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL and the rest of the standard AWS
    environment (IRSA, Pod Identity) are read by boto3 itself.

Object layout, all under WARMSTART_CACHE_PREFIX:

    <prefix><sha256>.tar.gz   the cache: a gzip tar of the files under WARMSTART_CACHE_PATHS, relative
                              to the cache dir, then `.warmstart/manifest.json`, the publisher's list of
                              every file with its size and sha256 as read while it held still. Metadata
                              (all required on restore): warmstart-sha256 and warmstart-bytes (of the
                              object), warmstart-factors-sha256 (the key hash, compared with the key)
                              and warmstart-format.
    <prefix><sha256>.json     the key factors, for debugging a miss; written by the publisher that won.

    <sha256> is the hex sha256 of the canonical JSON (sorted keys, no spaces) of compute_factors().

A restore installs a file only if it is a regular file under WARMSTART_CACHE_PATHS (the restoring
pod's own list: anything else, a Hugging Face config or a shared library, say, is refused) and the
manifest lists it with the size and sha256 it has; otherwise the whole object is refused.

Node-local state lives in <cache dir>/.warmstart/ (locks, markers, temp files), which is never
published or overwritten by a restore. Locks there are flock(2)s, released by the kernel when a
pod dies: `lock` (the node lock, held while a restore renames files into place),
`fetch-<sha256>.lock` (one download per key per node), `publish-<sha256>.lock` (one publisher per
key per node), and `compiling-<sha256>-*.lock`, held by each publish sidecar until its vLLM is
healthy, so that no node publishes while another vLLM there still compiles the same key.

Log line, one per phase outcome, on stdout:

    {"event":"warmstart.compile_cache","phase":"restore","result":"restored","key":"llama-8b/<sha>.tar.gz",
     "bytes":15728640,"files":412,"seconds":1.234,"reason":null}

    restore results: restored | hit (this node already has the key) | miss (no object yet)
                     | skipped (disabled, or another pod held a lock too long)
                     | misconfigured (the bucket does not exist) | error
    publish results: published | exists (the object is there already, or another publisher won)
                     | skipped (disabled, empty cache, never healthy, never settled, another vLLM on
                     the node still compiling, another pod publishing) | misconfigured | error
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import fcntl
import hashlib
import importlib.metadata
import io
import importlib.util
import json
import os
import platform
import queue
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping

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
_CHUNK = 1 << 20
_STABLE_TRIES = 3
#: The archive's last member: the files the publisher vouches for. Under .warmstart/, which no
#: restore ever installs.
MANIFEST_MEMBER = f"{STATE_DIRNAME}/manifest.json"
#: Largest pax extended header accepted. tarfile reads a whole one into memory; the publisher
#: writes one per long path (a few hundred bytes).
_MAX_HEADER_BYTES = 16 << 10
#: Temp files of a dead process that carry no key lease (older layouts) are removed after this.
_STALE_TEMP_S = 3600
#: The restore unpacks while it downloads, so each file it writes adds this to the download's
#: bound: at most WARMSTART_MAX_FILES x 5 ms (500 s for 100000 files). Writing an empty file took
#: about 1-2 ms on a loaded 2-core machine here.
_EXTRACT_S_PER_FILE = 0.005


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
        problems: list[str] = []

        def text(name: str, default: str = "", required: bool = False) -> str:
            value = env.get(name, "").strip() or default
            if required and not value:
                problems.append(f"{name} is not set")
            return value

        def number(name: str, default: float, *, integer: bool = False, minimum: float = 0) -> Any:
            raw = env.get(name, "").strip()
            if not raw:
                return int(default) if integer else float(default)
            try:
                value = int(raw) if integer else float(raw)
            except ValueError:
                problems.append(f"{name}={raw!r} is not {'an integer' if integer else 'a number'}")
                return int(default) if integer else float(default)
            if value < minimum:
                problems.append(f"{name}={raw!r} must be >= {minimum}")
            return value

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
                and not any(_ephemeral(part) for part in parts))


# --------------------------------------------------------------------------------------------
# Cache key


def canonical_json(value: Any) -> str:
    """The one serialisation that is hashed: the same factors always give the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def factors_hash(factors: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(factors).encode()).hexdigest()


def cache_key(prefix: str, factors: Mapping[str, Any]) -> str:
    """Object key of the archive for these factors: `<prefix><sha256 of the factors>.tar.gz`.

    The whole hash is used, so two configurations that differ in any factor can never share an
    object: a foreign cache is at best a silent recompile and at worst a runtime error.
    """
    return f"{prefix}{factors_hash(factors)}.tar.gz"


def manifest_key(archive_key: str) -> str:
    return archive_key[: -len(".tar.gz")] + ".json"


def image_identity(image: str) -> str:
    """The digest when the reference has one: the same bytes under another name are the same image."""
    if "@sha256:" in image:
        return "sha256:" + image.split("@sha256:", 1)[1]
    return image


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch_build() -> dict[str, str | None]:
    """torch's CUDA version and git commit, read from torch/version.py without importing torch.

    Importing torch costs seconds; find_spec on a top-level package only locates it.
    """
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return {"cuda": None, "git": None}
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text()
    except OSError:
        return {"cuda": None, "git": None}

    def field(name: str) -> str | None:
        m = re.search(rf"^{name}\s*(?::[^=\n]*)?=\s*['\"]([^'\"\n]+)['\"]", text, re.MULTILINE)
        return m.group(1) if m else None

    return {"cuda": field("cuda"), "git": field("git_version")}


def detect_accelerator(override: str | None, cuda_build: str | None, *, which: Callable[[str], str | None] = shutil.which) -> str:
    """Name and compute capability of every visible GPU, or `cpu-<machine>` without one.

    A CUDA build of torch with no nvidia-smi on PATH is an error rather than `cpu-...`: that is a
    container that cannot see the GPU, and keying its cache as CPU would let GPUs of different
    types share one object.
    """
    if override:
        return override
    smi = which("nvidia-smi")
    if smi:
        try:
            proc = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CacheError(f"nvidia-smi failed: {exc}") from exc
        rows = sorted({" ".join(line.split()) for line in proc.stdout.splitlines() if line.strip()})
        if proc.returncode != 0 or not rows:
            detail = (proc.stderr or proc.stdout).strip().splitlines()[:1]
            raise CacheError(f"nvidia-smi exited {proc.returncode} listing no GPU: {' '.join(detail)}")
        # "NVIDIA H100 80GB HBM3, 9.0"; several rows only on a mixed node, kept all so it cannot collide.
        return " + ".join(rows)
    if cuda_build:
        raise CacheError(f"torch is built for CUDA {cuda_build} but nvidia-smi is not on PATH, so the GPU "
                         "cannot be identified; give this container the GPU or set WARMSTART_ACCELERATOR")
    return f"cpu-{platform.machine() or 'unknown'}"


#: Where the loaded NVIDIA kernel module states its version: both belong to the host's kernel,
#: so a container reads the node's driver there without running nvidia-smi a second time.
DRIVER_VERSION_FILES = (Path("/sys/module/nvidia/version"), Path("/proc/driver/nvidia/version"))
_DRIVER_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)")


def detect_gpu_driver(override: str | None, accelerator_override: str | None,
                      files: tuple[Path, ...] = DRIVER_VERSION_FILES) -> str:
    """The NVIDIA driver version, a key factor: the CUDA driver's JIT cache
    ($CUDA_CACHE_PATH) holds code the driver compiled for itself, so a cache from another driver
    is dead weight at best. Read from the kernel module's files, without a process; `none`
    without an NVIDIA driver, `unknown` when the files cannot be read, and `unspecified` when the
    accelerator is given by WARMSTART_ACCELERATOR (tests) and the driver is not."""
    if override:
        return override
    if accelerator_override:
        return "unspecified"
    present = False
    for path in files:
        try:
            with open(path, "rb") as fh:
                text = fh.read(4096).decode("utf-8", "replace")
        except FileNotFoundError:
            continue
        except OSError:
            present = True
            continue
        present = True
        line = text.strip().splitlines()[0] if text.strip() else ""
        if "NVRM" in line:  # "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  <date>"
            line = line.split("Kernel Module", 1)[-1]
        m = _DRIVER_VERSION.search(line)
        if m:
            return m.group(1)
    return "unknown" if present else "none"


#: Largest choice file read (the picker writes about 200 bytes).
_MAX_CHOICE_BYTES = 64 << 10
_MAX_WEIGHTS_PATH = 1024


def weights_factor(choice_file: Path | None) -> str:
    """Where this pod's vLLM loads its weights from, as a key factor: `local:<path>` or `s3`.

    vLLM hashes the model path it is given into its torch.compile cache directory
    (`ModelConfig.compute_hash`, https://github.com/vllm-project/vllm/blob/main/vllm/config/model.py),
    so a pod that reads `/weights/<digest>` from the node's NVMe and one that streams the
    `s3://` URI compile into different directories: under one key, whichever published first
    would be a permanent miss for the other. The local path (with its digest) is the factor,
    not just `local`, since two digests of one source are two directories too; the S3 URI is
    already in the compile fingerprint. Anything but a well-formed `local` choice is `s3`, the
    mode vLLM falls back to without the picker's files. Never raises; reads at most 64 KiB.
    """
    if choice_file is None:
        return "s3"
    try:
        with open(choice_file, "rb") as fh:
            raw = fh.read(_MAX_CHOICE_BYTES + 1)
        if len(raw) > _MAX_CHOICE_BYTES:
            return "s3"
        doc = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return "s3"
    if not isinstance(doc, dict) or doc.get("choice") != "local":
        return "s3"
    path = doc.get("path")
    if not isinstance(path, str) or not path.startswith("/") or len(path) > _MAX_WEIGHTS_PATH or "\0" in path:
        return "s3"
    return f"local:{path}"


def compute_factors(settings: Settings) -> dict[str, Any]:
    """Everything that makes a compile cache unusable elsewhere when it differs: accelerator and
    compute capability (also FlashInfer's `<arch>` folders), TP, model, image (which pins the
    FlashInfer, DeepGEMM, TVM-FFI and TileLang versions), the torch build, Triton, vLLM, CUDA,
    Python, the NVIDIA driver (the CUDA JIT cache), the compile-relevant vLLM arguments, where
    the weights are loaded from (`weights_factor`) and this tool's format. Sources: "Considerations for
    cross-node caching" in AWS's
    https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html,
    and the factors vLLM hashes,
    https://docs.vllm.ai/en/latest/design/torch_compile/#compilation-cache
    """
    build = _torch_build()
    triton = "none"
    for dist in TRITON_DISTS:
        version = _dist_version(dist)
        if version:
            triton = f"{dist}=={version}"
            break
    return {
        "format": f"warmstart-compile-cache/{FORMAT_VERSION}",
        "accelerator": detect_accelerator(settings.accelerator, build["cuda"]),
        "tensor_parallel_size": settings.tp,
        "model": settings.model,
        "image": image_identity(settings.image),
        "torch": _dist_version("torch") or "none",
        "torch_git": build["git"] or "none",
        "triton": triton,
        "vllm": _dist_version("vllm") or "none",
        "cuda": build["cuda"] or os.environ.get("CUDA_VERSION") or "none",
        "python": f"{sys.implementation.name}-{platform.python_version()}",
        "compile_fingerprint": settings.compile_fingerprint,
        "weights": weights_factor(settings.weights_choice_file),
        "gpu_driver": detect_gpu_driver(settings.gpu_driver, settings.accelerator),
        "startup_plan": settings.startup_plan_fingerprint,
    }


def resolve_factors(settings: Settings, *, prefer_state_file: bool) -> dict[str, Any]:
    """Factors from the pod's state file when asked and present (see WARMSTART_STATE_FILE)."""
    if prefer_state_file and settings.state_file and settings.state_file.is_file():
        try:
            saved = json.loads(settings.state_file.read_text())
            if isinstance(saved.get("factors"), dict):
                return saved["factors"]
        except (OSError, ValueError):
            pass
    return compute_factors(settings)


# --------------------------------------------------------------------------------------------
# Outcomes and the log line


@dataclasses.dataclass
class Outcome:
    """The one result of a phase; `line()` is what the cold-start report parses."""

    phase: str
    result: str = "error"
    key: str | None = None
    bytes: int | None = None
    files: int | None = None
    seconds: float | None = None
    reason: str | None = None
    waited_s: float | None = None
    compile_dirs: list[str] | None = None
    """restore: vLLM's torch.compile hash directories the node holds after this restore (or hit),
    so the cold-start report can tell a hash mismatch from a failed load when vLLM compiles anyway."""

    def line(self) -> str:
        record = {"event": EVENT, "phase": self.phase, "result": self.result, "key": self.key,
                  "bytes": self.bytes, "files": self.files,
                  "seconds": None if self.seconds is None else round(self.seconds, 3),
                  "reason": None if self.reason is None else self.reason[:600]}
        if self.waited_s is not None:
            record["waited_s"] = round(self.waited_s, 3)
        if self.compile_dirs is not None:
            record["compile_dirs"] = self.compile_dirs
        return json.dumps(record, separators=(",", ":"))


#: Where vLLM puts its per-hash compile directories: `torch_compile_cache/<hash10>` (piecewise) and
#: `torch_compile_cache/torch_aot_compile/<sha256>` (AOT, vllm/compilation/decorators.py in 0.33).
_COMPILE_HASH_PARENTS = ("vllm/torch_compile_cache", "vllm/torch_compile_cache/torch_aot_compile",
                         "vllm/torch_aot_compile")
_MAX_COMPILE_DIRS = 32


def compile_dirs(cache_dir: Path) -> list[str]:
    """The hash directories of vLLM's torch.compile cache on the node (at most 32, sorted)."""
    found: set[str] = set()
    for parent in _COMPILE_HASH_PARENTS:
        try:
            with os.scandir(cache_dir / parent) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False) and entry.name != "torch_aot_compile" \
                            and not _ephemeral(entry.name):
                        found.add(f"{parent}/{entry.name}"[len("vllm/"):][:120])
        except OSError:
            continue
    return sorted(found)[:_MAX_COMPILE_DIRS]


def _emit(outcome: Outcome) -> None:
    sys.stdout.write(outcome.line() + "\n")
    sys.stdout.flush()


def describe_error(exc: BaseException) -> str:
    """One line naming the failure, for the log: S3 error codes, errno names, our own reasons."""
    code, status = _s3_code(exc), _s3_status(exc)
    if code or status:
        message = exc.response.get("Error", {}).get("Message") or ""  # type: ignore[attr-defined]
        hint = ""
        if code == "AccessDenied":
            hint = " (S3 also answers this for a missing key when the role lacks s3:ListBucket on the prefix)"
        return f"S3 {code} ({status}): {message}{hint}".strip()
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        where = f" {exc.filename}" if exc.filename else ""
        return f"{name}: {exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------------------------
# Node-local state: lock, markers, temp files


class LockTimeout(CacheError):
    pass


class FileLock:
    """An exclusive flock on a file in <cache dir>/.warmstart/, shared by every pod on the node.

    flock is per open file description and released by the kernel when the holder dies, so a
    killed pod never leaves the node locked. The files are never removed: a waiter would then
    lock an unlinked inode while a newcomer locks a new file.
    """

    def __init__(self, path: Path, timeout_s: float, what: str = "the node lock"):
        self.path = path
        self.timeout_s = timeout_s
        self.what = what
        self.fd: int | None = None

    def __enter__(self) -> "FileLock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise LockTimeout(f"another pod held {self.what} {self.path} for over {self.timeout_s:g} s")
                time.sleep(0.05)
        self.fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None


def NodeLock(state_dir: Path, timeout_s: float) -> FileLock:  # noqa: N802 - the name callers know
    return FileLock(state_dir / "lock", timeout_s)


def _acquire(lock: FileLock, outcome: "Outcome") -> FileLock | None:
    """`lock`, held; or None, with the outcome `skipped`, when another pod kept it too long
    (that pod is doing the same work, or vLLM compiles as it would without this tool)."""
    lock.path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return lock.__enter__()
    except LockTimeout as exc:
        outcome.result, outcome.reason = "skipped", str(exc)
        return None


def _lock_node(settings: Settings, outcome: "Outcome") -> FileLock | None:
    return _acquire(NodeLock(settings.state_dir, settings.lock_timeout_s), outcome)


def _key_hash(key: str) -> str:
    return PurePosixPath(key).name.split(".")[0]


def _marker(settings: Settings, kind: str, key: str) -> Path:
    return settings.state_dir / f"{kind}-{_key_hash(key)}.json"


def _node_has(settings: Settings, key: str) -> str | None:
    """Why this node already holds the cache for `key`, or None."""
    if _marker(settings, "restored", key).exists():
        return "restored on this node before"
    if _marker(settings, "published", key).exists():
        return "compiled and published from this node"
    return None


def _write_json_atomic(path: Path, value: Any) -> None:
    tmp = path.with_name(f"tmp-json-{secrets.token_hex(6)}-{path.name}")
    try:
        tmp.write_text(json.dumps(value, indent=1, sort_keys=True))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class Compiling:
    """`compiling-<key hash>-<token>.lock`, flocked while this pod's vLLM has not yet answered
    /health, i.e. while it may still be writing the key's cache files (vLLM writes some of them
    in place). Created under a temp name and renamed once locked, so a peer never sees it
    unlocked while its holder lives."""

    def __init__(self, settings: Settings, key_hash: str):
        token = secrets.token_hex(6)
        tmp = settings.state_dir / f"tmp-lease-{token}"
        self.path = settings.state_dir / f"compiling-{key_hash}-{token}.lock"
        self.fd: int | None = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            os.rename(tmp, self.path)
        except BaseException:
            os.close(self.fd)
            tmp.unlink(missing_ok=True)
            raise

    def release(self) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None


def compiling_peers(settings: Settings, key_hash: str) -> int:
    """How many other pods on the node still compile this key (their lease is held). Leases
    of dead pods (flock free) are removed on the way."""
    alive = 0
    for path in settings.state_dir.glob(f"compiling-{key_hash}-*.lock"):
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                alive += 1
                continue
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return alive


_KEYED_TEMP = re.compile(r"^tmp-(restore|publish)-([0-9a-f]{64})-")
_LEASE_OF = {"restore": "fetch", "publish": "publish"}


def _clean_stale_temp(settings: Settings, own: tuple[str, str]) -> None:
    """Temp files of dead pods. A keyed temp (`tmp-<restore|publish>-<key hash>-...`) belongs to
    the holder of that key's lease: it is removed when the caller holds that lease itself (`own`,
    so the file is a dead holder's) or can take it (nobody holds it). Any other temp is removed
    once it is older than an hour: nothing this tool writes lives that long."""
    now = time.time()
    for entry in settings.state_dir.glob("tmp-*"):
        m = _KEYED_TEMP.match(entry.name)
        if m is None:
            try:
                if now - entry.lstat().st_mtime > _STALE_TEMP_S:
                    _remove(entry)
            except FileNotFoundError:
                pass
            continue
        if (m[1], m[2]) == own:
            _remove(entry)
            continue
        lease = FileLock(settings.state_dir / f"{_LEASE_OF[m[1]]}-{m[2]}.lock", 0)
        try:
            with lease:
                _remove(entry)
        except LockTimeout:
            pass  # its owner is alive


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------------------------
# Deadlines


class _Budget:
    """The bound one network operation must meet, and the flag that stops it once missed."""

    def __init__(self, what: str, bound_s: float):
        self.what = what
        self.start = time.monotonic()
        self.bound_s = bound_s
        self.abandoned = threading.Event()

    @property
    def deadline(self) -> float:
        return self.start + self.bound_s

    def allow(self, bound_s: float) -> None:
        """The bound, once the operation knows its size (a download from its Content-Length)."""
        self.bound_s = bound_s

    def extend(self, seconds: float) -> None:
        """More time for local work the operation does as it goes (a file it unpacked)."""
        self.bound_s += seconds

    def check(self) -> None:
        if self.abandoned.is_set():
            raise DeadlineExceeded(f"{self.what}: abandoned at its deadline")


def _bounded(budget: _Budget, work: Callable[[_Budget], Any]) -> Any:
    """`work(budget)` on a worker thread, waited for until the budget's deadline at most.

    botocore's timeouts are per socket read, so a server that trickles a byte at a time, or
    accepts and never answers through every retry, would hold the caller for hours. Past the
    deadline the worker is abandoned: it stops at its next chunk (it checks the budget), and
    it is a daemon thread, so the process can exit under it. The worker creates and closes
    its own files; nothing it holds is closed from here.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work(budget)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    worker = threading.Thread(target=run, name=f"warmstart-{budget.what[:20]}", daemon=True)
    worker.start()
    while worker.is_alive():
        remaining = budget.deadline - time.monotonic()
        if remaining <= 0:
            budget.abandoned.set()
            raise DeadlineExceeded(f"{budget.what} did not finish within {budget.bound_s:.3g} s "
                                   "(WARMSTART_DEADLINE_BASE_S + bytes / WARMSTART_FLOOR_BYTES_PER_S)")
        worker.join(min(remaining, 0.05))  # short: the bound may grow once the size is known
    if "error" in box:
        raise box["error"]
    return box.get("value")


# --------------------------------------------------------------------------------------------
# S3


def make_client(settings: Settings) -> Any:
    """An S3 client that fails within seconds: a pod must not wait long for an optional cache."""
    # botocore, not boto3: the same client and credential chain (IRSA, Pod Identity, env,
    # AWS_ENDPOINT_URL), without importing boto3's transfer manager. That import was a third of
    # a restore's wall time, and the restore sits on the pod's start-up path. Imported late so
    # that `key` works in an image without boto3.
    import botocore.session
    from botocore.config import Config

    # Per socket operation only; the bound on a whole request is _bounded's (see Settings.bound_s).
    config = Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 3, "mode": "standard"})
    return botocore.session.get_session().create_client("s3", region_name=settings.region, config=config)


def _s3_status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return None


def _s3_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return response.get("Error", {}).get("Code")
    return None


def _write_stream(read: Callable[[int], bytes], out: Any, limit: int,
                  budget: _Budget | None = None, chunk: int = _CHUNK) -> tuple[int, str]:
    """Copy a stream to a file, returning (bytes, sha256). Writes go through here so a full disk
    surfaces as one OSError(ENOSPC) that the caller cleans up after. Never more than `limit`
    bytes, one chunk in memory at a time; stops once `budget` is abandoned."""
    digest = hashlib.sha256()
    total = 0
    while True:
        if budget is not None:
            budget.check()
        data = read(chunk)
        if not data:
            return total, digest.hexdigest()
        total += len(data)
        if total > limit:
            raise CacheError(f"more than the {limit} bytes expected (WARMSTART_MAX_BYTES={limit} at most)")
        digest.update(data)
        out.write(data)


class _BudgetedReader:
    """An upload body that stops being readable once its budget is abandoned, so an abandoned
    upload ends at its next chunk instead of feeding a stalled server forever."""

    def __init__(self, f: Any, budget: _Budget):
        self._f, self._budget = f, budget

    def read(self, n: int = -1) -> bytes:
        self._budget.check()
        return self._f.read(n)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


def _is_missing_bucket(exc: BaseException) -> bool:
    return _s3_code(exc) == "NoSuchBucket"


def _missing_bucket(settings: Settings) -> Misconfigured:
    return Misconfigured(f"the bucket {settings.bucket!r} (WARMSTART_CACHE_BUCKET) does not exist; this is a "
                         "deployment error, not a cache miss: fix the bucket name or create the bucket")


# --------------------------------------------------------------------------------------------
# Archive: build and safe extraction


def _ephemeral(name: str) -> bool:
    """Files a compiler is still writing or that only coordinate processes: inductor writes
    `.<pid>.<tid>.tmp` then renames, Triton stages in `tmp.pid_*` dirs, and both use `*.lock`;
    FlashInfer appends its build log, `flashinfer_jit.log`, to its workspace
    (flashinfer/jit/core.py), a log and not a cache."""
    return name.endswith((".tmp", ".lock", ".log")) or name.startswith("tmp.pid_")


def snapshot(settings: Settings) -> dict[str, tuple[int, int, bool]]:
    """{relative path: (size, mtime_ns, executable)} of every regular file that would be published.

    Symlinks, sockets and devices are left out: compile caches are plain files, and restore
    refuses anything else, so the archive is safe to extract on any node.
    """
    files: dict[str, tuple[int, int, bool]] = {}
    for top in settings.cache_paths:
        root = settings.cache_dir / top
        if not root.is_dir() or root.is_symlink():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not _ephemeral(d))
            for name in filenames:
                if _ephemeral(name):
                    continue
                full = os.path.join(dirpath, name)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    rel = os.path.relpath(full, settings.cache_dir).replace(os.sep, "/")
                    files[rel] = (st.st_size, st.st_mtime_ns, bool(st.st_mode & 0o111))
    return files


class _Changed(Exception):
    """A file changed while it was archived: the cache is not stable yet."""


def build_archive(settings: Settings, files: Mapping[str, tuple[int, int, bool]], out_path: Path,
                  key_hash: str) -> list[list[Any]]:
    """A gzip tar of exactly `files`, each checked against the snapshot as it is read, then the
    manifest of what was read: [[path, bytes, sha256, executable], ...], also returned."""
    entries: list[list[Any]] = []
    with tarfile.open(out_path, "w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tar:
        for rel in sorted(files):
            size, mtime_ns, executable = files[rel]
            try:
                f = open(settings.cache_dir / rel, "rb")
            except FileNotFoundError as exc:
                raise _Changed(rel) from exc
            with f:
                st = os.fstat(f.fileno())
                if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
                    raise _Changed(rel)
                data = _HashingReader(f)
                info = tarfile.TarInfo(rel)
                info.size = size
                info.mtime = mtime_ns // 1_000_000_000
                info.mode = 0o755 if executable else 0o644
                tar.addfile(info, data)
                st = os.fstat(f.fileno())
                if (st.st_size, st.st_mtime_ns) != (size, mtime_ns) or data.count != size:
                    raise _Changed(rel)
                entries.append([rel, size, data.digest.hexdigest(), executable])
        body = json.dumps({"format": FORMAT_VERSION, "factors_sha256": key_hash, "files": entries},
                          separators=(",", ":")).encode()
        info = tarfile.TarInfo(MANIFEST_MEMBER)
        info.size, info.mode, info.mtime = len(body), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(body))
    return entries


class _HashingReader:
    """A file as tarfile reads it into the archive, hashed on the way (what is vouched for is
    exactly what was archived)."""

    def __init__(self, f: Any):
        self._f, self.digest, self.count = f, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.digest.update(data)
        self.count += len(data)
        return data


def _manifest_limit(settings: Settings) -> int:
    """Largest manifest accepted: a line per file of at most a long path and a sha256."""
    return 4096 + settings.max_files * 512


class _BoundedTarInfo(tarfile.TarInfo):
    """Headers as tarfile parses them, refused before tarfile reads what they announce.

    tarfile reads a whole pax or GNU long-name header into memory, and a GNU sparse header's
    extension blocks into a list, whatever their size: a few KB of gzip can announce GBs. Only
    what build_archive writes is accepted: regular files and small pax headers. (`frombuf` is
    the documented constructor tarfile calls for every header block.)
    """

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> "tarfile.TarInfo":
        info = super().frombuf(buf, encoding, errors)
        if info.type == tarfile.XHDTYPE:
            if info.size > _MAX_HEADER_BYTES:
                raise CacheError(f"archive has a {info.size}-byte pax header (at most {_MAX_HEADER_BYTES} "
                                 "accepted): not an archive this tool wrote")
        elif info.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            raise CacheError(f"archive member {info.name!r} is not a regular file (tar type {info.type!r})")
        return info


def _safe_name(name: str) -> str:
    path = PurePosixPath(name)
    parts = [p for p in path.parts if p != "."]
    if path.is_absolute() or not parts or ".." in parts or "\\" in name or "\x00" in name:
        raise CacheError(f"unsafe path in archive: {name!r}")
    if parts[0] == STATE_DIRNAME:
        raise CacheError(f"archive writes into {STATE_DIRNAME}/: {name!r}")
    return "/".join(parts)


def _parse_manifest(data: bytes, settings: Settings, key_hash: str) -> dict[str, tuple[int, str, bool]]:
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT_VERSION or doc.get("factors_sha256") != key_hash:
            raise CacheError("archive manifest is for another format or other key factors")
        files = {str(rel): (int(size), str(sha), bool(executable)) for rel, size, sha, executable in doc["files"]}
    except CacheError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CacheError(f"archive manifest is unreadable: {type(exc).__name__}: {exc}") from exc
    if len(files) > settings.max_files:
        raise CacheError(f"archive manifest lists {len(files)} files, more than WARMSTART_MAX_FILES={settings.max_files}")
    return files


def extract_archive(archive: Path | Any, dest: Path, settings: Settings, key_hash: str,
                    budget: _Budget | None = None) -> int:
    """Extract into `dest` (an empty staging dir) what the publisher vouched for, or refuse it all.

    `archive` is a file, or a stream read once from start to end (the download itself, so that
    unpacking overlaps the transfer); `budget` is checked before every member.

    Members are written one by one with O_EXCL|O_NOFOLLOW rather than with extractall, so no
    link, device, absolute path or `..` can place anything outside `dest`, whatever Python's
    tarfile filter defaults are in the image. Every member must be a regular file under
    WARMSTART_CACHE_PATHS (this pod's list, not the archive's), at most WARMSTART_MAX_FILES of
    them and WARMSTART_MAX_BYTES in all, each refused at its header before its data is read;
    and every one must be listed in the manifest (the last member) with its size and sha256,
    which must list nothing else. Memory stays bounded: one chunk, one header and the manifest.
    Returns the number of files.
    """
    seen: dict[str, tuple[int, str, bool]] = {}
    manifest: dict[str, tuple[int, str, bool]] | None = None
    made: set[str] = set()
    total = 0
    if isinstance(archive, (str, Path)):
        opened = tarfile.open(archive, "r:gz", tarinfo=_BoundedTarInfo)
    else:
        # Inflated here, not by tarfile ("r|gz"): tarfile's stream inflates a whole read of
        # compressed input at once, however large it grows, then copies what is left of it on
        # every read (tarfile._Stream._read), so a member header cost a copy of up to ~1000
        # times the chunk read. Here each read gives at most `_OUT` bytes (zlib's max_length,
        # https://docs.python.org/3/library/zlib.html#zlib.Decompress.decompress), fed `_IN`
        # bytes at a time, so memory stays one chunk and tarfile's copies stay small.
        _IN, _OUT = 32 << 10, 32 << 10
        stream = archive

        class _Inflating:
            def __init__(self) -> None:
                self.inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing
                self.feed = memoryview(b"")

            def read(self, n: int = _OUT) -> bytes:
                inflater = self.inflater
                while not inflater.eof:
                    data: Any = inflater.unconsumed_tail
                    if not data:
                        if not self.feed:
                            chunk = stream.read(_CHUNK)
                            if not chunk:
                                return b""  # truncated: tarfile reports what it lacks
                            self.feed = memoryview(chunk)
                        data, self.feed = self.feed[:_IN], self.feed[_IN:]
                    out = inflater.decompress(data, n if 0 < n < _OUT else _OUT)
                    if out:
                        return out
                return b""

        opened = tarfile.open(fileobj=_Inflating(), mode="r|", tarinfo=_BoundedTarInfo, bufsize=_OUT)
    with opened as tar:
        while True:
            if budget is not None:
                budget.check()
            member = tar.next()
            # tarfile keeps every header it has read (for getmembers); they are not needed here.
            tar.members.clear()
            if member is None:
                break
            if manifest is not None:
                raise CacheError(f"archive member {member.name!r} follows the manifest")
            if member.name == MANIFEST_MEMBER:
                limit = _manifest_limit(settings)
                if member.size > limit:
                    raise CacheError(f"archive manifest is {member.size} bytes, more than {limit} for "
                                     f"WARMSTART_MAX_FILES={settings.max_files}")
                source = tar.extractfile(member)
                assert source is not None
                manifest = _parse_manifest(source.read(limit + 1), settings, key_hash)
                continue
            name = _safe_name(member.name)
            if not settings.published_path(name):
                raise CacheError(f"archive member {name!r} is not under WARMSTART_CACHE_PATHS="
                                 f"{','.join(settings.cache_paths)}: only published cache paths are installed")
            if name in seen:
                raise CacheError(f"archive member {name!r} appears twice")
            if len(seen) >= settings.max_files:
                raise CacheError(f"archive holds more than WARMSTART_MAX_FILES={settings.max_files} files")
            total += member.size
            if total > settings.max_bytes:
                raise CacheError(f"archive expands beyond WARMSTART_MAX_BYTES={settings.max_bytes}")
            target = dest / name
            # Each directory is made once: a mkdir per member was a tenth of an unpack here
            # (one failing syscall each), and the archive lists a directory's files together.
            parent = os.path.dirname(name)
            if parent not in made:
                target.parent.mkdir(parents=True, exist_ok=True)
                made.add(parent)
            source = tar.extractfile(member)
            assert source is not None
            executable = bool(member.mode & 0o111)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                written, sha = _write_stream(source.read, out, member.size)
                if written != member.size:
                    raise CacheError(f"archive member {member.name!r} is truncated")
                # On the open file, not the path: no second lookup, and the file is the one
                # O_EXCL|O_NOFOLLOW created (os.utime takes a descriptor where the platform
                # can, https://docs.python.org/3/library/os.html#os.utime).
                out.flush()
                os.fchmod(fd, 0o755 if executable else 0o644)
                os.utime(fd, (member.mtime, member.mtime))
            seen[name] = (written, sha, executable)
            if budget is not None:
                budget.extend(_EXTRACT_S_PER_FILE)
    if manifest is None:
        raise CacheError("archive has no manifest: the publisher vouched for none of its files")
    unvouched = sorted(set(seen) - set(manifest))
    if unvouched:
        raise CacheError(f"archive member {unvouched[0]!r} is not in the publisher's manifest")
    missing = sorted(set(manifest) - set(seen))
    if missing:
        raise CacheError(f"archive lacks {missing[0]!r}, which its manifest lists")
    for name, (size, sha, _) in seen.items():
        if manifest[name][:2] != (size, sha):
            raise CacheError(f"archive member {name!r} differs from what the publisher recorded for it")
    return len(seen)


def install_tree(staging: Path, cache_dir: Path) -> list[Path]:
    """Move the staged cache into place, each entry with one rename on the same filesystem.

    A top-level directory the node lacks moves in whole, so readers see all of it or none of
    it. Into an existing directory, files are moved one by one and files the node already has
    are kept: cache entries are content-addressed, so an existing file is an equivalent one.
    Returns what was moved, so a failure can take it back out.
    """
    moved: list[Path] = []
    try:
        _merge(staging, cache_dir, moved, top=True)
    except BaseException:
        for path in reversed(moved):
            _remove(path)
        raise
    return moved


def _merge(src: Path, dst: Path, moved: list[Path], *, top: bool = False) -> None:
    if not top and not os.path.lexists(dst):
        try:
            os.rename(src, dst)
            moved.append(dst)
            return
        except OSError as exc:
            # A compiler created the same directory meanwhile: merge into it instead.
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not src.is_dir():
                raise
    if src.is_dir() and dst.is_dir() and not dst.is_symlink():
        for entry in sorted(os.listdir(src)):
            _merge(src / entry, dst / entry, moved)


# --------------------------------------------------------------------------------------------
# restore


def restore(settings: Settings | None = None, *, client: Any = None, emit: bool = True) -> Outcome:
    """Fetch the cache for this pod's key into the node's cache dir, unless the node has it.

    Never raises: every failure becomes one `error` (or `misconfigured`) outcome, temp files
    are removed and nothing half-restored is left behind, so vLLM compiles as if this step had
    not run. The download ends within Settings.bound_s(object bytes), waiting for another pod's
    download of the same key within WARMSTART_LOCK_TIMEOUT_S.
    """
    outcome = Outcome("restore")
    start = time.monotonic()
    try:
        settings = settings or Settings.from_env()
        _restore(settings, client, outcome)
    except Misconfigured as exc:
        outcome.result, outcome.reason = "misconfigured", str(exc)
    except BaseException as exc:  # noqa: BLE001 - the contract is "never fail the pod"
        outcome.result, outcome.reason = "error", describe_error(exc)
        if not isinstance(exc, Exception):
            outcome.reason = f"interrupted: {type(exc).__name__}"
            outcome.seconds = time.monotonic() - start
            if emit:
                _emit(outcome)
            raise
    outcome.seconds = time.monotonic() - start
    if emit:
        _emit(outcome)
    _record_outcome(settings, outcome)
    return outcome


def _record_outcome(settings: Settings | None, outcome: Outcome) -> None:
    """The restore's outcome line, next to the key file in the pod's state directory, for the
    first-token sidecar's cold-start record (podside/first_token.py); best effort."""
    if settings is None or not settings.state_file:
        return
    try:
        settings.state_file.parent.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(settings.state_file.parent / f"compile-cache-{outcome.phase}.json", json.loads(outcome.line()))
    except (OSError, ValueError):
        pass


STARTUP_PLAN_DIR = "vllm/startup_plan"


def guard_startup_plans(settings: Settings) -> str | None:
    """Drop the node's startup plans when this pod's WARMSTART_STARTUP_PLAN_FINGERPRINT differs
    from the one recorded by the last pod of the model on the node, under the node lock. vLLM
    applies a plan whose own fingerprint matches, and that fingerprint leaves out
    --gpu-memory-utilization (vllm/v1/worker/startup_plan.py): a plan kept across such a change
    would size the KV cache for the old setting. A dropped plan costs one profiling run. Returns
    a note for the log line, or None; never raises."""
    record = settings.state_dir / "startup-plan.json"
    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        with NodeLock(settings.state_dir, settings.lock_timeout_s):
            try:
                recorded = json.loads(record.read_text()).get("fingerprint")
            except (OSError, ValueError, AttributeError):
                recorded = None
            if recorded == settings.startup_plan_fingerprint:
                return None
            plans = settings.cache_dir / STARTUP_PLAN_DIR
            held = plans.is_dir() and not plans.is_symlink() and any(plans.iterdir())
            _remove(plans)
            _write_json_atomic(record, {"fingerprint": settings.startup_plan_fingerprint})
            return "startup plans of other memory settings removed from the node" if held else None
    except (OSError, CacheError) as exc:
        return f"startup plans not checked: {describe_error(exc)}"


def _restore(settings: Settings, client: Any, outcome: Outcome) -> None:
    note = guard_startup_plans(settings)
    try:
        _restore_cache(settings, client, outcome)
    finally:
        if note:
            outcome.reason = f"{outcome.reason}; {note}" if outcome.reason else note


def _restore_cache(settings: Settings, client: Any, outcome: Outcome) -> None:
    if not settings.bucket:
        outcome.result, outcome.reason = "skipped", "WARMSTART_CACHE_BUCKET is empty: pre-warm is off"
        return
    factors = compute_factors(settings)
    key = outcome.key = cache_key(settings.prefix, factors)
    key_hash = factors_hash(factors)
    note = _write_state_file(settings, key, factors)
    held = _node_has(settings, key)
    if held:
        outcome.result, outcome.reason = "hit", held
        outcome.compile_dirs = compile_dirs(settings.cache_dir)
        return
    # One download per key per node: the others wait for it (it ends within its bound), then hit.
    fetching = _acquire(FileLock(settings.state_dir / f"fetch-{key_hash}.lock", settings.lock_timeout_s,
                                 "the download of this key"), outcome)
    if fetching is None:
        return
    try:
        held = _node_has(settings, key)
        if held:
            outcome.result, outcome.reason = "hit", held
            outcome.compile_dirs = compile_dirs(settings.cache_dir)
            return
        _clean_stale_temp(settings, own=("restore", key_hash))
        base = settings.state_dir / f"tmp-restore-{key_hash}-{secrets.token_hex(6)}"
        staging = base.with_name(base.name + ".d")
        try:
            fetched = _download_extracted(settings, client or make_client(settings), key, key_hash, staging, outcome)
            if fetched is None:
                return
            size, files = fetched
            # The node lock only for the renames: local, milliseconds. Never across network I/O.
            lock = _lock_node(settings, outcome)
            if lock is None:
                return
            try:
                moved = install_tree(staging, settings.cache_dir)
                try:
                    _write_json_atomic(_marker(settings, "restored", key),
                                       {"key": key, "bucket": settings.bucket, "bytes": size, "files": files,
                                        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                except BaseException:
                    for path in reversed(moved):
                        _remove(path)
                    raise
            finally:
                lock.__exit__()
            outcome.result, outcome.bytes, outcome.files = "restored", size, files
            outcome.reason = note
            outcome.compile_dirs = compile_dirs(settings.cache_dir)
        finally:
            _remove(staging)
    finally:
        fetching.__exit__()


def _check_metadata(meta: Mapping[str, str], key_hash: str, length: Any, settings: Settings) -> None:
    """Refuse an object before reading its body: every field the publisher writes is required."""
    if not meta.get("warmstart-sha256"):
        raise CacheError("object has no warmstart-sha256 metadata, so it cannot be verified")
    if meta.get("warmstart-format") != str(FORMAT_VERSION):
        raise CacheError(f"object has warmstart-format {meta.get('warmstart-format')!r}, not {FORMAT_VERSION}")
    if not meta.get("warmstart-factors-sha256"):
        raise CacheError("object has no warmstart-factors-sha256 metadata, so nothing says it is for this key")
    if meta["warmstart-factors-sha256"] != key_hash:
        raise CacheError("object metadata names other key factors than its key")
    if not isinstance(length, int) or length < 0:
        raise CacheError("object has no Content-Length, so its download cannot be bounded")
    if length > settings.max_bytes:
        raise CacheError(f"object is {length} bytes, over WARMSTART_MAX_BYTES={settings.max_bytes}; not downloaded")
    if meta.get("warmstart-bytes") != str(length):
        raise CacheError(f"object is {length} bytes but was published as {meta.get('warmstart-bytes')} (truncated)")


class _VerifyingReader:
    """The object's body as the extraction reads it: never more than its Content-Length, each
    read checked against the budget, every byte hashed, so the whole object is verified against
    the publisher's sha256 once it has been read."""

    _AHEAD = 8  # chunks read ahead of the extraction: 2 MiB in flight at most
    _READ = 256 << 10

    def __init__(self, body: Any, length: int, budget: _Budget):
        self._body, self._length, self._budget = body, length, budget
        self.digest, self.count = hashlib.sha256(), 0
        # The network is read on its own thread, so the transfer goes on while the extraction
        # unpacks and writes (both mostly outside the GIL). That thread also counts and hashes
        # what it reads (hashlib drops the GIL for large buffers), so the object's sha256 is
        # off the extraction's path: measured here, a third of the extracting thread's time
        # was hashing. Every byte the body gives is hashed in order, and the extraction reads
        # them all (drain), so the digest is the object's.
        self._chunks: "queue.Queue[bytes | BaseException]" = queue.Queue(self._AHEAD)
        self._pending = b""
        self._done = False
        self._stop = threading.Event()
        self._filler = threading.Thread(target=self._fill, name="warmstart-read-ahead", daemon=True)
        self._filler.start()

    def _stopped(self) -> bool:
        return self._stop.is_set() or self._budget.abandoned.is_set()

    def _put(self, item: "bytes | BaseException") -> None:
        while not self._stopped():
            try:
                self._chunks.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def _fill(self) -> None:
        try:
            while not self._stopped():
                # 256 KiB reads: a read returns only when full, and the budget is checked
                # between. Reads of 64 KiB cost about half again as much CPU per byte here
                # (urllib3 works per read), on a start-up path that is CPU-bound.
                data = self._body.read(self._READ)
                self.count += len(data)
                if self.count > self._length:
                    raise CacheError(f"more than the {self._length} bytes expected "
                                     f"(WARMSTART_MAX_BYTES={self._length} at most)")
                self.digest.update(data)
                self._put(data)
                if not data:
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the extracting thread
            self._put(exc)

    def close(self) -> None:
        """Stop reading ahead; the body may be closed once this returns."""
        self._stop.set()
        self._filler.join(timeout=1)  # a read stuck on the socket ends when the body is closed

    def _next(self) -> bytes:
        while True:
            self._budget.check()
            try:
                item = self._chunks.get(timeout=0.05)
            except queue.Empty:
                continue
            if isinstance(item, BaseException):
                raise item
            return item

    def read(self, n: int = -1) -> bytes:
        self._budget.check()
        if not self._pending and not self._done:
            self._pending = self._next()
            self._done = not self._pending
        want = len(self._pending) if n is None or n < 0 else n
        if want >= len(self._pending):  # the usual case: tarfile asks for more than a chunk
            data, self._pending = self._pending, b""
        else:
            data, self._pending = self._pending[:want], self._pending[want:]
        return data

    def drain(self) -> None:
        """Read what the extraction left (tar padding, the gzip trailer), so all of it is hashed."""
        while self.read(self._READ):
            pass


def _corrupt(sha: str, expected: str) -> CacheError:
    return CacheError(f"object sha256 {sha[:12]}... does not match the published {expected[:12]}... (corrupt)")


def _download_extracted(settings: Settings, client: Any, key: str, key_hash: str, staging: Path,
                        outcome: Outcome) -> tuple[int, int] | None:
    """Download the object and unpack it into `staging` as it arrives (extract_archive), then
    check the whole object against the size and sha256 the publisher recorded; nothing in
    `staging` is installed unless both match. Within Settings.bound_s: the base until the
    response headers, then base + Content-Length / floor rate from the start. (bytes, files),
    or None when there is no object (a miss)."""
    budget = _Budget(f"download of s3://{settings.bucket}/{key}", settings.bound_s())
    readers: list[_VerifyingReader] = []

    def fetch(budget: _Budget) -> tuple[int, int]:
        response = client.get_object(Bucket=settings.bucket, Key=key)
        body = response["Body"]
        try:
            budget.check()
            # Servers differ in the case of metadata names (S3 lower-cases them, rclone capitalises).
            meta = {k.lower(): v for k, v in (response.get("Metadata") or {}).items()}
            length = response.get("ContentLength")
            _check_metadata(meta, key_hash, length, settings)
            budget.allow(settings.bound_s(length))
            expected = meta["warmstart-sha256"]
            reader = _VerifyingReader(body, length, budget)
            readers.append(reader)
            staging.mkdir()
            try:
                files = extract_archive(reader, staging, settings, key_hash, budget)
                reader.drain()
            except (tarfile.TarError, EOFError, ValueError, zlib.error, CacheError) as exc:
                # A damaged object usually fails as an archive first: say so when its bytes are
                # not the published ones, else the archive's own reason.
                if isinstance(exc, DeadlineExceeded):
                    raise
                try:
                    reader.drain()
                except Exception:  # noqa: BLE001 - the first failure is the one to report
                    raise exc from None
                if reader.digest.hexdigest() != expected:
                    raise _corrupt(reader.digest.hexdigest(), expected) from exc
                raise
            if reader.count != length:
                raise CacheError(f"object ended after {reader.count} of its {length} bytes (truncated)")
            if reader.digest.hexdigest() != expected:
                raise _corrupt(reader.digest.hexdigest(), expected)
            return length, files
        finally:
            for r in readers:
                r.close()
            body.close()
            if budget.abandoned.is_set():  # the waiting thread has given up: leave nothing behind
                _remove(staging)

    try:
        return _bounded(budget, fetch)
    except Exception as exc:
        if _is_missing_bucket(exc):
            raise _missing_bucket(settings) from exc
        if _s3_code(exc) in ("NoSuchKey", "404", "NotFound") or _s3_status(exc) == 404:
            outcome.result, outcome.reason = "miss", "no cache published for this key yet"
            return None
        raise


def _write_state_file(settings: Settings, key: str, factors: Mapping[str, Any]) -> str | None:
    if not settings.state_file:
        return None
    try:
        settings.state_file.parent.mkdir(parents=True, exist_ok=True)
        _write_json_atomic(settings.state_file, {"key": key, "factors": factors})
    except OSError as exc:
        return f"state file not written: {describe_error(exc)}"
    return None


# --------------------------------------------------------------------------------------------
# publish


def wait_for_health(url: str, timeout_s: float, max_interval_s: float) -> bool:
    """Poll until `url` answers 200. Starts at 1 s and backs off to `max_interval_s`, so a
    model that loads for ten minutes costs a handful of requests. False after `timeout_s`
    (0: never)."""
    # No proxies: a cluster-wide HTTP_PROXY must not capture a request to the pod's own loopback.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = None if timeout_s <= 0 else time.monotonic() + timeout_s
    interval = min(1.0, max_interval_s)
    while True:
        try:
            with opener.open(url, timeout=5) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(interval, remaining))
        else:
            time.sleep(interval)
        interval = min(interval * 2, max_interval_s)


def publish(settings: Settings | None = None, *, client: Any = None, wait: bool = True, emit: bool = True) -> Outcome:
    """Once vLLM serves, upload the node's cache under this pod's key unless it is there already.

    The upload is a conditional write (If-None-Match: *), so of several nodes publishing one key
    exactly one object is ever written on S3; the losers see 412 and report `exists`. Only files
    that held still over WARMSTART_SETTLE_S before and while they were archived are published,
    and only once no other vLLM on the node still compiles this key. No lock is held across the
    upload but this key's publish lease. Never raises, like restore.
    """
    outcome = Outcome("publish")
    start = time.monotonic()
    try:
        settings = settings or Settings.from_env()
        _publish(settings, client, outcome, wait=wait)
    except Misconfigured as exc:
        outcome.result, outcome.reason = "misconfigured", str(exc)
    except BaseException as exc:  # noqa: BLE001
        outcome.result, outcome.reason = "error", describe_error(exc)
        if not isinstance(exc, Exception):
            outcome.reason = f"interrupted: {type(exc).__name__}"
            outcome.seconds = time.monotonic() - start - (outcome.waited_s or 0)
            if emit:
                _emit(outcome)
            raise
    # The work itself; the wait for vLLM is reported apart, in waited_s.
    outcome.seconds = time.monotonic() - start - (outcome.waited_s or 0)
    if emit:
        _emit(outcome)
    return outcome


def object_exists(client: Any, bucket: str, key: str) -> bool | None:
    """True or False from a HEAD; None when S3 will not say (403, see describe_error)."""
    try:
        client.head_object(Bucket=bucket, Key=key)
        return True
    except Exception as exc:
        status = _s3_status(exc)
        if status == 404:
            return False
        if status == 403:
            return None
        raise


def _wait_for_peers(settings: Settings, key_hash: str, waited_from: float) -> bool:
    """Wait until no other vLLM on the node compiles this key (their leases are free), within
    WARMSTART_HEALTH_TIMEOUT_S of `waited_from` (0: no limit). False if they never finish."""
    deadline = None if settings.health_timeout_s <= 0 else waited_from + settings.health_timeout_s
    while compiling_peers(settings, key_hash):
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(min(settings.poll_interval_s, 1.0))
    return True


def _publish(settings: Settings, client: Any, outcome: Outcome, *, wait: bool) -> None:
    if not settings.bucket:
        outcome.result, outcome.reason = "skipped", "WARMSTART_CACHE_BUCKET is empty: pre-warm is off"
        return
    factors = resolve_factors(settings, prefer_state_file=True)
    key = outcome.key = cache_key(settings.prefix, factors)
    key_hash = factors_hash(factors)
    held = _node_has(settings, key)
    if held:  # checked before the wait, so a restarted sidecar settles at once
        outcome.result, outcome.reason = "exists", held
        return
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    waited_from = time.monotonic()
    compiling = Compiling(settings, key_hash)
    try:
        if wait:
            healthy = wait_for_health(settings.health_url, settings.health_timeout_s, settings.poll_interval_s)
            outcome.waited_s = time.monotonic() - waited_from
            if not healthy:
                outcome.result = "skipped"
                outcome.reason = f"{settings.health_url} never answered 200 within {settings.health_timeout_s:g} s"
                return
    finally:
        compiling.release()
    # Another vLLM on this node may still be writing this key's files (some in place): a copy
    # taken now could carry a half-written one to every node that restores it.
    peers_done = _wait_for_peers(settings, key_hash, waited_from)
    if wait or time.monotonic() - waited_from > 0.5:
        outcome.waited_s = time.monotonic() - waited_from
    if not peers_done:
        outcome.result = "skipped"
        outcome.reason = (f"another vLLM on this node was still compiling this key after "
                          f"{settings.health_timeout_s:g} s (WARMSTART_HEALTH_TIMEOUT_S); it publishes when done")
        return
    publishing = FileLock(settings.state_dir / f"publish-{key_hash}.lock", 0, "the publish lease of this key")
    try:
        publishing.__enter__()
    except LockTimeout:
        outcome.result, outcome.reason = "skipped", "another pod on this node is publishing this key"
        return
    tmp_archive = settings.state_dir / f"tmp-publish-{key_hash}-{secrets.token_hex(6)}.tar.gz"
    try:
        held = _node_has(settings, key)
        if held:
            outcome.result, outcome.reason = "exists", held
            return
        _clean_stale_temp(settings, own=("publish", key_hash))
        client = client or make_client(settings)
        # HEAD first: skips building the archive in the common case that another node won long
        # ago. It is also what keeps a second publisher from overwriting on servers that ignore
        # If-None-Match (rclone's `serve s3` 1.75 does); the conditional PUT closes the race
        # on S3 itself.
        head = _Budget(f"HEAD s3://{settings.bucket}/{key}", settings.bound_s())
        if _bounded(head, lambda _: object_exists(client, settings.bucket, key)):
            outcome.result, outcome.reason = "exists", "already in the bucket"
            _mark_published(settings, key, None)
            return
        entries = _stable_archive(settings, tmp_archive, key_hash, outcome)
        if entries is None:
            return
        size, sha = _file_digest(tmp_archive)
        outcome.bytes, outcome.files = size, len(entries)
        metadata = {"warmstart-sha256": sha, "warmstart-bytes": str(size), "warmstart-format": str(FORMAT_VERSION),
                    "warmstart-factors-sha256": key_hash}

        def upload(budget: _Budget) -> None:
            with open(tmp_archive, "rb") as f:
                client.put_object(Bucket=settings.bucket, Key=key, Body=_BudgetedReader(f, budget),
                                  ContentLength=size, ContentType="application/gzip", Metadata=metadata,
                                  IfNoneMatch="*")

        try:
            _bounded(_Budget(f"upload of {size} bytes to s3://{settings.bucket}/{key}", settings.bound_s(size)),
                     upload)
        except Exception as exc:
            if _is_missing_bucket(exc):
                raise _missing_bucket(settings) from exc
            # 412: another publisher won. 409 ConditionalRequestConflict: one is writing right now.
            if _s3_status(exc) in (409, 412) or _s3_code(exc) in ("PreconditionFailed", "ConditionalRequestConflict"):
                outcome.result, outcome.reason = "exists", "another publisher won the conditional write"
                _mark_published(settings, key, None)
                return
            raise
        outcome.result = "published"
        _mark_published(settings, key, sha)
        body = json.dumps({"key": key, "factors": factors, "sha256": sha, "bytes": size, "files": len(entries),
                           "publisher": os.environ.get("HOSTNAME"), "node": os.environ.get("NODE_NAME")},
                          indent=1, sort_keys=True).encode()
        try:
            _bounded(_Budget(f"PUT s3://{settings.bucket}/{manifest_key(key)}", settings.bound_s(len(body))),
                     lambda _: client.put_object(Bucket=settings.bucket, Key=manifest_key(key),
                                                 ContentType="application/json", Body=body))
        except Exception as exc:
            outcome.reason = f"factors manifest not written: {describe_error(exc)}"
    finally:
        _remove(tmp_archive)
        publishing.__exit__()


_KEPT_CHANGING = "cache kept changing"


def publish_until_settled(settings: Settings | None = None, *, client: Any = None,
                          sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """The sidecar's publish: once vLLM is healthy, and again after WARMSTART_PUBLISH_RETRY_S
    (doubling, WARMSTART_PUBLISH_RETRIES times) while the cache keeps changing. Besides the
    compile cache the archive carries JIT caches (FlashInfer, the CUDA driver's) that a first
    request may still fill after /health; one busy minute must not cost the node's whole publish.
    Each try logs its own line. Never raises."""
    outcome = publish(settings, client=client)
    try:
        settings = settings or Settings.from_env()
    except ConfigError:
        return outcome
    for attempt in range(settings.publish_retries):
        if outcome.result != "skipped" or not (outcome.reason or "").startswith(_KEPT_CHANGING):
            break
        sleep(settings.publish_retry_s * 2 ** attempt)
        outcome = publish(settings, client=client, wait=False)  # vLLM answered /health already
    return outcome


def _mark_published(settings: Settings, key: str, sha: str | None) -> None:
    """Remember that the bucket has this key, so a restarted sidecar does not publish again."""
    try:
        _write_json_atomic(_marker(settings, "published", key), {"key": key, "sha256": sha,
                           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    except OSError:
        pass  # only an optimisation; the HEAD answers the same question next time


def _stable_archive(settings: Settings, out: Path, key_hash: str, outcome: Outcome) -> list[list[Any]] | None:
    """Tar the cache only if no file changed over WARMSTART_SETTLE_S before it was archived nor
    while it was read: a file vLLM is still writing in place changes size or mtime within that
    interval. None, with the outcome set, when the cache is empty, too big or never settles."""
    for _ in range(_STABLE_TRIES):
        before = snapshot(settings)
        if not before:
            outcome.result = "skipped"
            outcome.reason = ("cache is empty (eager mode, or vLLM compiled into a directory outside "
                              f"WARMSTART_CACHE_PATHS={','.join(settings.cache_paths)})")
            return None
        total = sum(size for size, _, _ in before.values())
        if total > settings.max_bytes:
            outcome.result = "skipped"
            outcome.reason = f"cache is {total} bytes, over WARMSTART_MAX_BYTES={settings.max_bytes}"
            return None
        if len(before) > settings.max_files:
            outcome.result = "skipped"
            outcome.reason = f"cache has {len(before)} files, over WARMSTART_MAX_FILES={settings.max_files}"
            return None
        time.sleep(settings.settle_s)
        files = snapshot(settings)
        if files != before:
            continue
        try:
            entries = build_archive(settings, files, out, key_hash)
        except _Changed:
            _remove(out)
            continue
        if snapshot(settings) == files:
            return entries
        _remove(out)
    outcome.result = "skipped"
    outcome.reason = (f"{_KEPT_CHANGING}: {_STABLE_TRIES} tries found a file that changed within "
                      f"WARMSTART_SETTLE_S={settings.settle_s:g} s or while it was archived")
    return None


def _file_digest(path: Path) -> tuple[int, str]:
    with open(path, "rb") as f:
        return _write_stream(f.read, _NullWriter(), 1 << 62)


class _NullWriter:
    def write(self, data: bytes) -> int:
        return len(data)


# --------------------------------------------------------------------------------------------
# Command line


def _idle_forever() -> None:
    """A sidecar that exits is restarted and would publish again; one that sleeps is not."""
    while True:
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("restore", help="init container: restore the node's cache from S3 (always exits 0)")
    pub = sub.add_parser("publish", help="sidecar: publish once vLLM is healthy, then idle")
    pub.add_argument("--once", action="store_true", help="return after publishing instead of idling (tests)")
    key = sub.add_parser("key", help="print the object key for this environment")
    key.add_argument("--json", action="store_true", help="print the key and its factors as JSON")
    args = parser.parse_args(argv)

    # As PID 1 in its container this process would ignore SIGTERM and hold up pod shutdown for
    # the whole grace period; exiting runs the `finally` blocks that remove temp files.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    if args.command == "restore":
        restore()
        return 0
    if args.command == "publish":
        if args.once:
            publish()
            return 0
        publish_until_settled()
        _idle_forever()
        return 0
    try:
        settings = Settings.from_env()
        factors = compute_factors(settings)
    except (ConfigError, CacheError) as exc:
        print(f"warmstart compile_cache key: {exc}", file=sys.stderr)
        return 2
    k = cache_key(settings.prefix, factors)
    print(json.dumps({"bucket": settings.bucket, "key": k, "factors": factors}, indent=1, sort_keys=True)
          if args.json else k)
    return 0


if __name__ == "__main__":
    sys.exit(main())
