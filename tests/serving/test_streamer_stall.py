"""The serving pod's stall cut, run: the pinned Run:ai streamer loads a checkpoint from a real S3
server on 127.0.0.1 through a proxy that slows or kills its connections (tests/support/throttle.py),
with the RUNAI_STREAMER_* values a stack's vLLM container gets by default.

Slow but alive: every connection that carries a body runs at 256 KiB/s, a quarter of the 1 MiB/s
limit AWS's guide gives, for longer than the low-speed window. With that limit and a 3 s window
the load failed (each cut part retried on a new connection, cut again, then `File access error`);
a load that is only slow must complete. Dead: one connection delivers nothing after its first MiB;
it must still be cut and its part fetched again, so the load completes instead of hanging.

And the benchmark that found the failure (bench/weights.py) records a failed case as a row and
goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench import weights as bench_weights
from tests.podside.servers import BUCKET
from tests.support.throttle import Pace, ThrottleProxy
from warmstart.config import LoaderTuning
from warmstart.decisions import tuning

pytestmark = pytest.mark.servers

MIB = 1 << 20
SHARD_BYTES = 16 * MIB
SHARDS = 2
# A quarter of the limit in AWS's guide
# (https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html).
SLOW_BYTES_PER_S = 256 * 1024
LOAD_TIMEOUT_S = 150

# What vLLM's runai_streamer loader does
# (vllm/model_executor/model_loader/weight_utils.py runai_safetensors_weights_iterator,
# https://github.com/vllm-project/vllm/blob/main/vllm/model_executor/model_loader/weight_utils.py).
CHILD = textwrap.dedent("""
    import json, os, sys
    os.environ.setdefault("RUNAI_STREAMER_S3_ENDPOINT", os.environ["AWS_ENDPOINT_URL"])
    from runai_model_streamer import SafetensorsStreamer, list_safetensors
    files = sorted(list_safetensors(sys.argv[1]))
    n = 0
    with SafetensorsStreamer() as st:
        st.stream_files(files, device="cpu", is_distributed=False)
        for _name, t in st.get_tensors():
            n += t.numel() * t.element_size()
    print(json.dumps({"bytes": n, "files": len(files)}))
""")


def _write_checkpoint(rclone_s3, tmp_path: Path, prefix: str) -> int:
    """Valid safetensors shards, uploaded through S3 (rclone caches directory listings, so files
    written into its folder behind its back would not be listed)."""
    s3 = rclone_s3.client()
    block = os.urandom(4 * MIB)
    for i in range(SHARDS):
        name = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
        tensors = [(f"layer{i}.w{j}", (2 * MIB,), 4 * MIB) for j in range(SHARD_BYTES // (4 * MIB))]
        bench_weights.write_shard(tmp_path / name, tensors, block)
        s3.upload_file(str(tmp_path / name), BUCKET, f"{prefix}/{name}")
    return SHARDS * SHARD_BYTES


def _pod_env(rclone_s3, endpoint: str) -> dict[str, str]:
    """A stack's defaults (LoaderTuning as the serving container gets it), with a chunk small
    enough that each shard is one chunk of a few CRT parts."""
    loader = LoaderTuning()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RUNAI_STREAMER_"))}
    stall = tuning.streamer_s3_env(loader.request_timeout_ms, loader.low_speed_limit_bytes_per_second,
                                   loader.retry_window_seconds)
    return env | rclone_s3.env() | stall | {
        "AWS_ENDPOINT_URL": endpoint, "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        "RUNAI_STREAMER_CHUNK_BYTESIZE": str(SHARD_BYTES), "RUNAI_STREAMER_CONCURRENCY": str(SHARDS),
        "RUNAI_STREAMER_LOG_TO_STDERR": "1"}


def _load(env: dict[str, str], prefix: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, f"s3://{BUCKET}/{prefix}"], env=env,
                          capture_output=True, text=True, timeout=LOAD_TIMEOUT_S)


def _window_s(loader: LoaderTuning) -> int:
    # aws-sdk-cpp's S3CrtClient: max(3, requestTimeoutMs / 1000) whole seconds
    # (https://github.com/aws/aws-sdk-cpp/blob/main/generated/src/aws-cpp-sdk-s3-crt/source/S3CrtClient.cpp).
    return max(3, loader.request_timeout_ms // 1000)


def test_a_slow_but_alive_load_completes(rclone_s3, tmp_path):
    loader = LoaderTuning()
    pace_s = _window_s(loader) + 5
    assert SLOW_BYTES_PER_S < 1 * MIB, "the pace must be under the limit that failed"
    weights = _write_checkpoint(rclone_s3, tmp_path, "stall/slow")
    with ThrottleProxy(rclone_s3.port, Pace(SLOW_BYTES_PER_S, pace_s, after_bytes=MIB, times=1000)) as px:
        proc = _load(_pod_env(rclone_s3, px.endpoint), "stall/slow")
        paced = px.chosen
    assert proc.returncode == 0, bench_weights.failure_reason(proc.returncode, proc.stderr)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"bytes": weights, "files": SHARDS}
    assert paced >= 1, "no connection was slowed: the test tested nothing"


def test_a_dead_connection_is_cut_and_its_part_fetched_again(rclone_s3, tmp_path):
    weights = _write_checkpoint(rclone_s3, tmp_path, "stall/dead")
    forever_s = LOAD_TIMEOUT_S * 10
    with ThrottleProxy(rclone_s3.port, Pace(0, forever_s, after_bytes=MIB, times=1)) as px:
        proc = _load(_pod_env(rclone_s3, px.endpoint), "stall/dead")
        cut = px.closed_by_client_while_paced
    assert proc.returncode == 0, bench_weights.failure_reason(proc.returncode, proc.stderr)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"bytes": weights, "files": SHARDS}
    assert cut == 1, "the dead connection was not cut by the client"


STREAMER_FAILURE = (
    "\x1b[0;31m[2026-12-03 13:16:59.170] [ERROR  ] [1 2] [s3/client/client.cc:364 @ operator()] Failed to "
    "download s3 object of request 3 : Http connection channel shut down due to failure to meet throughput "
    "minimum (aws-c-http: AWS_ERROR_HTTP_CHANNEL_THROUGHPUT_FAILURE) (http_status=-1, error_type=1, "
    "retryable=false)\n"
    "[ERROR  ] [streamer/impl/batch/batch.cc:106 @ handle_error] Failed to read from file s3://b/m.safetensors\n"
    "ValueError: Could not receive response from libstreamer due to: b'File access error'\n")


def test_the_bench_records_a_failed_case_and_goes_on(monkeypatch):
    failing = f"import sys; sys.stderr.write({STREAMER_FAILURE!r}); sys.exit(1)"
    row = bench_weights.run_case(failing, [], dict(os.environ), os.getpid(), None)
    assert set(row) == {"failed"}
    assert row["failed"].startswith("exit 1: ")
    assert "AWS_ERROR_HTTP_CHANNEL_THROUGHPUT_FAILURE" in row["failed"], "the root cause, not its consequence"

    monkeypatch.setattr(bench_weights, "CASE_TIMEOUT_S", 1)
    row = bench_weights.run_case("import time; time.sleep(30)", [], dict(os.environ), os.getpid(), None)
    assert row["failed"].startswith("no result within 1 s")

    row = bench_weights.run_case("print('not json')", [], dict(os.environ), os.getpid(), None)
    assert row["failed"].startswith("no result line")
