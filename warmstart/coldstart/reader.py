"""Read one pod's start from the cluster with the Kubernetes Python client and the user's
kubeconfig: the Pod, its Events (field selector on the pod's uid), its NodeClaim and Node, and
each container's log with timestamps. The client is imported here, late, so the rest of
warmstart works without the `report` extra.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .parser import PodStart, parse_pod_start

# Bounded memory: vLLM's start-up lines come first, so the head of each log is enough.
LOG_LIMIT_BYTES = 4 * 1024 * 1024
REQUEST_TIMEOUT_S = 20
NODECLAIM_API = ("karpenter.sh", "v1", "nodeclaims")


class ReaderError(RuntimeError):
    """The cluster cannot be read: no client, no kubeconfig, or the API refused. The message
    says what to do; the CLI prints it without a traceback."""


@dataclass
class Cluster:
    core: Any
    custom: Any
    api_client: Any

    def plain(self, obj: Any) -> Any:
        """A client model object as the API's JSON (camelCase dict)."""
        return self.api_client.sanitize_for_serialization(obj)


def connect(kubeconfig: str | None = None, context: str | None = None) -> Cluster:
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise ReaderError("the cold-start report needs the Kubernetes client: pip install 'warmstart[report]'") from None
    try:
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    except (ConfigException, FileNotFoundError, OSError, TypeError) as exc:
        where = kubeconfig or "$KUBECONFIG or ~/.kube/config"
        raise ReaderError(f"no usable kubeconfig ({where}): {exc}; run `aws eks update-kubeconfig --name <cluster> "
                          "--region <region>` or pass --kubeconfig") from None
    return Cluster(client.CoreV1Api(api_client), client.CustomObjectsApi(api_client), api_client)


def _api_error(exc: Exception, what: str) -> ReaderError:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None) or type(exc).__name__
    hint = {401: "the kubeconfig's credentials were refused (expired token?)",
            403: "your identity may not read this (needs get/list on pods, events, pods/log, nodes, nodeclaims)",
            404: "not found"}.get(status or 0, "")
    return ReaderError(f"{what}: {status or ''} {reason}{'; ' + hint if hint else ''}".strip())


def _raw(response: Any) -> Any:
    """The API's own JSON (or log text) of a call made with _preload_content=False: the client's
    typed models are skipped, so an object with fields newer than the client still reads."""
    data = response.data if hasattr(response, "data") else response
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    try:
        return json.loads(data)
    except ValueError:
        return data


def _call(fn: Any, what: str, *args: Any, **kwargs: Any) -> Any:
    try:
        return _raw(fn(*args, _request_timeout=REQUEST_TIMEOUT_S, _preload_content=False, **kwargs))
    except Exception as exc:  # the API's refusals and urllib3's errors: one clear line each
        if _is_api_error(exc) or type(exc).__module__.startswith("urllib3"):
            raise _api_error(exc, what) from None
        raise


def _optional(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """A read whose absence is a missing signal, not an error (a deleted node, a log gone)."""
    try:
        return _raw(fn(*args, _request_timeout=REQUEST_TIMEOUT_S, _preload_content=False, **kwargs))
    except Exception as exc:
        if _is_api_error(exc) and getattr(exc, "status", None) in (400, 403, 404):
            return None
        if _is_api_error(exc) or type(exc).__module__.startswith("urllib3"):
            raise _api_error(exc, f"calling {getattr(fn, '__name__', 'the API')}") from None
        raise


def _is_api_error(exc: Exception) -> bool:
    from kubernetes.client.exceptions import ApiException

    return isinstance(exc, ApiException)


def model_pods(cluster: Cluster, namespace: str, model: str, selector: dict[str, str]) -> list[dict]:
    """The model's pods, oldest first."""
    sel = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
    pods = _call(cluster.core.list_namespaced_pod, f"listing pods of {model} in {namespace}", namespace,
                 label_selector=sel)
    out = list(pods.get("items") or [])
    return sorted(out, key=lambda p: p["metadata"].get("creationTimestamp") or "")


def read_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """Everything the parser reads for one pod, as plain dicts and log text."""
    pod = _call(cluster.core.read_namespaced_pod, f"reading pod {namespace}/{name}", name, namespace)
    uid = pod["metadata"]["uid"]
    events = _call(cluster.core.list_namespaced_event, f"listing events of {name}", namespace,
                   field_selector=f"involvedObject.uid={uid}").get("items", [])
    node_name = (pod.get("spec") or {}).get("nodeName")
    node = _optional(cluster.core.read_node, node_name) if node_name else None
    nodeclaim = None
    claim = next((e["message"].split("nodeclaim/", 1)[1].split()[0] for e in events
                  if e.get("reason") == "Nominated" and "nodeclaim/" in (e.get("message") or "")), None)
    group, version, plural = NODECLAIM_API
    if claim:
        nodeclaim = _optional(cluster.custom.get_cluster_custom_object, group, version, plural, claim)
    if nodeclaim is None and node_name:
        listed = _optional(cluster.custom.list_cluster_custom_object, group, version, plural)
        for item in (listed or {}).get("items", []):
            if (item.get("status") or {}).get("nodeName") == node_name:
                nodeclaim = item
                break
    spec = pod.get("spec") or {}
    logs: dict[str, str] = {}
    for c in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        text = _optional(cluster.core.read_namespaced_pod_log, name, namespace, container=c["name"],
                         timestamps=True, limit_bytes=LOG_LIMIT_BYTES)
        if isinstance(text, str) and text:
            logs[c["name"]] = text
    return {"pod": pod, "events": events, "nodeclaim": nodeclaim, "node": node, "logs": logs}


def read_pod_start(cluster: Cluster, namespace: str, name: str) -> PodStart:
    got = read_pod(cluster, namespace, name)
    return parse_pod_start(got["pod"], got["events"], got["nodeclaim"], got["node"], got["logs"])
