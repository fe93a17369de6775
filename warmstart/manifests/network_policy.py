"""NetworkPolicies (networking.k8s.io/v1) of one model's pods, as plain object dicts (pure).

Once a NetworkPolicy selects a pod, that pod accepts and sends only what some policy allows
(https://kubernetes.io/docs/concepts/services-networking/network-policies/#the-two-sorts-of-pod-isolation).
Each model gets:

- `serving_network_policy`: its vLLM pods accept TCP 8000 only from the model's router pods
  when a router is in front of them, else from pods of their own namespace and of the
  namespaces named as clients; optionally from a metrics scraper outside the cluster (the
  Amazon Managed Service for Prometheus collector scrapes through ENIs in the VPC's subnets,
  https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-collector-how-to.html, so it is
  an ipBlock, not a pod). They send only DNS and HTTPS (`egress_rules`). A single pod serves
  every tensor-parallel rank (they talk over localhost and /dev/shm), so there is no rule
  between the model's pods.
- `weights_import_network_policy`: the import Job accepts nothing, sends only DNS and HTTPS.
- `egress_only_network_policy` / `deny_all_network_policy`: the same shape, or nothing at all,
  for any selector (the node cache's staging pods and warm-spare placeholders,
  `warmstart/manifests/node_cache.py`).

Why HTTPS to any address rather than to S3 alone: S3, reached through the VPC's gateway
endpoint, has only a managed prefix list of public ranges that change, which a NetworkPolicy
cannot name (ipBlock takes fixed CIDRs,
https://kubernetes.io/docs/reference/kubernetes-api/policy-resources/network-policy-v1/); the
pods also need STS (IRSA's AssumeRoleWithWebIdentity) and, for a Hub import, the Hugging Face
Hub. What the IAM roles allow is the boundary on what they can do there.

These objects only act where the cluster enforces them: `components/cluster.py` turns
enforcement on in both cluster modes (docs/security.md).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from .autoscaling import KEDA_NAMESPACE, KEDA_OPERATOR_LABELS
from .serving import HTTP_PORT, METRICS_PORT, selector
from .weights_import import labels as import_labels

API_VERSION = "networking.k8s.io/v1"
# The immutable label the API server puts on every namespace (Kubernetes >= 1.22,
# https://kubernetes.io/docs/concepts/services-networking/network-policies/#targeting-a-namespace-by-its-name).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
DNS_PORT = 53
HTTPS_PORT = 443
# Selector of a model's router pods (the router's own labels: name `router`, instance = model).
ROUTER_NAME = "router"


def router_selector(model: str) -> dict[str, str]:
    """The labels the model's router pods carry."""
    return {"app.kubernetes.io/name": ROUTER_NAME, "app.kubernetes.io/instance": model}


def keda_operator_peer(namespace: str = KEDA_NAMESPACE) -> dict[str, Any]:
    """KEDA's operator pods (in `namespace`), and only them: its metrics server and admission
    webhooks share the namespace but carry other `app` labels."""
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
            "podSelector": {"matchLabels": dict(KEDA_OPERATOR_LABELS)}}


def _labels(model: str) -> dict[str, str]:
    return {"app.kubernetes.io/instance": model, "app.kubernetes.io/part-of": "warmstart",
            "app.kubernetes.io/managed-by": "pulumi"}


def egress_rules() -> list[dict[str, Any]]:
    """DNS, then HTTPS anywhere (S3, STS, the Hub; see the module docstring).

    DNS to any address on port 53, not to kube-dns pods: in EKS Auto Mode the resolver the pods
    use runs on the node, not as pods in kube-system, so a kube-dns pod selector drops every
    lookup (https://github.com/aws/containers-roadmap/issues/2552)."""
    return [
        {"ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}]},
        {"ports": [{"protocol": "TCP", "port": HTTPS_PORT}]},
    ]


def _cidr_peers(cidrs: Sequence[str]) -> list[dict[str, Any]]:
    for c in cidrs:
        try:
            ipaddress.ip_network(c)  # strict: host bits set is an error, as the API server rejects it
        except ValueError as exc:
            raise ValueError(f"metrics scraper CIDR {c!r} is not a network address (e.g. 10.0.32.0/19): {exc}") from None
    return [{"ipBlock": {"cidr": c}} for c in cidrs]


def scraper_peers(cidrs: Sequence[str] = (),
                  pods: Sequence[tuple[str, Sequence[tuple[str, str]]]] = ()) -> list[dict[str, Any]]:
    """The peers a metrics port admits: scrapers outside the cluster by CIDR (the AMP managed
    collector's ENIs), and scraper pods by namespace and labels (a Prometheus of your own)."""
    peers = _cidr_peers(sorted(set(cidrs)))
    for ns, labels in sorted({(ns, tuple(sorted(labels))) for ns, labels in pods}):
        if not ns or not labels:
            raise ValueError("a metrics scraper pod selector needs a namespace and at least one label")
        peers.append({"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: ns}},
                      "podSelector": {"matchLabels": dict(labels)}})
    return peers


def serving_ingress_peers(model: str, *, router: Mapping[str, str] | None = None,
                          client_namespaces: Sequence[str] = (), actuator: Mapping[str, str] | None = None
                          ) -> list[dict[str, Any]]:
    """Who may open a connection to the vLLM serving port: the router pods (selected by `router`,
    in the model's namespace) when there is a router, else every pod of the model's namespace
    and of `client_namespaces`; and a standby model's actuator (`actuator`: its pods' labels),
    which calls vLLM's sleep routes. Scrapers never: they get the metrics-only port."""
    if actuator is not None and not actuator:
        raise ValueError(f"model {model}: an empty actuator selector would admit every pod of the namespace")
    extra = [{"podSelector": {"matchLabels": dict(actuator)}}] if actuator else []
    if router is not None:
        if not router:
            raise ValueError(f"model {model}: an empty router selector would admit every pod of the namespace")
        return [{"podSelector": {"matchLabels": dict(router)}}, *extra]
    # Without a router the namespace's pods, the actuator's among them, are admitted already.
    return [{"podSelector": {}}] + [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: ns}}}
                                    for ns in sorted(set(client_namespaces))]


def serving_network_policy(model: str, namespace: Any, *, router: Mapping[str, str] | None = None,
                           client_namespaces: Sequence[str] = (), metrics_cidrs: Sequence[str] = (),
                           metrics_pods: Sequence[tuple[str, Sequence[tuple[str, str]]]] = (),
                           actuator: Mapping[str, str] | None = None, port: int = HTTP_PORT) -> dict[str, Any]:
    """The NetworkPolicy of one model's vLLM pods (named after the model), serving on `port`.

    `router`: the labels of the model's router pods (`router_selector(model)`) when requests
    reach the pods through a router, None when clients call the Service directly.
    `client_namespaces`: other namespaces whose pods may call the Service (without a router).
    `actuator`: a standby model's actuator pods' labels, admitted to the serving port too.
    `metrics_cidrs` / `metrics_pods`: the scrapers, admitted to the metrics-only port alone. An
    ipBlock on the serving port would admit every pod: with the VPC CNI every pod address is a
    VPC address (https://docs.aws.amazon.com/eks/latest/userguide/managing-vpc-cni.html)."""
    ingress: list[dict[str, Any]] = [{
        "from": serving_ingress_peers(model, router=router, client_namespaces=client_namespaces, actuator=actuator),
        "ports": [{"protocol": "TCP", "port": port}],
    }]
    scrapers = scraper_peers(metrics_cidrs, metrics_pods)
    if scrapers:
        ingress.append({"from": scrapers, "ports": [{"protocol": "TCP", "port": METRICS_PORT}]})
    return {
        "apiVersion": API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": {"name": model, "namespace": namespace, "labels": _labels(model)},
        "spec": {
            "podSelector": {"matchLabels": selector(model)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress_rules(),
        },
    }


def weights_import_network_policy(model: str, namespace: Any) -> dict[str, Any]:
    """The NetworkPolicy of one model's weights-import Job pods: no ingress at all, egress DNS
    and HTTPS only."""
    pod_labels = import_labels(model)
    return {
        "apiVersion": API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{model}-import", "namespace": namespace, "labels": _labels(model)},
        "spec": {
            "podSelector": {"matchLabels": {k: pod_labels[k] for k in
                                            ("app.kubernetes.io/name", "app.kubernetes.io/instance")}},
            # Ingress listed with no rule: nothing may connect to the Job's pods.
            "policyTypes": ["Ingress", "Egress"],
            "egress": egress_rules(),
        },
    }


def egress_only_network_policy(name: str, namespace: Any, selector: Mapping[str, str],
                               labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Pods that accept nothing and send only DNS and HTTPS (`egress_rules`): the import Job's
    shape, for any selector (the node cache's staging pods: S3, STS and the Kubernetes API
    server, which an EKS pod reaches on TCP 443 through the `kubernetes` Service)."""
    if not selector:
        raise ValueError(f"NetworkPolicy {name}: an empty pod selector would select every pod of the namespace")
    return {
        "apiVersion": API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {"podSelector": {"matchLabels": dict(selector)}, "policyTypes": ["Ingress", "Egress"],
                 "egress": egress_rules()},
    }


def deny_all_network_policy(name: str, namespace: Any, selector: Mapping[str, str],
                            labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Pods that neither accept nor send anything (both policy types listed, no rule: the
    "default deny all" shape of
    https://kubernetes.io/docs/concepts/services-networking/network-policies/#default-deny-all-ingress-and-all-egress-traffic),
    such as the warm-spare placeholders, which only hold resources."""
    if not selector:
        raise ValueError(f"NetworkPolicy {name}: an empty pod selector would select every pod of the namespace")
    return {
        "apiVersion": API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
        "spec": {"podSelector": {"matchLabels": dict(selector)}, "policyTypes": ["Ingress", "Egress"]},
    }
