"""The first-token sidecar against a local fake vLLM (health + streaming completions) and a real
S3-compatible server (rclone, the session's `rclone_s3`), run as the pod runs it: the file, by
the interpreter, as a subprocess."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.podside.pods import clean_environ
from tests.podside.servers import BUCKET
from tests.support.pod_scripts import artifact
from warmstart.podside import first_token, weights_select

pytestmark = pytest.mark.servers  # the sidecar script against a fake vLLM and rclone

SCRIPT = artifact("first_token.pyz")


class FakeVllm:
    """/health: 503 for the first `ready_after` polls, then 200; /v1/completions: an SSE stream
    whose first token comes after `token_delay_s` (or an HTTP error when `fail` is set)."""

    def __init__(self, ready_after=2, token_delay_s=0.3, fail=None, trickle_s=0.0):
        self.ready_after, self.token_delay_s, self.fail = ready_after, token_delay_s, fail
        # > 0: the stream sends one byte every 0.3 s, never a newline, for this long.
        self.trickle_s = trickle_s
        self.health = 0
        self.bodies: list[dict] = []
        fake = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                fake.health += 1
                self.send_response(200 if fake.health > fake.ready_after else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                if fake.fail:
                    self.send_response(fake.fail)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                if fake.trickle_s:
                    end = time.monotonic() + fake.trickle_s
                    try:
                        while time.monotonic() < end:
                            self.wfile.write(b"d")
                            self.wfile.flush()
                            time.sleep(0.3)
                    except OSError:  # the client gave up and closed
                        pass
                    self.close_connection = True
                    return
                time.sleep(fake.token_delay_s)
                chunk = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": " Hi"}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base(self):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def run_sidecar(env: dict, timeout=60) -> tuple[list[dict], subprocess.CompletedProcess]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--once"], env={**clean_environ(), **env},
                          capture_output=True, text=True, timeout=timeout)
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.strip()]
    return lines, proc


def pod_env(vllm: FakeVllm, s3, state: Path, prefix: str, **extra) -> dict:
    return {**s3.env(), "WARMSTART_HEALTH_URL": f"{vllm.base}/health",
            "WARMSTART_COMPLETIONS_URL": f"{vllm.base}/v1/completions", "WARMSTART_SERVED_MODEL": "llama-3-1-8b",
            "WARMSTART_CACHE_BUCKET": BUCKET, "WARMSTART_RECORD_PREFIX": prefix, "WARMSTART_STATE_DIR": str(state),
            "POD_NAME": "llama-3-1-8b-abc12", "POD_NAMESPACE": "inference", "NODE_NAME": "ip-10-0-1-2",
            "WARMSTART_INSTANCE_TYPE": "g6e.2xlarge", "WARMSTART_HEALTH_TIMEOUT_S": "20",
            # The picker's choice file of this pod alone (its default is the node's /run path).
            "WARMSTART_WEIGHTS_CHOICE_FILE": str(state.parent / "weights-choice.json"), **extra}


def test_probe_times_the_first_token_and_uploads_the_record(rclone_s3, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    # What the init containers leave (the file contract): the restore's line and key file.
    (state / "compile-cache-restore.json").write_text(json.dumps(
        {"event": "warmstart.compile_cache", "phase": "restore", "result": "restored",
         "key": "llama-3-1-8b/abc.tar.gz", "seconds": 1.2}))
    (state / "key.json").write_text(json.dumps({"key": "llama-3-1-8b/abc.tar.gz", "factors": {"x": 1}}))
    (state / "huge.json").write_bytes(b"{" + b" " * (first_token.MAX_STATE_BYTES + 10) + b"}")
    with FakeVllm(ready_after=2, token_delay_s=0.3) as vllm:
        lines, proc = run_sidecar(pod_env(vllm, rclone_s3, state, "llama-3-1-8b/coldstart/"))
    assert proc.returncode == 0, proc.stderr
    probe, upload = lines
    assert probe["event"] == "warmstart.first_token" and probe["result"] == "ok", probe
    assert 0.3 <= probe["ttft_s"] < 5
    assert vllm.bodies == [{"model": "llama-3-1-8b", "prompt": "Hello", "max_tokens": 1, "stream": True,
                            "temperature": 0}]
    assert upload["result"] == "uploaded" and upload["key"] == "llama-3-1-8b/coldstart/llama-3-1-8b-abc12.json"
    record = json.loads(rclone_s3.client().get_object(Bucket=BUCKET, Key=upload["key"])["Body"].read())
    assert record["format"] == first_token.FORMAT
    assert record["phases"]["first_token"] == probe["ttft_s"]
    assert record["phases"]["init:warmstart.compile_cache.restore"] == 1.2
    assert record["flags"]["compile_restore"] == "restored"
    assert record["compile_cache_key"] == "llama-3-1-8b/abc.tar.gz"
    assert isinstance(record["flags"]["new_node"], bool)  # this host's uptime decides
    assert "huge" not in json.dumps(record["init"])  # over the size bound: ignored


def test_history_summarises_uploaded_records(rclone_s3, tmp_path):
    from warmstart.coldstart import history

    s3 = rclone_s3.client()
    prefix = "hist-model/coldstart/"
    for i, (new, restore, ready) in enumerate([(True, "miss", 300), (True, "restored", 120), (True, "restored", 140),
                                               (False, "hit", 80), (False, "hit", 90)]):
        rec = {"format": first_token.FORMAT, "flags": {"new_node": new, "compile_restore": restore},
               "phases": {"ready": ready, "first_token": 0.2}}
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}pod-{i}.json", Body=json.dumps(rec).encode())
    records = history.read_records(s3, BUCKET, prefix)
    summary = history.summarise(records)
    assert summary[("new node", "compile hit", "no node cache")]["ready"] == {"n": 2, "p50": 120, "p95": 140}
    assert summary[("new node", "compile miss", "no node cache")]["ready"]["p50"] == 300
    assert summary[("warm node", "compile hit", "no node cache")]["ready"]["p95"] == 90
    assert "p95" in history.table(summary)


def test_unhealthy_server_and_http_errors_never_fail_the_pod(rclone_s3, tmp_path):
    with FakeVllm(ready_after=10**9) as vllm:
        lines, proc = run_sidecar(pod_env(vllm, rclone_s3, tmp_path, "m/coldstart/", WARMSTART_HEALTH_TIMEOUT_S="1.5"))
    assert proc.returncode == 0 and lines[0]["result"] == "unhealthy"
    assert lines[1]["result"] == "uploaded"  # the record says so too
    with FakeVllm(ready_after=0, fail=500) as vllm:
        lines, proc = run_sidecar(pod_env(vllm, rclone_s3, tmp_path, "m/coldstart/"))
    assert proc.returncode == 0 and lines[0]["result"] == "error" and "HTTP 500" in lines[0]["reason"]


def test_a_stalled_stream_hits_the_deadline(rclone_s3, tmp_path):
    with FakeVllm(ready_after=0, token_delay_s=5) as vllm:
        start = time.monotonic()
        lines, proc = run_sidecar(pod_env(vllm, rclone_s3, tmp_path, "m/coldstart/", WARMSTART_REQUEST_TIMEOUT_S="1"))
    assert proc.returncode == 0 and lines[0]["result"] == "error"
    assert time.monotonic() - start < 5 + 10


def test_unreachable_s3_is_one_error_line(tmp_path):
    with FakeVllm(ready_after=0) as vllm:
        env = {"WARMSTART_HEALTH_URL": f"{vllm.base}/health", "WARMSTART_COMPLETIONS_URL": f"{vllm.base}/v1/completions",
               "WARMSTART_SERVED_MODEL": "m", "WARMSTART_CACHE_BUCKET": BUCKET, "WARMSTART_RECORD_PREFIX": "m/coldstart/",
               "POD_NAME": "p", "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x",
               "AWS_SECRET_ACCESS_KEY": "y", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
               "WARMSTART_STATE_DIR": str(tmp_path)}
        lines, proc = run_sidecar(env)
    assert proc.returncode == 0 and lines[0]["result"] == "ok"
    assert lines[1]["result"] == "error" and lines[1]["reason"]


def test_no_bucket_skips_the_upload(tmp_path):
    with FakeVllm(ready_after=0) as vllm:
        lines, _ = run_sidecar({"WARMSTART_HEALTH_URL": f"{vllm.base}/health", "WARMSTART_SERVED_MODEL": "m",
                                "WARMSTART_COMPLETIONS_URL": f"{vllm.base}/v1/completions",
                                "WARMSTART_STATE_DIR": str(tmp_path)})
    assert lines[1]["result"] == "skipped"


@pytest.mark.parametrize("text, expected", [("12345.67 890.1\n", 12345.67), ("garbage", None)])
def test_host_uptime(tmp_path, text, expected):
    p = tmp_path / "uptime"
    p.write_text(text)
    assert first_token.host_uptime_s(str(p)) == expected


def test_the_restore_outcome_reaches_the_first_token_record(tmp_path):
    """The compile-cache restore leaves its outcome line in the pod's state directory, where the
    first-token sidecar reads it into the record `warmstart coldstart --history` splits by."""
    from tests.podside.pods import BASE_ENV
    from warmstart.podside.compile_cache import main as cc
    from warmstart.podside import first_token as ft

    state = tmp_path / "run"
    env = BASE_ENV | {"WARMSTART_CACHE_DIR": str(tmp_path / "cache"), "WARMSTART_CACHE_BUCKET": "",
                      "WARMSTART_STATE_FILE": str(state / "key.json")}
    (tmp_path / "cache").mkdir()
    outcome = cc.restore(cc.Settings.from_env(env), emit=False)
    outcomes, _ = ft.read_state(state)
    recorded = outcomes["warmstart.compile_cache.restore"]
    assert recorded["result"] == outcome.result and recorded["phase"] == "restore"
    record = ft.build_record({}, {}, outcomes, None, None)
    assert record["flags"]["compile_restore"] == outcome.result


# --------------------------------------------------------------------------------------------
# Issue 24: the record under faults, and the node cache's verdict in it


def test_a_trickled_stream_without_a_newline_ends_at_the_deadline(rclone_s3, tmp_path):
    """Before: each byte reset the per-read timeout and readline waited for a newline, far past
    the deadline."""
    with FakeVllm(ready_after=0, trickle_s=30) as vllm:
        start = time.monotonic()
        lines, proc = run_sidecar(pod_env(vllm, rclone_s3, tmp_path, "m/coldstart/", WARMSTART_REQUEST_TIMEOUT_S="2"),
                                  timeout=90)
        took = time.monotonic() - start  # before the fake server's close, which waits for its handler
    assert proc.returncode == 0 and lines[0]["result"] == "error", lines
    assert "no token within 2 s" in lines[0]["reason"]
    assert took < 15, f"{took:.1f} s for a 2 s deadline"


def test_the_pickers_choice_reaches_the_record_and_the_history_splits_by_it(rclone_s3, tmp_path):
    from tests.support.node_cache import SELECT
    from warmstart.coldstart import history

    prefix = "nc-model/coldstart/"
    for i, staged in enumerate((True, False)):
        root, out = tmp_path / f"w{i}", tmp_path / f"out{i}"
        digest = "abc123"
        if staged:  # a complete copy on the node: the picker chooses it
            (root / digest).mkdir(parents=True)
            (root / digest / "model.safetensors").write_bytes(b"x" * 10)
            (root / digest / ".warmstart-complete.json").write_text(json.dumps({
                "format": "warmstart-weights-stage/1", "digest": digest, "source": "s3://b/m",
                "files": [{"key": "model.safetensors", "size": 10, "etag": "e"}]}))
        subprocess.run([sys.executable, str(SELECT)], env={**clean_environ(), "WARMSTART_WEIGHTS_SOURCE": "s3://b/m",
                       "WARMSTART_WEIGHTS_DIGEST": digest, "WARMSTART_WEIGHTS_ROOT": str(root),
                       "WARMSTART_WEIGHTS_OUT": str(out)}, check=True, capture_output=True, timeout=30)
        with FakeVllm(ready_after=0) as vllm:
            lines, proc = run_sidecar(pod_env(vllm, rclone_s3, tmp_path / "none", prefix, POD_NAME=f"pod-{i}",
                                              WARMSTART_WEIGHTS_CHOICE_FILE=str(out / "choice.json")))
        assert lines[1]["result"] == "uploaded", lines
    records = history.read_records(rclone_s3.client(), BUCKET, prefix)
    assert sorted(r["flags"]["node_cache"] for r in records) == ["hit", "miss"]
    groups = {k[2] for k in history.summarise(records)}
    assert groups == {"node cache hit", "node cache miss"}


def test_the_record_fits_what_the_history_reads(rclone_s3, tmp_path):
    """32 state files of 64 KiB each made a 2 MB record the reader skipped."""
    from warmstart.coldstart import history

    assert first_token.MAX_RECORD_BYTES == history.MAX_RECORD_BYTES
    state = tmp_path / "state"
    state.mkdir()
    for i in range(first_token.MAX_STATE_FILES + 4):
        doc = {"event": f"warmstart.init{i}", "result": "ok", "seconds": 1.0,
               "reason": "r" * (first_token.MAX_STATE_BYTES - 200)}
        (state / f"s{i:02d}.json").write_text(json.dumps(doc))
    # A nested file among them: skipped, never the record's loss.
    (state / "nested.json").write_bytes(b"[" * 50_000 + b"]" * 50_000)
    prefix = "big-model/coldstart/"
    with FakeVllm(ready_after=0) as vllm:
        lines, proc = run_sidecar(pod_env(vllm, rclone_s3, state, prefix))
    assert lines[1]["result"] == "uploaded" and lines[1]["bytes"] <= history.MAX_RECORD_BYTES, lines
    (record,) = history.read_records(rclone_s3.client(), BUCKET, prefix)
    assert record["phases"]["first_token"] == lines[0]["ttft_s"] and record["trimmed"] is True
    assert len(record["init"]) == first_token.MAX_STATE_FILES - 1  # the nested file took a slot, skipped


def test_every_staged_serving_pod_shows_the_sidecar_the_pickers_choice():
    from tests.support.stacks import STACK_NAMES, render_stack
    from warmstart.manifests import node_cache

    checked = 0
    for stack in STACK_NAMES:
        for dep in render_stack(stack).kind("Deployment"):
            spec = dep["spec"]["template"]["spec"]
            inits = {c["name"]: c for c in spec.get("initContainers", [])}
            if "first-token" not in inits:
                continue
            probe = inits["first-token"]
            env = {e["name"]: e.get("value") for e in probe["env"]}
            picker = inits.get(node_cache.SELECT_CONTAINER)
            if picker is None:
                assert not env.get("WARMSTART_WEIGHTS_CHOICE_FILE"), dep["metadata"]["name"]
                continue
            out = {e["name"]: e.get("value") for e in picker["env"]}["WARMSTART_WEIGHTS_OUT"]
            (written,) = [m["name"] for m in picker["volumeMounts"] if m["mountPath"] == out]
            (seen,) = [m for m in probe["volumeMounts"] if m["name"] == written]
            assert seen["readOnly"] is True
            assert env["WARMSTART_WEIGHTS_CHOICE_FILE"] == f"{seen['mountPath']}/{weights_select.CHOICE_FILE}"
            checked += 1
    assert checked, "no stack stages a model"
