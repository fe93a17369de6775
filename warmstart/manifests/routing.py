"""The prefix-aware router of one model as plain Kubernetes object dicts (pure).

From a RoutingPlan (warmstart/decisions/routing.py): the router's ServiceAccount, a Role that may
only read pods in the model's namespace and its RoleBinding, a Deployment of SMG (two replicas on
two non-GPU nodes), its PodDisruptionBudget, the Service that is the model's endpoint, optionally
an internal load balancer, and two NetworkPolicies: one fencing the router pods, one letting only
the router (and named scrapers) reach the model's vLLM pods. The ModelRouter component
(components/routing.py) registers them; the tests validate them against the Kubernetes schemas.

Why each choice:
- discovery by the vLLM pods' own selector (`serving.selector`), in their namespace only, so the
  router sees exactly the model's pods and needs a Role, not a ClusterRole;
- the control plane (`POST /workers`, `DELETE /workers/{id}`, `/get_loads`, `/flush_cache`)
  requires a key: SMG serves it on the same port as the OpenAI routes and, without a key, lets
  anyone register a backend URL (its SECURITY POSTURE warning at start-up). The entrypoint passes
  `--control-plane-api-keys` with the key of the Secret `<model>-router-control-plane` when it
  exists, else a random key drawn in the pod that never leaves it: discovery goes through the
  Kubernetes API, so nothing needs the control plane, and no key lives in the Pulumi program;
- the metrics listener binds 127.0.0.1 unless scrapers are named, and then only their CIDRs may
  reach it; the probe listener serves only /liveness, /readiness and /health, so it stays open
  (the kubelet must reach it);
- readiness is SMG's /readiness: ready once one vLLM pod is, not ready while draining, so a
  stopping router leaves the Service before it closes.
"""

from __future__ import annotations

from typing import Any

from ..decisions import routing
from ..decisions.routing import METRICS_PORT, PROBE_PORT, ROUTER_PORT, RoutingPlan
from . import network_policy, pod_scripts, serving
from . import standby_pool as pool_objects

# The image's user (docker/Dockerfile of smg-project/smg: `useradd --uid 65532 smg`).
RUN_AS_USER = 65532
CONTAINER = "router"
# The control-plane key arrives as a file from the optional Secret's volume (a file, not an env
# var, so it never shows in the process environment); the variable names that file.
CONTROL_PLANE_KEY_FILE_ENV = "SMG_CONTROL_PLANE_KEY_FILE"
CONTROL_PLANE_KEY_DIR = "/etc/warmstart/router"
CONTROL_PLANE_VOLUME = "control-plane-key"
CONTROL_PLANE_SECRET_KEY = "key"
# Client-facing port of the model's endpoint: the same as vLLM's, so the URL does not change when
# a router is put in front.
SERVICE_PORT = serving.HTTP_PORT
TMP_VOLUME, TMP_MOUNT = "tmp", "/tmp"
# The front queue (warmstart/podside/front_queue.py) of a model that scales from zero: its script's
# ConfigMap (shipped to the namespace with the other pod scripts) and where the pod mounts it.
FRONT_QUEUE_CONFIGMAP = "warmstart-front-queue"
FRONT_QUEUE_SCRIPT = "front_queue.pyz"
FRONT_QUEUE_MOUNT = "/opt/warmstart-front-queue"
FRONT_QUEUE_VOLUME = "front-queue"
# The front queue script's digest on the router pods' template, so a new script rolls them.
FRONT_QUEUE_SCRIPT_ANNOTATION = f"{serving.ANNOTATION_DOMAIN}/front-queue-sha256"

# Internal NLB annotations. Auto Mode provisions NLBs itself for this load balancer class
# (https://docs.aws.amazon.com/eks/latest/userguide/auto-configure-nlb.html); in karpenter mode
# warmstart installs no AWS Load Balancer Controller, so the Service is handled by the cloud
# provider EKS runs, whose annotations are the legacy ones
# (https://kubernetes.io/docs/reference/labels-annotations-taints/#service-beta-kubernetes-io-aws-load-balancer-internal,
# https://cloud-provider-aws.sigs.k8s.io/service_controller/).
AUTO_MODE_LB_CLASS = "eks.amazonaws.com/nlb"
LB_ANNOTATIONS: dict[str, dict[str, str]] = {
    "auto": {
        "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
        "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "ip",
    },
    "karpenter": {
        "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
        "service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
    },
}

# The entrypoint: the image's own command (`python3 -m smg.launch_router`) with the control-plane
# key appended. Backquotes, not $(...), so Kubernetes' $(VAR) expansion of `command` cannot touch it.
ENTRYPOINT = (
    'set -eu\n'
    f'file="${{{CONTROL_PLANE_KEY_FILE_ENV}:-}}"\n'
    'key=""\n'
    'if [ -n "$file" ] && [ -s "$file" ]; then key=`cat "$file"`; fi\n'
    'if [ -z "$key" ]; then key=`od -An -N32 -tx1 /dev/urandom | tr -d " \\n"`; fi\n'
    'exec python3 -m smg.launch_router "$@" --control-plane-api-keys "warmstart:operator:admin:$key"\n'
)


def labels(model: str) -> dict[str, str]:
    """The router pods' labels; the first two are its selector."""
    return {
        "app.kubernetes.io/name": "router",
        "app.kubernetes.io/instance": model,
        "app.kubernetes.io/component": "router",
        "app.kubernetes.io/part-of": "warmstart",
    }


def selector(model: str) -> dict[str, str]:
    return {k: v for k, v in labels(model).items() if k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}


def control_plane_secret_name(model: str) -> str:
    return f"{model}-router-control-plane"


def _meta(p: RoutingPlan, name: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name or p.name, "namespace": p.namespace, "labels": labels(p.model), **extra}


def service_account_spec(p: RoutingPlan) -> dict[str, Any]:
    # The one warmstart ServiceAccount that mounts its token: the router watches pods.
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(p), "automountServiceAccountToken": True}


def role_spec(p: RoutingPlan) -> dict[str, Any]:
    """Read pods in the model's namespace: what SMG's Kubernetes discovery calls (list + watch,
    get on a pod; smg-project/smg deploy/helm/smg/templates/role.yaml)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(p),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}


def role_binding_spec(p: RoutingPlan) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(p),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": p.name},
            "subjects": [{"kind": "ServiceAccount", "name": p.name, "namespace": p.namespace}]}


def control_plane_secret_spec(p: RoutingPlan, key: Any) -> dict[str, Any]:
    """The control-plane key as a Secret (`key`: a Pulumi secret Output in a program)."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(p, control_plane_secret_name(p.model)), "stringData": {CONTROL_PLANE_SECRET_KEY: key}}


def container_args(p: RoutingPlan) -> list[str]:
    # Awake engines only: the standby actuator relabels a pod before it sleeps its engine, and SMG
    # drops a pod that stops matching (service_discovery/kubernetes.rs, compute_desired_state).
    return routing.flags(p, serving.worker_selector(p.model, pooled=p.standby_pool is not None))


def deployment_spec(p: RoutingPlan) -> dict[str, Any]:
    probe_get = {"port": "probe"}
    serving_port = [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}]
    # Behind a front queue SMG listens on the pod's loopback alone (routing.flags), its probe
    # listener included: the front queue takes the serving port, and no probe port is offered.
    probe_port = {"name": "probe", "containerPort": PROBE_PORT, "protocol": "TCP"}
    ports = [] if p.front_queue else [*serving_port, probe_port]
    if p.scraped:
        ports.append({"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"})
    container = {
        "name": CONTAINER,
        "image": p.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", ENTRYPOINT, "smg"],
        "args": container_args(p),
        "env": [
            {"name": "HOME", "value": TMP_MOUNT},
            {"name": "HF_HOME", "value": f"{TMP_MOUNT}/hf"},
            {"name": CONTROL_PLANE_KEY_FILE_ENV, "value": f"{CONTROL_PLANE_KEY_DIR}/{CONTROL_PLANE_SECRET_KEY}"},
        ],
        "ports": ports,
        # Behind a front queue the pod is Ready without an engine (the queue holds the requests).
        **({} if p.front_queue else {"readinessProbe": {
            "httpGet": {"path": "/readiness", **probe_get}, "periodSeconds": 5, "timeoutSeconds": 2,
            "failureThreshold": 2}}),
        "livenessProbe": router_liveness_probe(p),
        # A Rust proxy: little CPU per request (AWS measured 1.3-1.9 ms routing overhead).
        "resources": {"requests": dict(routing.ROUTER_REQUESTS), "limits": {"memory": routing.ROUTER_MEMORY_LIMIT}},
        "volumeMounts": [{"name": TMP_VOLUME, "mountPath": TMP_MOUNT},
                         {"name": CONTROL_PLANE_VOLUME, "mountPath": CONTROL_PLANE_KEY_DIR, "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                            "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    spread = [
        # One router per node (a node drain or loss takes one), and across zones where possible.
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
         "labelSelector": {"matchLabels": selector(p.model)}},
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": selector(p.model)}},
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(p, annotations={"pulumi.com/timeoutSeconds": str(p.ready_timeout_seconds)}),
        "spec": {
            "replicas": p.router_replicas,
            "selector": {"matchLabels": selector(p.model)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            # A router is Ready once one vLLM pod is, which may take the model's whole start-up.
            "progressDeadlineSeconds": p.ready_timeout_seconds,
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {"labels": labels(p.model), **({"annotations": {
                    FRONT_QUEUE_SCRIPT_ANNOTATION: pod_scripts.script_digest(FRONT_QUEUE_SCRIPT)}} if p.front_queue else {})},
                "spec": {
                    "serviceAccountName": p.name,
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    **p.non_gpu.pod_fields(),
                    "topologySpreadConstraints": spread,
                    "containers": [container, *([front_queue_container(p, serving_port)] if p.front_queue else [])],
                    "volumes": [{"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}},
                                *([{"name": FRONT_QUEUE_VOLUME, "configMap": {"name": FRONT_QUEUE_CONFIGMAP}}]
                                  if p.front_queue else []),
                                # Optional: without the Secret the directory is empty and the pod
                                # draws a random key nobody has.
                                {"name": CONTROL_PLANE_VOLUME, "secret": {
                                    "secretName": control_plane_secret_name(p.model), "optional": True,
                                    "defaultMode": 0o400}}],
                    "terminationGracePeriodSeconds": routing.SHUTDOWN_GRACE_SECONDS + routing.DRAIN_SETTLE_SECONDS + 5,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                                        "fsGroup": RUN_AS_USER, "seccompProfile": {"type": "RuntimeDefault"}},
                },
            },
        },
    }


# SMG's liveness seen from inside its own container, for a router behind a front queue: SMG then
# listens on the pod's loopback only, and its probe listener binds the same host as its serving one
# (`health::start_probe_listener(&config.host, ...)`, smg model_gateway/src/server.rs at 1.13.0),
# which the kubelet's httpGet (sent to the pod's IP) cannot reach. The image's python3 (the front
# queue runs on it too), standard library only; argv[1] is the URL.
_LOOPBACK_LIVENESS = "import sys,urllib.request as u\nu.urlopen(sys.argv[1],timeout=4).read()\n"


def router_liveness_probe(p: RoutingPlan) -> dict[str, Any]:
    """SMG's /liveness on its probe port: an httpGet, or behind a front queue (SMG on the pod's
    loopback) the same request made from inside the container."""
    probe: dict[str, Any] = {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6, "initialDelaySeconds": 10}
    if p.front_queue:
        return {"exec": {"command": ["python3", "-c", _LOOPBACK_LIVENESS,
                                     f"http://127.0.0.1:{PROBE_PORT}/liveness"]}, **probe}
    return {"httpGet": {"path": "/liveness", "port": "probe"}, **probe}


def front_queue_container(p: RoutingPlan, ports: list[dict[str, Any]]) -> dict[str, Any]:
    """The front queue on the serving port, in front of SMG on the pod's loopback: it holds requests
    until SMG's /readiness says an engine is there, bounded, and answers 429 with Retry-After past
    the bounds. The router's own image (it has python3); the script from its ConfigMap."""
    return {
        "name": "front-queue",
        "image": p.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", f"{FRONT_QUEUE_MOUNT}/{FRONT_QUEUE_SCRIPT}", "--port", str(ROUTER_PORT),
                    "--upstream", f"http://127.0.0.1:{routing.SMG_BEHIND_QUEUE_PORT}",
                    "--ready-url", f"http://127.0.0.1:{PROBE_PORT}/readiness",
                    "--max-held", str(routing.FRONT_QUEUE_MAX_HELD),
                    "--max-held-bytes", str(routing.FRONT_QUEUE_MAX_HELD_BYTES),
                    "--max-connections", str(routing.FRONT_QUEUE_MAX_CONNECTIONS),
                    "--read-timeout-seconds", str(routing.FRONT_QUEUE_READ_TIMEOUT_SECONDS),
                    "--max-hold-seconds", str(p.front_queue_hold_seconds),
                    "--retry-after", str(p.front_queue_retry_after_seconds)],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "ports": ports,
        "readinessProbe": {"httpGet": {"path": routing.FRONT_QUEUE_HELD_PATH, "port": "http"}, "periodSeconds": 5,
                           "timeoutSeconds": 2, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": routing.FRONT_QUEUE_HELD_PATH, "port": "http"}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 6},
        "resources": {"requests": dict(routing.FRONT_QUEUE_REQUESTS), "limits": {"cpu": "1", "memory": f"{routing.FRONT_QUEUE_MEMORY_LIMIT_MIB}Mi"}},
        "volumeMounts": [{"name": FRONT_QUEUE_VOLUME, "mountPath": FRONT_QUEUE_MOUNT, "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                            "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def pdb_spec(p: RoutingPlan) -> dict[str, Any]:
    # maxUnavailable, so a single router (routerReplicas: 1) never blocks a node drain.
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": _meta(p),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(p.model)}}}


def service_spec(p: RoutingPlan, name: str | None = None) -> dict[str, Any]:
    """The model's endpoint in the cluster: `name` (default the model's name, the name its vLLM
    Service has without a router) on vLLM's port, in front of the routers."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(p, name or p.model),
            "spec": {"type": "ClusterIP", "selector": selector(p.model),
                     "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}]}}


def load_balancer_service_spec(p: RoutingPlan) -> dict[str, Any]:
    """An internal NLB in front of the routers, for clients in the VPC outside the cluster."""
    spec: dict[str, Any] = {
        "type": "LoadBalancer", "selector": selector(p.model),
        "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}],
    }
    if p.cluster_mode == "auto":
        spec["loadBalancerClass"] = AUTO_MODE_LB_CLASS
    else:
        # The cloud provider's NLB targets every node's NodePort (instance targets); with the
        # default `Cluster` policy kube-proxy then SNATs each connection to the receiving node's
        # IP, and the AWS network policy agent admits a node's own IP on every port of the pods
        # on it ("Traffic from the local node should always be allowed",
        # https://github.com/aws/aws-network-policy-agent/blob/main/pkg/fwruleprocessor/fw_rule_processor.go
        # ComputeMapEntriesFromEndpointRules), so `clientCidrs` would fence nothing. `Local`
        # delivers only to a router on the receiving node, with the client's own address
        # (https://kubernetes.io/docs/tasks/access-application-cluster/create-external-load-balancer/#preserving-the-client-source-ip).
        # Auto Mode's NLB sends to the pods' IPs (target type ip), with no NodePort hop.
        spec["externalTrafficPolicy"] = "Local"
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(p, f"{p.model}-internal", annotations=dict(LB_ANNOTATIONS[p.cluster_mode])),
            "spec": spec}


def _tcp(port: int | str) -> dict[str, Any]:
    return {"port": port, "protocol": "TCP"}


def router_network_policy_spec(p: RoutingPlan) -> dict[str, Any]:
    """What may reach the router pods and what they may reach."""
    ingress: list[dict[str, Any]] = [
        # The serving port: pods of the model's namespace, and the named client CIDRs (an exposed
        # router's load balancer clients).
        {"from": [{"podSelector": {}}, *({"ipBlock": {"cidr": c}} for c in p.client_cidrs)],
         "ports": [_tcp(ROUTER_PORT)]},
    ]
    if not p.front_queue:
        # The probe listener serves only /liveness, /readiness and /health; the kubelet calls it.
        # (Behind a front queue it is on the pod's loopback: router_liveness_probe.)
        ingress.append({"ports": [_tcp(PROBE_PORT)]})
    if p.scraped:
        ingress.append({"from": network_policy.scraper_peers(p.metrics_cidrs, p.metrics_pods),
                        "ports": [_tcp(METRICS_PORT)]})
    if p.front_queue_scaled:
        # A model scaled to zero pods: KEDA's operator reads each router pod's held count on the
        # serving port (its metrics-api scaler dials the Service's endpoints, the pod IPs, itself).
        ingress.append({"from": [network_policy.keda_operator_peer(p.keda_namespace)], "ports": [_tcp(ROUTER_PORT)]})
    egress: list[dict[str, Any]] = [
        # The model's vLLM pods, and a pooled model's engine hosts (its engine there, on the same port).
        {"to": [{"podSelector": {"matchLabels": serving.selector(p.model)}},
                *([{"podSelector": {"matchLabels": pool_objects.host_selector(p.standby_pool)}}]
                  if p.standby_pool is not None else [])],
         "ports": [_tcp(p.worker_port)]},
        # DNS on port 53 to any address, as every warmstart pod: in Auto Mode the resolver is on
        # the node, not kube-dns pods (network_policy.egress_rules).
        network_policy.egress_rules()[0],
        # The Kubernetes API (the pod watch): the pod calls the `kubernetes` Service's ClusterIP,
        # which the AWS network policy agent judges before DNAT (replies ride its conntrack), so
        # ServedModel names that ClusterIP's /32 alone (components/served_model.py).
        {"to": [{"ipBlock": {"cidr": c}} for c in p.api_server_cidrs], "ports": [_tcp(443)]},
    ]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(p),
            "spec": {"podSelector": {"matchLabels": selector(p.model)}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": ingress, "egress": egress}}


def vllm_network_policy_spec(p: RoutingPlan) -> dict[str, Any]:
    """Only the model's routers (and the named scrapers: vLLM serves /metrics on the same port)
    reach its vLLM pods' serving port, so nothing bypasses the routing or its load bound."""
    sources: list[dict[str, Any]] = [{"podSelector": {"matchLabels": selector(p.model)}},
                                     *({"ipBlock": {"cidr": c}} for c in p.vllm_scrape_cidrs)]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": f"{p.model}-vllm", "namespace": p.namespace, "labels": serving.labels(p.model)},
            "spec": {"podSelector": {"matchLabels": serving.selector(p.model)}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": sources, "ports": [_tcp(p.worker_port)]}]}}


def objects(p: RoutingPlan, service_name: str | None = None) -> list[dict[str, Any]]:
    """Every object of the router, in apply order (the control-plane Secret is the component's)."""
    out = [service_account_spec(p), role_spec(p), role_binding_spec(p), deployment_spec(p), pdb_spec(p),
           service_spec(p, service_name), router_network_policy_spec(p), vllm_network_policy_spec(p)]
    if p.expose:
        out.append(load_balancer_service_spec(p))
    return out
