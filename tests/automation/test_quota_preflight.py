"""The quota preflight (warmstart/automation/quotas.py) against a local stand-in of the Service
Quotas API: a real boto3 client whose calls a botocore Stubber answers, checked against the
service model botocore ships (moto does not serve GetServiceQuota for EC2's vCPU quotas), and
through `warmstart.cli.main` with only the prerequisites and the engine faked.

Each case: enough quota, short quota (exit 4, the quota's name, value, need and the exact
increase request, no engine call), no permission to read it (a warning; the engine runs)."""

from __future__ import annotations

import copy
import os
from typing import Any

import boto3
import pytest
import yaml
from botocore.stub import Stubber

from tests.support.stacks import STACKS_DIR, load_stack_doc
from warmstart import automation, cli, config, render
from warmstart.automation import preflight, quotas
from warmstart.decisions import capacity, gpu_pools, instances, node_fit
from warmstart.exit_codes import EXIT_OK, EXIT_QUOTA
from warmstart.plan import stack as plan

P_ON_DEMAND, G_ON_DEMAND, P_SPOT, G_SPOT = "L-417A185B", "L-DB2E81BA", "L-7212CCBC", "L-3819A6DF"
STANDARD = capacity.STANDARD_ON_DEMAND_CODE
NAMES = {P_ON_DEMAND: "Running On-Demand P instances", G_ON_DEMAND: "Running On-Demand G and VT instances",
         P_SPOT: "All P Spot Instance Requests", G_SPOT: "All G and VT Spot Instance Requests",
         STANDARD: capacity.STANDARD_ON_DEMAND_NAME}


def _client() -> Any:
    return boto3.client("service-quotas", region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def _quota(code: str, value: float) -> dict:
    return {"Quota": {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                      "QuotaCode": code, "QuotaName": NAMES[code], "Value": value, "Unit": "None",
                      "Adjustable": True, "GlobalQuota": False}}


def _expect(stub: Stubber, code: str, value: float | None = None, error: str | None = None) -> None:
    params = {"ServiceCode": "ec2", "QuotaCode": code}
    if error:
        stub.add_client_error("get_service_quota", service_error_code=error, service_message="denied by test",
                              http_status_code=400, expected_params=params)
    else:
        stub.add_response("get_service_quota", _quota(code, value), params)


def _gpu_needs(p: Any, unlisted: tuple[str, ...] = ()) -> list[capacity.QuotaNeed]:
    """The GPU pools' needs (the non-GPU nodes' Standard quota apart)."""
    return [n for n in quotas.stack_needs(p, unlisted) if n.code != STANDARD]


def _plan(stack: str) -> plan.StackPlan:
    return render.load_plan(STACKS_DIR, stack)[1]


# --------------------------------------------------------------------------------------
# What the pools need


def test_prod_needs_its_p5_nodes_at_their_limits_in_on_demand_p_vcpus():
    p = _plan("prod")
    (need,) = _gpu_needs(p)
    assert (need.code, need.name) == (P_ON_DEMAND, NAMES[P_ON_DEMAND])
    (pool,) = p.cluster.pools
    # Every model at maxReplicas plus a surge pod, and the warm spare, in whole nodes.
    models = [m for m in p.models if m.pool == pool.name]
    nodes = sum(gpu_pools.nodes_for(gpu_pools.PoolModel(m.instance, m.tensor_parallel_size, m.max_replicas),
                                    m.max_replicas + gpu_pools.SURGE_PODS) for m in models) + pool.warm_nodes
    assert need.vcpus == nodes * instances.lookup("p5.48xlarge").vcpu


def test_dev_checks_its_g6e_quota():
    (need,) = _gpu_needs(_plan("dev"))
    assert need.code == G_ON_DEMAND and "g6e.2xlarge" in need.pools[0]


def test_a_spot_pool_with_fallback_needs_both_quotas_and_reserved_counts_as_on_demand():
    values = {"clusterMode": "karpenter", "region": "us-east-1", "gpuPools": [
        {"name": "l40s", "instanceTypes": ["g6e.12xlarge"], "capacity": {"types": ["spot", "onDemand"]}},
        {"name": "h100", "instanceTypes": ["p5.48xlarge"],
         "capacity": {"types": ["reserved"], "reservations": [{"id": "cr-0123456789abcdef0"}]}}],
        "models": [{"name": "a", "source": "org/a", "weightsGiB": 15, "pool": "l40s", "replicas": 2}]}
    needs = {n.code: n for n in _gpu_needs(plan.plan_stack(config.parse_config(values), "t"))}
    assert set(needs) == {G_ON_DEMAND, G_SPOT, P_ON_DEMAND}
    assert needs[G_ON_DEMAND].vcpus == needs[G_SPOT].vcpus
    assert needs[P_ON_DEMAND].vcpus == instances.lookup("p5.48xlarge").vcpu  # no model: one node of the pool


# --------------------------------------------------------------------------------------
# The three cases, against the stubbed API


def test_enough_quota_passes():
    p = _plan("prod")
    (need,) = _gpu_needs(p)
    client = _client()
    with Stubber(client) as stub:
        _expect(stub, STANDARD, 10000.0)  # the CPU pool and system nodes (sorted first)
        _expect(stub, P_ON_DEMAND, need.vcpus)
        report = quotas.check_quotas(p, client)
        stub.assert_no_pending_responses()
    assert not report.short
    line = report.passed_line()
    print(line)
    assert f"Running On-Demand P instances (L-417A185B) {need.vcpus} vCPUs >= {need.vcpus} needed" in line
    # The shipped placeholder id is named, with what happens meanwhile and the fix.
    (warning,) = report.warnings
    print(warning)
    assert f"warmstart:gpuPools[0].capacity.reservations[0].id is the placeholder {capacity.PLACEHOLDER_RESERVATION_ID}" \
        in warning and "launch as on-demand instead" in warning and "describe-capacity-reservations" in warning


def test_short_quota_names_the_quota_its_value_the_need_and_the_request():
    p = _plan("prod")
    (need,) = _gpu_needs(p)
    client = _client()
    with Stubber(client) as stub:
        _expect(stub, STANDARD, 10000.0)  # the CPU pool and system nodes (sorted first)
        _expect(stub, P_ON_DEMAND, 192.0)
        report = quotas.check_quotas(p, client)
    (short,) = report.short
    msg = str(quotas.QuotaShortFailed("up", "prod", report.short))
    print(msg)
    assert f'"Running On-Demand P instances" (L-417A185B) in us-east-1 is 192 vCPUs' in msg
    assert f"need {need.vcpus} at their limits (h100 (4 x p5.48xlarge))" in msg
    assert (f"`aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-417A185B "
            f"--desired-value {need.vcpus} --region us-east-1`") in msg


def test_no_permission_to_read_quotas_is_a_warning():
    p = _plan("dev")
    client = _client()
    with Stubber(client) as stub:
        _expect(stub, G_ON_DEMAND, error="AccessDeniedException")
        report = quotas.check_quotas(p, client)
    assert not report.short and not report.checked
    (warning,) = report.warnings
    print(warning)
    assert 'could not check EC2 quota "Running On-Demand G and VT instances" (L-DB2E81BA) in us-west-2' in warning
    assert "servicequotas:GetServiceQuota" in warning and "get-service-quota --service-code ec2" in warning


def test_an_unapplied_quota_is_read_as_its_aws_default():
    p = _plan("dev")
    (need,) = _gpu_needs(p)
    client = _client()
    with Stubber(client) as stub:
        _expect(stub, G_ON_DEMAND, error="NoSuchResourceException")
        stub.add_response("get_aws_default_service_quota", _quota(G_ON_DEMAND, 0.0),
                          {"ServiceCode": "ec2", "QuotaCode": G_ON_DEMAND})
        report = quotas.check_quotas(p, client)
    (short,) = report.short
    assert (short.value, short.need) == (0.0, need.vcpus)


# --------------------------------------------------------------------------------------
# Through the command: before any engine call


@pytest.fixture
def project(tmp_path, monkeypatch):
    """The shipped dev stack (its model imports, so the weights preflight reads nothing) in a
    project in tmp_path, prerequisites and engine faked, Service Quotas stubbed."""
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks").mkdir()
    doc = copy.deepcopy(load_stack_doc("dev"))
    doc["config"]["warmstart:accountId"] = "111122223333"  # no account step
    (tmp_path / "stacks" / "Pulumi.dev.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setattr(preflight, "caller_account", lambda region: None)
    monkeypatch.setattr(automation.prerequisites, "check_prerequisites", lambda request, env=None: (object(), []))
    calls: list[str] = []
    monkeypatch.setattr(automation.engine, "open_stack", lambda request, cmd: calls.append("open_stack") or object())
    monkeypatch.setattr(automation.engine, "run_engine",
                        lambda request, stack, say, say_err: calls.append("run_engine") or automation.Outcome("succeeded", EXIT_OK))
    client = _client()
    stub = Stubber(client)
    stub.activate()
    monkeypatch.setattr(quotas, "quotas_client", lambda region: client)
    yield stub, calls
    stub.deactivate()


@pytest.mark.parametrize("op", ["preview", "up"])
def test_short_quota_exits_4_before_any_engine_call(op, project, capsys, tmp_path):
    stub, calls = project
    _expect(stub, G_ON_DEMAND, 8.0)
    summary = tmp_path / "summary.json"
    rc = cli.main([op, "--stack", "dev", "--summary", str(summary)])
    err = capsys.readouterr().err
    print(err)
    assert rc == EXIT_QUOTA == 4 and calls == []
    assert f"warmstart: cannot run `{op}` on stack 'dev': 1 EC2 vCPU quota is below what the GPU pools need" in err
    assert "--quota-code L-DB2E81BA --desired-value 16 --region us-west-2" in err
    import json

    doc = json.loads(summary.read_text())
    assert (doc["result"], doc["exitCode"]) == ("quota-short", 4)
    assert doc["quotaShort"] == [{"code": G_ON_DEMAND, "name": NAMES[G_ON_DEMAND], "value": 8.0, "need": 16,
                                  "request": capacity.increase_command(G_ON_DEMAND, 16, "us-west-2")}]


def test_enough_quota_reaches_the_engine(project, capsys):
    stub, calls = project
    _expect(stub, G_ON_DEMAND, 64.0)
    assert cli.main(["up", "--stack", "dev"]) == EXIT_OK
    out = capsys.readouterr().out
    print(out)
    assert "quota preflight passed: Running On-Demand G and VT instances (L-DB2E81BA) 64 vCPUs >= 16 needed" in out
    assert calls == ["open_stack", "run_engine"]


def test_no_permission_warns_and_reaches_the_engine(project, capsys):
    stub, calls = project
    _expect(stub, G_ON_DEMAND, error="AccessDeniedException")
    assert cli.main(["up", "--stack", "dev"]) == EXIT_OK
    err = capsys.readouterr().err
    print(err)
    assert "warmstart: warning: could not check EC2 quota" in err and calls == ["open_stack", "run_engine"]


def test_skip_preflight_skips_the_quotas_too(project, capsys):
    stub, calls = project  # no response queued: a call would fail the stub
    assert cli.main(["up", "--stack", "dev", "--skip-preflight"]) == EXIT_OK
    assert calls == ["open_stack", "run_engine"]


def test_no_answer_warns_once_and_names_what_was_not_checked():
    values = {"clusterMode": "karpenter", "region": "us-east-1", "gpuPools": [
        {"name": "l40s", "instanceTypes": ["g6e.12xlarge"], "capacity": {"types": ["spot", "onDemand"]}}],
        "models": [{"name": "a", "source": "org/a", "weightsGiB": 15, "pool": "l40s", "replicas": 2,
                    "import": {"s3": "s3://src-bucket/a"}}]}
    p = plan.plan_stack(config.parse_config(values), "t")
    client = _client()
    with Stubber(client) as stub:
        _expect(stub, STANDARD, 10000.0)  # the CPU pool and system nodes (sorted first)
        _expect(stub, G_SPOT, error="ServiceUnavailableException")  # codes are read in order
        report = quotas.check_quotas(p, client)
        stub.assert_no_pending_responses()
    assert not report.short
    first, rest = report.warnings
    assert 'could not check EC2 quota "All G and VT Spot Instance Requests" (L-3819A6DF)' in first
    assert "Service Quotas did not answer (ServiceUnavailableException" in first
    assert rest.startswith('not checked either: "Running On-Demand G and VT instances" (L-DB2E81BA')


# --------------------------------------------------------------------------------------
# A pool kept for model stacks, and a model stack: counted at the GPU limit / maxReplicas


def _readme_quota(stack: str) -> tuple[str, int]:
    """The quota code and vCPUs the README's table says a shipped stack needs."""
    import re

    text = (STACKS_DIR.parent / "README.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith(f"  | `{stack}`"))
    code, vcpus = re.search(r"(L-[0-9A-F]{8}): (\d+) vCPUs", row).groups()
    return code, int(vcpus)


def test_staging_checks_its_pool_at_its_gpu_limit_as_the_readme_says():
    # No inline model: the pool's maxGpus (4 x g6e.2xlarge, kept for its model stacks) bounds it.
    p = _plan("staging")
    (need,) = _gpu_needs(p)
    (pool,) = p.cluster.pools
    assert need.vcpus == pool.max_gpus // pool.instances[0].gpu_count * pool.instances[0].vcpu
    assert (need.code, need.vcpus) == _readme_quota("staging")


def test_a_model_stack_checks_its_platform_pool_for_its_own_max_replicas_plus_a_surge_pod():
    p = _plan("staging-llama-3-1-8b")
    (need,) = _gpu_needs(p)
    m = p.model
    nodes = gpu_pools.nodes_for(gpu_pools.PoolModel(m.instance, m.tensor_parallel_size, m.max_replicas),
                                m.max_replicas + gpu_pools.SURGE_PODS)
    assert (need.code, need.vcpus) == (G_ON_DEMAND, nodes * m.instance.vcpu)
    assert "l40s of platform 'staging', for llama-3-1-8b at maxReplicas 3" in need.pools[0]
    client = _client()
    with Stubber(client) as stub:
        _expect(stub, G_ON_DEMAND, 16.0)
        report = quotas.run_quota_preflight(p, client)
        stub.assert_no_pending_responses()
    (short,) = report.short
    assert (short.need, short.region) == (need.vcpus, "us-west-2")


def test_a_pool_with_no_model_counts_its_gpu_limit_not_one_node():
    values = {"clusterMode": "karpenter", "region": "us-east-1", "gpuPools": [
        {"name": "l40s", "instanceTypes": ["g6e.2xlarge", "g6e.12xlarge"], "maxGpus": 8}], "models": []}
    (need,) = _gpu_needs(plan.plan_stack(config.parse_config(values), "t"))
    # At maxGpus 8: 8 x g6e.2xlarge hold 64 vCPUs, 2 x g6e.12xlarge 96, the worst case.
    assert need.vcpus == 96 and need.pools == ("l40s (2 x g6e.12xlarge)",)


# --------------------------------------------------------------------------------------
# The P5 families' spot quota: read by the code the account lists


def _spot_p5_plan() -> plan.StackPlan:
    values = {"clusterMode": "karpenter", "region": "us-east-1", "gpuPools": [
        {"name": "h100", "instanceTypes": ["p5.48xlarge"], "maxGpus": 16, "capacity": {"types": ["spot", "onDemand"]}}],
        "models": []}
    return plan.plan_stack(config.parse_config(values), "t")


def _not_listed(stub: Stubber, code: str) -> None:
    params = {"ServiceCode": "ec2", "QuotaCode": code}
    for op in ("get_service_quota", "get_aws_default_service_quota"):
        stub.add_client_error(op, service_error_code="NoSuchResourceException", service_message="no such quota",
                              http_status_code=400, expected_params=params)


P5_SPOT = "L-C4BD4855"
NAMES[P5_SPOT] = "All P5 Spot Instance Requests"


def test_a_p5_spot_pool_reads_the_p5_spot_quota_where_the_account_lists_it():
    p = _spot_p5_plan()
    client = _client()
    with Stubber(client) as stub:
        _expect(stub, P5_SPOT, 384.0)  # read first: it decides which quota holds the p5 spot nodes
        _expect(stub, STANDARD, 10000.0)  # the CPU pool and system nodes (sorted first)
        _expect(stub, P_ON_DEMAND, 384.0)
        report = quotas.check_quotas(p, client)
        stub.assert_no_pending_responses()
    assert not report.short and not report.warnings
    line = report.passed_line()
    print(line)
    assert "All P5 Spot Instance Requests (L-C4BD4855) 384 vCPUs >= 384 needed" in line


def test_a_p5_spot_pool_reads_the_p_spot_quota_where_the_account_has_no_p5_one_and_says_so():
    p = _spot_p5_plan()
    client = _client()
    with Stubber(client) as stub:
        _not_listed(stub, P5_SPOT)
        _expect(stub, STANDARD, 10000.0)  # the CPU pool and system nodes (sorted first)
        _expect(stub, P_ON_DEMAND, 384.0)
        _expect(stub, P_SPOT, 192.0)
        report = quotas.check_quotas(p, client)
        stub.assert_no_pending_responses()
    (short,) = report.short
    msg = str(quotas.QuotaShortFailed("up", "t", report.short))
    print(msg)
    assert (short.code, short.need, short.instead_of) == (P_SPOT, 384, P5_SPOT)
    assert "(L-7212CCBC) in us-east-1 is 192 vCPUs (read because the account lists no quota L-C4BD4855" in msg


# --------------------------------------------------------------------------------------
# Answers without a value, and credentials that cannot be loaded: warnings, never a traceback


@pytest.mark.parametrize("answer", [{}, {"Quota": {"QuotaCode": G_ON_DEMAND, "QuotaName": NAMES[G_ON_DEMAND]}}],
                         ids=["no-Quota", "no-Value"])
def test_an_answer_without_a_value_is_a_warning_that_names_the_quota(answer):
    p = _plan("dev")
    client = _client()
    params = {"ServiceCode": "ec2", "QuotaCode": G_ON_DEMAND}
    with Stubber(client) as stub:
        stub.add_response("get_service_quota", answer, params)
        stub.add_response("get_aws_default_service_quota", answer, params)
        report = quotas.check_quotas(p, client)
        stub.assert_no_pending_responses()
    assert not report.short and not report.checked
    (warning,) = report.warnings
    print(warning)
    part = "Quota" if not answer else "Value"
    assert (f'could not check EC2 quota "Running On-Demand G and VT instances" (L-DB2E81BA) in us-west-2: Service '
            f"Quotas answered without a {part} for it") in warning and "get-service-quota" in warning


def test_an_applied_answer_without_a_value_falls_back_to_the_aws_default():
    p = _plan("dev")
    client = _client()
    params = {"ServiceCode": "ec2", "QuotaCode": G_ON_DEMAND}
    with Stubber(client) as stub:
        stub.add_response("get_service_quota", {"Quota": {"QuotaCode": G_ON_DEMAND}}, params)
        stub.add_response("get_aws_default_service_quota", _quota(G_ON_DEMAND, 64.0), params)
        report = quotas.check_quotas(p, client)
    assert [v for _, v in report.checked] == [64.0] and not report.warnings


REAL_QUOTAS_CLIENT = quotas.quotas_client


def test_a_stale_aws_profile_is_a_warning_through_up_not_a_traceback(project, capsys, tmp_path, monkeypatch):
    _, calls = project
    monkeypatch.setattr(quotas, "quotas_client", REAL_QUOTAS_CLIENT)  # the deployer's own client
    (tmp_path / "aws-config").write_text("[profile real]\nregion = us-west-2\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_PROFILE", "gone")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    assert cli.main(["up", "--stack", "dev"]) == EXIT_OK
    err = capsys.readouterr().err
    print(err)
    assert "Traceback" not in err and calls == ["open_stack", "run_engine"]
    assert ('warmstart: warning: could not check the EC2 vCPU quotas the GPU pools need ("Running On-Demand G and VT '
            'instances" (L-DB2E81BA, 16 vCPUs)): the AWS credentials could not be loaded (ProfileNotFound') in err
    assert "set AWS_PROFILE to a profile of yours" in err


# --------------------------------------------------------------------------------------
# The EC2 Spot service-linked role (Karpenter-mode spot pools)


def _iam() -> Any:
    return boto3.client("iam", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")


def _spot_values(mode: str, types: list[str]) -> dict:
    return {"clusterMode": mode, "region": "us-east-1", "gpuPools": [
        {"name": "l40s", "instanceTypes": ["g6e.12xlarge"], "capacity": {"types": types}}],
        "models": [{"name": "a", "source": "org/a", "weightsGiB": 15, "pool": "l40s", "replicas": 2,
                    "import": {"s3": "s3://src-bucket/a"}}]}


def _enough_quota(stub: Stubber, p: Any) -> None:
    for need in quotas.stack_needs(p):
        _expect(stub, need.code, float(need.vcpus))


ROLE = {"Role": {"Path": "/aws-service-role/spot.amazonaws.com/", "RoleName": quotas.SPOT_ROLE,
                 "RoleId": "AROAEXAMPLEEXAMPLE123", "Arn": f"arn:aws:iam::111122223333:role/aws-service-role/"
                 f"spot.amazonaws.com/{quotas.SPOT_ROLE}", "CreateDate": "2026-01-01T00:00:00Z"}}


@pytest.mark.parametrize("types", [["spot", "onDemand"], ["spot"]])
def test_a_karpenter_spot_pool_without_the_spot_role_is_refused_with_the_command_that_creates_it(types):
    p = plan.plan_stack(config.parse_config(_spot_values("karpenter", types)), "t")
    sq, iam = _client(), _iam()
    with Stubber(sq) as s1, Stubber(iam) as s2:
        _enough_quota(s1, p)
        s2.add_client_error("get_role", service_error_code="NoSuchEntity", service_message="not found",
                            http_status_code=404, expected_params={"RoleName": "AWSServiceRoleForEC2Spot"})
        report = quotas.run_quota_preflight(p, sq, iam=iam)
        s2.assert_no_pending_responses()
    assert not report.short
    (refused,) = report.refused
    msg = str(quotas.QuotaShortFailed("up", "t", report.short, report.refused))
    print(msg)
    assert "1 other account prerequisite of the GPU pools' nodes is missing" in msg
    assert "no EC2 Spot service-linked role (AWSServiceRoleForEC2Spot)" in refused and "pool(s) 'l40s'" in refused
    assert "`aws iam create-service-linked-role --aws-service-name spot.amazonaws.com`" in refused


def test_the_spot_role_present_passes_and_denied_is_a_warning():
    p = plan.plan_stack(config.parse_config(_spot_values("karpenter", ["spot", "onDemand"])), "t")
    sq, iam = _client(), _iam()
    with Stubber(sq) as s1, Stubber(iam) as s2:
        _enough_quota(s1, p)
        s2.add_response("get_role", ROLE, {"RoleName": quotas.SPOT_ROLE})
        assert not quotas.run_quota_preflight(p, sq, iam=iam).refused
        _enough_quota(s1, p)
        s2.add_client_error("get_role", service_error_code="AccessDenied", http_status_code=403)
        report = quotas.run_quota_preflight(p, sq, iam=iam)
    assert not report.refused
    (warning,) = report.warnings
    assert "could not check the EC2 Spot service-linked role AWSServiceRoleForEC2Spot" in warning
    assert "iam:GetRole" in warning


@pytest.mark.parametrize("mode,types", [("auto", ["spot", "onDemand"]), ("karpenter", ["onDemand"])])
def test_the_spot_role_is_read_only_for_karpenter_pools_that_allow_spot(mode, types):
    p = plan.plan_stack(config.parse_config(_spot_values(mode, types)), "t")
    sq, iam = _client(), _iam()
    with Stubber(sq) as s1, Stubber(iam):  # no IAM response queued: a call would fail the stub
        _enough_quota(s1, p)
        report = quotas.run_quota_preflight(p, sq, iam=iam)
    assert not report.refused and not report.warnings


def test_a_missing_spot_role_exits_4_through_up_before_any_engine_call(project, capsys, tmp_path, monkeypatch):
    stub, calls = project
    doc = copy.deepcopy(load_stack_doc("dev"))
    doc["config"]["warmstart:accountId"] = "111122223333"
    doc["config"]["warmstart:clusterMode"] = "karpenter"
    doc["config"]["warmstart:gpuPools"][0]["capacity"] = {"types": ["spot", "onDemand"]}
    doc["config"]["warmstart:models"][0]["replicas"] = 2
    (tmp_path / "stacks" / "Pulumi.dev.yaml").write_text(yaml.safe_dump(doc))
    for need in quotas.stack_needs(render.load_plan(tmp_path / "stacks", "dev")[1]):
        _expect(stub, need.code, float(need.vcpus))
    iam = _iam()
    with Stubber(iam) as s2:
        s2.add_client_error("get_role", service_error_code="NoSuchEntity", http_status_code=404)
        monkeypatch.setattr(quotas, "iam_client", lambda region: iam)
        rc = cli.main(["up", "--stack", "dev"])
    err = capsys.readouterr().err
    print(err)
    assert rc == EXIT_QUOTA and calls == []
    assert "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com" in err


# --------------------------------------------------------------------------------------
# Reservations read by id


RID = "cr-0123456789abcdef0"
ZONES = {"AvailabilityZones": [{"ZoneName": f"us-east-1{c}", "ZoneId": f"use1-az{n}", "State": "available",
                                "RegionName": "us-east-1", "OptInStatus": "opt-in-not-required"}
                               for c, n in (("a", 6), ("b", 1), ("c", 2), ("d", 4))]}


def _reserved_plan(types: list[str], azs: list[str] | None = None, ids: tuple[str, ...] = (RID,)) -> plan.StackPlan:
    values = {"clusterMode": "karpenter", "region": "us-east-1", "gpuPools": [
        {"name": "h100", "instanceTypes": ["p5.48xlarge"],
         "capacity": {"types": types, "reservations": [{"id": i} for i in ids]}}], "models": []}
    if azs:
        values["network"] = {"availabilityZones": azs}
    return plan.plan_stack(config.parse_config(values), "t")


def _reservation(az: str, az_id: str, state: str = "active", start: Any = None, kind: str = "default",
                 rid: str = RID, itype: str = "p5.48xlarge") -> dict:
    import datetime as dt

    r = {"CapacityReservationId": rid, "InstanceType": itype, "AvailabilityZone": az, "AvailabilityZoneId": az_id,
         "State": state, "ReservationType": kind, "TotalInstanceCount": 2, "AvailableInstanceCount": 2,
         "StartDate": start or dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)}
    return {"CapacityReservations": [r]}


def _ec2_check(p: Any, reservations: list[dict], now: Any = None) -> quotas.QuotaReport:
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    report = quotas.QuotaReport()
    with Stubber(ec2) as stub:
        stub.add_response("describe_availability_zones", ZONES)
        for r in reservations:
            rid = r["CapacityReservations"][0]["CapacityReservationId"]
            stub.add_response("describe_capacity_reservations", r, {"CapacityReservationIds": [rid]})
        quotas.check_reservations(p, ec2, report, now)
        stub.assert_no_pending_responses()
    return report


def test_a_reserved_only_pool_whose_subnets_miss_the_reservations_az_is_refused():
    report = _ec2_check(_reserved_plan(["reserved"], ["us-east-1a", "us-east-1b"]), [_reservation("us-east-1d", "use1-az4")])
    (refused,) = report.refused
    print(refused)
    assert refused.startswith("warmstart:gpuPools[0].capacity.reservations: pool 'h100' launches into its reservations "
                              "only")
    assert (f"reservation {RID} is in us-east-1d (use1-az4), but the GPU nodes' subnets are in us-east-1a, us-east-1b"
            in refused) and "add a private subnet in us-east-1d" in refused and "add onDemand" in refused


def test_the_default_azs_are_the_regions_first_and_a_match_by_zone_id_passes():
    # No pinned AZs: the first azCount (3) available AZs by name, as the network component picks.
    assert not _ec2_check(_reserved_plan(["reserved"]), [_reservation("us-east-1c", "use1-az2")]).refused
    (refused,) = _ec2_check(_reserved_plan(["reserved"]), [_reservation("us-east-1d", "use1-az4")]).refused
    assert "subnets are in us-east-1a, us-east-1b, us-east-1c" in refused


def test_a_capacity_block_that_has_not_started_is_refused_with_its_start():
    import datetime as dt

    now = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.timezone.utc)
    block = _reservation("us-east-1a", "use1-az6", state="scheduled", kind="capacity-block",
                         start=now + dt.timedelta(hours=5))
    (refused,) = _ec2_check(_reserved_plan(["reserved"], ["us-east-1a", "us-east-1b"]), [block], now).refused
    print(refused)
    assert f"Capacity Block {RID} has not started: it starts 2026-12-03T17:00:00+00:00 (in 5.0 h)" in refused


def test_with_a_fallback_an_unusable_reservation_is_a_warning_and_one_usable_reservation_is_enough():
    report = _ec2_check(_reserved_plan(["reserved", "onDemand"], ["us-east-1a", "us-east-1b"]),
                        [_reservation("us-east-1d", "use1-az4")])
    assert not report.refused
    (warning,) = report.warnings
    assert "is in us-east-1d" in warning and "meanwhile its nodes launch as on-demand instead" in warning
    other = "cr-0fedcba9876543210"
    report = _ec2_check(_reserved_plan(["reserved"], ["us-east-1a", "us-east-1b"], ids=(RID, other)),
                        [_reservation("us-east-1d", "use1-az4"), _reservation("us-east-1a", "use1-az6", rid=other)])
    assert not report.refused and "its nodes launch into its other reservations only" in report.warnings[0]


def test_an_existing_vpcs_subnets_are_read_and_a_missing_reservation_is_named():
    values = {"clusterMode": "karpenter", "region": "us-east-1", "network": {
        "vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ["subnet-0aaaaaaaa", "subnet-0bbbbbbbb"],
        "privateRouteTableIds": ["rtb-0aaaaaaaa"]},
        "gpuPools": [{"name": "h100", "instanceTypes": ["p5.48xlarge"],
                      "capacity": {"types": ["reserved"], "reservations": [{"id": RID}]}}], "models": []}
    p = plan.plan_stack(config.parse_config(values), "t")
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
    report = quotas.QuotaReport()
    with Stubber(ec2) as stub:
        stub.add_response("describe_subnets", {"Subnets": [
            {"SubnetId": "subnet-0aaaaaaaa", "AvailabilityZone": "us-east-1a", "AvailabilityZoneId": "use1-az6"},
            {"SubnetId": "subnet-0bbbbbbbb", "AvailabilityZone": "us-east-1b", "AvailabilityZoneId": "use1-az1"}]},
            {"SubnetIds": ["subnet-0aaaaaaaa", "subnet-0bbbbbbbb"]})
        stub.add_client_error("describe_capacity_reservations", service_error_code="InvalidCapacityReservationId.NotFound",
                              http_status_code=400)
        quotas.check_reservations(p, ec2, report)
    (refused,) = report.refused
    assert f"reservation {RID} does not exist in us-east-1 for this account" in refused


def test_the_placeholder_reservation_is_not_read():
    p = _plan("prod")  # its only reservation is the placeholder: warned about, never read
    assert quotas.reservation_pools(p) == []


def test_a_p5_spot_quota_that_cannot_be_read_is_warned_about_once_and_the_rest_still_read():
    p = _spot_p5_plan()
    client = _client()
    with Stubber(client) as stub:
        _expect(stub, P5_SPOT, error="AccessDeniedException")  # asked once
        _expect(stub, STANDARD, 10000.0)  # the CPU pool and system nodes (sorted first)
        _expect(stub, P_ON_DEMAND, 384.0)
        report = quotas.check_quotas(p, client)
        stub.assert_no_pending_responses()
    (warning,) = report.warnings
    assert 'could not check EC2 quota "All P5 Spot Instance Requests" (L-C4BD4855)' in warning
    assert [n.code for n, _ in report.checked] == [STANDARD, P_ON_DEMAND]


def test_a_model_stack_on_a_karpenter_platforms_spot_pool_checks_the_spot_role_and_both_quotas():
    import dataclasses

    p = _plan("staging-llama-3-1-8b")
    pools = tuple(f.model_copy(update={"capacity_types": ["on-demand", "spot"]}) for f in p.contract.pools)
    p = dataclasses.replace(p, contract=dataclasses.replace(p.contract, cluster_mode="karpenter", pools=pools))
    needs = _gpu_needs(p)
    assert {n.code for n in needs} == {G_ON_DEMAND, G_SPOT} and len({n.vcpus for n in needs}) == 1
    assert quotas.spot_pools(p) == ["l40s"]
    sq, iam = _client(), _iam()
    with Stubber(sq) as s1, Stubber(iam) as s2:
        _enough_quota(s1, p)
        s2.add_client_error("get_role", service_error_code="NoSuchEntity", http_status_code=404)
        report = quotas.run_quota_preflight(p, sq, iam=iam)
    assert len(report.refused) == 1 and quotas.SPOT_ROLE_COMMAND in report.refused[0]


# --------------------------------------------------------------------------------------
# The non-GPU nodes: the CPU pool at its CPU limit and the system nodes, on the Standard quota


def test_the_cpu_pool_at_its_cpu_limit_and_the_system_nodes_count_against_the_standard_quota():
    values = {"clusterMode": "karpenter", "region": "us-east-1", "gpuPools": [
        {"name": "l40s", "instanceTypes": ["g6e.2xlarge"], "maxGpus": 2}], "models": []}
    p = plan.plan_stack(config.parse_config(values), "t")
    (standard,) = [n for n in quotas.stack_needs(p) if n.code == STANDARD]
    group = p.cluster.system_node_group
    system = group.size * max(node_fit.node_type(t).vcpu for t in group.instance_types)
    assert standard.vcpus == p.cluster.cpu_pool.cpu_limit + system
    assert any("general-purpose" in w for w in standard.pools) and any("system nodes" in w for w in standard.pools)
    client = _client()
    with Stubber(client) as stub:
        _expect(stub, STANDARD, 32.0)  # a new account's default is low
        _expect(stub, G_ON_DEMAND, 1000.0)
        report = quotas.check_quotas(p, client)
        stub.assert_no_pending_responses()
    (short,) = report.short
    msg = str(quotas.QuotaShortFailed("up", "t", report.short))
    assert short.code == STANDARD and f"--quota-code {STANDARD} --desired-value {standard.vcpus}" in msg, msg


def test_auto_mode_has_no_cpu_pool_limit_to_count():
    values = {"clusterMode": "auto", "region": "us-east-1", "gpuPools": [
        {"name": "l40s", "instanceTypes": ["g6e.2xlarge"]}], "models": []}
    p = plan.plan_stack(config.parse_config(values), "t")
    assert STANDARD not in {n.code for n in quotas.stack_needs(p)}
