"""Weights import, as the program declares it (real program, Pulumi mocks): the Job, its own
identity, where it runs, what the Deployment waits for, and what the planner refuses offline."""

from __future__ import annotations

import copy
import json

import kubernetes_validate
import pytest
from hypothesis import given
from hypothesis import strategies as st

import components
from tests.support.policy_eval import allowed, statements
from tests.support.stacks import render_doc, render_stack
from tests.support.strategies import models, prefixes
from warmstart import config, mocks, policies, render
from warmstart.decisions import iam, naming, placement
from warmstart.decisions import weights_import as imports
from warmstart.decisions.instances import GIB
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.manifests import weights_import as import_job
from warmstart.plan.stack import plan_stack

ROLE, ROLE_POLICY = "aws:iam/role:Role", "aws:iam/rolePolicy:RolePolicy"
SA, JOB, DEPLOYMENT = ("kubernetes:core/v1:ServiceAccount", "kubernetes:batch/v1:Job",
                       "kubernetes:apps/v1:Deployment")
LLAMA_COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"
STAGING = "s3://warmstart-prod-staging/qwen/Qwen2.5-72B-Instruct-FP8"


def _prod_with_imports(stack_doc) -> dict:
    """prod (Karpenter mode) with an S3 import for one model and a small Hub model added."""
    doc = stack_doc("prod")
    ms = doc["config"]["warmstart:models"]
    ms[0]["import"] = {"s3": STAGING}
    ms.append({"name": "qwen-7b", "source": "qwen/Qwen2.5-7B-Instruct",
               "weightsGiB": 14.2, "pool": "h100",
               "import": {"huggingFace": {"repo": "Qwen/Qwen2.5-7B-Instruct", "revision": "a" * 40}}})
    doc["config"]["warmstart:huggingFaceToken"] = "hf_test_token_not_real"
    return doc


@pytest.fixture(scope="module")
def prod_imports(tmp_path_factory) -> render.Rendered:
    from tests.support.stacks import load_stack_doc
    return render_doc(_prod_with_imports(lambda s: copy.deepcopy(load_stack_doc(s))), tmp_path_factory.mktemp("p"),
                      "prodimports")


def _by(rendered: render.Rendered, typ: str, name: str | None = None) -> list[mocks.Registered]:
    return [r for r in rendered.resources if r.typ == typ
            and (name is None or (r.inputs.get("metadata") or {}).get("name") == name)]


def _jobs(rendered: render.Rendered) -> dict[str, dict]:
    return {j.inputs["metadata"]["labels"]["app.kubernetes.io/instance"]: j.inputs for j in _by(rendered, JOB)}


# --------------------------------------------------------------------------------------------
# What the Deployment waits for


def test_every_deployment_waits_for_its_service_account(rendered):
    """A pod admitted before the IRSA webhook can see its ServiceAccount never gets credentials."""
    for m in rendered.stack_plan.models:
        (dep,) = _by(rendered, DEPLOYMENT, m.name)
        (sa,) = _by(rendered, SA, m.name)
        assert sa.urn in dep.dependencies, m.name


def test_the_dev_deployment_waits_for_its_import_job_which_waits_for_its_identity():
    r = render_stack("dev")
    (m,) = r.stack_plan.models
    (dep,), (job,) = _by(r, DEPLOYMENT, m.name), _by(r, JOB)
    assert job.urn in dep.dependencies
    (import_sa,) = _by(r, SA, imports.service_account(m.name))
    assert import_sa.urn in job.dependencies
    # The ServiceAccount's role ARN is known only once the role's policy is attached.
    (policy,) = [p for p in r.of_type(ROLE_POLICY) if p.inputs["name"] == "weights-import"]
    assert policy.urn in import_sa.dependencies
    # pulumi-kubernetes waits for a Job to complete; it may wait as long as the Job may run.
    spec = job.inputs["spec"]
    assert int(job.inputs["metadata"]["annotations"]["pulumi.com/timeoutSeconds"]) > spec["activeDeadlineSeconds"]


def test_a_stack_without_imports_has_no_import_objects():
    r = render_stack("prod")
    assert not _by(r, JOB) and not [x for x in r.of_type(ROLE) if x.inputs["name"].endswith("-import")]
    assert "importRoles" not in r.stack_plan.summary()["aws"]


# --------------------------------------------------------------------------------------------
# The Job


def _check_job(job: dict, m, mode: str) -> None:
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    # A warmstart platform's own elastic CPU pool, in either mode (the platform's non_gpu_placement).
    assert pod["nodeSelector"] == placement.own_platform_placement().selector
    assert placement.GPU_RESOURCE not in json.dumps(c["resources"])
    assert not pod.get("tolerations"), "the import must not be able to land on a GPU node"
    assert pod["restartPolicy"] == "Never" and pod["serviceAccountName"] == f"{m.name}-import"
    assert "ttlSecondsAfterFinished" not in job["spec"], "Pulumi would recreate a deleted Job"
    assert 1 <= job["spec"]["backoffLimit"] <= 3
    assert job["spec"]["activeDeadlineSeconds"] == imports.deadline_seconds(m.weights_bytes)
    assert c["image"] == m.image and c["command"] == ["python3", "/opt/warmstart/weights_import.pyz"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert (env["WARMSTART_DEST_BUCKET"], env["WARMSTART_DEST_PREFIX"]) == (m.bucket, m.prefix)
    assert float(env["WARMSTART_WEIGHTS_GIB"]) * GIB == pytest.approx(m.weights_bytes, rel=1e-5)
    scratch = [v for v in pod["volumes"] if v["name"] == "scratch"]
    if m.weights_import.kind == "huggingFace":
        assert env["WARMSTART_HF_REVISION"] == m.weights_import.revision
        (vol,) = scratch
        # Streamed file by file: the whole model when it is small, else the files in flight; the
        # Job's budget for them stays inside the emptyDir, which fits the node it runs on.
        size_limit = int(vol["emptyDir"]["sizeLimit"].removesuffix("Gi")) * GIB
        assert size_limit >= min(m.weights_bytes * 1.05, imports.SCRATCH_CAP_BYTES)
        assert int(env["WARMSTART_SCRATCH_BYTES"]) + imports.SCRATCH_EXTRA_BYTES <= size_limit
        assert int(env["WARMSTART_SCRATCH_BYTES"]) >= imports.ASSUMED_LARGEST_FILE_BYTES or \
            size_limit >= m.weights_bytes * 1.05
        assert size_limit < imports.NODE_EPHEMERAL_BYTES[mode]
        assert env["HF_XET_CHUNK_CACHE_SIZE_BYTES"] == "0"
    else:
        assert env["WARMSTART_SOURCE_S3"] == m.weights_import.source and not scratch
    assert job["metadata"]["name"] == m.weights_import.job_name


def test_the_dev_import_job_runs_on_a_general_purpose_node():
    r = render_stack("dev")
    (m,) = r.stack_plan.models
    job = _jobs(r)[m.name]
    _check_job(job, m, "auto")
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"karpenter.sh/nodepool": "general-purpose"}
    assert m.weights_import.revision == LLAMA_COMMIT


def test_karpenter_mode_import_jobs_run_on_the_general_purpose_pool_not_the_system_group(prod_imports):
    jobs = _jobs(prod_imports)
    assert set(jobs) == {"qwen-67b", "qwen-7b"}
    for m in prod_imports.stack_plan.models:
        if m.weights_import:
            _check_job(jobs[m.name], m, "karpenter")
            assert jobs[m.name]["spec"]["template"]["spec"]["nodeSelector"] == {"karpenter.sh/nodepool": "general-purpose"}
    assert prod_imports.kind("NodePool") and "general-purpose" in {p["metadata"]["name"] for p in prod_imports.kind("NodePool")}


@pytest.mark.parametrize("stack", ["dev", "staging-llama-3-1-8b"])
def test_no_import_jobs_node_is_consolidated_under_it(stack):
    """The non-GPU pools consolidate underused nodes; an import evicted mid-copy starts over from
    what it had recorded, so its pod keeps its node (Karpenter's pod-level disruption control)."""
    jobs = _jobs(render_stack(stack))
    assert jobs
    for job in jobs.values():
        assert job["spec"]["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"


def test_the_token_reaches_only_the_hub_import_through_a_secret(prod_imports, tmp_path):
    (secret,) = [o for o in prod_imports.kind("Secret")]
    assert secret["metadata"]["name"] == "qwen-7b-hf-token"
    assert secret["stringData"] == {"token": "hf_test_token_not_real"}
    jobs = _jobs(prod_imports)
    token_env = [e for e in jobs["qwen-7b"]["spec"]["template"]["spec"]["containers"][0]["env"]
                 if e["name"] == "HF_TOKEN"]
    assert token_env == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "qwen-7b-hf-token",
                                                                             "key": "token"}}}]
    assert "HF_TOKEN" not in json.dumps(jobs["qwen-67b"])
    assert "hf_test_token" not in json.dumps(prod_imports.stack_plan.summary())
    # Nor does it reach the render's files.
    render.write(prod_imports, tmp_path / "out")
    assert not any("hf_test_token" in p.read_text() for p in (tmp_path / "out").rglob("*") if p.is_file())


def test_every_rendered_object_validates_and_the_policy_pack_passes(prod_imports):
    version = prod_imports.stack_plan.config.kubernetes_version
    for obj in prod_imports.kubernetes_objects:
        # Custom resources: against their CRDs in tests/cluster/test_cluster.py and tests/serving/test_serving.py.
        if not obj["apiVersion"].startswith(("karpenter.", "eks.amazonaws.com/", "keda.sh/")):
            kubernetes_validate.validate(obj, version, strict=True)
    records = mocks.policy_records(prod_imports.resources, prod_imports.stack_plan.config.region)
    assert [str(v) for v in policies.run_all(records)] == []


def test_the_job_name_changes_exactly_with_source_revision_and_destination(stack_doc):
    base = plan_stack(config.parse_config(_values(stack_doc("dev"))), "dev").models[0].weights_import
    def name_after(edit) -> str:
        doc = stack_doc("dev")
        edit(doc["config"]["warmstart:models"][0])
        return plan_stack(config.parse_config(_values(doc)), "dev").models[0].weights_import.job_name
    assert name_after(lambda m: None) == base.job_name
    assert name_after(lambda m: m.update(replicas=3, image="vllm/vllm-openai:v0.34.0")) == base.job_name
    assert name_after(lambda m: m["import"]["huggingFace"].update(revision="b" * 40)) != base.job_name
    assert name_after(lambda m: m["import"]["huggingFace"].update(repo="meta-llama/Other")) != base.job_name
    assert name_after(lambda m: m.update(source="other/llama")) != base.job_name


def _values(doc: dict) -> dict:
    return {k.removeprefix("warmstart:"): v for k, v in doc["config"].items()}


# --------------------------------------------------------------------------------------------
# Its identity: a role of its own, writing only its prefix


def _import_policy(rendered: render.Rendered, model: str) -> dict:
    name = naming.import_role_name(rendered.stack_plan.name_prefix, model)
    (pol,) = [p for p in rendered.of_type(ROLE_POLICY) if p.inputs["role"] == name]
    return json.loads(pol.inputs["policy"])


def _assert_writes_only_its_prefix(rendered: render.Rendered, model: str) -> None:
    p = rendered.stack_plan
    doc = _import_policy(rendered, model)
    m = next(x for x in p.models if x.name == model)
    own = f"arn:aws:s3:::{m.bucket}/{m.prefix}"
    for action in iam.IMPORT_WRITE_ACTIONS:
        assert allowed(doc, action, f"{own}/model-00001-of-00004.safetensors"), action
    assert allowed(doc, "s3:GetObject", f"{own}/warmstart-manifest.json")
    assert allowed(doc, "s3:ListBucket", f"arn:aws:s3:::{m.bucket}", {"s3:prefix": f"{m.prefix}/"})
    elsewhere = [f"arn:aws:s3:::{m.bucket}/{m.prefix}-v2/x.safetensors", f"arn:aws:s3:::{m.bucket}/x.safetensors",
                 f"arn:aws:s3:::{m.bucket}/{m.prefix.rsplit('/', 1)[0]}/config.json"]
    elsewhere += [f"arn:aws:s3:::{o.bucket}/{o.prefix}/config.json" for o in p.models if o.name != model]
    if p.aws.compile_cache_bucket:
        elsewhere.append(f"arn:aws:s3:::{p.aws.compile_cache_bucket}/{model}/x.tar.gz")
    for key in elsewhere:
        for action in ("s3:PutObject", "s3:GetObject", "s3:AbortMultipartUpload"):
            assert not allowed(doc, action, key), (action, key)
    assert not allowed(doc, "s3:ListBucket", f"arn:aws:s3:::{m.bucket}", {"s3:prefix": ""})
    for action in sorted(iam.WRITE_ACTIONS - set(iam.IMPORT_WRITE_ACTIONS)):
        assert not allowed(doc, action, f"{own}/config.json"), action
    if m.weights_import.kind == "s3":
        src = f"arn:aws:s3:::{m.weights_import.source_bucket}/{m.weights_import.source_prefix}"
        assert allowed(doc, "s3:GetObject", f"{src}/config.json")
        assert not allowed(doc, "s3:PutObject", f"{src}/config.json")
    # Trusted by the import's own ServiceAccount only, never the serving one.
    (role,) = [r for r in rendered.of_type(ROLE) if r.inputs["name"] == naming.import_role_name(p.name_prefix, model)]
    (stmt,) = statements(json.loads(role.inputs["assumeRolePolicy"]))
    subs = [v for k, v in stmt["Condition"]["StringEquals"].items() if k.endswith(":sub")]
    assert subs == [f"system:serviceaccount:{p.config.namespace}:{model}-import"]


def test_the_dev_import_role_writes_only_its_models_prefix():
    _assert_writes_only_its_prefix(render_stack("dev"), "llama-3-1-8b")


def test_import_roles_of_s3_and_hub_imports_write_only_their_prefixes(prod_imports):
    _assert_writes_only_its_prefix(prod_imports, "qwen-67b")
    _assert_writes_only_its_prefix(prod_imports, "qwen-7b")


def test_the_serving_role_stays_read_only(prod_imports):
    p = prod_imports.stack_plan
    for a in p.aws.access:
        (pol,) = [x for x in prod_imports.of_type(ROLE_POLICY) if x.inputs["role"] == a.role_name]
        doc = json.loads(pol.inputs["policy"])
        for action in sorted(iam.WRITE_ACTIONS):
            assert not allowed(doc, action, f"arn:aws:s3:::{p.aws.model_bucket}/{a.model_prefix}/config.json")


@given(prefixes, models)
def test_import_role_names_fit_iam_and_never_collide_with_the_serving_role(prefix, model):
    name = naming.import_role_name(prefix, model)
    assert naming.role_name_valid(name) and len(name) <= naming.ROLE_NAME_MAX
    assert name != naming.role_name(prefix, model)


# --------------------------------------------------------------------------------------------
# The planner, offline


def _plan_errors(doc: dict) -> str:
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        plan_stack(config.parse_config(_values(doc)), "t")
    return str(err.value)


def test_an_s3_import_from_the_models_own_source_is_refused(stack_doc):
    doc = stack_doc("dev")
    m = doc["config"]["warmstart:models"][0]
    m["import"] = {"s3": plan_stack(config.parse_config(_values(doc)), "t").models[0].source}
    assert "warmstart:models[0].import.s3" in _plan_errors(doc) and "overlaps the model's own source" in _plan_errors(doc)


def test_a_hub_import_larger_than_a_general_purpose_nodes_disk_is_planned_streamed(stack_doc):
    """Llama-4-Scout's 203 GiB from the Hub: no longer refused (it once needed a scratch copy of
    the whole model); its scratch holds the files in flight and fits the node, it asks for a
    larger node, and its predicted time and deadline grow with the weights."""
    doc = stack_doc("prod")
    doc["config"]["warmstart:models"][1]["import"] = {"huggingFace": {"repo": "meta-llama/Scout", "revision": "c" * 40}}
    plan = plan_stack(config.parse_config(_values(doc)), "t")
    small, large = (m.weights_import for m in plan.models)
    assert large is not None and large.kind == "huggingFace"
    assert large.weights_bytes > imports.NODE_EPHEMERAL_BYTES["karpenter"]
    assert large.scratch_bytes == imports.SCRATCH_CAP_BYTES + imports.SCRATCH_EXTRA_BYTES
    assert large.cpu == imports.LARGE_IMPORT_CPU
    assert imports.predicted_seconds(large.weights_bytes) < large.deadline_seconds
    assert imports.predicted_seconds(2 * large.weights_bytes) > imports.predicted_seconds(large.weights_bytes)


@given(st.integers(min_value=1, max_value=4096))
def test_scratch_never_exceeds_the_cap_and_holds_a_small_model_whole(gib):
    scratch = imports.scratch_bytes(gib * GIB)
    assert scratch <= imports.SCRATCH_CAP_BYTES + imports.SCRATCH_EXTRA_BYTES + GIB
    assert scratch < imports.NODE_EPHEMERAL_BYTES["auto"] - 20 * GIB  # room for the vLLM image
    if gib * GIB * (1 + imports.WEIGHTS_TOLERANCE) <= imports.SCRATCH_CAP_BYTES:
        assert imports.scratch_budget_bytes(scratch) >= gib * GIB * (1 + imports.WEIGHTS_TOLERANCE)
    else:
        assert imports.scratch_budget_bytes(scratch) >= imports.FILE_PARALLELISM * imports.ASSUMED_LARGEST_FILE_BYTES


def test_the_script_and_the_job_agree_on_what_cannot_be_retried():
    from warmstart.podside.weights_import import settings as weights_import_settings
    from warmstart.podside.weights_import import main as script
    assert set(import_job.PERMANENT_EXIT_CODES) == {weights_import_settings.EXIT_CONFIG, weights_import_settings.EXIT_ACCESS, weights_import_settings.EXIT_VERIFY}


# --------------------------------------------------------------------------------------------
# The component alone


KUBECONFIG = json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []})


def _alone(**overrides):
    args = components.VllmModelArgs(
        model_name="llama", source="s3://team-models/meta-llama/Llama-3.1-8B-Instruct", weights_gib=15,
        instance_type="g6e.2xlarge", region="us-east-1", namespace="ml", kubeconfig=KUBECONFIG,
        weights_import={"s3": "s3://team-staging/llama-8b"},
        import_role_arn="arn:aws:iam::123456789012:role/llama-import") | overrides
    return mocks.run(lambda: components.VllmModel("llama", args), region="us-east-1", stack="alone")


def test_a_model_alone_ships_its_import_script_and_validates():
    resources = _alone()
    objects = [r.inputs for r in resources if render.is_kubernetes_object(r)]
    (job,) = [o for o in objects if o["kind"] == "Job"]
    maps = {v["configMap"]["name"] for v in job["spec"]["template"]["spec"]["volumes"] if "configMap" in v}
    assert maps == {"llama-weights-import"} and "llama-weights-import" in {
        o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    for obj in objects:
        kubernetes_validate.validate(obj, "1.33", strict=True)


def test_a_model_alone_with_an_import_but_no_import_role_names_the_arg():
    with pytest.raises(Exception) as err:
        _alone(import_role_arn=None)
    assert "VllmModelArgs.importRoleArn" in str(err.value)


def test_the_render_table_warns_of_a_hub_import_without_a_token(prod_imports):
    assert "no warmstart:huggingFaceToken is set" in render.table(render_stack("dev").stack_plan)
    assert "huggingFaceToken" not in render.table(prod_imports.stack_plan)


def test_the_job_carries_max_model_len_and_hf_overrides_for_the_config_json_check(stack_doc):
    """The import checks maxModelLen against the model's config.json as vLLM does at start-up,
    with the --hf-overrides the engine gets (podside/weights_import/context_length.py)."""
    def env_after(edit) -> dict:
        doc = stack_doc("dev")
        edit(doc["config"]["warmstart:models"][0])
        m = plan_stack(config.parse_config(_values(doc)), "dev").models[0]
        (c,) = import_job.job_spec(m, "warmstart", "us-east-1")["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in c["env"]}

    unset = env_after(lambda m: m.pop("maxModelLen", None))
    assert "WARMSTART_MAX_MODEL_LEN" not in unset and "WARMSTART_HF_OVERRIDES" not in unset
    yarn = '{"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}'
    env = env_after(lambda m: m.update(maxModelLen=131072, extraArgs=["--enable-prefix-caching",
                                                                       "--hf-overrides", yarn]))
    assert (env["WARMSTART_MAX_MODEL_LEN"], env["WARMSTART_HF_OVERRIDES"]) == ("131072", yarn)
    assert env_after(lambda m: m.update(maxModelLen=8192, extraArgs=[f"--hf-overrides={yarn}"]))[
        "WARMSTART_HF_OVERRIDES"] == yarn
