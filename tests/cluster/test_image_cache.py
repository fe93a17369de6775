"""The optional ECR pull-through cache of Docker Hub (warmstart/decisions/image_cache.py)."""

from __future__ import annotations

import json

import pytest

from tests.support.stacks import load_stack_doc, render_doc
from warmstart import config, mocks, policies
from warmstart.decisions import image_cache
from warmstart.errors import ConfigErrors

ACCOUNT = "123456789012"
SECRET = f"arn:aws:secretsmanager:us-west-2:{ACCOUNT}:secret:ecr-pullthroughcache/docker-hub-AbCdEf"


@pytest.mark.parametrize("image, cached", [
    ("vllm/vllm-openai:v0.33.0", f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/docker-hub/vllm/vllm-openai:v0.33.0"),
    ("vllm/vllm-openai@sha256:" + "a" * 64,
     f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/docker-hub/vllm/vllm-openai@sha256:" + "a" * 64),
    # Docker Hub official images live under library/.
    ("ubuntu:24.04", f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/docker-hub/library/ubuntu:24.04"),
    # Other registries are left alone.
    ("public.ecr.aws/neuron/vllm:1.0", "public.ecr.aws/neuron/vllm:1.0"),
    ("localhost:5000/vllm:1", "localhost:5000/vllm:1"),
    ("ghcr.io/org/vllm:1", "ghcr.io/org/vllm:1"),
])
def test_only_docker_hub_images_go_through_the_cache(image, cached):
    assert image_cache.cached_image(image, ACCOUNT, "us-west-2") == cached


def _cached_dev(tmp_path, **extra):
    doc = load_stack_doc("dev")
    doc["config"]["warmstart:imageCache"] = {"ecrPullThrough": {"credentialArn": SECRET}}
    doc["config"].update(extra)
    return render_doc(doc, tmp_path, stack="cached")


def test_the_rule_the_node_permissions_and_every_model_image(tmp_path):
    r = _cached_dev(tmp_path, **{"warmstart:accountId": ACCOUNT})
    (rule,) = r.of_type("aws:ecr/pullThroughCacheRule:PullThroughCacheRule")
    assert rule.inputs == {"ecrRepositoryPrefix": "docker-hub", "upstreamRegistryUrl": "registry-1.docker.io",
                           "credentialArn": SECRET}
    (access,) = [p for p in r.of_type("aws:iam/rolePolicy:RolePolicy") if p.name.endswith("gpu-node-pull-through")]
    (stmt,) = json.loads(access.inputs["policy"])["Statement"]
    assert sorted(stmt["Action"]) == ["ecr:BatchImportUpstreamImage", "ecr:CreateRepository"]
    assert stmt["Resource"] == f"arn:aws:ecr:us-west-2:{ACCOUNT}:repository/docker-hub/*"
    # It is the GPU nodes' role that pulls.
    (node_role,) = [x for x in r.of_type("aws:iam/role:Role") if x.inputs["name"].endswith("-gpu-node")]
    assert access.inputs["role"] == node_role.inputs["name"]
    model_images = set()
    for obj in r.kubernetes_objects:
        spec = obj.get("spec", {}).get("template", {}).get("spec") if isinstance(obj.get("spec"), dict) else None
        for c in (spec or {}).get("containers", []) + (spec or {}).get("initContainers", []):
            if "vllm" in c["image"]:
                model_images.add(c["image"])
    assert model_images == {f"{ACCOUNT}.dkr.ecr.us-west-2.amazonaws.com/docker-hub/vllm/vllm-openai:v0.33.0"}
    assert r.stack_plan.models[0].image in model_images
    assert [str(v) for v in policies.run_all(mocks.policy_records(r.resources, "us-west-2"))] == []


def test_the_cache_needs_the_account(tmp_path):
    with pytest.raises(ConfigErrors) as err:
        _cached_dev(tmp_path)
    assert [e.key for e in err.value.errors] == ["warmstart:imageCache.ecrPullThrough"]


def test_the_secret_must_be_a_pull_through_cache_secret():
    with pytest.raises(ConfigErrors) as err:
        config.parse_config({"clusterMode": "auto", "region": "us-west-2",
                             "gpuPools": [{"name": "l40s", "instanceTypes": ["g6e.2xlarge"]}],
                             "imageCache": {"ecrPullThrough": {
                                 "credentialArn": f"arn:aws:secretsmanager:us-west-2:{ACCOUNT}:secret:dockerhub"}}})
    assert any(e.key == "warmstart:imageCache.ecrPullThrough.credentialArn" for e in err.value.errors)


def test_an_image_from_a_registry_the_cache_does_not_serve_gets_a_note(tmp_path):
    """Issue 24: an nvcr.io image with imageCache on was silently pulled uncached."""
    from warmstart import render

    doc = load_stack_doc("dev")
    doc["config"]["warmstart:imageCache"] = {"ecrPullThrough": {"credentialArn": SECRET}}
    doc["config"]["warmstart:accountId"] = ACCOUNT
    models = doc["config"]["warmstart:models"]
    models[0]["image"] = "nvcr.io/nvidia/vllm:25.09-py3"
    r = render_doc(doc, tmp_path, stack="ngc")
    text = render.table(r.stack_plan)
    (note,) = [line for line in text.splitlines() if "caches Docker Hub images only" in line]
    assert "nvcr.io/nvidia/vllm:25.09-py3" in note and "(from nvcr.io)" in note and "fix:" in note
    # Docker Hub images alone: no such note.
    (tmp_path / "hub").mkdir()
    assert "caches Docker Hub images only" not in render.table(_cached_dev(tmp_path / "hub", **{"warmstart:accountId": ACCOUNT}).stack_plan)


def test_the_cache_rule_and_node_permissions_keep_their_state_where_they_moved(tmp_path):
    """The rule (now ServingPlatform's) and the nodes' import permissions (now Cluster's) were the
    stack's own children: each answers to its URN from then, so `up` updates, never replaces."""
    r = _cached_dev(tmp_path, **{"warmstart:accountId": ACCOUNT})
    root = "urn:pulumi:cached::warmstart::warmstart:index:Stack$"
    was = {f"{root}aws:ecr/pullThroughCacheRule:PullThroughCacheRule::warmstart-docker-hub-cache",
           f"{root}aws:iam/rolePolicy:RolePolicy::warmstart-gpu-node-pull-through",
           f"{root}aws:iam/rolePolicy:RolePolicy::warmstart-system-node-pull-through"}
    answers = {a for x in r.resources for a in (x.urn, *x.aliases)}
    assert was <= answers, sorted(was - answers)
    (rule,) = r.of_type("aws:ecr/pullThroughCacheRule:PullThroughCacheRule")
    assert "warmstart:index:ServingPlatform$" in rule.urn
