"""The standby actuator's pods figure as the render wires it (docs/scale-out.md, "A sleeper for
every step"): prod's standby model gets a ScaledObject trigger (KEDA's metrics-api, valid
against the vendored CRD) that reads the actuator's figure from a Service whose only endpoint is
the actuator's figure port; only KEDA's operator may reach that port; the actuator may raise the
replicas of the Deployment the ScaledObject scales, and nothing else of it. How the figure moves
on a wake runs for real in tests/podside/test_standby_scale.py; what the HPA does with it, in
tests/autoscaling/test_hpa.py and bench/scaleout.py."""

from __future__ import annotations

import urllib.parse

import pytest

from tests.support.keda import validate_keda
from tests.support.stacks import load_stack_doc, render_doc
from warmstart.decisions import autoscaling as scaling
from warmstart.decisions import standby
from warmstart.manifests import standby as standby_objects


@pytest.fixture(scope="module")
def prod(tmp_path_factory):
    doc = load_stack_doc("prod")
    (entry,) = [m for m in doc["config"]["warmstart:models"] if m.get("standby")]
    r = render_doc(doc, tmp_path_factory.mktemp("prod"), "prod")
    (m,) = [p for p in r.stack_plan.models if p.name == entry["name"]]
    by = {(o["kind"], o["metadata"]["name"]): o for o in r.kubernetes_objects}
    return r, m, by, entry


def test_the_scaled_object_reads_the_actuators_figure_from_its_service(prod):
    r, m, by, entry = prod
    so = by[("ScaledObject", m.name)]
    validate_keda(so)
    (fig,) = [t for t in so["spec"]["triggers"] if t["type"] == "metrics-api"]
    meta = fig["metadata"]
    # Target one pod, AverageValue: the HPA's recommendation is the figure itself.
    assert (fig["name"], fig["metricType"], float(meta["targetValue"])) == ("standby-pods", "AverageValue", 1.0)
    assert meta["format"] == "json" and meta["valueLocation"] == "pods"
    assert "aggregateFromKubeServiceEndpoints" not in meta, "one actuator: the Service's address, not its endpoints"
    # The prometheus triggers stay: they scale the awake engines on load (and hold while the figure errors).
    assert {t["name"] for t in so["spec"]["triggers"] if t["type"] == "prometheus"} >= {"waiting-requests", "engine-demand"}
    url = urllib.parse.urlsplit(meta["url"])
    service, namespace = url.hostname.split(".")[:2]
    svc = by[("Service", service)]
    assert svc["metadata"]["namespace"] == namespace == r.stack_plan.config.namespace
    actuator = by[("Deployment", service)]
    pod = actuator["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == url.port]
    (c,) = pod["spec"]["containers"]
    assert [p["containerPort"] for p in c["ports"] if p["name"] == port["targetPort"]] == [standby.FIGURE_PORT]
    args = c["args"]
    assert args[args.index("--figure-port") + 1] == str(standby.FIGURE_PORT)
    assert url.path == standby.FIGURE_PATH
    # The figure's parts are the model's own: its sleepers, its floor, its per-engine load, its ceiling.
    a = entry["autoscaling"]
    assert args[args.index("--standby") + 1] == str(entry["standby"]["count"])
    assert args[args.index("--max-pods") + 1] == str(so["spec"]["maxReplicaCount"])
    assert float(args[args.index("--target-requests") + 1]) == float(
        a.get("targetRequestsPerReplica", scaling.DEFAULT_TARGET_REQUESTS_PER_REPLICA))


def test_only_kedas_operator_reaches_the_figure(prod):
    r, m, by, _ = prod
    name = standby.actuator_name(m.name)
    pol = by[("NetworkPolicy", name)]
    assert pol["spec"]["podSelector"]["matchLabels"] == standby_objects.selector(m.name)
    keda_ns = "keda"
    assert pol["spec"]["ingress"] == [{
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": keda_ns}},
                  "podSelector": {"matchLabels": {"app": "keda-operator"}}}],
        "ports": [{"port": standby.FIGURE_PORT, "protocol": "TCP"}]}]
    # No other policy of the stack admits anything to the actuator's pods.
    labels = by[("Deployment", name)]["spec"]["template"]["metadata"]["labels"]
    others = [o for o in r.kubernetes_objects if o["kind"] == "NetworkPolicy" and o is not pol
              and o["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
              and o["metadata"]["namespace"] == pol["metadata"]["namespace"] and o["spec"].get("ingress")]
    assert others == [], [o["metadata"]["name"] for o in others]


def test_the_actuator_may_raise_the_scaled_deployment_and_nothing_else(prod):
    _, m, by, _ = prod
    so = by[("ScaledObject", m.name)]
    name = standby.actuator_name(m.name)
    role = by[("Role", name)]
    target = so["spec"]["scaleTargetRef"]["name"]
    assert ("Deployment", target) in by
    (scale,) = [rule for rule in role["rules"] if rule["apiGroups"] == ["apps"]]
    assert scale == {"apiGroups": ["apps"], "resources": ["deployments/scale"], "resourceNames": [target],
                     "verbs": ["get", "patch"]}
    args = by[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--deployment") + 1] == target
