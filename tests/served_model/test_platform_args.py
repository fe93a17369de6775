"""A ServedModel's `platform` is validated as strictly as a stack file: from Python (snake_case
keys, or camelCase ones read as their twins, never dropped) and from another language (camelCase,
as the component provider maps them), with the stack file's one-line errors naming
`ServedModelArgs.platform.<camelCaseKey>`."""

from __future__ import annotations

import copy

import pytest
from pulumi.provider.experimental.component import ComponentProvider

import components
from components.__main__ import HOSTED
from components.platform import PlatformArgs, PlatformPoolArgs
from tests.support.platforms import KUBECONFIG, PLATFORM
from warmstart import mocks
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.plan import platform as contract
from warmstart.plan import platform_args

MODEL = {"name": "llama-70b", "source": "meta-llama/Llama-3.1-70B-Instruct", "weights_gib": 140, "pool": "h100",
         "node_cache": "off"}
KEY = "ServedModelArgs.platform"


def _served(platform, model=None):
    built = {}
    resources = mocks.run(lambda: built.setdefault("m", components.ServedModel(
        "research-llama-70b", {"model": model or MODEL, "platform": platform})),  # type: ignore[typeddict-item]
        region="us-east-1", stack="alone")
    return built["m"], resources


def _errors(platform, model=None) -> list[ConfigError]:
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        _served(platform, model)
    e = err.value
    return e.errors if isinstance(e, ConfigErrors) else [e]


def _pool(**change):
    return [PLATFORM["pools"][0] | change]


def _without(*keys):
    return {k: v for k, v in PLATFORM.items() if k not in keys}


BAD = [
    # A misspelt mode was a KeyError deep in the planner.
    (PLATFORM | {"cluster_mode": "karpentr"}, "clusterMode", "'auto' or 'karpenter'"),
    # A string where a list belongs was split into its characters.
    (PLATFORM | {"vpc_cidrs": "10.40.0.0/16"}, "vpcCidrs", "expected a list"),
    (PLATFORM | {"pools": _pool(instance_types="p5.48xlarge")}, "pools[0].instanceTypes", "expected a list"),
    # "false" read as true.
    (PLATFORM | {"node_cache": "false"}, "nodeCache", "expected true or false"),
    (PLATFORM | {"pod_scripts": "false"}, "podScripts", "expected true or false"),
    (PLATFORM | {"compile_cache": {"enabled": "false"}}, "compileCache.enabled", "expected true or false"),
    # A namespace Kubernetes refuses.
    (PLATFORM | {"namespace": "Inference_NS"}, "namespace", "must be a DNS label"),
    (PLATFORM | {"namespace": "x" * 64}, "namespace", "at most 63"),
    # Numbers are numbers: no string, no boolean, no NaN.
    (PLATFORM | {"pools": _pool(max_gpus="32")}, "pools[0].maxGpus", "expected an integer"),
    (PLATFORM | {"pools": _pool(max_gpus=True)}, "pools[0].maxGpus", "expected an integer"),
    (PLATFORM | {"pools": _pool(max_gpus=float("nan"))}, "pools[0].maxGpus", "expected an integer"),
    (PLATFORM | {"pools": _pool(capacity_types=["spot", "onDemand"])}, "pools[0].capacityTypes[1]", "'on-demand'"),
    (PLATFORM | {"loader": {"chunk_bytes": "4294967296"}}, "loader.chunkBytes", "expected an integer"),
    (PLATFORM | {"pools": PLATFORM["pools"] * 2}, "pools", "more than once"),
    # Ranges, names and ARNs by the rules of what they name.
    (PLATFORM | {"service_cidr": "172.20.0.1/16"}, "serviceCidr", "host bits"),
    (PLATFORM | {"vpc_cidrs": ["10.40.0.0/16", "fd00::/64"]}, "vpcCidrs[1]", "IPv4"),
    (PLATFORM | {"oidc_issuer": "https://oidc.eks.us-east-1.amazonaws.com/id/ABC"}, "oidcIssuer", "without its scheme"),
    (PLATFORM | {"oidc_provider_arn": "ABC"}, "oidcProviderArn", "OIDC provider ARN"),
    (PLATFORM | {"oidc_provider_arn": 12}, "oidcProviderArn", "a string, or a Pulumi Output"),
    (PLATFORM | {"model_bucket": "s3://research-models"}, "modelBucket", "bucket name"),
    (PLATFORM | {"region": "us-east-\u0661"}, "region", "must be an AWS region code"),
    (PLATFORM | {"image_cache_account": "12345678901\u0662"}, "imageCacheAccount", "12-digit AWS account ID"),
    (PLATFORM | {"monitoring": {"server_address": "prometheus:9090"}}, "monitoring.serverAddress", "http(s) URL"),
    (PLATFORM | {"monitoring": {"server_address": "https://p", "scraper_pods": [
        {"namespace": "monitoring", "pod_labels": {"app name": "prometheus"}}]}},
     "monitoring.scraperPods[0].podLabels", "label key"),
    (PLATFORM | {"non_gpu_placement": {"tolerations": [{"key": "dedicated", "effect": "NoSchedul"}]}},
     "nonGpuPlacement.tolerations[0].effect", "'NoSchedule'"),
    # Unknown keys are errors, with the nearest known one.
    (PLATFORM | {"cluster_nme": "research"}, "cluster_nme", "did you mean `clusterName`"),
    (_without("pools"), "pools", "required"),
    # Both spellings of one key: which one was meant?
    (PLATFORM | {"clusterName": "other"}, "clusterName", "given twice"),
    (PLATFORM | {"pools": _pool(maxGpus=8)}, "pools[0].maxGpus", "given twice"),
]


@pytest.mark.parametrize(("platform", "key", "words"), BAD, ids=[f"{k}-{w}" for _, k, w in BAD])
def test_a_bad_platform_fact_from_python_is_one_line_naming_its_key(platform, key, words):
    errors = _errors(platform)
    assert [e.key for e in errors] == [f"{KEY}.{key}"], [str(e) for e in errors]
    (e,) = errors
    assert words in str(e) and "; fix: " in str(e) and "\n" not in str(e), str(e)


def test_camel_case_keys_in_a_python_dict_are_read_not_dropped():
    """The exported document's spelling (camelCase) in a Python dict: every key reaches the
    model; before, `podScripts` and `nodeCache` were silently dropped."""
    camel = {contract._camel(k): v for k, v in PLATFORM.items()} | {"podScripts": True, "nodeCache": True}
    m, rs = _served(camel, MODEL | {"node_cache": "on"})
    assert m.platform.pod_scripts and m.platform.node_cache and m.platform.cluster_name == "research"
    assert m.plan.staged
    # The platform ships the scripts: the model ships none.
    assert [r for r in rs if r.typ == "kubernetes:core/v1:ConfigMap"] == []
    # The same facts as the snake_case PlatformArgs.
    assert m.platform == _served(PLATFORM | {"pod_scripts": True, "node_cache": True},
                                 MODEL | {"node_cache": "on"})[0].platform


def test_a_platform_stacks_document_passed_as_it_is_is_read():
    doc = contract.document(contract.checked_args(PLATFORM | {"pod_scripts": True}))
    assert doc["contractVersion"] == contract.CONTRACT_VERSION
    m, _ = _served(doc | {"kubeconfig": KUBECONFIG})
    assert m.platform.pod_scripts and m.platform.pools[0].max_gpus == 32
    (e,) = _errors(doc | {"contractVersion": contract.CONTRACT_VERSION + 1})
    assert e.key == f"{KEY}.contractVersion" and "version" in e.rule
    # A document passed as it is from a platform of another major version, or of 0.x (none).
    (e,) = _errors(doc | {"warmstartVersion": "0.4.0"})
    assert e.key == f"{KEY}.warmstartVersion" and "warmstart 0.4.0 (major version 0)" in e.rule
    (e,) = _errors({k: v for k, v in doc.items() if k != "warmstartVersion"})
    assert e.key == f"{KEY}.warmstartVersion" and "0.x" in e.rule


def test_the_non_gpu_placement_is_of_its_kubernetes_shape():
    placement = {"node_selector": {"node-role.example.com/system": "true"},
                 "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"},
                                 {"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}]}
    spec = platform_args.check(PLATFORM | {"non_gpu_placement": placement}, KEY, contract.CONTRACT_VERSION)
    assert spec.non_gpu_placement is not None and spec.non_gpu_placement.tolerations[1].value == "system"
    # Its label keys survive the exported document's camelCase round trip.
    back = contract.platform_args(contract.document(contract.checked_args(
        PLATFORM | {"non_gpu_placement": {"node_selector": {"team_pool": "cpu"}}})), "research", "reader")
    assert back["non_gpu_placement"] == {"node_selector": {"team_pool": "cpu"}}


def test_every_platform_args_key_is_validated():
    """One declaration per fact: every PlatformArgs key (and pool key) is a field of the
    validator, so a new key cannot pass unchecked."""
    fields = set(platform_args.PlatformArgsSpec.model_fields) - {"contract_version", "warmstart_version"}
    assert fields == set(PlatformArgs.__annotations__) | {"non_gpu_placement"}
    assert set(platform_args.PoolArgsSpec.model_fields) == set(PlatformPoolArgs.__annotations__)


def _other_language(platform: dict) -> dict:
    provider = ComponentProvider(HOSTED, "warmstart")
    model = {"name": "llama-70b", "source": "meta-llama/Llama-3.1-70B-Instruct", "weightsGib": 140, "pool": "h100",
             "nodeCache": "off"}
    return provider.map_inputs({"model": model, "platform": platform}, provider._component_defs["ServedModel"])


CAMEL = {"stack": "research", "region": "us-east-1", "clusterName": "research", "clusterMode": "karpenter",
         "kubernetesVersion": "1.33", "namespace": "inference", "namePrefix": "research",
         "oidcProviderArn": PLATFORM["oidc_provider_arn"], "oidcIssuer": PLATFORM["oidc_issuer"],
         "vpcCidrs": ["10.40.0.0/16"], "serviceCidr": "172.20.0.0/16", "modelBucket": "research-models",
         # Every number crosses the wire as a float.
         "pools": [{"name": "h100", "instanceTypes": ["p5.48xlarge"], "maxGpus": 32.0}], "kubeconfig": KUBECONFIG}


@pytest.mark.parametrize(("change", "key", "words"), [
    ({"vpcCidrs": "10.40.0.0/16"}, "vpcCidrs", "expected a list"),
    ({"nodeCache": "false"}, "nodeCache", "expected true or false"),
    ({"namespace": "Inference"}, "namespace", "must be a DNS label"),
    ({"pools": [{"name": "h100", "instanceTypes": ["p5.48xlarge"], "maxGpus": 2.5}]}, "pools[0].maxGpus",
     "expected an integer"),
    ({"loader": {"chunkBytes": "4294967296"}}, "loader.chunkBytes", "expected an integer"),
])
def test_a_bad_platform_fact_from_another_language_names_its_schema_key(change, key, words):
    args = _other_language(copy.deepcopy(CAMEL) | change)
    errors = _errors(args["platform"], args["model"])
    assert [e.key for e in errors] == [f"{KEY}.{key}"], [str(e) for e in errors]
    assert words in str(errors[0]) and "\n" not in str(errors[0])


def test_another_languages_whole_numbers_arrive_as_floats_and_are_read():
    args = _other_language(copy.deepcopy(CAMEL) | {"loader": {"chunkBytes": float(2**32)}})
    assert isinstance(args["platform"]["pools"][0]["max_gpus"], float)
    m, _ = _served(args["platform"], args["model"])
    assert m.platform.pools[0].max_gpus == 32 and m.platform.loader.chunk_bytes == 2**32
