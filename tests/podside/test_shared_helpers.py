"""The helpers every pod-side script takes from podside_common instead of a copy of its own: the
S3 client builder (the deadlines each caller asks for, botocore loaded only when a client is
built), the outcome-line emitter (one line, flushed, the caller's key order) and SIGTERM's exit
deadline (its line and exit code arrive while the main thread is stuck)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.pod_scripts import artifact
from warmstart.podside.common import shared as common

ROOT = Path(__file__).resolve().parents[2]


# ---- make_s3_client ----------------------------------------------------------------------


@pytest.mark.parametrize("with_boto3", [False, True])
def test_the_client_has_the_deadlines_and_retries_it_was_asked_for(with_boto3: bool) -> None:
    client = common.make_s3_client(region="eu-west-1", connect_timeout_s=7, read_timeout_s=90, max_attempts=4,
                                   max_pool_connections=21, endpoint_url="http://127.0.0.1:9",
                                   credentials={"aws_access_key_id": "a", "aws_secret_access_key": "b"},
                                   with_boto3=with_boto3)
    config = client.meta.config
    assert (config.connect_timeout, config.read_timeout, config.max_pool_connections) == (7, 90, 21)
    # botocore keeps the attempts as total_max_attempts, the first try included
    # (https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html).
    assert config.retries == {"mode": "standard", "total_max_attempts": 5}
    assert client.meta.region_name == "eu-west-1" and client.meta.endpoint_url == "http://127.0.0.1:9"
    assert client._request_signer._credentials.access_key == "a"


def test_without_max_attempts_the_retries_are_botocores_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    config = common.make_s3_client(region="us-east-1", max_attempts=None).meta.config
    assert "total_max_attempts" not in (config.retries or {})  # the Config carried no retries


def test_the_endpoint_comes_from_the_process_environment_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    assert common.make_s3_client(region="us-east-1").meta.endpoint_url == "http://127.0.0.1:8"
    assert common.make_s3_client(region="us-east-1", endpoint_url="http://127.0.0.1:7").meta.endpoint_url \
        == "http://127.0.0.1:7"


@pytest.mark.servers  # starts an interpreter
def test_importing_the_shared_module_loads_neither_botocore_nor_boto3() -> None:
    """The compile-cache restore imports podside_common on the pod's start-up path."""
    probe = ("import sys; import warmstart.podside.common.shared; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('botocore', 'boto3')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)


# ---- json_line, emit_line ----------------------------------------------------------------


def test_an_outcome_line_is_one_compact_flushed_line_in_the_callers_key_order(capsys) -> None:
    record = {"event": "e", "b": [1, {"z": None}], "a": "x\ny"}
    common.emit_line(record)
    common.emit_line(record, sort_keys=True)
    common.emit_line("already a line")
    out = capsys.readouterr().out
    assert out.splitlines() == ['{"event":"e","b":[1,{"z":null}],"a":"x\\ny"}',
                                '{"a":"x\\ny","b":[1,{"z":null}],"event":"e"}', "already a line"]
    assert out.endswith("\n") and json.loads(out.splitlines()[0]) == record


# ---- exit_at_deadline ---------------------------------------------------------------------

_STUCK = """
import sys, threading, time
sys.path.insert(0, {folder!r})
import podside.common.shared as c
after = {after}
c.exit_at_deadline(0.5, {final}, after)
with threading.Lock():  # the main thread stuck, as in a library's locking, never returning
    time.sleep(60)
"""


def _stuck(tmp_path: Path, final: str, after: str = "None") -> tuple[subprocess.CompletedProcess[str], float]:
    folder = artifact("first_token.pyz")  # one that carries the shared module, as a pod has it
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _STUCK.format(folder=str(folder), final=final, after=after)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=30)
    return proc, time.monotonic() - start


@pytest.mark.servers  # starts an interpreter
def test_the_deadline_writes_the_final_line_and_exits_with_its_code(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    proc, took = _stuck(tmp_path, "lambda: ('{\"result\":\"error\"}', 143)",
                        f"lambda code: open({str(log)!r}, 'w').write(f'after {{code}}')")
    assert proc.returncode == 143 and proc.stdout == '{"result":"error"}\n', proc
    assert log.read_text() == "after 143" and took < 10


@pytest.mark.servers  # starts an interpreter
def test_a_failing_final_line_still_ends_the_process(tmp_path: Path) -> None:
    proc, took = _stuck(tmp_path, "lambda: 1 / 0")
    assert proc.returncode == 1 and proc.stdout == "" and took < 10, proc
