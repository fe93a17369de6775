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
from pathlib import Path
from typing import Callable

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pulumi_policy import EnforcementLevel, ResourceValidationPolicy, StackValidationPolicy
from pulumi_policy.policy import PolicyResource, ResourceValidationArgs, StackValidationArgs
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from warmstart import mocks, policies, policy_pack
from warmstart.manifests import serving
from warmstart.config import LoaderTuning
from warmstart.decisions import tuning
from warmstart.decisions.instances import GIB, MIB
from warmstart.policies import Resource
from tests.conftest import ROOT, STACK_NAMES, render_stack

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


def test_pack_has_one_mandatory_policy_per_check():
    pack = policy_pack.policies_for_pack()
    assert [p.name for p in pack] == [c.name for c in policies.CHECKS]
    for p, c in zip(pack, policies.CHECKS):
        assert p.enforcement_level == EnforcementLevel.MANDATORY
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


def test_served_pack_lists_every_policy_as_mandatory(analyzer):
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import analyzer_pb2

    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == policy_pack.PACK_NAME
    assert {p.name for p in info.policies} == {c.name for c in policies.CHECKS}
    assert {p.enforcementLevel for p in info.policies} == {analyzer_pb2.MANDATORY}


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
