"""The weights import's small reads under the framings and stalls a proxy or gateway gives
(issue 32, item 5): the script runs as the Job runs it, against SeaweedFS behind a fault proxy
that forwards every request unchanged and re-frames or trickles only the response body."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from tests.podside.faults import FaultProxy, Rule, get_of
from tests.podside.servers import S3Server
from tests.support.weights_import import DST, Job, assert_copied
from tests.podside.servers import BUCKET
from warmstart.podside import weights_import as wi

pytestmark = pytest.mark.servers


@pytest.fixture
def proxy(seaweed_s3: S3Server) -> Iterator[FaultProxy]:
    with FaultProxy(seaweed_s3.endpoint) as p:
        yield p


def through(job: Job, proxy: FaultProxy) -> Job:
    return Job(job.server, {**job.env, "AWS_ENDPOINT_URL": proxy.url})


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
