"""A real torch.compile cache carried from one node to another through the bucket.

Proved with inductor's own counters, not with timing: node B's first compile must be served
from the FX graph cache that node A compiled.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.podside.pods import Pod, PodFactory, clean_environ

WORKLOAD = Path(__file__).with_name("compile_workload.py")

pytestmark = [
    pytest.mark.torch_compile,
    pytest.mark.slow,
    pytest.mark.servers,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed"),
]


def compile_on(pod: Pod) -> dict:
    """vLLM's compile, as the Deployment sets up its environment (the cache variables of
    https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html)."""
    cache = pod.cache_dir
    env = {**clean_environ(), "XDG_CACHE_HOME": str(cache), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
           "TRITON_CACHE_DIR": str(cache / "triton")}
    proc = subprocess.run([sys.executable, str(WORKLOAD)], env=env, capture_output=True, text=True,
                          # A real compile on 2 shared cores; on a machine running another suite it
                          # takes several times its idle minute.
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_new_node_hits_the_cache_another_node_compiled(pod: PodFactory) -> None:
    # The real accelerator detection: this CPU machine, with a CPU build of torch.
    a = pod("node-a", WARMSTART_ACCELERATOR="")
    cold = compile_on(a)
    assert cold["fxgraph_cache_miss"] > 0 and cold["fxgraph_cache_hit"] == 0  # a real compile
    published = a.run("publish", "--once")
    assert published.line["result"] == "published" and published.line["files"] > 0

    b = pod("node-b", WARMSTART_ACCELERATOR="")
    assert not (b.cache_dir / "inductor").exists()
    restored = b.run("restore")
    assert restored.line["result"] == "restored" and restored.line["key"] == published.line["key"]
    warm = compile_on(b)
    assert warm["fxgraph_cache_hit"] > 0 and warm["fxgraph_cache_miss"] == 0
    assert warm["autograd_cache_miss"] == 0
