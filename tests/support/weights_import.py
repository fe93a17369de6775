"""The weights-import script run as its Job runs it (a file, with this interpreter), a small
Hugging Face-format model, and what an import must leave in S3."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.podside.servers import S3Server
from tests.support.pod_scripts import artifact
from warmstart.podside.weights_import import settings as weights_import_settings
from warmstart.podside.weights_import import main as wi

MODULE = artifact("weights_import.pyz")
MIB = 1 << 20
PART = 5 * MIB
COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
OTHER_COMMIT = "1" * 40
SHARDS = {"model-00001-of-00003.safetensors": 7 * MIB + 11, "model-00002-of-00003.safetensors": 6 * MIB + 5,
          "model-00003-of-00003.safetensors": 1 * MIB + 3}


def model_files(seed: int = 0, shards: dict[str, int] = SHARDS) -> dict[str, bytes]:
    """A small Hugging Face-format model, plus files vLLM does not read (which must not be copied)."""
    rnd = random.Random(seed)
    files = {name: rnd.randbytes(size) for name, size in shards.items()}
    index = {"metadata": {"total_size": sum(shards.values())},
             "weight_map": {f"layer.{i}.weight": name for i, name in enumerate(sorted(shards))}}
    files |= {
        "config.json": json.dumps({"architectures": ["LlamaForCausalLM"], "seed": seed}).encode(),
        "generation_config.json": b'{"do_sample": true}',
        "tokenizer.json": rnd.randbytes(300_000),
        "tokenizer_config.json": b'{"model_max_length": 8192}',
        "special_tokens_map.json": b"{}",
        "model.safetensors.index.json": json.dumps(index).encode(),
        # Not for vLLM: never copied.
        "README.md": b"# a model card",
        ".gitattributes": b"*.safetensors filter=lfs",
        "original/params.json": b"{}",
        "original/consolidated.00.pth": rnd.randbytes(4096),
    }
    return files


WANTED = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "model.safetensors.index.json", *SHARDS}


def weights_gib(files: dict[str, bytes]) -> float:
    return sum(len(v) for k, v in files.items() if k.endswith(".safetensors") and "/" not in k) / (1 << 30)


@dataclasses.dataclass
class Run:
    returncode: int
    lines: list[dict[str, Any]]
    stdout: str
    stderr: str

    def phase(self, name: str) -> dict[str, Any]:
        (line,) = [line for line in self.lines if line["phase"] == name]
        return line

    @property
    def phases(self) -> list[tuple[str, str]]:
        return [(line["phase"], line["result"]) for line in self.lines]

    @property
    def reason(self) -> str:
        return " ".join(line["reason"] or "" for line in self.lines if line["result"] == "error")


def clean_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "WARMSTART_", "BOTO", "HF_"))}


def parse(stdout: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert all(line["event"] == weights_import_settings.EVENT for line in lines), stdout
    return lines


@dataclasses.dataclass
class Job:
    """One import Job's environment: the destination, the expected size, the source."""

    server: S3Server
    env: dict[str, str]

    def full_env(self, **extra: str) -> dict[str, str]:
        return {**clean_environ(), **self.server.env(), **self.env, **extra}

    def run(self, timeout: float = 120, **extra: str) -> Run:
        proc = subprocess.run([sys.executable, str(MODULE)], env=self.full_env(**extra), capture_output=True,
                              text=True, timeout=timeout)
        return Run(proc.returncode, parse(proc.stdout), proc.stdout, proc.stderr)

    def spawn(self, **extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, str(MODULE)], env=self.full_env(**extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def through(job: Job, proxy: Any) -> Job:
    """The same Job, its S3 traffic through a proxy (anything with a `url`, a FaultProxy)."""
    return Job(job.server, {**job.env, "AWS_ENDPOINT_URL": proxy.url})


def ensure_bucket(server: S3Server, bucket: str) -> None:
    client = server.client()
    if not any(b["Name"] == bucket for b in client.list_buckets().get("Buckets", [])):
        client.create_bucket(Bucket=bucket)


def put_tree(server: S3Server, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    client = server.client()
    for name, data in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)


def objects(server: S3Server, bucket: str, prefix: str) -> dict[str, dict[str, Any]]:
    """Every object under prefix/ (recursively): name -> size, etag, last-modified."""
    client, out, token = server.client(), {}, None
    while True:
        kwargs = {"Bucket": bucket, "Prefix": f"{prefix}/"} | ({"ContinuationToken": token} if token else {})
        page = client.list_objects_v2(**kwargs)
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix) + 1:]] = {"size": o["Size"], "etag": o["ETag"].strip('"'),
                                               "modified": o["LastModified"]}
        if not page.get("IsTruncated"):
            return out
        token = page["NextContinuationToken"]


def body(server: S3Server, bucket: str, key: str) -> bytes:
    return server.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def assert_copied(server: S3Server, bucket: str, prefix: str, files: dict[str, bytes]) -> dict[str, Any]:
    """The destination holds exactly what vLLM needs, byte for byte, and the manifest; returns it."""
    found = objects(server, bucket, prefix)
    assert set(found) == WANTED | {wi.MANIFEST_NAME}, sorted(found)
    for name in WANTED:
        assert sha(body(server, bucket, f"{prefix}/{name}")) == sha(files[name]), name
    manifest = json.loads(body(server, bucket, f"{prefix}/{wi.MANIFEST_NAME}"))
    assert {f["name"] for f in manifest["files"]} == WANTED
    for f in manifest["files"]:
        assert f["key"] == f"{prefix}/{f['name']}"
        assert (f["bytes"], f["etag"]) == (found[f["name"]]["size"], found[f["name"]]["etag"])
    assert manifest["total_bytes"] == sum(len(files[n]) for n in WANTED)
    assert manifest["weights_bytes"] == sum(SHARDS.values())
    # Written last: no object is newer than the manifest.
    assert all(o["modified"] <= found[wi.MANIFEST_NAME]["modified"] for o in found.values())
    return manifest


# On SeaweedFS: the source under `imports/`, the model's `source` under `models/` of one bucket.
SRC, DST = "imports", "models"
