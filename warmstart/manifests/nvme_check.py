"""The serving pod's start-up NVMe check: an init container that reports, instead of silently
accepting, a compile-cache directory that is not on the node's local NVMe
(https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html#model-loading-nvme-instance-store).

The script (warmstart/podside/nvme_check.py, standard library only) ships in a ConfigMap and
runs in the model's own vLLM image, so no extra image is pulled. `nvme_check_extras()` is the
pod wiring (pure); the script ships in a ConfigMap (`pod_scripts.config_map_spec`).
"""

from __future__ import annotations

from ..decisions import placement
from ..plan.records import ServingPlan
from . import pod_scripts
from .serving import (
    ANNOTATION_DOMAIN,
    COMPILE_CACHE_VOLUME,
    IMAGE_PULL_POLICY,
    PodExtras,
    container_security_context,
)

# The ConfigMap a namespace shares when one PodScript ships the script for every model in it.
CONFIGMAP_NAME = "warmstart-nvme-check"
SCRIPT_KEY = "nvme_check.pyz"
SCRIPT_VOLUME = "warmstart-nvme-check"
SCRIPT_MOUNT = "/opt/warmstart"
INIT_CONTAINER = "nvme-check"
# Changing the script changes this annotation, so pods roll onto the new version.
SCRIPT_ANNOTATION = f"{ANNOTATION_DOMAIN}/nvme-check-sha256"


def nvme_check_min_bytes(min_nvme_bytes: int) -> int:
    """Smallest filesystem that can be the node's NVMe RAID: 80 % of the smallest NVMe total the
    pods can land on (formatting overhead is a few percent). Anything smaller (the 100 GiB root
    volume, Auto Mode's 20-80 GiB EBS data volume) is not the NVMe."""
    return int(min_nvme_bytes * 0.8)


def nvme_check_extras(m: ServingPlan, mode: str, config_map: str = CONFIGMAP_NAME) -> PodExtras:
    """The init container (and its script volume) for one model; nothing when the model keeps
    no compile cache on the node. `mode`: `warn` or `fail` when the cache is not on NVMe. The
    size floor is the model's instance type's NVMe (its pods select that type)."""
    if not m.compile_cache:
        return PodExtras()
    env = {
        "WARMSTART_NVME_CHECK_PATH": placement.COMPILE_CACHE_MOUNT,
        "WARMSTART_NVME_CHECK_MODE": mode,
        "WARMSTART_NVME_MIN_BYTES": str(nvme_check_min_bytes(m.instance.nvme_total_bytes)),
        "WARMSTART_NVME_HOST_PATH": f"{m.compile_cache_host_path}/{m.name}",
        # Read-only root filesystem: no bytecode next to the script.
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    init = {
        "name": INIT_CONTAINER,
        "image": m.image,
        "imagePullPolicy": IMAGE_PULL_POLICY,
        "command": ["python3", f"{SCRIPT_MOUNT}/{SCRIPT_KEY}"],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "volumeMounts": [
            {"name": COMPILE_CACHE_VOLUME, "mountPath": placement.COMPILE_CACHE_MOUNT, "readOnly": True},
            {"name": SCRIPT_VOLUME, "mountPath": SCRIPT_MOUNT, "readOnly": True},
        ],
        # It reads /proc/self/mountinfo, statvfs and /sys, all open to any user: no root, no
        # capability. A small CPU limit: it only reads a few files.
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
        "securityContext": container_security_context(),
        # The reason of a refused start shows in `kubectl describe pod`.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return PodExtras(
        init_containers=(init,),
        volumes=({"name": SCRIPT_VOLUME, "configMap": {"name": config_map}},),
        pod_annotations={SCRIPT_ANNOTATION: pod_scripts.script_digest(SCRIPT_KEY)},
    )
