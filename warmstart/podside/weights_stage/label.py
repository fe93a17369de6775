"""The weights stager's node label: an NFD NodeFeature owned by the stager's pod, applied and
deleted through the API server.

Part of the weights_stage package (main.py's docstring has the commands, the life of a copy, the
faults and the environment); the API calls are common/kube.py's, the one client of the pod scripts.
"""

from __future__ import annotations

from typing import Any

from ..common.kube import APPLY_PATCH, InCluster
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


def feature_path(settings: Settings, name: str | None = None) -> str:
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
    api = InCluster(settings.kube_api, settings.sa_dir, timeout=timeout)
    try:
        if present:
            status, _ = api.request("PATCH", feature_path(settings, name) + "?fieldManager=warmstart-weights&force=true",
                                    node_feature(settings), content_type=APPLY_PATCH)
            ok = 200 <= status < 300
            record.update(result="labelled" if ok else "error", reason=None if ok else f"HTTP {status}")
        else:
            status, _ = api.request("DELETE", feature_path(settings, name))
            ok = 200 <= status < 300 or status == 404
            record.update(result="unlabelled" if ok else "error", reason=None if ok else f"HTTP {status}")
    except Exception as exc:  # noqa: BLE001 - a label is an optimisation, never a failure
        record.update(result="error", reason=f"{type(exc).__name__}: {exc}")
    return record
