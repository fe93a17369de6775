"""The weights import's constants, errors, Settings (read once from the environment) and log line.

Part of weights_import.py, whose docstring has the job, the environment and the log;
shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping

from ..common.env import EnvReader
from ..common.shared import emit_line, json_line
from .context_length import parse_overrides

EVENT = "warmstart.weights_import"


FORMAT = "warmstart-weights-import/1"


MANIFEST_NAME = "warmstart-manifest.json"


INDEX_NAME = "model.safetensors.index.json"


GIB = 1 << 30


MIB = 1 << 20
# How far the measured safetensors total may be from weightsGiB. People write a rounded figure
# (15 for Llama-3.1-8B's 14.96 GiB); within 5 % the streamer concurrency, ceil(weights / 4 GiB),
# moves by at most one worker, while a wrong model, another precision (FP8 is half of BF16) or
# a missing shard is far outside it. warmstart.decisions.weights_import has the same number.
WEIGHTS_TOLERANCE = 0.05
# What vLLM reads from the model prefix: weights, config and tokenizer files, chat templates,
# remote code. Top-level names only (matched against names without a "/").
WANTED_PATTERNS = ("*.safetensors", "*.json", "*.model", "*.tiktoken", "*.txt", "*.jinja", "*.py")


HF_COMMIT = re.compile(r"^[0-9a-f]{40}$")


S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<prefix>[^\s]*[^\s/])/?$")
# S3 answers these for a request that will never succeed: no point retrying.
PERMANENT_S3_CODES = frozenset({"AccessDenied", "NoSuchBucket", "NoSuchKey", "InvalidAccessKeyId",
                                "SignatureDoesNotMatch", "AllAccessDisabled", "InvalidObjectState",
                                "AccountProblem", "InvalidBucketName"})

DEFAULT_TERMINATION_LOG = "/dev/termination-log"

EXIT_OK, EXIT_BUG, EXIT_CONFIG, EXIT_ACCESS, EXIT_VERIFY, EXIT_TRANSFER = 0, 1, 2, 3, 4, 5


EXIT_TERMINATED = 143


class ImportFailure(RuntimeError):
    """An expected failure: its exit code and a message that says what to do."""

    exit_code = EXIT_BUG


class ConfigError(ImportFailure):
    exit_code = EXIT_CONFIG


class AccessError(ImportFailure):
    exit_code = EXIT_ACCESS


class VerifyError(ImportFailure):
    exit_code = EXIT_VERIFY


class TransferError(ImportFailure):
    exit_code = EXIT_TRANSFER


class Interrupted(ImportFailure):
    exit_code = 143  # EXIT_TERMINATED


# --------------------------------------------------------------------------------------------
# Settings


def termination_log(env: Mapping[str, str]) -> Path | None:
    """Where the failure reason goes: WARMSTART_TERMINATION_LOG, else the file Kubernetes mounts
    into every container (none outside a pod)."""
    given = env.get("WARMSTART_TERMINATION_LOG", "").strip()
    if given:
        return Path(given)
    return Path(DEFAULT_TERMINATION_LOG) if Path(DEFAULT_TERMINATION_LOG).is_file() else None


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything this script reads from the environment, validated once."""

    model: str
    dest_bucket: str
    dest_prefix: str
    weights_gib: float
    s3_bucket: str | None
    s3_prefix: str | None
    hf_repo: str | None
    hf_revision: str | None
    scratch_dir: Path
    max_concurrency: int
    part_bytes: int
    retries: int
    region: str | None
    termination_log: Path | None
    small_read_s: float = 60.0
    """WARMSTART_SMALL_READ_S: the most one small JSON read may take, all its attempts together."""
    scratch_bytes: int = 0
    """WARMSTART_SCRATCH_BYTES: what the Hub files in flight may hold on the scratch disk together
    (0: the disk's free space when the copy starts)."""
    file_parallelism: int = 8
    """WARMSTART_FILE_PARALLELISM: the most Hub files downloaded and uploaded at once."""
    max_model_len: int | None = None
    """WARMSTART_MAX_MODEL_LEN: the model's `maxModelLen` (None: vLLM's default, nothing to check)."""
    hf_overrides: dict[str, Any] | None = None
    """WARMSTART_HF_OVERRIDES: the JSON object of `--hf-overrides` in the model's extraArgs."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        read = EnvReader(env)
        problems = read.problems
        text, number = read.text, read.number


        prefix = text("WARMSTART_DEST_PREFIX", required=True).strip("/")
        weights_gib = number("WARMSTART_WEIGHTS_GIB", 0.0)
        if not env.get("WARMSTART_WEIGHTS_GIB", "").strip():
            problems.append("WARMSTART_WEIGHTS_GIB is not set")
        elif weights_gib <= 0:
            problems.append("WARMSTART_WEIGHTS_GIB must be > 0")
        s3_uri, repo, revision = text("WARMSTART_SOURCE_S3"), text("WARMSTART_HF_REPO"), text("WARMSTART_HF_REVISION")
        s3_bucket = s3_prefix = None
        if bool(s3_uri) == bool(repo):
            problems.append("set exactly one of WARMSTART_SOURCE_S3 or WARMSTART_HF_REPO")
        if s3_uri:
            m = S3_URI.match(s3_uri)
            if m is None:
                problems.append(f"WARMSTART_SOURCE_S3={s3_uri!r} is not s3://bucket/prefix")
            else:
                s3_bucket, s3_prefix = m["bucket"], m["prefix"].strip("/")
            if revision:
                problems.append("WARMSTART_HF_REVISION applies only to a Hugging Face import")
        if repo and not HF_COMMIT.match(revision):
            problems.append(f"WARMSTART_HF_REVISION={revision!r} must be a 40-hex commit (a branch or tag can move)")
        max_model_len = number("WARMSTART_MAX_MODEL_LEN", 0, integer=True, minimum=1) or None
        overrides = None
        if text("WARMSTART_HF_OVERRIDES"):
            overrides = parse_overrides(text("WARMSTART_HF_OVERRIDES"))
            if overrides is None:
                problems.append("models[].extraArgs: the value of --hf-overrides is not a JSON object (vLLM "
                                "refuses it too); fix: write it as one, e.g. '{\"rope_scaling\": {...}}'")
        part = number("WARMSTART_PART_BYTES", 64 * MIB, integer=True, minimum=5 * MIB)
        term = termination_log(env)
        settings = cls(
            model=text("WARMSTART_MODEL", required=True),
            dest_bucket=text("WARMSTART_DEST_BUCKET", required=True),
            dest_prefix=prefix,
            weights_gib=weights_gib,
            s3_bucket=s3_bucket,
            s3_prefix=s3_prefix,
            hf_repo=repo or None,
            hf_revision=revision or None,
            scratch_dir=Path(text("WARMSTART_SCRATCH_DIR") or "/scratch"),
            max_concurrency=number("WARMSTART_MAX_CONCURRENCY", 16, integer=True, minimum=1),
            part_bytes=part,
            retries=number("WARMSTART_RETRIES", 3, integer=True, minimum=1),
            region=text("AWS_REGION") or text("AWS_DEFAULT_REGION") or None,
            termination_log=term,
            small_read_s=number("WARMSTART_SMALL_READ_S", SMALL_READ_S, minimum=1),
            scratch_bytes=number("WARMSTART_SCRATCH_BYTES", 0, integer=True, minimum=0),
            file_parallelism=number("WARMSTART_FILE_PARALLELISM", 8, integer=True, minimum=1),
            max_model_len=max_model_len,
            hf_overrides=overrides,
        )
        if (s3_bucket is not None and settings.dest_bucket == s3_bucket
                and (f"{s3_prefix}/".startswith(f"{prefix}/") or f"{prefix}/".startswith(f"{s3_prefix}/"))):
            problems.append(f"the source s3://{s3_bucket}/{s3_prefix} overlaps the destination "
                            f"s3://{settings.dest_bucket}/{prefix}")
        if problems:
            raise ConfigError("; ".join(problems))
        return settings

    @property
    def source(self) -> str:
        """What the manifest records as the source: `s3://bucket/prefix` or `hf://<repo>`."""
        return f"s3://{self.s3_bucket}/{self.s3_prefix}" if self.s3_bucket else f"hf://{self.hf_repo}"

    @property
    def revision(self) -> str | None:
        return self.hf_revision

    @property
    def destination(self) -> str:
        return f"s3://{self.dest_bucket}/{self.dest_prefix}"

    def dest_key(self, name: str) -> str:
        return f"{self.dest_prefix}/{name}"


# --------------------------------------------------------------------------------------------
# The log line


@dataclasses.dataclass
class Phase:
    """One phase's outcome; `line()` is its one JSON log line."""

    name: str
    model: str
    result: str = "error"
    files: int | None = None
    bytes: int | None = None
    reason: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    started: float = dataclasses.field(default_factory=time.monotonic)

    def line(self) -> str:
        record = {"event": EVENT, "phase": self.name, "result": self.result, "model": self.model,
                  "files": self.files, "bytes": self.bytes,
                  "seconds": round(time.monotonic() - self.started, 3),
                  "reason": None if self.reason is None else self.reason[:2000], **self.extra}
        return json_line(record)


def emit(phase: Phase) -> None:
    emit_line(phase.line())


def gib(n: int | float) -> float:
    return n / GIB


def wanted(name: str) -> bool:
    """A top-level file vLLM reads (never the manifest)."""
    return "/" not in name and name != MANIFEST_NAME and any(fnmatch.fnmatchcase(name, p) for p in WANTED_PATTERNS)


#: The most one small read may take, all attempts together (WARMSTART_SMALL_READ_S): botocore's
#: read_timeout bounds each socket read, not a body trickled a byte at a time.
SMALL_READ_S = 60.0
