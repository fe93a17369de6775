#!/usr/bin/env python3
"""Undo what drill runs left: one function used three ways.

- by `warmstart drill` itself when a run ends, also on Ctrl-C (the user's kubeconfig);
- by `warmstart drill --restore` after a run whose client was lost (every run of the namespace);
- by the run's restore Job inside the cluster, after the run's expiry (`--in-cluster`: its
  ServiceAccount token, standard library only, run by the router image's python3).

What a run changed carries its id (plan.py): objects it created have the label
`warmstart.io/drill-run`, a Deployment it scaled has the previous replicas in the annotation
`warmstart.io/drill-replicas` (with `warmstart.io/drill-run`), a node it cordoned the annotation
`warmstart.io/drill-cordoned`. Restoring: replicas set back through the scale subresource and the
annotations removed (a JSON merge patch with null, RFC 7386), nodes uncordoned, created objects
deleted. Idempotent: a second restore finds nothing to do.

In the cluster, the restore Job cannot delete the rules that let it act: it deletes its
ServiceAccount and its bindings last and leaves its Role (and ClusterRole), bound to no one, which
grant nothing; the client's restore deletes those.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable

RUN_LABEL = "warmstart.io/drill-run"
REPLICAS_ANNOTATION = "warmstart.io/drill-replicas"
CORDON_ANNOTATION = "warmstart.io/drill-cordoned"
# Karpenter's node-level opt-out of voluntary disruption (consolidation, drift), on Pod, Node and
# NodeClaim since v1 (https://karpenter.sh/docs/concepts/disruption/#node-level-controls): set on
# the cordoned node while the drill holds it, so the emptied node is not consolidated away
# mid-run; `PROTECT_ANNOTATION: added` records that the drill set it (a user's own is kept).
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
PROTECT_ANNOTATION = "warmstart.io/drill-do-not-disrupt"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MERGE = "application/merge-patch+json"

# call(method, path, query, body, content_type) -> (status, parsed JSON or None)
Call = Callable[[str, str, "dict[str, str] | None", Any, str], "tuple[int, Any]"]


def log(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "time": round(time.time(), 3), **fields}, sort_keys=True), flush=True)


def _items(call: Call, path: str, query: dict[str, str] | None = None) -> list[dict[str, Any]]:
    status, doc = call("GET", path, query, None, "application/json")
    if status != 200 or not isinstance(doc, dict):
        raise RuntimeError(f"GET {path}: {status}")
    return list(doc.get("items") or [])


def _ok(status: int) -> bool:
    return 200 <= status < 300 or status == 404  # gone already is restored


def _selector(run: str | None) -> str:
    return f"{RUN_LABEL}={run}" if run else RUN_LABEL


def restore(call: Call, namespace: str, run: str | None = None, *, in_cluster: bool = False,
            nodes: bool = True) -> list[str]:
    """Undo run `run` (None: every run) in `namespace`; returns what was done, one line each."""
    done: list[str] = []
    failed: list[str] = []

    def act(what: str, method: str, path: str, body: Any = None, ctype: str = "application/json",
            query: dict[str, str] | None = None) -> None:
        status, _ = call(method, path, query, body, ctype)
        (done if _ok(status) else failed).append(f"{what}" + ("" if _ok(status) else f" (HTTP {status})"))

    apps = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    for d in _items(call, apps):
        ann = (d["metadata"].get("annotations") or {})
        if REPLICAS_ANNOTATION not in ann or (run and ann.get(RUN_LABEL) != run):
            continue
        name, replicas = d["metadata"]["name"], int(ann[REPLICAS_ANNOTATION])
        act(f"Deployment {namespace}/{name}: replicas back to {replicas}", "PATCH", f"{apps}/{name}/scale",
            {"spec": {"replicas": replicas}}, MERGE)
        act(f"Deployment {namespace}/{name}: drill annotations removed", "PATCH", f"{apps}/{name}",
            {"metadata": {"annotations": {REPLICAS_ANNOTATION: None, RUN_LABEL: None}}}, MERGE)
    if nodes:
        for n in _items(call, "/api/v1/nodes"):
            ann = n["metadata"].get("annotations") or {}
            if CORDON_ANNOTATION not in ann or (run and ann[CORDON_ANNOTATION] != run):
                continue
            name = n["metadata"]["name"]
            undo: dict[str, Any] = {CORDON_ANNOTATION: None}
            if ann.get(PROTECT_ANNOTATION) == "added":  # only what the drill added itself
                undo.update({DO_NOT_DISRUPT: None, PROTECT_ANNOTATION: None})
            act(f"Node {name}: uncordoned" + (f", {DO_NOT_DISRUPT} removed" if DO_NOT_DISRUPT in undo else ""),
                "PATCH", f"/api/v1/nodes/{name}",
                {"spec": {"unschedulable": None}, "metadata": {"annotations": undo}}, MERGE)
    sel = {"labelSelector": _selector(run)}
    seen: set[str] = set()
    own = os.environ.get("WARMSTART_DRILL_JOB", "")
    ns = f"/namespaces/{namespace}"
    for j in _items(call, f"/apis/batch/v1{ns}/jobs", sel):
        name = j["metadata"]["name"]
        seen.add((j["metadata"].get("labels") or {}).get(RUN_LABEL, ""))
        if in_cluster and name == own:
            continue  # its own Job: the TTL controller removes it once it has finished
        act(f"Job {namespace}/{name}: deleted", "DELETE", f"/apis/batch/v1{ns}/jobs/{name}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"})
    for p in _items(call, f"/api/v1{ns}/pods", sel):
        if in_cluster and (p["metadata"].get("labels") or {}).get("job-name") == own:
            continue
        if p["metadata"].get("ownerReferences"):
            continue  # a Job's pod goes with its Job
        name = p["metadata"]["name"]
        act(f"Pod {namespace}/{name}: deleted", "DELETE", f"/api/v1{ns}/pods/{name}")
    for np in _items(call, f"/apis/networking.k8s.io/v1{ns}/networkpolicies", sel):
        name = np["metadata"]["name"]
        act(f"NetworkPolicy {namespace}/{name}: deleted", "DELETE", f"/apis/networking.k8s.io/v1{ns}/networkpolicies/{name}")
    # The restore identity last: the bindings are what let this run act.
    # Every run has a restore Job (labelled), so the jobs listed name the runs to clean up.
    runs = [run] if run else sorted(r for r in seen if r)
    for r in runs:
        name = f"drill-restore-{r}"
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        act(f"ServiceAccount {namespace}/{name}: deleted", "DELETE", f"/api/v1{ns}/serviceaccounts/{name}")
        if not in_cluster:
            act(f"Role {namespace}/{name}: deleted", "DELETE", f"{rbac}{ns}/roles/{name}")
            act(f"ClusterRole {namespace}-{name}: deleted", "DELETE", f"{rbac}/clusterroles/{namespace}-{name}")
        act(f"ClusterRoleBinding {namespace}-{name}: deleted", "DELETE", f"{rbac}/clusterrolebindings/{namespace}-{name}")
        act(f"RoleBinding {namespace}/{name}: deleted", "DELETE", f"{rbac}{ns}/rolebindings/{name}")
    if failed:
        raise RuntimeError("could not restore: " + "; ".join(failed))
    return done


def in_cluster_call(base: str | None = None) -> Call:
    """Calls with the pod's ServiceAccount token (re-read each call: the kubelet rotates it)."""
    if base is None:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        base = f"https://{host}:{port}"
    ctx = ssl.create_default_context(cafile=f"{SA_DIR}/ca.crt") if base.startswith("https:") else None

    def call(method: str, path: str, query: dict[str, str] | None, body: Any, ctype: str) -> tuple[int, Any]:
        try:
            with open(f"{SA_DIR}/token") as f:
                token = f.read().strip()
        except OSError:
            token = os.environ.get("WARMSTART_KUBE_TOKEN", "")
        url = base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        req = urllib.request.Request(url, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": ctype,
                                              "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=20, context=ctx) as r:
                return r.status, json.loads(r.read(8 << 20) or b"null")
        except urllib.error.HTTPError as err:
            return err.code, None
    return call


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--namespace", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--wait", type=float, default=0.0, help="seconds to wait first (the run's expiry)")
    p.add_argument("--in-cluster", action="store_true")
    a = p.parse_args(argv)
    log("warmstart.drill_restore", result="waiting", run=a.run, seconds=a.wait)
    time.sleep(max(0.0, min(a.wait, 86400.0)))
    try:
        done = restore(in_cluster_call(os.environ.get("WARMSTART_KUBE_API") or None), a.namespace, a.run,
                       in_cluster=a.in_cluster)
    except (RuntimeError, OSError, ValueError, KeyError) as err:
        log("warmstart.drill_restore", result="error", run=a.run, reason=str(err)[:500])
        return 1  # the Job retries (backoffLimit)
    log("warmstart.drill_restore", result="ok", run=a.run, done=done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
