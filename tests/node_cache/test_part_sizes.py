"""The stager's part-size derivation and S3's digests of parts, as pure functions (the fast loop);
the same rules against real servers are in test_stage_checks.py."""

from __future__ import annotations

import base64
import hashlib
import math
import os

from hypothesis import given, settings, strategies as st

from warmstart.podside.weights_stage import content as weights_stage_content
from warmstart.podside.weights_stage import main as weights_stage

MIB = 1 << 20


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 1 << 40), part_mib=st.integers(5, 2048))
def test_the_part_sizes_s3_clients_choose_are_derived(size, part_mib):
    """Every candidate splits the object into its part count; the AWS CLI's and boto3's own
    choice (8 MiB, doubled until the parts fit in 10,000) is always among them; and any whole-MiB
    part size is found whenever the range ceil(size / P) == parts leaves few enough to try all."""
    def parts_of(p: int) -> int:
        return math.ceil(size / p)

    default = 8 * MIB
    while parts_of(default) > weights_stage_content.S3_MAX_PARTS:
        default *= 2  # s3transfer's ChunksizeAdjuster
    for part in (default, part_mib * MIB):
        if parts_of(part) > weights_stage_content.S3_MAX_PARTS:
            continue
        found, known = weights_stage_content.part_size_candidates(size, parts_of(part))
        assert found and all(parts_of(p) == parts_of(part) for p in found), (size, part, found)
        assert known == (parts_of(part) == 1)
        if parts_of(part) == 1:
            continue
        if part == default:
            assert part in found, (size, part, found)
        lo, hi = math.ceil(size / parts_of(part)), (size - 1) // (parts_of(part) - 1)
        if hi // MIB - max(5, -(-lo // MIB)) + 1 <= weights_stage_content.MAX_GUESSED_PART_SIZES - 4:
            assert part in found, (size, part, found)


def test_a_one_part_etag_is_the_md5_of_the_md5():
    data = os.urandom(1000)
    d = weights_stage_content.PartDigests("md5", 8 * MIB)
    d.update(memoryview(data))
    assert weights_stage_content.s3_etag(d.finish(), True) == hashlib.md5(hashlib.md5(data).digest()).hexdigest() + "-1"


def test_a_composite_checksum_is_the_sha256_of_the_parts_sha256s():
    data = os.urandom(3 * MIB + 5)
    d = weights_stage_content.PartDigests("sha256", MIB)
    d.update(memoryview(data))
    parts = [hashlib.sha256(data[i:i + MIB]).digest() for i in range(0, len(data), MIB)]
    assert weights_stage_content.s3_checksum(d.finish(), True) == \
        base64.b64encode(hashlib.sha256(b"".join(parts)).digest()).decode() + "-4"
