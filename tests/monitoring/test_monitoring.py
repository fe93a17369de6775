"""The Monitoring component alone, from its own Args under Pulumi mocks: the managed collector and
workspace (or an existing endpoint), KEDA with its IRSA role on non-GPU nodes, and the Args it
refuses naming the key. (Its schema is checked with ModelAutoscaling's, tests/autoscaling/.)"""

from __future__ import annotations

import json
import re

import pytest
import yaml

import components.monitoring as monitoring_component
from tests.support.platforms import PLATFORM
from warmstart import config, mocks, versions
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.plan import platform as contract
from warmstart.decisions import placement
from warmstart.manifests import autoscaling as objects

REGION = "us-east-1"
OIDC_ISSUER = "oidc.eks.us-east-1.amazonaws.com/id/ABCDEF"
OIDC_ARN = f"arn:aws:iam::{mocks.FAKE_ACCOUNT}:oidc-provider/{OIDC_ISSUER}"


def _amp_synthesizers(monkeypatch):
    """The outputs AWS computes for AMP resources, in their documented forms
    (https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-collector-how-to.html)."""
    extra = {
        "aws:amp/workspace:Workspace": lambda n, i, r: {
            "arn": f"arn:aws:aps:{r}:{mocks.FAKE_ACCOUNT}:workspace/ws-{n}",
            "prometheusEndpoint": f"https://aps-workspaces.{r}.amazonaws.com/workspaces/ws-{n}/"},
        "aws:amp/scraper:Scraper": lambda n, i, r: {
            "arn": f"arn:aws:aps:{r}:{mocks.FAKE_ACCOUNT}:scraper/s-{n}",
            "roleArn": f"arn:aws:iam::{mocks.FAKE_ACCOUNT}:role/aws-service-role/scraper.aps.amazonaws.com/"
                       f"AWSServiceRoleForAmazonPrometheusScraper_{n}"},
    }
    monkeypatch.setattr(mocks, "SYNTHESIZERS", mocks.SYNTHESIZERS | extra)


def _monitoring(monkeypatch, drop=(), **overrides):
    _amp_synthesizers(monkeypatch)
    args = monitoring_component.MonitoringArgs(
        cluster_name="ws-dev", cluster_mode=monitoring_component.ClusterMode.AUTO, region=REGION, name_prefix="ws-dev",
        oidc_provider_arn=OIDC_ARN, oidc_issuer=OIDC_ISSUER, namespaces=["inference"],
        cluster_arn=f"arn:aws:eks:{REGION}:{mocks.FAKE_ACCOUNT}:cluster/ws-dev",
        subnet_ids=["subnet-b", "subnet-a"], security_group_ids=["sg-1"], kubeconfig="{}") | overrides
    args = {k: v for k, v in args.items() if k not in drop}
    built = {}
    resources = mocks.run(lambda: built.setdefault("m", monitoring_component.Monitoring("mon", args)),
                          region=REGION, stack="alone")
    return built["m"], resources


def _one(resources, typ):
    found = [r for r in resources if r.typ == typ]
    assert len(found) == 1, (typ, [r.name for r in found])
    return found[0]


def test_monitoring_keda_role_is_irsa_for_keda_operator_and_queries_one_workspace(monkeypatch):
    _, rs = _monitoring(monkeypatch)
    workspace = _one(rs, "aws:amp/workspace:Workspace")
    ws_arn = mocks.SYNTHESIZERS["aws:amp/workspace:Workspace"](workspace.name, workspace.inputs, REGION)["arn"]
    role = _one(rs, "aws:iam/role:Role")
    (trust,) = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
    assert trust["Principal"] == {"Federated": OIDC_ARN} and trust["Action"] == "sts:AssumeRoleWithWebIdentity"
    assert trust["Condition"] == {"StringEquals": {f"{OIDC_ISSUER}:sub": "system:serviceaccount:keda:keda-operator",
                                                   f"{OIDC_ISSUER}:aud": "sts.amazonaws.com"}}
    policy = _one(rs, "aws:iam/rolePolicy:RolePolicy")
    (stmt,) = json.loads(policy.inputs["policy"])["Statement"]
    assert stmt == {"Sid": "QueryOneWorkspace", "Effect": "Allow", "Resource": ws_arn,
                    "Action": ["aps:GetLabels", "aps:GetMetricMetadata", "aps:GetSeries", "aps:QueryMetrics"]}
    assert not [r for r in rs if r.typ in ("aws:iam/rolePolicyAttachment:RolePolicyAttachment", "aws:iam/policy:Policy")]
    scraper = _one(rs, "aws:amp/scraper:Scraper")
    assert scraper.inputs["destination"] == {"amp": {"workspaceArn": ws_arn}}
    assert scraper.inputs["source"]["eks"]["subnetIds"] == ["subnet-a", "subnet-b"]
    assert yaml.safe_load(scraper.inputs["scrapeConfiguration"]) == objects.scrape_configuration(["inference"], router=False)
    assert workspace.inputs["tags"]["AMPAgentlessScraper"] == ""


def test_monitoring_installs_the_pinned_chart_on_non_gpu_nodes_with_the_role(monkeypatch):
    _, rs = _monitoring(monkeypatch)
    release = _one(rs, "kubernetes:helm.sh/v3:Release")
    assert (release.inputs["chart"], release.inputs["version"], release.inputs["repositoryOpts"]["repo"]) == \
        ("keda", versions.KEDA_CHART_VERSION, "https://kedacore.github.io/charts")
    values = release.inputs["values"]
    assert values["nodeSelector"] == {placement.NODEPOOL_LABEL: placement.GENERAL_PURPOSE_POOL}
    role = _one(rs, "aws:iam/role:Role")
    assert values["podIdentity"]["aws"]["irsa"]["roleArn"] == f"arn:aws:iam::{mocks.FAKE_ACCOUNT}:role/{role.inputs['name']}"
    ns = _one(rs, "kubernetes:core/v1:Namespace")
    assert ns.inputs["metadata"]["name"] == release.inputs["namespace"] == "keda"
    assert ns.urn in release.dependencies


def test_monitoring_leaves_the_access_entry_to_amp_and_refuses_a_second_one(monkeypatch):
    _, rs = _monitoring(monkeypatch)
    assert not [r for r in rs if r.typ == "aws:eks/accessEntry:AccessEntry" or r.typ.startswith("kubernetes:rbac")]
    with pytest.raises(Exception, match=r"MonitoringArgs\.scraperAccessEntry.*one entry per principal"):
        _monitoring(monkeypatch, scraper_access_entry=True)


def test_monitoring_with_an_existing_endpoint_creates_no_aws_resource(monkeypatch):
    m, rs = _monitoring(monkeypatch, monitoring={"prometheus_url": "http://prometheus-operated.monitoring.svc:9090/"},
                        cluster_mode=monitoring_component.ClusterMode.KARPENTER)
    assert not [r for r in rs if r.typ.startswith("aws:")]
    values = _one(rs, "kubernetes:helm.sh/v3:Release").inputs["values"]
    assert "podIdentity" not in values
    # Karpenter mode too: warmstart's own elastic CPU pool, never the controller's system group.
    assert values["nodeSelector"] == {placement.NODEPOOL_LABEL: placement.GENERAL_PURPOSE_POOL}


@pytest.mark.parametrize("overrides, drop, key", [
    ({"monitoring": {"prometheus_url": "http://p:9090/api/v1/query"}}, (), "MonitoringArgs.monitoring.prometheusUrl"),
    ({"monitoring": {"prometheus_url": "prometheus:9090"}}, (), "MonitoringArgs.monitoring.prometheusUrl"),
    ({"namespaces": []}, (), "MonitoringArgs.namespaces"),
    ({}, ("cluster_arn",), "MonitoringArgs.clusterArn"),
])
def test_monitoring_bad_args_name_the_key(monkeypatch, overrides, drop, key):
    with pytest.raises(Exception, match=re.escape(key)):
        _monitoring(monkeypatch, drop=drop, **overrides)


def _comparable(resources):
    """Each registered resource by URN with its inputs, for comparing two runs."""
    return {r.urn: (r.typ, json.dumps(r.inputs, sort_keys=True, default=str)) for r in resources}


@pytest.mark.parametrize("prometheus_url", [None, "http://prometheus-operated.monitoring.svc:9090"])
def test_a_keda_of_the_users_own_is_neither_installed_nor_namespaced_and_the_rest_is_unchanged(monkeypatch,
                                                                                                prometheus_url):
    given = {"prometheus_url": prometheus_url} if prometheus_url else {}
    m, ours = _monitoring(monkeypatch, monitoring=given)
    theirs_m, theirs = _monitoring(monkeypatch, monitoring=given | {"keda": {"create": False}})
    assert theirs_m.keda is None and m.keda is not None
    gone = {u: t for u, (t, _) in _comparable(ours).items() if u not in _comparable(theirs)}
    assert sorted(gone.values()) == ["kubernetes:core/v1:Namespace", "kubernetes:helm.sh/v3:Release"]
    # Everything else (workspace, collector, the query role) exactly as with warmstart's KEDA.
    assert {u: v for u, v in _comparable(ours).items() if u not in gone} == _comparable(theirs)


def test_the_query_role_trusts_the_users_keda_operator(monkeypatch):
    _, rs = _monitoring(monkeypatch, monitoring={"keda": {"create": False, "namespace": "autoscaling",
                                                          "operator_service_account": "keda-op"}})
    (trust,) = json.loads(_one(rs, "aws:iam/role:Role").inputs["assumeRolePolicy"])["Statement"]
    assert trust["Condition"]["StringEquals"][f"{OIDC_ISSUER}:sub"] == "system:serviceaccount:autoscaling:keda-op"


def test_warmstarts_keda_in_another_namespace(monkeypatch):
    _, rs = _monitoring(monkeypatch, monitoring={"keda": {"namespace": "autoscaling",
                                                          "operator_service_account": "keda-op"}})
    release, ns = _one(rs, "kubernetes:helm.sh/v3:Release"), _one(rs, "kubernetes:core/v1:Namespace")
    assert ns.inputs["metadata"]["name"] == release.inputs["namespace"] == "autoscaling"
    assert release.inputs["values"]["serviceAccount"]["operator"]["name"] == "keda-op"
    (trust,) = json.loads(_one(rs, "aws:iam/role:Role").inputs["assumeRolePolicy"])["Statement"]
    assert trust["Condition"]["StringEquals"][f"{OIDC_ISSUER}:sub"] == "system:serviceaccount:autoscaling:keda-op"


@pytest.mark.parametrize("keda, key", [
    ({"namespace": "Not_A_Name"}, "MonitoringArgs.monitoring.keda.namespace"),
    ({"operator_service_account": ""}, "MonitoringArgs.monitoring.keda.operatorServiceAccount"),
    ({"create": "sometimes"}, "MonitoringArgs.monitoring.keda.create"),
    ({"crate": False}, "MonitoringArgs.monitoring.keda.crate"),
])
def test_bad_keda_args_are_refused_as_the_config_refuses_them_under_the_nested_key(monkeypatch, keda, key):
    with pytest.raises(ConfigErrors) as err:
        _monitoring(monkeypatch, monitoring={"keda": keda})
    assert [e.key for e in err.value.errors] == [key]
    # The same words as a stack file's `monitoring.keda` gets: one rule, the config model's.
    with pytest.raises(ConfigErrors) as stack_err:
        config.parse_spec(config.MonitoringConfig, {"keda": keda}, "warmstart:monitoring.")
    assert [e.rule for e in err.value.errors] == [e.rule for e in stack_err.value.errors]


def test_the_sections_defaults_are_the_configs(monkeypatch):
    _, rs = _monitoring(monkeypatch)
    d = config.KedaConfig()
    release, ns = _one(rs, "kubernetes:helm.sh/v3:Release"), _one(rs, "kubernetes:core/v1:Namespace")
    assert ns.inputs["metadata"]["name"] == release.inputs["namespace"] == d.namespace
    assert release.inputs["values"]["serviceAccount"]["operator"]["name"] == d.operator_service_account


def test_the_flat_prometheus_url_of_before_is_the_sections_with_a_warning(monkeypatch):
    import pulumi

    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda msg, resource=None, **_: warned.append(msg))
    url = "http://prometheus-operated.monitoring.svc:9090"
    nested_m, nested = _monitoring(monkeypatch, monitoring={"prometheus_url": url})
    assert warned == []
    flat_m, flat = _monitoring(monkeypatch, prometheus_url=url)
    assert _comparable(flat) == _comparable(nested) and len(warned) == 1 and "prometheusUrl" in warned[0]
    with pytest.raises(ConfigError, match=r"MonitoringArgs\.prometheusUrl"):
        _monitoring(monkeypatch, prometheus_url=url, monitoring={"keda": {"create": False}})


@pytest.mark.parametrize("section", [
    {},
    {"prometheus_url": "http://prometheus-operated.monitoring.svc:9090",
     "scraper": {"namespace": "monitoring", "pod_labels": {"app.kubernetes.io/name": "prometheus"}},
     "keda": {"namespace": "autoscaling"}},
])
def test_the_platforms_monitoring_facts_are_the_sections(monkeypatch, section):
    """What a platform's models read of the monitoring (PlatformArgs.monitoring) comes from the
    same section the component deployed from: the endpoint KEDA queries, who scrapes, where KEDA
    runs."""
    m, _ = _monitoring(monkeypatch, monitoring=section)
    given = config.MonitoringConfig.model_validate(section)
    facts = m.platform_monitoring
    assert facts["managed_scraper"] == (given.prometheus_url is None) == ("region" in facts)
    assert facts["keda_namespace"] == given.keda.namespace
    assert [(s["namespace"], s["pod_labels"]) for s in facts["scraper_pods"]] == (
        [(given.scraper.namespace, dict(given.scraper.pod_labels))] if given.scraper else [])
    contract.from_args(PLATFORM | {"monitoring": facts | {"server_address": "https://p.example"}}, "k")
