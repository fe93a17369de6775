"""The compile-cache key: the factors a cache is valid for, and their hash.

Part of compile_cache.py, whose docstring has the commands, the environment and the object
layout; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from .settings import CacheError, FORMAT_VERSION, Settings, TRITON_DISTS
from ..common.shared import parse_json, read_regular

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


def runs_nvidia_smi(override: str | None, *, which: Callable[[str], str | None] = shutil.which) -> bool:
    """Whether detect_accelerator will run nvidia-smi (no WARMSTART_ACCELERATOR, one on PATH)."""
    return not override and which("nvidia-smi") is not None


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
#: Largest state file read (WARMSTART_STATE_FILE: the key and its factors, about 1 KB).
_MAX_STATE_FILE_BYTES = 64 << 10
#: Deepest nesting read from either: both are one object of flat values. Deeper is refused
#: before Python's recursion limit turns it into a RecursionError.
_MAX_JSON_DEPTH = 32


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
    mode vLLM falls back to without the picker's files. Never raises; reads at most 64 KiB, of a
    regular file opened without following a link or blocking (a FIFO under the name would hold
    the restore until a writer came), JSON nested at most 32 deep (podside_common.read_regular,
    parse_json).
    """
    if choice_file is None:
        return "s3"
    raw = read_regular(choice_file, _MAX_CHOICE_BYTES)
    if not isinstance(raw, bytes):
        return "s3"
    doc, why = parse_json(raw, _MAX_JSON_DEPTH)
    if why is not None or not isinstance(doc, dict) or doc.get("choice") != "local":
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
    """Factors from the pod's state file when asked and present (see WARMSTART_STATE_FILE), read
    as the choice file is (weights_factor); anything else there (a link, a FIFO, more than 64
    KiB, not a JSON object with a `factors` object) computes them afresh."""
    if prefer_state_file and settings.state_file:
        raw = read_regular(settings.state_file, _MAX_STATE_FILE_BYTES)
        saved, why = parse_json(raw, _MAX_JSON_DEPTH) if isinstance(raw, bytes) else (None, raw)
        if why is None and isinstance(saved, dict) and isinstance(saved.get("factors"), dict):
            return saved["factors"]
    return compute_factors(settings)
