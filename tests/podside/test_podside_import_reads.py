"""The weights import's small reads under the framings and stalls a proxy or gateway gives:
the script runs as the Job runs it, against SeaweedFS behind a fault proxy
that forwards every request unchanged and re-frames or trickles only the response body."""

from __future__ import annotations

import time

import pytest

from tests.podside.faults import FaultProxy, Rule, get_of
from tests.support.weights_import import DST, WANTED, assert_copied, through
from tests.podside.servers import BUCKET
from warmstart.podside.weights_import import main as wi

pytestmark = pytest.mark.servers



def test_chunked_json_bodies_are_read_and_a_complete_import_stays_complete(s3_job, prefix, proxy):
    """Every JSON file (the index at the source, the manifest and index at the destination)
    comes back `Transfer-Encoding: chunked`, no Content-Length. Before: "cut short" on every
    read, exit 5 for the import and for every rerun of a complete one."""
    job, files = s3_job
    proxy.add(Rule(lambda m, p, h: m == "GET" and p.split("?")[0].endswith(".json"), "chunked"))
    run = through(job, proxy).run(timeout=120)
    assert run.returncode == wi.EXIT_OK, (run.stdout, run.stderr)
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files)
    again = through(job, proxy).run(timeout=120)
    assert again.returncode == wi.EXIT_OK and again.phase("done")["result"] == "unchanged", again.stdout
    assert any(action == "chunked" and path.split("?")[0].endswith(wi.MANIFEST_NAME)
               for _, path, action in proxy.seen)


def test_a_trickled_index_ends_at_the_small_read_deadline(s3_job, prefix, proxy):
    """The source's index sent a byte every half second (never idle for botocore's read
    timeout): the read ends at WARMSTART_SMALL_READ_S, exit 5, nothing written."""
    job, files = s3_job
    proxy.add(Rule(get_of(wi.INDEX_NAME), "trickle", delay_s=0.5, trickle_bytes=1))
    start = time.monotonic()
    run = through(job, proxy).run(timeout=90, WARMSTART_SMALL_READ_S="4")
    took = time.monotonic() - start
    assert run.returncode == wi.EXIT_TRANSFER, (run.stdout, run.stderr)
    assert "not read within 4 s" in run.reason and wi.INDEX_NAME in run.reason, run.reason
    assert took < 40, took  # before: one read of the whole index, minutes
    from tests.support.weights_import import objects
    assert objects(job.server, BUCKET, f"{DST}/{prefix}") == {}


# --------------------------------------------------------------------------------------------
# Item 4: same-size files of unknown origin at the destination


def test_same_size_files_without_a_manifest_are_copied_not_trusted(s3_job, prefix):
    """Another revision's files (same names, same sizes, other bytes) at the destination and no
    manifest: before, they were kept and a complete manifest vouched for them."""
    from tests.support.weights_import import model_files, put_tree

    job, files = s3_job
    other = model_files(seed=9)
    assert {n: len(b) for n, b in other.items()} == {n: len(b) for n, b in files.items()}
    put_tree(job.server, BUCKET, f"{DST}/{prefix}", {n: b for n, b in other.items() if wi.wanted(n)})
    run = job.run(timeout=120)
    assert run.returncode == wi.EXIT_OK, (run.stdout, run.stderr)
    # Every file whose bytes differ is copied; the ones that are equal (S3's ETags agree) are not.
    assert run.phase("plan")["to_copy"] == sum(other[n] != files[n] for n in WANTED) >= 4, run.phase("plan")
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files)


def test_files_of_unknown_origin_with_the_sources_etags_are_proven_and_kept(s3_job, prefix):
    """The same bytes already there (an earlier copy by hand): the ETags S3 computed agree with
    the source's, so they are not copied again."""
    from tests.support.weights_import import put_tree

    job, files = s3_job
    put_tree(job.server, BUCKET, f"{DST}/{prefix}", {n: b for n, b in files.items() if wi.wanted(n)})
    run = job.run(timeout=120)
    assert run.returncode == wi.EXIT_OK, (run.stdout, run.stderr)
    assert run.phase("plan")["to_copy"] == 0, run.phase("plan")
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files)


def test_hub_same_size_files_of_another_revision_are_hashed_and_copied(hub_job, hub, prefix):
    """From the Hub: a same-size file at the destination is proven by hashing it against the
    Hub's sha256 (kept, not downloaded) or else downloaded and uploaded; the manifest records
    every file's sha256."""
    from tests.support.weights_import import model_files, put_tree, sha, body

    job, files = hub_job
    other = model_files(seed=9)
    planted = {"model-00001-of-00003.safetensors": other["model-00001-of-00003.safetensors"],  # another revision's
               "model-00002-of-00003.safetensors": files["model-00002-of-00003.safetensors"]}  # the same bytes
    put_tree(job.server, "models", prefix, planted)
    run = job.run()
    assert run.returncode == wi.EXIT_OK, (run.stdout, run.stderr)
    downloaded = {p.rsplit("/", 1)[-1] for p in hub.downloads()}
    assert "model-00001-of-00003.safetensors" in downloaded and "model-00002-of-00003.safetensors" not in downloaded
    manifest = assert_copied(job.server, "models", prefix, files)
    recorded = {f["name"]: f.get("sha256") for f in manifest["files"]}
    for name in planted:
        assert recorded[name] == sha(files[name]), name
    assert sha(body(job.server, "models", f"{prefix}/model-00001-of-00003.safetensors")) == \
        sha(files["model-00001-of-00003.safetensors"])


# --------------------------------------------------------------------------------------------
# Item 7: SIGTERM around the manifest's write


def _manifest_put(method: str, path: str, headers: dict[str, str]) -> bool:
    return method == "PUT" and path.split("?")[0].endswith(wi.MANIFEST_NAME)


def _sigterm_when(proc, proxy: FaultProxy, action: str) -> tuple[int, list[dict]]:
    import json
    import signal

    try:
        assert proxy.wait_for(lambda s: s[2] == action, 90), "the manifest's write never reached the proxy"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return proc.returncode, [json.loads(x) for x in out.splitlines() if x.strip()]


def test_sigterm_just_after_the_manifest_reached_s3_says_the_import_is_complete(s3_job, prefix, proxy):
    """S3 has stored the complete manifest, its answer is still on the way. Before: exit 143
    "nothing was recorded as complete"; now the final line says what S3 holds."""
    job, files = s3_job
    proxy.add(Rule(_manifest_put, "hold", delay_s=60, times=1))
    code, lines = _sigterm_when(through(job, proxy).spawn(), proxy, "held")
    assert code == wi.EXIT_OK, lines
    assert lines[-1]["phase"] == "done" and lines[-1]["result"] == "imported", lines
    assert "complete manifest reached S3" in lines[-1]["reason"], lines
    assert_copied(job.server, BUCKET, f"{DST}/{prefix}", files)
    assert through(job, proxy).run(timeout=90).phase("done")["result"] == "unchanged"


def test_sigterm_before_the_manifest_reached_s3_says_nothing_is_complete(s3_job, prefix, proxy):
    job, files = s3_job
    proxy.add(Rule(_manifest_put, "delay", delay_s=60, times=1))
    code, lines = _sigterm_when(through(job, proxy).spawn(), proxy, "delay")
    assert code == wi.EXIT_TERMINATED, lines
    assert lines[-1]["phase"] == "done" and "holds no complete manifest" in lines[-1]["reason"], lines
    from tests.support.weights_import import objects
    assert wi.MANIFEST_NAME not in objects(job.server, BUCKET, f"{DST}/{prefix}")
