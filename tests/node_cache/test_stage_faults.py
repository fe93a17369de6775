"""The stager and the picker under faults, races and planted files (issue 24).

Each test runs the script as the pod runs it (a file, this interpreter, the real s5cmd, the
session's rclone S3 server, some through a fault proxy that forwards requests unchanged) with
the fault injected, bounds its time, and checks the outcome: the documented result, nothing
half-published (no marker on a copy that does not match), the previous good copy intact."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest

from tests.podside.faults import FaultProxy, Rule, get_of
from tests.podside.servers import BUCKET, RcloneS3
from tests.support.loopback import LoopbackServer
from tests.support.node_cache import (
    SELECT,
    STAGE,
    Node,
    Version,
    digest_of,
    model_files,
    tree,
    wait_for,
)
from warmstart.podside import weights_select
from warmstart.podside.weights_stage import node as weights_stage_node
from warmstart.podside.weights_stage import settings as weights_stage_settings
from warmstart.podside.weights_stage import main as weights_stage

pytestmark = pytest.mark.servers  # the staging script with s5cmd against S3 servers


@pytest.fixture
def proxy(rclone_s3: RcloneS3) -> Iterator[FaultProxy]:
    with FaultProxy(rclone_s3.endpoint) as p:
        yield p


def staged_previous(node: Node, upload) -> tuple[str, dict[str, bytes]]:
    """A complete earlier version on the node: what every failure must leave intact."""
    v = upload(model_files(100, mib=1))
    d = digest_of(v)
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d))
    assert rc == 0 and lines[-1]["result"] == "staged", lines
    return d, v.files


def assert_intact(node: Node, digest: str, files: dict[str, bytes]) -> None:
    assert tree(node.root / digest) == files
    marker = weights_stage_node.read_marker(node.root / digest)
    assert marker and marker["digest"] == digest


def no_partial(node: Node, digest: str) -> bool:
    return not os.path.lexists(node.root / f"{digest}.partial") and not os.path.lexists(node.root / digest)


# --------------------------------------------------------------------------------------------
# 2. A source rewritten during the copy


def test_a_source_rewritten_with_same_size_shards_during_the_copy_is_never_promoted(node, upload, proxy,
                                                                                     rclone_s3):
    prev, prev_files = staged_previous(node, upload)
    v = upload(model_files(1))
    d = digest_of(v)
    shard = "model-00002-of-00002.safetensors"
    proxy.add(Rule(get_of(shard), "delay", delay_s=3, times=1))
    env = node.env(v, d, AWS_ENDPOINT_URL=proxy.url)
    proc = subprocess.Popen([sys.executable, str(STAGE), "stage"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proxy.wait_for(lambda s: s[2] == "delay", 60), "the copy never asked for the shard"
        # A new import revision lands in the same prefix: same names, same sizes, other bytes.
        client = rclone_s3.client()
        for name, data in model_files(2).items():
            client.put_object(Bucket=BUCKET, Key=f"{v.prefix}/{name}", Body=data)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    (line,) = [json.loads(x) for x in out.splitlines()]
    assert line["result"] == "refused" and "source changed during the copy" in line["reason"], line
    assert no_partial(node, d)
    assert_intact(node, prev, prev_files)


def test_a_resumed_copy_drops_files_of_another_revision(node, upload, rclone_s3):
    """sync --size-only would keep a same-size shard of the revision an earlier attempt copied."""
    v = upload(model_files(1))
    d = digest_of(v)
    assert weights_stage.stage(node.settings(v, d), emit_line=False)["result"] == "staged"
    # An attempt that was stopped: the copy is back under the partial name, then the source
    # is rewritten (same sizes) before the next attempt.
    os.rename(node.root / d, node.root / f"{d}.partial")
    weights_stage.write_file(node.root / f"{d}.partial" / weights_stage_settings.SOURCE_SNAPSHOT,
                              json.dumps(weights_stage.list_source(node.settings(v, d),
                                                                   weights_stage.Deadline(60))).encode())
    new = model_files(2)
    client = rclone_s3.client()
    for name, data in new.items():
        client.put_object(Bucket=BUCKET, Key=f"{v.prefix}/{name}", Body=data)
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d))
    assert rc == 0 and lines[-1]["result"] == "staged", lines
    assert tree(node.root / d) == new


# --------------------------------------------------------------------------------------------
# 3. Content: what S3 can vouch for


def test_a_byte_flipped_on_the_way_is_refused_and_the_previous_copy_kept(node, upload, proxy):
    prev, prev_files = staged_previous(node, upload)
    v = upload(model_files(3))
    d = digest_of(v)
    proxy.add(Rule(get_of("model-00001-of-00002.safetensors"), "flip"))
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d, AWS_ENDPOINT_URL=proxy.url), timeout=90)
    assert rc == 0 and lines[-1]["result"] == "refused", lines
    assert "content mismatch" in lines[-1]["reason"] and "model-00001-of-00002.safetensors" in lines[-1]["reason"]
    assert no_partial(node, d)
    assert_intact(node, prev, prev_files)


@pytest.mark.parametrize("part_mib, recorded", [(5, False), (6, False), (6, True)])
def test_multipart_objects_are_checked_against_their_etag(tmp_path, seaweed_s3, s5cmd, part_mib, recorded):
    """SeaweedFS gives a multipart object S3's ETag (MD5 of the parts' MD5s, `-<parts>`);
    rclone 1.75 gives the whole object's MD5, which the single-part check covers."""
    from boto3.s3.transfer import TransferConfig

    node = Node(tmp_path / "nvme" / "weights" / "llama", seaweed_s3, s5cmd)
    prefix = f"node-cache/{os.getpid()}-mp-{part_mib}-{recorded}/model"
    client = seaweed_s3.client()
    big = os.urandom(11 << 20)
    path = tmp_path / "big"
    path.write_bytes(big)
    client.upload_file(str(path), BUCKET, f"{prefix}/model.safetensors",
                       Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=part_mib << 20))
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/config.json", Body=b"{}")
    if recorded:  # the import's manifest names the part size; no sha256 (a server-side copy)
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{weights_stage.IMPORT_MANIFEST}",
                          Body=json.dumps({"status": "complete", "part_bytes": part_mib << 20, "files": []}).encode())
    v = Version(prefix, {})
    d = digest_of(v)
    listing = weights_stage.list_source(node.settings(v, d), weights_stage.Deadline(60))
    parts = -(-(11 << 20) // (part_mib << 20))
    assert listing["model.safetensors"]["etag"].endswith(f"-{parts}"), listing  # a real multipart object
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d))
    assert rc == 0 and lines[-1]["result"] == "staged" and lines[-1]["checked"] == ["etag"], lines
    assert (node.root / d / "model.safetensors").read_bytes() == big


def test_the_import_manifest_sha256_is_checked_when_it_names_the_etag(node, upload, rclone_s3):
    files = model_files(4)
    v = upload(files)
    d = digest_of(v)
    listing = weights_stage.list_source(node.settings(v, d), weights_stage.Deadline(60))
    manifest = {"format": "warmstart-weights-import/1", "status": "complete", "part_bytes": 64 << 20,
                "files": [{"name": n, "etag": listing[n]["etag"], "sha256": hashlib.sha256(b).hexdigest()}
                          for n, b in files.items()]}
    # One recorded sha256 is wrong: the copy is refused although the ETags all match.
    manifest["files"][0]["sha256"] = "0" * 64
    rclone_s3.client().put_object(Bucket=BUCKET, Key=f"{v.prefix}/{weights_stage.IMPORT_MANIFEST}",
                                  Body=json.dumps(manifest).encode())
    record = weights_stage.stage(node.settings(v, d), emit_line=False)
    assert record["result"] == "refused" and "sha256" in record["reason"], record
    manifest["files"][0]["sha256"] = hashlib.sha256(files[manifest["files"][0]["name"]]).hexdigest()
    rclone_s3.client().put_object(Bucket=BUCKET, Key=f"{v.prefix}/{weights_stage.IMPORT_MANIFEST}",
                                  Body=json.dumps(manifest).encode())
    record = weights_stage.stage(node.settings(v, d), emit_line=False)
    assert record["result"] == "staged" and record["checked"] == ["etag", "sha256"], record


# --------------------------------------------------------------------------------------------
# 6. Planted paths in the node's weights directory


def test_a_loading_symlink_never_makes_the_stager_delete_elsewhere(node, upload, tmp_path):
    v = upload(model_files(5, mib=1))
    d = digest_of(v)
    victim_dir = tmp_path / "elsewhere"
    victim_dir.mkdir()
    (victim_dir / "precious.json").write_text('{"until": 0}')
    node.root.mkdir(parents=True)
    os.symlink(victim_dir, node.root / weights_stage_settings.LOADING_DIR)
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d))
    assert rc == 0 and lines[-1]["result"] == "staged", lines
    assert (victim_dir / "precious.json").read_text() == '{"until": 0}'


def test_a_symlinked_partial_never_copies_outside_the_root(node, upload, tmp_path):
    v = upload(model_files(6, mib=1))
    d = digest_of(v)
    outside = tmp_path / "outside"
    outside.mkdir()
    node.root.mkdir(parents=True)
    os.symlink(outside, node.root / f"{d}.partial")
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d))
    assert rc == 0 and lines[-1]["result"] == "staged", lines
    assert list(outside.iterdir()) == []
    assert not (node.root / d).is_symlink() and tree(node.root / d) == v.files


def test_a_fifo_among_pause_requests_never_hangs_the_stager(node, upload):
    v = upload(model_files(7, mib=1))
    d = digest_of(v)
    (node.root / weights_stage_settings.LOADING_DIR).mkdir(parents=True)
    os.mkfifo(node.root / weights_stage_settings.LOADING_DIR / "planted.json")
    start = time.monotonic()
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d, WARMSTART_STAGE_DEADLINE_S="30"), timeout=60)
    assert rc == 0 and lines[-1]["result"] == "staged", lines
    assert time.monotonic() - start < 30


def test_a_fifo_marker_never_holds_the_serving_pod_in_init(node, upload, tmp_path):
    v = upload(model_files(8, mib=1))
    d = digest_of(v)
    (node.root / d).mkdir(parents=True)
    os.mkfifo(node.root / d / weights_stage_settings.MARKER)
    env = node.env(v, d) | {"WARMSTART_WEIGHTS_OUT": str(tmp_path / "out")}
    rc, (line,) = node.run(SELECT, env=env, timeout=30)
    assert rc == 0 and line["choice"] == "s3" and "not a regular file" in line["reason"], line
    # The stager is not held either: it restages over the planted directory.
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d), timeout=60)
    assert rc == 0 and lines[-1]["result"] == "staged", lines


def _peak_rss_mib(argv: list[str], env: dict[str, str]) -> tuple[int, float]:
    """Run argv in a fresh wrapper process (its only child): (exit code, the child's peak RSS)."""
    code = ("import resource, subprocess, sys\n"
            f"rc = subprocess.run({argv!r}, stdout=subprocess.DEVNULL, timeout=60).returncode\n"
            "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=90)
    rc, kib = out.stdout.split()
    return int(rc), int(kib) / 1024


def test_a_huge_marker_stays_inside_the_pickers_memory_limit(node, upload, tmp_path):
    v = upload(model_files(9, mib=1))
    d = digest_of(v)
    (node.root / d).mkdir(parents=True)
    with open(node.root / d / weights_stage_settings.MARKER, "wb") as fh:
        fh.write(b'{"format": "warmstart-weights-stage/1", "files": [' + b'{"key": "x", "size": 1},' * (200 << 15))
    assert (node.root / d / weights_stage_settings.MARKER).stat().st_size > 150 << 20
    env = node.env(v, d) | {"WARMSTART_WEIGHTS_OUT": str(tmp_path / "out")}
    rc, peak = _peak_rss_mib([sys.executable, str(SELECT)], env)
    assert rc == 0 and peak < 64, f"{peak:.0f} MiB against the picker's 128 MiB limit"
    assert json.loads((tmp_path / "out" / weights_select.CHOICE_FILE).read_text())["choice"] == "s3"


# --------------------------------------------------------------------------------------------
# 7. Bounds


def test_an_infinite_or_skewed_pause_defers_staging_only_for_a_bounded_time(node, upload):
    v = upload(model_files(10, mib=1))
    d = digest_of(v)
    (node.root / weights_stage_settings.LOADING_DIR).mkdir(parents=True)
    (node.root / weights_stage_settings.LOADING_DIR / "inf.json").write_text('{"until": Infinity}')
    (node.root / weights_stage_settings.LOADING_DIR / "skewed.json").write_text(json.dumps({"until": time.time() + 1e9}))
    start = time.monotonic()
    rc, lines = node.run(STAGE, "stage", env=node.env(v, d, WARMSTART_STAGE_DEADLINE_S="30"), timeout=90)
    assert rc == 0 and lines[-1]["result"] == "staged", lines  # before: "deferred" at the deadline
    assert 10 <= lines[-1]["paused_s"] <= 17, lines  # half the deadline, and a poll period or so
    assert time.monotonic() - start < 60
    # With a short per-request cap the requests count for that long only.
    v2 = upload(model_files(11, mib=1))
    rc, lines = node.run(STAGE, "stage", env=node.env(v2, digest_of(v2), WARMSTART_MAX_PAUSE_S="1"), timeout=60)
    assert rc == 0 and lines[-1]["result"] == "staged" and lines[-1]["paused_s"] < 5, lines


def test_a_disk_that_fills_at_the_marker_leaves_no_partial_copy(node, upload, small_disk, tmp_path):
    disk = small_disk("16m")
    if disk is None:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    n = Node(disk / "weights" / "llama", node.server, node.s5cmd)
    prev, prev_files = staged_previous(n, upload)
    v = upload({"a.safetensors": os.urandom(6 << 20), "config.json": b"{}"})
    d = digest_of(v)
    # After the copy, something else on the node takes the rest of the disk.
    script = tmp_path / "s5cmd-then-fill"
    script.write_text(f'#!/bin/sh\n"{node.s5cmd}" "$@"; rc=$?\n'
                      f'case " $* " in *" sync "*) cat /dev/zero > "{disk}/ballast" 2>/dev/null ;; esac\n'
                      'exit $rc\n')
    script.chmod(0o755)
    rc, lines = n.run(STAGE, "stage", env=n.env(v, d, WARMSTART_S5CMD=str(script)))
    assert rc == 0 and lines[-1]["result"] == "refused" and "disk full" in lines[-1]["reason"], lines
    assert no_partial(n, d)
    assert_intact(n, prev, prev_files)


class FakeKubeApi(LoopbackServer):
    """The API server's NodeFeature endpoint: records (method, path, monotonic time)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, float]] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                api.calls.append((self.command, self.path, time.monotonic()))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_PATCH = do_DELETE = _any  # noqa: N815

            def log_message(self, *args: object) -> None:
                pass

        self._serve(Handler)

    @property
    def url(self) -> str:
        return self.base_url


def test_sigterm_unlabels_the_node_well_inside_the_grace_period(node, upload, tmp_path):
    v = upload(model_files(12, mib=1))
    d = digest_of(v)
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    with FakeKubeApi() as api:
        env = node.env(v, d, WARMSTART_KUBE_API=api.url, WARMSTART_SA_DIR=str(sa),
                       WARMSTART_LABEL="weights.warmstart.io/llama", NODE_NAME="n1", POD_NAME="p1",
                       POD_UID="u1", POD_NAMESPACE="inference")
        proc = subprocess.Popen([sys.executable, str(STAGE), "hold"], env=env, stdout=subprocess.PIPE, text=True)
        try:
            assert wait_for(lambda: any(c[0] == "PATCH" for c in api.calls), 90), "never labelled"
            time.sleep(0.5)  # into the 30 s check interval
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=40)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        deletes = [t for m, _, t in api.calls if m == "DELETE"]
    assert deletes and deletes[0] - sent < 10, "the unlabel came too late for the 30 s grace period"
    assert proc.returncode == 0
