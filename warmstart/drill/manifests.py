"""The objects a drill run creates, and the RBAC it needs.

Every object carries the run's label (`warmstart.io/drill-run`), so a restore finds all of them
by one selector, and a bound of its own: the load Job's and the cache-bypassed pod's
`activeDeadlineSeconds` (the kubelet ends the pod, https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/,
and the Job controller a Job, https://kubernetes.io/docs/concepts/workloads/controllers/job/#job-termination-and-cleanup),
the load Job's `ttlSecondsAfterFinished` (the TTL controller deletes it,
https://kubernetes.io/docs/concepts/workloads/controllers/ttlafterfinished/), and the restore Job,
which waits for the run's expiry and undoes what is left.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from .. import versions
from ..manifests import serving
from ..manifests.network_policy import egress_only_network_policy
from . import plan as drill_plan

ENGINE_LABEL = serving.ENGINE_LABEL
BYPASS_ENV = drill_plan.BYPASS_ENV
load_job_name, fallback_pod_name = drill_plan.load_job_name, drill_plan.fallback_pod_name
restore_name, router_url = drill_plan.restore_name, drill_plan.router_url
BYPASS_ANNOTATION = "warmstart.io/drill-caches"
LOAD_TTL_S = 600
# The load pod's own slack past the load's duration: the last requests' answers and the result line.
LOAD_SLACK_S = 120
COMPONENT = "warmstart-drill"


def run_labels(run_id: str, role: str) -> dict[str, str]:
    return {drill_plan.RUN_LABEL: run_id, "app.kubernetes.io/component": role,
            "app.kubernetes.io/part-of": "warmstart", "app.kubernetes.io/managed-by": COMPONENT}


def _meta(name: str, namespace: str, run_id: str, role: str, expires: str) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": run_labels(run_id, role),
            "annotations": {drill_plan.EXPIRES_ANNOTATION: expires}}


def _script(module: str) -> str:
    return (Path(__file__).parent / f"{module}.py").read_text()


def _small_container(name: str, args: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        # The router's image has python3 (the standby actuator runs in it, docs/scale-out.md) and
        # is already on the CPU nodes.
        "image": versions.SMG_IMAGE,
        "imagePullPolicy": serving.IMAGE_PULL_POLICY,
        "command": ["python3", "-I", "-c"],
        "args": args,
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "resources": {"requests": {"cpu": "250m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": serving.container_security_context(),
    }


def load_job(p: drill_plan.DrillPlan, served_model: str) -> dict[str, Any]:
    """The load: one pod, in the cluster (a router behind an internal load balancer is not
    reachable from a laptop, and a port-forward would add its own queue to every time)."""
    b = p.bounds
    exp = p.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    args = [_script("load_script"), "--url", router_url(p.model, p.namespace), "--model", served_model,
            "--rate", f"{b.rate:g}", "--duration", str(b.duration_s), "--concurrency", str(b.concurrency),
            "--max-requests", str(b.request_cap), "--max-tokens", str(b.max_tokens),
            "--prefix-groups", str(b.prefix_groups), "--seed", p.run_id]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": _meta(load_job_name(p.run_id), p.namespace, p.run_id, "drill-load", exp),
        "spec": {
            "backoffLimit": 0,  # a second load would be a second step, not this one
            "activeDeadlineSeconds": b.duration_s + LOAD_SLACK_S,
            "ttlSecondsAfterFinished": LOAD_TTL_S,
            "template": {
                "metadata": {"labels": run_labels(p.run_id, "drill-load")},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": serving.pod_security_context(),
                    "containers": [_small_container("load", args)],
                },
            },
        },
    }


def fallback_pod(p: drill_plan.DrillPlan, deployment: dict[str, Any]) -> dict[str, Any]:
    """One standalone pod from the model's pod template, its caches bypassed: every hostPath
    volume (the node's compile cache and staged weights) replaced by an emptyDir, and the bypass
    switch set for the pod scripts (the compile-cache restore from S3 skips). Its labels keep
    `app.kubernetes.io/name` but not the Deployment's selector (a ReplicaSet adopts an orphan pod
    its selector matches, then deletes it as a surplus:
    https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/#non-template-pod-acquisitions),
    and no engine label, so no router sends to it."""
    template = copy.deepcopy(deployment["spec"]["template"])
    spec = template["spec"]
    for v in spec.get("volumes") or []:
        if "hostPath" in v:
            del v["hostPath"]
            v["emptyDir"] = {}
    for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        env = [e for e in c.get("env") or [] if e.get("name") != BYPASS_ENV]
        c["env"] = env + [{"name": BYPASS_ENV, "value": "1"}]
    spec["activeDeadlineSeconds"] = p.bounds.deadline_s
    spec["restartPolicy"] = "Never"  # a pod outside a controller; a crash is a measured failure
    exp = p.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = _meta(fallback_pod_name(p.model, p.run_id), p.namespace, p.run_id, "drill-cold", exp)
    meta["labels"].update({"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": fallback_instance(p.model)})
    meta["annotations"].update({**(template.get("metadata") or {}).get("annotations", {}),
                                BYPASS_ANNOTATION: "bypassed: node weights cache, compile cache, engine state"})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def fallback_instance(model: str) -> str:
    return f"{model}-drill-cold"[:63]


def fallback_network_policy(p: drill_plan.DrillPlan) -> dict[str, Any]:
    """The cloned pod is selected by none of the model's NetworkPolicies (they select its
    Deployment's labels): it accepts nothing and sends DNS and HTTPS only (S3, STS)."""
    np = egress_only_network_policy(fallback_pod_name(p.model, p.run_id), p.namespace,
                                    {"app.kubernetes.io/instance": fallback_instance(p.model),
                                     drill_plan.RUN_LABEL: p.run_id}, run_labels(p.run_id, "drill-cold"))
    np["metadata"]["annotations"] = {drill_plan.EXPIRES_ANNOTATION: p.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")}
    return np


# --- RBAC ---------------------------------------------------------------------------------------
# (apiGroup, resource, verbs). What the drill sends, and nothing else: the stand-in API server of
# the tests refuses any request outside these (tests/support/kube_api.py), and docs/drill.md lists
# them for the user.
DRILL_NAMESPACE_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "pods", ("get", "list", "watch", "create", "delete")),
    ("", "pods/log", ("get",)),
    ("", "pods/eviction", ("create",)),
    ("", "events", ("list",)),
    ("", "serviceaccounts", ("create", "delete")),
    ("apps", "deployments", ("get", "list", "patch")),
    ("apps", "deployments/scale", ("get", "patch")),
    ("batch", "jobs", ("get", "list", "create", "delete")),
    ("networking.k8s.io", "networkpolicies", ("create", "delete", "list")),
    ("rbac.authorization.k8s.io", "roles", ("create", "delete")),
    ("rbac.authorization.k8s.io", "rolebindings", ("create", "delete")),
    # The model's ScaledObject: the metrics endpoint the prefix-cache line queries (prefix.py).
    ("keda.sh", "scaledobjects", ("get",)),
)
DRILL_CLUSTER_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "nodes", ("get", "list", "patch")),
    ("rbac.authorization.k8s.io", "clusterroles", ("create", "delete")),
    ("rbac.authorization.k8s.io", "clusterrolebindings", ("create", "delete")),
)
# The restore Job's own: what restore.py sends from inside the cluster.
RESTORE_NAMESPACE_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "pods", ("list", "delete")),
    ("", "serviceaccounts", ("delete",)),
    ("apps", "deployments", ("list", "patch")),
    ("apps", "deployments/scale", ("patch",)),
    ("batch", "jobs", ("list", "delete")),
    ("networking.k8s.io", "networkpolicies", ("list", "delete")),
    ("rbac.authorization.k8s.io", "roles", ("delete",)),
    ("rbac.authorization.k8s.io", "rolebindings", ("delete",)),
)
RESTORE_CLUSTER_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "nodes", ("list", "patch")),
    ("rbac.authorization.k8s.io", "clusterroles", ("delete",)),
    ("rbac.authorization.k8s.io", "clusterrolebindings", ("delete",)),
)


def _rules(rules: tuple[tuple[str, str, tuple[str, ...]], ...]) -> list[dict[str, Any]]:
    return [{"apiGroups": [g], "resources": [r], "verbs": list(v)} for g, r, v in rules]


def drill_role(namespace: str, name: str = "warmstart-drill") -> list[dict[str, Any]]:
    """The Role and ClusterRole a user needs to run the drill (docs/drill.md); the ClusterRole only
    for `--lose-prepared-node` (nodes are cluster-scoped) and for finding prepared nodes."""
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": namespace}, "rules": _rules(DRILL_NAMESPACE_RULES)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name}, "rules": _rules(DRILL_CLUSTER_RULES)},
    ]


def restore_objects(p: drill_plan.DrillPlan, cluster_scope: bool) -> list[dict[str, Any]]:
    """The in-cluster expiry: a ServiceAccount, its Role (and ClusterRole to uncordon, only when
    the run cordons), their bindings, and a Job that sleeps until the run's expiry, then runs
    restore.py with that identity. `activeDeadlineSeconds` bounds it past the expiry."""
    name, ns, rid = restore_name(p.run_id), p.namespace, p.run_id
    exp = p.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    wait_s = max(0, int((p.expires_at - p.started_at).total_seconds()))
    objs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, ns, rid, "drill-restore", exp)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, ns, rid, "drill-restore", exp),
         "rules": _rules(RESTORE_NAMESPACE_RULES)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": _meta(name, ns, rid, "drill-restore", exp),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
    ]
    if cluster_scope:
        cmeta = _meta(f"{ns}-{name}", ns, rid, "drill-restore", exp)
        del cmeta["namespace"]
        objs += [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": cmeta,
             "rules": _rules(RESTORE_CLUSTER_RULES)},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": copy.deepcopy(cmeta),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{ns}-{name}"},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
        ]
    container = _small_container("restore", [_script("restore"), "--namespace", ns, "--run", rid,
                                             "--wait", str(wait_s), "--in-cluster"])
    container["env"].append({"name": "WARMSTART_DRILL_JOB", "value": name})
    objs.append({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(name, ns, rid, "drill-restore", exp),
        "spec": {
            "backoffLimit": 3,
            "activeDeadlineSeconds": wait_s + 900,
            "ttlSecondsAfterFinished": LOAD_TTL_S,
            "template": {
                "metadata": {"labels": run_labels(rid, "drill-restore")},
                "spec": {"restartPolicy": "OnFailure", "serviceAccountName": name,
                         "securityContext": serving.pod_security_context(), "containers": [container]},
            },
        },
    })
    return objs


def dump(obj: dict[str, Any]) -> str:
    return json.dumps(obj, sort_keys=True)
