"""How a model's weights get into its `source` during `up`: the import Job's decisions (pure).

A model with `import` gets a Job on non-GPU nodes that copies the weights from the Hugging Face
Hub (at a pinned commit) or another S3 prefix into the model's own prefix, verifies them and
writes a manifest (warmstart/podside/weights_import.py); the Deployment waits for it. Here:
its names, where it runs, how long it may take, how much scratch disk it needs, and the rules
a config must meet for it to work, all from config alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from . import naming, placement
from .instances import GIB, MIB

ImportKind = Literal["huggingFace", "s3"]

# The measured safetensors total may differ from `weightsGiB` by this fraction. People write a
# rounded figure (15 for Llama-3.1-8B's 14.96 GiB), and within 5 % the streamer concurrency,
# ceil(weights / 4 GiB chunk), moves by at most one worker. A wrong model, another precision
# (BF16 vs FP8 halves it) or a missing shard (a quarter of a 4-shard model) is far outside it.
# The pod-side script carries the same number (its WEIGHTS_TOLERANCE; a test keeps them equal).
WEIGHTS_TOLERANCE = 0.05

# Pessimistic sustained rate of a whole import: a small general-purpose node's share of NAT
# for the Hub download, then the S3 upload, one after the other, about 40 MiB/s each. A Hub
# download to EC2 usually runs at hundreds of MiB/s, an S3 server-side copy faster still, so
# the deadline below fires only for an import that is stuck, never for a slow but healthy one.
IMPORT_RATE_BYTES_PER_S = 20 * MIB
# Before any byte moves: a general-purpose node launched for the pod and the model's vLLM image
# (about 10 GB) pulled onto it. The same allowance the Deployment has for a GPU node.
IMPORT_START_SECONDS = 900
# `pulumi up` waits this much longer than the Job's own deadline, so Kubernetes, not Pulumi,
# decides that an import failed (and says why in the Job's conditions).
PULUMI_WAIT_MARGIN_SECONDS = 120
# Pod retries of a failed copy (each resumes where the last stopped). Config, source and
# verification errors fail the Job at once (podFailurePolicy), so these are for transient faults.
BACKOFF_LIMIT = 2
# The Hugging Face path streams file by file through an emptyDir (podside/weights_import/stream.py):
# a file is downloaded, uploaded while hashed, and deleted, and a file starts only while the files
# in flight fit the scratch. So the scratch is bounded by the largest file times the files in
# flight, not by the model. The render sizes it by this assumption about the largest file: 10 GiB,
# twice the 5 GB shards transformers' `save_pretrained` writes by default (max_shard_size="5GB",
# https://huggingface.co/docs/transformers/main_classes/model#transformers.PreTrainedModel.save_pretrained;
# Llama-3.1-70B's 30 shards and DeepSeek-R1's 163 are each under 5 GB).
ASSUMED_LARGEST_FILE_BYTES = 10 * GIB
# Files in flight at once: what keeps a general-purpose node's network busy (each file is one
# Hub download and one multipart upload of WARMSTART_MAX_CONCURRENCY parts at most).
FILE_PARALLELISM = 4
# The scratch of a large model: FILE_PARALLELISM files of the assumed largest size. A file larger
# than the whole scratch fails the Job before any download, naming the file and the fix (import a
# re-sharded copy); a file between the assumption and this bound is imported with fewer in flight.
SCRATCH_CAP_BYTES = FILE_PARALLELISM * ASSUMED_LARGEST_FILE_BYTES
# Room for the config/tokenizer files and the Hub client's own bookkeeping (its `.cache` of
# metadata beside the files, HF_HOME), besides the files in flight.
SCRATCH_EXTRA_BYTES = 2 * GIB
# Ephemeral storage of the node the Job lands on: Auto Mode's `general-purpose` NodePool uses
# the default NodeClass (80 GiB, https://docs.aws.amazon.com/eks/latest/userguide/create-node-class.html);
# the Karpenter-mode `general-purpose` NodePool's EC2NodeClass gives its nodes a root volume with
# that much room besides the image and the OS (warmstart/manifests/gpu_pools.py
# CPU_ROOT_VOLUME_GIB). The largest scratch (SCRATCH_CAP_BYTES + SCRATCH_EXTRA_BYTES) fits it
# with room for the vLLM image (a test holds them together).
NODE_EPHEMERAL_BYTES: dict[placement.ClusterMode, int] = {"auto": 80 * GIB, "karpenter": 80 * GIB}
# A Hub import above this size asks for a larger general-purpose node: it requests LARGE_IMPORT_CPU,
# which no `large` or `xlarge` node holds beside its DaemonSets, so Karpenter (either mode) launches
# a 2xlarge or larger, whose baseline network bandwidth is four times a `large`'s (m6i/m7i: 3.125
# against 0.781 Gbit/s, https://docs.aws.amazon.com/ec2/latest/instancetypes/gp.html#gp_network).
# The import uses those CPUs: it hashes every byte and runs TLS for the download and the upload.
LARGE_IMPORT_BYTES = 64 * GIB
LARGE_IMPORT_CPU = "4"
# Baseline network bandwidth of the smallest node each request can land on, in bits per second
# (the gp page above: Auto Mode's m5.large 0.75 Gbit/s, m6i/m7i.large 0.781; Auto Mode's c5/m5/r5.2xlarge,
# the slowest 2xlarge its pool may pick, 2.5 Gbit/s). An import moves every byte in (from the Hub,
# through the NAT gateway) and out (to S3, through the gateway endpoint); the prediction counts
# both against the baseline, the pessimistic reading, and ignores burst credits.
SMALL_NODE_BASELINE_BITS = 750_000_000
LARGE_NODE_BASELINE_BITS = 2_500_000_000


def predicted_seconds(weights_bytes: int) -> int:
    """The Hub import's expected duration once its pod runs: every byte twice (in and out)
    through the baseline bandwidth of the smallest node its request lands on."""
    bits = LARGE_NODE_BASELINE_BITS if weights_bytes > LARGE_IMPORT_BYTES else SMALL_NODE_BASELINE_BITS
    return math.ceil(2 * weights_bytes * 8 / bits)


def import_cpu(kind: ImportKind, weights_bytes: int) -> str:
    """The import pod's CPU request: a large Hub import asks for a larger node (see LARGE_IMPORT_BYTES)."""
    return LARGE_IMPORT_CPU if kind == "huggingFace" and weights_bytes > LARGE_IMPORT_BYTES else IMPORT_REQUESTS["cpu"]


def service_account(model: str) -> str:
    """The import Job's own ServiceAccount (and IRSA subject): never the serving one."""
    return f"{model}-import"


def token_secret_name(model: str) -> str:
    return f"{model}-hf-token"


# What the import Job's pod requests (manifests/weights_import.py): it is placed on the non-GPU
# nodes next to the routers and KEDA (the platform's `non_gpu_placement`; warmstart/decisions/cpu_pool.py
# holds them against the CPU NodePool's limit).
IMPORT_REQUESTS = {"cpu": "500m", "memory": "1Gi"}


def import_digest(source: str, revision: str | None, destination: str) -> str:
    """Short digest of what an import copies where: in the Job's name, so changing any of them
    replaces the Job (a Job's pod template is immutable) and an unchanged `up` keeps it."""
    return naming.short_hash("weights-import", source, revision or "", destination)


def job_name(model: str, digest: str) -> str:
    """`<model>-import-<digest>`: at most 40 + 8 + 8 characters, inside the 63 of the pods'
    `job-name` label."""
    return f"{model}-import-{digest}"


def deadline_seconds(weights_bytes: int) -> int:
    """The Job's activeDeadlineSeconds: start-up allowance plus the weights at the pessimistic rate."""
    return IMPORT_START_SECONDS + math.ceil(weights_bytes / IMPORT_RATE_BYTES_PER_S)


def scratch_bytes(weights_bytes: int) -> int:
    """emptyDir size for a Hugging Face import, rounded up to whole GiB: the whole model (within
    the tolerance) when it is smaller than SCRATCH_CAP_BYTES, else that cap; plus the extra."""
    need = min(weights_bytes * (1 + WEIGHTS_TOLERANCE), SCRATCH_CAP_BYTES) + SCRATCH_EXTRA_BYTES
    return math.ceil(need / GIB) * GIB


def scratch_budget_bytes(scratch: int) -> int:
    """What the files in flight may hold of a scratch of `scratch` bytes (WARMSTART_SCRATCH_BYTES)."""
    return max(0, scratch - SCRATCH_EXTRA_BYTES)


@dataclass(frozen=True)
class ImportPlan:
    """Everything decided for one model's weights import."""

    model: str
    kind: ImportKind
    source: str
    """`s3://bucket/prefix`, or `hf://<repo>` for the Hugging Face Hub."""
    revision: str | None
    """The pinned Hub commit; None for an S3 source."""
    destination: str
    """The model's `source`, where the weights land."""
    dest_bucket: str
    dest_prefix: str
    source_bucket: str | None
    source_prefix: str | None
    weights_bytes: int
    job_name: str
    service_account: str
    deadline_seconds: int
    scratch_bytes: int
    """emptyDir for the Hub files in flight; 0 for S3 (a server-side copy needs no local disk)."""
    cpu: str = "500m"
    """The import pod's CPU request (import_cpu)."""
    non_gpu: placement.NonGpuPlacement = placement.ANYWHERE_OFF_GPU
    """Where the Job's pod runs: the platform's non-GPU nodes."""

    @property
    def pulumi_wait_seconds(self) -> int:
        """How long `pulumi up` waits for the import Job (`pulumi.com/timeoutSeconds`): its own
        deadline and a margin for the pod to be scheduled and report."""
        return self.deadline_seconds + PULUMI_WAIT_MARGIN_SECONDS

    @property
    def predicted_seconds(self) -> int | None:
        """The Hub import's expected duration on its node (None for a server-side S3 copy,
        whose bytes never pass through the pod)."""
        return predicted_seconds(self.weights_bytes) if self.kind == "huggingFace" else None

    @property
    def hugging_face_repo(self) -> str | None:
        return self.source.removeprefix("hf://") if self.kind == "huggingFace" else None

    def summary(self) -> dict:
        """The plan.json entry of the import (never the token)."""
        return {"kind": self.kind, "source": self.source, "revision": self.revision, "job": self.job_name,
                "serviceAccount": self.service_account, "deadlineSeconds": self.deadline_seconds,
                "scratchBytes": self.scratch_bytes, "cpu": self.cpu, "predictedSeconds": self.predicted_seconds}


def overlaps(a_bucket: str, a_prefix: str, b_bucket: str, b_prefix: str) -> bool:
    """Two `bucket/prefix` locations share keys (one prefix is the other or lies under it)."""
    if a_bucket != b_bucket:
        return False
    a, b = a_prefix.strip("/") + "/", b_prefix.strip("/") + "/"
    return a.startswith(b) or b.startswith(a)
