"""The metrics-only port of the serving pod: the wiring around warmstart/podside/metrics_proxy.py.

vLLM serves Prometheus `/metrics` on its serving port (https://docs.vllm.ai/en/latest/usage/metrics.html),
so a NetworkPolicy that admits the scraper there admits it to the completions API too. This
native sidecar (an init container with restartPolicy Always,
https://kubernetes.io/docs/concepts/workloads/pods/sidecar-containers/) serves only `GET /metrics`
on port `metrics` (8001), fetched from vLLM over the pod's loopback, so the scraper is admitted on
that port alone. It runs in the model's own image (standard library only: no extra pull).
Pure: it returns dicts; the serving component adds them to the pod.
"""

from __future__ import annotations

import re
from typing import Any

from . import pod_scripts
from .serving import (ANNOTATION_DOMAIN, HTTP_PORT, IMAGE_PULL_POLICY, METRICS_PORT, METRICS_PORT_NAME, PodExtras,
                      container_security_context)

CONFIGMAP_NAME = "warmstart-metrics-proxy"
SCRIPT_KEY = "metrics_proxy.pyz"
SCRIPT_MOUNT = "/opt/warmstart-metrics-proxy"
CONTAINER = "metrics-proxy"
PORT = METRICS_PORT
PORT_NAME = METRICS_PORT_NAME
UPSTREAM = f"http://127.0.0.1:{HTTP_PORT}/metrics"
# The whole upstream fetch, below Prometheus' default scrape_timeout of 10 s
# (https://prometheus.io/docs/prometheus/latest/configuration/configuration/#scrape_config).
UPSTREAM_TIMEOUT_S = 5
MAX_BYTES = 32 * 1024 * 1024
SCRIPT_ANNOTATION = f"{ANNOTATION_DOMAIN}/metrics-proxy-sha256"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def script_volume(script_config_map: str) -> str:
    """The pod volume that carries the script: named after its ConfigMap, so the container's
    mount and `volumes()` agree by construction (a volume name is a DNS label:
    https://kubernetes.io/docs/concepts/overview/working-with-objects/names/#dns-label-names)."""
    if not _DNS_LABEL.match(script_config_map):
        raise ValueError(f"the metrics proxy's ConfigMap name {script_config_map!r} is not a DNS label")
    return script_config_map


def metrics_proxy_container(image: str, script_config_map: str = CONFIGMAP_NAME,
                            vllm_port: int = HTTP_PORT) -> dict[str, Any]:
    """The sidecar: `image` is the model's vLLM image (it has python3); the script comes from
    the ConfigMap `script_config_map`, mounted read-only; vLLM serves on `vllm_port`."""
    return {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": IMAGE_PULL_POLICY,
        "command": ["python3", f"{SCRIPT_MOUNT}/{SCRIPT_KEY}", "--port", str(PORT), "--upstream",
                    UPSTREAM if vllm_port == HTTP_PORT else f"http://127.0.0.1:{vllm_port}/metrics",
                    "--timeout", str(UPSTREAM_TIMEOUT_S), "--max-bytes", str(MAX_BYTES)],
        # Read-only root filesystem: no bytecode next to the script.
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}],
        # Liveness, not readiness: a native sidecar's readiness counts toward the pod's
        # (https://kubernetes.io/docs/concepts/workloads/pods/sidecar-containers/#sidecar-containers-and-pod-lifecycle),
        # so a stuck metrics path would take the serving pod out of its Service; a stuck proxy is
        # restarted instead, and the pod keeps serving.
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": PORT_NAME},
                          "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3},
        "restartPolicy": "Always",
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}},
        "securityContext": {**container_security_context(), "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": script_volume(script_config_map), "mountPath": SCRIPT_MOUNT, "readOnly": True}],
    }


def volumes(script_config_map: str = CONFIGMAP_NAME) -> tuple[dict[str, Any], ...]:
    """The pod volumes the sidecar mounts."""
    return ({"name": script_volume(script_config_map), "configMap": {"name": script_config_map}},)


def metrics_proxy_extras(image: str, script_config_map: str = CONFIGMAP_NAME, vllm_port: int = HTTP_PORT) -> PodExtras:
    """The sidecar, its script volume and the script-digest annotation (pods roll onto a new script)."""
    return PodExtras(
        init_containers=(metrics_proxy_container(image, script_config_map, vllm_port),),
        volumes=volumes(script_config_map),
        pod_annotations={SCRIPT_ANNOTATION: pod_scripts.script_digest(SCRIPT_KEY)},
    )
