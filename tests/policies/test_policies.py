"""warmstart's policy pack: the rendered stacks pass, and a broken copy of each resource kind
fails with the policy's message.

The checks are the pure functions in warmstart/policies/, run here over the resources the real
program registers under Pulumi mocks, exactly as the pack (warmstart/policy_pack.py) runs them
inside `pulumi preview` / `up`. The pack adapters are exercised too, with the SDK's own
PolicyResource and unknown-value proxies standing in for a preview.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
from dataclasses import replace
from datetime import date, timedelta
from pathlib import Path
from typing import Callable

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pulumi_policy import (
    EnforcementLevel,
    ResourceValidationPolicy,
    StackValidationPolicy,
)
from pulumi_policy.policy import (
    PolicyResource,
    ResourceValidationArgs,
    StackValidationArgs,
)
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from tests.support.stacks import ROOT, STACK_NAMES, render_stack
from warmstart import mocks, policies, policy_pack, versions
from warmstart.config import LoaderTuning
from warmstart.decisions import tuning
from warmstart.decisions.instances import GIB, MIB
from warmstart.manifests import serving
from warmstart.policies import Resource, eks_version

_records: dict[str, list[Resource]] = {}


def records(stack: str) -> list[Resource]:
    """A fresh, mutable copy of a rendered stack's records."""
    if stack not in _records:
        _records[stack] = mocks.policy_records(render_stack(stack).resources, render_stack(stack).stack_plan.config.region)
    return copy.deepcopy(_records[stack])


def of_type(rs: list[Resource], *types: str) -> list[Resource]:
    found = [r for r in rs if r.typ in types]
    assert found, f"the rendered stack has no {types}"
    return found


def drop(rs: list[Resource], *types: str) -> list[Resource]:
    of_type(rs, *types)
    return [r for r in rs if r.typ not in types]


def set_doc(r: Resource, key: str, doc: dict) -> None:
    """Write an IAM policy back in the form it was rendered in (JSON string or object)."""
    r.props[key] = json.dumps(doc) if isinstance(r.props[key], str) else doc


# The only checks that warn instead of block: nothing breaks the day a version leaves standard
# support, it only costs more.
ADVISORY = {"eks-version-standard-support"}


def check(name: str) -> policies.Check:
    return next(c for c in policies.CHECKS if c.name == name)


# --------------------------------------------------------------------------------------
# The rendered stacks pass


def test_rendered_stacks_pass_every_policy(stack_name):
    assert [str(v) for v in policies.run_all(records(stack_name))] == []


def test_every_policy_has_something_to_check_in_some_stack():
    """A check that sees nothing to check in every stack would pass vacuously."""
    subjects = {
        "s3-bucket-guardrails": lambda rs: [r for r in rs if r.typ in policies.BUCKET_TYPES],
        "irsa-trust-pinned": lambda rs: [r for r in rs if r.typ in policies.ROLE_TYPES and policies.irsa_trust(r)],
        "irsa-no-model-bucket-write": lambda rs: policies._model_buckets(rs),
        "gpu-subnets-s3-gateway-endpoint": lambda rs: [r for r in rs if r.typ in policies.SUBNET_TYPES],
        "gpu-node-classes-nvme": lambda rs: [nc for nc in policies.gpu_node_classes(rs).values() if nc],
        "vllm-no-eager-with-distributed-or-cache": policies.vllm_deployments,
        "vllm-loader-concurrency": policies.vllm_deployments,
        "vllm-gpu-request-equals-tp": policies.vllm_deployments,
        "vllm-startup-probe": policies.vllm_deployments,
        "eks-version-standard-support": lambda rs: [r for r in rs if r.typ in eks_version.CLUSTER_TYPES],
        "autoscaling-max-replicas-fit-gpu-pool": lambda rs: policies.scaled_objects(rs),
    }
    assert set(subjects) == {c.name for c in policies.CHECKS}
    for name, subject in subjects.items():
        assert any(subject(records(s)) for s in STACK_NAMES), f"{name} checks nothing in any stack"


# --------------------------------------------------------------------------------------
# Broken copies fail with the policy's message

Mutation = Callable[[list[Resource]], list[Resource]]


def _pab_flag(rs):
    of_type(rs, *policies.PUBLIC_ACCESS_BLOCK_TYPES)[0].props["restrictPublicBuckets"] = False
    return rs


def _tls_condition(rs):
    pol = of_type(rs, *policies.BUCKET_POLICY_TYPES)[0]
    doc = policies.policy_document(pol.props["policy"])
    for s in policies.statements(doc):
        s.pop("Condition", None)
        if s.get("Effect") == "Deny":
            s["Condition"] = {"Bool": {"aws:SecureTransport": "true"}}
    set_doc(pol, "policy", doc)
    return rs


def _versioning_suspended(rs):
    of_type(rs, *policies.VERSIONING_TYPES)[0].props["versioningConfiguration"]["status"] = "Suspended"
    return rs


def _irsa_role(rs) -> Resource:
    roles = [r for r in of_type(rs, *policies.ROLE_TYPES) if policies.irsa_trust(r)]
    assert roles, "the rendered stack has no IRSA role"
    return roles[0]


def _trust(rs, edit: Callable[[dict], None]):
    role = _irsa_role(rs)
    doc = policies.irsa_trust(role)
    stmt = next(s for s in policies.statements(doc) if policies._is_web_identity(s))
    edit(stmt)
    set_doc(role, "assumeRolePolicy", doc)
    return rs


def _cond_key(stmt: dict, suffix: str) -> str:
    return next(k for k in stmt["Condition"]["StringEquals"] if k.endswith(suffix))


def _sub_wildcard(stmt):
    k = _cond_key(stmt, ":sub")
    v = stmt["Condition"]["StringEquals"].pop(k)
    stmt["Condition"]["StringLike"] = {k: v.rsplit(":", 1)[0] + ":*"}


def _sub_two_accounts(stmt):
    k = _cond_key(stmt, ":sub")
    v = stmt["Condition"]["StringEquals"][k]
    stmt["Condition"]["StringEquals"][k] = [v, v.rsplit(":", 1)[0] + ":other"]


def _aud_wrong(stmt):
    stmt["Condition"]["StringEquals"][_cond_key(stmt, ":aud")] = "sts.example.com"


def _aud_missing(stmt):
    del stmt["Condition"]["StringEquals"][_cond_key(stmt, ":aud")]


def _model_write(rs):
    """Add s3:PutObject to the policy that grants an IRSA role read access to a model bucket."""
    bucket = sorted(policies._model_buckets(rs))[0]
    for role in (r for r in rs if r.typ in policies.ROLE_TYPES and policies.irsa_trust(r)):
        for holder in rs:
            key = "policy" if holder.typ in policies.ROLE_POLICY_TYPES + policies.POLICY_TYPES else None
            if key is None:
                continue
            doc = policies.policy_document(holder.props.get(key))
            if not doc or bucket not in json.dumps(doc):
                continue
            for s in policies.statements(doc):
                if bucket in json.dumps(s.get("Resource")):
                    s["Action"] = [*policies.as_list(s["Action"]), "s3:PutObject"]
                    s["Resource"] = [*policies.as_list(s["Resource"]), f"arn:aws:s3:::{bucket}/*"]
                    set_doc(holder, key, doc)
                    return rs
    raise AssertionError(f"no role policy grants access to the model bucket {bucket}")


def _managed_full_access(rs):
    role = _irsa_role(rs)
    return rs + [Resource("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "broken-attachment",
                          {"role": role.props.get("name") or role.name,
                           "policyArn": "arn:aws:iam::aws:policy/AmazonS3FullAccess"})]


def _import_policy(rs) -> tuple[Resource, dict]:
    """The weights-import role's policy (the dev stack imports its model) and its document."""
    (pol,) = [r for r in rs if r.typ in policies.ROLE_POLICY_TYPES and r.props.get("name") == "weights-import"]
    return pol, policies.policy_document(pol.props["policy"])


def _import_write(edit: Callable[[dict], None]):
    """Edit the import role's one write statement (its own model's prefix)."""
    def mutate(rs):
        pol, doc = _import_policy(rs)
        edit(next(s for s in policies.statements(doc) if s.get("Sid") == "WriteModelWeights"))
        set_doc(pol, "policy", doc)
        return rs
    return mutate


def _whole_bucket(stmt):
    stmt["Resource"] = stmt["Resource"].split("/", 1)[0] + "/*"


def _sibling_prefix(stmt):
    stmt["Resource"] = stmt["Resource"].removesuffix("/*") + "-v2/*"


def _import_trusts_the_serving_account(rs):
    """The import role's policy, assumable by the serving ServiceAccount instead of `<model>-import`."""
    role = next(r for r in of_type(rs, *policies.ROLE_TYPES) if (r.props.get("tags") or {}).get("warmstart:purpose"))
    doc = policies.irsa_trust(role)
    cond = next(s for s in policies.statements(doc) if policies._is_web_identity(s))["Condition"]["StringEquals"]
    key = next(k for k in cond if k.endswith(":sub"))
    cond[key] = cond[key].removesuffix("-import")
    set_doc(role, "assumeRolePolicy", doc)
    return rs


def _serving_writes_its_own_prefix(rs):
    """PutObject added to the serving role's read of its own prefix: a write scoped to a prefix
    is still a write of the model bucket."""
    (pol,) = [r for r in rs if r.typ in policies.ROLE_POLICY_TYPES and r.props.get("name") == "s3-access"][:1]
    doc = policies.policy_document(pol.props["policy"])
    stmt = next(s for s in policies.statements(doc) if s.get("Sid") == "ReadModelWeights")
    stmt["Action"] = [*policies.as_list(stmt["Action"]), "s3:PutObject"]
    set_doc(pol, "policy", doc)
    return rs


def _endpoint_route_table(rs):
    ep = of_type(rs, *policies.VPC_ENDPOINT_TYPES)[0]
    ep.props["routeTableIds"] = ep.props["routeTableIds"][1:]
    return rs


def _node_class(rs, kind: str) -> Resource:
    ncs = [nc for nc in policies.gpu_node_classes(rs).values() if nc is not None and nc.props["kind"] == kind]
    assert ncs, f"the rendered stack has no GPU {kind}"
    return ncs[0]


def _auto_storage_too_large(rs):
    _node_class(rs, "NodeClass").props["spec"].setdefault("ephemeralStorage", {})["size"] = "59000Gi"
    return rs


def _karpenter_no_raid0(rs):
    _node_class(rs, "EC2NodeClass").props["spec"].pop("instanceStorePolicy", None)
    return rs


def _pool_without_node_class(rs):
    pools = policies.gpu_node_pools(rs)
    assert pools, "the rendered stack has no GPU NodePool"
    pools[0].props["spec"]["template"]["spec"]["nodeClassRef"]["name"] = "not-declared"
    return rs


def _pool_gpu_limit(rs, gpus: int):
    for np in policies.gpu_node_pools(rs):
        np.props["spec"]["limits"]["nvidia.com/gpu"] = gpus
    return rs


def _deployment(rs, pred=lambda d: True) -> Resource:
    deps = [d for d in policies.vllm_deployments(rs) if pred(d)]
    assert deps, "the rendered stack has no such vLLM Deployment"
    return deps[0]


def _container(d: Resource) -> dict:
    return policies.vllm_container(d)


def _eager(pred):
    def mutate(rs):
        _container(_deployment(rs, pred))["args"].append("--enforce-eager")
        return rs
    return mutate


def _distributed(d):
    return (policies._loader_config(_container(d)) or {}).get("distributed") is True


def _annotation(key, fn):
    def mutate(rs):
        ann = _deployment(rs).props["metadata"]["annotations"]
        ann[key] = fn(ann[key])
        return rs
    return mutate


def _loader_concurrency(rs):
    c = _container(_deployment(rs))
    i = next(i for i, a in enumerate(c["args"]) if a.startswith("--model-loader-extra-config="))
    cfg = json.loads(c["args"][i].split("=", 1)[1])
    cfg["concurrency"] += 7
    c["args"][i] = "--model-loader-extra-config=" + json.dumps(cfg)
    return rs


def _chunk_env(rs):
    for e in _container(_deployment(rs))["env"]:
        if e["name"] == policies.CHUNK_ENV:
            e["value"] = str(8 * GIB)
    return rs


def _gpu_count(rs):
    res = _container(_deployment(rs))["resources"]
    for part in ("requests", "limits"):
        res[part][policies.GPU_RESOURCE] = str(int(res[part][policies.GPU_RESOURCE]) + 1)
    return rs


def _gpu_requests_ne_limits(rs):
    res = _container(_deployment(rs))["resources"]
    res["requests"][policies.GPU_RESOURCE] = str(int(res["limits"][policies.GPU_RESOURCE]) + 1)
    return rs


def _no_startup_probe(rs):
    del _container(_deployment(rs))["startupProbe"]
    return rs


# (stacks, check, mutation, message the violation must match)
def _eks_version(rs, version: str):
    for r in of_type(rs, *eks_version.CLUSTER_TYPES):
        r.props["version"] = version
    return rs


CASES: dict[str, tuple[tuple[str, ...], str, Mutation, str]] = {
    "bucket-public-access-flag": (("dev", "prod"), "s3-bucket-guardrails", _pab_flag, r"restrictPublicBuckets=False"),
    "bucket-no-public-access-block": (("dev", "prod"), "s3-bucket-guardrails",
                                      lambda rs: drop(rs, *policies.PUBLIC_ACCESS_BLOCK_TYPES), r"has no public access block"),
    "bucket-unencrypted": (("dev", "prod"), "s3-bucket-guardrails",
                           lambda rs: drop(rs, *policies.ENCRYPTION_TYPES), r"has no default encryption"),
    "bucket-plain-http": (("dev", "prod"), "s3-bucket-guardrails", _tls_condition, r"does not deny requests without TLS"),
    "bucket-no-policy": (("dev", "prod"), "s3-bucket-guardrails",
                         lambda rs: drop(rs, *policies.BUCKET_POLICY_TYPES), r"has no bucket policy"),
    "bucket-versioning-suspended": (("dev", "prod"), "s3-bucket-guardrails", _versioning_suspended,
                                    r"is not versioned \(status \['Suspended'"),
    "irsa-sub-wildcard": (("dev", "prod"), "irsa-trust-pinned", lambda rs: _trust(rs, _sub_wildcard),
                          r":sub with an operator other than StringEquals"),
    "irsa-sub-two-accounts": (("dev",), "irsa-trust-pinned", lambda rs: _trust(rs, _sub_two_accounts),
                              r"must name exactly one service account"),
    "irsa-aud-wrong": (("dev",), "irsa-trust-pinned", lambda rs: _trust(rs, _aud_wrong),
                       r"audience must be exactly 'sts.amazonaws.com'"),
    "irsa-aud-missing": (("prod",), "irsa-trust-pinned", lambda rs: _trust(rs, _aud_missing),
                         r"no StringEquals '<issuer>:aud'"),
    "irsa-model-write": (("dev", "prod"), "irsa-no-model-bucket-write", _model_write,
                         r"allows writing the model bucket"),
    "irsa-managed-full-access": (("dev",), "irsa-no-model-bucket-write", _managed_full_access,
                                 r"AWS managed policy .*AmazonS3FullAccess allows writing the model bucket"),
    "irsa-serving-role-writes-its-prefix": (("dev", "prod"), "irsa-no-model-bucket-write",
                                            _serving_writes_its_own_prefix,
                                            r"allows writing the model bucket .*serving roles only read weights"),
    "irsa-import-role-writes-the-whole-bucket": (("dev",), "irsa-no-model-bucket-write", _import_write(_whole_bucket),
                                                 r"beyond what the weights import of model 'llama-3-1-8b' needs"),
    "irsa-import-role-writes-another-prefix": (("dev",), "irsa-no-model-bucket-write", _import_write(_sibling_prefix),
                                               r"beyond what the weights import of model 'llama-3-1-8b' needs"),
    "irsa-import-role-deletes": (("dev",), "irsa-no-model-bucket-write",
                                 _import_write(lambda st: st["Action"].append("s3:DeleteObject")),
                                 r"beyond what the weights import of model 'llama-3-1-8b' needs"),
    "irsa-import-role-wildcard-action": (("dev",), "irsa-no-model-bucket-write",
                                         _import_write(lambda st: st.update(Action="s3:Put*")),
                                         r"beyond what the weights import of model 'llama-3-1-8b' needs"),
    "irsa-import-policy-on-the-serving-account": (("dev",), "irsa-no-model-bucket-write",
                                                  _import_trusts_the_serving_account,
                                                  r"allows writing the model bucket .*serving roles only read weights"),
    "subnet-route-table-off-endpoint": (("dev", "prod"), "gpu-subnets-s3-gateway-endpoint", _endpoint_route_table,
                                        r"not on the S3 Gateway endpoint"),
    "subnet-no-endpoint": (("dev",), "gpu-subnets-s3-gateway-endpoint",
                           lambda rs: drop(rs, *policies.VPC_ENDPOINT_TYPES), r"no S3 Gateway VPC endpoint"),
    "nodeclass-auto-storage-not-below-nvme": (("dev",), "gpu-node-classes-nvme", _auto_storage_too_large,
                                              r"ephemeralStorage.size=59000Gi is not below the NVMe capacity"),
    "nodeclass-karpenter-no-raid0": (("prod",), "gpu-node-classes-nvme", _karpenter_no_raid0,
                                     r"instanceStorePolicy=None; without RAID0"),
    "nodepool-undeclared-node-class": (("dev", "prod"), "gpu-node-classes-nvme", _pool_without_node_class,
                                       r"'not-declared', which this stack does not declare"),
    "vllm-eager-distributed": (("prod",), "vllm-no-eager-with-distributed-or-cache", _eager(_distributed),
                               r"--enforce-eager with distributed loading"),
    "vllm-eager-compile-cache": (("dev",), "vllm-no-eager-with-distributed-or-cache",
                                 _eager(lambda d: policies.uses_compile_cache(_container(d))),
                                 r"--enforce-eager with a compile cache"),
    "vllm-concurrency-annotation": (("dev", "prod"), "vllm-loader-concurrency",
                                    _annotation(policies.ANNOTATION_CONCURRENCY, lambda v: str(int(v) + 1)),
                                    r"declares concurrency \d+ for \d+ bytes"),
    "vllm-weights-annotation-missing": (("dev",), "vllm-loader-concurrency",
                                        _annotation(policies.ANNOTATION_WEIGHTS, lambda v: None),
                                        r"does not declare positive integer annotations"),
    "vllm-loader-config-concurrency": (("dev", "prod"), "vllm-loader-concurrency", _loader_concurrency,
                                       r"streams with concurrency \d+ but declares"),
    "vllm-chunk-env": (("prod",), "vllm-loader-concurrency", _chunk_env, r"RUNAI_STREAMER_CHUNK_BYTESIZE='8589934592'"),
    "vllm-gpu-not-tp": (("dev", "prod"), "vllm-gpu-request-equals-tp", _gpu_count,
                        r"gets \d+ nvidia.com/gpu but runs --tensor-parallel-size=\d+"),
    "vllm-gpu-requests-ne-limits": (("prod",), "vllm-gpu-request-equals-tp", _gpu_requests_ne_limits,
                                    r"requests \d+ but limits \d+ nvidia.com/gpu"),
    "vllm-no-startup-probe": (("dev", "prod"), "vllm-startup-probe", _no_startup_probe, r"has no startup probe"),
    # prod's qwen-67b autoscales to 4 replicas of TP 2 on its pool's p5.48xlarge nodes.
    "autoscaling-pool-too-small": (("prod",), "autoscaling-max-replicas-fit-gpu-pool", lambda rs: _pool_gpu_limit(rs, 8),
                                   r"allows 8 GPUs but its models"),
    # 1.29 left extended support on 2026-03-23: reported whatever day the suite runs.
    "eks-version-past-support": (("dev", "prod"), "eks-version-standard-support", lambda rs: _eks_version(rs, "1.29"),
                                 r"Kubernetes 1\.29 is past the end of EKS extended support on 2026-03-23"),
}
PARAMS = [(case, stack) for case, (stacks, *_rest) in CASES.items() for stack in stacks]


@pytest.mark.parametrize("case, stack", PARAMS, ids=[f"{c}-{s}" for c, s in PARAMS])
def test_broken_copy_fails_with_the_policy_message(case, stack):
    _, name, mutate, message = CASES[case]
    broken = mutate(records(stack))
    found = check(name).fn(broken)
    assert any(re.search(message, v.message) for v in found), [v.message for v in found]
    assert all(v.policy == name for v in found)
    assert all("fix:" in v.message for v in found if re.search(message, v.message)) or case.startswith("vllm-")
    # The same mutation trips the whole pack, and only through this policy's checks.
    assert {v.policy for v in policies.run_all(broken)} >= {name}


def test_every_policy_has_a_broken_case():
    assert {c[1] for c in CASES.values()} == {c.name for c in policies.CHECKS}


# --------------------------------------------------------------------------------------
# The EKS version check, on given days


def _eks_warnings(stack: str, version: str, on: date) -> list[str]:
    return [v.message for v in eks_version.check_eks_version(_eks_version(records(stack), version), today=on)]


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_eks_version_warns_from_the_end_of_standard_support_on(stack):
    """1.33: standard support until 2026-07-29 (UTC), extended until 2027-07-29."""
    assert _eks_warnings(stack, "1.33", date(2026, 7, 28)) == []
    (extended,) = _eks_warnings(stack, "1.33", date(2026, 7, 29))
    assert "left EKS standard support on 2026-07-29 and is billed as extended support until 2027-07-29" in extended
    assert "fix:" in extended and versions.EKS_RELEASE_CALENDAR_URL in extended
    assert _eks_warnings(stack, "1.33", date(2026, 12, 1)) == [extended]
    (ended,) = _eks_warnings(stack, "1.33", date(2027, 7, 29))
    assert "past the end of EKS extended support on 2027-07-29" in ended


def test_eks_version_default_is_quiet_until_its_end_of_standard_support():
    row = next(r for r in versions.EKS_RELEASE_CALENDAR if r.version == versions.DEFAULT_KUBERNETES_VERSION)
    day_before = row.end_of_standard_support - timedelta(days=1)
    assert _eks_warnings("dev", versions.DEFAULT_KUBERNETES_VERSION, day_before) == []
    assert _eks_warnings("dev", versions.DEFAULT_KUBERNETES_VERSION, row.end_of_standard_support)


def test_eks_version_reports_one_cluster_once_and_skips_what_it_cannot_know():
    on = date(2026, 12, 1)
    component = Resource("eks:index:Cluster", "c", {"name": "ws-dev", "version": "1.31"})
    child = Resource("aws:eks/cluster:Cluster", "c-eksCluster", {"name": "ws-dev", "version": "1.31"})
    (only,) = eks_version.check_eks_version([component, child], today=on)
    assert only.policy == "eks-version-standard-support" and "1.31" in only.message
    assert eks_version.check_eks_version([Resource("eks:index:Cluster", "c", {"version": policies.UNKNOWN})], on) == []
    assert eks_version.check_eks_version([Resource("eks:index:Cluster", "c", {"name": "x"})], on) == []  # EKS default
    assert eks_version.check_eks_version([Resource("eks:index:Cluster", "c", {"version": "1.99"})], on) == []
    (old,) = eks_version.check_eks_version([Resource("eks:index:Cluster", "c", {"version": "1.27"})], on)
    assert "past the end of EKS extended support" in old.message


def test_eks_release_calendar_is_14_plus_12_months():
    """Standard support is 14 months from the EKS release, extended support 12 more (same page)."""
    def months_later(d: date, n: int) -> date:
        y, m = divmod(d.month - 1 + n, 12)
        return d.replace(year=d.year + y, month=m + 1)
    for r in versions.EKS_RELEASE_CALENDAR:
        assert r.end_of_standard_support == months_later(r.eks_release, 14), r.version
        assert r.end_of_extended_support == months_later(r.end_of_standard_support, 12), r.version


def test_the_default_kubernetes_version_is_in_standard_support_today():
    """Deliberately dated: the day warmstart's default leaves EKS standard support, every stack
    on the default starts paying for extended support. Bump versions.DEFAULT_KUBERNETES_VERSION
    (and the calendar) to the newest version in standard support that the pins support."""
    status, row = versions.eks_support(versions.DEFAULT_KUBERNETES_VERSION, eks_version.today_utc())
    assert status == versions.STANDARD, (
        f"Kubernetes {versions.DEFAULT_KUBERNETES_VERSION} left EKS standard support on "
        f"{row.end_of_standard_support if row else '?'}: bump versions.DEFAULT_KUBERNETES_VERSION")


def test_the_pack_reports_the_eks_version_as_advisory():
    (pol,) = [p for p in policy_pack.policies_for_pack() if p.name == "eks-version-standard-support"]
    assert isinstance(pol, StackValidationPolicy) and pol.enforcement_level == EnforcementLevel.ADVISORY
    reported = _run_stack_policy(pol.name, _policy_resources(_eks_version(records("dev"), "1.29")))
    assert len(reported) == 1 and "1.29 is past the end of EKS extended support" in reported[0][0]


# --------------------------------------------------------------------------------------
# Pure helpers under properties


SAFE = st.text(alphabet="abc:/-*?", max_size=8)


@given(SAFE, st.text(alphabet="abc:/-", max_size=8))
def test_iam_match_agrees_with_glob_semantics(pattern, value):
    assert policies.iam_match(pattern, value) == fnmatch.fnmatchcase(value, pattern)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"]))
def test_quantity_bytes(n, suffix):
    scale = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    assert policies.quantity_bytes(f"{n}{suffix}") == n * scale[suffix]


@settings(max_examples=60, deadline=None)
@given(weights_gib=st.floats(min_value=0.5, max_value=700), chunk_mib=st.integers(min_value=5, max_value=16384),
       tp=st.sampled_from([1, 2, 4, 8]), eager=st.booleans())
def test_serving_and_policies_agree(weights_gib, chunk_mib, tp, eager):
    """Whatever sizes a model has, the Deployment warmstart writes passes the vLLM policies, and
    the same Deployment with its concurrency off by one does not."""
    base = render_stack("dev").stack_plan.models[0]
    weights, chunk = int(weights_gib * GIB), chunk_mib * MIB
    m = replace(base, weights_bytes=weights, loader=LoaderTuning(chunk_bytes=chunk),
                concurrency=tuning.loader_concurrency(weights, chunk), tensor_parallel_size=tp,
                distributed=tp > 1, eager=eager and tp == 1, compile_cache=not eager,
                pod=tuning.pod_size(base.instance, 1))
    dep = Resource("kubernetes:apps/v1:Deployment", "d", serving.deployment_spec(m, "ns", "us-west-2"))
    vllm_checks = [c for c in policies.CHECKS if c.name.startswith("vllm-")]
    assert [str(v) for c in vllm_checks for v in c.fn([dep])] == []
    dep.props["metadata"]["annotations"][policies.ANNOTATION_CONCURRENCY] = str(m.concurrency + 1)
    assert check("vllm-loader-concurrency").fn([dep])


# --------------------------------------------------------------------------------------
# The pack adapters, with the SDK's own resource objects and unknown-value proxies


def _policy_resources(rs: list[Resource], unknown: Callable[[Resource], list[str]] = lambda r: [],
                      deps: bool = True, edit: Callable[[Resource, dict], dict[str, list[str]]] | None = None
                      ) -> list[PolicyResource]:
    """PolicyResources as the engine hands them to a stack policy during a preview: props behind
    the unknown-checking proxy; the props `unknown(r)` names unknown, with property
    dependencies on what they referenced (unless deps=False); `edit(r, props)` may blank
    nested values itself and return the dependencies to record for them."""
    urn = {r.key: f"urn:pulumi:dev::warmstart::{r.typ}::{r.name}" for r in rs}
    staged = []
    for r in rs:
        props = copy.deepcopy(dict(r.props))
        prop_deps: dict[str, list[str]] = {}
        for key in unknown(r):
            prop_deps[key] = [urn[t.key] for t in rs if policies.refers(r, key, t)]
            props[key] = UNKNOWN_STRING_VALUE
        if edit is not None:
            prop_deps |= {k: [urn[x] for x in v] for k, v in edit(r, props).items()}
        staged.append((r, props, prop_deps if deps else {}))
    out = {urn[r.key]: PolicyResource(r.typ, unknown_checking_proxy(props), urn[r.key], r.name, None, None,
                                      None, [], {}) for r, props, _ in staged}
    for r, _, prop_deps in staged:
        out[urn[r.key]].property_dependencies = {k: [out[u] for u in v] for k, v in prop_deps.items()}
    return list(out.values())


def _run_stack_policy(name: str, resources: list[PolicyResource]) -> list[tuple[str, str | None]]:
    reported = []
    pol = next(p for p in policy_pack.policies_for_pack() if p.name == name)
    assert isinstance(pol, StackValidationPolicy)
    pol.validate(StackValidationArgs(resources), lambda msg, urn=None: reported.append((msg, urn)))
    return reported


def _run_resource_policy(name: str, r: Resource, props=None) -> list[str]:
    reported = []
    pol = next(p for p in policy_pack.policies_for_pack() if p.name == name)
    assert isinstance(pol, ResourceValidationPolicy)
    args = ResourceValidationArgs(r.typ, unknown_checking_proxy(copy.deepcopy(dict(props or r.props))),
                                  f"urn:{r.name}", r.name, None, None)
    pol.validate(args, lambda msg, urn=None: reported.append(msg))
    return reported


def test_pack_has_one_policy_per_check_at_its_level():
    pack = policy_pack.policies_for_pack()
    assert [p.name for p in pack] == [c.name for c in policies.CHECKS]
    for p, c in zip(pack, policies.CHECKS):
        advisory = c.name in ADVISORY
        assert p.enforcement_level == (EnforcementLevel.ADVISORY if advisory else EnforcementLevel.MANDATORY)
        assert isinstance(p, StackValidationPolicy if c.scope == "stack" else ResourceValidationPolicy)


def test_plain_unwraps_proxies_and_marks_unknowns():
    props = unknown_checking_proxy({"a": [{"b": UNKNOWN_STRING_VALUE}, 1], "c": "x"})
    assert policy_pack.plain(props) == {"a": [{"b": policies.UNKNOWN}, 1], "c": "x"}


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_pack_passes_the_rendered_stacks(stack):
    rs = records(stack)
    for c in policies.CHECKS:
        if c.scope == "stack":
            assert _run_stack_policy(c.name, _policy_resources(rs)) == []
        else:
            assert [m for r in rs for m in _run_resource_policy(c.name, r)] == []


def test_pack_reports_a_stack_violation_on_the_resource():
    broken = _pab_flag(records("dev"))
    reported = _run_stack_policy("s3-bucket-guardrails", _policy_resources(broken))
    assert len(reported) == 1 and "restrictPublicBuckets=False" in reported[0][0]
    assert reported[0][1].startswith("urn:pulumi:dev::warmstart::aws:s3/bucket:Bucket::")


def test_pack_reports_a_resource_violation():
    rs = _no_startup_probe(records("dev"))
    dep = _deployment(rs)
    assert any("has no startup probe" in m for m in _run_resource_policy("vllm-startup-probe", dep))


def test_preview_unknowns_follow_property_dependencies():
    """In a preview, a bucket's name may be unknown in its public access block, policy, ...:
    the engine's property dependencies still link them, so nothing is reported falsely, and
    a real violation is still found."""
    related = set(policies.PUBLIC_ACCESS_BLOCK_TYPES + policies.ENCRYPTION_TYPES + policies.BUCKET_POLICY_TYPES
                  + policies.VERSIONING_TYPES)
    unknown = lambda r: ["bucket"] if r.typ in related else []  # noqa: E731
    assert _run_stack_policy("s3-bucket-guardrails", _policy_resources(records("dev"), unknown)) == []
    broken = _pab_flag(records("dev"))
    assert _run_stack_policy("s3-bucket-guardrails", _policy_resources(broken, unknown))
    # Without dependencies the link is unknowable: skipped, never a false violation.
    assert _run_stack_policy("s3-bucket-guardrails", _policy_resources(records("dev"), unknown, deps=False)) == []


NETWORK_IDS = {"aws:ec2/routeTableAssociation:RouteTableAssociation": ["subnetId", "routeTableId"],
               "aws:ec2/vpcEndpoint:VpcEndpoint": ["routeTableIds", "vpcId"],
               "aws:ec2/route:Route": ["routeTableId", "gatewayId", "natGatewayId"]}


def _unknown_subnet_selectors(r: Resource, props: dict) -> dict[str, list[str]]:
    """A new VPC in a preview: the Auto Mode NodeClass selects subnets by ids not known yet."""
    terms = props.get("spec", {}).get("subnetSelectorTerms") if r.props.get("kind") == "NodeClass" else None
    if not terms or not any("id" in t for t in terms):
        return {}
    ids = {t["id"] for t in terms if "id" in t}
    for t in terms:
        if "id" in t:
            t["id"] = UNKNOWN_STRING_VALUE
    return {"spec": [s.key for s in _records["dev"] if s.typ in policies.SUBNET_TYPES and s.props.get("id") in ids]}


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_preview_unknown_network_ids_follow_property_dependencies(stack):
    """In a preview of a new VPC every subnet, route table and endpoint id is unknown: the
    policy follows the engine's property dependencies, finds nothing wrong in the rendered
    stack, and still finds a GPU route table taken off the endpoint."""
    unknown = lambda r: [k for k in NETWORK_IDS.get(r.typ, []) if k in r.props]  # noqa: E731
    ok = _policy_resources(records(stack), unknown, edit=_unknown_subnet_selectors)
    assert _run_stack_policy("gpu-subnets-s3-gateway-endpoint", ok) == []
    broken = _policy_resources(_endpoint_route_table(records(stack)), unknown, edit=_unknown_subnet_selectors)
    assert any("not on the S3 Gateway endpoint" in m for m, _ in
               _run_stack_policy("gpu-subnets-s3-gateway-endpoint", broken))


def test_preview_unknown_trust_of_the_import_role_is_deferred_but_a_broad_write_still_fails():
    """In a preview of a new cluster the import role's trust is unknown: its import tags stand
    in, so its confined write passes, and a write beyond its prefix fails all the same."""
    def unknown_trust(rs):
        for r in of_type(rs, *policies.ROLE_TYPES):
            if (r.props.get("tags") or {}).get("warmstart:purpose") == "weights-import":
                r.props["assumeRolePolicy"] = policies.UNKNOWN
        return rs
    assert check("irsa-no-model-bucket-write").fn(unknown_trust(records("dev"))) == []
    found = check("irsa-no-model-bucket-write").fn(unknown_trust(_import_write(_whole_bucket)(records("dev"))))
    assert any("beyond what the weights import" in v.message for v in found)


@pytest.mark.parametrize("pattern, prefix, reaches", [
    ("arn:aws:s3:::b/p/*", "arn:aws:s3:::b/", True), ("arn:aws:s3:::*", "arn:aws:s3:::b/", True),
    ("*", "arn:aws:s3:::b/", True), ("arn:aws:s3:::b?/*", "arn:aws:s3:::b/", True),  # "b//key"
    ("arn:aws:s3:::c/*", "arn:aws:s3:::b/", False),
    ("arn:aws:s3:::b-other/*", "arn:aws:s3:::b/", False), ("arn:aws:s3:::b", "arn:aws:s3:::b/", False),
    ("arn:aws:s3:::?/x", "arn:aws:s3:::b/", True),
])
def test_a_resource_pattern_reaches_objects_under_a_prefix(pattern, prefix, reaches):
    from warmstart.policies import iam as iam_checks
    assert iam_checks._may_match_under(pattern, prefix) is reaches


def test_preview_unknown_trust_policy_is_deferred_not_failed():
    role = _irsa_role(records("dev"))
    assert _run_resource_policy("irsa-trust-pinned", role, dict(role.props) | {"assumeRolePolicy": UNKNOWN_STRING_VALUE}) == []


def test_policy_pack_runs_in_the_programs_virtualenv():
    def venv(project_file: Path) -> Path:
        doc = yaml.safe_load(project_file.read_text())
        return (project_file.parent / doc["runtime"]["options"]["virtualenv"]).resolve()
    assert venv(ROOT / "policy" / "PulumiPolicy.yaml") == venv(ROOT / "Pulumi.yaml")
    main = (ROOT / "policy" / "__main__.py").read_text()
    assert "policies_for_pack()" in main and "PolicyPack(" in main


# --------------------------------------------------------------------------------------
# The pack as the Pulumi CLI drives it: policy/__main__.py served over gRPC


@pytest.fixture(scope="module")
def analyzer():
    """Start the pack the way the CLI does (it prints its port) and connect an Analyzer client."""
    import subprocess
    import sys

    import grpc
    from pulumi.runtime.proto import analyzer_pb2_grpc

    proc = subprocess.Popen([sys.executable, str(ROOT / "policy" / "__main__.py")], cwd=ROOT / "policy",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline().strip())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _wire(r: Resource, urn: str):
    from google.protobuf import json_format, struct_pb2
    from pulumi.runtime.proto import analyzer_pb2

    props = json_format.ParseDict(json.loads(json.dumps(dict(r.props))), struct_pb2.Struct())
    return analyzer_pb2.AnalyzerResource(type=r.typ, properties=props, urn=urn, name=r.name)


def _analyze_stack(stub, rs: list[Resource]):
    from pulumi.runtime.proto import analyzer_pb2

    req = analyzer_pb2.AnalyzeStackRequest(resources=[_wire(r, f"urn:pulumi:s::warmstart::{r.typ}::{r.name}")
                                                      for r in rs])
    return list(stub.AnalyzeStack(req).diagnostics)


def test_served_pack_lists_every_policy_at_its_level(analyzer):
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import analyzer_pb2

    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == policy_pack.PACK_NAME
    assert {p.name for p in info.policies} == {c.name for c in policies.CHECKS}
    assert {p.name: p.enforcementLevel for p in info.policies} == {
        c.name: analyzer_pb2.ADVISORY if c.name in ADVISORY else analyzer_pb2.MANDATORY for c in policies.CHECKS}


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_served_pack_passes_the_rendered_stack_on_the_wire(analyzer, stack):
    """Properties cross the wire as protobuf Structs (numbers become doubles), as in a real run."""
    from pulumi.runtime.proto import analyzer_pb2

    rs = records(stack)
    assert [d.message for d in _analyze_stack(analyzer, rs)] == []
    for r in rs:
        req = analyzer_pb2.AnalyzeRequest(type=r.typ, properties=_wire(r, "u").properties, urn="u", name=r.name)
        assert [d.message for d in analyzer.Analyze(req).diagnostics] == []


def test_served_pack_blocks_a_broken_stack(analyzer):
    from pulumi.runtime.proto import analyzer_pb2

    found = _analyze_stack(analyzer, _versioning_suspended(records("prod")))
    assert [(d.policyName, d.enforcementLevel) for d in found] == [("s3-bucket-guardrails", analyzer_pb2.MANDATORY)]
    assert "is not versioned" in found[0].message and "::aws:s3/bucket:Bucket::" in found[0].urn
    dep = _deployment(_gpu_count(records("prod")))
    req = analyzer_pb2.AnalyzeRequest(type=dep.typ, properties=_wire(dep, "u").properties, urn="u", name=dep.name)
    assert {d.policyName for d in analyzer.Analyze(req).diagnostics} == {"vllm-gpu-request-equals-tp"}
