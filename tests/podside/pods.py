"""A pod's view of the compile-cache tool: its node directory, its environment, its commands.

Commands run the module as a file with the interpreter, exactly as the pod does
(`python3 /opt/warmstart/compile_cache.py restore`), which also proves the file stands alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from warmstart.podside.compile_cache import settings as compile_cache_settings
from warmstart.podside.compile_cache import main as compile_cache

from tests.podside.servers import BUCKET, S3Server
from tests.support.pod_scripts import artifact

MODULE = artifact("compile_cache.pyz")
IMAGE = "registry.example/vllm/vllm-openai:v0.11.1@sha256:" + "ab" * 32


def clean_environ() -> dict[str, str]:
    """The test process's environment without anything AWS or warmstart: each pod states its own."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_", "BOTO"))}


@dataclasses.dataclass
class Run:
    returncode: int
    lines: list[dict[str, Any]]
    stdout: str
    stderr: str

    @property
    def line(self) -> dict[str, Any]:
        """The single log line the command must print."""
        assert len(self.lines) == 1, f"expected one log line, got {self.stdout!r} (stderr {self.stderr!r})"
        return self.lines[0]


def parse_lines(stdout: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert all(line["event"] == compile_cache_settings.EVENT for line in lines), stdout
    return lines


@dataclasses.dataclass
class Pod:
    """One pod on one node: `cache_dir` is the node's hostPath, `env` the pod's environment."""

    cache_dir: Path
    env: dict[str, str]

    def with_env(self, **changes: str) -> "Pod":
        return Pod(self.cache_dir, {**self.env, **changes})

    def settings(self) -> compile_cache.Settings:
        return compile_cache.Settings.from_env(self.env)

    def key(self) -> str:
        return compile_cache.cache_key(self.settings().prefix, compile_cache.compute_factors(self.settings()))

    def full_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**clean_environ(), **self.env, **(extra or {})}

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 90) -> Run:
        proc = subprocess.run([sys.executable, str(MODULE), *args], env=self.full_env(env),
                              capture_output=True, text=True, timeout=timeout)
        return Run(proc.returncode, parse_lines(proc.stdout), proc.stdout, proc.stderr)

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(MODULE), *args], env=self.full_env(env),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


_models = itertools.count()
PodFactory = Callable[..., Pod]


def pod_factory(tmp_path: Path, server: S3Server, health_url: str) -> PodFactory:
    """Pods of one new model (a key prefix of its own) on nodes under tmp_path."""
    model = f"model-{next(_models)}"

    def make(node: str = "node-a", **env: str) -> Pod:
        cache_dir = tmp_path / node / "compile-cache"
        cache_dir.mkdir(parents=True, exist_ok=True)
        base = {
            **server.env(),
            "WARMSTART_CACHE_DIR": str(cache_dir),
            "WARMSTART_CACHE_BUCKET": BUCKET,
            "WARMSTART_CACHE_PREFIX": f"{model}/",
            "WARMSTART_MODEL": model,
            "WARMSTART_TP": "1",
            "WARMSTART_IMAGE": IMAGE,
            "WARMSTART_COMPILE_FINGERPRINT": "fp-1",
            "WARMSTART_ACCELERATOR": "NVIDIA H100 80GB HBM3, 9.0",
            "WARMSTART_HEALTH_URL": health_url,
            "WARMSTART_POLL_INTERVAL_S": "0.05",
            "WARMSTART_SETTLE_S": "0",
            "WARMSTART_LOCK_TIMEOUT_S": "60",
            "WARMSTART_HEALTH_TIMEOUT_S": "30",  # a test bug fails in seconds, not hours
        }
        return Pod(cache_dir, {**base, **env})

    return make


def finish(proc: subprocess.Popen[str], timeout: float = 90) -> Run:
    out, err = proc.communicate(timeout=timeout)
    return Run(proc.returncode, parse_lines(out), out, err)


# --------------------------------------------------------------------------------------------
# Cache contents


def make_cache(cache_dir: Path, seed: int, *, kib: int = 16, compressible: bool = False) -> dict[str, bytes]:
    """Write a compile cache the way the compilers lay it out, plus things that must never be
    published (another tool's cache under XDG_CACHE_HOME, a file being written, a lock).
    Returns the files a publish must carry: {relative path: content}."""
    rng = random.Random(seed)

    def blob(n: int) -> bytes:
        return bytes(n) if compressible else rng.randbytes(n)

    published = {
        "inductor/fxgraph/ab/fabcdef/entry": blob(kib * 1024),
        "inductor/aotautograd/cd/entry": blob(2048),
        f"inductor/c{seed}/kernel.so": blob(kib * 512),
        f"inductor/c{seed}/kernel.cpp": f"// kernel {seed}\n".encode(),
        "triton/XYZ/kernel.cubin": blob(4096),
        "vllm/torch_compile_cache/0123456789/rank_0_0/backbone/computation_graph.py": f"seed={seed}\n".encode(),
    }
    never = {
        "huggingface/hub/models--x/blobs/weights": b"weights",
        "inductor/.123.140.tmp": b"half-written",
        "inductor/locks/abc.lock": b"",
        "triton/tmp.pid_12_34/kernel.cubin": b"staging",
    }
    for rel, data in {**published, **never}.items():
        path = cache_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (cache_dir / "inductor/c{}/kernel.so".format(seed)).chmod(0o755)
    return published


def tree(cache_dir: Path) -> dict[str, bytes]:
    """Every file in the node's cache dir except the tool's own state."""
    out: dict[str, bytes] = {}
    if not cache_dir.exists():
        return out
    for path in sorted(cache_dir.rglob("*")):
        rel = path.relative_to(cache_dir).as_posix()
        if rel.split("/")[0] == compile_cache_settings.STATE_DIRNAME:
            continue
        if path.is_file() or path.is_symlink():
            out[rel] = path.read_bytes() if path.is_file() else b"<symlink>"
    return out


def leftovers(cache_dir: Path) -> list[str]:
    """Temp files the tool left in its state dir (there must be none after any outcome)."""
    state = cache_dir / compile_cache_settings.STATE_DIRNAME
    return sorted(p.name for p in state.glob("tmp-*")) if state.exists() else []


# The compile-cache key's inputs of one pod (tests/podside/test_podside_key.py, the first-token tests).
BASE_ENV = {
    "WARMSTART_CACHE_PREFIX": "llama-8b/",
    "WARMSTART_MODEL": "meta-llama/Llama-3.1-8B-Instruct",
    "WARMSTART_TP": "2",
    "WARMSTART_IMAGE": IMAGE,
    "WARMSTART_COMPILE_FINGERPRINT": "fp-1",
    "WARMSTART_ACCELERATOR": "NVIDIA H100 80GB HBM3, 9.0",
}


# --------------------------------------------------------------------------------------------
# The fake engine (tests/podside/fake_engine.py) with the serving pod's own env

FAKE_ENGINE = Path(__file__).resolve().parent / "fake_engine.py"


def engine_env(cache_dir: Path, home: Path) -> dict[str, str]:
    """The cache env the serving manifest renders for a compile-cached model
    (`serving.vllm_env`), with the compile-cache mount replaced by this node's directory."""
    from types import SimpleNamespace

    from warmstart.decisions import placement
    from warmstart.manifests import serving

    # Only what vllm_env reads: a compile-cached model with no standby engines.
    m = SimpleNamespace(compile_cache=True, standby=None, loader=SimpleNamespace(
        chunk_bytes=1, request_timeout_ms=1, low_speed_limit_bytes_per_second=1, retry_window_seconds=1))
    env = {e["name"]: e["value"] for e in serving.vllm_env(m, "us-east-1")}  # type: ignore[arg-type]
    env = {k: v.replace(placement.COMPILE_CACHE_MOUNT, str(cache_dir)) for k, v in env.items()}
    return env | {"HOME": str(home), "TMPDIR": str(home / "tmp")}


def run_engine(cache_dir: Path, home: Path, *, scale: float = 0.4, seed: int = 0,
               flashinfer_jit: bool = False) -> dict[str, int]:
    """Run the fake engine as the serving container would: its own process, the pod's env.
    `flashinfer_jit`: FlashInfer builds its ops into the workspace (ops outside flashinfer-jit-cache).
    Scale 0.4 (about 11 MB, 6 MB of gzip) keeps the archive over the 4 MiB the size-bound test
    needs refused at its Content-Length, before a byte is read."""
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    env = {**clean_environ(), **engine_env(cache_dir, home)}
    env.pop("VLLM_CACHE_ROOT", None)  # the pod sets none: vLLM's root follows XDG_CACHE_HOME
    proc = subprocess.run([sys.executable, str(FAKE_ENGINE), "--scale", str(scale), "--seed", str(seed),
                           *(["--flashinfer-jit"] if flashinfer_jit else [])],
                          env=env, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(proc.stdout)
