"""The Hub import of a model four times larger than its scratch, SIGKILLed mid-way and restarted
(bench/import_stream.py at a test's size): every file in S3 and verified, the scratch below its
bound, and no file recorded as verified before the kill sent again."""

from __future__ import annotations

import pytest

from bench.import_stream import EXTRA, MIB, measure

pytestmark = pytest.mark.servers


def test_a_model_larger_than_its_scratch_is_imported_through_a_kill(tmp_path):
    r = measure(tmp_path, total=48 * MIB, shard=6 * MIB, scratch=12 * MIB, part=5 * MIB, timeout_s=300)
    assert r["model_over_scratch"] >= 4
    assert r["killed_mid_copy"] and 0 < r["verified_at_kill"] < r["shards"], r
    assert r["second_exit"] == 0 and r["manifest_status"] == "complete"
    assert r["files_bad"] == [] and r["files_in_s3_and_verified"] == r["files"]
    assert r["scratch_peak_bytes"] <= r["scratch_bound_bytes"] + EXTRA, r
    assert r["budget_peak_bytes"] <= r["scratch_bound_bytes"]
    # Verified files are kept; only those in flight at the kill (at most 4 files at once) go twice.
    assert r["verified_files_resent"] == [] and r["reuploaded_verified_before_kill"] == []
    assert len(r["files_uploaded_more_than_once"]) <= 4
    assert r["uploaded_bytes"] <= r["model_bytes"] + 4 * r["shard_bytes"] * 1.01
