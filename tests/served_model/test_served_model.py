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
    from tests.conftest import ROOT

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
