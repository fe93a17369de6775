"""Cross-node compile-cache pre-warm: the pod wiring around warmstart/podside/compile_cache.py.

Per node, the cache lives on the NVMe hostPath the serving pod already mounts. Across nodes:
- a `compile-cache-restore` init container runs before vLLM and, when the node lacks the
  artifacts for this model's key, restores them from the compile-cache bucket, so the first pod
  on a new node does not compile (AWS measured 65 s -> 16 s;
  https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html#model-loading-torch-compile-new-nodes);
- a `compile-cache-publish` native sidecar waits until vLLM answers /health (compile done) and
  publishes the artifacts once, with a conditional write.
Both always exit 0: a cache problem costs a compile, never a crash loop. `compile_cache_extras()`
is the wiring (pure); the script ships in a ConfigMap (`pod_scripts.config_map_spec`).
"""

from __future__ import annotations

from typing import Any

from ..decisions import cachekey, placement
from ..plan.records import ServingPlan
from . import node_cache, pod_scripts
from .serving import (
    ANNOTATION_DOMAIN,
    COMPILE_CACHE_VOLUME,
    IMAGE_PULL_POLICY,
    TMP_MOUNT,
    TMP_VOLUME,
    PodExtras,
    container_security_context,
    vllm_args,
)

# The ConfigMap a namespace shares when one PodScript ships the script for every model in it.
CONFIGMAP_NAME = "warmstart-compile-cache"
SCRIPT_KEY = "compile_cache.pyz"
SCRIPT_VOLUME = "warmstart-compile-cache"
SCRIPT_MOUNT = "/opt/warmstart"
# Shared between the restore init container (which sees the GPU) and the publish sidecar (which
# requests none): the key the init container computed, so both use the same one.
STATE_VOLUME = "compile-cache-state"
STATE_MOUNT = "/run/warmstart"
RESTORE_CONTAINER = "compile-cache-restore"
PUBLISH_CONTAINER = "compile-cache-publish"
SCRIPT_ANNOTATION = f"{ANNOTATION_DOMAIN}/compile-cache-script-sha256"


def _env(m: ServingPlan, bucket: Any, region: str) -> list[dict]:
    values: dict[str, Any] = {
        "WARMSTART_CACHE_DIR": placement.COMPILE_CACHE_MOUNT,
        "WARMSTART_CACHE_BUCKET": bucket,
        "WARMSTART_CACHE_PREFIX": cachekey.cache_key_prefix(m.name),
        "WARMSTART_MODEL": m.name,
        "WARMSTART_TP": str(m.tensor_parallel_size),
        "WARMSTART_IMAGE": m.image,
        "WARMSTART_COMPILE_FINGERPRINT": cachekey.compile_fingerprint(
            m.image, m.source, m.tensor_parallel_size, vllm_args(m)),
        "WARMSTART_STARTUP_PLAN_FINGERPRINT": cachekey.startup_plan_fingerprint(vllm_args(m)),
        "WARMSTART_STATE_FILE": f"{STATE_MOUNT}/key.json",
        "WARMSTART_HEALTH_URL": f"http://127.0.0.1:{m.serving_port}/health",
        # The first start of a large model may take its whole start-up budget to get healthy.
        "WARMSTART_HEALTH_TIMEOUT_S": str(m.startup_budget_seconds * 2),
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        # Read-only root filesystem, UID outside /etc/passwd: HOME and temp files on the
        # pod's /tmp emptyDir, no bytecode next to the script.
        "HOME": TMP_MOUNT,
        "TMPDIR": TMP_MOUNT,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env = [{"name": k, "value": v} for k, v in sorted(values.items())]
    env.append({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    return env


# The restore's guard (warmstart/podside/compile_cache_startup_plan.py, plan_folder) makes a node
# folder per memory setting, `vllm/startup_plan/<first 16 hex of its fingerprint>`; mounted as
# vLLM's $VLLM_CACHE_ROOT/startup_plan ($XDG_CACHE_HOME/vllm, serving.vllm_env), vLLM reads and
# saves only that setting's plans. Only with the restore container: it creates the folder as the
# pod's user before vLLM starts (a subPath the kubelet creates is root's, and vLLM could not save).
STARTUP_PLAN_FOLDER_CHARS = 16


def startup_plan_mount(m: ServingPlan) -> dict[str, Any]:
    """The vLLM container's mount of its memory setting's startup-plan folder on the node."""
    fingerprint = cachekey.startup_plan_fingerprint(vllm_args(m))
    return {"name": COMPILE_CACHE_VOLUME, "mountPath": f"{placement.COMPILE_CACHE_MOUNT}/vllm/startup_plan",
            "subPath": f"vllm/startup_plan/{fingerprint[:STARTUP_PLAN_FOLDER_CHARS]}"}


def compile_cache_extras(m: ServingPlan, bucket: Any, region: str, config_map: str = CONFIGMAP_NAME,
                         weights_choice: bool = False) -> PodExtras:
    """Restore/publish wiring for one model; nothing for a model without the compile cache or
    without a bucket. `bucket` is the cache bucket's name (a string or a Pulumi Input);
    `config_map` the ConfigMap that carries the script. `weights_choice`: the model has the
    node cache, so both containers read the picker's choice file (the `weights` key factor;
    merge `node_cache.serving_extras` before these extras, it defines the volume)."""
    if not m.compile_cache or bucket is None:
        return PodExtras()
    env = _env(m, bucket, region)
    mounts = [
        # Read-write for both: the node lock, markers and temp archives live in the cache dir.
        {"name": COMPILE_CACHE_VOLUME, "mountPath": placement.COMPILE_CACHE_MOUNT},
        {"name": SCRIPT_VOLUME, "mountPath": SCRIPT_MOUNT, "readOnly": True},
        {"name": STATE_VOLUME, "mountPath": STATE_MOUNT},
        # The serving pod's /tmp emptyDir (serving.deployment_spec defines it).
        {"name": TMP_VOLUME, "mountPath": TMP_MOUNT},
    ]
    if weights_choice:
        choice_env, choice_mount = node_cache.compile_cache_choice_wiring()
        env.append(choice_env)
        mounts.append(choice_mount)
    # What both containers share: the script, its inputs and the cache they work on.
    common = {
        "image": m.image,
        "imagePullPolicy": IMAGE_PULL_POLICY,
        "env": env,
        "volumeMounts": mounts,
        # Non-root (the pod's UID owns the cache directory, serving.cache_owner_container), no
        # capabilities, read-only root: the script writes only its volumes.
        "securityContext": container_security_context(),
    }
    command = ["python3", f"{SCRIPT_MOUNT}/{SCRIPT_KEY}"]
    gpus = str(m.tensor_parallel_size)
    restore = {
        "name": RESTORE_CONTAINER,
        "command": [*command, "restore"],
        **common,
        # The same GPUs as vLLM, so nvidia-smi names the real accelerator in the key. Init
        # containers run before the others, so this does not add to the pod's GPU request.
        # No CPU limit: the restore unpacks the archive on the cold start's critical path.
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi", placement.GPU_RESOURCE: gpus},
                      "limits": {"memory": "1Gi", placement.GPU_RESOURCE: gpus}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    publish = {
        "name": PUBLISH_CONTAINER,
        "command": [*command, "publish"],
        **common,
        # A native sidecar (restartPolicy Always, Kubernetes >= 1.29): it runs beside vLLM for
        # the pod's life and never holds up its termination or its Ready condition.
        "restartPolicy": "Always",
        # A CPU limit: it packs its archive while vLLM serves, and must not take vLLM's cores.
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
    }
    return PodExtras(
        volume_mounts=(startup_plan_mount(m),),
        init_containers=(restore, publish),
        volumes=({"name": SCRIPT_VOLUME, "configMap": {"name": config_map}},
                 {"name": STATE_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}),
        # A new script rolls the pods onto it.
        pod_annotations={SCRIPT_ANNOTATION: pod_scripts.script_digest(SCRIPT_KEY)},
    )
