"""Scale from zero pods (docs/scale-out.md): a model at `minReplicas: 0` without standby renders a
ScaledObject that KEDA's operator activates from the routers' front queues (metrics-api, polled
every second, not through AMP's scrape), front queues whose bounds follow the model's predicted
cold start, and sizing and rules that know it. The queue itself runs for real in
tests/podside/test_front_queue.py; who reaches it, in tests/network/test_reachability.py (`zero-pods`)."""

from __future__ import annotations

import copy
import math
import urllib.parse

import pytest

from tests.support.keda import validate_keda
from tests.support.stacks import load_stack_doc, render_doc
from warmstart import render
from warmstart.config import AutoscalingConfig, LoaderTuning, ModelSpec
from warmstart.decisions import autoscaling as scaling
from warmstart.decisions import phases, routing
from warmstart.errors import ConfigErrors
from warmstart.manifests import network_policy
from warmstart.plan.cluster import model_non_gpu_pods
from warmstart.plan.model import plan_model
from warmstart.podside import front_queue

KEY = "warmstart:models[0]"


@pytest.fixture(scope="module")
def zero(tmp_path_factory):
    """prod with its autoscaled model's standby removed and minReplicas 0: zero pods."""
    doc = copy.deepcopy(load_stack_doc("prod"))
    model = doc["config"]["warmstart:models"][0]
    model.pop("standby")
    model["autoscaling"]["minReplicas"] = 0
    r = render_doc(doc, tmp_path_factory.mktemp("zero"), "prod-zero")
    (m,) = [p for p in r.stack_plan.models if p.name == model["name"]]
    return r, m


def _by(r):
    return {(o["kind"], o["metadata"]["name"]): o for o in r.kubernetes_objects}


def _flag(command, name):
    return command[command.index(name) + 1]


def test_keda_scales_from_zero_pods_on_the_front_queues_every_second(zero):
    r, m = zero
    by = _by(r)
    so = by[("ScaledObject", m.name)]
    validate_keda(so)
    spec = so["spec"]
    assert spec["minReplicaCount"] == 0 and by[("Deployment", m.name)]["spec"]["replicas"] == 0, "the GPU released"
    assert spec["pollingInterval"] == scaling.FROM_ZERO_POLLING_INTERVAL_SECONDS <= 2 < scaling.SCRAPE_INTERVAL_SECONDS
    (queue,) = [t for t in spec["triggers"] if t["type"] == "metrics-api"]
    meta = queue["metadata"]
    assert meta["format"] == "json" and float(meta["activationTargetValue"]) == 0, "one held request activates"
    assert (meta["aggregateFromKubeServiceEndpoints"], meta["aggregationType"]) == ("true", "sum")
    # KEDA takes the Service and namespace from the host's first two labels and dials each Ready
    # endpoint on the URL's port: it must be the port the Service's endpoints (the pods) carry.
    url = urllib.parse.urlsplit(meta["url"])
    service, namespace = url.hostname.split(".")[:2]
    svc = by[("Service", service)]
    assert svc["metadata"]["namespace"] == namespace == r.stack_plan.config.namespace
    router = by[("Deployment", f"{m.name}-router")]
    assert svc["spec"]["selector"].items() <= router["spec"]["template"]["metadata"]["labels"].items()
    target = svc["spec"]["ports"][0]["targetPort"]
    (fq,) = [c for c in router["spec"]["template"]["spec"]["containers"] if c["name"] == "front-queue"]
    assert [p["containerPort"] for p in fq["ports"] if p["name"] == target] == [url.port]
    assert url.path == front_queue.HELD_PATH == routing.FRONT_QUEUE_HELD_PATH
    # The value it reads is one the front queue answers (tests/podside/test_front_queue.py reads it).
    gate = front_queue.Gate("http://127.0.0.1:1/", 1, 1)
    assert isinstance(gate.counts()[meta["valueLocation"]], int)
    # 1 -> N stays the waiting-requests trigger's: the queue's target is its whole count bound.
    assert float(meta["targetValue"]) == routing.FRONT_QUEUE_MAX_HELD


def test_a_loading_pod_is_not_scaled_back_to_zero(zero):
    """KEDA removes the last pod only `cooldownPeriod` after a trigger was last active (a request
    held or in flight); that is at least the model's start-up budget, which bounds a load."""
    r, m = zero
    spec = _by(r)[("ScaledObject", m.name)]["spec"]
    assert spec["cooldownPeriod"] >= m.startup_budget_seconds
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
        "stabilizationWindowSeconds"] >= min(scaling.MAX_STABILIZATION_SECONDS, m.startup_budget_seconds)
    # the waiting query fails while no vLLM pod reports (ignoreNullValues false): KEDA 2.20.2 does
    # not deactivate a ScaledObject whose trigger errors (`isError && Fallback == nil`)
    prometheus = [t for t in spec["triggers"] if t["type"] == "prometheus"]
    assert [t["name"] for t in prometheus] == ["waiting-requests", "engine-demand"]
    assert all(t["metadata"]["ignoreNullValues"] == "false" for t in prometheus) and "fallback" not in spec


def test_the_front_queue_holds_for_the_predicted_cold_start_and_says_when_to_return(zero):
    r, m = zero
    router = _by(r)[("Deployment", f"{m.name}-router")]
    (fq,) = [c for c in router["spec"]["template"]["spec"]["containers"] if c["name"] == "front-queue"]
    ready = phases.predict_from_zero(m.weights_bytes, m.instance, compile_cached=m.compile_cache).total_seconds
    retry, hold = int(_flag(fq["command"], "--retry-after")), int(_flag(fq["command"], "--max-hold-seconds"))
    assert retry >= math.ceil(ready)
    assert f"from zero pods a held request is answered ~{ready:.0f}s" in render.scale_out_line(m)
    # a start on time answers the held requests: they are held past the predicted ready time
    assert hold >= min(retry, routing.FRONT_QUEUE_MAX_HOLD_SECONDS) and hold <= routing.FRONT_QUEUE_MAX_HOLD_SECONDS
    # KEDA's operator is admitted to the serving port; nothing else new
    policy = _by(r)[("NetworkPolicy", f"{m.name}-router")]
    keda = [rule for rule in policy["spec"]["ingress"] if network_policy.keda_operator_peer() in rule.get("from", [])]
    assert keda == [{"from": [network_policy.keda_operator_peer()], "ports": [{"port": routing.ROUTER_PORT,
                                                                             "protocol": "TCP"}]}]
    assert model_non_gpu_pods(m)[0].cpu_millis > int(routing.ROUTER_REQUESTS["cpu"].removesuffix("m")), \
        "the router pods are sized with their front queue"


def test_a_keda_of_your_own_elsewhere_is_the_one_admitted_to_the_front_queue(tmp_path):
    """`monitoring.keda: {create: false, namespace: autoscalers}`: the front queue admits the
    operator where it runs, not warmstart's default namespace."""
    doc = copy.deepcopy(load_stack_doc("prod"))
    model = doc["config"]["warmstart:models"][0]
    model.pop("standby")
    model["autoscaling"]["minReplicas"] = 0
    doc["config"]["warmstart:monitoring"] = doc["config"].get("warmstart:monitoring", {}) | {
        "keda": {"create": False, "namespace": "autoscalers"}}
    r = render_doc(doc, tmp_path, "prod-own-keda")
    policy = _by(r)[("NetworkPolicy", f"{model['name']}-router")]
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule.get("from", [])]
    assert network_policy.keda_operator_peer("autoscalers") in peers
    assert network_policy.keda_operator_peer() not in peers


@pytest.mark.parametrize("ready", [0.0, 30.0, 90.0, 280.0, 500.0, 10_000.0])
def test_the_hold_is_twice_the_predicted_start_within_its_bounds(ready):
    hold = routing.front_queue_hold_seconds(ready)
    assert routing.FRONT_QUEUE_HOLD_SECONDS <= hold <= routing.FRONT_QUEUE_MAX_HOLD_SECONDS
    assert hold == routing.FRONT_QUEUE_MAX_HOLD_SECONDS or hold >= 2 * ready


def test_a_warm_spare_start_is_shorter_than_a_new_node_and_both_count_every_phase():
    from warmstart.decisions import instances
    inst = instances.lookup("p5.48xlarge")
    new = phases.predict_from_zero(67 * 2**30, inst, compile_cached=True)
    spare = phases.predict_from_zero(67 * 2**30, inst, compile_cached=True, warm_spare=True, staged=True)
    assert spare.total_seconds < new.total_seconds
    assert new.start.node_launch == phases.NODE_LAUNCH_SECONDS and spare.start.node_launch == 0
    assert new.total_seconds == pytest.approx(new.signal + new.start.total_seconds + new.join)


def test_zero_pods_without_a_router_is_refused():
    """maxReplicas 1 with routing auto has no router, so no front queue would hold the requests."""
    spec = ModelSpec(name="m", source="s3://b-models/m", weights_gib=15,
                     autoscaling=AutoscalingConfig(min_replicas=0, max_replicas=1))
    with pytest.raises(ConfigErrors) as e:
        plan_model(spec, key=KEY, instance_type="g6e.xlarge", pool="p", loader=LoaderTuning(), compile_cache=True,
                   compile_cache_host_path="/mnt/k8s-disks/0/c")
    keys = [x.key for x in e.value.errors]
    assert f"{KEY}.autoscaling.minReplicas" in keys and any("router" in x.fix for x in e.value.errors)


def test_zero_pods_needs_the_front_queues_service():
    with pytest.raises(ValueError, match="front queues"):
        scaling.plan_scaling("m", "ns", scaling.AutoscalingSpec(0, 3), 600)
    p = scaling.plan_scaling("m", "ns", scaling.AutoscalingSpec(0, 3), 600, front_queue_service="m")
    assert p.queue_trigger is not None and p.summary()["frontQueueTrigger"]["url"].startswith("http://m.ns.svc:")
    # with standby engines KEDA keeps the sleepers and the actuator wakes one: no metrics-api trigger
    assert scaling.plan_scaling("m", "ns", scaling.AutoscalingSpec(0, 3, standby=1), 600,
                                front_queue_service="m").queue_trigger is None
