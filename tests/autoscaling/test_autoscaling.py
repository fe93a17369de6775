"""Autoscaling on vLLM's metrics: the pure decisions (properties), the KEDA objects against the
vendored KEDA 2.20.2 CRDs and chart values, the components under Pulumi mocks (IAM least
privilege on one workspace, KEDA on non-GPU nodes), and the policy that re-checks pool limits.
The PromQL itself runs through promtool in tests/autoscaling/test_promql.py."""

from __future__ import annotations

import json
import re

import kubernetes_validate
import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pulumi.provider.experimental.analyzer import Analyzer

import components.autoscaling as autoscaling_component
import components.monitoring as monitoring_component
from tests.support.keda import SCALED_OBJECT, SCHEMAS, validate_keda
from warmstart import config, mocks, versions
from warmstart.config import LoaderTuning, ModelSpec
from warmstart.decisions import autoscaling as decide
from warmstart.decisions import gpu_pools, instances, placement, tuning
from warmstart.decisions.gpu_pools import SURGE_PODS, PoolModel
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.manifests import autoscaling as objects
from warmstart.manifests import serving
from warmstart.plan.model import plan_model
from warmstart.policies import Resource, autoscaling as policy

K8S_VERSION = versions.DEFAULT_KUBERNETES_VERSION
REGION = "us-east-1"
OIDC_ISSUER = "oidc.eks.us-east-1.amazonaws.com/id/ABCDEF"
OIDC_ARN = f"arn:aws:iam::{mocks.FAKE_ACCOUNT}:oidc-provider/{OIDC_ISSUER}"
dns = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)


def spec(lo=1, hi=4, waiting=5.0, kv=None) -> decide.AutoscalingSpec:
    return decide.AutoscalingSpec(lo, hi, waiting, kv)


# --------------------------------------------------------------------------------------
# Decisions


@given(dns, dns)
def test_each_query_selects_exactly_its_model_and_namespace(model, ns):
    for q, fn in ((decide.waiting_query(model, ns), "sum"), (decide.kv_cache_query(model, ns), "max")):
        m = re.fullmatch(r'(\w+)\((vllm:\w+)\{namespace="([^"]+)",model_name="([^"]+)"\}\)', q)
        assert m and m.groups()[0] == fn and m.groups()[2:] == (ns, model), q
    assert decide.waiting_query(model, ns) != decide.waiting_query(model + "x", ns)


@pytest.mark.parametrize("bad", ['a"}or vector(1)', "UPPER", "a b", ""])
def test_a_name_that_is_not_a_dns_label_never_reaches_a_query(bad):
    with pytest.raises(ValueError):
        decide.waiting_query(bad, "inference")
    with pytest.raises(ValueError):
        decide.kv_cache_query("llama", bad)


def test_the_metric_names_are_vllm_0_33s():
    assert decide.WAITING_METRIC == "vllm:num_requests_waiting"
    assert decide.KV_CACHE_METRIC == "vllm:kv_cache_usage_perc"
    q = decide.kv_cache_query("m", "n")
    assert "gpu_cache_usage_perc" not in q


@given(st.integers(0, 20_000))
def test_scale_down_waits_the_startup_budget_within_what_kubernetes_allows(budget):
    hold = decide.scale_down_hold_seconds(budget)
    period = decide.scale_down_period_seconds(budget)
    assert hold >= min(budget, decide.MAX_STABILIZATION_SECONDS) and hold <= decide.MAX_STABILIZATION_SECONDS
    assert hold >= decide.MIN_SCALE_DOWN_HOLD_SECONDS
    if budget <= decide.MAX_STABILIZATION_SECONDS:
        # The window holds the budget: past it, one pod per sync, so a falling load is back at the
        # floor within one window (plus a sync per surplus pod).
        assert period == decide.HPA_SYNC_SECONDS
    else:
        assert min(budget, decide.MAX_POLICY_PERIOD_SECONDS) <= period <= decide.MAX_POLICY_PERIOD_SECONDS
    assert decide.scale_down_hold_seconds(budget + 1) >= hold  # monotone


@given(st.floats(1, 2000))
def test_every_real_models_budget_is_held_in_full(weights_gib):
    """Up to ~600 GiB of weights the whole start-up budget fits HPA's one-hour window."""
    budget = tuning.startup_budget_seconds(int(weights_gib * instances.GIB))
    p = decide.plan_scaling("m", "n", spec(), budget)
    b = decide.hpa_behavior(p)
    if budget <= decide.MAX_STABILIZATION_SECONDS:
        assert b["scaleDown"]["stabilizationWindowSeconds"] >= budget
    assert b["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert p.cooldown_period_seconds >= budget


def test_the_hpa_behavior_is_a_valid_autoscaling_v2_object_for_long_budgets():
    """The Kubernetes schema caps the window at 3600 and a period at 1800: a 700 GiB model's
    budget (4100 s) must still produce an HPA the API server accepts."""
    budget = tuning.startup_budget_seconds(700 * instances.GIB)
    assert budget > decide.MAX_STABILIZATION_SECONDS
    p = decide.plan_scaling("big", "inference", spec(), budget)
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "big"},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "big"},
                    "minReplicas": 1, "maxReplicas": 4, "behavior": decide.hpa_behavior(p),
                    "metrics": [{"type": "External", "external": {"metric": {"name": "s0-prometheus"},
                                                                  "target": {"type": "AverageValue", "averageValue": "5"}}}]}}
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)
    b = hpa["spec"]["behavior"]["scaleDown"]
    assert b["stabilizationWindowSeconds"] <= 3600 and all(x["periodSeconds"] <= 1800 for x in b["policies"])


BAD_SPECS = [
    (spec(0, 4), False, None, r"minReplicas=0: .*needs the router.s front queue.*has no router"),
    (spec(5, 3), False, None, r"minReplicas=5: llama: minReplicas=5 is above maxReplicas=3"),
    (spec(2, 2), False, None, r"maxReplicas=2: llama: equals minReplicas=2"),
    (spec(1, 4, kv=1.5), False, None, r"kvCacheUsageCeiling=1.5: .* fraction"),
    (spec(1, 4, waiting=0), False, None, r"targetWaitingPerReplica=0: .* positive"),
    (spec(2, 4), False, 1, r"models\[0\]\.replicas=1: .* outside \[minReplicas=2, maxReplicas=4\]"),
]


@pytest.mark.parametrize("s, queue, replicas, message", BAD_SPECS)
def test_bad_autoscaling_blocks_fail_naming_key_rule_and_fix(s, queue, replicas, message):
    with pytest.raises(ConfigErrors) as err:
        decide.check_spec(s, key="warmstart:models[0].autoscaling", model="llama", front_queue=queue, replicas=replicas)
    text = str(err.value)
    assert re.search(message, text), text
    assert all(e.key.startswith("warmstart:models[0].") and e.fix for e in err.value.errors)


def test_min_zero_is_allowed_with_a_front_queue_and_good_blocks_pass():
    decide.check_spec(spec(0, 4), key="k", model="m", front_queue=True)
    decide.check_spec(spec(1, 8, kv=0.8), key="k", model="m", replicas=3)


def _pool_model(name: str, itype: str, tp: int, replicas: int) -> PoolModel:
    return PoolModel(instances.lookup(itype), tp, replicas, name=name)


pool_models = st.lists(
    st.tuples(st.sampled_from(["g6e.xlarge", "g6e.12xlarge", "g6e.48xlarge", "p5.48xlarge"]),
              st.sampled_from([1, 2, 4, 8]), st.integers(0, 6), st.one_of(st.none(), st.integers(1, 12))),
    min_size=1, max_size=4)


def _models(drawn) -> tuple[list[PoolModel], dict[str, decide.AutoscalingSpec]]:
    models, scaled = [], {}
    for i, (itype, tp, replicas, hi) in enumerate(drawn):
        inst = instances.lookup(itype)
        tp = min(tp, inst.gpu_count)
        models.append(_pool_model(f"m{i}", itype, tp, replicas))
        if hi is not None:
            scaled[f"m{i}"] = spec(1, max(hi, 2))
    return models, scaled


@settings(max_examples=200)
@given(pool_models, st.integers(1, 400))
def test_the_pool_rule_passes_exactly_when_the_ceiling_fits(drawn, max_gpus):
    models, scaled = _models(drawn)
    keys = {m.name: f"warmstart:models[{i}]" for i, m in enumerate(models)}
    need = decide.pool_gpus_needed(models, scaled)
    try:
        decide.check_pool_capacity("gpu", max_gpus, models, scaled, model_keys=keys, pool_key="warmstart:gpuPools[0]")
        assert need <= max_gpus
    except ConfigErrors as err:
        assert need > max_gpus
        for e in err.errors:
            assert f"need {need} GPUs" in e.rule and f"maxGpus={max_gpus}" in e.rule
            assert e.key.endswith(".autoscaling.maxReplicas") or (not scaled and e.key.endswith(".maxGpus"))
            assert f">= {need}" in e.fix


@settings(max_examples=200)
@given(pool_models, st.integers(1, 400))
def test_the_suggested_lower_max_replicas_fits(drawn, max_gpus):
    models, scaled = _models(drawn)
    assume(scaled)
    keys = {m.name: f"warmstart:models[{i}]" for i, m in enumerate(models)}
    try:
        decide.check_pool_capacity("gpu", max_gpus, models, scaled, model_keys=keys, pool_key="p")
        return
    except ConfigErrors as err:
        errors = err.errors
    for e in errors:
        m = re.search(r"lower (\S+)'s maxReplicas to (\d+)", e.fix)
        if not m:
            continue
        fixed = dict(scaled) | {m[1]: spec(1, int(m[2]))}
        assert decide.pool_gpus_needed(models, fixed) <= max_gpus, e.fix


@given(pool_models)
def test_models_without_autoscaling_are_sized_as_before(drawn):
    models, _ = _models(drawn)
    assert decide.pool_gpus_needed(models, {}) == gpu_pools.gpus_needed(models, SURGE_PODS)
    largest = max(m.instance.gpu_count for m in models)
    assert decide.default_pool_max_gpus(models, {}, largest) == gpu_pools.default_max_gpus(models, [m.instance for m in models])


@given(pool_models, st.integers(2, 30))
def test_the_pool_limit_grows_with_max_replicas_not_replicas(drawn, hi):
    models, _ = _models(drawn)
    first = models[0].name
    lo = decide.pool_gpus_needed(models, {first: spec(1, hi)})
    assert decide.pool_gpus_needed(models, {first: spec(1, hi + 1)}) >= lo
    # replicas of an autoscaled model do not count: maxReplicas does.
    bumped = [gpu_pools.PoolModel(m.instance, m.tensor_parallel_size, m.replicas + 5, name=m.name) if m.name == first
              else m for m in models]
    assert decide.pool_gpus_needed(bumped, {first: spec(1, hi)}) == lo


def test_max_replicas_beyond_the_pool_limit_names_the_numbers():
    models = [_pool_model("llama", "g6e.12xlarge", 4, 1)]
    with pytest.raises(ConfigErrors) as err:
        decide.check_pool_capacity("gpu", 16, models, {"llama": spec(1, 6)},
                                   model_keys={"llama": "warmstart:models[0]"}, pool_key="warmstart:gpuPools[0]")
    (e,) = err.value.errors
    assert e.key == "warmstart:models[0].autoscaling.maxReplicas" and e.value == 6
    assert "maxReplicas=6+1 surge = 7 pods x TP 4 on g6e.12xlarge = 7 nodes x 4 GPUs = 28" in e.rule
    assert "lower llama's maxReplicas to 3" in e.fix and "maxGpus to >= 28" in e.fix


def test_autoscaling_on_a_model_whose_pool_cannot_grow():
    with pytest.raises(ConfigError, match=r"VllmModelArgs\.autoscaling\.maxReplicas: llama: is not on a NodePool"):
        decide.check_pool_can_grow(None, key="VllmModelArgs.autoscaling", model="llama")
    decide.check_pool_can_grow("gpu", key="k", model="llama")


def test_the_keda_policy_allows_exactly_the_query_actions_on_one_workspace():
    arn = f"arn:aws:aps:{REGION}:{mocks.FAKE_ACCOUNT}:workspace/ws-1234"
    (stmt,) = decide.keda_query_policy(arn)["Statement"]
    assert stmt["Effect"] == "Allow" and stmt["Resource"] == arn
    assert sorted(stmt["Action"]) == ["aps:GetLabels", "aps:GetMetricMetadata", "aps:GetSeries", "aps:QueryMetrics"]
    with pytest.raises(ValueError):
        decide.keda_query_policy("*")


@given(st.floats(0, 3600), st.floats(0, 3600), st.floats(0, 3600), st.floats(0, 3600))
def test_a_warm_spare_saves_exactly_the_node_and_image(launch, image, weights, compile_s):
    e = decide.scale_out_estimate(node_launch_s=launch, node_launch_source="a", image_s=image, image_source="b",
                                  weights_s=weights, weights_source="c", compile_s=compile_s, compile_source="d")
    assert e.cold_seconds - e.warm_spare_seconds == pytest.approx(launch + image)
    assert e.warm_spare_seconds >= decide.SCRAPE_INTERVAL_SECONDS + decide.HPA_SYNC_SECONDS
    assert all(p.source for p in e.phases)


# --------------------------------------------------------------------------------------
# Objects against the KEDA CRDs, the chart's values and the Kubernetes schemas


def _plan(kv=None, budget=1300):
    return decide.plan_scaling("llama", "inference", spec(1, 6, 5, kv), budget)


@pytest.mark.parametrize("kv", [None, 0.8])
def test_amp_scaled_object_and_trigger_authentication_pass_the_crds(kv):
    p = _plan(kv)
    so = objects.scaled_object(p, objects.server_address("https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1/"),
                               region=REGION, authentication=objects.trigger_authentication_name("llama"))
    ta = objects.trigger_authentication("llama", "inference")
    validate_keda(so)
    validate_keda(ta)
    s = so["spec"]
    assert s["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llama"}
    assert (s["minReplicaCount"], s["maxReplicaCount"]) == (1, 6)
    assert [t["metadata"]["query"] for t in s["triggers"]] == [t.query for t in p.triggers]
    assert len(s["triggers"]) == (3 if kv else 2)
    for t in s["triggers"]:
        assert t["authenticationRef"]["name"] == ta["metadata"]["name"]
        assert t["metadata"]["awsRegion"] == REGION
        assert not t["metadata"]["serverAddress"].endswith("/")
        assert float(t["metadata"]["threshold"]) in (5.0, 1.0, kv), "the engine-demand figure is a pod count: its target is one pod"
    assert ta["spec"]["podIdentity"] == {"provider": "aws", "identityOwner": "keda"}


def test_a_plain_endpoint_gets_no_sigv4_and_no_trigger_authentication():
    so = objects.scaled_object(_plan(0.8), "http://prometheus.monitoring.svc:9090", region=None, authentication=None)
    validate_keda(so)
    for t in so["spec"]["triggers"]:
        # identityOwner: operator would make KEDA sign with the operator's default credentials
        # (GetAwsAuthorization in keda pkg/scalers/aws/aws_common.go).
        assert "authenticationRef" not in t and not {"awsRegion", "identityOwner"} & set(t["metadata"])
    with pytest.raises(ValueError):
        objects.scaled_object(_plan(), "http://x", region=REGION, authentication=None)


def test_a_broken_scaled_object_fails_the_crd():
    so = objects.scaled_object(_plan(), "http://p:9090", region=None, authentication=None)
    del so["spec"]["scaleTargetRef"]
    assert list(SCALED_OBJECT.iter_errors(so))


@pytest.mark.parametrize("url, expected", [
    ("https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-9/", "https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-9"),
    ("http://prometheus-operated.monitoring.svc:9090", "http://prometheus-operated.monitoring.svc:9090"),
])
def test_server_address_is_what_keda_appends_api_v1_query_to(url, expected):
    assert objects.server_address(url) == expected
    assert "//api" not in objects.server_address(url) + "/api/v1/query"


@pytest.mark.parametrize("bad", ["http://p:9090/api/v1/query", "prometheus:9090", "https://x/api/v1"])
def test_server_address_refuses_a_query_path_or_no_scheme(bad):
    with pytest.raises(ValueError):
        objects.server_address(bad)


@pytest.mark.parametrize("router", [False, True])
def test_the_scrape_configuration_keeps_only_vllm_and_router_ports_in_the_namespaces(router):
    cfg = objects.scrape_configuration(["inference", "inference", "team-b"], router=router)
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == ({"vllm", "router"} if router else {"vllm"})
    assert int(cfg["global"]["scrape_interval"].rstrip("s")) >= 30
    # vLLM's metrics-only port (the pod's metrics proxy), never its serving port `http`.
    ports = {"vllm": (serving.labels("m")["app.kubernetes.io/name"], "metrics"), "router": ("router", "metrics")}
    for name, j in jobs.items():
        (sd,) = j["kubernetes_sd_configs"]
        assert sd == {"role": "pod", "namespaces": {"names": ["inference", "team-b"]}}
        keep = j["relabel_configs"][0]
        assert keep["action"] == "keep" and keep["regex"] == "{};{}".format(*ports[name])
        targets = {r["target_label"] for r in j["relabel_configs"] if "target_label" in r}
        assert decide.NAMESPACE_LABEL in targets  # what every trigger selects on
    assert objects.VLLM_PORT == serving.METRICS_PORT != serving.HTTP_PORT
    # Written out in full: no YAML anchors or aliases for the collector's validator to refuse.
    text = objects.scrape_configuration_yaml(["inference"], router=router)
    assert "&id" not in text and "*id" not in text
    assert yaml.safe_load(text) == objects.scrape_configuration(["inference"], router=router)


CHART_VALUES = yaml.safe_load((SCHEMAS / "chart-values-2.20.2.yaml").read_text())


def _paths(d, prefix=()):
    for k, v in d.items():
        if isinstance(v, dict) and v and k not in ("nodeSelector", "limits", "requests"):
            yield from _paths(v, prefix + (k,))
        else:
            yield prefix + (k,)


@pytest.mark.parametrize("mode", ["auto", "karpenter"])
def test_keda_values_exist_in_the_pinned_chart_and_keep_keda_off_gpu_nodes(mode):
    values = objects.keda_values(mode, "arn:aws:iam::123456789012:role/x-keda-operator")
    for path in _paths(values):
        cur = CHART_VALUES
        for step in path:
            assert isinstance(cur, dict) and step in cur, f"{'.'.join(path)} is not a value of keda 2.20.2"
            cur = cur[step]
    assert values["nodeSelector"] == placement.own_platform_placement().selector
    assert placement.GPU_RESOURCE not in json.dumps(values["tolerations"]) and values["tolerations"] == []
    assert values["podIdentity"]["aws"]["irsa"] == {"enabled": True, "roleArn": "arn:aws:iam::123456789012:role/x-keda-operator"}
    for c in ("operator", "metricServer", "webhooks"):
        sc = values["securityContext"][c]
        assert sc["capabilities"]["drop"] == ["ALL"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
        assert values["podSecurityContext"][c]["runAsNonRoot"]
    assert "podIdentity" not in objects.keda_values(mode, None)


def test_the_chart_pin_is_the_keda_release_of_the_vendored_crds():
    assert versions.KEDA_CHART_VERSION == "2.20.2"
    for f in ("keda.sh_scaledobjects.yaml", "keda.sh_triggerauthentications.yaml"):
        assert "controller-gen" in (SCHEMAS / f).read_text()[:400]


# --------------------------------------------------------------------------------------
# Components under the mocks (Monitoring's own: tests/monitoring/)


def _autoscaling(**overrides):
    args = autoscaling_component.ModelAutoscalingArgs(
        model_name="llama", namespace="inference", startup_budget_seconds=1300,
        autoscaling={"min_replicas": 1, "max_replicas": 4, "kv_cache_usage_ceiling": 0.8},
        server_address="https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1", region=REGION,
        kubeconfig="{}") | overrides
    built = {}
    rs = mocks.run(lambda: built.setdefault("a", autoscaling_component.ModelAutoscaling("llama-autoscaling", args)),
                   region=REGION, stack="alone")
    return built["a"], rs


def _objects(rs):
    return {r.inputs["kind"]: r for r in rs if r.typ.startswith("kubernetes:keda.sh/")}


def test_model_autoscaling_registers_crd_valid_objects_with_the_planned_queries():
    a, rs = _autoscaling()
    found = _objects(rs)
    assert set(found) == {"ScaledObject", "TriggerAuthentication"}
    for r in found.values():
        validate_keda({k: r.inputs[k] for k in ("apiVersion", "kind", "metadata", "spec")})
    so = found["ScaledObject"]
    assert [t["metadata"]["query"] for t in so.inputs["spec"]["triggers"]] == \
        [decide.waiting_query("llama", "inference"),
         decide.demand_query("llama", "inference", decide.DEFAULT_TARGET_REQUESTS_PER_REPLICA),
         decide.kv_cache_query("llama", "inference")]
    assert found["TriggerAuthentication"].urn in so.dependencies
    hold = so.inputs["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert hold["stabilizationWindowSeconds"] >= 1300


def test_model_autoscaling_keeps_the_standby_sections_sleepers_beside_its_range():
    """The model entry's `standby` section, nested as the other sections; the deprecated
    `standbyCount` plans the same; both at once are refused (one would be ignored)."""
    from warmstart.errors import ConfigError

    plain = _objects(_autoscaling()[1])["ScaledObject"].inputs["spec"]
    nested = _objects(_autoscaling(standby={"count": 2, "sleep_level": 1})[1])["ScaledObject"].inputs["spec"]
    assert (nested["minReplicaCount"], nested["maxReplicaCount"]) == (plain["minReplicaCount"] + 2,
                                                                      plain["maxReplicaCount"] + 2)
    assert nested["triggers"][0]["metadata"]["query"] != plain["triggers"][0]["metadata"]["query"]
    flat = _objects(_autoscaling(standby_count=2)[1])["ScaledObject"].inputs["spec"]
    assert flat == nested
    with pytest.raises(ConfigError) as e:
        _autoscaling(standby={"count": 2}, standby_count=2)
    assert e.value.key == "ModelAutoscalingArgs.standbyCount"


def test_model_autoscaling_without_region_queries_unsigned():
    _, rs = _autoscaling(region=None, server_address="http://prometheus:9090")
    found = _objects(rs)
    assert set(found) == {"ScaledObject"}


def test_model_autoscaling_refuses_min_zero_without_a_queue():
    with pytest.raises(Exception, match=r"ModelAutoscalingArgs\.autoscaling\.minReplicas=0"):
        _autoscaling(autoscaling={"min_replicas": 0, "max_replicas": 4})


@pytest.mark.parametrize("section, key", [
    ({"max_replicas": 0}, "ModelAutoscalingArgs.autoscaling.maxReplicas"),
    ({}, "ModelAutoscalingArgs.autoscaling.maxReplicas"),
    ({"max_replicas": 4, "target_waiting_per_replica": 0}, "ModelAutoscalingArgs.autoscaling.targetWaitingPerReplica"),
    ({"max_replicas": 4, "kv_cache_usage_ceiling": 1.5}, "ModelAutoscalingArgs.autoscaling.kvCacheUsageCeiling"),
])
def test_model_autoscalings_section_is_validated_as_the_configs_under_its_nested_key(section, key):
    with pytest.raises(ConfigErrors) as err:
        _autoscaling(autoscaling=section)
    assert [e.key for e in err.value.errors] == [key]


def test_model_autoscalings_section_defaults_are_the_configs():
    a, _ = _autoscaling(autoscaling={"max_replicas": 4})
    d = config.AutoscalingConfig(max_replicas=4)
    spelled, _ = _autoscaling(autoscaling={"min_replicas": d.min_replicas, "max_replicas": 4,
                                           "target_waiting_per_replica": d.target_waiting_per_replica})
    assert a.plan == spelled.plan and a.plan.min_replicas == d.min_replicas
    assert [t.threshold for t in a.plan.triggers] == [d.target_waiting_per_replica, 1], "no KV-cache trigger unless set"
    assert str(d.target_requests_per_replica) in a.plan.triggers[1].query.replace(".0)", ")") or \
        f"/ {d.target_requests_per_replica:g})" in a.plan.triggers[1].query


def test_model_autoscalings_flat_keys_of_before_scale_as_the_section_with_a_warning(monkeypatch):
    import pulumi

    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, resource=None, **_: warned.append(msg))
    nested, rs_nested = _autoscaling()
    assert warned == []
    flat, rs_flat = _autoscaling(autoscaling=None, min_replicas=1, max_replicas=4, kv_cache_usage_ceiling=0.8)
    assert flat.plan == nested.plan
    assert [r.inputs for r in rs_flat if r.typ.startswith("kubernetes:")] == \
        [r.inputs for r in rs_nested if r.typ.startswith("kubernetes:")]
    assert len(warned) == 1 and "ModelAutoscalingArgs: kvCacheUsageCeiling, maxReplicas, minReplicas" in warned[0]
    with pytest.raises(ConfigError, match="ModelAutoscalingArgs.maxReplicas"):
        _autoscaling(max_replicas=4)


def test_pulumi_infers_a_documented_schema_for_both_components():
    result = Analyzer("warmstart").analyze([monitoring_component.Monitoring, autoscaling_component.ModelAutoscaling])
    defs = result.component_definitions if hasattr(result, "component_definitions") else result["component_definitions"]
    assert set(defs) == {"Monitoring", "ModelAutoscaling"}
    wired = {"Monitoring": {"oidcProviderArn", "oidcIssuer", "clusterArn", "subnetIds", "securityGroupIds", "kubeconfig"},
             "ModelAutoscaling": {"serverAddress", "kubeconfig"}}
    for name, c in defs.items():
        assert c.description
        assert not [k for k, p in {**c.inputs, **c.outputs}.items() if not (p.description or "").strip()], name
        assert {k for k, p in c.inputs.items() if not p.plain} == wired[name]


# --------------------------------------------------------------------------------------
# The policy: KEDA's maxReplicaCount against the NodePool's GPU limit


def _model_plan(name: str, itype: str, weights_gib: float, pool: str = "gpu"):
    m = ModelSpec(name=name, source=f"s3://models/{name}", weights_gib=weights_gib)
    return plan_model(m, key="k", instance_type=itype, pool=pool, loader=LoaderTuning(), compile_cache=False,
                      compile_cache_host_path="/mnt/.ephemeral/compile-cache")


def _records(max_gpus: int, models: list[tuple[str, str, float, int | None]]) -> list[Resource]:
    rs = [Resource("kubernetes:karpenter.sh/v1:NodePool", "gpu", {
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "gpu"},
        "spec": {"limits": {placement.GPU_RESOURCE: str(max_gpus)}}})]
    for name, itype, gib, hi in models:
        plan = _model_plan(name, itype, gib)
        rs.append(Resource("kubernetes:apps/v1:Deployment", name, serving.deployment_spec(plan, "inference", REGION)))
        if hi is not None:
            so = objects.scaled_object(decide.plan_scaling(name, "inference", spec(1, hi), plan.startup_budget_seconds),
                                       "http://p:9090", region=None, authentication=None)
            rs.append(Resource("kubernetes:keda.sh/v1alpha1:ScaledObject", name, so))
    return rs


FITTING = [("g6e.xlarge", 10.0), ("g6e.12xlarge", 60.0), ("g6e.12xlarge", 100.0), ("g6e.48xlarge", 10.0),
           ("p5.48xlarge", 140.0)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(FITTING), st.one_of(st.none(), st.integers(2, 10))), min_size=1, max_size=3),
       st.integers(1, 200))
def test_the_policy_agrees_with_the_config_rule(drawn, max_gpus):
    entries = [(f"m{i}", t, g, hi) for i, ((t, g), hi) in enumerate(drawn)]
    plans = {n: _model_plan(n, t, g) for n, t, g, _ in entries}
    models = [PoolModel(p.instance, p.tensor_parallel_size, p.replicas, name=n) for n, p in plans.items()]
    scaled = {n: spec(1, hi) for n, _, _, hi in entries if hi is not None}
    found = policy.check_autoscaling_fits_pool(_records(max_gpus, entries))
    need = decide.pool_gpus_needed(models, scaled)
    if not scaled:
        assert found == []
    else:
        assert bool(found) == (need > max_gpus)
        assert all(f"need {need}" in v.message and f"allows {max_gpus} GPUs" in v.message for v in found)
        assert {v.resource.name for v in found} <= set(scaled)


def test_the_policy_ignores_pools_without_autoscaled_models():
    assert policy.check_autoscaling_fits_pool(_records(1, [("a", "g6e.12xlarge", 100.0, None)])) == []


def test_the_policy_is_registered_and_skips_unknown_limits():
    from warmstart import policies
    assert policy.POLICY in {c.name for c in policies.CHECKS}
    rs = _records(4, [("a", "g6e.12xlarge", 100.0, 8)])
    rs[0] = Resource(rs[0].typ, rs[0].name, {**rs[0].props, "spec": {"limits": policies.UNKNOWN}})
    assert policy.check_autoscaling_fits_pool(rs) == []
