"""ServedModel from its own Args: one model entry and a PlatformArgs, nothing else."""

from __future__ import annotations

import copy
import json

import kubernetes_validate
import pytest

import components
from tests.support.platforms import KUBECONFIG, PLATFORM
from warmstart import mocks
from warmstart.errors import ConfigError, ConfigErrors

MODEL = {"name": "llama-70b", "source": "meta-llama/Llama-3.1-70B-Instruct", "weights_gib": 140, "pool": "h100",
         "node_cache": "off"}


def _served(model=None, platform=None, name="research-llama-70b"):
    built = {}
    args = {"model": model or MODEL, "platform": platform or PLATFORM}
    resources = mocks.run(lambda: built.setdefault("m", components.ServedModel(name, args)),  # type: ignore[arg-type]
                          region="us-east-1", stack="alone")
    return built["m"], resources


def _of(resources, typ):
    return [r for r in resources if r.typ == typ]


def test_a_model_entry_on_a_platform_it_did_not_create_plans_and_deploys_alone():
    m, rs = _served()
    # The relative source is in the platform's model bucket; TP auto on the pool's only type.
    assert m.plan.source == "s3://research-models/meta-llama/Llama-3.1-70B-Instruct"
    assert (m.plan.pool, m.plan.instance.instance_type, m.plan.tensor_parallel_size) == ("h100", "p5.48xlarge", 4)
    # Karpenter mode: the compile cache under the mode's NVMe mount.
    assert m.plan.compile_cache_host_path.startswith("/mnt/k8s-disks/0/")
    (dep,) = [r for r in _of(rs, "kubernetes:apps/v1:Deployment") if r.inputs["metadata"]["name"] == "llama-70b"]
    assert dep.inputs["metadata"]["namespace"] == "inference"
    assert dep.inputs["spec"]["template"]["spec"]["nodeSelector"]["karpenter.sh/nodepool"] == "h100"
    # Its role trusts one ServiceAccount of the platform's cluster, named by the platform's prefix.
    (role,) = _of(rs, "aws:iam/role:Role")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    cond = trust["Statement"][0]["Condition"]["StringEquals"]
    assert cond[f"{PLATFORM['oidc_issuer']}:sub"] == "system:serviceaccount:inference:llama-70b"
    assert role.inputs["name"].startswith("research-")
    # No shared scripts on this platform: the model ships its own.
    assert {r.inputs["metadata"]["name"] for r in _of(rs, "kubernetes:core/v1:ConfigMap")} >= {"llama-70b-first-token"}
    # One Kubernetes provider, from the platform's kubeconfig.
    assert len(_of(rs, "pulumi:providers:kubernetes")) == 1
    for r in rs:
        if r.typ.startswith("kubernetes:") and "apiVersion" in r.inputs:
            kubernetes_validate.validate(r.inputs, "1.33", strict=True)


def test_its_resources_are_named_from_its_prefix_as_in_the_stack():
    _, rs = _served(name="team-llama-70b")
    names = {r.name for r in rs if r.typ.startswith("warmstart:index:")}
    assert {"team-llama-70b", "team-identity-llama-70b"} <= names
    assert all(r.urn.split("::")[2].startswith("warmstart:index:ServedModel") for r in rs
               if r.typ != "warmstart:index:ServedModel" and r.typ.startswith("warmstart:index:"))


def test_a_platform_that_ships_the_scripts_is_not_shipped_them_again():
    _, rs = _served(platform=PLATFORM | {"pod_scripts": True})
    assert _of(rs, "kubernetes:core/v1:ConfigMap") == []


@pytest.mark.parametrize(("change", "key", "words"), [
    ({"model": MODEL | {"pool": "a100"}}, "ServedModelArgs.model.pool", "no GPU pool 'a100'"),
    ({"model": MODEL | {"weights_gib": -1}}, "ServedModelArgs.model.weightsGib", ""),
    ({"model": MODEL | {"autoscaling": {"max_replicas": 3}}}, "ServedModelArgs.model.autoscaling", "runs no KEDA"),
    ({"model": MODEL | {"node_cache": "on"}}, "ServedModelArgs.model.nodeCache", "node-feature-discovery"),
    ({"platform": {k: v for k, v in PLATFORM.items() if k != "pools"}}, "ServedModelArgs.platform.pools", "required"),
])
def test_bad_args_are_named_by_their_key(change, key, words):
    args = {"model": MODEL, "platform": PLATFORM} | change
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        mocks.run(lambda: components.ServedModel("research-llama-70b", args), region="us-east-1", stack="bad")
    errors = err.value.errors if isinstance(err.value, ConfigErrors) else [err.value]
    assert any(e.key == key and words in str(e) for e in errors), [str(e) for e in errors]


SPOT = PLATFORM | {"pools": [PLATFORM["pools"][0] | {"capacity_types": ["spot", "on-demand"]}]}


def test_a_one_replica_model_on_a_spot_pool_is_refused_as_inline_models_and_model_stacks_are():
    """The rule of a model on a spot pool is one (capacity.spot_replicas_problem), run by an
    inline model's plan, a model stack's and a ServedModel's: before, a ServedModel took a
    one-replica model onto spot."""
    from warmstart.decisions import capacity

    with pytest.raises((ConfigError, ConfigErrors)) as err:
        mocks.run(lambda: components.ServedModel("research-llama-70b", {"model": MODEL, "platform": SPOT}),
                  region="us-east-1", stack="bad")
    errors = err.value.errors if isinstance(err.value, ConfigErrors) else [err.value]
    (e,) = errors
    assert e.key == "ServedModelArgs.model.replicas" and e.value == 1
    assert capacity.spot_replicas_problem("h100", ["spot"], "llama-70b", 1) in e.rule and "'research'" in e.rule
    assert "replicas >= 2" in e.fix
    # An autoscaled model is judged by its fewest replicas, and two replicas may run on spot.
    monitored = SPOT | {"monitoring": {"server_address": "https://prometheus.example/api/v1"}}
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        mocks.run(lambda: components.ServedModel("research-llama-70b", {
            "model": MODEL | {"autoscaling": {"min_replicas": 1, "max_replicas": 3}}, "platform": monitored}),
            region="us-east-1", stack="bad")
    errors = err.value.errors if isinstance(err.value, ConfigErrors) else [err.value]
    assert [x.key for x in errors] == ["ServedModelArgs.model.autoscaling.minReplicas"]
    m, _ = _served(model=MODEL | {"replicas": 2}, platform=SPOT)
    assert m.plan.replicas == 2


def test_another_languages_inputs_reach_it_as_its_args():
    """What a YAML or TypeScript program sends (camelCase keys as the schema names them, enums
    as strings) is mapped by the SDK's component provider onto ServedModelArgs, and deploys the
    same model as the Python Args."""
    from pulumi.provider.experimental.component import ComponentProvider

    from components.__main__ import HOSTED

    provider = ComponentProvider(HOSTED, "warmstart")
    platform = {"stack": "research", "region": "us-east-1", "clusterName": "research", "clusterMode": "karpenter",
                "kubernetesVersion": "1.33", "namespace": "inference", "namePrefix": "research",
                "oidcProviderArn": PLATFORM["oidc_provider_arn"], "oidcIssuer": PLATFORM["oidc_issuer"],
                "vpcCidrs": ["10.40.0.0/16"], "serviceCidr": "172.20.0.0/16", "modelBucket": "research-models",
                "pools": [{"name": "h100", "instanceTypes": ["p5.48xlarge"], "maxGpus": 32}], "kubeconfig": KUBECONFIG,
                "monitoring": {"serverAddress": "https://prometheus.example/api/v1", "scraperPods": [
                    {"namespace": "monitoring", "podLabels": {"app.kubernetes.io/name": "prometheus"}}]}}
    model = {"name": "llama-70b", "source": "meta-llama/Llama-3.1-70B-Instruct", "weightsGib": 140, "pool": "h100",
             "nodeCache": "off", "routing": {"policy": "prefix_hash", "loadFactor": 1.5},
             "autoscaling": {"maxReplicas": 3}, "weightsImport": {"s3": "s3://staging/llama-70b"}}
    args = provider.map_inputs({"model": model, "platform": platform}, provider._component_defs["ServedModel"])
    assert args["platform"]["cluster_mode"] is components.ClusterMode.KARPENTER
    # A label map's keys are labels, not schema names: they arrive as written.
    assert args["platform"]["monitoring"]["scraper_pods"][0]["pod_labels"] == {"app.kubernetes.io/name": "prometheus"}
    assert args["model"]["weights_gib"] == 140 and args["model"]["routing"]["load_factor"] == 1.5
    m, rs = _served(model=args["model"], platform=args["platform"])
    python = copy.deepcopy(MODEL) | {"routing": {"policy": "prefix_hash", "load_factor": 1.5},
                                     "autoscaling": {"max_replicas": 3}, "weights_import": {"s3": "s3://staging/llama-70b"}}
    assert m.plan == _served(model=python, platform=PLATFORM | {"monitoring": args["platform"]["monitoring"]})[0].plan
    assert m.plan.routed and m.plan.weights_import is not None and m.plan.autoscaling.max_replicas == 3
    assert _of(rs, "kubernetes:keda.sh/v1alpha1:ScaledObject")
    with pytest.raises(Exception, match="weightsGib"):
        provider.map_inputs({"model": {k: v for k, v in model.items() if k != "weightsGib"}, "platform": platform},
                            provider._component_defs["ServedModel"])


def test_the_components_pages_yaml_program_reaches_the_served_model_intact():
    """The YAML program of docs/components.md, as its SDK sends it (camelCase properties), is
    mapped onto ServedModelArgs and deploys: every key it sets arrives."""
    import re

    import yaml
    from pulumi.provider.experimental.component import ComponentProvider

    from components.__main__ import HOSTED
    from tests.support.stacks import ROOT

    doc = (ROOT / "docs" / "components.md").read_text()
    program = next(yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", doc, re.S) if "ServedModel" in b)
    (resource,) = program["resources"].values()
    assert resource["type"] == "warmstart:index:ServedModel"
    props = resource["properties"]
    props["platform"]["kubeconfig"] = KUBECONFIG  # `${kubeconfig}`: the program's secret
    provider = ComponentProvider(HOSTED, "warmstart")
    args = provider.map_inputs(props, provider._component_defs["ServedModel"])
    m, rs = _served(model=args["model"], platform=args["platform"], name="research-llama-3-1-70b")
    from components.model_args_gen import camel_case

    # Every key the program writes arrives, under its Python name, and nothing else.
    assert {camel_case(k) for k in args["model"]} == set(props["model"])
    assert {camel_case(k) for k in args["platform"]} == set(props["platform"])
    assert (m.plan.name, m.plan.weights_bytes, m.plan.pool, m.plan.routing.policy) == (
        "llama-3-1-70b", 140 * 2**30, "h100", "prefix_hash")
    assert m.platform.cluster_mode == "karpenter" and m.platform.vpc_cidrs == ("10.40.0.0/16",)
    assert m.plan.source == "s3://my-models/meta-llama/Llama-3.1-70B-Instruct" and not m.plan.staged
    assert [r for r in rs if r.typ == "kubernetes:apps/v1:Deployment"]


# --- Where its non-GPU pods run (the platform's `non_gpu_placement`) ---------------------------

ROUTED = MODEL | {"replicas": 2, "import": {"s3": "s3://upstream/llama"}}


def _non_gpu_pods(rs):
    """The router Deployment's and import Job's pod specs."""
    out = {}
    for r in _of(rs, "kubernetes:apps/v1:Deployment") + _of(rs, "kubernetes:batch/v1:Job"):
        spec = r.inputs["spec"]["template"]["spec"]
        if not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations") or []):
            out[r.inputs["metadata"]["name"]] = spec
    return out


def test_with_no_placement_its_routers_and_import_run_anywhere_off_the_gpu_nodes():
    """A cluster warmstart did not create has neither `warmstart.io/node-group` nor warmstart's
    NodePools: with no placement, no warmstart-only label, only an affinity off the GPU labels."""
    from warmstart.decisions import placement

    _, rs = _served(model=ROUTED)
    pods = _non_gpu_pods(rs)
    assert "llama-70b-router" in pods and len(pods) == 2, sorted(pods)
    for spec in pods.values():
        assert "nodeSelector" not in spec and "tolerations" not in spec
        assert spec["affinity"] == placement.off_gpu_affinity()
        assert placement.NODE_GROUP_LABEL not in json.dumps(spec)


def test_its_routers_and_import_take_the_platforms_placement():
    given = {"node_selector": {"node-role.example.com/cpu": "true"},
             "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "cpu", "effect": "NoSchedule"}]}
    _, rs = _served(model=ROUTED, platform=PLATFORM | {"non_gpu_placement": given})
    pods = _non_gpu_pods(rs)
    assert len(pods) == 2
    for spec in pods.values():
        assert spec["nodeSelector"] == given["node_selector"] and spec["tolerations"] == given["tolerations"]
        assert "affinity" not in spec


@pytest.mark.parametrize(("selector", "words"), [
    ({"karpenter.sh/nodepool": "h100"}, "its GPU pool 'h100'"),
    ({"warmstart.io/node-group": "system"}, "sized for the controller and CoreDNS alone"),
])
def test_a_placement_where_its_non_gpu_pods_cannot_run_is_refused_with_the_numbers(selector, words):
    platform = PLATFORM | {"non_gpu_placement": {"node_selector": selector}}
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        mocks.run(lambda: components.ServedModel("research-llama-70b", {"model": ROUTED, "platform": platform}),
                  region="us-east-1", stack="bad")
    errors = err.value.errors if isinstance(err.value, ConfigErrors) else [err.value]
    (e,) = [e for e in errors if e.key == "ServedModelArgs.platform.nonGpuPlacement"]
    # The numbers: 2 routers plus a surge pod at 500m and the import Job at 500m.
    assert words in str(e) and "2000m CPU" in str(e), str(e)


def test_a_malformed_placement_is_named_by_its_key():
    platform = PLATFORM | {"non_gpu_placement": {"tolerations": [{"key": "x", "operator": "Sometimes"}]}}
    with pytest.raises((ConfigError, ConfigErrors), match=r"ServedModelArgs\.platform.*operator"):
        mocks.run(lambda: components.ServedModel("research-llama-70b", {"model": ROUTED, "platform": platform}),
                  region="us-east-1", stack="bad")


def test_the_general_purpose_pools_room_is_checked_with_the_numbers():
    """On a warmstart platform's own pool: each pod must fit one of its nodes, and in Karpenter
    mode all of a model's non-GPU pods at their peak must fit what the CPU limit keeps for model
    stacks (warmstart/decisions/cpu_pool.py)."""
    from warmstart.decisions import cpu_pool, node_fit

    router = node_fit.PodDemand("m-router", 500, 512, count=3)
    assert cpu_pool.check_pods("karpenter", [router], budget_millis=cpu_pool.MODEL_STACKS_CPU_MILLIS).problems == ()
    huge = node_fit.PodDemand("m-router", 9000, 512, count=3)
    (one, total) = cpu_pool.check_pods("karpenter", [huge], budget_millis=20000).problems
    assert "9000m CPU" in one and "largest general-purpose node" in one
    assert "27000m CPU" in total and "20000m" in total
    assert cpu_pool.check_pods("auto", [huge], budget_millis=None).problems == ()
    assert cpu_pool.check_pods("auto", [node_fit.PodDemand("x", 500_000, 1)], budget_millis=None).problems
