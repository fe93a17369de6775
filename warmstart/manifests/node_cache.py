"""Node-local model cache: the staging DaemonSet, its RBAC and PriorityClasses, the serving
pod's wiring, warm-spare placeholders and NFD's Helm values, as plain object dicts (pure).

Life cycle (docs/node-cache.md):
- stage: one DaemonSet per (model, GPU pool) runs the model's own image on every node of the
  pool (so a new image is pulled there before the Deployment rolls), copies the weights into
  `<nvme>/weights/<model>/<digest>/` (warmstart/podside/weights_stage.py) and publishes the node
  label `weights.warmstart.io/<model>=<digest>` through an NFD NodeFeature it owns;
- prefer: serving pods get a *preferred* node affinity to that label, never a required one;
- fall back: the serving pod's `weights-select` init container picks the local copy only when
  it is complete, else the S3 URI (warmstart/podside/weights_select.py);
- replace: a new digest is a new directory; the old one is removed once the new one is
  complete, the previous one kept for a rollback;
- evict: the label goes with the staging pod (ownerReference), or when the copy disappears.

Every container runs as `serving.RUN_AS_UID` with `serving.container_security_context()`
(read-only root, no capabilities) and `IfNotPresent`, except `weights-owner`, which hands the
kubelet-created node directory to that UID (`weights_owner_container`). Only the staging pods
mount a Kubernetes API token (the NodeFeature calls); `staging_network_policy` and
`placeholder_network_policy` restrict their traffic (docs/security.md).
"""

from __future__ import annotations

from typing import Any

from .. import versions
from ..decisions import placement
from ..decisions.node_cache import CONTAINER_WEIGHTS_ROOT, STAGING_PRIORITY, PLACEHOLDER_PRIORITY, \
    container_model_path, node_weights_root, rollout_timeout_seconds
from . import network_policy, pod_scripts
from .serving import (
    ANNOTATION_DOMAIN,
    IMAGE_PULL_POLICY,
    IRSA_ROLE_ANNOTATION,
    RUN_AS_GID,
    RUN_AS_UID,
    PodExtras,
    container_security_context,
    pod_security_context,
)

LABEL_NAMESPACE = "weights.warmstart.io"
NFD_GROUP = "nfd.k8s-sigs.io"
STAGE_SCRIPT = "weights_stage.pyz"
SELECT_SCRIPT = "weights_select.pyz"
STAGE_CONFIGMAP = "warmstart-weights-stage"
SELECT_CONFIGMAP = "warmstart-weights-select"
SCRIPT_MOUNT = "/opt/warmstart-weights"
S5CMD_DIR = "/opt/s5cmd"
WEIGHTS_VOLUME = "node-weights"
CHOICE_VOLUME = "weights-choice"
CHOICE_MOUNT = "/run/warmstart-weights"
MODEL_PATH_FILE = f"{CHOICE_MOUNT}/model-path"
CHOICE_FILE = f"{CHOICE_MOUNT}/choice.json"
SELECT_CONTAINER = "weights-select"
WEIGHTS_OWNER_CONTAINER = "weights-owner"
# Scratch of the read-only staging containers: HOME and TMPDIR of Python and s5cmd. `s5cmd sync`
# sorts the source and destination listings with on-disk temporary files in $TMPDIR
# (github.com/lanrat/extsort, vendored by https://github.com/peak/s5cmd/blob/master/command/sync.go)
# and panics if it cannot write them; the downloads themselves go to a temporary file in the
# destination directory that is then renamed (`storage.Filesystem.CreateTemp`), i.e. under the
# hostPath `<digest>.partial/`, which `weights_stage.verify` cleans.
SCRATCH_VOLUME, SCRATCH_MOUNT = "tmp", "/tmp"
# The registry.k8s.io/pause image's own user: `USER 65535:65535` in
# https://github.com/kubernetes/kubernetes/blob/master/build/pause/Dockerfile; above 10000
# (checkov's CKV_K8S_40) and not group 0.
PAUSE_UID = 65535
STAGING_PRIORITY_CLASS = "warmstart-weights-staging"
PLACEHOLDER_PRIORITY_CLASS = "warmstart-warm-spare"

# Staging uses the node's network and disk, not its GPUs: small requests, no GPU. The CPU limit
# caps a background copy at 4 cores (s5cmd's TLS and writes), so it never takes the cores of a
# serving pod that is loading next to it; the hold container restages too, so the same limit.
STAGE_REQUESTS = {"cpu": "500m", "memory": "512Mi"}
STAGE_LIMITS = {"cpu": "4", "memory": "1Gi"}
SMALL_LIMITS = {"cpu": "500m", "memory": "128Mi"}


def label_key(model: str) -> str:
    """The node label a complete copy of `model` publishes (value: the digest)."""
    return f"{LABEL_NAMESPACE}/{model}"


def labels(model: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "warmstart-weights", "app.kubernetes.io/instance": model,
            "app.kubernetes.io/component": component, "app.kubernetes.io/part-of": "warmstart",
            "app.kubernetes.io/managed-by": "pulumi"}


def daemonset_name(model: str, pool: str) -> str:
    return f"{model}-weights-{pool}"


def service_account_name(model: str) -> str:
    """The staging pods' own ServiceAccount: the model's read-only IRSA role for S3, and the
    only identity with NodeFeature rights (the serving pods' ServiceAccount has none)."""
    return f"{model}-weights"


def staging_selector(model: str) -> dict[str, str]:
    """The labels every staging pod of `model` carries, whatever its pool."""
    return {k: v for k, v in labels(model, "weights-staging").items()
            if k in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component")}


def service_account_spec(model: str, namespace: Any, role_arn: Any = None) -> dict[str, Any]:
    """`role_arn` (a string or a Pulumi Input): the model's read-only IRSA role for the staging
    copy, whose trust policy names exactly `<namespace>/<model>-weights`.

    No token by default: the staging pod spec asks for one itself (a pod's
    `automountServiceAccountToken` wins over its ServiceAccount's,
    https://kubernetes.io/docs/tasks/configure-pod-container/configure-service-account/#opt-out-of-api-credential-automounting),
    so no other pod that names this ServiceAccount gets its NodeFeature rights by accident."""
    meta: dict[str, Any] = {"name": service_account_name(model), "namespace": namespace,
                            "labels": labels(model, "weights-staging")}
    if role_arn is not None:
        meta["annotations"] = {IRSA_ROLE_ANNOTATION: role_arn}
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, "automountServiceAccountToken": False}


def role_spec(model: str, namespace: Any) -> dict[str, Any]:
    """Least privilege for the label: NodeFeature objects in this namespace only; create and
    patch (server-side apply creates or updates in one call), delete on the way out. No get,
    list or watch, nothing on Nodes."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": service_account_name(model), "namespace": namespace,
                     "labels": labels(model, "weights-staging")},
        "rules": [{"apiGroups": [NFD_GROUP], "resources": ["nodefeatures"], "verbs": ["create", "delete", "patch"]}],
    }


def role_binding_spec(model: str, namespace: Any) -> dict[str, Any]:
    name = service_account_name(model)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(model, "weights-staging")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }


def priority_class_specs() -> list[dict[str, Any]]:
    """Below every serving pod (default priority 0), never preempting anything themselves.
    Placeholders sit below the staging pods, so a spare node keeps its copy when its
    placeholder is preempted (https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/)."""
    common = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "globalDefault": False,
              "preemptionPolicy": "Never"}
    return [
        common | {"metadata": {"name": STAGING_PRIORITY_CLASS, "labels": labels("all", "weights-staging")},
                  "value": STAGING_PRIORITY,
                  "description": "warmstart weights staging: yields to serving pods, preempts nothing"},
        common | {"metadata": {"name": PLACEHOLDER_PRIORITY_CLASS, "labels": labels("all", "warm-spare")},
                  "value": PLACEHOLDER_PRIORITY,
                  "description": "warmstart warm spare placeholders: preempted by any serving pod"},
    ]


def _script_env(model: str, source: str, digest: str, region: str) -> dict[str, str]:
    return {"WARMSTART_WEIGHTS_SOURCE": source, "WARMSTART_WEIGHTS_DIGEST": digest,
            "WARMSTART_WEIGHTS_ROOT": CONTAINER_WEIGHTS_ROOT, "AWS_REGION": region, "AWS_DEFAULT_REGION": region,
            "WARMSTART_LABEL": label_key(model)}


def _downward(*fields: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}} for n, f in fields]


def weights_owner_container(image: str) -> dict[str, Any]:
    """Hands the model's node weights directory to RUN_AS_UID, before anything writes it.

    Kubelet creates a `DirectoryOrCreate` hostPath as root, mode 0755
    (https://kubernetes.io/docs/concepts/storage/volumes/#hostpath-volume-types), and fsGroup
    does not apply to hostPath, so the non-root stager could not create `<digest>.partial/` there.
    Unlike the compile cache's owner this one is not recursive and needs CAP_CHOWN only: no
    root-run pod ever wrote under this directory (everything below it is created by RUN_AS_UID),
    and a recursive walk could race a copy that renames files beside it and fail the pod. Runs in
    the model's own image (no extra pull); `-h`: a symbolic link is changed itself, never its
    target."""
    return {
        "name": WEIGHTS_OWNER_CONTAINER, "image": image, "imagePullPolicy": IMAGE_PULL_POLICY,
        "command": ["chown", "-h", f"{RUN_AS_UID}:{RUN_AS_GID}", CONTAINER_WEIGHTS_ROOT],
        "volumeMounts": [{"name": WEIGHTS_VOLUME, "mountPath": CONTAINER_WEIGHTS_ROOT}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0,
                            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _weights_volume(nvme_mount: str, model: str) -> dict[str, Any]:
    return {"name": WEIGHTS_VOLUME, "hostPath": {"path": node_weights_root(nvme_mount, model), "type": "DirectoryOrCreate"}}


def daemonset_spec(*, model: str, pool: str, namespace: Any, image: str, source: str, digest: str,
                   nvme_mount: str, region: str, deadline_seconds: int,
                   script_config_map: str = STAGE_CONFIGMAP, copier_image: str = versions.S5CMD_IMAGE,
                   content_check: str = "auto") -> dict[str, Any]:
    """The staging DaemonSet of one model on one pool; `image` is the model's own image,
    `copier_image` the s5cmd image (through the same pull-through cache as the model's, if any),
    `content_check` the stager's WARMSTART_CONTENT_CHECK (rendered, so `up` keeps it)."""
    name = daemonset_name(model, pool)
    env_values = _script_env(model, source, digest, region) | {
        "WARMSTART_S5CMD": f"{S5CMD_DIR}/s5cmd", "WARMSTART_STAGE_DEADLINE_S": str(deadline_seconds),
        "WARMSTART_CONTENT_CHECK": content_check,
        # Read-only root filesystem, a UID outside /etc/passwd: HOME and temp files on the
        # scratch emptyDir, no bytecode next to the script.
        "HOME": SCRATCH_MOUNT, "TMPDIR": SCRATCH_MOUNT, "PYTHONDONTWRITEBYTECODE": "1"}
    env = [{"name": k, "value": v} for k, v in sorted(env_values.items())] + _downward(
        ("NODE_NAME", "spec.nodeName"), ("POD_NAME", "metadata.name"), ("POD_UID", "metadata.uid"),
        ("POD_NAMESPACE", "metadata.namespace"))
    mounts = [{"name": WEIGHTS_VOLUME, "mountPath": CONTAINER_WEIGHTS_ROOT},
              {"name": "scripts", "mountPath": SCRIPT_MOUNT, "readOnly": True},
              {"name": "s5cmd", "mountPath": S5CMD_DIR, "readOnly": True},
              {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_MOUNT}]
    command = ["python3", f"{SCRIPT_MOUNT}/{STAGE_SCRIPT}"]
    secure = container_security_context()
    pod_labels = labels(model, "weights-staging") | {f"{ANNOTATION_DOMAIN}/pool": pool}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": pod_labels,
                     "annotations": {f"{ANNOTATION_DOMAIN}/weights-digest": digest,
                                     # pulumi-kubernetes awaits the rollout this long.
                                     "pulumi.com/timeoutSeconds": str(rollout_timeout_seconds(deadline_seconds))}},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "warmstart-weights",
                                         "app.kubernetes.io/instance": model, f"{ANNOTATION_DOMAIN}/pool": pool}},
            # Every node stages at once: each copy is independent, and the Deployment waits for all.
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": pod_labels,
                             "annotations": {f"{ANNOTATION_DOMAIN}/weights-stage-script-sha256":
                                             pod_scripts.script_digest(STAGE_SCRIPT)}},
                "spec": {
                    "serviceAccountName": service_account_name(model),
                    # The one pod of the node cache that calls the Kubernetes API (its
                    # NodeFeature: create/patch/delete in this namespace only); the
                    # ServiceAccount itself mounts no token (docs/security.md, CKV_K8S_38).
                    "automountServiceAccountToken": True,
                    "priorityClassName": STAGING_PRIORITY_CLASS,
                    "nodeSelector": {placement.NODEPOOL_LABEL: pool},
                    "tolerations": [{"key": placement.GPU_TAINT_KEY, "operator": "Exists",
                                     "effect": placement.GPU_TAINT_EFFECT}],
                    "initContainers": [
                        # First: nothing else writes the node directory before it is ours.
                        weights_owner_container(image),
                        {"name": "s5cmd", "image": copier_image, "imagePullPolicy": IMAGE_PULL_POLICY,
                         # The image is alpine with the static binary at /s5cmd
                         # (https://github.com/peak/s5cmd/blob/master/Dockerfile); busybox `cp`
                         # runs as any UID and writes only the emptyDir.
                         "command": ["cp", versions.S5CMD_BINARY_IN_IMAGE, f"{S5CMD_DIR}/s5cmd"],
                         "volumeMounts": [{"name": "s5cmd", "mountPath": S5CMD_DIR}],
                         "resources": {"requests": {"cpu": "50m", "memory": "32Mi"},
                                       "limits": {"cpu": "200m", "memory": "64Mi"}},
                         "securityContext": secure},
                        {"name": "weights-stage", "image": image, "imagePullPolicy": IMAGE_PULL_POLICY,
                         "command": [*command, "stage"], "env": env,
                         "volumeMounts": mounts, "resources": {"requests": STAGE_REQUESTS, "limits": STAGE_LIMITS},
                         "securityContext": secure, "terminationMessagePolicy": "FallbackToLogsOnError"},
                    ],
                    "containers": [
                        # The model's image, kept running: pulled on every node before the
                        # Deployment rolls; it labels the node, watches the copy, retries.
                        {"name": "weights-hold", "image": image, "imagePullPolicy": IMAGE_PULL_POLICY,
                         "command": [*command, "hold"], "env": env, "volumeMounts": mounts,
                         "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": STAGE_LIMITS},
                         "securityContext": secure},
                    ],
                    "volumes": [
                        _weights_volume(nvme_mount, model),
                        {"name": "scripts", "configMap": {"name": script_config_map}},
                        {"name": "s5cmd", "emptyDir": {"sizeLimit": "64Mi"}},
                        {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
                    ],
                    # The hold container unlabels the node on SIGTERM.
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": pod_security_context(),
                },
            },
        },
    }


def serving_affinity(model: str, digest: str) -> dict[str, Any]:
    """Preferred, never required: a pod lands on any node of its pool and streams from S3
    when no node holds the copy."""
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "preference": {"matchExpressions": [{"key": label_key(model), "operator": "In", "values": [digest]}]},
    }]}}


def serving_extras(*, model: str, source: str, digest: str, image: str, nvme_mount: str,
                   pause_seconds: int, script_config_map: str = SELECT_CONFIGMAP) -> PodExtras:
    """The serving pod's `weights-select` init container and volumes, its preference for the
    nodes that hold the weights (`serving_affinity`) and its vLLM command (`serving_command`).
    Merge it before the
    compile-cache extras (`compile_cache_extras(..., weights_choice=True)`): the restore reads
    CHOICE_FILE for its `weights` key factor. The vLLM container mounts WEIGHTS_VOLUME read-only
    at CONTAINER_WEIGHTS_ROOT (volume_mounts here) and starts with `serving_command()`.

    `pause_seconds` > 0: a pod that streams from S3 asks the node's copier to pause that long by
    writing `<root>/.loading/<pod uid>.json`, so the picker mounts the node directory read-write
    and `weights_owner_container` goes first (this pod may reach a new node before its staging
    pod does, and the directory is then still root's). 0: no pause requests, a read-only mount,
    no owner."""
    pauses = pause_seconds > 0
    env = [{"name": k, "value": v} for k, v in sorted({
        "WARMSTART_WEIGHTS_SOURCE": source, "WARMSTART_WEIGHTS_DIGEST": digest,
        "WARMSTART_WEIGHTS_ROOT": CONTAINER_WEIGHTS_ROOT, "WARMSTART_WEIGHTS_PATH": container_model_path(digest),
        "WARMSTART_WEIGHTS_OUT": CHOICE_MOUNT, "WARMSTART_LOADING_HOLD_S": str(max(0, pause_seconds)),
        "PYTHONDONTWRITEBYTECODE": "1"}.items())]
    env += _downward(("POD_UID", "metadata.uid"))
    weights_mount: dict[str, Any] = {"name": WEIGHTS_VOLUME, "mountPath": CONTAINER_WEIGHTS_ROOT}
    if not pauses:
        weights_mount["readOnly"] = True
    select = {
        "name": SELECT_CONTAINER, "image": image, "imagePullPolicy": IMAGE_PULL_POLICY,
        "command": ["python3", f"{SCRIPT_MOUNT}/{SELECT_SCRIPT}"],
        "env": env,
        "volumeMounts": [weights_mount,
                         {"name": "weights-select-script", "mountPath": SCRIPT_MOUNT, "readOnly": True},
                         {"name": CHOICE_VOLUME, "mountPath": CHOICE_MOUNT}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
        "securityContext": container_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return PodExtras(
        init_containers=((weights_owner_container(image),) if pauses else ()) + (select,),
        volumes=(_weights_volume(nvme_mount, model),
                 {"name": "weights-select-script", "configMap": {"name": script_config_map}},
                 {"name": CHOICE_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}),
        volume_mounts=({"name": WEIGHTS_VOLUME, "mountPath": CONTAINER_WEIGHTS_ROOT, "readOnly": True},
                       {"name": CHOICE_VOLUME, "mountPath": CHOICE_MOUNT, "readOnly": True}),
        pod_annotations={f"{ANNOTATION_DOMAIN}/weights-digest": digest,
                         f"{ANNOTATION_DOMAIN}/weights-select-script-sha256": pod_scripts.script_digest(SELECT_SCRIPT)},
        # Preferred, never required: with no node holding the copy the pod streams from S3.
        affinity=serving_affinity(model, digest),
        vllm_command=serving_command,
    )


def compile_cache_choice_wiring() -> tuple[dict[str, str], dict[str, Any]]:
    """(env var, volume mount) the compile-cache restore AND publish containers need for their
    `weights` key factor: the picker's CHOICE_FILE, mounted read-only from CHOICE_VOLUME (which
    `serving_extras` defines). Both containers must get both, so they compute one key
    (the publisher prefers the restore's saved factors, but recomputes them without them)."""
    return ({"name": "WARMSTART_WEIGHTS_CHOICE_FILE", "value": CHOICE_FILE},
            {"name": CHOICE_VOLUME, "mountPath": CHOICE_MOUNT, "readOnly": True})


def serving_command(vllm_args: list[str]) -> tuple[list[str], list[str]]:
    """(command, args) for the vLLM container: the model path comes from the picker's file
    (falling back to the S3 URI, `vllm_args[0]`, if the file is missing); the rest unchanged.
    vLLM streams a local directory with the same `--load-format=runai_streamer`."""
    source, rest = vllm_args[0], list(vllm_args[1:])
    script = f'exec vllm serve "$(cat {MODEL_PATH_FILE} 2>/dev/null || echo {source})" "$@"'
    return ["sh", "-c", script, "vllm"], rest


def placeholder_name(pool: str) -> str:
    return f"{pool}-warm-spare"


def placeholder_selector(pool: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "warmstart-warm-spare", "app.kubernetes.io/instance": pool}


def placeholder_spec(*, pool: str, namespace: Any, warm_nodes: int, instance_type: str, gpus: int) -> dict[str, Any]:
    """`warmNodes` pause pods, one per node (required anti-affinity), each holding a whole node's
    GPUs of `instance_type`: Karpenter / Auto Mode keep that many spare nodes, the staging
    DaemonSet fills them, and any serving pod preempts a placeholder to land there; the
    placeholder then goes Pending and a replacement spare is launched."""
    name = placeholder_name(pool)
    sel = placeholder_selector(pool)
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": sel | {"app.kubernetes.io/part-of": "warmstart"},
                     # Its pods may stay Pending (no capacity): never hold `pulumi up` on them.
                     "annotations": {"pulumi.com/skipAwait": "true"}},
        "spec": {
            "replicas": warm_nodes,
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": sel},
                "spec": {
                    # No Kubernetes API, no network (placeholder_network_policy): it only holds GPUs.
                    "automountServiceAccountToken": False,
                    "priorityClassName": PLACEHOLDER_PRIORITY_CLASS,
                    "nodeSelector": {placement.NODEPOOL_LABEL: pool, placement.INSTANCE_TYPE_LABEL: instance_type},
                    "tolerations": [{"key": placement.GPU_TAINT_KEY, "operator": "Exists",
                                     "effect": placement.GPU_TAINT_EFFECT}],
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": sel}, "topologyKey": "kubernetes.io/hostname"}]}},
                    "containers": [{"name": "pause", "image": versions.PAUSE_IMAGE,
                                    "imagePullPolicy": IMAGE_PULL_POLICY,
                                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi",
                                                               placement.GPU_RESOURCE: str(gpus)},
                                                  "limits": {"cpu": "50m", "memory": "16Mi",
                                                             placement.GPU_RESOURCE: str(gpus)}},
                                    "securityContext": container_security_context()}],
                    "terminationGracePeriodSeconds": 0,
                    # The pause image's own non-root user (PAUSE_UID); it writes nothing.
                    "securityContext": {"runAsNonRoot": True, "runAsUser": PAUSE_UID, "runAsGroup": PAUSE_UID,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                },
            },
        },
    }


def staging_network_policy(model: str, namespace: Any) -> dict[str, Any]:
    """The staging pods of `model` (every pool): nothing connects to them; they send DNS and
    HTTPS only (S3 and STS for the copy, the API server for the NodeFeature, on TCP 443)."""
    return network_policy.egress_only_network_policy(f"{model}-weights", namespace, staging_selector(model),
                                                     labels(model, "weights-staging"))


def placeholder_network_policy(pool: str, namespace: Any) -> dict[str, Any]:
    """The warm-spare placeholders of `pool`: no traffic at all, either way."""
    return network_policy.deny_all_network_policy(
        placeholder_name(pool), namespace, placeholder_selector(pool),
        placeholder_selector(pool) | {"app.kubernetes.io/part-of": "warmstart", "app.kubernetes.io/managed-by": "pulumi"})


def nfd_values(non_gpu: placement.NonGpuPlacement = placement.ANYWHERE_OFF_GPU,
               label_namespaces: tuple[str, ...] = (LABEL_NAMESPACE,)) -> dict[str, Any]:
    """node-feature-discovery chart values: only nfd-master (it turns NodeFeature objects into
    labels) and its garbage collector, on the platform's non-GPU nodes (`non_gpu`); no worker,
    no topology updater. `extraLabelNs` keeps the label namespace allowed even if a stack denies
    others (chart `master.extraLabelNs`, `master.nodeSelector`/`tolerations`/`affinity`, the same
    under `gc`,
    https://github.com/kubernetes-sigs/node-feature-discovery/blob/v0.19.0/deployment/helm/node-feature-discovery/values.yaml)."""
    where = non_gpu.pod_fields()
    return {"master": {"enable": True, "extraLabelNs": sorted(label_namespaces), **where},
            "worker": {"enable": False}, "topologyUpdater": {"enable": False}, "gc": {"enable": True, **where}}
