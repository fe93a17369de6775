"""The components as a public surface: Pulumi's schema inference accepts them, each one works
alone from Args a person writes, and inside a stack each decides exactly what the stack plan says."""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

import components
from components import schema as package_schema
from components.__main__ import HOSTED
from tests.support.stacks import ROOT, STACK_NAMES, STACKS_DIR
from warmstart import config, mocks, policies, render
from warmstart.decisions import placement
from warmstart.errors import ConfigErrors

EXAMPLES = ROOT / "examples"
KUBECONFIG = json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []})
# Inputs that are wired from other resources, so other languages can pass outputs to them; every
# other input is a plan-time decision and must be plain.
WIRED = {
    "ServedModel": {"huggingFaceToken"},
    "ServingPlatform": {"dockerHubCredentialArn"},
    "Network": set(),
    "Cluster": {"vpcId", "privateSubnetIds", "publicSubnetIds"},
    "ModelStorage": {"s3EndpointId"},
    "ModelRole": {"oidcProviderArn", "oidcIssuer", "compileCacheBucket"},
    "ModelImportRole": {"oidcProviderArn", "oidcIssuer"},
    "VllmModel": {"compileCacheBucket", "roleArn", "kubeconfig", "importRoleArn", "huggingFaceToken", "nodeCacheRoleArn"},
    "ModelRouter": {"controlPlaneApiKey", "kubeconfig"},
    "Monitoring": {"oidcProviderArn", "oidcIssuer", "clusterArn", "subnetIds", "securityGroupIds", "kubeconfig"},
    "ModelAutoscaling": {"serverAddress", "kubeconfig"},
    "ModelStandby": {"kubeconfig"},
}


# --------------------------------------------------------------------------------------
# The package's schema, as `pulumi package add` infers it


def test_pulumi_infers_a_schema_for_every_hosted_component():
    result = package_schema.analyze()
    defs = result["component_definitions"]
    assert sorted(defs) == sorted(WIRED)
    for name, c in defs.items():
        assert c.description, name
        assert c.inputs and c.outputs, name
        undocumented = [k for k, p in {**c.inputs, **c.outputs}.items() if not (p.description or "").strip()]
        assert not undocumented, f"{name}: no docstring for {undocumented}"
        wired = {k for k, p in c.inputs.items() if not p.plain}
        assert wired == WIRED[name], f"{name}: inputs that accept outputs {sorted(wired)}"
    for t in result["type_definitions"].values():
        props = t.enum or list(t.properties.values())
        assert t.description and props, t.name
        assert all((p.description or "").strip() for p in props), t.name


def test_the_per_model_components_take_the_model_entrys_sections_nested():
    inputs = {name: c.inputs for name, c in package_schema.analyze()["component_definitions"].items()}
    assert inputs["ModelRouter"]["routing"].ref.endswith(":ModelEntryRoutingArgs")
    assert inputs["ModelAutoscaling"]["autoscaling"].ref.endswith(":ModelEntryAutoscalingArgs")
    assert not {"policy", "loadFactor", "maxExcessRequests", "expose"} & set(inputs["ModelRouter"])
    assert not {"minReplicas", "maxReplicas", "targetWaitingPerReplica", "kvCacheUsageCeiling"} & set(
        inputs["ModelAutoscaling"])
    assert inputs["ModelStandby"]["standby"].ref.endswith(":ModelEntryStandbyArgs")
    assert inputs["ModelStandby"]["autoscaling"].ref.endswith(":ModelEntryAutoscalingArgs")
    assert not {"count", "sleepLevel", "awakeIdleSeconds", "minAwake", "targetWaitingPerReplica"} & set(
        inputs["ModelStandby"])


def test_the_schema_names_every_component_by_its_token():
    doc = package_schema.schema()
    assert doc["name"] == "warmstart"
    tokens = {f"warmstart:index:{c.__name__}" for c in HOSTED}
    assert set(doc["resources"]) == tokens
    for token, res in doc["resources"].items():
        assert res["isComponent"] is True
        assert res["requiredInputs"], token
        assert all(p.get("description") for p in res["inputProperties"].values()), token
    # A component instance registers under the same token the schema advertises.
    for c in HOSTED:
        assert f'"warmstart:index:{c.__name__}"' in Path(c.__init__.__code__.co_filename).read_text()


def test_the_plugin_manifest_names_the_python_runtime():
    manifest = yaml.safe_load((ROOT / "components" / "PulumiPlugin.yaml").read_text())
    assert manifest == {"runtime": "python"}
    assert (ROOT / "components" / "__main__.py").is_file()


def test_components_readme_is_the_generated_reference():
    readme = (ROOT / "components" / "README.md").read_text()
    assert readme == package_schema.reference(), "stale: run `python -m components.schema > components/README.md`"
    for c in HOSTED:
        assert f"## {c.__name__}\n" in readme


# --------------------------------------------------------------------------------------
# Inside the stack: each component decides what the stack plan decided


def _stack(stack: str):
    _, plan = render.load_plan(STACKS_DIR, stack)
    built = {}

    def program():
        built["stack"] = components.WarmstartStack(
            "warmstart", components.WarmstartStackArgs(config=plan.config, stack=stack))

    mocks.run(program, region=plan.config.region, stack=stack)
    return plan, built["stack"]


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_each_component_plans_from_its_args_exactly_what_the_stack_planned(stack):
    plan, s = _stack(stack)
    # Each VllmModel holds its ServedModel's plan (routing and autoscaling are only recorded in it:
    # the ModelRouter and ModelAutoscaling act on them).
    assert {name: m.plan for name, m in s.models.items()} == {m.name: m for m in plan.models}
    # Each ServedModel planned, from its model entry and PlatformArgs alone, what the stack planned.
    assert {name: sm.plan for name, sm in s.served.items()} == {m.name: m for m in plan.models}
    assert {name: r.plan.policy for name, r in s.routers.items()} == {
        m.name: m.routing_policy for m in plan.models if m.routed}
    assert {name: (a.plan.min_replicas, a.plan.max_replicas) for name, a in s.autoscalers.items()} == {
        # KEDA counts pods: the standby engines are inside its range.
        m.name: (m.autoscaling.min_replicas + (m.standby.count if m.standby else 0),
                 m.autoscaling.max_replicas + (m.standby.count if m.standby else 0))
        for m in plan.models if m.autoscaling}
    assert s.network.plan == plan.aws.network
    assert s.storage.plan == plan.aws.buckets
    assert {name: r.access for name, r in s.roles.items()} == {a.model: a for a in plan.aws.access}
    assert s.cluster.plan.pools == plan.cluster.pools
    assert s.cluster.plan.system_node_group == plan.cluster.system_node_group


def _flat_args(spec, m, cfg) -> dict:
    """The VllmModel Args a program wrote for a planned model before `model` (its model fields
    flat, the deprecated alias)."""
    values = dict(model_name=m.name, source=m.source, weights_gib=spec.weights_gib,
                  instance_type=m.instance.instance_type, region=cfg.region, namespace=cfg.namespace,
                  tensor_parallel_size=None if spec.tensor_parallel_size == "auto" else spec.tensor_parallel_size,
                  replicas=m.replicas, image=m.image, max_model_len=m.max_model_len,
                  gpu_memory_utilization=m.gpu_memory_utilization, eager=m.eager, extra_args=list(m.extra_args),
                  loader=m.loader.model_dump(), cluster_mode=cfg.cluster_mode, node_pool=m.pool,
                  compile_cache=m.compile_cache, compile_cache_host_path=m.compile_cache_host_path,
                  weights_import=spec.weights_import.model_dump(exclude_none=True) if spec.weights_import else None,
                  node_cache=m.load.mode if m.load else None,
                  # The stack's platform puts the non-GPU pods on its general-purpose pool.
                  non_gpu_placement=placement.own_platform_placement().args(),
                  standby=spec.standby.model_dump() if spec.standby else None,
                  autoscaled=True if spec.autoscaling else None)
    return {k: v for k, v in values.items() if v is not None}


def _nested_args(spec, m, cfg) -> dict:
    """The VllmModel Args a program writes for a planned model: its stack entry as `model`, with
    what the stack resolved for it (full source, instance type, cached image, the stack's loader
    and compile cache), beside the wiring."""
    entry = spec.model_dump(exclude_unset=True, exclude_none=True) | {
        "source": m.source, "instance_type": m.instance.instance_type, "image": m.image,
        "loader": m.loader.model_dump(), "compile_cache": m.compile_cache,
        "node_cache": m.load.mode if m.load else "off"}
    return dict(model=entry, region=cfg.region, namespace=cfg.namespace, cluster_mode=cfg.cluster_mode,
                compile_cache_host_path=m.compile_cache_host_path,
                non_gpu_placement=placement.own_platform_placement().args())


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_vllm_model_alone_plans_from_its_args_what_the_served_model_planned(stack):
    """VllmModel used alone (no plan handed in) decides exactly what a ServedModel decided for
    the same model: one planner, whichever way in. The nested entry gives the whole plan (its
    routing and autoscaling too); the deprecated flat keys, which have neither, its serving part."""
    from components.serving import plan_serving

    _, plan = render.load_plan(STACKS_DIR, stack)
    for spec, m in zip(plan.config.models, plan.models):
        assert plan_serving(_nested_args(spec, m, plan.config)) == m, m.name
        assert plan_serving(_flat_args(spec, m, plan.config)).serving == m.serving, m.name


# --------------------------------------------------------------------------------------
# Alone: a vLLM model on an existing cluster


def _vllm_alone(**overrides):
    args = components.VllmModelArgs(model_name="llama", source="s3://team-models/meta-llama/Llama-3.1-70B",
                                    weights_gib=140, instance_type="p5.48xlarge", region="us-east-1",
                                    namespace="ml", kubeconfig=KUBECONFIG,
                                    compile_cache_bucket="team-compile-cache") | overrides
    built = {}
    resources = mocks.run(lambda: built.setdefault("m", components.VllmModel("llama", args)),
                          region="us-east-1", stack="alone")
    return built["m"], resources


def test_a_model_alone_decides_its_tuning_and_ships_its_own_scripts():
    m, resources = _vllm_alone()
    assert (m.plan.tensor_parallel_size, m.plan.concurrency, m.plan.distributed) == (4, 35, True)
    (provider,) = [r for r in resources if r.typ == "pulumi:providers:kubernetes"]
    objects = [r.inputs for r in resources if render.is_kubernetes_object(r)]
    assert all(r.provider and provider.urn in r.provider for r in resources if render.is_kubernetes_object(r))
    maps = {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    assert maps == {"llama-nvme-check", "llama-compile-cache", "llama-first-token"}
    (dep,) = [o for o in objects if o["kind"] == "Deployment"]
    mounted = {v["configMap"]["name"] for v in dep["spec"]["template"]["spec"]["volumes"] if "configMap" in v}
    assert mounted == maps, "the pods must mount the ConfigMaps this model ships"
    assert "karpenter.sh/nodepool" not in dep["spec"]["template"]["spec"]["nodeSelector"]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.33", strict=True)
    assert not policies.run_all(mocks.policy_records(resources, "us-east-1"))


def test_a_model_alone_without_a_cache_bucket_keeps_the_node_cache_and_no_restore():
    m, resources = _vllm_alone(compile_cache_bucket=None)
    (dep,) = [r.inputs for r in resources if r.typ == "kubernetes:apps/v1:Deployment"]
    inits = [c["name"] for c in dep["spec"]["template"]["spec"]["initContainers"]]
    # The node cache stays: the NVMe check, then the init container that hands its directory to
    # the pods' non-root UID; no restore. The first-token sidecar still times the start (with no
    # bucket it keeps no record).
    assert inits == ["nvme-check", "compile-cache-owner", "first-token"] and m.plan.compile_cache
    assert {r.inputs["metadata"]["name"] for r in resources if r.typ == "kubernetes:core/v1:ConfigMap"} == {
        "llama-nvme-check", "llama-first-token"}


@pytest.mark.parametrize("overrides, key, rule", [
    ({"tensor_parallel_size": 8, "instance_type": "g6e.12xlarge"}, "VllmModelArgs.tensorParallelSize", "needs 8 GPUs"),
    ({"instance_type": "p9.96xlarge"}, "VllmModelArgs.instanceType", "unknown GPU instance type"),
    ({"source": "https://example.com/m"}, "VllmModelArgs.source", "must be s3://bucket/prefix"),
    # A key prefix is a stack's shorthand for its own model bucket; a model alone has none.
    ({"source": "meta-llama/Llama-3.1-8B-Instruct"}, "VllmModelArgs.source", "must be s3://bucket/prefix with"),
    ({"compile_cache_host_path": "/var/cache/x"}, "VllmModelArgs.compileCacheHostPath", "is not under"),
    ({"eager": True}, "VllmModelArgs.compileCache", "--enforce-eager disables torch.compile"),
])
def test_a_model_alone_names_the_arg_it_cannot_use(overrides, key, rule):
    if overrides.get("eager"):
        overrides = overrides | {"compile_cache": True, "tensor_parallel_size": None, "weights_gib": 15}
    with pytest.raises(Exception) as err:
        _vllm_alone(**overrides)
    errors = err.value.errors if isinstance(err.value, ConfigErrors) else getattr(err.value, "errors", None)
    text = str(err.value) if errors is None else "\n".join(str(e) for e in errors)
    assert key in text and rule in text, text


# --------------------------------------------------------------------------------------
# The examples: components used alone in programs of their own, validated like a stack


EXAMPLE_NAMES = sorted(p.name for p in EXAMPLES.iterdir() if (p / "__main__.py").is_file())


def _render_example(name: str) -> tuple[dict, list[mocks.Registered]]:
    folder = EXAMPLES / name
    raw = config.read_stack_file(folder / "Pulumi.example.yaml")
    project = yaml.safe_load((folder / "Pulumi.yaml").read_text())["name"]
    region = raw[f"{project}:region"]
    return raw, mocks.run_program_file(folder, region=region, stack="example", config=raw, project=project)


def test_there_are_examples_of_components_alone():
    assert {"vllm-on-existing-cluster", "buckets-and-role"} <= set(EXAMPLE_NAMES)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_renders_and_validates_like_a_stack(name):
    raw, resources = _render_example(name)
    assert resources
    used = {r.typ for r in resources if r.typ.startswith("warmstart:index:")}
    assert used and used <= {f"warmstart:index:{c.__name__}" for c in HOSTED}
    for r in resources:
        if render.is_kubernetes_object(r):
            kubernetes_validate.validate(r.inputs, "1.33", strict=True)
    region = next(v for k, v in raw.items() if k.endswith(":region"))
    assert [str(v) for v in policies.run_all(mocks.policy_records(resources, region))] == []


def test_examples_import_the_installed_name_not_a_bare_components_package():
    for name in EXAMPLE_NAMES:
        source = (EXAMPLES / name / "__main__.py").read_text()
        assert "from warmstart_components import" in source and "import components" not in source


def test_another_languages_inputs_reach_the_component_as_its_args():
    """What `pulumi package add` SDKs send (camelCase inputs, enums as strings) is mapped by the
    SDK's own component provider onto the Args and builds the same model."""
    from pulumi.provider.experimental.component import ComponentProvider

    provider = ComponentProvider(HOSTED, "warmstart")
    inputs = {"modelName": "llama", "source": "s3://team-models/meta-llama/Llama-3.1-70B", "weightsGib": 140,
              "instanceType": "p5.48xlarge", "region": "us-east-1", "namespace": "ml", "clusterMode": "karpenter",
              "nvmeCheck": "fail", "loader": {"chunkBytes": 2 * 2**30}, "kubeconfig": KUBECONFIG,
              "nodePool": "h100"}
    args = provider.map_inputs(inputs, provider._component_defs["VllmModel"])
    assert args["weights_gib"] == 140 and args["cluster_mode"] is components.ClusterMode.KARPENTER
    assert args["loader"] == {"chunk_bytes": 2 * 2**30}
    built = {}
    mocks.run(lambda: built.setdefault("m", components.VllmModel("llama", args)), region="us-east-1", stack="sdk")
    m = built["m"].plan
    assert m.compile_cache_host_path.startswith("/mnt/k8s-disks/0/") and m.concurrency == 70
    # The same model nested, as `model` (ModelEntryArgs, whose schema requires `pool`), plans the same.
    flat = ("modelName", "source", "weightsGib", "instanceType", "loader", "nodePool")
    nested = {k: v for k, v in inputs.items() if k not in flat} | {"model": {
        "name": "llama", "source": inputs["source"], "weightsGib": 140, "instanceType": "p5.48xlarge",
        "loader": {"chunkBytes": 2 * 2**30}, "pool": "h100"}}
    args = provider.map_inputs(nested, provider._component_defs["VllmModel"])
    assert args["model"]["weights_gib"] == 140 and args["model"]["loader"] == {"chunk_bytes": 2 * 2**30}
    mocks.run(lambda: built.update(n=components.VllmModel("llama", args)), region="us-east-1", stack="sdk")
    assert built["n"].plan == m
    # A model key left out is the component's error, keyed as written.
    args = provider.map_inputs({k: v for k, v in inputs.items() if k != "weightsGib"},
                               provider._component_defs["VllmModel"])
    with pytest.raises(ConfigErrors, match=r"VllmModelArgs\.weightsGib"):
        mocks.run(lambda: components.VllmModel("llama", args), region="us-east-1", stack="sdk")
