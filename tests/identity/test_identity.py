"""ModelRole and ModelImportRole alone, from their own Args under Pulumi mocks: the trust is
pinned to one ServiceAccount, and the permissions are what each role needs and no more (judged
by evaluating requests, tests/support/policy_eval.py)."""

from __future__ import annotations

from typing import Any

import components
from tests.support.policy_eval import allowed, statements
from tests.support.stacks import policy_json
from warmstart import mocks

ISSUER = "oidc.eks.us-east-1.amazonaws.com/id/ABCDEF"
BASE = {"model_name": "llama", "source": "s3://team-models/meta-llama/Llama-3.1-8B", "namespace": "ml",
        "oidc_provider_arn": f"arn:aws:iam::{mocks.FAKE_ACCOUNT}:oidc-provider/{ISSUER}",
        "oidc_issuer": f"https://{ISSUER}", "name_prefix": "team", "region": "us-east-1"}
WEIGHTS = "arn:aws:s3:::team-models/meta-llama/Llama-3.1-8B/model.safetensors"


def _role(component: type, **args: Any) -> tuple[dict, dict]:
    """The (trust policy, permissions policy) of the one role the component registers."""
    resources = mocks.run(lambda: component("llama", BASE | args), region="us-east-1", stack="alone")
    (role,) = [r for r in resources if r.typ == "aws:iam/role:Role"]
    (policy,) = [r for r in resources if r.typ == "aws:iam/rolePolicy:RolePolicy"]
    return policy_json(role.inputs["assumeRolePolicy"]), policy_json(policy.inputs["policy"])


def _subjects(trust: dict) -> list[str]:
    (st,) = statements(trust)
    return [v for cond in st["Condition"].values() for k, v in cond.items() if k.endswith(":sub")]


def test_a_model_role_is_assumed_by_the_models_service_account_and_only_reads_its_weights():
    trust, policy = _role(components.ModelRole)
    assert _subjects(trust) == ["system:serviceaccount:ml:llama"]
    assert allowed(policy, "s3:GetObject", WEIGHTS)
    assert not allowed(policy, "s3:PutObject", WEIGHTS)
    assert not allowed(policy, "s3:GetObject", "arn:aws:s3:::team-models/another/model.safetensors")


def test_a_model_role_reads_and_writes_its_own_compile_cache_prefix_only_when_given_a_bucket():
    _, without = _role(components.ModelRole)
    _, with_cache = _role(components.ModelRole, compile_cache_bucket="team-cache")
    assert not allowed(without, "s3:PutObject", "arn:aws:s3:::team-cache/llama/key.tar.gz")
    assert allowed(with_cache, "s3:PutObject", "arn:aws:s3:::team-cache/llama/key.tar.gz")
    assert not allowed(with_cache, "s3:PutObject", "arn:aws:s3:::team-cache/other/key.tar.gz")


def test_an_import_role_is_the_import_jobs_and_writes_but_never_deletes_the_models_prefix():
    trust, policy = _role(components.ModelImportRole, import_s3="s3://team-imports/llama")
    assert _subjects(trust) == ["system:serviceaccount:ml:llama-import"]
    assert allowed(policy, "s3:PutObject", WEIGHTS)
    assert not allowed(policy, "s3:DeleteObject", WEIGHTS)
    assert allowed(policy, "s3:GetObject", "arn:aws:s3:::team-imports/llama/config.json")
    assert not allowed(policy, "s3:PutObject", "arn:aws:s3:::team-imports/llama/config.json")
