"""A fake vLLM start-up: writes the cache trees vLLM 0.33, FlashInfer, the CUDA driver, DeepGEMM,
TVM-FFI and TileLang would write, at their real relative paths, from the serving pod's env.

Run as a script in the pod-side harness, with the env `warmstart.manifests.serving.vllm_env`
renders (the compile-cache mount replaced by the node's directory), so what lands where is
decided by that env, exactly as in the pod: a variable that is missing sends its tree to HOME.

    python3 tests/podside/fake_engine.py [--scale 1.0] [--seed 0]

Sizes follow what the engines write for an 8B-70B dense model (scale 1.0, about 78 MB in all):
vLLM's artifacts about 15 MB (AWS measured ~15 MB for a 60 GB model, "Considerations for
cross-node caching",
https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html),
FlashInfer's JIT ops 5-20 MB per `.so`, CUDA ComputeCache entries of 100-500 KB, DeepGEMM and
Triton cubins of tens to hundreds of KB. Binary content is part random and part repeated, so
gzip shrinks it to about 60%, as it does machine code. Also written, as the engines do, and never to be
published: FlashInfer's build log, lock files, a TileLang scratch file and a Hugging Face
download under XDG_CACHE_HOME. Prints one JSON line: {"files": n, "bytes": n}.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
from pathlib import Path

FLASHINFER_VERSION = "0.7.2.post1"
ARCH = "90a"  # FlashInfer's <arch> folder for compute capability 9.0 (H100)


def _blob(rng: random.Random, n: int) -> bytes:
    """`n` bytes that gzip shrinks to about 60%: random runs, some of them repeated."""
    out = bytearray()
    while len(out) < n:
        run = rng.randbytes(rng.randint(16, 96))
        out += run * rng.choice((1, 1, 2, 3))
    return bytes(out[:n])


class Writer:
    def __init__(self, seed: int, scale: float):
        self.rng, self.scale = random.Random(seed), scale
        self.files = self.bytes = 0

    def size(self, n: int) -> int:
        return max(1, int(n * self.scale))

    def write(self, path: Path, data: bytes | None = None, n: int = 0, text: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            data = _blob(self.rng, self.size(n))
        path.write_bytes(data)
        self.files += 1
        self.bytes += len(data)

    def hexname(self, n: int = 16) -> str:
        return self.rng.randbytes(32).hex()[:n]


def env_dir(name: str, default: str) -> Path:
    return Path(os.path.expanduser(os.environ.get(name) or default))


def write_all(w: Writer) -> None:
    cache_root = env_dir("XDG_CACHE_HOME", "~/.cache")
    vllm_root = Path(os.environ.get("VLLM_CACHE_ROOT") or cache_root / "vllm")

    # vLLM's piecewise compile cache: torch_compile_cache/<hash10>/rank_0_0/backbone
    # (vllm/compilation/backends.py), one artifact per compiled range and subgraph.
    piece = vllm_root / "torch_compile_cache" / w.hexname(10) / "rank_0_0" / "backbone"
    w.write(piece / "computation_graph.py", n=48 << 10)
    w.write(piece / "transformed_code.py", n=12 << 10)
    w.write(piece / "vllm_compile_cache.py", n=3 << 10)
    w.write(piece / "cache_key_factors.json", json.dumps({"env": w.hexname(), "config": w.hexname()}).encode())
    for i in range(33):
        w.write(piece / f"artifact_compile_range_1_8192_subgraph_{i}", n=220 << 10)
    # AOT: torch_compile_cache/torch_aot_compile/<sha256>/rank_0_0/model, with the process-wide
    # inductor cache beside it (vllm/compilation/decorators.py).
    aot = vllm_root / "torch_compile_cache" / "torch_aot_compile" / hashlib.sha256(w.rng.randbytes(8)).hexdigest()
    w.write(aot / "rank_0_0" / "model", n=5 << 20)
    for i in range(24):
        h = w.hexname(2)
        w.write(aot / "inductor_cache" / h / f"c{h}{w.hexname(40)}.py", n=18 << 10)
    w.write(aot / "inductor_cache" / "locks" / f"{w.hexname()}.lock", b"")

    inductor = env_dir("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_warmstart")
    for i in range(12):
        w.write(inductor / "fxgraph" / w.hexname(2) / f"f{w.hexname(40)}" / w.hexname(), n=64 << 10)
    triton = env_dir("TRITON_CACHE_DIR", "~/.triton/cache")
    for i in range(40):
        k = triton / w.hexname(52)
        w.write(k / "triton_.cubin", n=48 << 10)
        w.write(k / "triton_.json", n=2 << 10)
        w.write(k / "triton_.ptx", n=60 << 10)

    # The startup plan, one per rank (vllm/v1/worker/startup_plan.py).
    if os.environ.get("VLLM_ENABLE_STARTUP_PLAN") == "1":
        fp = w.hexname(16)
        plan = {"schema": 1, "fingerprint": fp, "kv_cache_memory_bytes": 56 << 30, "free_memory_baseline": 78 << 30}
        w.write(vllm_root / "startup_plan" / f"startup_plan_{fp}.json", json.dumps(plan).encode())

    # FlashInfer: $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch>/{cached_ops,generated}
    # plus its build log, and the autotune store under .cache/flashinfer/autotune (flashinfer/jit/env.py).
    fi_cache = env_dir("FLASHINFER_WORKSPACE_BASE", "~") / ".cache" / "flashinfer"
    ws = fi_cache / FLASHINFER_VERSION / ARCH
    for op, mib in (("batch_prefill_with_kv_cache_dtype_q_bf16_head_dim_128", 18),
                    ("batch_decode_with_kv_cache_dtype_q_bf16_head_dim_128", 9),
                    ("sampling", 6), ("norm", 5)):
        w.write(ws / "cached_ops" / op / f"{op}.so", n=mib << 20)
        w.write(ws / "cached_ops" / op / "build.ninja", n=3 << 10)
        w.write(ws / "generated" / op / f"{op}.cu", n=40 << 10)
    w.write(ws / "flashinfer_jit.log", n=30 << 10)
    w.write(fi_cache / "autotune" / f"{w.hexname()}.json", n=6 << 10)

    # The CUDA driver's JIT cache: an index and hashed entries ($CUDA_CACHE_PATH).
    nv = env_dir("CUDA_CACHE_PATH", "~/.nv/ComputeCache")
    w.write(nv / "index", n=24 << 10)
    for i in range(40):
        w.write(nv / w.hexname(1) / w.hexname(1) / w.hexname(14), n=w.rng.randint(100, 500) << 10)

    # DeepGEMM: $DG_JIT_CACHE_DIR/cache/kernel.<name>.<hash>/kernel.cubin.
    dg = env_dir("DG_JIT_CACHE_DIR", str(vllm_root / "deep_gemm"))
    for i in range(20):
        k = dg / "cache" / f"kernel.fp8_gemm_nt.{w.hexname(32)}"
        w.write(k / "kernel.cubin", n=160 << 10)
        w.write(k / "kernel.cu", n=6 << 10)

    # vLLM's FlashInfer autotune results (vllm/model_executor/warmup/flashinfer_autotune_cache.py).
    at = env_dir("VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", str(vllm_root / "flashinfer_autotune_cache"))
    w.write(at / FLASHINFER_VERSION / ARCH / hashlib.sha256(b"cfg").hexdigest() / "autotune_configs.json", n=8 << 10)

    # TVM-FFI's torch DLPack addon and TileLang's kernel cache, with TileLang's scratch beside it.
    tvm = env_dir("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi")
    w.write(tvm / "torch_c_dlpack_addon" / w.hexname() / "libtorch_c_dlpack_addon.so", n=1200 << 10)
    tile = env_dir("TILELANG_CACHE_DIR", "~/.tilelang/cache")
    for i in range(6):
        k = tile / w.hexname(64)
        w.write(k / "kernel_lib.so", n=400 << 10)
        w.write(k / "params.pkl", n=2 << 10)
    scratch = env_dir("TILELANG_TMP_DIR", str(tile / "tmp"))
    w.write(scratch / f"{os.getpid()}_{w.hexname(32)}.so", n=100 << 10)

    # Another tool's cache under XDG_CACHE_HOME: never published.
    w.write(cache_root / "huggingface" / "hub" / "models--org--model" / "blobs" / w.hexname(), n=64 << 10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every file size (tests use less)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    w = Writer(args.seed, args.scale)
    write_all(w)
    print(json.dumps({"files": w.files, "bytes": w.bytes}))


if __name__ == "__main__":
    main()
