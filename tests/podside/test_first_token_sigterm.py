"""The first-token sidecar on SIGTERM, run as the pod runs it (the file, this
interpreter, no --once): a pod deleted before vLLM was ready still leaves its record in S3 and
one outcome line, and a SIGTERM after the upload ends the idle sidecar at once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.podside.pods import clean_environ
from tests.podside.servers import BUCKET, HealthServer
from tests.support.pod_scripts import artifact
from warmstart.podside import first_token

pytestmark = pytest.mark.servers

SCRIPT = artifact("first_token.pyz")


def _env(health: HealthServer, s3, tmp_path: Path, prefix: str) -> dict[str, str]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return {**clean_environ(), **s3.env(), "WARMSTART_HEALTH_URL": health.url,
            "WARMSTART_COMPLETIONS_URL": f"{health.base_url}/v1/completions", "WARMSTART_SERVED_MODEL": "llama",
            "WARMSTART_CACHE_BUCKET": BUCKET, "WARMSTART_RECORD_PREFIX": prefix, "WARMSTART_STATE_DIR": str(state),
            "WARMSTART_WEIGHTS_CHOICE_FILE": "", "POD_NAME": "llama-abc12", "POD_NAMESPACE": "inference",
            "NODE_NAME": "ip-10-0-1-2", "WARMSTART_HEALTH_TIMEOUT_S": "600"}


def _wait(pred, timeout: float = 30) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_sigterm_before_ready_still_uploads_the_record_and_says_so(rclone_s3, tmp_path):
    """Before: sys.exit(0) from the handler, no probe line, no record line, nothing in S3."""
    prefix = f"sigterm-{time.monotonic_ns()}/coldstart/"
    with HealthServer(ready_after=10**9) as health:
        proc = subprocess.Popen([sys.executable, str(SCRIPT)], env=_env(health, rclone_s3, tmp_path, prefix),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert _wait(lambda: health.requests >= 2), "the sidecar never polled /health"
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=40)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    assert proc.returncode == 0, err
    assert time.monotonic() - sent < first_token.TERM_DEADLINE_S + 5
    probe, record_line = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert probe["event"] == first_token.EVENT and probe["result"] == "terminated", probe
    assert "before vLLM was healthy" in probe["reason"]
    assert record_line["event"] == first_token.RECORD_EVENT and record_line["result"] == "uploaded", record_line
    record = json.loads(rclone_s3.client().get_object(Bucket=BUCKET, Key=record_line["key"])["Body"].read())
    assert record["first_token"]["result"] == "terminated" and record["pod"] == "llama-abc12"


def test_sigterm_while_idle_after_the_upload_exits_at_once(rclone_s3, tmp_path):
    prefix = f"sigterm-idle-{time.monotonic_ns()}/coldstart/"
    with HealthServer(ready_after=0) as health:
        proc = subprocess.Popen([sys.executable, str(SCRIPT)], env=_env(health, rclone_s3, tmp_path, prefix),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # The completion probe fails (no /v1/completions here); the record is uploaded, then idle.
            assert _wait(lambda: any(o["Key"].startswith(prefix) for o in rclone_s3.client().list_objects_v2(
                Bucket=BUCKET, Prefix=prefix).get("Contents", [])), 60), "no record uploaded"
            time.sleep(0.3)
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    assert proc.returncode == 0 and time.monotonic() - sent < 5, err
    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert [x["event"] for x in lines] == [first_token.EVENT, first_token.RECORD_EVENT], lines
