"""The weights-import Job of one model as plain Kubernetes object dicts (pure).

A model with `import` gets, besides its serving objects: its own ServiceAccount
(`<model>-import`, with the import role, never the serving one), the Hugging Face token as a
Secret when one is given, and a Job that runs warmstart/podside/weights_import.py (from a
ConfigMap, `pod_scripts.config_map_spec`) in the model's own image on a non-GPU node. The
VllmModel component registers them and makes the Deployment wait for the Job.

Why each choice:
- the Job's name carries a digest of source, revision and destination: a Job is immutable, so a
  new import must be a new Job, while an unchanged `up` leaves the completed one alone;
- no `ttlSecondsAfterFinished`: Pulumi would see the Job gone and create it again;
- `pulumi.com/replaceUnready`: a Job that failed (a missing token, a wrong weightsGiB) is
  replaced by the next `up` after the fix, instead of Pulumi waiting on it again;
- podFailurePolicy: configuration, access and verification errors (exit 2, 3, 4) fail the Job
  at once; only transient faults use the retries, and node disruptions do not count.
"""

from __future__ import annotations

from typing import Any

from ..decisions import weights_import as imports
from ..decisions.instances import GIB
from ..decisions.placement import DO_NOT_DISRUPT
from ..plan.records import ServingPlan
from ..podside.weights_import import context_length
from ..podside.weights_import import s3 as script_s3
from .serving import (
    ANNOTATION_DOMAIN,
    IMAGE_PULL_POLICY,
    RUN_AS_GID,
    RUN_AS_UID,
    _quantity,
    container_security_context,
    pod_security_context,
)

CONFIGMAP_NAME = "warmstart-weights-import"
SCRIPT_KEY = "weights_import.pyz"
SCRIPT_VOLUME = "warmstart-weights-import"
SCRIPT_MOUNT = "/opt/warmstart"
CONTAINER = "weights-import"
SCRATCH_VOLUME, SCRATCH_MOUNT = "scratch", "/scratch"
TMP_VOLUME, TMP_MOUNT = "tmp", "/tmp"
TMP_BYTES = 1 * GIB
TOKEN_KEY = "token"
# Non-root: the script needs only to read the image's Python and write its emptyDirs. The
# vLLM images run as root by default but their Python tree is world-readable. The same
# identity as the serving pods (serving.RUN_AS_UID).
RUN_AS_USER = RUN_AS_UID
# Its CPU limit: the copy and its verification are network- and hash-bound, on a shared
# general-purpose node where an unbounded import must not starve its neighbours.
CPU_LIMIT = "4"
# What the import process holds besides its largest JSON parse and the upload parts in flight:
# the interpreter with boto3, botocore and huggingface_hub, s3transfer's threads, and the Hub
# client's download buffers.
BASE_MEMORY_BYTES = 2 * GIB
# A Hub upload holds each part in memory from its read (and hash) until S3 has it: at most the
# transfer threads' count of parts (weights_import/stream.py PartUploads), at the script's defaults.
UPLOAD_PARTS_IN_FLIGHT_BYTES = 16 * 64 * 1024 * 1024
_MEMORY_STEP = 256 * 1024 * 1024


def memory_limit_bytes() -> int:
    """The Job's memory limit, from what the script must parse: its largest JSON document
    (`MAX_JSON_BYTES`, anything larger is refused unread) parsed at the measured worst case of
    `JSON_PARSE_FACTOR` times its size (tests/podside/test_podside_import_faults.py measures
    it), plus the body's bytes and text, on top of BASE_MEMORY_BYTES and the upload parts in
    flight; rounded up to 256 MiB."""
    need = BASE_MEMORY_BYTES + UPLOAD_PARTS_IN_FLIGHT_BYTES + (script_s3.JSON_PARSE_FACTOR + 2) * script_s3.MAX_JSON_BYTES
    return -(-need // _MEMORY_STEP) * _MEMORY_STEP


# Exit codes of the script that no retry can fix (see warmstart/podside/weights_import/main.py).
PERMANENT_EXIT_CODES = (2, 3, 4)
ANNOTATION_SOURCE = f"{ANNOTATION_DOMAIN}/import-source"
ANNOTATION_REVISION = f"{ANNOTATION_DOMAIN}/import-revision"
ANNOTATION_DESTINATION = f"{ANNOTATION_DOMAIN}/import-destination"


def labels(model: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "weights-import",
        "app.kubernetes.io/instance": model,
        "app.kubernetes.io/component": "weights-import",
        "app.kubernetes.io/part-of": "warmstart",
        "app.kubernetes.io/managed-by": "pulumi",
    }


def _plan(m: ServingPlan) -> imports.ImportPlan:
    if m.weights_import is None:
        raise ValueError(f"model {m.name} has no weights import")
    return m.weights_import


def service_account_spec(m: ServingPlan, namespace: Any, role_arn: Any = None) -> dict[str, Any]:
    """The import Job's ServiceAccount; `role_arn` (a string or a Pulumi Input) is its IRSA role."""
    imp = _plan(m)
    meta: dict[str, Any] = {"name": imp.service_account, "namespace": namespace, "labels": labels(m.name)}
    if role_arn is not None:
        meta["annotations"] = {"eks.amazonaws.com/role-arn": role_arn}
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, "automountServiceAccountToken": False}


def token_secret_spec(m: ServingPlan, namespace: Any, token: Any) -> dict[str, Any]:
    """The Hugging Face token as a Secret (`token`: a Pulumi secret Output in a program)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": imports.token_secret_name(m.name), "namespace": namespace, "labels": labels(m.name)},
            "stringData": {TOKEN_KEY: token}}


def _env(m: ServingPlan, imp: imports.ImportPlan, region: str, token_secret: str | None) -> list[dict]:
    values: dict[str, str] = {
        "WARMSTART_MODEL": m.name,
        "WARMSTART_DEST_BUCKET": imp.dest_bucket,
        "WARMSTART_DEST_PREFIX": imp.dest_prefix,
        "WARMSTART_WEIGHTS_GIB": f"{m.weights_bytes / GIB:.6g}",
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        # The root filesystem is read-only: Python's bytecode, HOME and temp files go elsewhere.
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "HOME": TMP_MOUNT,
        "TMPDIR": TMP_MOUNT,
    }
    # The import checks maxModelLen against the model's config.json as vLLM does at start-up
    # (podside/weights_import/context_length.py), with the --hf-overrides the engine gets.
    if m.max_model_len is not None:
        values["WARMSTART_MAX_MODEL_LEN"] = str(m.max_model_len)
        overrides = context_length.hf_overrides(m.extra_args)
        if overrides is not None:
            values["WARMSTART_HF_OVERRIDES"] = overrides
    if imp.kind == "s3":
        values["WARMSTART_SOURCE_S3"] = imp.source
    else:
        assert imp.hugging_face_repo and imp.revision
        values |= {"WARMSTART_HF_REPO": imp.hugging_face_repo, "WARMSTART_HF_REVISION": imp.revision,
                   "WARMSTART_SCRATCH_DIR": SCRATCH_MOUNT, "HF_HOME": f"{SCRATCH_MOUNT}/hf-home",
                   # The files in flight may hold this much of the emptyDir together, so its sizeLimit
                   # is never reached (decisions/weights_import.py sizes both).
                   "WARMSTART_SCRATCH_BYTES": str(imports.scratch_budget_bytes(imp.scratch_bytes)),
                   "WARMSTART_FILE_PARALLELISM": str(imports.FILE_PARALLELISM),
                   # hf_xet's chunk cache would keep downloaded chunks in HF_HOME beside the files,
                   # outside the budget: off (its setting, read from the environment by hf_xet).
                   "HF_XET_CHUNK_CACHE_SIZE_BYTES": "0",
                   "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    env: list[dict] = [{"name": k, "value": v} for k, v in sorted(values.items())]
    if token_secret is not None and imp.kind == "huggingFace":
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": token_secret, "key": TOKEN_KEY}}})
    return env


def job_spec(m: ServingPlan, namespace: Any, region: str, config_map: str = CONFIGMAP_NAME,
             token_secret: str | None = None) -> dict[str, Any]:
    """The batch/v1 Job that imports one model's weights. `config_map` carries the script;
    `token_secret` names the Secret with the Hugging Face token (None: no token)."""
    imp = _plan(m)
    scratch = imp.scratch_bytes
    volumes: list[dict] = [
        {"name": SCRIPT_VOLUME, "configMap": {"name": config_map, "defaultMode": 0o444}},
        {"name": TMP_VOLUME, "emptyDir": {"sizeLimit": _quantity(TMP_BYTES)}},
    ]
    mounts: list[dict] = [
        {"name": SCRIPT_VOLUME, "mountPath": SCRIPT_MOUNT, "readOnly": True},
        {"name": TMP_VOLUME, "mountPath": TMP_MOUNT},
    ]
    if scratch:
        volumes.append({"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": _quantity(scratch)}})
        mounts.append({"name": SCRATCH_VOLUME, "mountPath": SCRATCH_MOUNT})
    # The scheduler must place the pod where its emptyDirs fit (plus the container's own logs).
    ephemeral = _quantity(scratch + TMP_BYTES + GIB)
    container = {
        "name": CONTAINER,
        "image": m.image,
        "imagePullPolicy": IMAGE_PULL_POLICY,
        "command": ["python3", f"{SCRIPT_MOUNT}/{SCRIPT_KEY}"],
        "env": _env(m, imp, region, token_secret),
        "volumeMounts": mounts,
        # A server-side copy moves no bytes through the pod; a Hub import streams through its
        # scratch disk. The limit is sized from the largest JSON parse (memory_limit_bytes).
        "resources": {"requests": {"cpu": imp.cpu, "memory": "1Gi", "ephemeral-storage": ephemeral},
                      "limits": {"cpu": CPU_LIMIT, "memory": _quantity(memory_limit_bytes())}},
        "securityContext": container_security_context() | {"runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_GID},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pulumi_wait = imp.pulumi_wait_seconds
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": imp.job_name,
            "namespace": namespace,
            "labels": labels(m.name),
            "annotations": {
                ANNOTATION_SOURCE: imp.source,
                ANNOTATION_REVISION: imp.revision or "",
                ANNOTATION_DESTINATION: imp.destination,
                f"{ANNOTATION_DOMAIN}/weights-bytes": str(m.weights_bytes),
                # Let `pulumi up` wait for the Job's own deadline; a failed Job is replaced by the
                # next `up` instead of awaited again.
                "pulumi.com/timeoutSeconds": str(pulumi_wait),
                "pulumi.com/replaceUnready": "true",
            },
        },
        "spec": {
            "backoffLimit": imports.BACKOFF_LIMIT,
            "activeDeadlineSeconds": imp.deadline_seconds,
            "completions": 1,
            "parallelism": 1,
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                                                      "values": list(PERMANENT_EXIT_CODES)}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]},
            "template": {
                # Its node is not consolidated while it copies: the non-GPU pools consolidate
                # underused nodes, and a restarted import re-reads what it had not recorded yet
                # (https://karpenter.sh/docs/concepts/disruption/#pod-level-controls; Auto Mode
                # honours it too, https://docs.aws.amazon.com/eks/latest/userguide/auto-configure-nodes.html).
                "metadata": {"labels": labels(m.name), "annotations": {DO_NOT_DISRUPT: "true"}},
                "spec": {
                    "serviceAccountName": imp.service_account,
                    # It calls S3 (and the Hub), never the Kubernetes API; IRSA brings its own
                    # projected token (serving.deployment_spec says why).
                    "automountServiceAccountToken": False,
                    "restartPolicy": "Never",
                    # Off the GPU nodes: an import needs no GPU (and GPU nodes are tainted).
                    **imp.non_gpu.pod_fields(),
                    "containers": [container],
                    "volumes": volumes,
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": pod_security_context(),
                },
            },
        },
    }
