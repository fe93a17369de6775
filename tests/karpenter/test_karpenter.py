"""The Karpenter part of a karpenter-mode cluster alone, from its own Args under Pulumi mocks: the
node role with its access entry, the interruption queue, the controller's IRSA role, and the
pinned charts on the cluster's provider, waiting for the cluster and the system nodes."""

from __future__ import annotations

import json

import pulumi
import pulumi_kubernetes as k8s

from components.karpenter import Karpenter, KarpenterArgs
from tests.support.stacks import STACKS_DIR
from warmstart import mocks, render, versions

ISSUER = "oidc.eks.us-west-2.amazonaws.com/id/ABCDEF"


def _karpenter() -> tuple[Karpenter, list[mocks.Registered], str]:
    _, plan = render.load_plan(STACKS_DIR, "prod")  # the shipped karpenter-mode stack
    assert str(plan.cluster.mode) == "karpenter"
    built = {}
    region = plan.config.region

    def program() -> None:
        cluster = pulumi.ComponentResource("test:index:Cluster", "eks")
        system = pulumi.ComponentResource("test:index:SystemNodes", "system")
        provider = k8s.Provider("k8s", kubeconfig="{}")
        built["k"] = Karpenter("karpenter", KarpenterArgs(
            plan=plan.cluster, name_prefix="team", region=region,
            oidc_provider_arn=f"arn:aws:iam::{mocks.FAKE_ACCOUNT}:oidc-provider/{ISSUER}", oidc_issuer=ISSUER,
            kubernetes_provider=provider, system_nodes=system, cluster=cluster))

    return built.get("k"), mocks.run(program, region=region, stack="alone"), region


def test_karpenter_registers_its_roles_queue_and_pinned_charts_on_the_clusters_provider():
    _, resources, _ = _karpenter()
    roles = sorted(r.inputs["name"] for r in resources if r.typ == "aws:iam/role:Role")
    assert roles == ["team-karpenter-controller", "team-karpenter-node"]
    (entry,) = [r for r in resources if r.typ == "aws:eks/accessEntry:AccessEntry"]
    assert entry.inputs["type"] == "EC2_LINUX"
    assert [r for r in resources if r.typ == "aws:sqs/queue:Queue"]
    releases = {r.inputs["chart"]: r for r in resources if r.typ == "kubernetes:helm.sh/v3:Release"}
    assert len(releases) == 3
    (provider,) = [r for r in resources if r.typ == "pulumi:providers:kubernetes"]
    assert all(provider.urn in (r.provider or "") for r in releases.values())
    assert versions.NVIDIA_DEVICE_PLUGIN_REPO in json.dumps([r.inputs for r in releases.values()])


def test_the_controller_role_is_trusted_by_the_controllers_service_account_only():
    _, resources, _ = _karpenter()
    (role,) = [r for r in resources if r.typ == "aws:iam/role:Role" and r.inputs["name"] == "team-karpenter-controller"]
    trust = json.loads(role.inputs["assumeRolePolicy"])
    (st,) = trust["Statement"]
    subjects = [v for cond in st["Condition"].values() for k, v in cond.items() if k.endswith(":sub")]
    assert len(subjects) == 1 and subjects[0].startswith("system:serviceaccount:") and "karpenter" in subjects[0]
