"""The cluster layer, as rendered: schemas, GPU placement invariants, Karpenter and Auto Mode wiring.

Every stack in stacks/ is rendered in BOTH cluster modes (its own, and with clusterMode
flipped), and every invariant is checked on each rendering.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.node_classes import crd_schema, validator
from tests.support.stacks import (
    STACK_NAMES,
    STACKS_DIR,
    load_stack_doc,
    policy_json,
    render_doc,
    render_stack,
)
from warmstart import mocks, render, versions
from warmstart.decisions import (
    cluster_access,
    gpu_pools,
    instances,
    karpenter,
    naming,
    placement,
)
from warmstart.decisions.instances import GB, GIB
from warmstart.decisions.network import KARPENTER_DISCOVERY_TAG
from warmstart.manifests.nvme_check import nvme_check_min_bytes

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
MODES = ("auto", "karpenter")
NODEPOOL = "kubernetes:karpenter.sh/v1:NodePool"
EC2NODECLASS = "kubernetes:karpenter.k8s.aws/v1:EC2NodeClass"
AUTO_NODECLASS = "kubernetes:eks.amazonaws.com/v1:NodeClass"
RELEASE = "kubernetes:helm.sh/v3:Release"
ROLE = "aws:iam/role:Role"
ACCESS_ENTRY = "aws:eks/accessEntry:AccessEntry"
ACCESS_POLICY = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
EKS = "eks:index:Cluster"
K8S_PROVIDER_NAME = "warmstart-cluster-k8s"


# --------------------------------------------------------------------------------------
# Rendering every stack in both modes, once per session


@cache
def _render_in_mode(stack: str, mode: str, tmp: str) -> render.Rendered:
    doc = load_stack_doc(stack)
    if doc["config"]["warmstart:clusterMode"] == mode:
        return render_stack(stack)
    doc["config"]["warmstart:clusterMode"] = mode
    Path(tmp).mkdir(parents=True, exist_ok=True)
    return render_doc(doc, Path(tmp), stack=stack)


@pytest.fixture(scope="session")
def flip_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("flipped"))


@pytest.fixture(params=[(s, m) for s in STACK_NAMES for m in MODES], ids=lambda p: f"{p[0]}-{p[1]}")
def any_mode(request, flip_dir) -> render.Rendered:
    stack, mode = request.param
    r = _render_in_mode(stack, mode, f"{flip_dir}/{stack}-{mode}")
    assert r.stack_plan.cluster_mode == mode
    return r


def _one(r: render.Rendered, typ: str) -> render.Registered:
    (x,) = r.of_type(typ)
    return x


def _by_name(r: render.Rendered, kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in r.kind(kind)}


def _requirement(pool: dict, key: str) -> dict:
    (req,) = [q for q in pool["spec"]["template"]["spec"]["requirements"] if q["key"] == key]
    return req


def _gpu_deployments(r: render.Rendered) -> list[dict]:
    """The vLLM Deployments (the warm-spare placeholders hold GPUs too, but serve nothing)."""
    return [d for d in r.kind("Deployment")
            if placement.GPU_RESOURCE in d["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
            and d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == "vllm"]


def _quantity_bytes(q: str) -> int:
    m = re.fullmatch(r"(\d+)(Gi|G|Ti|T)", q)
    assert m, q
    return int(m[1]) * {"Gi": GIB, "G": GB, "Ti": 1024 * GIB, "T": 1000 * GB}[m[2]]


# --------------------------------------------------------------------------------------
# Schemas


def test_every_karpenter_object_validates_against_the_upstream_crds(any_mode):
    kinds = ("NodePool", "EC2NodeClass", "NodeClass")
    objects = [o for o in any_mode.kubernetes_objects if o["kind"] in kinds]
    assert objects
    for obj in objects:
        errors = sorted(validator(obj["kind"]).iter_errors(obj), key=str)
        assert not errors, f"{obj['kind']}/{obj['metadata']['name']}: {[e.message for e in errors]}"


def test_each_mode_renders_its_own_node_class_kind(any_mode):
    # Karpenter mode adds the elastic CPU pool of the non-GPU pods (Auto Mode has its built-in one).
    cpu = any_mode.stack_plan.cluster.cpu_pool
    pools = {p.name for p in any_mode.stack_plan.cluster.pools} | ({cpu.name} if cpu else set())
    assert set(_by_name(any_mode, "NodePool")) == pools
    own, other = ("NodeClass", "EC2NodeClass") if any_mode.stack_plan.cluster_mode == "auto" else ("EC2NodeClass", "NodeClass")
    assert set(_by_name(any_mode, own)) == pools and not any_mode.kind(other)
    for pool in any_mode.kind("NodePool"):
        ref = pool["spec"]["template"]["spec"]["nodeClassRef"]
        assert ref["kind"] == own and ref["name"] in _by_name(any_mode, own)
        assert ref["group"] == _by_name(any_mode, own)[ref["name"]]["apiVersion"].split("/")[0]


def test_the_schemas_catch_a_broken_object(any_mode):
    pool = json.loads(json.dumps(any_mode.kind("NodePool")[0]))
    pool["spec"]["disruption"]["consolidationPolicy"] = "Sometimes"
    assert list(validator("NodePool").iter_errors(pool))
    if any_mode.stack_plan.cluster_mode == "karpenter":
        nc = json.loads(json.dumps(any_mode.kind("EC2NodeClass")[0]))
        nc["spec"]["instanceStorePolicy"] = "RAID1"
        assert "'RAID1' is not one of ['RAID0']" in [e.message for e in validator("EC2NodeClass").iter_errors(nc)]
    else:
        nc = json.loads(json.dumps(any_mode.kind("NodeClass")[0]))
        nc["spec"]["ephemeralStorage"]["size"] = "80GB"
        assert list(validator("NodeClass").iter_errors(nc))


@cache
def _karpenter_allowed_aws_labels() -> frozenset[str]:
    """The `karpenter.k8s.aws/*` requirement keys the NodePool CRD's CEL rule allows (CEL is not
    evaluated by jsonschema, so the rule's list is read from the CRD itself)."""
    key = (crd_schema("karpenter.sh_nodepools.yaml")["properties"]["spec"]["properties"]["template"]
           ["properties"]["spec"]["properties"]["requirements"]["items"]["properties"]["key"])
    (rule,) = [v["rule"] for v in key["x-kubernetes-validations"] if "karpenter.k8s.aws/instance-local-nvme" in v["rule"]]
    return frozenset(re.findall(r'"(karpenter\.k8s\.aws/[^"]+)"', rule))


def test_requirement_keys_use_the_modes_label_domain(any_mode):
    mode = any_mode.stack_plan.cluster_mode
    foreign = placement.LABEL_DOMAIN["karpenter" if mode == "auto" else "auto"]
    for pool in _gpu_nodepools(any_mode):
        keys = [q["key"] for q in pool["spec"]["template"]["spec"]["requirements"]]
        assert not any(k.startswith(foreign + "/") for k in keys), keys
        assert placement.local_nvme_label(mode) in keys and placement.gpu_count_label(mode) in keys
        # The CRD's CEL label restrictions (not checked by the schema validation above).
        assert not any(k.endswith("karpenter.sh/nodepool") or k == "kubernetes.io/hostname" for k in keys)
        if mode == "karpenter":
            assert {k for k in keys if k.startswith("karpenter.k8s.aws/")} <= _karpenter_allowed_aws_labels()
        labels = pool["spec"]["template"].get("metadata", {}).get("labels", {})
        assert not any(k.split("/")[0].endswith(("karpenter.sh", "karpenter.k8s.aws")) for k in labels)


# --------------------------------------------------------------------------------------
# GPU placement invariants


def _gpu_nodepools(r: render.Rendered) -> list[dict[str, Any]]:
    """The GPU pools' NodePools (not the Karpenter-mode CPU pool of the non-GPU pods)."""
    names = {p.name for p in r.stack_plan.cluster.pools}
    return [o for o in r.kind("NodePool") if o["metadata"]["name"] in names]


def test_every_gpu_nodepool_is_tainted(any_mode):
    for pool in _gpu_nodepools(any_mode):
        taints = pool["spec"]["template"]["spec"]["taints"]
        assert {"key": placement.GPU_TAINT_KEY, "effect": placement.GPU_TAINT_EFFECT} in taints


def test_every_gpu_deployment_lands_only_on_a_pool_that_fits_it(any_mode):
    mode = any_mode.stack_plan.cluster_mode
    pools = _by_name(any_mode, "NodePool")
    deployments = _gpu_deployments(any_mode)
    assert len(deployments) == len(any_mode.stack_plan.models)
    for dep in deployments:
        spec = dep["spec"]["template"]["spec"]
        assert {"key": placement.GPU_TAINT_KEY, "operator": "Exists", "effect": placement.GPU_TAINT_EFFECT} in spec["tolerations"]
        tp = int(spec["containers"][0]["resources"]["requests"][placement.GPU_RESOURCE])
        pool = pools[spec["nodeSelector"][placement.NODEPOOL_LABEL]]
        itype = spec["nodeSelector"][placement.INSTANCE_TYPE_LABEL]
        assert itype in _requirement(pool, placement.INSTANCE_TYPE_LABEL)["values"]
        # Every node the pool can launch has at least TP GPUs and NVMe that passes the floor.
        for t in _requirement(pool, placement.INSTANCE_TYPE_LABEL)["values"]:
            inst = instances.lookup(t)
            assert inst.nvme_total_gb > 0
            assert gpu_pools.nvme_label_admits(inst, int(_requirement(pool, placement.local_nvme_label(mode))["values"][0]))
            assert inst.gpu_count > int(_requirement(pool, placement.gpu_count_label(mode))["values"][0])
        inst = instances.lookup(itype)
        assert inst.gpu_count >= tp
        assert int(_requirement(pool, placement.gpu_count_label(mode))["values"][0]) < tp
        assert f"--tensor-parallel-size={tp}" in spec["containers"][0]["args"]


def test_nodepool_limits_cover_every_replica_and_a_surge(any_mode):
    plan = any_mode.stack_plan
    pools = _by_name(any_mode, "NodePool")
    for p in plan.cluster.pools:
        limit = int(pools[p.name]["spec"]["limits"][placement.GPU_RESOURCE])
        on_pool = [gpu_pools.PoolModel(m.instance, m.tensor_parallel_size, m.replicas)
                   for m in plan.models if m.pool == p.name]
        assert limit >= gpu_pools.gpus_needed(on_pool, surge=1)


def test_disruption_never_repacks_serving_pods(any_mode):
    for pool in _gpu_nodepools(any_mode):
        d = pool["spec"]["disruption"]
        assert d["consolidationPolicy"] == "WhenEmpty"
        assert all(b["nodes"] in ("0", "1") for b in d["budgets"])


def test_every_node_class_of_a_cache_pool_uses_the_nvme(any_mode):
    plan = any_mode.stack_plan
    mode = plan.cluster_mode
    cached_pools = {m.pool for m in plan.models if m.compile_cache}
    assert cached_pools, "every stack caches something"
    classes = _by_name(any_mode, "NodeClass" if mode == "auto" else "EC2NodeClass")
    for name in cached_pools:
        (p,) = [p for p in plan.cluster.pools if p.name == name]
        spec = classes[name]["spec"]
        if mode == "karpenter":
            assert spec["instanceStorePolicy"] == "RAID0"
            (root,) = [b for b in spec["blockDeviceMappings"] if b.get("rootVolume")]
            # The root volume must be distinguishable from the NVMe RAID by size (nvme_check).
            assert _quantity_bytes(root["ebs"]["volumeSize"]) < nvme_check_min_bytes(p.min_nvme_bytes)
            assert not spec["amiSelectorTerms"][0]["alias"].endswith("@latest")
        else:
            size = _quantity_bytes(spec["ephemeralStorage"]["size"])
            assert size < min(instances.lookup(t).nvme_total_bytes for t in p.instance_types)
            assert size < nvme_check_min_bytes(p.min_nvme_bytes)
    for m in plan.models:
        if m.compile_cache:
            assert m.compile_cache_host_path.startswith(placement.NVME_MOUNT[mode] + "/")


# --------------------------------------------------------------------------------------
# Cluster, providers, access


def test_the_cluster_is_pulumi_eks_with_access_entries_oidc_and_logs(any_mode):
    c = any_mode.stack_plan.cluster
    eks = _one(any_mode, EKS).inputs
    assert eks["name"] == c.name == naming.cluster_name(any_mode.stack_plan.name_prefix)
    assert eks["authenticationMode"] == "API" and eks["createOidcProvider"] is True
    assert eks["enabledClusterLogTypes"] == sorted(any_mode.stack_plan.config.cluster.log_types)
    assert eks["version"] == any_mode.stack_plan.config.kubernetes_version
    (logs,) = any_mode.of_type("aws:cloudwatch/logGroup:LogGroup")
    assert logs.inputs["name"] == f"/aws/eks/{c.name}/cluster" and logs.inputs["retentionInDays"] > 0
    if c.mode == "auto":
        assert eks["autoMode"]["enabled"] is True and eks["bootstrapSelfManagedAddons"] is False
        # EKS runs Auto Mode's add-ons; the only charts a stack may install there are KEDA's
        # (autoscaling) and node-feature-discovery's (the node cache's labels).
        assert not any_mode.of_type("aws:eks/nodeGroup:NodeGroup")
        assert {r.inputs["chart"] for r in any_mode.of_type(RELEASE)} <= {versions.KEDA_CHART, versions.NFD_CHART}
    else:
        assert "autoMode" not in eks


def test_the_api_endpoint_is_public_as_eks_defaults_or_limited_or_private_only(any_mode, stack_doc, tmp_path):
    """EKS's defaults unless the stack says otherwise: the public endpoint for 0.0.0.0/0, and
    always the private one (nodes and pods reach the API inside the VPC)."""
    eks = _one(any_mode, EKS).inputs
    assert (eks["endpointPublicAccess"], eks["endpointPrivateAccess"], eks["publicAccessCidrs"]) == (
        True, True, ["0.0.0.0/0"])
    doc = stack_doc("dev")
    doc["config"]["warmstart:cluster"] = {"publicAccessCidrs": ["203.0.113.0/24", "198.51.100.7/32"]}
    eks = _one(render_doc(doc, tmp_path, stack="limited"), EKS).inputs
    assert eks["endpointPublicAccess"] is True and eks["publicAccessCidrs"] == ["203.0.113.0/24", "198.51.100.7/32"]
    doc["config"]["warmstart:cluster"] = {"endpointPublicAccess": False}
    private = render_doc(doc, tmp_path, stack="private")
    eks = _one(private, EKS).inputs
    assert eks["endpointPublicAccess"] is False and eks["endpointPrivateAccess"] is True
    assert "publicAccessCidrs" not in eks
    assert private.stack_plan.cluster.summary()["endpointPublicAccess"] is False


def test_every_kubernetes_object_goes_through_the_clusters_provider(any_mode):
    k8s_resources = [r for r in any_mode.resources
                     if r.typ.startswith("kubernetes:") and not r.typ.startswith("pulumi:providers:")]
    assert any(r.inputs.get("kind") == "Deployment" for r in k8s_resources)
    for r in k8s_resources:
        assert r.provider and f"pulumi:providers:kubernetes::{K8S_PROVIDER_NAME}::" in r.provider, (r.typ, r.name)
    (provider,) = any_mode.of_type("pulumi:providers:kubernetes")
    kubeconfig = json.loads(provider.inputs["kubeconfig"])
    assert any_mode.stack_plan.cluster.name in kubeconfig["users"][0]["user"]["exec"]["args"]


def _node_role_entry(r: render.Rendered, role_name: str) -> tuple[render.Registered, list[render.Registered]]:
    roles = {x.inputs["name"]: x for x in r.of_type(ROLE)}
    arn = mocks.SYNTHESIZERS[ROLE](roles[role_name].name, roles[role_name].inputs, r.stack_plan.config.region)["arn"]
    (entry,) = [e for e in r.of_type(ACCESS_ENTRY) if e.inputs["principalArn"] == arn]
    return entry, [a for a in r.of_type(ACCESS_POLICY) if a.inputs["principalArn"] == arn]


def test_the_gpu_node_role_can_join_the_cluster(any_mode):
    """A node class whose role has no access entry launches nodes that never join (silently)."""
    c = any_mode.stack_plan.cluster
    kind = "NodeClass" if c.mode == "auto" else "EC2NodeClass"
    roles = {nc["spec"]["role"] for nc in any_mode.kind(kind)}
    assert len(roles) == 1
    entry, policies = _node_role_entry(any_mode, roles.pop())
    assert entry.inputs["clusterName"] == c.name
    if c.mode == "auto":
        assert entry.inputs["type"] == "EC2"
        (assoc,) = policies
        assert assoc.inputs["policyArn"].endswith(":cluster-access-policy/AmazonEKSAutoNodePolicy")
        assert assoc.inputs["accessScope"] == {"type": "cluster"}
    else:
        assert entry.inputs["type"] == "EC2_LINUX" and not policies  # EC2_LINUX takes no policies


def test_admins_get_cluster_admin_access_entries(stack_doc, tmp_path):
    doc = stack_doc("dev")
    admins = ["arn:aws:iam::123456789012:role/platform-admin", "arn:aws:iam::123456789012:user/alice"]
    doc["config"]["warmstart:cluster"] = {"admins": admins}
    r = render_doc(doc, tmp_path, stack="admins")
    entries = {e.inputs["principalArn"]: e.inputs for e in r.of_type(ACCESS_ENTRY)}
    assocs = {a.inputs["principalArn"]: a.inputs for a in r.of_type(ACCESS_POLICY)}
    for arn in admins:
        assert entries[arn]["type"] == "STANDARD"
        assert assocs[arn]["policyArn"] == "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"
        assert assocs[arn]["accessScope"] == {"type": "cluster"}


CREATOR = f"arn:aws:iam::{mocks.FAKE_ACCOUNT}:user/render"  # who the mocks say runs the program
ADMIN_VIEW = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSAdminViewPolicy"


def _access(r: render.Rendered) -> dict[str, tuple[str, str, dict]]:
    """principalArn -> (entry type, policy ARN, scope) of every STANDARD access entry."""
    entries = {e.inputs["principalArn"]: e.inputs for e in r.of_type(ACCESS_ENTRY) if e.inputs["type"] == "STANDARD"}
    assocs = {a.inputs["principalArn"]: a.inputs for a in r.of_type(ACCESS_POLICY)}
    return {arn: (e["type"], assocs[arn]["policyArn"], assocs[arn]["accessScope"]) for arn, e in entries.items()}


def test_viewers_get_read_only_access_entries_that_read_secrets(stack_doc, tmp_path):
    """AmazonEKSAdminViewPolicy: get/list/watch on everything, Secrets (Helm's release state)
    and custom resources included; AmazonEKSViewPolicy has neither."""
    doc = stack_doc("prod")
    viewers = ["arn:aws:iam::123456789012:role/ci-readonly", "arn:aws:iam::123456789012:role/path/auditor"]
    doc["config"]["warmstart:cluster"] = {"admins": ["arn:aws:iam::123456789012:role/platform-admin"],
                                          "viewers": viewers}
    r = render_doc(doc, tmp_path, stack="viewers")
    access = _access(r)
    for arn in viewers:
        assert access[arn] == ("STANDARD", ADMIN_VIEW, {"type": "cluster"})
    assert access["arn:aws:iam::123456789012:role/platform-admin"][1].endswith("/AmazonEKSClusterAdminPolicy")
    assert cluster_access.VIEWER_ACCESS_POLICY == "AmazonEKSAdminViewPolicy"
    assert r.stack_plan.cluster.viewers == tuple(sorted(viewers))


@pytest.mark.parametrize("cluster, key, rule", [
    ({"admins": ["arn:aws:iam::123456789012:role/ops"], "viewers": ["arn:aws:iam::123456789012:role/ops"]},
     "warmstart:cluster.viewers", "also in admins"),
    ({"admins": ["arn:aws:iam::123456789012:role/ops", "arn:aws:iam::123456789012:user/bo",
                 "arn:aws:iam::123456789012:role/ops"]}, "warmstart:cluster.admins", "more than once"),
    ({"viewers": ["arn:aws:iam::123456789012:role/ci", "arn:aws:iam::123456789012:role/ci"]},
     "warmstart:cluster.viewers", "more than once"),
])
def test_a_principal_gets_one_access_entry_or_the_config_is_refused(stack_doc, tmp_path, cluster, key, rule):
    from warmstart.errors import ConfigErrors

    doc = stack_doc("dev")
    doc["config"]["warmstart:cluster"] = cluster
    with pytest.raises(ConfigErrors) as err:
        render_doc(doc, tmp_path, stack="dup")
    (found,) = [e for e in err.value.errors if e.key == key]
    assert rule in found.rule and found.fix


def _write_stack(doc: dict, tmp_path: Path, stack: str) -> Path:
    folder = tmp_path / f"stacks-{stack}"
    folder.mkdir(exist_ok=True)
    (folder / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(doc))
    return folder


def _as_caller(monkeypatch, arn: str, clusters: tuple[str, ...] = ()) -> None:
    """The mocks as if `arn` ran the program in an account that has `clusters`."""
    call = mocks.FakeCloud.call

    def answer(self, args):
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": mocks.FAKE_ACCOUNT, "arn": arn, "userId": "AIDA" + arn[-6:]}
        if args.token == "aws:eks/getClusters:getClusters":
            return {"id": self.region, "names": list(clusters)}
        return call(self, args)
    monkeypatch.setattr(mocks.FakeCloud, "call", answer)


@pytest.mark.parametrize("field", ["admins", "viewers"])
def test_the_identity_creating_the_cluster_is_never_given_a_second_entry(stack_doc, tmp_path, monkeypatch, field):
    """EKS already gave the creator a cluster-admin entry (pulumi-eks sets
    bootstrapClusterCreatorAdminPermissions): an `up` that would add another is refused before
    anything is registered, for an IAM user and for an assumed role (its session resolved to
    the role ARN, as EKS names it)."""
    from warmstart.errors import ConfigError

    doc = stack_doc("dev")
    doc["config"]["warmstart:cluster"] = {field: [CREATOR]}
    with pytest.raises(ConfigError) as err:
        render_doc(doc, tmp_path, stack="creator-user")
    assert err.value.key == f"ClusterArgs.cluster.{field}" and err.value.value == CREATOR and "409" in err.value.rule

    role = "arn:aws:iam::123456789012:role/deployer"
    _as_caller(monkeypatch, "arn:aws:sts::123456789012:assumed-role/deployer/gha-42")
    doc["config"]["warmstart:cluster"] = {field: [role]}
    with pytest.raises(ConfigError) as err:
        render_doc(doc, tmp_path, stack="creator-role")
    assert err.value.value == role


def test_access_entries_do_not_depend_on_who_runs_the_program(stack_doc, tmp_path, monkeypatch):
    """The nightly drift preview runs as the read-only role and `up` as the deployer: both must
    see the same entries, or every drift check reports one. Once the cluster exists (its
    creator no longer comparable with the caller), a listed caller is not refused either."""
    doc = stack_doc("dev")
    admins = ["arn:aws:iam::123456789012:role/deployer", "arn:aws:iam::123456789012:user/alice"]
    viewers = ["arn:aws:iam::123456789012:role/ci-readonly"]
    doc["config"]["warmstart:cluster"] = {"admins": admins, "viewers": viewers}
    name = render.load_plan(_write_stack(doc, tmp_path, "caller"), "caller")[1].cluster.name
    seen = []
    for caller in ("arn:aws:sts::123456789012:assumed-role/deployer/up",
                   "arn:aws:sts::123456789012:assumed-role/ci-readonly/drift", CREATOR):
        _as_caller(monkeypatch, caller, clusters=(name,))
        seen.append(_access(render_doc(doc, tmp_path, stack="caller")))
    assert seen[0] == seen[1] == seen[2] and sorted(seen[0]) == sorted(admins + viewers)


def test_a_preview_as_the_creator_only_warns(monkeypatch):
    """A preview creates nothing: it warns, and the graph is the one an `up` would register."""
    import pulumi

    from components import Cluster, ClusterArgs, GpuPoolArgs

    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, resource=None, **_: warned.append(msg))
    cloud = mocks.FakeCloud(region="us-east-1")
    pulumi.runtime.set_mocks(cloud, project="warmstart", stack="unit", preview=True, monitor=mocks.EngineMonitor(cloud))
    pulumi.runtime.test(lambda: Cluster("unit", ClusterArgs(
        cluster_name="unit", mode="auto", region="us-east-1", vpc_id="vpc-0123456789abcdef0",
        private_subnet_ids=["subnet-0a"], gpu_pools=[GpuPoolArgs(name="l40s", instance_types=["g6e.2xlarge"])],
        cluster={"viewers": [CREATOR]})) and None)()
    assert len(warned) == 1 and "ClusterArgs.cluster.viewers" in warned[0] and "refused" in warned[0]
    assert [r.inputs["principalArn"] for r in cloud.resources
            if r.typ == ACCESS_ENTRY and r.inputs["type"] == "STANDARD"] == [CREATOR]


def test_the_deployers_principal_is_its_role_for_a_session(monkeypatch):
    import pulumi

    from components.cluster import deploying_principal

    seen = {}
    for arn, want in [("arn:aws:sts::123456789012:assumed-role/deployer/s", "arn:aws:iam::123456789012:role/deployer"),
                      (CREATOR, CREATOR)]:
        _as_caller(monkeypatch, arn)
        mocks.run(lambda: seen.update(got=deploying_principal(pulumi.InvokeOptions())), region="us-east-1",
                  stack="who")
        assert seen["got"] == want


# --------------------------------------------------------------------------------------
# The Kubernetes version, and the GPU nodes' NVIDIA driver


def test_the_default_kubernetes_version_is_in_the_calendar_and_validated(any_mode):
    version = any_mode.stack_plan.config.kubernetes_version
    assert version == versions.DEFAULT_KUBERNETES_VERSION == "1.36"
    assert any(r.version == version for r in versions.EKS_RELEASE_CALENDAR)
    import kubernetes_validate

    (dep, *_) = any_mode.kind("Deployment")
    kubernetes_validate.validate(dep, version, strict=True)  # the schemas exist for it


@pytest.mark.parametrize("version, line, ok", [
    ("580.159.03", "NVIDIA driver 580.159.03 (the vLLM image needs >= 580)", True),
    ("595.71.05", "NVIDIA driver 595.71.05", True),
    ("570.195.03", "WARNING: NVIDIA driver 570.195.03 is older than 580", False),
    (None, "WARNING: NVIDIA driver: unknown", False),
])
def test_the_nvme_check_logs_the_nodes_nvidia_driver(tmp_path, version, line, ok):
    from warmstart.podside import nvme_check

    if version is not None:
        (tmp_path / "module" / "nvidia").mkdir(parents=True)
        (tmp_path / "module" / "nvidia" / "version").write_text(version + "\n")
    assert nvme_check.nvidia_driver(tmp_path) == version
    got_ok, got = nvme_check.driver_line(nvme_check.nvidia_driver(tmp_path), nvme_check.MIN_NVIDIA_DRIVER_MAJOR)
    assert got_ok is ok and line in got and got.startswith("warmstart nvme-check: ")


# --------------------------------------------------------------------------------------
# Karpenter mode


@pytest.fixture(params=STACK_NAMES)
def karpenter_mode(request, flip_dir) -> render.Rendered:
    """Every stack rendered in karpenter mode."""
    return _render_in_mode(request.param, "karpenter", f"{flip_dir}/{request.param}-karpenter")


def _release(r: render.Rendered, name: str) -> dict:
    (rel,) = [x.inputs for x in r.of_type(RELEASE) if x.inputs["name"] == name]
    return rel


def test_karpenter_controller_runs_on_the_system_node_group(karpenter_mode):
    r = karpenter_mode
    (group,) = r.of_type("aws:eks/nodeGroup:NodeGroup")
    g = group.inputs
    assert g["scalingConfig"]["minSize"] >= 2 and g["scalingConfig"]["desiredSize"] >= 2
    assert g["capacityType"] == "ON_DEMAND" and g["amiType"].startswith("AL2023")
    assert len(g["subnetIds"]) >= 2  # the chart spreads its replicas over zones
    values = _release(r, "karpenter")["values"]
    assert values["nodeSelector"].items() >= g["labels"].items() and g["labels"]
    assert values["replicas"] == 2
    # No GPU NodePool can produce a node with the system label.
    for pool in r.kind("NodePool"):
        assert placement.NODE_GROUP_LABEL not in pool["spec"]["template"].get("metadata", {}).get("labels", {})


def test_the_controller_needs_nothing_that_runs_on_nodes_it_launches(karpenter_mode):
    """Pinned to the system group (and the chart's `karpenter.sh/nodepool DoesNotExist`), and
    resolving names through the node's resolver, not CoreDNS, which may run on the
    general-purpose pool's nodes."""
    values = _release(karpenter_mode, "karpenter")["values"]
    chart = yaml.safe_load((Path(__file__).resolve().parent.parent / "schemas" / "karpenter" /
                            "helm-values-v1.14.1.yaml").read_text())
    assert "dnsPolicy" in chart and values["dnsPolicy"] == "Default"
    assert values["nodeSelector"][placement.NODE_GROUP_LABEL] == placement.SYSTEM_NODE_GROUP


def test_the_cpu_pool_takes_the_gpu_pools_nodes_identity_and_no_gpu_taint(karpenter_mode):
    """The Karpenter-mode `general-purpose` NodePool: the GPU node classes' role, subnets and
    security groups (nodes that could not join or reach the cluster would never serve a pod), the
    same AMI pin, no GPU taint and no GPU instance type, a CPU limit, and never the system label
    (the controller's own nodes)."""
    r = karpenter_mode
    cpu = r.stack_plan.cluster.cpu_pool
    assert cpu is not None and cpu.name == placement.GENERAL_PURPOSE_POOL
    classes = _by_name(r, "EC2NodeClass")
    gpu_class = classes[r.stack_plan.cluster.pools[0].name]["spec"]
    cpu_class = classes[cpu.name]["spec"]
    for key in ("role", "subnetSelectorTerms", "securityGroupSelectorTerms", "amiSelectorTerms", "metadataOptions",
                "tags"):
        assert cpu_class[key] == gpu_class[key], key
    assert "instanceStorePolicy" not in cpu_class
    pool = _by_name(r, "NodePool")[cpu.name]
    assert not pool["spec"]["template"]["spec"].get("taints")
    types = _requirement(pool, placement.INSTANCE_TYPE_LABEL)["values"]
    assert types and not set(types) & set(instances.catalog())
    assert int(pool["spec"]["limits"]["cpu"]) == cpu.cpu_limit > 0
    assert placement.NODE_GROUP_LABEL not in (pool["spec"]["template"].get("metadata") or {}).get("labels", {})


def test_karpenter_charts_are_pinned_and_ordered(karpenter_mode):
    r = karpenter_mode
    crd, ctl = _release(r, "karpenter-crd"), _release(r, "karpenter")
    assert crd["version"] == ctl["version"] == versions.KARPENTER_VERSION
    assert ctl["skipCrds"] is True and crd["chart"] == versions.KARPENTER_CRD_CHART
    image = ctl["values"]["controller"]["image"]
    assert image["tag"] == versions.KARPENTER_VERSION and image["digest"].startswith("sha256:")
    dp = _release(r, "nvidia-device-plugin")
    assert dp["version"] == versions.NVIDIA_DEVICE_PLUGIN_VERSION
    assert dp["repositoryOpts"]["repo"] == "https://nvidia.github.io/k8s-device-plugin"
    # The plugin's default affinity matches `nvidia.com/gpu.present=true`: every GPU pool sets it.
    for pool in _gpu_nodepools(r):
        assert pool["spec"]["template"]["metadata"]["labels"][placement.NVIDIA_GPU_PRESENT_LABEL] == "true"


def test_karpenter_settings_name_the_cluster_and_its_interruption_queue(karpenter_mode):
    r = karpenter_mode
    c = r.stack_plan.cluster
    settings = _release(r, "karpenter")["values"]["settings"]
    (queue,) = r.of_type("aws:sqs/queue:Queue")
    # A stack whose pools launch into reservations also turns the ReservedCapacity gate on explicitly.
    gates = {"featureGates": {"reservedCapacity": True}} if any(p.capacity.reserved for p in c.pools) else {}
    assert settings == {"clusterName": c.name, "interruptionQueue": queue.inputs["name"]} | gates
    assert queue.inputs["messageRetentionSeconds"] == 300 and queue.inputs["sqsManagedSseEnabled"] is True
    queue_arn = mocks.SYNTHESIZERS["aws:sqs/queue:Queue"](queue.name, queue.inputs, r.stack_plan.config.region)["arn"]
    targets = r.of_type("aws:cloudwatch/eventTarget:EventTarget")
    rules = r.of_type("aws:cloudwatch/eventRule:EventRule")
    assert len(targets) == len(rules) == len(karpenter.INTERRUPTION_EVENTS)
    assert all(t.inputs["arn"] == queue_arn for t in targets)
    assert {t.inputs["rule"] for t in targets} == {x.inputs["name"] for x in rules}


def test_karpenter_controller_assumes_its_role_through_irsa_only(karpenter_mode):
    r = karpenter_mode
    sa = _release(r, "karpenter")["values"]["serviceAccount"]
    roles = {mocks.SYNTHESIZERS[ROLE](x.name, x.inputs, "")["arn"]: x for x in r.of_type(ROLE)}
    role = roles[sa["annotations"]["eks.amazonaws.com/role-arn"]]
    (stmt,) = policy_json(role.inputs["assumeRolePolicy"])["Statement"]
    eks = mocks.SYNTHESIZERS[EKS]("", _one(r, EKS).inputs, r.stack_plan.config.region)
    issuer = eks["oidcIssuer"]
    assert not issuer.startswith("https://")
    assert stmt["Principal"] == {"Federated": eks["oidcProviderArn"]}
    assert stmt["Condition"]["StringEquals"] == {
        f"{issuer}:sub": f"system:serviceaccount:{karpenter.CONTROLLER_NAMESPACE}:{sa['name']}",
        f"{issuer}:aud": "sts.amazonaws.com"}
    attached = {a.inputs["policyArn"] for a in r.of_type("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
                if a.inputs["role"] == role.inputs["name"]}
    assert len(attached) == 6


def test_karpenter_node_classes_select_what_the_stack_tagged(karpenter_mode):
    r = karpenter_mode
    name = r.stack_plan.cluster.name
    subnet_tags = [s.inputs.get("tags", {}) for s in r.of_type("aws:ec2/subnet:Subnet")
                   if s.inputs.get("tags", {}).get(KARPENTER_DISCOVERY_TAG)]
    tag_resources = {(t.inputs["resourceId"], t.inputs["key"], t.inputs["value"]) for t in r.of_type("aws:ec2/tag:Tag")}
    sg = mocks.SYNTHESIZERS[EKS]("", _one(r, EKS).inputs, r.stack_plan.config.region)["clusterSecurityGroupId"]
    for nc in r.kind("EC2NodeClass"):
        (subnet_term,) = nc["spec"]["subnetSelectorTerms"]
        (sg_term,) = nc["spec"]["securityGroupSelectorTerms"]
        assert subnet_term == sg_term == {"tags": {KARPENTER_DISCOVERY_TAG: name}}
        # Private subnets carry the tag (created VPC: on the subnet; existing VPC: ec2.Tag).
        private = len(r.stack_plan.aws.network.private_subnet_ids) or r.stack_plan.aws.network.az_count
        tagged = len(subnet_tags) + sum(1 for t in tag_resources if t[0].startswith("subnet-") and t[1:] == (KARPENTER_DISCOVERY_TAG, name))
        assert tagged == private
        assert (sg, KARPENTER_DISCOVERY_TAG, name) in tag_resources


# --- the controller's IAM equals Karpenter's reference, statement by statement


class _CfnLoader(yaml.SafeLoader):
    pass


_CfnLoader.add_multi_constructor("!", lambda loader, suffix, node: {
    f"!{suffix}": loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else loader.construct_sequence(node)})


def _canonical(statement: dict) -> dict:
    def as_list(v: Any) -> list[str]:
        return sorted(str(x).lower() if isinstance(x, bool) else str(x) for x in (v if isinstance(v, list) else [v]))
    out = {k: as_list(statement[k]) for k in ("Action", "Resource") if k in statement}
    out["Effect"] = statement["Effect"]
    out["Condition"] = {op: {k: as_list(v) for k, v in kv.items()} for op, kv in statement.get("Condition", {}).items()}
    if "Principal" in statement:
        p = statement["Principal"]
        out["Principal"] = p if isinstance(p, str) else {k: as_list(v) for k, v in p.items()}
    return out


REFERENCE_POLICIES = {
    "NodeLifecyclePolicy": "node-lifecycle", "IAMIntegrationPolicy": "iam-integration",
    "EKSIntegrationPolicy": "eks-integration", "InterruptionPolicy": "interruption",
    "ZonalShiftPolicy": "zonal-shift", "ResourceDiscoveryPolicy": "resource-discovery",
}


def test_karpenter_controller_policies_match_the_upstream_reference(karpenter_mode):
    r = karpenter_mode
    region, c = r.stack_plan.config.region, r.stack_plan.cluster
    synth = mocks.SYNTHESIZERS
    node_role = [x for x in r.of_type(ROLE) if x.inputs["name"].endswith("-karpenter-node")][0]
    (queue,) = r.of_type("aws:sqs/queue:Queue")
    subs = {"${AWS::Partition}": "aws", "${AWS::Region}": region, "${AWS::AccountId}": mocks.FAKE_ACCOUNT,
            "${ClusterName}": c.name, "${KarpenterNodeRole.Arn}": synth[ROLE](node_role.name, node_role.inputs, region)["arn"],
            "${KarpenterInterruptionQueue.Arn}": synth["aws:sqs/queue:Queue"](queue.name, queue.inputs, region)["arn"]}
    template = yaml.load((SCHEMAS / "karpenter" / "getting-started-cloudformation-v1.14.yaml").read_text(), Loader=_CfnLoader)
    ours = {p.inputs["name"].removeprefix(f"{r.stack_plan.name_prefix}-karpenter-"): policy_json(p.inputs["policy"])
            for p in r.of_type("aws:iam/policy:Policy") if "-karpenter-" in p.inputs["name"]}
    assert set(ours) == set(REFERENCE_POLICIES.values())
    for resource, short in REFERENCE_POLICIES.items():
        text = template["Resources"][resource]["Properties"]["PolicyDocument"]["!Sub"]
        for var, value in subs.items():
            text = text.replace(var, value)
        assert "${" not in text, text
        reference = {s["Sid"]: _canonical(s) for s in json.loads(text)["Statement"]}
        assert {s["Sid"]: _canonical(s) for s in ours[short]["Statement"]} == reference, short

    # Queue policy and EventBridge rules, likewise.
    ref_queue_policy = template["Resources"]["KarpenterInterruptionQueuePolicy"]["Properties"]["PolicyDocument"]
    queue_arn = subs["${KarpenterInterruptionQueue.Arn}"]
    ref_statements = [_canonical({**s, "Resource": queue_arn}) for s in ref_queue_policy["Statement"]]
    (qp,) = r.of_type("aws:sqs/queuePolicy:QueuePolicy")
    assert sorted(map(json.dumps, (_canonical(s) for s in policy_json(qp.inputs["policy"])["Statement"]))) == \
        sorted(map(json.dumps, ref_statements))
    ref_patterns = [v["Properties"]["EventPattern"] for v in template["Resources"].values() if v["Type"] == "AWS::Events::Rule"]
    ours_patterns = [json.loads(x.inputs["eventPattern"]) for x in r.of_type("aws:cloudwatch/eventRule:EventRule")]
    assert sorted(map(json.dumps, ours_patterns)) == sorted(json.dumps(p, sort_keys=True) for p in ref_patterns)


# --------------------------------------------------------------------------------------
# Component level: the Cluster against plain Inputs (what the AWS layer wires IRSA from)


@pytest.mark.parametrize("mode", MODES)
def test_cluster_component_exposes_the_irsa_inputs(mode):
    import pulumi

    from components import Cluster, ClusterArgs, GpuPoolArgs

    plan = render.load_plan(STACKS_DIR, "prod")[1]
    seen: dict[str, Any] = {}

    def program() -> None:
        c = Cluster("unit", ClusterArgs(
            cluster_name="unit", mode=mode, region="us-east-1", vpc_id="vpc-0123456789abcdef0",
            private_subnet_ids=["subnet-0b", "subnet-0a"],
            gpu_pools=[GpuPoolArgs(name="h100", instance_types=["p5.48xlarge"])]))
        pulumi.Output.all(c.oidc_provider_arn, c.oidc_issuer, c.cluster_name).apply(
            lambda v: seen.update(arn=v[0], issuer=v[1], name=v[2]))
        seen["provider"] = c.kubernetes_provider
        seen["plan"] = c.plan

    resources = mocks.run(program, region="us-east-1", stack="unit")
    assert seen["arn"].startswith("arn:aws:iam::") and ":oidc-provider/" in seen["arn"]
    assert not seen["issuer"].startswith("https://") and seen["arn"].endswith(seen["issuer"])
    assert seen["name"] == "unit" and seen["plan"].mode == mode
    # Alone, with no models named, a pool may still launch one node of its type.
    assert [p.max_gpus for p in seen["plan"].pools] == [8] and plan.cluster.pools[0].max_gpus > 8
    assert any(r.typ == "pulumi:providers:kubernetes" for r in resources)
    if mode == "auto":
        (nc,) = [r.inputs for r in resources if r.typ == AUTO_NODECLASS]
        assert nc["spec"]["subnetSelectorTerms"] == [{"id": "subnet-0a"}, {"id": "subnet-0b"}]
