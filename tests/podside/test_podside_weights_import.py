"""The weights-import script against real S3 servers and a stand-in of the Hugging Face Hub.

The script runs as a file with this interpreter, as the Job runs it (`python3
/opt/warmstart/weights_import.py`), with boto3 and the real huggingface_hub client. S3 to S3
copies run against SeaweedFS: rclone's `serve s3` 1.75 cannot do UploadPartCopy (its answer
has no ETag), so the server-side multipart copy needs a server that implements it. The
session's SeaweedFS has room for few buckets (`-volume.max=8`, 7 volumes per bucket), so
source and destination are two prefixes of its one bucket there. The Hub path uploads to rclone. Parts are 5 MiB (S3's minimum), so a 7 MiB shard is a real multipart
transfer.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import pytest

from tests.podside.hub import wait_for
from tests.podside.servers import BUCKET
from tests.support.weights_import import (COMMIT, DST, MIB, MODULE, OTHER_COMMIT, PART, SRC, WANTED, Job, assert_copied, body,
                                          clean_environ, ensure_bucket, model_files, objects, parse, put_tree,
                                          weights_gib)
from warmstart.decisions import weights_import as decisions
from warmstart.podside.weights_import import settings as weights_import_settings
from warmstart.podside.weights_import import main as wi

pytestmark = pytest.mark.servers  # the import script against S3 servers and a Hub stand-in


# --------------------------------------------------------------------------------------------
# S3 to S3 (server-side copies)


def test_s3_import_copies_only_what_vllm_reads_server_side_and_records_a_manifest(s3_job, prefix):
    job, files = s3_job
    run = job.run()
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert run.phases == [("check", "absent"), ("plan", "planned"), ("copy", "copied"), ("verify", "verified"),
                          ("manifest", "written"), ("done", "imported")]
    copy = run.phase("copy")
    assert copy["files"] == len(WANTED) and copy["kind"] == "s3-server-side" and copy["attempts"] == 1
    manifest = assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files)
    assert (manifest["source"], manifest["revision"]) == (f"s3://{BUCKET}/{SRC}/{prefix}", None)
    # The 7 MiB shard went as a multipart copy (5 MiB parts): S3's ETag of a 2-part object.
    etags = {f["name"]: f["etag"] for f in manifest["files"]}
    assert etags["model-00001-of-00003.safetensors"].endswith("-2")


def test_a_rerun_of_a_complete_import_copies_nothing_and_never_reads_the_source(s3_job, prefix):
    job, files = s3_job
    assert job.run().returncode == 0
    before = objects(job.server, BUCKET, f"{DST}/{prefix}")
    # Take the source away: a rerun that touched it would fail.
    client = job.server.client()
    for name in list(objects(job.server, BUCKET, f"{SRC}/{prefix}")):
        client.delete_object(Bucket=BUCKET, Key=f"{SRC}/{prefix}/{name}")
    run = job.run()
    assert run.returncode == 0, run.stdout
    assert run.phases == [("check", "complete"), ("done", "unchanged")]
    assert run.phase("done")["files"] == 0
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == before
    # A weightsGiB changed since is still checked against what is there, still without copying.
    wrong = job.run(WARMSTART_WEIGHTS_GIB="1.5")
    assert wrong.returncode == weights_import_settings.EXIT_VERIFY and wrong.phases == [("check", "error")]
    assert "fix: set weightsGiB:" in wrong.reason
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == before


def test_an_interrupted_copy_is_completed_by_a_rerun_copying_only_what_is_missing(s3_job, prefix):
    job, files = s3_job
    # What a killed Job leaves: some files whole, one cut short, no manifest.
    put_tree(job.server, BUCKET, f"{DST}/{prefix}", {"config.json": files["config.json"],
                                            "model-00001-of-00003.safetensors": files["model-00001-of-00003.safetensors"],
                                            "model-00002-of-00003.safetensors": files["model-00002-of-00003.safetensors"][:MIB]})
    kept = objects(job.server, BUCKET, f"{DST}/{prefix}")["model-00001-of-00003.safetensors"]
    run = job.run()
    assert run.returncode == 0, run.stdout
    assert run.phase("check")["result"] == "absent"
    plan = run.phase("plan")
    assert plan["to_copy"] == len(WANTED) - 2
    assert plan["to_copy_bytes"] == sum(len(files[n]) for n in WANTED) - len(files["config.json"]) - \
        len(files["model-00001-of-00003.safetensors"])
    assert run.phase("copy")["files"] == len(WANTED) - 2
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files)
    after = objects(job.server, BUCKET, f"{DST}/{prefix}")["model-00001-of-00003.safetensors"]
    assert (after["etag"], after["modified"]) == (kept["etag"], kept["modified"]), "a whole file was copied again"


def test_a_killed_s3_import_leaves_no_manifest_and_a_rerun_completes_it(s3_job, prefix):
    job, files = s3_job
    proc = job.spawn()
    deadline = time.monotonic() + 30
    # Kill it as soon as the copy has started writing (or, on a fast machine, whenever it got to).
    while time.monotonic() < deadline and proc.poll() is None:
        if objects(job.server, BUCKET, f"{DST}/{prefix}"):
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    left = objects(job.server, BUCKET, f"{DST}/{prefix}")
    if proc.returncode == -signal.SIGKILL:
        assert wi.MANIFEST_NAME not in left or set(left) == WANTED | {wi.MANIFEST_NAME}
    run = job.run()
    assert run.returncode == 0, run.stdout
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files)


def test_an_interrupted_import_of_another_revision_never_passes_for_either(s3_job, prefix, monkeypatch):
    """Revision B over a complete A, killed after one shard: every file of B has the size of A's
    (a fine-tune of the same architecture). Neither a rerun of A nor of B may trust sizes there."""
    job, a_files = s3_job
    assert job.run().returncode == 0
    b_files = model_files(seed=5)
    assert {n: len(v) for n, v in b_files.items()} == {n: len(v) for n, v in a_files.items()}
    put_tree(job.server, BUCKET, f"{SRC}/{prefix}-b", b_files)
    b_env = job.full_env(WARMSTART_SOURCE_S3=f"s3://{BUCKET}/{SRC}/{prefix}-b")
    real_copy = wi.S3Source.copy

    def copy_one_shard_then_die(self, files, manager):
        real_copy(self, [f for f in files if f.name.endswith(".safetensors")][:1], manager)
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(wi.S3Source, "copy", copy_one_shard_then_die)
    with pytest.raises(KeyboardInterrupt):
        wi.run(wi.Settings.from_env(b_env), client=job.server.client())
    monkeypatch.undo()
    marker = json.loads(body(job.server, BUCKET, f"{DST}/{prefix}/{wi.MANIFEST_NAME}"))
    assert (marker["status"], marker["source"]) == ("incomplete", f"s3://{BUCKET}/{SRC}/{prefix}-b")
    # Back to A: the manifest no longer vouches for A, so no size is trusted: a file is kept
    # only where S3's ETag proves it A's (equal to the source's), every other is copied again.
    there, source_a = objects(job.server, BUCKET, f"{DST}/{prefix}"), objects(job.server, BUCKET, f"{SRC}/{prefix}")
    again = job.run()
    assert again.returncode == 0 and again.phase("check")["result"] == "incomplete"
    assert again.phase("copy")["files"] == sum(there[n]["etag"] != source_a[n]["etag"] for n in WANTED) >= 1
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", a_files)
    # And B, interrupted the same way and resumed: only the shard it had copied is kept.
    monkeypatch.setattr(wi.S3Source, "copy", copy_one_shard_then_die)
    with pytest.raises(KeyboardInterrupt):
        wi.run(wi.Settings.from_env(b_env), client=job.server.client())
    monkeypatch.undo()
    there, source_b = objects(job.server, BUCKET, f"{DST}/{prefix}"), objects(job.server, BUCKET, f"{SRC}/{prefix}-b")
    kept = "model-00001-of-00003.safetensors"  # the shard the interrupted run of B copied
    resumed = Job(job.server, {**job.env, "WARMSTART_SOURCE_S3": f"s3://{BUCKET}/{SRC}/{prefix}-b"}).run()
    assert resumed.returncode == 0, resumed.stdout
    # A's files are copied unless S3's ETag proves them B's too (equal bytes); B's own shard is kept.
    assert resumed.phase("copy")["files"] == sum(there[n]["etag"] != source_b[n]["etag"] for n in WANTED - {kept})
    assert objects(job.server, BUCKET, f"{DST}/{prefix}")[kept]["modified"] == there[kept]["modified"]
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", b_files)


def test_a_source_without_config_json_fails_before_anything_is_written(s3_job, prefix):
    job, files = s3_job
    job.server.client().delete_object(Bucket=BUCKET, Key=f"{SRC}/{prefix}/config.json")
    run = job.run()
    assert run.returncode == weights_import_settings.EXIT_VERIFY
    assert run.phases[-1] == ("plan", "error") and "has no config.json" in run.reason
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == {}


def test_a_shard_named_by_the_index_but_missing_fails_naming_it(s3_job, prefix):
    job, files = s3_job
    job.server.client().delete_object(Bucket=BUCKET, Key=f"{SRC}/{prefix}/model-00002-of-00003.safetensors")
    run = job.run()
    assert run.returncode == weights_import_settings.EXIT_VERIFY
    assert "model-00002-of-00003.safetensors" in run.reason and "names 1 shard(s) that are not there" in run.reason
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == {}


def test_a_total_that_disagrees_with_weights_gib_fails_with_the_fix(s3_job, prefix):
    job, files = s3_job
    measured = weights_gib(files)
    run = job.run(WARMSTART_WEIGHTS_GIB=repr(measured * 1.5))
    assert run.returncode == weights_import_settings.EXIT_VERIFY
    reason = run.reason
    assert "llama:" in reason and f"total {measured:.2f} GiB" in reason
    assert f"weightsGiB is {measured * 1.5:g}" in reason and f"fix: set weightsGiB: {measured:.2f}" in reason
    assert "5% tolerance" in reason
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == {}
    # Within the tolerance (a rounded figure) it imports.
    assert job.run(WARMSTART_WEIGHTS_GIB=repr(measured * 1.04)).returncode == 0


def test_stray_shards_vllm_would_load_fail_the_import(seaweed_s3, prefix):
    """Without an index vLLM loads every *.safetensors under the prefix, so a leftover of
    another model there is an error (the import role may not delete it)."""
    files = {"config.json": b"{}", "model.safetensors": random.Random(3).randbytes(MIB)}
    put_tree(seaweed_s3, BUCKET, f"{SRC}/{prefix}", files)
    put_tree(seaweed_s3, BUCKET, f"{DST}/{prefix}", {"old-model.safetensors": b"x" * 100})
    job = Job(seaweed_s3, {"WARMSTART_MODEL": "m", "WARMSTART_DEST_BUCKET": BUCKET,
                           "WARMSTART_DEST_PREFIX": f"{DST}/{prefix}", "WARMSTART_WEIGHTS_GIB": repr(MIB / (1 << 30)),
                           "WARMSTART_SOURCE_S3": f"s3://{BUCKET}/{SRC}/{prefix}"})
    run = job.run()
    assert run.returncode == weights_import_settings.EXIT_VERIFY and "old-model.safetensors" in run.reason and "delete them" in run.reason


def test_a_source_that_cannot_be_read_is_an_access_error(seaweed_s3, prefix):
    job = Job(seaweed_s3, {"WARMSTART_MODEL": "m", "WARMSTART_DEST_BUCKET": BUCKET, "WARMSTART_DEST_PREFIX": prefix,
                           "WARMSTART_WEIGHTS_GIB": "1", "WARMSTART_SOURCE_S3": "s3://no-such-bucket-here/x"})
    run = job.run()
    assert run.returncode == weights_import_settings.EXIT_ACCESS and "no-such-bucket-here" in run.reason


def test_a_bad_environment_is_a_config_error(tmp_path):
    proc = subprocess.run([sys.executable, str(MODULE)], env={**clean_environ(), "WARMSTART_MODEL": "m",
                                                             "WARMSTART_TERMINATION_LOG": str(tmp_path / "term")},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == weights_import_settings.EXIT_CONFIG
    (line,) = parse(proc.stdout)
    assert "WARMSTART_DEST_BUCKET is not set" in line["reason"] and line["exit_code"] == 2
    assert "WARMSTART_DEST_BUCKET is not set" in (tmp_path / "term").read_text()


# --------------------------------------------------------------------------------------------
# The Hugging Face Hub (a stand-in on 127.0.0.1, the real client) to S3


def test_hub_import_downloads_the_pinned_commit_and_uploads_only_what_vllm_reads(hub_job, hub, prefix):
    job, files = hub_job
    run = job.run()
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert run.phase("copy")["kind"] == "hub-download-upload"
    manifest = assert_copied(job.server, "models", prefix, files)
    assert (manifest["source"], manifest["revision"]) == ("hf://org/model", COMMIT)
    # Only the pinned commit was asked for, and nothing outside what vLLM reads was downloaded.
    resolved = [p for p in hub.downloads()]
    assert resolved and all(f"/org/model/resolve/{COMMIT}/" in p for p in resolved)
    assert {p.rsplit("/", 1)[-1] for p in resolved} == WANTED
    # rclone keeps an md5 ETag for any upload; its log shows the 7 MiB shard went in parts.
    log = job.server.log_path.read_text(errors="replace")
    assert f"initiate multipart upload models {prefix}/model-00001-of-00003.safetensors" in log
    assert f"initiate multipart upload models {prefix}/config.json" not in log


def test_hub_rerun_of_a_complete_import_sends_no_request_to_the_hub(hub_job, hub, prefix):
    job, files = hub_job
    assert job.run().returncode == 0
    served = len(hub.requests)
    run = job.run()
    assert run.returncode == 0 and run.phases == [("check", "complete"), ("done", "unchanged")]
    assert len(hub.requests) == served


def test_hub_partial_destination_downloads_only_the_missing_files(hub_job, hub, prefix):
    job, files = hub_job
    whole = {n: files[n] for n in ("config.json", "model-00001-of-00003.safetensors")}
    put_tree(job.server, "models", prefix, whole)
    run = job.run()
    assert run.returncode == 0, run.stdout
    downloaded = {p.rsplit("/", 1)[-1] for p in hub.downloads()}
    # The index is read to plan; every other file that was whole is not fetched again.
    assert "model-00001-of-00003.safetensors" not in downloaded and "config.json" not in downloaded
    assert run.phase("copy")["files"] == len(WANTED) - 2
    assert_copied(job.server, "models", prefix, files)


def test_a_killed_hub_import_leaves_no_manifest_and_a_rerun_completes_it(hub_job, hub, prefix, tmp_path):
    job, files = hub_job
    hub.stall = "model-00002-of-00003.safetensors"
    proc = job.spawn()
    try:
        assert wait_for(hub.stalled, 60), "the download never reached the stalled shard"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    # What it left is a resume record ("incomplete"), never a complete manifest.
    left = objects(job.server, "models", prefix)
    assert wi.MANIFEST_NAME in left
    assert json.loads(body(job.server, "models", f"{prefix}/{wi.MANIFEST_NAME}"))["status"] == "incomplete"
    hub.stall = None
    hub.release.set()
    # A retried pod gets a new, empty scratch volume.
    run = job.run(WARMSTART_SCRATCH_DIR=str(tmp_path / "scratch-2"))
    assert run.returncode == 0, run.stdout
    assert_copied(job.server, "models", prefix, files)


def test_gated_repository_needs_a_token_whose_account_accepted_it(rclone_s3, hub, prefix, tmp_path):
    ensure_bucket(rclone_s3, "models")
    files = model_files(seed=4)
    hub.add("meta-llama/Gated", COMMIT, files, gated=True, readers=("hf_reader_token",))
    job = Job(rclone_s3, {"WARMSTART_MODEL": "llama", "WARMSTART_DEST_BUCKET": "models",
                          "WARMSTART_DEST_PREFIX": prefix, "WARMSTART_WEIGHTS_GIB": repr(weights_gib(files)),
                          "WARMSTART_HF_REPO": "meta-llama/Gated", "WARMSTART_HF_REVISION": COMMIT,
                          "WARMSTART_PART_BYTES": str(PART), "WARMSTART_RETRIES": "2", "HF_ENDPOINT": hub.url,
                          "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"})
    no_token = job.run(WARMSTART_SCRATCH_DIR=str(tmp_path / "s1"))
    assert no_token.returncode == weights_import_settings.EXIT_ACCESS
    assert "gated" in no_token.reason and "warmstart:huggingFaceToken" in no_token.reason
    refused = job.run(WARMSTART_SCRATCH_DIR=str(tmp_path / "s2"), HF_TOKEN="hf_other_account")
    assert refused.returncode == weights_import_settings.EXIT_ACCESS and "accept its license" in refused.reason
    assert "hf_other_account" not in refused.stdout + refused.stderr
    ok = job.run(WARMSTART_SCRATCH_DIR=str(tmp_path / "s3"), HF_TOKEN="hf_reader_token")
    assert ok.returncode == 0, ok.stdout
    assert "hf_reader_token" not in ok.stdout + ok.stderr
    assert {t for m, p, t in hub.requests if m == "GET" and "/resolve/" in p} >= {"hf_reader_token"}
    assert_copied(rclone_s3, "models", prefix, files)


def test_hub_unknown_revision_and_wrong_size_fail_before_any_weight_is_downloaded(hub_job, hub, prefix):
    job, files = hub_job
    run = job.run(WARMSTART_HF_REVISION=OTHER_COMMIT)
    assert run.returncode == weights_import_settings.EXIT_ACCESS and "has no revision" in run.reason
    run = job.run(WARMSTART_WEIGHTS_GIB="40")
    assert run.returncode == weights_import_settings.EXIT_VERIFY and "fix: set weightsGiB:" in run.reason
    assert not [p for p in hub.downloads() if p.endswith(".safetensors")]
    assert objects(job.server, "models", prefix) == {}


# --------------------------------------------------------------------------------------------
# Pure parts


def test_the_script_and_the_planner_agree_on_the_tolerance():
    assert wi.WEIGHTS_TOLERANCE == decisions.WEIGHTS_TOLERANCE


@pytest.mark.parametrize("name, wanted", [
    ("model-00001-of-00004.safetensors", True), ("config.json", True), ("tokenizer.model", True),
    ("vocab.txt", True), ("merges.txt", True), ("tiktoken.tiktoken", True), ("modeling_x.py", True),
    ("chat_template.jinja", True), ("README.md", False), ("original/params.json", False),
    ("consolidated.00.pth", False), ("pytorch_model.bin", False), (wi.MANIFEST_NAME, False),
])
def test_only_top_level_files_vllm_reads_are_wanted(name, wanted):
    assert wi.wanted(name) is wanted


def test_with_an_index_only_its_shards_are_weights():
    names = ["a.safetensors", "b.safetensors", "consolidated.safetensors"]
    index = {"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}}
    assert wi.weights_of(names, index) == (["a.safetensors", "b.safetensors"], ["consolidated.safetensors"])
    assert wi.weights_of(names, None) == (sorted(names), [])


@pytest.mark.parametrize("env, problem", [
    ({}, "WARMSTART_DEST_BUCKET is not set"),
    ({"WARMSTART_HF_REPO": "a/b", "WARMSTART_HF_REVISION": "main"}, "must be a 40-hex commit"),
    ({"WARMSTART_HF_REPO": "a/b", "WARMSTART_HF_REVISION": COMMIT, "WARMSTART_SOURCE_S3": "s3://bb/x"},
     "exactly one of"),
    ({"WARMSTART_SOURCE_S3": "s3://models/org"}, "overlaps the destination"),
    ({"WARMSTART_SOURCE_S3": "s3://bb/x", "WARMSTART_PART_BYTES": "1024"}, "must be >= 5242880"),
    ({"WARMSTART_SOURCE_S3": "s3://bb/x", "WARMSTART_MAX_MODEL_LEN": "0"}, "WARMSTART_MAX_MODEL_LEN='0' must be >= 1"),
    ({"WARMSTART_SOURCE_S3": "s3://bb/x", "WARMSTART_HF_OVERRIDES": "[1]"},
     r"models\[\]\.extraArgs: the value of --hf-overrides is not a JSON object"),
])
def test_settings_name_what_is_wrong(env, problem):
    base = {"WARMSTART_MODEL": "m", "WARMSTART_DEST_BUCKET": "models", "WARMSTART_DEST_PREFIX": "org/model",
            "WARMSTART_WEIGHTS_GIB": "15"}
    if not env:
        base.pop("WARMSTART_DEST_BUCKET")
        env = {"WARMSTART_SOURCE_S3": "s3://bb/x"}
    with pytest.raises(wi.ConfigError, match=problem):
        wi.Settings.from_env(base | env)


# --------------------------------------------------------------------------------------------
# Issue 15: a malformed or hostile object is a clear failure or is ignored, never a crash or an OOM


@pytest.mark.parametrize("manifest", [
    {"format": wi.FORMAT, "status": "complete", "source": None, "revision": None, "files": [1, "x", None]},
    {"format": wi.FORMAT, "status": "incomplete", "source": None, "revision": None, "replacing_etags": ["x"]},
    {"format": wi.FORMAT, "status": "complete", "source": None, "revision": None,
     "files": [{"name": "config.json", "bytes": 1}], "index_shards": ["not-there.safetensors"]},
], ids=["files-not-objects", "etags-not-a-map", "index-names-absent-shards"])
def test_a_malformed_manifest_at_the_destination_is_not_trusted_and_not_a_crash(s3_job, prefix, manifest):
    job, files = s3_job
    manifest = {**manifest, "source": job.env["WARMSTART_SOURCE_S3"]}
    job.server.client().put_object(Bucket=BUCKET, Key=f"{DST}/{prefix}/{wi.MANIFEST_NAME}",
                                   Body=json.dumps(manifest).encode())
    run = job.run()
    assert run.returncode == 0, (run.stdout, run.stderr)  # not EXIT_BUG: it imports over it
    assert run.phases[0][1] == "incomplete" and run.phases[-1] == ("done", "imported")
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files)


@pytest.mark.parametrize("index", [b"\xff\xfe not utf-8 \x80", b"{" + b" " * (wi.MAX_JSON_BYTES + 10) + b"}"],
                         ids=["non-utf8", "over-the-json-limit"])
def test_an_unreadable_or_oversized_index_fails_verification_before_anything_is_copied(s3_job, prefix, index):
    job, _ = s3_job
    job.server.client().put_object(Bucket=BUCKET, Key=f"{SRC}/{prefix}/{wi.INDEX_NAME}", Body=index)
    run = job.run()
    assert run.returncode == weights_import_settings.EXIT_VERIFY and "not a safetensors index" in run.reason, (run.stdout, run.stderr)
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == {}


def test_a_missing_destination_bucket_is_an_access_error_not_an_empty_destination(s3_job):
    job, _ = s3_job
    run = job.run(WARMSTART_DEST_BUCKET="warmstart-no-such-bucket")
    assert run.returncode == weights_import_settings.EXIT_ACCESS and "NoSuchBucket" in run.reason, (run.stdout, run.stderr)
    assert run.phases == [("check", "error")]
