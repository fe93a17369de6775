"""A fake vLLM start-up: writes the cache trees vLLM 0.33, FlashInfer, the CUDA driver, DeepGEMM,
TVM-FFI and TileLang would write, at their real relative paths, from the serving pod's env.

Run as a script in the pod-side harness, with the env `warmstart.manifests.serving.vllm_env`
renders (the compile-cache mount replaced by the node's directory), so what lands where is
decided by that env, exactly as in the pod: a variable that is missing sends its tree to HOME.

    python3 tests/podside/fake_engine.py [--scale 1.0] [--seed 0] [--flashinfer-jit]

Sizes follow what the engines write for an 8B-70B dense model on an H100 from vLLM's official
image (scale 1.0: about 27 MB in all, 16 MB of gzip; with `--flashinfer-jit`, 67 MB and 40 MB):

- vLLM's torch.compile artifacts, Inductor and Triton: about 18 MB (AWS measured ~15 MB for a
  60 GB model, "Considerations for cross-node caching",
  https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html).
- FlashInfer: build.ninja files, generated sources and autotune results, a few hundred KB, and
  no JIT-built `.so`. vLLM's image installs FlashInfer's precompiled kernels, flashinfer-cubin
  and flashinfer-jit-cache ("Install FlashInfer pre-compiled kernel cache and binaries",
  https://github.com/vllm-project/vllm/blob/dead20baf70df70580ecb093f82b0b7b8676e4f5/docker/Dockerfile;
  later Dockerfiles also run `flashinfer download-cubin`, vllm PR #41134). FlashInfer loads an
  op whose `.so` that package holds from the package and never builds it into the workspace
  (`JitSpec.build_and_load`: `if self.is_aot: return self.load(self.aot_path)`, `is_aot` being
  that `.so` existing under FLASHINFER_AOT_DIR, the flashinfer-jit-cache package,
  https://github.com/flashinfer-ai/flashinfer/blob/01a02aacb5dc4986b6dc6a43c0e27f4683f6c826/flashinfer/jit/core.py),
  while `gen_jit_spec` still writes the op's build.ninja under cached_ops/ and the module
  generators its sources under generated/ (flashinfer/jit/attention/modules.py). The four ops
  written here (bf16 batch prefill and decode at head dim 128, sampling, norm) are in the set
  `flashinfer/aot.py` builds by default (fa2_head_dim (128, 128), fp16 and bf16, and its misc
  modules, at a recent revision:
  https://github.com/flashinfer-ai/flashinfer/blob/0006e88adb1a928a97b3ad99cb7f47c0db6ae057/flashinfer/aot.py);
  that the pinned image's flashinfer-jit-cache (0.7.2.post1) holds them too is inferred, not
  checked against the wheel. `--flashinfer-jit` is a model whose ops are outside that set
  (other head dims, custom variants): each op's `.so` too, 5-18 MiB, 38 MiB in all, as this
  engine wrote for every model before.
- CUDA driver ComputeCache: an index and 4 entries of 100-500 KB (before: 40, about 12 MB). The
  driver JIT-compiles PTX only for a kernel that ships no binary code for the GPU
  (https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#just-in-time-compilation).
  vLLM's own kernels carry sm_90 code (its Dockerfile above builds them for torch_cuda_arch_list
  '7.0 7.5 8.0 8.9 9.0 10.0 12.0'), Triton compiles its kernels to cubins itself (the
  triton_.cubin files), and torch's wheels and FlashInfer's precompiled ops are taken to carry
  code for the GPU too, so on an H100 only a few kernels should reach the driver's JIT: the
  count is inferred, not measured on a GPU.
- DeepGEMM, TVM-FFI and TileLang: cubins and shared objects of tens to hundreds of KB, about
  7 MB in all.

Binary content is part random and part repeated, so gzip shrinks it to about 60%, as it does
machine code. Also written, as the engines do, and never to be published: FlashInfer's build
log, lock files, a TileLang scratch file and a Hugging Face download under XDG_CACHE_HOME.
Prints one JSON line: {"files": n, "bytes": n}.
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
    def __init__(self, seed: int, scale: float, flashinfer_jit: bool = False):
        self.rng, self.scale, self.flashinfer_jit = random.Random(seed), scale, flashinfer_jit
        # The JIT-built ops draw from their own stream, so both modes write every other file alike.
        self.jit_rng = random.Random(seed + 1)
        self.files = self.bytes = 0

    def size(self, n: int) -> int:
        return max(1, int(n * self.scale))

    def write(self, path: Path, data: bytes | None = None, n: int = 0, text: bool = False,
              rng: random.Random | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            data = _blob(rng or self.rng, self.size(n))
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
    # An op of flashinfer-jit-cache leaves its build.ninja and generated sources, and is loaded
    # from the package; only an op outside it (w.flashinfer_jit) is built here, into a .so.
    fi_cache = env_dir("FLASHINFER_WORKSPACE_BASE", "~") / ".cache" / "flashinfer"
    ws = fi_cache / FLASHINFER_VERSION / ARCH
    for op, mib in (("batch_prefill_with_kv_cache_dtype_q_bf16_head_dim_128", 18),
                    ("batch_decode_with_kv_cache_dtype_q_bf16_head_dim_128", 9),
                    ("sampling", 6), ("norm", 5)):
        if w.flashinfer_jit:
            w.write(ws / "cached_ops" / op / f"{op}.so", n=mib << 20, rng=w.jit_rng)
        w.write(ws / "cached_ops" / op / "build.ninja", n=3 << 10)
        w.write(ws / "generated" / op / f"{op}.cu", n=40 << 10)
    w.write(ws / "flashinfer_jit.log", n=30 << 10)
    w.write(fi_cache / "autotune" / f"{w.hexname()}.json", n=6 << 10)

    # The CUDA driver's JIT cache: an index and hashed entries ($CUDA_CACHE_PATH), a few: see above.
    nv = env_dir("CUDA_CACHE_PATH", "~/.nv/ComputeCache")
    w.write(nv / "index", n=24 << 10)
    for i in range(4):
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
    ap.add_argument("--flashinfer-jit", action="store_true",
                    help="FlashInfer builds its ops (not in flashinfer-jit-cache): 38 MiB of .so more at scale 1")
    args = ap.parse_args()
    w = Writer(args.seed, args.scale, args.flashinfer_jit)
    write_all(w)
    print(json.dumps({"files": w.files, "bytes": w.bytes}))


if __name__ == "__main__":
    main()
