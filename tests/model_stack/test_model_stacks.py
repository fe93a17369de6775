"""Model stacks: one model on an environment's platform, through the exported contract
(warmstart/plan/platform.py, components/model_stack.py), rendered offline against the platform's
own render."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.support.keda import validate_keda
from tests.support.stacks import (
    ALL_STACK_NAMES,
    MODEL_STACK_NAMES,
    PLATFORM_STACK_NAMES,
    STACKS_DIR,
    load_stack_doc,
    render_stack,
)
from tests.support.validation import validate_rendered
from warmstart import config, mocks, policies, render, versions
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.plan import platform


def _doc(stack: str) -> dict:
    return load_stack_doc(stack)


def _objects_of(rendered: render.Rendered, model: str) -> dict[tuple[str, str], dict]:
    """The model's own Kubernetes objects, by (kind, name)."""
    out = {}
    for o in rendered.kubernetes_objects:
        labels = o.get("metadata", {}).get("labels") or {}
        if labels.get("app.kubernetes.io/instance") == model or o["metadata"]["name"].startswith(f"{model}-") \
                or o["metadata"]["name"] == model:
            out[(o["kind"], o["metadata"]["name"])] = o
    return out


def _write(tmp_path: Path, docs: dict[str, dict]) -> Path:
    d = tmp_path / "stacks"
    d.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        (d / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump(doc))
    return d


def test_the_shipped_stacks_include_a_model_stack():
    assert MODEL_STACK_NAMES == ["staging-llama-3-1-8b"] and PLATFORM_STACK_NAMES == ["staging"]


@pytest.mark.parametrize("stack", ALL_STACK_NAMES)
def test_every_stack_file_renders_validates_and_passes_the_policy_pack(stack):
    """Platform and model stacks alike: every Kubernetes object against its schema (KEDA's
    against the vendored CRDs), every resource through the policy pack."""
    validate_rendered(render_stack(stack))




@pytest.mark.parametrize("stack", MODEL_STACK_NAMES)
def test_a_model_stack_renders_and_validates_like_an_environment(stack):
    r = render_stack(stack)
    assert isinstance(r.stack_plan, platform.ModelStackPlan)
    version = r.stack_plan.kubernetes_version
    kinds = set()
    for obj in r.kubernetes_objects:
        kinds.add(obj["kind"])
        if obj["apiVersion"].startswith("keda.sh/"):
            validate_keda(obj)
        else:
            kubernetes_validate.validate(obj, version, strict=True)
    assert {"Deployment", "Service", "ServiceAccount", "NetworkPolicy"} <= kinds
    # Only the model's resources: no cluster, network, bucket or namespace of its own.
    types = {x.typ for x in r.resources}
    assert not {t for t in types if t.startswith(("eks:", "aws:ec2", "aws:s3")) or t == "kubernetes:core/v1:Namespace"}
    assert mocks.STACK_REFERENCE_TYPE in types
    records = mocks.policy_records(r.resources, r.stack_plan.contract.region)
    assert [str(v) for v in policies.run_all(records)] == []


def test_the_model_stack_creates_what_the_same_model_inline_creates(tmp_path):
    """staging with its model stack's model inline against staging + the model stack: the
    model's Kubernetes objects (Deployment, router, ScaledObject, node cache, import Job...) and
    AWS roles are the same."""
    model_doc = _doc("staging-llama-3-1-8b")
    inline = copy.deepcopy(_doc("staging"))
    inline["config"]["warmstart:models"] = [model_doc["config"]["warmstart:model"]]
    d = _write(tmp_path, {"staging": inline})
    together = render.run_program(d, "staging", program_dir=STACKS_DIR.parent)
    alone = render_stack("staging-llama-3-1-8b")
    name = model_doc["config"]["warmstart:model"]["name"]
    mine, theirs = _objects_of(alone, name), _objects_of(together, name)
    assert {k for k, _ in mine} >= {"Deployment", "DaemonSet", "Job", "ScaledObject", "NetworkPolicy"}
    assert mine == theirs
    roles = lambda r: {x.name: x.inputs for x in r.resources if x.typ.startswith("aws:iam/") and name in x.name}  # noqa: E731
    assert roles(alone) and roles(alone) == roles(together)
    # And the same decisions.
    (inline_plan,) = [m for m in together.stack_plan.models if m.name == name]
    assert alone.stack_plan.model == inline_plan


def test_the_platform_exports_a_versioned_contract():
    outputs = render.platform_outputs(STACKS_DIR, "staging", "test")
    doc = outputs[platform.OUTPUT]
    assert doc["contractVersion"] == platform.CONTRACT_VERSION and doc["stack"] == "staging"
    assert [(p["name"], p["maxGpus"], p["inlineGpus"]) for p in doc["pools"]] == [("l40s", 4, 0)]
    assert doc["oidcProviderArn"].startswith("arn:aws:iam::") and doc["oidcIssuer"]
    assert doc["monitoring"]["serverAddress"].startswith("https://aps-workspaces.") and doc["nodeCache"] is True
    assert platform.KUBECONFIG_OUTPUT in outputs and doc["models"] == []
    # prod's inline models (and its warm spare) take GPUs of its pool, which a model stack cannot use.
    prod = render.platform_outputs(STACKS_DIR, "prod", "test")[platform.OUTPUT]
    (h100,) = prod["pools"]
    assert prod["models"] == ["llama-4-scout", "qwen-67b"] and 0 < h100["inlineGpus"] <= h100["maxGpus"]


def _model_stack(platform_name: str = "prod", **model_overrides) -> dict:
    """A Llama-4-Scout-sized model stack on `platform_name`."""
    return {"config": {"warmstart:platform": platform_name, "warmstart:model": {
        "name": "extra", "source": "meta-llama/Llama-4-Scout-17B-16E-Instruct", "weightsGiB": 203, "pool": "h100",
        "maxModelLen": 65536} | model_overrides}}


def _plan_errors(tmp_path, docs, stack="prod-x") -> list[ConfigError]:
    d = _write(tmp_path, docs)
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        render.load_plan(d, stack, program_dir=STACKS_DIR.parent)
    e = err.value
    return e.errors if isinstance(e, ConfigErrors) else [e]


def _plan_error(tmp_path, docs, stack="prod-x") -> ConfigError:
    return _plan_errors(tmp_path, docs, stack)[0]


def test_a_pool_the_platform_lacks_names_both_stacks(tmp_path):
    e = _plan_error(tmp_path, {"prod": _doc("prod"), "prod-x": _model_stack(pool="a100")})
    assert e.key == "warmstart:model.pool" and "'prod-x'" in str(e) and "'prod'" in str(e) and "h100" in str(e)


def test_a_model_inline_in_its_platform_is_refused(tmp_path):
    e = _plan_error(tmp_path, {"prod": _doc("prod"), "prod-x": _model_stack(name="qwen-67b")})
    assert e.key == "warmstart:model.name" and "also inline" in str(e)


def test_a_second_model_stack_with_the_same_model_on_the_platform_is_refused(tmp_path):
    """Issue 24: only the platform's inline models were checked. The platform cannot know the
    stacks that read it, so the check is against the model stack files beside this one."""
    docs = {"prod": _doc("prod"), "prod-x": _model_stack(), "prod-y": _model_stack()}
    e = _plan_error(tmp_path, docs)
    assert e.key == "warmstart:model.name" and "'prod-y'" in str(e) and "two Deployments" in str(e), str(e)
    assert "fix:" in str(e)
    # Another name, or the same name on another platform, is fine.
    from warmstart import config
    from warmstart.plan import platform

    ok = {"prod": _doc("prod"), "prod-x": _model_stack(), "prod-y": _model_stack(name="other"),
          "dev-x": _model_stack(platform_name="dev")}
    d = _write(tmp_path / "ok", ok)
    siblings = render.sibling_model_stacks(d)
    assert siblings == {"prod-x": ("prod", "extra"), "prod-y": ("prod", "other"), "dev-x": ("dev", "extra")}
    cfg = config.model_stack_from_pulumi_config(config.read_stack_file(d / "Pulumi.prod-x.yaml"))
    platform.check_sibling_model_stacks(cfg, "prod-x", siblings)  # no error


def test_a_missing_platform_stack_is_named(tmp_path):
    e = _plan_error(tmp_path, {"prod-x": _model_stack()})
    assert e.key == "warmstart:platform" and "Pulumi.prod.yaml" in str(e)


def test_a_pool_the_platform_cannot_grow_is_a_config_error_with_the_numbers(tmp_path):
    e = _plan_error(tmp_path, {"prod": _doc("prod"), "prod-x": _model_stack()})
    # prod's derived limit holds its inline models and its warm spare, nothing more.
    assert e.key == "warmstart:model.replicas" and "leaving 0" in str(e) and "need 8 GPUs" in str(e)
    bigger = copy.deepcopy(_doc("prod"))
    bigger["config"]["warmstart:gpuPools"][0]["maxGpus"] = 1000
    d = _write(tmp_path / "ok", {"prod": bigger, "prod-x": _model_stack()})
    _, plan = render.load_plan(d, "prod-x", program_dir=STACKS_DIR.parent)
    assert plan.model.tensor_parallel_size == 4 and plan.contract.pools[0].max_gpus == 1000


def test_autoscaling_needs_keda_on_the_platform(tmp_path):
    dev = _doc("dev")
    ms = {"config": {"warmstart:platform": "dev", "warmstart:model": {
        "name": "second", "source": "org/second", "weightsGiB": 15, "pool": dev["config"]["warmstart:gpuPools"][0]["name"],
        "autoscaling": {"minReplicas": 1, "maxReplicas": 2}}}}
    errors = {e.key: str(e) for e in _plan_errors(tmp_path, {"dev": dev, "dev-second": ms}, stack="dev-second")}
    assert "KEDA" in errors["warmstart:model.autoscaling"] and "modelStacks: {autoscaling: true}" in errors[
        "warmstart:model.autoscaling"]
    # dev's pool has no room for a second model either, and says how much it needs.
    assert "maxGpus >= 5" in errors["warmstart:model.autoscaling.maxReplicas"]


_OURS = {"warmstartVersion": versions.WARMSTART_VERSION}
_OTHER_MAJOR = f"{versions.major(versions.WARMSTART_VERSION) + 1}.0.0"


@pytest.mark.parametrize("doc, rule", [
    ({}, "exports no warmstartPlatform"),
    (_OURS | {"contractVersion": platform.CONTRACT_VERSION + 1},
     f"reads platform contract version {platform.CONTRACT_VERSION}"),
    (_OURS | {"contractVersion": platform.CONTRACT_VERSION, "stack": "prod"},
     f"is not a version-{platform.CONTRACT_VERSION} contract"),
    # Another major version of warmstart, whatever its contract version says.
    ({"contractVersion": platform.CONTRACT_VERSION, "warmstartVersion": _OTHER_MAJOR},
     f"was exported by warmstart {_OTHER_MAJOR} (major version"),
    ({"contractVersion": platform.CONTRACT_VERSION}, "was exported by warmstart 0.x"),
    ({"contractVersion": platform.CONTRACT_VERSION, "warmstartVersion": "one"}, "not a semantic version"),
])
def test_a_contract_of_another_version_or_shape_is_refused(doc, rule):
    with pytest.raises(ConfigError) as err:
        platform.parse(doc, "prod", "prod-x")
    assert rule in str(err.value) and "'prod'" in str(err.value) and "'prod-x'" in str(err.value)


def test_the_contract_carries_the_package_version_and_another_minor_is_read():
    """The exported document names the warmstart that wrote it; the same major version, of any
    minor or patch, is read (semver: only a major version may break the contract)."""
    doc = render.platform_outputs(STACKS_DIR, "staging", "test")[platform.OUTPUT]
    assert doc["warmstartVersion"] == versions.WARMSTART_VERSION
    major = versions.major(versions.WARMSTART_VERSION)
    assert platform.parse(doc | {"warmstartVersion": f"{major}.99.7"}, "staging", "staging-x").stack == "staging"
    with pytest.raises(ConfigError) as err:
        platform.parse(doc | {"warmstartVersion": f"{major + 1}.0.0"}, "staging", "staging-x")
    assert f"up 'staging' with warmstart {major}.x first" in err.value.fix


def test_the_reference_names_the_platform_in_this_project():
    from components.model_stack import reference_name
    names = {}
    # A self-managed backend has no organization: Pulumi names it `organization`.
    mocks.run(lambda: names.update(bare=reference_name("prod"), qualified=reference_name("acme/other/prod")),
              region="us-east-1", stack="s", project="warmstart")
    assert names == {"bare": "organization/warmstart/prod", "qualified": "acme/other/prod"}
    refs = [x for x in render_stack("staging-llama-3-1-8b").resources if x.typ == mocks.STACK_REFERENCE_TYPE]
    assert [x.inputs["name"] for x in refs] == ["organization/warmstart/staging"]


def test_a_model_stack_config_is_strict():
    raw = {"warmstart:platform": "prod", "warmstart:model": json.dumps({"name": "m", "source": "a/b", "weightsGiB": 1,
                                                                        "pool": "h100", "bogus": 1})}
    with pytest.raises(ConfigErrors) as err:
        config.model_stack_from_pulumi_config(raw)
    assert any("bogus" in e.key for e in err.value.errors)


def test_a_model_stack_render_writes_its_own_plan(tmp_path):
    """`warmstart render` of a model stack writes its plan: the platform it runs on and its one model."""
    out = tmp_path / "out"
    render.write(render_stack("staging-llama-3-1-8b"), out)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["platform"] == "staging" and [m["name"] for m in plan["models"]] == ["llama-3-1-8b"]
    assert plan["models"][0]["nodeCache"]["staged"] is True and plan["models"][0]["routing"] == "prefix_hash"


def test_a_single_replica_model_stack_on_a_spot_pool_is_refused(tmp_path):
    spot = copy.deepcopy(_doc("prod"))
    pool = spot["config"]["warmstart:gpuPools"][0]
    pool.pop("capacityTypes", None)
    pool["capacity"] = {"types": ["spot", "onDemand"]}
    pool["maxGpus"] = 1000
    # prod's own models run 2+ replicas on spot; llama-4-scout runs one, so give it a second.
    for m in spot["config"]["warmstart:models"]:
        if "autoscaling" not in m:
            m["replicas"] = 2
    errors = {e.key: str(e) for e in _plan_errors(tmp_path, {"prod": spot, "prod-x": _model_stack()})}
    assert "may run on spot" in errors["warmstart:model.replicas"] and "'prod-x'" in errors["warmstart:model.replicas"]


def _staging_model_stack():
    return config.model_stack_from_pulumi_config(config.read_stack_file(STACKS_DIR / "Pulumi.staging-llama-3-1-8b.yaml"))


def test_the_platform_exports_where_its_non_gpu_pods_run():
    """Both modes' platforms export their elastic CPU pool as `nonGpuPlacement`, with the label
    key intact (label maps are never re-cased), and the model stack's routers and import use it."""
    for stack in ("staging", "prod"):
        doc = render_stack(stack).outputs[platform.OUTPUT]
        assert doc["nonGpuPlacement"] == {"nodeSelector": {"karpenter.sh/nodepool": "general-purpose"}, "tolerations": []}
    r = render_stack("staging-llama-3-1-8b")
    for o in r.kubernetes_objects:
        if o["kind"] in ("Deployment", "Job") and o["metadata"]["name"] != "llama-3-1-8b":
            assert o["spec"]["template"]["spec"]["nodeSelector"] == {"karpenter.sh/nodepool": "general-purpose"}


@pytest.mark.parametrize(("selector", "words"), [
    ({"karpenter.sh/nodepool": "l40s"}, "its GPU pool 'l40s'"),
    ({"warmstart.io/node-group": "system"}, "Karpenter system node group"),
])
def test_a_model_stack_whose_non_gpu_pods_have_nowhere_to_run_is_refused(selector, words):
    doc = copy.deepcopy(render_stack("staging").outputs[platform.OUTPUT])
    doc["nonGpuPlacement"] = {"nodeSelector": selector}
    contract = platform.parse(doc, "staging", "staging-llama-3-1-8b")
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        platform.plan_model_stack(_staging_model_stack(), contract, "staging-llama-3-1-8b")
    errors = err.value.errors if isinstance(err.value, ConfigErrors) else [err.value]
    (e,) = [e for e in errors if e.key == "warmstart:platform.nonGpuPlacement"]
    # Its numbers: 2 routers plus a surge pod and the import Job, 500m each, and the standby
    # actuator's 50m.
    assert words in str(e) and "2050m CPU" in str(e) and "'staging-llama-3-1-8b'" in str(e)


def test_a_model_stack_on_a_platform_without_placement_runs_anywhere_off_the_gpu_nodes():
    """A platform exported before `nonGpuPlacement` (or a cluster of your own without it): no
    label is selected, only an affinity off the GPU nodes."""
    doc = {k: v for k, v in render_stack("staging").outputs[platform.OUTPUT].items() if k != "nonGpuPlacement"}
    contract = platform.parse(doc, "staging", "staging-llama-3-1-8b")
    plan = platform.plan_model_stack(_staging_model_stack(), contract, "staging-llama-3-1-8b")
    assert not plan.model.weights_import.non_gpu.given


def test_the_first_model_stack_on_dev_is_told_the_gpu_limit_to_set_and_plans_with_it(tmp_path):
    """dev derives its pool's limit from its inline model; the first model stack on it is refused
    with the figure to set (docs/model-stacks.md says the same), and plans once it is set."""
    extra = {"config": {"warmstart:platform": "dev", "warmstart:model": {
        "name": "qwen-2-5-7b", "source": "Qwen/Qwen2.5-7B-Instruct", "weightsGiB": 15, "pool": "l40s"}}}
    e = _plan_error(tmp_path, {"dev": _doc("dev"), "dev-qwen": extra}, stack="dev-qwen")
    assert "leaving 0" in str(e) and "set gpuPools[l40s].maxGpus >= 4 in stacks/Pulumi.dev.yaml" in str(e)
    room = copy.deepcopy(_doc("dev"))
    room["config"]["warmstart:gpuPools"][0]["maxGpus"] = 4
    d = _write(tmp_path / "room", {"dev": room, "dev-qwen": extra})
    _, plan = render.load_plan(d, "dev-qwen", program_dir=STACKS_DIR.parent)
    assert plan.model.pool == "l40s"
