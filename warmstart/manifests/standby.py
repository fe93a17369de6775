"""The standby actuator of one model as plain Kubernetes object dicts (pure).

From an ActuatorPlan (warmstart/decisions/standby.py): a ServiceAccount, a Role that may only
list its model's pods and patch them (the deletion-cost annotation, and the
`warmstart.io/engine` label that takes a pod out of the routers before its engine sleeps) and
its RoleBinding (and `get`/`patch` on the model Deployment's scale subresource, by name: a wake
raises its replicas), a one-pod Deployment on the non-GPU nodes running
warmstart/podside/standby/ from its ConfigMap, the Service KEDA reads the actuator's pods figure
from, and the NetworkPolicy fencing the actuator (it accepts KEDA's operator alone, on the
figure's port; it sends only to the model's vLLM pods, DNS and the Kubernetes API). The serving pods' own policy (manifests/network_policy.py,
`actuator`) admits it to their serving port beside the routers, no client: vLLM's dev routes (sleep, wake, /collective_rpc, ...) that standby needs are never a
client's to call, and SMG forwards none of them (docs/scale-out.md).

Why the router's image: it has python3, it is already on the non-GPU nodes where the routers run
(no pull of the multi-GiB vLLM image onto a system node), and the script needs the standard
library only.
"""

from __future__ import annotations

from typing import Any

from .. import versions
from ..decisions import routing
from ..decisions.standby import ACTUATOR_REQUESTS, FIGURE_PORT, WAKE_HOLD_SECONDS, ActuatorPlan
from . import network_policy, pod_scripts, serving

CONFIGMAP_NAME = "warmstart-standby"
SCRIPT_KEY = "standby.pyz"
SCRIPT_MOUNT = "/opt/warmstart-standby"
NAME = "standby-actuator"
IMAGE = versions.SMG_IMAGE
# The router image's user (smg-project/smg docker/Dockerfile: `useradd --uid 65532 smg`).
RUN_AS_USER = 65532
TMP_VOLUME, TMP_MOUNT = "tmp", "/tmp"
HEARTBEAT = f"{TMP_MOUNT}/heartbeat"
# The script's digest on the pod template: a new script rolls the actuator (a ConfigMap change alone
# restarts nothing, https://kubernetes.io/docs/concepts/configuration/configmap/#mounted-configmaps-are-updated-automatically).
SCRIPT_ANNOTATION = f"{serving.ANNOTATION_DOMAIN}/standby-sha256"
# Restart the actuator when its loop has not turned for this long (30 periods).
HEARTBEAT_MAX_AGE_SECONDS = 30
FIGURE_PORT_NAME = "figure"
_LIVENESS = (
    "import os,sys,time\n"
    "sys.exit(0 if time.time()-os.stat(sys.argv[1]).st_mtime<float(sys.argv[2]) else 1)\n"
)


def labels(model: str) -> dict[str, str]:
    """The actuator pod's labels; the first two are its selector."""
    return {"app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": model,
            "app.kubernetes.io/component": NAME, "app.kubernetes.io/part-of": "warmstart"}


def selector(model: str) -> dict[str, str]:
    return {k: v for k, v in labels(model).items() if k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}


def _meta(p: ActuatorPlan, name: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name or p.name, "namespace": p.namespace, "labels": labels(p.model), **extra}


def _label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def service_account_spec(p: ActuatorPlan) -> dict[str, Any]:
    # The actuator lists its model's pods, so its pod mounts the token.
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(p), "automountServiceAccountToken": True}


def role_spec(p: ActuatorPlan) -> dict[str, Any]:
    """List the namespace's pods (the script filters by the model's selector: RBAC cannot scope a
    list to labels) and patch them, for the deletion cost and the routing label
    (serving.ENGINE_LABEL); no get, watch, create or delete. Read and raise the replicas of the
    model's own Deployment, by name, through its scale subresource only (a wake starts the woken
    sleeper's replacement at once): nothing of the Deployment's spec but its replicas."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(p),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
                      {"apiGroups": ["apps"], "resources": ["deployments/scale"],
                       "resourceNames": [p.deployment_name], "verbs": ["get", "patch"]}]}


def role_binding_spec(p: ActuatorPlan) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(p),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": p.name},
            "subjects": [{"kind": "ServiceAccount", "name": p.name, "namespace": p.namespace}]}


def container_args(p: ActuatorPlan) -> list[str]:
    return [f"{SCRIPT_MOUNT}/{SCRIPT_KEY}", "--model", p.model, "--namespace", p.namespace,
            "--selector", _label_selector(serving.selector(p.model)), "--port", str(serving.HTTP_PORT),
            "--standby", str(p.standby), "--min-awake", str(p.min_awake), "--sleep-level", str(p.sleep_level),
            "--target-waiting", f"{p.target_waiting:g}", "--awake-idle-seconds", str(p.awake_idle_seconds),
            "--period", f"{p.period_seconds:g}", "--heartbeat", HEARTBEAT,
            "--figure-port", str(FIGURE_PORT), "--wake-hold-seconds", str(WAKE_HOLD_SECONDS),
            "--deployment", p.deployment_name,
            *(["--max-pods", str(p.max_pods)] if p.max_pods else []),
            *(["--target-requests", f"{p.target_requests:g}"] if p.target_requests else []),
            *(["--front-queue-selector", _label_selector(network_policy.router_selector(p.model)),
               "--front-queue-port", str(routing.ROUTER_PORT)] if p.front_queue else [])]


def deployment_spec(p: ActuatorPlan, script_config_map: str = CONFIGMAP_NAME) -> dict[str, Any]:
    probe = {"exec": {"command": ["python3", "-c", _LIVENESS, HEARTBEAT, str(HEARTBEAT_MAX_AGE_SECONDS)]},
             "periodSeconds": 10, "timeoutSeconds": 5}
    container = {
        "name": "actuator",
        "image": p.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3"],
        "args": container_args(p),
        "ports": [{"name": FIGURE_PORT_NAME, "containerPort": FIGURE_PORT, "protocol": "TCP"}],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}, {"name": "HOME", "value": TMP_MOUNT}],
        "readinessProbe": probe | {"failureThreshold": 3, "initialDelaySeconds": 2},
        "livenessProbe": probe | {"failureThreshold": 3, "initialDelaySeconds": 10},
        "resources": {"requests": dict(ACTUATOR_REQUESTS), "limits": {"cpu": "500m", "memory": "128Mi"}},
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": TMP_MOUNT},
                         {"name": "script", "mountPath": SCRIPT_MOUNT, "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(p),
        "spec": {
            # One writer of wake and sleep: two actuators would both wake for the same queue.
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector(p.model)},
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {"labels": labels(p.model),
                             "annotations": {SCRIPT_ANNOTATION: pod_scripts.script_digest(SCRIPT_KEY)}},
                "spec": {
                    "serviceAccountName": p.name,
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    # The same non-GPU nodes as the router (GPU nodes are tainted and costly).
                    **p.non_gpu.pod_fields(),
                    "containers": [container],
                    "volumes": [{"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}},
                                {"name": "script", "configMap": {"name": script_config_map}}],
                    "terminationGracePeriodSeconds": 10,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                                        "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}},
                },
            },
        },
    }


def _tcp(port: int) -> dict[str, Any]:
    return {"port": port, "protocol": "TCP"}


def service_spec(p: ActuatorPlan) -> dict[str, Any]:
    """Where KEDA's metrics-api scaler reads the figure (decisions/standby.py `figure_url`). A
    Ready actuator only is an endpoint: while its pod restarts the read fails, and the HPA holds."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(p),
            "spec": {"type": "ClusterIP", "selector": selector(p.model),
                     "ports": [{"name": FIGURE_PORT_NAME, "port": FIGURE_PORT, "targetPort": FIGURE_PORT_NAME,
                                "protocol": "TCP"}]}}


def actuator_network_policy_spec(p: ActuatorPlan) -> dict[str, Any]:
    """The actuator accepts KEDA's operator alone, on the figure's port (a read-only count; the
    metrics-api scaler runs in the operator, which dials the Service: the AWS network policy agent
    judges the ingress at the actuator's pod, after the Service's DNAT, so the operator's pod is
    the peer); it reaches the model's vLLM pods (serving port: the sleep routes, /metrics, the
    warm-up), DNS and the Kubernetes API."""
    egress = [
        {"to": [{"podSelector": {"matchLabels": serving.selector(p.model)}}], "ports": [_tcp(serving.HTTP_PORT)]},
        # The routers' front queues: how many requests they hold (`GET /warmstart/held`).
        *([{"to": [{"podSelector": {"matchLabels": network_policy.router_selector(p.model)}}],
            "ports": [_tcp(routing.ROUTER_PORT)]}] if p.front_queue else []),
        network_policy.egress_rules()[0],
        # The `kubernetes` ClusterIP is judged before DNAT, its endpoints are ENIs in the VPC
        # (the router's rule, manifests/routing.py).
        {"to": [{"ipBlock": {"cidr": c}} for c in p.api_server_cidrs], "ports": [_tcp(443)]},
    ]
    return {"apiVersion": network_policy.API_VERSION, "kind": "NetworkPolicy", "metadata": _meta(p),
            "spec": {"podSelector": {"matchLabels": selector(p.model)}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": [network_policy.keda_operator_peer(p.keda_namespace)],
                                  "ports": [_tcp(FIGURE_PORT)]}],
                     "egress": egress}}


def objects(p: ActuatorPlan, script_config_map: str = CONFIGMAP_NAME) -> list[dict[str, Any]]:
    """Every object of the actuator, policies first (a pod started before its policy runs unfenced)."""
    return [actuator_network_policy_spec(p), service_account_spec(p), role_spec(p), role_binding_spec(p),
            service_spec(p), deployment_spec(p, script_config_map)]
