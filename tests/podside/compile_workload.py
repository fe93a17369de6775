"""A small transformer compiled with torch.compile on the CPU: the stand-in for vLLM's compile.

Run as a script in a fresh process (the caches live in TORCHINDUCTOR_CACHE_DIR, set by the
caller); prints one JSON line with the first compiled call's time and inductor's own cache
counters, which is how the test tells a cache hit from a recompile without timing anything.
The benchmark in bench/compile_cache.py runs this same workload.
"""

from __future__ import annotations

import json
import time
import warnings

warnings.filterwarnings("ignore")  # torch without numpy warns at import; irrelevant here

t0 = time.perf_counter()
import torch  # noqa: E402
from torch import nn  # noqa: E402

import_s = time.perf_counter() - t0


class Block(nn.Module):
    """Pre-norm attention and MLP, the shape of a decoder layer."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        attn = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1) @ v
        x = x + self.out(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.down(nn.functional.gelu(self.up(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 64, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*(Block(dim) for _ in range(layers)))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(ids)))


def main() -> None:
    torch.manual_seed(0)
    model = torch.compile(TinyLM().eval())
    ids = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        start = time.perf_counter()
        model(ids)
        first_call_s = time.perf_counter() - start
    from torch._dynamo.utils import counters

    print(json.dumps({
        "import_s": import_s,
        "first_call_s": first_call_s,
        "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
        "autograd_cache_hit": counters["aot_autograd"]["autograd_cache_hit"],
        "autograd_cache_miss": counters["aot_autograd"]["autograd_cache_miss"],
    }))


if __name__ == "__main__":
    main()
