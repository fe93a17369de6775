#!/usr/bin/env python3
"""Side by side, through the real router (SMG 1.13.0 from its PyPI wheel): prefix-aware routing
as warmstart renders it against random and round-robin, in front of 7 fake vLLM replicas.

The replicas are tests/routing/fake_vllm.py: each keeps an LRU prefix cache of bounded size in
vLLM's block layout and counts hit tokens; a stand-in for vLLM's automatic prefix caching
(https://docs.vllm.ai/en/latest/design/prefix_caching/), holding which prefixes a replica would
still have, not KV tensors. A request takes `--decode-ms` plus `--prefill-us-per-token` for each
token not in its cache (a sleep, so the machine's CPUs are not what is measured). Every policy
runs on the same fleet (same URLs, so the same hash ring), emptied between runs, through two
fresh routers (clients alternate), each with the per-router load bound of
warmstart/decisions/routing.py.

The workload has the shape of SageMaker HyperPod's measurement
(https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-model-deployment-caching-routing.html):
many users share a set of long prefixes, each request adds a short suffix, requests run
concurrently. Why each default is what it is:

- 7 replicas: the anchor's 7 instances (each between 13.3 % and 15.4 % of requests).
- `--prefixes 350` (50 a replica) of `--prefix-chars 4096` (1024 tokens): a set of long shared
  prompts, longer than the 256 tokens SMG hashes, so the key is shared text only. The count sets
  the sampling spread: a replica's prefix count has relative stddev sqrt(6/P), 13 % here (23 % at
  112), and fewer, hotter prefixes would only be fairer to the bound by making it work harder.
- Suffixes of 4-12 words from `--users 2000` users: short, so a request's tokens are ~97 % prefix.
- `--requests 5600`: 16 a prefix, so the unavoidable first miss of each prefix costs ~6 % of the
  hit rate, and request-count noise is sqrt(6/R) = 3.3 %; ~15 s a policy on 2 shared cores.
- `--concurrency 112`: 16 in flight a replica, 8 as each router counts. The load bound compares
  in-flight counts, so it is exercised only when replicas are loaded; 16 is modest for vLLM,
  whose scheduler batches up to `--max-num-seqs` requests. At 28 (2 a replica a router) the bound
  cannot fire (mean + threshold is never reached) and shares are the ring's (see below).
- `--decode-ms 250`, `--prefill-us-per-token 100`: a short answer, and a miss on a 1024-token
  prefix adding ~100 ms (40 %), so misses cost time and a replica full of misses is slower.
- Cache 2.2x a replica's share of the prefixes: enough for prefix-aware routing, about a third
  of what random routing would need, so random's hit rate lands near the anchor's ~25 %.

Why shares are uneven, and what evens them (printed with figures for the run's own ring).
SMG's prefix_hash puts each worker on its ring at 150 virtual nodes, blake3("<url>#<i>")
(https://github.com/smg-project/smg, model_gateway/src/worker/hash_ring.rs,
VIRTUAL_NODES_PER_WORKER; not a flag), and a request's key is xxh3 of its first 256 tokens or
1024 characters (model_gateway/src/policies/prefix_hash.rs). A worker's slice of the ring is then
Beta(150, 6*150): relative stddev sqrt(6/1051) = 7.6 %, so even with endless prefixes one replica
in seven is often 12-15 % off the mean, and which one depends on the pod IPs. The prefixes'
sampling (13 %) comes on top. The only thing in SMG that corrects it is the load bound (load_ok:
a worker is skipped when its in-flight count exceeds max(mean * load factor, mean + abs
threshold)); it caps in-flight load, not request share, and only binds when the load is high
enough for the relative term to matter. Measured (5600 requests, 112 in flight, two rings whose
unbounded shares were 22 % and 14 % off): SMG's default bound (1.25, 10 over the mean, 5 a
router) kept ~90 % KV hits and left 16 % and 12 %; maxExcessRequests 6 (3 a router) 87 % and
8 %; 4: 83 % and 7 %; 2: 82 % and 8 %; load factor 1.15 or less: under 80 % hits. Over more
rings 6 still left two of six 18-20 % off, 4 none above 14 %: warmstart's default is 4 (2 a
router), and this script also runs SMG's own 10 beside it. SMG's
cache_aware policy, as an alternative, spreads worse with two routers (69 % off, 58 % hits):
each router's tree places a new prefix on its least-loaded worker independently.

Printed: KV-cache hit rate per policy, each replica's share, the ring's slices and the shares
the ring alone would give these requests, the trade-off of each bound run, the router's added p50
and p99 latency against calling a replica directly, and the share of prefixes that move when a
replica is added and removed. Targets (judged on warmstart's bound, the first prefix_hash run):
hit rate >= 80 % where random stays near the anchor's ~25 %, every replica within +/-15 % of the
mean share, p50 overhead < 2 ms, movement <= 1/N + 5 %; a target missed is explained. The last
line is one JSON object with the figures.

    python bench/routing.py [--requests 5600] [--concurrency 112] [--prefixes 350]
                            [--policies prefix_hash,prefix_hash:1.25:10,random,round_robin]
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.routing.fake_vllm import BLOCK_CHARS, FakeVllm  # noqa: E402
from tests.routing.router import SmgRouter, write_discovery_file  # noqa: E402
from warmstart.decisions import routing  # noqa: E402

REPLICAS = 7
# SMG's ring: 150 virtual nodes per worker, at blake3(url#i)
# (https://github.com/smg-project/smg, model_gateway/src/worker/hash_ring.rs, VIRTUAL_NODES_PER_WORKER).
VNODES = 150
# warmstart's bound, the bound this benchmark recommends (see above), and the two baselines.
DEFAULT_POLICIES = "prefix_hash,prefix_hash:1.25:10,random,round_robin"
WORDS = ("policy", "context", "document", "section", "customer", "account", "report", "summary", "clause",
         "record", "ticket", "product", "region", "release", "schedule", "invoice")


class Client:
    """One keep-alive connection per thread to each base URL (no connect cost in the figures)."""

    def __init__(self) -> None:
        self.local = threading.local()

    def post(self, base: str, body: bytes, timeout_s: float = 60.0) -> tuple[float, dict]:
        conns = self.local.__dict__.setdefault("conns", {})
        host, port = base.removeprefix("http://").split(":")
        for attempt in (0, 1):
            conn = conns.get(base)
            if conn is None:
                conn = conns[base] = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
            try:
                t0 = time.perf_counter()
                conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                elapsed = time.perf_counter() - t0
                if resp.status != 200:
                    raise RuntimeError(f"{base}: {resp.status} {data[:200]!r}")
                return elapsed, json.loads(data)
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                conns.pop(base, None)
                if attempt:
                    raise
        raise AssertionError("unreachable")


def body(system: str, user: str) -> bytes:
    return json.dumps({"model": "fake-model", "max_tokens": 1, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user}]}).encode()


def prefixes(count: int, chars: int, rng: random.Random, tag: str = "Shared context") -> list[str]:
    out = []
    for i in range(count):
        text = f"{tag} {i}. "
        while len(text) < chars:
            text += rng.choice(WORDS) + " "
        # Whole blocks, so a shared prefix ends on a block boundary as a chat template's would.
        out.append(text[: chars - chars % BLOCK_CHARS])
    return out


def workload(n: int, shared: list[str], users: int, rng: random.Random, skew: float = 0.0) -> list[tuple[int, bytes]]:
    """(prefix index, request body) for `n` requests: each picks a shared prefix (uniformly, or by
    a Zipf law of exponent `skew`) and adds a short question of one of `users` users."""
    weights = [1 / (i + 1) ** skew for i in range(len(shared))]
    picks = rng.choices(range(len(shared)), weights=weights, k=n)
    return [(i, body(shared[i], f"user {rng.randrange(users)} asks question {k}: "
                     + " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))))
            for k, i in enumerate(picks)]


def start_fleet(stack: ExitStack, n: int, args: argparse.Namespace, first: int = 0) -> list[FakeVllm]:
    return [stack.enter_context(FakeVllm(f"w{first + i}", cache_blocks=args.cache_blocks,
                                         delay_ms=args.decode_ms, prefill_us_per_token=args.prefill_us_per_token))
            for i in range(n)]


def prefix_flags(load_factor: float = routing.DEFAULT_LOAD_FACTOR,
                 max_excess_requests: int = routing.DEFAULT_MAX_EXCESS_REQUESTS) -> list[str]:
    """Exactly the routing flags of a rendered plan (two routers) with this load bound."""
    p = routing.plan("bench", "bench", "auto", "auto", "unused", load_factor=load_factor,
                     max_excess_requests=max_excess_requests)
    return routing.policy_flags(p.policy, load_factor=p.load_factor, abs_threshold=p.abs_threshold,
                                prefix_tokens=p.prefix_tokens, waiting_requests=p.waiting_requests)


def policy(spec: str) -> tuple[str, list[str]]:
    """A policy to run: `prefix_hash` (warmstart's default bound), `prefix_hash:LF:EXCESS` (that
    bound), `random`, `round_robin`, or `cache_aware` (SMG's radix-tree policy, its defaults)."""
    name, _, bound = spec.partition(":")
    if name == "prefix_hash":
        if bound:
            lf, excess = bound.split(":")
            return f"prefix_hash lf={float(lf):g} excess={int(excess)}", prefix_flags(float(lf), int(excess))
        return (f"prefix_hash lf={routing.DEFAULT_LOAD_FACTOR:g} excess={routing.DEFAULT_MAX_EXCESS_REQUESTS}",
                prefix_flags())
    if name in ("random", "round_robin", "cache_aware"):
        return name, routing.policy_flags(name)
    raise SystemExit(f"--policies: unknown policy {spec!r}")


def ring_map(router: SmgRouter, fleet: list[FakeVllm], texts: list[str]) -> list[str]:
    """The replica the router's hash ring picks for each text, with no load: the replicas answer at
    once, two requests in flight at most. With two in flight, the other one's replica has load 1
    against a bound of at least mean + 1 (SMG's load_ok), so no walk can happen; the caller checks
    the walk counter anyway."""
    for b in fleet:
        b.set_delay(0.0)
    client = Client()
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda t: client.post(router.url, body(t, "hi"))[1]["choices"][0]["message"]["content"],
                             texts))


def run_policy(label: str, flags: list[str], fleet: list[FakeVllm], requests: list[tuple[int, bytes]],
               args: argparse.Namespace) -> dict:
    """One measured run on `fleet` (emptied first) through two fresh routers."""
    for b in fleet:
        b.reset()
        b.set_delay(args.decode_ms, args.prefill_us_per_token)
    with ExitStack() as stack:
        routers = [stack.enter_context(SmgRouter([*flags, "--worker-urls", *(b.url for b in fleet)],
                                                 wait_for_workers=REPLICAS)) for _ in range(2)]
        client = Client()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            latencies = list(pool.map(lambda ib: client.post(routers[ib[0] % 2].url, ib[1][1])[0],
                                      enumerate(requests)))
        wall = time.perf_counter() - t0
        stats = [b.stats() for b in fleet]
        walks = sum(r.metric_sum("smg_prefix_hash_policy_branch_total", branch="load_balance_walk") for r in routers)
    hit = sum(s["hit_tokens"] for s in stats) / sum(s["prompt_tokens"] for s in stats)
    total = sum(s["requests"] for s in stats)
    shares = {s["name"]: s["requests"] / total for s in stats}
    mean = 1 / REPLICAS
    return {"policy": label, "kv_hit_rate": hit, "shares": shares,
            "max_share_deviation": max(abs(s - mean) / mean for s in shares.values()),
            "p50_latency_ms": statistics.median(latencies) * 1000, "wall_s": wall, "load_balance_walks": walks,
            "peak_inflight": {s["name"]: s["max_inflight"] for s in stats}}


def ring_of(fleet: list[FakeVllm], requests: list[tuple[int, bytes]], shared: list[str],
            args: argparse.Namespace) -> dict:
    """What SMG's ring alone does on this fleet's URLs: each replica's slice (from `--ring-probes`
    keys) and the share each would get of these requests with no load bound (from the replica
    each shared prefix maps to)."""
    probes = prefixes(args.ring_probes, 1100, random.Random(5), tag="Ring probe")
    with SmgRouter([*prefix_flags(), "--worker-urls", *(b.url for b in fleet)], wait_for_workers=REPLICAS) as r:
        mapped = ring_map(r, fleet, shared + probes)
        walked = r.metric_sum("smg_prefix_hash_policy_branch_total", branch="load_balance_walk")
    if walked:
        raise RuntimeError(f"{walked:.0f} walks while mapping the ring: the mapping is not the ring's")
    names = [b.name for b in fleet]
    target = mapped[: len(shared)]
    mean = 1 / REPLICAS
    slices = {n: mapped[len(shared):].count(n) / len(probes) for n in names}
    expected = {n: sum(1 for i, _ in requests if target[i] == n) / len(requests) for n in names}
    return {"slices": slices, "prefixes": {n: target.count(n) for n in names}, "expected_shares": expected,
            "max_slice_deviation": max(abs(v - mean) / mean for v in slices.values()),
            "max_expected_deviation": max(abs(v - mean) / mean for v in expected.values())}


def overhead(args: argparse.Namespace, n: int) -> dict:
    """Added latency: the same requests, one at a time, to a replica directly and through a
    router that has only that replica, interleaved so machine noise hits both alike."""
    rng = random.Random(7)
    shared = prefixes(4, args.prefix_chars, rng)
    reqs = [b for _, b in workload(n, shared, 50, rng)]
    with ExitStack() as stack:
        # A replica that answers at once: its delay would be the same on both paths, and only
        # adds the machine's timer noise to the difference.
        (backend,) = start_fleet(stack, 1, argparse.Namespace(**{**vars(args), "decode_ms": 0,
                                                                 "prefill_us_per_token": 0}))
        r = stack.enter_context(SmgRouter([*prefix_flags(), "--worker-urls", backend.url], wait_for_workers=1))
        client = Client()
        for b in reqs[:50]:  # warm both paths' connections and caches
            client.post(backend.url, b), client.post(r.url, b)
        direct, routed = [], []
        for b in reqs:
            direct.append(client.post(backend.url, b)[0])
            routed.append(client.post(r.url, b)[0])

    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1000

    return {"direct_p50_ms": pct(direct, 0.5), "routed_p50_ms": pct(routed, 0.5),
            "direct_p99_ms": pct(direct, 0.99), "routed_p99_ms": pct(routed, 0.99),
            "added_p50_ms": pct(routed, 0.5) - pct(direct, 0.5), "added_p99_ms": pct(routed, 0.99) - pct(direct, 0.99)}


def movement(args: argparse.Namespace, count: int) -> dict:
    """Prefix -> replica before and after a replica joins (7 -> 8) and after one leaves (8 -> 7),
    through file discovery, as a Deployment scaling is seen through the pod watch."""
    rng = random.Random(11)
    shared = prefixes(count, 1100, rng)
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        fleet = start_fleet(stack, REPLICAS + 1, argparse.Namespace(**{**vars(args), "decode_ms": 0,
                                                                      "prefill_us_per_token": 0}))
        manifest = Path(tmp) / "workers.json"
        write_discovery_file(manifest, [b.url for b in fleet[:REPLICAS]])
        r = stack.enter_context(SmgRouter([*prefix_flags(), "--discovery-provider", "file", "--discovery-file",
                                           str(manifest), "--discovery-check-interval-secs", "1"],
                                          wait_for_workers=REPLICAS))
        client = Client()

        def mapping() -> list[str]:
            return [client.post(r.url, body(s, "hi"))[1]["choices"][0]["message"]["content"] for s in shared]

        before = mapping()
        write_discovery_file(manifest, [b.url for b in fleet])
        r.wait_workers(REPLICAS + 1, 30)
        added = mapping()
        leaving = fleet[3].name
        write_discovery_file(manifest, [b.url for b in fleet if b.name != leaving])
        r.wait_workers(REPLICAS, 30)
        removed = mapping()
    moved_add = [i for i in range(count) if before[i] != added[i]]
    moved_remove = [i for i in range(count) if added[i] != removed[i]]
    return {"moved_on_add": len(moved_add) / count, "moved_on_remove": len(moved_remove) / count,
            "add_only_to_new": {added[i] for i in moved_add} <= {fleet[-1].name},
            "remove_only_from_leaving": {added[i] for i in moved_remove} <= {leaving},
            "bound": 1 / (REPLICAS + 1) + 0.05}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5600)
    ap.add_argument("--concurrency", type=int, default=112, help="requests in flight, over both routers")
    ap.add_argument("--prefixes", type=int, default=350, help="shared long prefixes")
    ap.add_argument("--prefix-chars", type=int, default=4096, help="characters per shared prefix (4 per token)")
    ap.add_argument("--skew", type=float, default=0.0, help="Zipf exponent of prefix popularity (0: uniform)")
    ap.add_argument("--users", type=int, default=2000)
    ap.add_argument("--cache-blocks", type=int, default=0,
                    help="blocks each replica caches (default: 2.2x its share of the shared prefixes)")
    ap.add_argument("--decode-ms", type=float, default=250.0)
    ap.add_argument("--prefill-us-per-token", type=float, default=100.0)
    ap.add_argument("--overhead-requests", type=int, default=600)
    ap.add_argument("--movement-prefixes", type=int, default=800)
    ap.add_argument("--ring-probes", type=int, default=1400, help="keys that map each replica's ring slice")
    ap.add_argument("--policies", default=DEFAULT_POLICIES,
                    help="comma-separated: prefix_hash (warmstart's bound), prefix_hash:LF:EXCESS, random, "
                         "round_robin, cache_aware; targets are judged on the first prefix_hash")
    args = ap.parse_args()
    specs = list(dict(policy(x.strip()) for x in args.policies.split(",") if x.strip()).items())
    if not any(label.startswith("prefix_hash") for label, _ in specs) or "random" not in dict(specs):
        raise SystemExit("--policies needs a prefix_hash and random (the targets compare them)")
    blocks_per_prefix = args.prefix_chars // BLOCK_CHARS
    if not args.cache_blocks:
        # Room for a replica's share of the prefixes, twice over (spills put some on two), and
        # then some for suffixes: enough for prefix-aware routing, about a third of what random
        # routing would need, where every replica sees every prefix.
        args.cache_blocks = int(2.2 * blocks_per_prefix * args.prefixes / REPLICAS)
    rng = random.Random(42)
    shared = prefixes(args.prefixes, args.prefix_chars, rng)
    requests = workload(args.requests, shared, args.users, rng, args.skew)
    print(f"{REPLICAS} fake replicas, cache {args.cache_blocks} blocks each (the shared prefixes need "
          f"{blocks_per_prefix * args.prefixes}); {args.requests} requests over {args.prefixes} prefixes of "
          f"{args.prefix_chars // 4} tokens (skew {args.skew:g}), {args.concurrency} in flight through 2 routers "
          f"(~{args.concurrency / 2 / REPLICAS:.1f} per replica per router); a request takes {args.decode_ms:g} ms "
          f"+ {args.prefill_us_per_token:g} us per uncached token")
    results: dict[str, dict] = {}
    with ExitStack() as stack:
        # One fleet for every policy: the same URLs, so the same hash ring, side by side.
        fleet = start_fleet(stack, REPLICAS, args)
        for label, flags in specs:
            results[label] = run_policy(label, flags, fleet, requests, args)
        ring = ring_of(fleet, requests, shared, args)
    for label, res in results.items():
        shares = " ".join(f"{s:.1%}" for s in res["shares"].values())
        print(f"{label:32s} KV hit {res['kv_hit_rate']:.1%}  shares {shares}  (max dev "
              f"{res['max_share_deviation']:.1%})  p50 {res['p50_latency_ms']:.0f} ms  walks "
              f"{res['load_balance_walks']:.0f}  peak in flight {max(res['peak_inflight'].values())}  "
              f"wall {res['wall_s']:.1f} s")
    print(f"{'ring alone (no bound)':32s} slices {' '.join(f'{v:.1%}' for v in ring['slices'].values())} (max dev "
          f"{ring['max_slice_deviation']:.1%}, from {args.ring_probes} keys); these prefixes' requests "
          f"{' '.join(f'{v:.1%}' for v in ring['expected_shares'].values())} (max dev "
          f"{ring['max_expected_deviation']:.1%})")
    ov = overhead(args, args.overhead_requests)
    print(f"router overhead: p50 +{ov['added_p50_ms']:.2f} ms ({ov['direct_p50_ms']:.2f} -> {ov['routed_p50_ms']:.2f}), "
          f"p99 +{ov['added_p99_ms']:.2f} ms ({ov['direct_p99_ms']:.2f} -> {ov['routed_p99_ms']:.2f})")
    mv = movement(args, args.movement_prefixes)
    print(f"movement: add 7->8 moved {mv['moved_on_add']:.1%} (only to the new replica: {mv['add_only_to_new']}), "
          f"remove 8->7 moved {mv['moved_on_remove']:.1%} (only from the leaving one: "
          f"{mv['remove_only_from_leaving']}); bound {mv['bound']:.1%}")
    hashed = [r for label, r in results.items() if label.startswith("prefix_hash")]
    ph, rnd = hashed[0], results["random"]
    print("trade-off (load bound -> KV hit rate vs share spread): " + "; ".join(
        f"{r['policy'].removeprefix('prefix_hash ')}: hit {r['kv_hit_rate']:.1%}, max dev "
        f"{r['max_share_deviation']:.1%}, walks {r['load_balance_walks'] / args.requests:.1%} of requests"
        for r in hashed))
    targets = {
        "hit_rate_ge_80": ph["kv_hit_rate"] >= 0.80,
        "random_near_25": abs(rnd["kv_hit_rate"] - 0.25) <= 0.10,
        "shares_within_15": ph["max_share_deviation"] <= 0.15,
        "p50_overhead_lt_2ms": ov["added_p50_ms"] < 2.0,
        "movement_within_bound": max(mv["moved_on_add"], mv["moved_on_remove"]) <= mv["bound"]
                                 and mv["add_only_to_new"] and mv["remove_only_from_leaving"],
    }
    n = REPLICAS
    spread = {
        # Relative standard deviation of a replica's share, by source (N replicas, V virtual nodes
        # per replica, P prefixes, R requests): a replica's ring slice is a sum of V of the N*V
        # gaps between uniform points, Beta(V, (N-1)V); its prefix count is Binomial(P, 1/N); its
        # request count is Binomial(R, 1/N).
        "ring_vnodes_theory": math.sqrt((n - 1) / (n * VNODES + 1)),
        "ring_measured": statistics.pstdev(ring["slices"].values()) * n,
        "ring_probe_noise": math.sqrt((n - 1) / args.ring_probes),
        "prefix_count_theory": math.sqrt((n - 1) / args.prefixes),
        "request_count_theory": math.sqrt((n - 1) / args.requests),
        "unbounded_expected_measured": statistics.pstdev(ring["expected_shares"].values()) * n,
        "with_bound_measured": statistics.pstdev(ph["shares"].values()) * n,
    }
    print("share spread (relative stddev): ring of {v} vnodes/replica {a:.1%} in theory, {b:.1%} measured "
          "(probe noise {g:.1%}); "
          "{p} prefixes {c:.1%}; {r} requests {d:.1%}; together, no bound {e:.1%}; with the bound {f:.1%}".format(
              v=VNODES, p=args.prefixes, r=args.requests, a=spread["ring_vnodes_theory"], b=spread["ring_measured"],
              c=spread["prefix_count_theory"], d=spread["request_count_theory"],
              e=spread["unbounded_expected_measured"], f=spread["with_bound_measured"],
              g=spread["ring_probe_noise"]))
    if not targets["shares_within_15"]:
        print(f"shares NOT within +/-15 %: the ring alone puts {ring['max_expected_deviation']:.1%} (max) on these "
              f"prefixes (slices {ring['max_slice_deviation']:.1%} before prefix sampling); the bound "
              f"({ph['policy'].removeprefix('prefix_hash ')}) walked {ph['load_balance_walks']:.0f} requests and "
              f"left {ph['max_share_deviation']:.1%}. It caps in-flight load, not request share: it binds only "
              f"where a replica's in-flight count exceeds max(mean*lf, mean+excess/routers).")
    print(json.dumps({
        "config": {k: getattr(args, k) for k in ("requests", "concurrency", "prefixes", "prefix_chars", "skew",
                                                  "cache_blocks", "decode_ms", "prefill_us_per_token")},
        "kv_hit_rate": {k: round(v["kv_hit_rate"], 4) for k, v in results.items()},
        "shares": {k: {w: round(s, 4) for w, s in v["shares"].items()} for k, v in results.items()},
        "max_share_deviation": {k: round(v["max_share_deviation"], 4) for k, v in results.items()},
        "load_balance_walks": {k: v["load_balance_walks"] for k, v in results.items() if k.startswith("prefix_hash")},
        "tradeoff": {r["policy"]: {"kv_hit_rate": round(r["kv_hit_rate"], 4),
                                   "max_share_deviation": round(r["max_share_deviation"], 4),
                                   "walked": round(r["load_balance_walks"] / args.requests, 4),
                                   "hit_and_shares_met": r["kv_hit_rate"] >= 0.80 and r["max_share_deviation"] <= 0.15}
                     for r in hashed},
        "ring": {"slices": {w: round(x, 4) for w, x in ring["slices"].items()},
                 "max_slice_deviation": round(ring["max_slice_deviation"], 4),
                 "max_unbounded_deviation": round(ring["max_expected_deviation"], 4)},
        "share_spread_rel_std": {k: round(v, 4) for k, v in spread.items()},
        "overhead_ms": {k: round(v, 3) for k, v in ov.items()},
        "movement": {"on_add": round(mv["moved_on_add"], 4), "on_remove": round(mv["moved_on_remove"], 4),
                     "bound": round(mv["bound"], 4)},
        "wall_s": {k: round(v["wall_s"], 1) for k, v in results.items()},
        "targets_met": targets,
    }, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
