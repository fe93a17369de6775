"""A standby pool's objects as plain Kubernetes object dicts (pure; docs/scale-out.md "Pooled standby").

From a PoolPlan (warmstart/decisions/standby_pool.py) and what the stack wires in (`PoolWiring`):

- the engine hosts: a Deployment of `spares` pods (the pool actuator moves its replicas through the
  scale subresource; the component ignores `spec.replicas` after the first create, as KEDA's
  Deployments), each one container of the members' vLLM image on the pool's GPU set, running the
  supervisor (warmstart/podside/engine_host, `engine_host.pyz`) from the spec ConfigMap that
  `standby_pool.host_spec` writes; its ServiceAccount, whose IRSA role reads the members' weights
  prefixes only (decisions/iam.py `pool_host_role_policy`);
- the pool actuator: a one-pod Deployment on the non-GPU nodes running the standby package in pool
  mode (`standby.pyz --pool-spec`), its pool.json ConfigMap, ServiceAccount, Role (pods: list,
  watch, get, patch; the host Deployment's scale subresource by name) and RoleBinding, and the
  Service KEDA's operator reads each member's figure from (`/warmstart/pods/<model>`);
- the NetworkPolicies, as the AWS VPC CNI's network policy agent enforces them (the peer is judged
  at the receiving pod, after a Service's DNAT): the hosts accept the supervisor's port from the
  pool actuator alone and each member's port from that member's routers alone (one rule per
  member); the actuator accepts KEDA's operator alone, on the figure's port.

A host is one trust domain (its engines share the container, the ServiceAccount and localhost):
docs/security.md says so, and the plan refuses a member that runs remote code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..decisions import instances, placement, routing, tuning
from ..decisions import node_cache as staging
from ..decisions import standby as standby_mod
from ..decisions import standby_pool as pool_mod
from ..plan.records import ModelPlan, ServingPlan
from . import network_policy, node_cache, pod_scripts, serving
from . import standby as actuator_objects

HOST_NAME = "warmstart-engine-host"
ACTUATOR_NAME = "warmstart-standby-pool"
ENGINE_ASLEEP = "asleep"
HOST_SCRIPT_KEY = "engine_host.pyz"
SCRIPT_MOUNT = "/scripts"
SPEC_KEY = "spec.json"
SPEC_MOUNT = "/etc/warmstart/engine-host"
POOL_KEY = "pool.json"
POOL_MOUNT = "/etc/warmstart/pool"
SUPERVISOR_PORT_NAME = "supervisor"
# The spec's and the script's digests on the host pod template: a ConfigMap change alone restarts
# nothing (https://kubernetes.io/docs/concepts/configuration/configmap/#mounted-configmaps-are-updated-automatically).
SPEC_ANNOTATION = f"{serving.ANNOTATION_DOMAIN}/engine-host-spec-sha256"
SCRIPT_ANNOTATION = f"{serving.ANNOTATION_DOMAIN}/engine-host-sha256"
POOL_ANNOTATION = f"{serving.ANNOTATION_DOMAIN}/pool-spec-sha256"
# The supervisor's liveness is its own loop (`/livez`), never an engine's: one engine's failure is
# the supervisor's to restart, not a reason to kill every engine of the host.
LIVENESS_FAILURES = 6


@dataclass(frozen=True)
class PoolWiring:
    """What the stack gives a pool's objects besides its plan."""

    namespace: str
    members: tuple[ServingPlan, ...]
    """The members' own serving plans (their `vllm serve` command, selector, autoscaling)."""
    region: str
    api_server_cidrs: tuple[str, ...]
    """The `kubernetes` Service's ClusterIP /32 (the actuator lists pods and scales the hosts)."""
    non_gpu: placement.NonGpuPlacement = placement.ANYWHERE_OFF_GPU
    actuator_image: str = actuator_objects.IMAGE
    keda_namespace: str = "keda"
    role_arn: Any = None
    """The hosts' IRSA role (a Pulumi Output in a program, a string in a test); None: no annotation."""
    front_queue: Mapping[str, bool] = field(default_factory=dict)
    """Per member: its routers hold requests in a front queue (minReplicas 0)."""
    targets: Mapping[str, tuple[int, float, float]] = field(default_factory=dict)
    """Per member: (minReplicas, targetWaitingPerReplica, targetRequestsPerReplica)."""
    nvme_mount: str | None = None
    """The GPU nodes' NVMe mount (the cluster mode's, placement.NVME_MOUNT): the hosts read a staged
    member's node copy under it. None: the hosts mount no node cache and every engine reads S3."""
    select_script_config_map: str = node_cache.SELECT_CONFIGMAP
    """The weights picker's script (the platform ships it in its namespace, pod_scripts)."""


def host_script_config_map(pool: str) -> str:
    """The supervisor's artifact, shipped by the pool (no other pod runs it)."""
    return f"{pool_mod.host_deployment_name(pool)}-script"


def host_labels(pool: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": HOST_NAME, "app.kubernetes.io/instance": pool,
            "app.kubernetes.io/component": "engine-host", "app.kubernetes.io/part-of": "warmstart",
            pool_mod.POOL_LABEL: pool}


def host_selector(pool: str) -> dict[str, str]:
    """The hosts' Deployment selector and the pool actuator's `hostSelector`: labels the actuator
    never moves (it moves `serves` and `engine` only)."""
    return {"app.kubernetes.io/name": HOST_NAME, pool_mod.POOL_LABEL: pool}


def host_pod_labels(pool: str) -> dict[str, str]:
    """A fresh host holds every engine asleep: no router selects it until the actuator labels it."""
    return host_labels(pool) | {serving.ENGINE_LABEL: ENGINE_ASLEEP}


def actuator_labels(pool: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": ACTUATOR_NAME, "app.kubernetes.io/instance": pool,
            "app.kubernetes.io/component": ACTUATOR_NAME, "app.kubernetes.io/part-of": "warmstart"}


def actuator_selector(pool: str) -> dict[str, str]:
    return {k: v for k, v in actuator_labels(pool).items()
            if k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}


figure_url = pool_mod.figure_url


def _tcp(port: int | str) -> dict[str, Any]:
    return {"port": port, "protocol": "TCP"}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --- the engine hosts ---------------------------------------------------------------------------------


def serve_argv(m: ServingPlan) -> list[str]:
    """A member's own `vllm serve` command, as its pods run it (the host spec replaces the flags the
    pool decides)."""
    return ["vllm", "serve", *serving.vllm_args(m)]


# --- a staged member's weights on a host (the node cache) ---------------------------------------------
#
# A model's own pod picks its weights once, in its `weights-select` init container, before vLLM starts
# (manifests/node_cache.py `serving_extras`). A host starts its engines one after another over
# minutes, and restarts one alone, so each engine runs the same picker itself, just before its
# `vllm serve`: a copy the node's staging pod completes while the host starts serves the engines that
# start after it. vLLM keeps the path it started with (`model_config.model`), and a level-2 wake's
# `reload_weights` loads from it again (vllm/v1/worker/gpu_model_runner.py `reload_weights`, whose
# loader reads the engine's own `model_config`, https://github.com/vllm-project/vllm), so an engine that
# started from the node's copy reloads from the NVMe, one that started from S3 streams again.


def staged_on_hosts(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, ServingPlan]:
    """The members whose engines read the node cache's copy where it is complete: staged on the
    hosts' GPU pool (`EngineSlot.staged`, the plan's figure) and a node mount given."""
    if w.nvme_mount is None:
        return {}
    by_name = {m.name: m for m in w.members}
    return {e.model: by_name[e.model] for e in plan.engines
            if e.staged and by_name[e.model].weights_digest is not None}


def weights_volume_name(slot: pool_mod.EngineSlot) -> str:
    return f"{node_cache.WEIGHTS_VOLUME}-{slot.order}"


def engine_weights_root(model: str) -> str:
    """Where a staged member's node directory is mounted in the host's container (one per member,
    read-only): `/weights/<model>`."""
    return f"{staging.CONTAINER_WEIGHTS_ROOT}/{model}"


def engine_choice_dir(model: str) -> str:
    """The picker's output of one engine (`model-path`, `choice.json`), on the host's choice volume."""
    return f"{node_cache.CHOICE_MOUNT}/{model}"


def picker_env(m: ServingPlan) -> dict[str, str]:
    """The picker's settings for one engine (warmstart/podside/weights_select.py reads them). No
    pause request to the node's copier (WARMSTART_LOADING_HOLD_S 0): the host mounts the node
    directory read-only."""
    assert m.weights_digest is not None
    root = engine_weights_root(m.name)
    return {"WARMSTART_WEIGHTS_SOURCE": m.source, "WARMSTART_WEIGHTS_DIGEST": m.weights_digest,
            "WARMSTART_WEIGHTS_ROOT": root, "WARMSTART_WEIGHTS_PATH": f"{root}/{m.weights_digest}",
            "WARMSTART_WEIGHTS_OUT": engine_choice_dir(m.name), "WARMSTART_LOADING_HOLD_S": "0",
            "PYTHONDONTWRITEBYTECODE": "1"}


def staged_serve_argv(m: ServingPlan) -> list[str]:
    """A staged member's command on a host: the picker (it always exits 0, writing the S3 URI when in
    doubt), then its own `vllm serve` on the path picked, the S3 URI where no file was written; the
    rest of its arguments unchanged (the host spec appends the pool's flags after them)."""
    args = serving.vllm_args(m)
    source, rest = args[0], args[1:]
    picked = f"{engine_choice_dir(m.name)}/{node_cache.MODEL_PATH_FILE.rsplit('/', 1)[1]}"
    # A restarted engine picks again: the previous start's file goes first.
    script = (f"rm -f {picked}; python3 {node_cache.SCRIPT_MOUNT}/{node_cache.SELECT_SCRIPT} || true; "
              f'exec vllm serve "$(cat {picked} 2>/dev/null || echo {shlex.quote(source)})" "$@"')
    return ["sh", "-c", script, "vllm", *rest]


def host_spec_json(plan: pool_mod.PoolPlan, w: PoolWiring) -> str:
    staged = staged_on_hosts(plan, w)
    spec = pool_mod.host_spec(plan, {m.name: staged_serve_argv(m) if m.name in staged else serve_argv(m)
                                     for m in w.members},
                              {name: picker_env(m) for name, m in staged.items()})
    return json.dumps(spec, sort_keys=True, indent=1)


def host_service_account_spec(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": plan.deployment_name, "namespace": w.namespace, "labels": host_labels(plan.name)}
    if w.role_arn is not None:
        meta["annotations"] = {serving.IRSA_ROLE_ANNOTATION: w.role_arn}
    # No engine calls the Kubernetes API; IRSA's webhook projects its own token.
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, "automountServiceAccountToken": False}


def host_spec_config_map(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": plan.deployment_name, "namespace": w.namespace, "labels": host_labels(plan.name)},
            "data": {SPEC_KEY: host_spec_json(plan, w)}}


def _host_env(plan: pool_mod.PoolPlan, w: PoolWiring) -> list[dict[str, str]]:
    """The container's environment: a member's (the first in start order), less what is per engine
    (the spec's `env`: distributed ports, dev mode, the pinned-allocator setting) and less the
    compile cache's paths (the hosts do not mount it: a path there would be on the read-only root
    filesystem). What is left (region, HOME and TMPDIR, the streamer's S3 tuning) is the stack's,
    alike for every member."""
    first = next(m for m in w.members if m.name == plan.engines[0].model)
    plain = dataclasses.replace(first, compile_cache=False, standby=None)
    per_engine = {standby_mod.DEV_MODE_ENV, standby_mod.PINNED_HOST_ALLOC_ENV, "VLLM_PORT"}
    return [e for e in serving.vllm_env(plain, w.region) if e["name"] not in per_engine]


def _capacity_affinity(plan: pool_mod.PoolPlan, staged: Mapping[str, ServingPlan] | None = None) -> dict[str, Any]:
    """A spare on spot would be taken by an interruption (the plan refuses a spot-only GPU pool):
    the hosts require the GPU pool's other purchase options. They prefer, never require, the nodes
    that hold a staged member's copy (its node label, as its own pods: node_cache.serving_affinity),
    one term per member, so a node holding more of them wins."""
    labels = sorted({{"onDemand": "on-demand"}.get(t, t) for t in plan.host_capacity_types})
    affinity: dict[str, Any] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": placement.CAPACITY_TYPE_LABEL, "operator": "In", "values": labels}]}]}}
    if staged:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": max(1, 100 // len(staged)), "preference": {"matchExpressions": [
                {"key": node_cache.label_key(name), "operator": "In", "values": [m.weights_digest]}]}}
            for name, m in sorted(staged.items())]
    return {"nodeAffinity": affinity}


def host_deployment_spec(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    inst = instances.lookup(plan.instance_type)
    size = tuning.pod_size(inst, plan.gpus)
    spec_text = host_spec_json(plan, w)
    startup = json.loads(spec_text)["startupTimeoutSeconds"]
    staged = staged_on_hosts(plan, w)
    slots = [e for e in plan.engines if e.model in staged]
    # A staged member's node directory (read-only: the host never writes the node cache), the
    # picker's script and one small in-memory folder for every engine's choice.
    weights_mounts = [{"name": weights_volume_name(e), "mountPath": engine_weights_root(e.model), "readOnly": True}
                      for e in slots]
    weights_volumes = [{"name": weights_volume_name(e), "hostPath": {
        "path": staging.node_weights_root(w.nvme_mount or "", e.model), "type": "DirectoryOrCreate"}} for e in slots]
    picker_mounts = [{"name": "weights-select-script", "mountPath": node_cache.SCRIPT_MOUNT, "readOnly": True},
                     {"name": node_cache.CHOICE_VOLUME, "mountPath": node_cache.CHOICE_MOUNT}] if slots else []
    picker_volumes = [{"name": "weights-select-script", "configMap": {"name": w.select_script_config_map}},
                      {"name": node_cache.CHOICE_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}] \
        if slots else []
    annotations = {SPEC_ANNOTATION: _digest(spec_text), SCRIPT_ANNOTATION: pod_scripts.script_digest(HOST_SCRIPT_KEY)}
    if slots:
        annotations[f"{serving.ANNOTATION_DOMAIN}/weights-select-script-sha256"] = \
            pod_scripts.script_digest(node_cache.SELECT_SCRIPT)
    # Every engine starts in turn (the supervisor's gate), each within the longest member's budget.
    startup_failures = -(-startup * len(plan.engines) // tuning.PROBE_PERIOD_SECONDS)
    gpu = str(plan.gpus)
    probe = {"httpGet": {"path": "/health", "port": SUPERVISOR_PORT_NAME}, "periodSeconds": tuning.PROBE_PERIOD_SECONDS}
    container = {
        "name": "engines",
        "image": plan.image,
        "imagePullPolicy": serving.IMAGE_PULL_POLICY,
        "command": ["python3", f"{SCRIPT_MOUNT}/{HOST_SCRIPT_KEY}", "--spec", f"{SPEC_MOUNT}/{SPEC_KEY}",
                    "--port", str(pool_mod.SUPERVISOR_PORT), "--run-dir", f"{serving.TMP_MOUNT}/engines"],
        "workingDir": serving.HOME_MOUNT,
        "env": _host_env(plan, w),
        "ports": [{"name": SUPERVISOR_PORT_NAME, "containerPort": pool_mod.SUPERVISOR_PORT, "protocol": "TCP"},
                  *({"containerPort": e.port, "protocol": "TCP"} for e in plan.engines)],
        "resources": {
            "requests": {"cpu": f"{size.cpu_millis}m", "memory": serving._quantity(size.memory_bytes),
                         placement.GPU_RESOURCE: gpu},
            "limits": {"memory": serving._quantity(size.memory_bytes), placement.GPU_RESOURCE: gpu},
        },
        # /health is 200 once every engine is up and asleep (the supervisor folds them).
        "startupProbe": probe | {"timeoutSeconds": 5, "failureThreshold": startup_failures},
        "readinessProbe": probe | {"timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/livez", "port": SUPERVISOR_PORT_NAME},
                          "periodSeconds": tuning.PROBE_PERIOD_SECONDS, "timeoutSeconds": 10,
                          "failureThreshold": LIVENESS_FAILURES},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": serving.HOME_VOLUME, "mountPath": serving.HOME_MOUNT},
                         {"name": serving.TMP_VOLUME, "mountPath": serving.TMP_MOUNT},
                         {"name": "script", "mountPath": SCRIPT_MOUNT, "readOnly": True},
                         {"name": "spec", "mountPath": SPEC_MOUNT, "readOnly": True},
                         *weights_mounts, *picker_mounts],
        "securityContext": serving.container_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": plan.deployment_name, "namespace": w.namespace, "labels": host_labels(plan.name),
                     "annotations": {f"{serving.ANNOTATION_DOMAIN}/standby-pool-members": ",".join(plan.members)}},
        "spec": {
            # The first create's count; the pool actuator owns it from then on (scale subresource).
            "replicas": plan.spares,
            "selector": {"matchLabels": host_selector(plan.name)},
            # A new spec starts a new host before the old one goes: the pool never drops below its spares.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "progressDeadlineSeconds": max(600, startup * len(plan.engines) + tuning.NODE_LAUNCH_ALLOWANCE_SECONDS),
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {"labels": host_pod_labels(plan.name), "annotations": annotations},
                "spec": {
                    "serviceAccountName": plan.deployment_name,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "nodeSelector": {placement.NODEPOOL_LABEL: plan.gpu_pool,
                                     placement.INSTANCE_TYPE_LABEL: plan.instance_type},
                    "affinity": _capacity_affinity(plan, staged),
                    "tolerations": [{"key": placement.GPU_TAINT_KEY, "operator": "Exists",
                                     "effect": placement.GPU_TAINT_EFFECT}],
                    "containers": [container],
                    "volumes": [
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": serving._quantity(size.shm_bytes)}},
                        {"name": serving.HOME_VOLUME, "emptyDir": {}},
                        {"name": serving.TMP_VOLUME, "emptyDir": {}},
                        {"name": "script", "configMap": {"name": host_script_config_map(plan.name)}},
                        {"name": "spec", "configMap": {"name": plan.deployment_name}},
                        *weights_volumes, *picker_volumes,
                    ],
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": serving.pod_security_context(),
                },
            },
        },
    }


def host_pdb_spec(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    """A drain or a consolidation takes one host at a time, as a model's own pods (serving.pdb_spec:
    maxUnavailable, so a pool of one spare never blocks a node drain)."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": plan.deployment_name, "namespace": w.namespace, "labels": host_labels(plan.name)},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": host_selector(plan.name)}}}


def host_network_policy_spec(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    """The supervisor's port from the pool actuator alone (its `/engines/<model>/<route>` passes the
    dev routes); each member's port from that member's routers alone, one rule per member, so a
    router reaches only its own model's engine. Egress as a model's vLLM pods (DNS, S3 and the
    streamer's endpoints: network_policy.egress_rules)."""
    ingress = [{"from": [{"podSelector": {"matchLabels": actuator_selector(plan.name)}}],
                "ports": [_tcp(pool_mod.SUPERVISOR_PORT)]}]
    for e in plan.engines:
        ingress.append({"from": [{"podSelector": {"matchLabels": network_policy.router_selector(e.model)}}],
                        "ports": [_tcp(e.port)]})
    return {"apiVersion": network_policy.API_VERSION, "kind": "NetworkPolicy",
            "metadata": {"name": plan.deployment_name, "namespace": w.namespace, "labels": host_labels(plan.name)},
            "spec": {"podSelector": {"matchLabels": host_selector(plan.name)}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": ingress, "egress": network_policy.egress_rules()}}


# --- the pool actuator -------------------------------------------------------------------------------


def pool_json(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    """The pool actuator's spec (POOL.md of issue 38; warmstart/podside/standby parses it)."""
    members = []
    for e in plan.engines:
        min_replicas, target_waiting, target_requests = w.targets.get(e.model, (1, 5.0, 0.0))
        members.append({
            "model": e.model, "port": e.port, "deployment": e.model, "selector": serving.selector(e.model),
            "minReplicas": min_replicas, "targetWaiting": target_waiting, "targetRequests": target_requests,
            "awakeIdleSeconds": next(m.pooled.awake_idle_seconds for m in w.members
                                     if m.name == e.model and m.pooled is not None),
            # The routers' front queues: each router pod's held count (`GET /warmstart/held` on its
            # serving port), read per pod (`selector`) as the per-model actuator reads it; `service`
            # is the model's own Service, whose endpoints are those pods (ServedModel's front queue
            # Service for KEDA too).
            "frontQueue": {"service": e.model, "selector": network_policy.router_selector(e.model),
                           "port": routing.ROUTER_PORT}
            if w.front_queue.get(e.model) else None,
        })
    return {"pool": plan.name, "namespace": w.namespace, "hostSelector": host_selector(plan.name),
            "hostDeployment": plan.deployment_name, "spares": plan.spares, "maxHosts": plan.max_hosts,
            "supervisorPort": pool_mod.SUPERVISOR_PORT, "sleepLevel": plan.sleep_level, "members": members}


def _actuator_meta(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    return {"name": plan.actuator_name, "namespace": w.namespace, "labels": actuator_labels(plan.name)}


def pool_config_map(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _actuator_meta(plan, w),
            "data": {POOL_KEY: json.dumps(pool_json(plan, w), sort_keys=True, indent=1)}}


def actuator_service_account_spec(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _actuator_meta(plan, w),
            "automountServiceAccountToken": True}


def actuator_role_spec(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    """Pods of the namespace: list, watch and get (hosts and members; RBAC cannot scope a list to
    labels) and patch (a host's `serves`/`engine` labels and deletion cost); the host Deployment's
    scale subresource, by name: nothing else of any Deployment, no create or delete."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _actuator_meta(plan, w),
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
                      {"apiGroups": ["apps"], "resources": ["deployments/scale"],
                       "resourceNames": [plan.deployment_name], "verbs": ["get", "patch", "update"]}]}


def actuator_role_binding_spec(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _actuator_meta(plan, w),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": plan.actuator_name},
            "subjects": [{"kind": "ServiceAccount", "name": plan.actuator_name, "namespace": w.namespace}]}


def actuator_service_spec(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _actuator_meta(plan, w),
            "spec": {"type": "ClusterIP", "selector": actuator_selector(plan.name),
                     "ports": [{"name": actuator_objects.FIGURE_PORT_NAME, "port": standby_mod.FIGURE_PORT,
                                "targetPort": actuator_objects.FIGURE_PORT_NAME, "protocol": "TCP"}]}}


def actuator_args(plan: pool_mod.PoolPlan) -> list[str]:
    return [f"{actuator_objects.SCRIPT_MOUNT}/{actuator_objects.SCRIPT_KEY}", "--pool-spec", f"{POOL_MOUNT}/{POOL_KEY}",
            "--period", f"{standby_mod.ACTUATOR_PERIOD_SECONDS:g}", "--heartbeat", actuator_objects.HEARTBEAT,
            "--figure-port", str(standby_mod.FIGURE_PORT), "--wake-hold-seconds", str(standby_mod.WAKE_HOLD_SECONDS)]


def actuator_deployment_spec(plan: pool_mod.PoolPlan, w: PoolWiring,
                             script_config_map: str = actuator_objects.CONFIGMAP_NAME) -> dict[str, Any]:
    """The per-model actuator's pod (manifests/standby.py: image, probes, identity, placement), in pool mode."""
    pool_text = json.dumps(pool_json(plan, w), sort_keys=True, indent=1)
    probe = {"exec": {"command": ["python3", "-c", actuator_objects._LIVENESS, actuator_objects.HEARTBEAT,
                                  str(actuator_objects.HEARTBEAT_MAX_AGE_SECONDS)]},
             "periodSeconds": 10, "timeoutSeconds": 5}
    uid = actuator_objects.RUN_AS_USER
    container = {
        "name": "actuator", "image": w.actuator_image, "imagePullPolicy": "IfNotPresent", "command": ["python3"],
        "args": actuator_args(plan),
        "ports": [{"name": actuator_objects.FIGURE_PORT_NAME, "containerPort": standby_mod.FIGURE_PORT,
                   "protocol": "TCP"}],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}, {"name": "HOME", "value": actuator_objects.TMP_MOUNT}],
        "readinessProbe": probe | {"failureThreshold": 3, "initialDelaySeconds": 2},
        "livenessProbe": probe | {"failureThreshold": 3, "initialDelaySeconds": 10},
        "resources": {"requests": dict(standby_mod.ACTUATOR_REQUESTS), "limits": {"cpu": "500m", "memory": "128Mi"}},
        "volumeMounts": [{"name": actuator_objects.TMP_VOLUME, "mountPath": actuator_objects.TMP_MOUNT},
                         {"name": "script", "mountPath": actuator_objects.SCRIPT_MOUNT, "readOnly": True},
                         {"name": "pool", "mountPath": POOL_MOUNT, "readOnly": True}],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _actuator_meta(plan, w),
        "spec": {
            # One writer of wakes, sleeps and the hosts' replicas.
            "replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": actuator_selector(plan.name)},
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {"labels": actuator_labels(plan.name),
                             "annotations": {actuator_objects.SCRIPT_ANNOTATION:
                                             pod_scripts.script_digest(actuator_objects.SCRIPT_KEY),
                                             POOL_ANNOTATION: _digest(pool_text)}},
                "spec": {
                    "serviceAccountName": plan.actuator_name, "automountServiceAccountToken": True,
                    "enableServiceLinks": False, **w.non_gpu.pod_fields(), "containers": [container],
                    "volumes": [{"name": actuator_objects.TMP_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}},
                                {"name": "script", "configMap": {"name": script_config_map}},
                                {"name": "pool", "configMap": {"name": plan.actuator_name}}],
                    "terminationGracePeriodSeconds": 10,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid, "fsGroup": uid,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                },
            },
        },
    }


def actuator_network_policy_spec(plan: pool_mod.PoolPlan, w: PoolWiring) -> dict[str, Any]:
    """KEDA's operator alone reaches the figure's port; the actuator reaches the hosts' supervisor,
    each member's own pods on its port (their queues, /metrics), the members' routers' front
    queues, DNS and the Kubernetes API."""
    egress: list[dict[str, Any]] = [
        {"to": [{"podSelector": {"matchLabels": host_selector(plan.name)}}], "ports": [_tcp(pool_mod.SUPERVISOR_PORT)]},
        *({"to": [{"podSelector": {"matchLabels": serving.selector(e.model)}}], "ports": [_tcp(e.port)]}
          for e in plan.engines),
    ]
    queued = [e.model for e in plan.engines if w.front_queue.get(e.model)]
    if queued:
        egress.append({"to": [{"podSelector": {"matchLabels": network_policy.router_selector(m)}} for m in queued],
                       "ports": [_tcp(routing.ROUTER_PORT)]})
    egress += [network_policy.egress_rules()[0],
               {"to": [{"ipBlock": {"cidr": c}} for c in w.api_server_cidrs], "ports": [_tcp(443)]}]
    return {"apiVersion": network_policy.API_VERSION, "kind": "NetworkPolicy", "metadata": _actuator_meta(plan, w),
            "spec": {"podSelector": {"matchLabels": actuator_selector(plan.name)}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": [network_policy.keda_operator_peer(w.keda_namespace)],
                                  "ports": [_tcp(standby_mod.FIGURE_PORT)]}],
                     "egress": egress}}


def objects(plan: pool_mod.PoolPlan, w: PoolWiring,
            actuator_script_config_map: str = actuator_objects.CONFIGMAP_NAME) -> list[dict[str, Any]]:
    """Every object of the pool, policies first (a pod started before its policy runs unfenced)."""
    names = {m.name for m in w.members}
    if set(plan.members) != names:
        raise ValueError(f"pool {plan.name}: members {sorted(plan.members)} but serving plans of {sorted(names)}")
    unmounted = [e.model for e in plan.engines if e.staged and e.model not in staged_on_hosts(plan, w)]
    if unmounted:
        # The plan counts their wakes from the node's NVMe: the hosts must mount it.
        raise ValueError(f"pool {plan.name}: {', '.join(unmounted)} planned staged, but no node NVMe mount is wired")
    return [host_network_policy_spec(plan, w), actuator_network_policy_spec(plan, w),
            host_service_account_spec(plan, w), host_spec_config_map(plan, w), host_deployment_spec(plan, w),
            host_pdb_spec(plan, w),
            actuator_service_account_spec(plan, w), actuator_role_spec(plan, w), actuator_role_binding_spec(plan, w),
            pool_config_map(plan, w), actuator_service_spec(plan, w),
            actuator_deployment_spec(plan, w, actuator_script_config_map)]


def wiring(plan: pool_mod.PoolPlan, models: Sequence[ModelPlan], *, namespace: str, region: str,
           api_server_cidrs: Sequence[str], role_arn: Any = None,
           non_gpu: placement.NonGpuPlacement = placement.ANYWHERE_OFF_GPU,
           actuator_image: str = actuator_objects.IMAGE, keda_namespace: str = "keda",
           nvme_mount: str | None = None) -> PoolWiring:
    """A pool's wiring from its members' model plans (their autoscaling and front queues);
    `nvme_mount`: the GPU nodes' NVMe mount, where the node cache stages a member's weights."""
    members = tuple(m for m in models if m.name in plan.members)
    return PoolWiring(
        namespace=namespace, members=members, region=region, api_server_cidrs=tuple(api_server_cidrs),
        non_gpu=non_gpu, actuator_image=actuator_image, keda_namespace=keda_namespace, role_arn=role_arn,
        nvme_mount=nvme_mount,
        front_queue={m.name: m.autoscaling is not None and m.autoscaling.min_replicas == 0 for m in members},
        targets={m.name: (m.autoscaling.min_replicas, m.autoscaling.target_waiting_per_replica,
                          m.autoscaling.target_requests_per_replica) for m in members if m.autoscaling is not None})
