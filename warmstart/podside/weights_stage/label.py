"""The weights stager's node label: an NFD NodeFeature owned by the stager's pod, applied and
deleted through the API server.

Part of weights_stage.py, whose docstring has the commands, the life of a copy, the faults and
the environment; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from .settings import NFD_API, NFD_NODE_NAME_LABEL, Settings

def node_feature(settings: Settings) -> dict[str, Any]:
    """The NodeFeature whose label nfd-master copies onto the node. Owned by this pod, so the
    garbage collector deletes it (and nfd-master the label) when the pod goes
    (https://kubernetes-sigs.github.io/node-feature-discovery/v0.19/usage/customization-guide.html#nodefeature-custom-resource).
    No blockOwnerDeletion: setting it needs update rights on the pod's finalizers."""
    return {
        "apiVersion": NFD_API, "kind": "NodeFeature",
        "metadata": {"name": feature_name(settings), "namespace": settings.namespace,
                     "labels": {NFD_NODE_NAME_LABEL: settings.node},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": settings.pod,
                                          "uid": settings.pod_uid}]},
        "spec": {"labels": {settings.label: settings.digest}},
    }


def feature_name(settings: Settings) -> str:
    model = settings.label.rsplit("/", 1)[-1]
    return f"{model}-weights-{settings.node}"[:253].rstrip(".-")


def _api(settings: Settings, method: str, path: str, body: Any = None, content_type: str = "application/json",
         timeout: float = 10) -> int:
    token = (settings.sa_dir / "token").read_text().strip()
    req = urllib.request.Request(settings.kube_api.rstrip("/") + path, method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": content_type,
                                          "Accept": "application/json"})
    context = None
    if settings.kube_api.startswith("https://"):
        context = ssl.create_default_context(cafile=str(settings.sa_dir / "ca.crt"))
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _feature_path(settings: Settings, name: str | None = None) -> str:
    base = f"/apis/{NFD_API}/namespaces/{settings.namespace}/nodefeatures"
    return base if name is None else f"{base}/{name}"


def label(settings: Settings, present: bool, timeout: float = 10) -> dict[str, Any]:
    """Apply (server-side apply: one idempotent call, verbs create+patch) or delete this
    node's NodeFeature. Never raises."""
    record: dict[str, Any] = {"phase": "label", "result": "skipped", "digest": settings.digest, "reason": None}
    if not settings.label or not settings.kube_api:
        record["reason"] = "WARMSTART_LABEL or the API server address is not set"
        return record
    if not (settings.node and settings.pod and settings.pod_uid and settings.namespace):
        record["reason"] = "NODE_NAME, POD_NAME, POD_UID and POD_NAMESPACE must come from the downward API"
        return record
    name = feature_name(settings)
    try:
        if present:
            status = _api(settings, "PATCH", _feature_path(settings, name) + "?fieldManager=warmstart-weights&force=true",
                          node_feature(settings), content_type="application/apply-patch+yaml")
            ok = 200 <= status < 300
            record.update(result="labelled" if ok else "error", reason=None if ok else f"HTTP {status}")
        else:
            status = _api(settings, "DELETE", _feature_path(settings, name), timeout=timeout)
            ok = 200 <= status < 300 or status == 404
            record.update(result="unlabelled" if ok else "error", reason=None if ok else f"HTTP {status}")
    except Exception as exc:  # noqa: BLE001 - a label is an optimisation, never a failure
        record.update(result="error", reason=f"{type(exc).__name__}: {exc}")
    return record
