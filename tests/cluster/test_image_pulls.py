"""Who may pull what, over the whole render of every stack (issue 20).

Every image a pod runs (workloads and the Helm releases' pods), the registry it comes from, and
the node role of the nodes it is pinned to: a role may pull what its nodes run, and no node pulls
an image through the ECR pull-through cache without the right to import it (its first pull
creates the repository and imports the image:
https://docs.aws.amazon.com/AmazonECR/latest/userguide/pull-through-cache-iam.html).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support import cluster, renders
from tests.support.renders import platform_of
from tests.support.stacks import (
    ALL_STACK_NAMES,
    load_stack_doc,
    policy_json,
    render_doc,
    render_stack,
)
from warmstart import render
from warmstart.decisions import image_cache

ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
ECR = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com/")
# The managed policies that let a node pull from a private ECR repository
# (https://docs.aws.amazon.com/AmazonECR/latest/userguide/ECR_on_EKS.html).
PULL_POLICIES = ("AmazonEC2ContainerRegistryPullOnly", "AmazonEC2ContainerRegistryReadOnly")
# The node role pulumi-eks creates for Auto Mode's built-in pools carries the policies EKS
# documents for it, AmazonEKSWorkerNodeMinimalPolicy and AmazonEC2ContainerRegistryPullOnly
# (https://docs.aws.amazon.com/eks/latest/userguide/auto-learn-iam.html#auto-learn-node-iam-role);
# it is not in the render (pulumi-eks's own child), so its attachments are taken from there.
AUTO_MODE_NODE_ROLE_POLICIES = ("AmazonEKSWorkerNodeMinimalPolicy", "AmazonEC2ContainerRegistryPullOnly")
ACCOUNT = "123456789012"


@dataclass(frozen=True)
class Pull:
    pod: str
    image: str
    role: str


def _roles_by_group(r: render.Rendered) -> dict[str, str]:
    """The node role of each group of nodes a pod can land on (tests/support/cluster.py): `system`
    (the managed node group), a NodePool by `pool:<name>` (its node class's role), and Auto Mode's
    built-in pools (the cluster's Auto Mode node role)."""
    out: dict[str, str] = {}
    for cls in r.kind("EC2NodeClass") + r.kind("NodeClass"):
        out[f"pool:{cls['metadata']['name']}"] = cls["spec"]["role"]
    for g in r.of_type("aws:eks/nodeGroup:NodeGroup"):
        out["system"] = str(g.inputs["nodeRoleArn"]).rsplit("/", 1)[-1]
    for c in r.of_type("eks:index:Cluster"):
        if c.inputs.get("autoMode"):
            for pool in ("general-purpose", "system"):
                out[f"pool:{pool}"] = f"{c.inputs['name']}-auto-node"  # pulumi-eks's autoModeNodeRoleName (the mocks answer it)
    return out


def pulls(r: render.Rendered) -> list[Pull]:
    """Every (pod, image, pulling node role) of the render, for every group of the platform's
    nodes the pod can be scheduled on."""
    platform = platform_of(r) or r
    nodes = renders.cluster_from(platform.stack_plan.stack, platform)
    roles = _roles_by_group(platform)

    def where(pod: cluster.Pod) -> list[str]:
        return sorted({roles.get(n.group, "?") for n in nodes.where(pod)}) or ["?"]
    out = []
    for o in r.kubernetes_objects:
        if o["kind"] not in ("Deployment", "DaemonSet", "Job"):
            continue
        spec = o["spec"]["template"]["spec"]
        for role in where(cluster.object_pods([o])[0]):
            for c in spec.get("initContainers", []) + spec.get("containers", []):
                out.append(Pull(f"{o['kind']} {o['metadata']['name']}", c["image"], role))
    for rel in r.of_type("kubernetes:helm.sh/v3:Release"):
        values = rel.inputs.get("values") or {}
        image = (values.get("controller") or {}).get("image")
        pods = cluster.release_pods([rel])
        if isinstance(image, dict) and pods:
            for role in where(pods[0]):
                out.append(Pull(f"Release {rel.inputs.get('name')}", f"{image['repository']}:{image['tag']}", role))
    return out


def _grants(r: render.Rendered) -> dict[str, set[str]]:
    """Per role name: its managed policies' names and the actions of its inline policies."""
    out: dict[str, set[str]] = {}
    for a in r.of_type(ATTACHMENT):
        out.setdefault(str(a.inputs["role"]), set()).add(str(a.inputs["policyArn"]).rsplit("/", 1)[-1])
    for p in r.of_type(ROLE_POLICY):
        for stmt in policy_json(p.inputs["policy"])["Statement"]:
            actions = stmt["Action"] if isinstance(stmt["Action"], list) else [stmt["Action"]]
            out.setdefault(str(p.inputs["role"]), set()).update(actions)
    for role in _roles_by_group(r).values():
        if role.endswith("-auto-node"):
            out.setdefault(role, set()).update(AUTO_MODE_NODE_ROLE_POLICIES)
    return out


def problems(r: render.Rendered) -> list[str]:
    grants = _grants((platform_of(r) or r))
    out = []
    for p in pulls(r):
        have = grants.get(p.role, set())
        if p.role == "?":
            out.append(f"{p.pod}: {p.image} runs on nodes whose role the render does not name")
            continue
        if ECR.match(p.image) and not have & set(PULL_POLICIES):
            out.append(f"{p.pod}: {p.image} is in ECR, and node role {p.role} may not pull from ECR")
        m = ECR.match(p.image)
        if m and image_cache.is_cached(p.image, m.group(1), m.group(2)):
            missing = set(image_cache.PULL_THROUGH_ACTIONS) - have
            if missing:
                out.append(f"{p.pod}: {p.image} comes through the pull-through cache, and node role {p.role} "
                           f"lacks {sorted(missing)} for its first pull")
    return out


def _ecr_stack(tmp_path, base: str, **extra: Any) -> render.Rendered:
    doc = load_stack_doc(base)
    region = doc["config"]["warmstart:region"]
    doc["config"]["warmstart:accountId"] = ACCOUNT
    doc["config"]["warmstart:imageCache"] = {"ecrPullThrough": {
        "credentialArn": f"arn:aws:secretsmanager:{region}:{ACCOUNT}:secret:ecr-pullthroughcache/docker-hub-AbCdEf"}}
    for m in doc["config"].get("warmstart:models", []):
        m.update(extra)
    return render_doc(doc, tmp_path, stack=f"ecr-{base}")


@pytest.mark.parametrize("stack", ALL_STACK_NAMES)
def test_every_node_role_may_pull_what_its_nodes_run(stack):
    assert problems(render_stack(stack)) == []


@pytest.mark.parametrize("base", ["prod", "dev"])
def test_with_the_pull_through_cache_every_first_puller_may_import(tmp_path, base):
    # dev imports from the Hub on a non-GPU node; prod's second model gets an S3 import and staging.
    extra = {} if base == "dev" else {"import": {"s3": "s3://upstream-models/m"}}
    r = _ecr_stack(tmp_path, base, **extra)
    cached = [p for p in pulls(r) if image_cache.is_cached(p.image, ACCOUNT, r.stack_plan.config.region)]
    assert {p.pod.split()[0] for p in cached} >= {"Job", "Deployment"}, cached
    assert problems(r) == []
    # Nothing comes from Docker Hub itself any more (the node cache's copier follows the model image).
    assert not [p.image for p in pulls(r) if image_cache.is_docker_hub(p.image)]


def test_a_role_without_import_rights_is_caught(tmp_path):
    r = copy.deepcopy(_ecr_stack(tmp_path, "dev"))
    r.resources = [res for res in r.resources
                   if not (res.typ == ROLE_POLICY and res.inputs.get("name") == "warmstart-pull-through"
                           and str(res.inputs["role"]).endswith("-auto-node"))]
    found = problems(r)
    assert found and all("lacks ['ecr:BatchImportUpstreamImage', 'ecr:CreateRepository']" in f for f in found)
    assert any(f.startswith("Job llama-3-1-8b-import-") for f in found), found
