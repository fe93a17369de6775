"""The serving pod's start-up NVMe check: an init container that reports, instead of silently
accepting, a compile-cache directory that is not on the node's local NVMe (field notes 4).

The script (warmstart/podside/nvme_check.py, standard library only) ships in a ConfigMap and
runs in the model's own vLLM image, so no extra image is pulled. `nvme_check_extras()` is the
pod wiring (pure); the stack ships the script with `podside.PodScript`.
"""

from __future__ import annotations

from ..decisions import placement
from ..plan import ModelPlan
from ..plan_cluster import ClusterPlan, PoolPlan
from . import podside
from .gpu_pools import nvme_check_min_bytes
from .serving import ANNOTATION_DOMAIN, COMPILE_CACHE_VOLUME, PodExtras

CONFIGMAP_NAME = "warmstart-nvme-check"
SCRIPT_KEY = "nvme_check.py"
SCRIPT_VOLUME = "warmstart-nvme-check"
SCRIPT_MOUNT = "/opt/warmstart"
INIT_CONTAINER = "nvme-check"
# Changing the script changes this annotation, so pods roll onto the new version.
SCRIPT_ANNOTATION = f"{ANNOTATION_DOMAIN}/nvme-check-sha256"


def script_source() -> str:
    return podside.script_source(SCRIPT_KEY)


def nvme_check_extras(m: ModelPlan, pool: PoolPlan, cluster: ClusterPlan) -> PodExtras:
    """The init container (and its script volume) for one model; nothing when the model keeps
    no compile cache on the node."""
    if not m.compile_cache:
        return PodExtras()
    env = {
        "WARMSTART_NVME_CHECK_PATH": placement.COMPILE_CACHE_MOUNT,
        "WARMSTART_NVME_CHECK_MODE": cluster.nvme_check,
        "WARMSTART_NVME_MIN_BYTES": str(nvme_check_min_bytes(pool)),
        "WARMSTART_NVME_HOST_PATH": f"{m.compile_cache_host_path}/{m.name}",
    }
    init = {
        "name": INIT_CONTAINER,
        "image": m.image,
        "command": ["python3", f"{SCRIPT_MOUNT}/{SCRIPT_KEY}"],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
        "volumeMounts": [
            {"name": COMPILE_CACHE_VOLUME, "mountPath": placement.COMPILE_CACHE_MOUNT, "readOnly": True},
            {"name": SCRIPT_VOLUME, "mountPath": SCRIPT_MOUNT, "readOnly": True},
        ],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
        # The reason of a refused start shows in `kubectl describe pod`.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return PodExtras(
        init_containers=(init,),
        volumes=({"name": SCRIPT_VOLUME, "configMap": {"name": CONFIGMAP_NAME}},),
        pod_annotations={SCRIPT_ANNOTATION: podside.script_digest(SCRIPT_KEY)},
    )
