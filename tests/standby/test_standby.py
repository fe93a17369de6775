"""Standby engines (docs/scale-out.md): the pure decisions (host memory, KEDA's count), what a
standby model's serving pods run with, and the actuator's objects and component, validated
against the Kubernetes schemas. The actuator script and the readiness probe run for real in
tests/podside/test_standby_actuator.py; the router's routes in tests/routing/test_standby_routes.py."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st

from components.standby import ModelStandby, ModelStandbyArgs
from tests.support.stacks import load_stack_doc, render_doc, render_stack
from warmstart import mocks, render, versions
from warmstart.coldstart import history
from warmstart.config import (
    AutoscalingConfig,
    LoaderTuning,
    ModelSpec,
    RoutingConfig,
    StandbyConfig,
)
from warmstart.decisions import autoscaling as scaling
from warmstart.decisions import instances, phases, placement, standby, tuning
from warmstart.decisions import routing as routing_decisions
from warmstart.decisions.instances import GIB
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.manifests import network_policy, pod_scripts, serving
from warmstart.manifests import routing as router_objects
from warmstart.manifests import standby as objects
from warmstart.plan.model import plan_model

K8S_VERSION = versions.DEFAULT_KUBERNETES_VERSION
KEY = "warmstart:models[0]"


def _plan(weights_gib=15.0, instance_type="g6e.xlarge", level=1, with_standby=True, autoscaled=True):
    spec = ModelSpec(name="m", source="s3://b-models/m", weights_gib=weights_gib,
                     autoscaling=AutoscalingConfig(min_replicas=1, max_replicas=3) if autoscaled else None,
                     standby=StandbyConfig(count=1, sleep_level=level) if with_standby else None)
    return plan_model(spec, key=KEY, instance_type=instance_type, pool="p", loader=LoaderTuning(),
                      compile_cache=True, compile_cache_host_path="/mnt/k8s-disks/0/warmstart-compile-cache")


def _vllm(dep):
    return dep["spec"]["template"]["spec"]["containers"][0]


# --------------------------------------------------------------------------------------
# Decisions


@given(st.integers(0, 2048 * GIB), st.integers(1, 4096 * GIB), st.integers(0, 64 * GIB))
def test_the_host_memory_rule_holds_exactly_when_the_sleeper_fits(weights, memory, shm):
    for level in (1, 2):
        need = standby.sleeping_host_bytes(weights, level) + shm
        assert (standby.check_host_memory(weights_bytes=weights, sleep_level=level, pod_memory_bytes=memory,
                                          shm_bytes=shm) is None) == (need <= memory)
    # Level 2 drops the weights: it never needs more host memory than level 1.
    assert standby.sleeping_host_bytes(weights, 2) <= standby.sleeping_host_bytes(weights, 1)


def _tp1(weights_gib: float, inst: instances.GpuInstance) -> bool:
    try:
        return tuning.choose_tensor_parallel(int(weights_gib * GIB), inst, None,
                                             tuning.DEFAULT_GPU_MEMORY_UTILIZATION) == 1
    except tuning.TuningError:
        return False


@pytest.mark.parametrize("t", sorted(instances.catalog()))
def test_level_1_is_refused_exactly_where_the_pod_cannot_hold_the_weights(t):
    inst = instances.lookup(t)
    pod = tuning.pod_size(inst, 1)
    fits = (pod.memory_bytes - pod.shm_bytes - standby.PROCESS_HOST_BYTES) / GIB
    under, over = math.floor(fits), math.floor(fits) + 1
    if under >= 1 and _tp1(under, inst):
        assert _plan(under, t).standby.sleep_level == 1
    if _tp1(over, inst):
        with pytest.raises(ConfigErrors) as e:
            _plan(over, t)
        (err,) = e.value.errors
        assert err.key == f"{KEY}.standby.sleepLevel" and "sleepLevel: 2" in err.fix
        assert f"{pod.memory_bytes / GIB:.1f} GiB" in err.rule and t in err.rule
        assert _plan(over, t, level=2).standby.sleep_level == 2


def test_standby_needs_autoscaling():
    with pytest.raises(ConfigErrors) as e:
        _plan(autoscaled=False)
    assert [x.key for x in e.value.errors] == [f"{KEY}.standby"]


def test_standby_needs_a_router(tmp_path):
    """Standby turns on vLLM's dev routes and a sleeper stays Ready: without a router the
    namespace's pods would reach /sleep and /wake_up, and the Service would send to sleepers."""
    spec = ModelSpec(name="m", source="s3://b-models/m", weights_gib=15, routing=RoutingConfig(policy="none"),
                     autoscaling=AutoscalingConfig(min_replicas=1, max_replicas=3), standby=StandbyConfig(count=1))
    with pytest.raises(ConfigErrors) as e:
        plan_model(spec, key=KEY, instance_type="g6e.xlarge", pool="p", loader=LoaderTuning(), compile_cache=True,
                   compile_cache_host_path="/mnt/k8s-disks/0/c")
    (err,) = e.value.errors
    assert err.key == f"{KEY}.routing.policy" and "router" in err.rule and "remove standby" in err.fix
    # A stack file: one line, the key a user edits.
    doc = load_stack_doc("prod")
    doc["config"]["warmstart:models"][0]["routing"] = {"policy": "none"}
    with pytest.raises(ConfigErrors) as e:
        render_doc(doc, tmp_path, "prod-unrouted")
    assert [x.key for x in e.value.errors] == ["warmstart:models[0].routing.policy"]
    # VllmModel alone: the router is another component, named by its pods' labels.
    from components.serving import VllmModel
    from warmstart.errors import ConfigError
    entry = {"name": "m", "source": "s3://b-models/m", "weights_gib": 15, "instance_type": "g6e.xlarge", "pool": "p",
             "autoscaling": {"min_replicas": 1, "max_replicas": 3}, "standby": {"count": 1}}
    with pytest.raises(ConfigError) as one:
        mocks.run(lambda: VllmModel("m", {"model": entry, "autoscaled": True, "region": "us-east-1"}),
                  region="us-east-1", stack="alone")
    assert one.value.key == "VllmModelArgs.routerPodLabels" and "ModelRouter" in one.value.fix
    routed = mocks.run(lambda: VllmModel("m", {"model": entry, "autoscaled": True, "region": "us-east-1",
                                               "router_pod_labels": {"app.kubernetes.io/name": "router",
                                                                     "app.kubernetes.io/instance": "m"}}),
                       region="us-east-1", stack="alone")
    assert any(r.typ == "kubernetes:apps/v1:Deployment" for r in routed)


@given(st.integers(0, 10_000), st.integers(0, 8), st.integers(1, 50))
def test_keda_keeps_the_sleepers_beside_what_the_queue_needs(waiting, count, target):
    # The HPA's answer for an AverageValue target is ceil(value / target).
    offset = standby.keda_standby_offset(count, target)
    assert math.ceil((waiting + offset) / target) == math.ceil(waiting / target) + count


def test_the_scaled_object_counts_the_sleepers():
    m = _plan()
    spec = m.autoscaling_spec
    p = scaling.plan_scaling("m", "ns", spec, m.startup_budget_seconds)
    assert (p.min_replicas, p.max_replicas) == (1 + 1, 3 + 1)
    assert p.triggers[0].query == '((sum(vllm:num_requests_waiting{namespace="ns",model_name="m"})) or vector(0)) + 5'
    assert m.replicas == 2, "the first create starts the awake minimum and the sleeper"
    assert m.max_replicas == 4, "the pool is sized for every pod, sleepers included"
    plain = scaling.plan_scaling("m", "ns", _plan(with_standby=False).autoscaling_spec, m.startup_budget_seconds)
    assert (plain.min_replicas, plain.max_replicas) == (1, 3)
    assert plain.triggers[0].query == 'sum(vllm:num_requests_waiting{namespace="ns",model_name="m"})'


# --------------------------------------------------------------------------------------
# The serving pods


def test_sleep_mode_and_dev_mode_only_with_standby():
    for with_standby in (True, False):
        c = _vllm(serving.deployment_spec(_plan(with_standby=with_standby).serving, "ns", "us-east-1"))
        env = {e["name"]: e["value"] for e in c["env"]}
        assert (standby.SLEEP_MODE_FLAG in c["args"]) == with_standby
        assert (env.get(standby.DEV_MODE_ENV) == "1") == with_standby
        assert standby.DEV_MODE_ENV in env or not with_standby
        # A sleeper stays Ready (the routing label keeps it out of the traffic): the same probe
        # with standby or without, so its Deployment completes like any other.
        probe = c["readinessProbe"]
        assert probe["httpGet"]["path"] == "/health"
        assert probe == _vllm(serving.deployment_spec(_plan(with_standby=False).serving, "ns", "us-east-1"))[
            "readinessProbe"]
        # The start-up probe still owns the load: no probe kills a loading pod.
        assert c["startupProbe"]["httpGet"]["path"] == "/health"


def test_an_extra_arg_cannot_turn_sleep_mode_on_behind_the_config():
    spec = ModelSpec(name="m", source="s3://b-models/m", weights_gib=15, extra_args=["--enable-sleep-mode"])
    with pytest.raises(ConfigErrors) as e:
        plan_model(spec, key=KEY, instance_type="g6e.xlarge", pool="p", loader=LoaderTuning(), compile_cache=True,
                   compile_cache_host_path="/mnt/k8s-disks/0/warmstart-compile-cache")
    assert [x.key for x in e.value.errors] == [f"{KEY}.extraArgs"]


# --------------------------------------------------------------------------------------
# The actuator's objects


PLACEMENTS = {"own platform": placement.own_platform_placement(), "anywhere off GPU": placement.ANYWHERE_OFF_GPU}


def _actuator(non_gpu=placement.ANYWHERE_OFF_GPU):
    m = _plan()
    return standby.plan_actuator(model="m", namespace="ns", image=objects.IMAGE, standby=m.standby, min_awake=1,
                                 target_waiting=5, non_gpu=non_gpu, api_server_cidrs=("172.20.0.1/32",))


@pytest.mark.parametrize("where", sorted(PLACEMENTS))
def test_the_actuator_objects_are_valid_and_least_privilege(where):
    p = _actuator(PLACEMENTS[where])
    objs = objects.objects(p)
    for o in objs:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)
    (role,) = [o for o in objs if o["kind"] == "Role"]
    # Pods: list and patch. The model's own Deployment, by name, and only its replicas (the scale
    # subresource): read and raise them on a wake.
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
                             {"apiGroups": ["apps"], "resources": ["deployments/scale"], "resourceNames": ["m"],
                              "verbs": ["get", "patch"]}]
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 1, "one writer of wake and sleep"
    assert {k: pod.get(k) for k in ("nodeSelector", "affinity")} == {
        k: PLACEMENTS[where].pod_fields().get(k) for k in ("nodeSelector", "affinity")}, "on the router's non-GPU nodes"
    assert not pod.get("tolerations"), "never on a GPU node"
    c = pod["containers"][0]
    assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["runAsNonRoot"]
    args = c["args"]
    assert args[args.index("--standby") + 1] == "1" and args[args.index("--min-awake") + 1] == "1"
    assert args[args.index("--selector") + 1] == "app.kubernetes.io/instance=m,app.kubernetes.io/name=vllm"
    (own,) = (o for o in objs if o["kind"] == "NetworkPolicy")
    # KEDA's operator pods alone, on the figure's port; nothing else reaches the actuator.
    assert "Ingress" in own["spec"]["policyTypes"]
    assert own["spec"]["ingress"] == [{"from": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "keda"}}, "podSelector": {"matchLabels": {"app": "keda-operator"}}}],
        "ports": [{"port": standby.FIGURE_PORT, "protocol": "TCP"}]}]
    (svc,) = (o for o in objs if o["kind"] == "Service")
    assert svc["spec"]["selector"] == objects.selector("m") and svc["spec"]["type"] == "ClusterIP"
    assert [(x["port"], x["targetPort"]) for x in svc["spec"]["ports"]] == [(standby.FIGURE_PORT, "figure")]
    assert c["ports"] == [{"name": "figure", "containerPort": standby.FIGURE_PORT, "protocol": "TCP"}]
    # What KEDA's trigger reads is what the Service routes to.
    assert standby.figure_url("m", "ns") == f"http://{svc['metadata']['name']}.ns.svc:{standby.FIGURE_PORT}/warmstart/pods"
    assert args[args.index("--figure-port") + 1] == str(standby.FIGURE_PORT)
    assert args[args.index("--deployment") + 1] == "m"
    assert own["spec"]["egress"][0]["to"] == [{"podSelector": {"matchLabels": serving.selector("m")}}]
    # The serving pods' own policy admits it beside the routers, and nothing else new.
    router = network_policy.router_selector("m")
    vllm = network_policy.serving_network_policy("m", "ns", router=router, actuator=objects.selector("m"))
    assert vllm["spec"]["ingress"][0]["from"] == [{"podSelector": {"matchLabels": router}},
                                                  {"podSelector": {"matchLabels": objects.selector("m")}}]
    with pytest.raises(ValueError):
        network_policy.serving_network_policy("m", "ns", router=router, actuator={})


def _standby_alone(**overrides):
    args = ModelStandbyArgs(model_name="m", namespace="ns", weights_gib=15, standby={"count": 1},
                            autoscaling={"min_replicas": 1, "max_replicas": 4},
                            api_server_cidrs=["172.20.0.1/32"]) | overrides  # type: ignore[operator]
    args = {k: v for k, v in args.items() if v is not None}
    built: dict = {}

    def program():
        built["s"] = ModelStandby("m-standby", args)  # type: ignore[arg-type]

    resources = mocks.run(program, region="us-east-1", stack="alone")
    return built["s"], resources


def test_the_component_registers_the_planned_objects():
    built = {}
    built["s"], resources = _standby_alone()
    objs = [x.inputs for x in resources if render.is_kubernetes_object(x)]
    for o in objs:
        kubernetes_validate.validate(o, K8S_VERSION, strict=True)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objs) == sorted(
        [(o["kind"], o["metadata"]["name"]) for o in objects.objects(built["s"].plan)]
        + [("ConfigMap", "m-standby-script")])
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    assert base64.b64decode(cm["binaryData"][objects.SCRIPT_KEY]) == pod_scripts.build(objects.SCRIPT_KEY).blob
    assert "podside/standby/main.py" in pod_scripts.script_files(objects.SCRIPT_KEY)
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    volumes = dep["spec"]["template"]["spec"]["volumes"]
    assert {"name": "script", "configMap": {"name": "m-standby-script"}} in json.loads(json.dumps(volumes))


@pytest.mark.parametrize("overrides, key", [
    ({"standby": {"count": 0}}, "ModelStandbyArgs.standby.count"),
    ({"standby": {"sleep_level": 3}}, "ModelStandbyArgs.standby.sleepLevel"),
    ({"autoscaling": {"max_replicas": 4, "target_waiting_per_replica": 0}},
     "ModelStandbyArgs.autoscaling.targetWaitingPerReplica"),
    ({"autoscaling": {"min_replicas": -1, "max_replicas": 4}}, "ModelStandbyArgs.autoscaling.minReplicas"),
    # Standby needs autoscaling: the model's section, whose maxReplicas the config requires.
    ({"autoscaling": None}, "ModelStandbyArgs.autoscaling.maxReplicas"),
])
def test_the_actuators_sections_are_validated_as_the_configs_under_their_nested_keys(overrides, key):
    with pytest.raises(ConfigErrors) as err:
        _standby_alone(**overrides)
    assert [e.key for e in err.value.errors] == [key]


def test_the_actuators_section_defaults_are_the_configs():
    s, _ = _standby_alone(standby=None, autoscaling={"max_replicas": 4})
    d, a = StandbyConfig(), AutoscalingConfig(max_replicas=4)
    assert (s.plan.standby, s.plan.sleep_level, s.plan.awake_idle_seconds) == (d.count, d.sleep_level,
                                                                              d.awake_idle_seconds)
    assert (s.plan.min_awake, s.plan.target_waiting) == (a.min_replicas, a.target_waiting_per_replica)


def test_the_actuators_flat_keys_of_before_plan_what_the_sections_plan_with_a_warning(monkeypatch):
    import pulumi

    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, resource=None, **_: warned.append(msg))
    sections = {"standby": {"count": 2, "sleep_level": 2, "awake_idle_seconds": 60},
                "autoscaling": {"min_replicas": 0, "max_replicas": 4, "target_waiting_per_replica": 3}}
    nested, rs_nested = _standby_alone(**sections)
    assert warned == []
    flat, rs_flat = _standby_alone(standby=None, autoscaling=None, count=2, sleep_level=2, awake_idle_seconds=60,
                                   min_awake=0, target_waiting_per_replica=3)
    # The flat Args carry no maxReplicas: the figure and a wake's raise are left unbounded there
    # (the HPA's maxReplicaCount still bounds the pods); all else is the same.
    assert (flat.plan.max_pods, nested.plan.max_pods) == (0, 6)
    assert flat.plan == dataclasses.replace(nested.plan, max_pods=0)
    assert (flat.plan.standby, flat.plan.min_awake, flat.plan.target_waiting) == (2, 0, 3)

    def without_max_pods(rs):
        out = json.loads(json.dumps([r.inputs for r in rs if r.typ.startswith("kubernetes:")]))
        for o in out:
            for c in o.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                if "--max-pods" in c.get("args", []):
                    i = c["args"].index("--max-pods")
                    del c["args"][i:i + 2]
        return out
    assert without_max_pods(rs_flat) == without_max_pods(rs_nested)
    assert len(warned) == 2 and any("awakeIdleSeconds, count, sleepLevel" in w for w in warned)
    assert any("minAwake, targetWaitingPerReplica" in w for w in warned)
    # Flat, an error keeps the key it was given by; flat and nested at once is refused.
    with pytest.raises(ConfigErrors) as err:
        _standby_alone(autoscaling=None, min_awake=-1)
    assert [e.key for e in err.value.errors] == ["ModelStandbyArgs.minAwake"]
    with pytest.raises(ConfigError, match="ModelStandbyArgs.minAwake"):
        _standby_alone(min_awake=1)
    with pytest.raises(ConfigError, match="ModelStandbyArgs.count"):
        _standby_alone(count=1)


# --------------------------------------------------------------------------------------
# The prediction, the render's scale-out line and the report's wake records


@given(st.integers(0, 1024 * GIB), st.integers(0, 1024 * GIB))
def test_a_level_1_wake_grows_with_the_weights_at_the_published_rate(a, b):
    inst = instances.lookup("p5.48xlarge")
    assert (phases.wake_seconds(a, 1, inst) <= phases.wake_seconds(b, 1, inst)) == (a <= b) or a == b
    assert phases.wake_seconds(64 * GIB, 1, inst) == pytest.approx(3.0)  # FMA README: ~3 s per 64 GiB
    # A level-2 wake reloads from S3: never faster than copying back from host RAM.
    assert phases.wake_seconds(a, 2, inst) >= phases.wake_seconds(a, 1, inst) or a == 0


def test_prod_predicts_a_standby_scale_out_under_20_s():
    r = render_stack("prod")
    m = next(m for m in r.stack_plan.models if m.standby is not None)
    line = render.scale_out_line(m)
    got = re.search(r"a woken standby engine \(of 1, sleep level 1\) answers ~(\d+)s after the load rises "
                    r"\(standby signal (\d+)s \+ wake "
                    r"([\d.]+)s for 67 GiB \+ first token (\d+)s \+ router join (\d+)s\)", line)
    assert got, line
    assert int(got[1]) < 20
    assert float(got[3]) == pytest.approx(67 * 3 / 64, abs=0.05)
    cold = int(re.search(r"new node serves after ~(\d+)s", line)[1])
    assert int(got[1]) * 10 < cold, "the standby path is the fast one"
    plain = next(m for m in r.stack_plan.models if m.standby is None)
    assert "standby" not in render.scale_out_line(plain)


def test_a_wake_is_its_own_kind_of_start_in_the_history():
    records = [{"kind": "wake", "flags": {"sleep_level": 1}, "phases": {"signal": 0.8, "wake": 3.1, "first_token": 0.2}},
               {"flags": {"new_node": True, "compile_restore": "hit"}, "phases": {"weights": 9.0}}]
    summary = history.summarise(records)
    assert set(summary) == {("standby wake", "sleep level 1", "-"), ("new node", "compile hit", "no node cache")}
    assert set(summary[("standby wake", "sleep level 1", "-")]) == {"signal", "wake", "first_token"}


# --------------------------------------------------------------------------------------
# Scale from zero: minReplicas 0 with standby engines


def test_min_replicas_0_is_refused_without_a_router_and_held_by_a_front_queue_with_standby(tmp_path):
    # The front queue lives in the router pods: no router, nothing holds the requests.
    spec = ModelSpec(name="m", source="s3://b-models/m", weights_gib=15, routing=RoutingConfig(policy="none"),
                     autoscaling=AutoscalingConfig(min_replicas=0, max_replicas=3),
                     standby=StandbyConfig(count=1))
    with pytest.raises(ConfigErrors) as e:
        plan_model(spec, key=KEY, instance_type="g6e.xlarge", pool="p", loader=LoaderTuning(), compile_cache=True,
                   compile_cache_host_path="/mnt/k8s-disks/0/c")
    by_key = {x.key: x for x in e.value.errors}
    assert set(by_key) == {f"{KEY}.autoscaling.minReplicas", f"{KEY}.routing.policy"}, by_key
    assert "routing.policy" in by_key[f"{KEY}.autoscaling.minReplicas"].fix

    doc = load_stack_doc("prod")
    doc["config"]["warmstart:models"][0]["autoscaling"]["minReplicas"] = 0
    r = render_doc(doc, tmp_path, "prod-zero")
    by = {(o["kind"], o["metadata"]["name"]): o for o in r.kubernetes_objects}
    (so,) = [o for (k, n), o in by.items() if k == "ScaledObject" and n == "qwen-67b"]
    assert so["spec"]["minReplicaCount"] == 1, "zero awake, the sleeper kept"
    pod = by[("Deployment", "qwen-67b-router")]["spec"]["template"]["spec"]
    smg, queue = pod["containers"]
    assert smg["args"][:4] == ["--host", "127.0.0.1", "--port", str(routing_decisions.SMG_BEHIND_QUEUE_PORT)]
    assert [p["name"] for p in queue["ports"]] == ["http"] and "readinessProbe" not in smg
    retry = int(queue["command"][queue["command"].index("--retry-after") + 1])
    assert retry >= math.ceil(phases.predict_standby_start(67 * GIB, instances.lookup("p5.48xlarge")).total_seconds)
    assert {"name": "front-queue", "configMap": {"name": router_objects.FRONT_QUEUE_CONFIGMAP}} in pod["volumes"]
    assert ("ConfigMap", router_objects.FRONT_QUEUE_CONFIGMAP) in by, "the platform ships the script"
    args = by[("Deployment", "qwen-67b-standby")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--min-awake") + 1] == "0" and "--front-queue-selector" in args
    # Without minReplicas 0 the router is as before: SMG on the serving port, no queue.
    plain = render_stack("prod")
    (router,) = [o for o in plain.kubernetes_objects if o["kind"] == "Deployment" and o["metadata"]["name"] ==
                 "qwen-67b-router"]
    assert [c["name"] for c in router["spec"]["template"]["spec"]["containers"]] == ["router"]


def test_the_non_gpu_nodes_are_sized_for_the_actuator_and_the_front_queue():
    from warmstart.plan.cluster import non_gpu_pods

    r = render_stack("prod")
    pods = {p.name: p for p in non_gpu_pods(r.stack_plan.config, r.stack_plan.models)}
    dep = next(o for o in r.kubernetes_objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "qwen-67b-standby")
    requests = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert (pods["qwen-67b-standby"].cpu_millis, pods["qwen-67b-standby"].memory_mib) == (
        int(requests["cpu"].removesuffix("m")), int(requests["memory"].removesuffix("Mi")))
    router_cpu = pods["qwen-67b-router"].cpu_millis
    zero = [m if m.standby is None else dataclasses.replace(
        m, autoscaling=m.autoscaling.model_copy(update={"min_replicas": 0})) for m in r.stack_plan.models]
    queued = {p.name: p for p in non_gpu_pods(r.stack_plan.config, zero)}
    assert queued["qwen-67b-router"].cpu_millis == router_cpu + 100, "the front queue's request on each router"


def test_a_stacks_actuator_reads_the_models_standby_plan_and_plans_none_of_its_own(tmp_path, monkeypatch):
    # Standby is planned once (plan/model.py): the stack's ModelStandby takes the model plan's
    # StandbyPlan; only the component used alone plans from its Args.
    import inspect

    import components.standby as component

    plan_standby = component.decide.plan_standby

    def planned(**kw):
        assert inspect.stack()[1].frame.f_globals["__name__"] != component.__name__, \
            "ModelStandby planned the model's standby a second time"
        return plan_standby(**kw)

    monkeypatch.setattr(component.decide, "plan_standby", planned)
    r = render_doc(load_stack_doc("prod"), tmp_path, "prod-once")
    m = next(m for m in r.stack_plan.models if m.standby is not None)
    (dep,) = [o for o in r.kubernetes_objects if o["kind"] == "Deployment" and o["metadata"]["name"] == f"{m.name}-standby"]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert (args[args.index("--standby") + 1], args[args.index("--sleep-level") + 1]) == (
        str(m.standby.count), str(m.standby.sleep_level))


def test_the_actuator_alone_refuses_a_pooled_models_section():
    with pytest.raises(ConfigError) as err:
        _standby_alone(standby={"pool": "shared"})
    assert err.value.key == "ModelStandbyArgs.standby.pool" and "no actuator of its own" in err.value.rule
