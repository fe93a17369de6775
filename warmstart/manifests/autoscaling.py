"""KEDA and metrics-collection objects as plain dicts (pure): per model a TriggerAuthentication and
a ScaledObject; per stack the managed collector's scrape configuration, the Kubernetes RBAC it may
need, and the KEDA chart's values.

The components (components/autoscaling.py, components/monitoring.py) register these; the tests
validate them against the vendored KEDA CRDs and run the PromQL and the scrape configuration
through `promtool`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from ..decisions import autoscaling as decide
from ..decisions import placement
from .serving import METRICS_PORT, METRICS_PORT_NAME

KEDA_API_VERSION = "keda.sh/v1alpha1"
KEDA_NAMESPACE = "keda"
# The chart's operator ServiceAccount (`serviceAccount.operator.name`, default `keda-operator`,
# https://github.com/kedacore/charts/blob/v2.20.2/keda/values.yaml): the IRSA subject.
KEDA_OPERATOR_SERVICE_ACCOUNT = "keda-operator"
# The operator's pod labels: the chart's `app: {{ .Values.operator.name }}` (default
# `keda-operator`; the metrics server and the webhooks carry their own names), the selector of its
# Deployment (https://github.com/kedacore/charts/blob/v2.20.2/keda/templates/manager/deployment.yaml).
KEDA_OPERATOR_LABELS = {"app": "keda-operator"}

# The router's pods, as the routing component labels them, and its metrics port
# (SMG `--prometheus-port`, default 29000).
ROUTER_NAME = "router"
ROUTER_METRICS_PORT_NAME = "metrics"
ROUTER_METRICS_PORT = 29000
# The serving pods' `app.kubernetes.io/name`, and their metrics-only port (manifests/serving.py).
VLLM_NAME = "vllm"
VLLM_PORT_NAME = METRICS_PORT_NAME
VLLM_PORT = METRICS_PORT


# Labels the scrape adds to every series: the pod's namespace (the triggers select on it), its
# name, and which workload and model it belongs to.
SCRAPE_TARGET_LABELS = {
    "__meta_kubernetes_namespace": decide.NAMESPACE_LABEL,
    "__meta_kubernetes_pod_name": "pod",
    "__meta_kubernetes_pod_label_app_kubernetes_io_name": "workload",
    "__meta_kubernetes_pod_label_app_kubernetes_io_instance": "warmstart_model",
}


def labels(model: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "keda-autoscaling", "app.kubernetes.io/instance": model,
            "app.kubernetes.io/part-of": "warmstart", "app.kubernetes.io/managed-by": "pulumi"}


def trigger_authentication_name(model: str) -> str:
    return f"{model}-keda-aws"


def server_address(endpoint: str) -> str:
    """KEDA's `serverAddress` from a Prometheus-compatible base URL.

    KEDA appends the path itself (`fmt.Sprintf("%s/api/v1/query?...", ServerAddress)` in
    https://github.com/kedacore/keda/blob/v2.20.2/pkg/scalers/prometheus_scaler.go), while
    `aws.amp.Workspace.prometheus_endpoint` ends with a slash
    (`https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>/`): the slash goes, or the
    query would go to `...//api/v1/query`.
    """
    if not endpoint.startswith(("https://", "http://")):
        raise ValueError(f"{endpoint!r} is not an http(s) URL")
    base = endpoint.rstrip("/")
    if base.endswith("/api/v1/query") or base.endswith("/api/v1"):
        raise ValueError(f"{endpoint!r} names the query API; give the base URL (KEDA appends /api/v1/query)")
    return base


def trigger_authentication(model: str, namespace: Any) -> dict[str, Any]:
    """Sign AMP queries with the KEDA operator's own IRSA role (`identityOwner: keda`): the
    operator's credentials, not the workload's, so the model's role gains no AMP access
    (https://keda.sh/docs/2.20/authentication-providers/aws/)."""
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "TriggerAuthentication",
        "metadata": {"name": trigger_authentication_name(model), "namespace": namespace, "labels": labels(model)},
        "spec": {"podIdentity": {"provider": "aws", "identityOwner": "keda"}},
    }


def _number(x: float) -> str:
    return format(float(x), ".15g")


def scaled_object(p: decide.ScalingPlan, server: Any, *, region: str | None, authentication: str | None
                  ) -> dict[str, Any]:
    """The model's ScaledObject. `server`: KEDA's serverAddress (a string or a Pulumi Input);
    `region` and `authentication` (a TriggerAuthentication name) for AMP's SigV4, both None for a
    plain Prometheus-compatible endpoint."""
    if (region is None) != (authentication is None):
        raise ValueError("region and authentication go together (SigV4 to AMP), or neither")
    trig = []
    for t in p.triggers:
        meta: dict[str, Any] = {
            "serverAddress": server,
            "query": t.query,
            "threshold": _number(t.threshold),
            # With replicas >= 1 an empty result means the scrape is broken, not an idle model:
            # fail the trigger (the HPA then keeps the replica count) instead of reading 0
            # and scaling in (`ignoreNullValues`, default true, same file as above).
            "ignoreNullValues": "false",
        }
        entry: dict[str, Any] = {"type": "prometheus", "name": t.name, "metricType": t.metric_type, "metadata": meta}
        if region is not None:
            # `awsRegion` selects SigV4 signing (aws.NewSigV4RoundTripper in prometheus_scaler.go);
            # `identityOwner: operator` is what KEDA's AMP example sets
            # (https://keda.sh/docs/2.20/scalers/prometheus/#example-amazon-managed-service-for-prometheus-amp).
            meta |= {"awsRegion": region, "identityOwner": "operator"}
            entry["authenticationRef"] = {"name": authentication, "kind": "TriggerAuthentication"}
        trig.append(entry)
    if (q := p.queue_trigger) is not None:
        # Zero pods: KEDA's operator reads every router pod's front queue itself (metrics-api,
        # https://keda.sh/docs/2.20/scalers/metrics-api/; field names as
        # https://github.com/kedacore/keda/blob/v2.20.2/pkg/scalers/metrics_api_scaler.go parses
        # them), summing over the Service's Ready endpoints, so a request held by any router counts.
        trig.append({"type": "metrics-api", "name": "front-queue-demand", "metricType": "AverageValue", "metadata": {
            "url": q.url, "format": "json", "valueLocation": q.value_location,
            "targetValue": _number(q.target), "activationTargetValue": _number(q.activation),
            "aggregateFromKubeServiceEndpoints": "true", "aggregationType": "sum"}})
    if (f := p.standby_trigger) is not None:
        # With standby: the actuator's pods figure, read by KEDA's operator from the actuator's
        # Service when the HPA asks (decisions/autoscaling.py `StandbyTrigger` says why).
        trig.append({"type": "metrics-api", "name": "standby-pods", "metricType": "AverageValue", "metadata": {
            "url": f.url, "format": "json", "valueLocation": f.value_location, "targetValue": _number(f.target)}})
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": {"name": p.model, "namespace": p.namespace, "labels": labels(p.model)},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": p.deployment},
            "minReplicaCount": p.min_replicas,
            "maxReplicaCount": p.max_replicas,
            "pollingInterval": p.polling_interval_seconds,
            "cooldownPeriod": p.cooldown_period_seconds,
            "advanced": {
                # Deleting the ScaledObject leaves the Deployment at its current size rather than
                # jumping back to the count it was created with.
                "restoreToOriginalReplicaCount": False,
                "horizontalPodAutoscalerConfig": {"behavior": decide.hpa_behavior(p)},
            },
            "triggers": trig,
        },
    }


def scrape_configuration(namespaces: Sequence[str], *, router: bool,
                         scrape_interval_seconds: int = decide.SCRAPE_INTERVAL_SECONDS) -> dict[str, Any]:
    """The managed collector's Prometheus configuration: pods of `namespaces` only, vLLM's
    metrics-only port (`metrics`, 8001: the pod's metrics proxy) `/metrics`, and, with routing,
    the router's `metrics` port.

    The collector supports `kubernetes_sd_configs` and `relabel_configs` and scrapes no more
    often than every 30 s (https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-collector-how-to.html#AMP-collector-configuration).
    Pods are kept by their `app.kubernetes.io/name` label AND the named container port, so a
    target is exactly one container port; everything else in the cluster is dropped before
    any scrape.
    """
    if scrape_interval_seconds < decide.SCRAPE_INTERVAL_SECONDS:
        raise ValueError(f"the managed collector scrapes at most every {decide.SCRAPE_INTERVAL_SECONDS} s")
    ns = sorted(set(namespaces))
    if not ns:
        raise ValueError("at least one namespace")

    def job(name: str, workload: str, port_name: str) -> dict[str, Any]:
        return {
            "job_name": name,
            "metrics_path": "/metrics",
            "scheme": "http",
            "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": ns}}],
            "relabel_configs": [
                {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name",
                                   "__meta_kubernetes_pod_container_port_name"],
                 "separator": ";", "regex": f"{workload};{port_name}", "action": "keep"},
                # A pod still Pending has no IP yet; a finished one has no server.
                {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Pending|Succeeded|Failed|Unknown",
                 "action": "drop"},
            ] + [{"source_labels": [src], "target_label": dst, "action": "replace"}
                 for src, dst in SCRAPE_TARGET_LABELS.items()],
        }

    jobs = [job("vllm", VLLM_NAME, VLLM_PORT_NAME)]
    if router:
        jobs.append(job("router", ROUTER_NAME, ROUTER_METRICS_PORT_NAME))
    return {"global": {"scrape_interval": f"{scrape_interval_seconds}s"}, "scrape_configs": jobs}


def scrape_configuration_yaml(namespaces: Sequence[str], *, router: bool) -> str:
    """What `aws.amp.Scraper(scrape_configuration=...)` takes: the YAML text (sorted, so two
    renders never diff)."""
    return yaml.dump(scrape_configuration(namespaces, router=router), Dumper=_PlainDumper, sort_keys=True)


class _PlainDumper(yaml.SafeDumper):
    """Writes every repeated value out in full: no `&id001` anchors or `*id001` aliases, which not
    every consumer of a Prometheus configuration is known to accept."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# KEDA's own defaults (https://github.com/kedacore/charts/blob/v2.20.2/keda/values.yaml
# `resources`), kept explicit so a chart bump cannot change them unseen.
KEDA_RESOURCES = {"limits": {"cpu": "1", "memory": "1000Mi"}, "requests": {"cpu": "100m", "memory": "100Mi"}}


def _chart_placement(non_gpu: placement.NonGpuPlacement) -> dict[str, Any]:
    """The chart's top-level `nodeSelector`, `tolerations` and `affinity` values
    (https://github.com/kedacore/charts/blob/v2.20.2/keda/values.yaml)."""
    fields = non_gpu.pod_fields()
    return {"nodeSelector": fields.get("nodeSelector", {}), "tolerations": fields.get("tolerations", []),
            **({"affinity": fields["affinity"]} if "affinity" in fields else {})}


_CONTAINER_SECURITY = {"capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": False,
                       "readOnlyRootFilesystem": True, "seccompProfile": {"type": "RuntimeDefault"}}


def keda_values(mode: placement.ClusterMode, operator_role_arn: Any | None,
                non_gpu: placement.NonGpuPlacement | None = None,
                service_account: str = KEDA_OPERATOR_SERVICE_ACCOUNT) -> dict[str, Any]:
    """Values of the `kedacore/keda` chart: every KEDA pod on non-GPU nodes (`non_gpu`, default
    the warmstart platform's own CPU NodePool: KEDA must not wait for a GPU node nor keep one
    alive), the operator's
    ServiceAccount annotated with its IRSA role (`podIdentity.aws.irsa`; None: a plain endpoint
    needs no AWS identity), non-root, read-only, all capabilities dropped, and no Secret access
    (warmstart's triggers read none)."""
    values: dict[str, Any] = {
        # The chart adds `kubernetes.io/os: linux` itself (templates/*/deployment.yaml); this
        # selector is merged under it, and no GPU taint is tolerated.
        **_chart_placement(non_gpu or placement.own_platform_placement()),
        "resources": {"operator": KEDA_RESOURCES, "metricServer": KEDA_RESOURCES, "webhooks": KEDA_RESOURCES},
        "securityContext": {c: _CONTAINER_SECURITY for c in ("operator", "metricServer", "webhooks")},
        "podSecurityContext": {c: {"runAsNonRoot": True} for c in ("operator", "metricServer", "webhooks")},
        "permissions": {"operator": {"restrict": {"secret": True}}, "metricServer": {"restrict": {"secret": True}}},
        "serviceAccount": {"operator": {"create": True, "name": service_account}},
    }
    if operator_role_arn is not None:
        values["podIdentity"] = {"aws": {"irsa": {"enabled": True, "roleArn": operator_role_arn}}}
    return values
