"""The optional ECR pull-through cache for Docker Hub images (pure).

With `imageCache.ecrPullThrough`, a pull-through cache rule in the stack's account and region
mirrors Docker Hub (`registry-1.docker.io`) under the repository prefix `docker-hub`, and every
model image that lives on Docker Hub (`vllm/vllm-openai:...`) is pulled as
`<account>.dkr.ecr.<region>.amazonaws.com/docker-hub/<repository>:<tag>` instead: the first pull
of a tag imports it into ECR, later pulls in the region come from ECR, next to the nodes, free of
Docker Hub's rate limits. Docker Hub rules need a Secrets Manager secret named
`ecr-pullthroughcache/...` with the Docker Hub credentials
(https://docs.aws.amazon.com/AmazonECR/latest/userguide/pull-through-cache-creating-rule.html), and
the nodes' role needs `ecr:BatchImportUpstreamImage` and `ecr:CreateRepository` on the cached
repositories for a first pull (https://docs.aws.amazon.com/AmazonECR/latest/userguide/pull-through-cache-iam.html).
"""

from __future__ import annotations

from typing import Any

DOCKER_HUB_PREFIX = "docker-hub"
DOCKER_HUB_URL = "registry-1.docker.io"
# The two actions a first pull through the cache takes beyond a plain pull.
PULL_THROUGH_ACTIONS = ("ecr:BatchImportUpstreamImage", "ecr:CreateRepository")


# Host names that are Docker Hub itself when written out (`docker.io/lightseekorg/smg:1.13.0`): the
# runtimes' default registry (https://github.com/distribution/reference/blob/v0.6.0/normalize.go,
# `legacyDefaultDomain`, `defaultDomain`).
DOCKER_HUB_HOSTS = ("docker.io", "index.docker.io", "registry-1.docker.io")


def _hub_path(image: str) -> str | None:
    """The repository path of a Docker Hub image (`vllm/vllm-openai:v0.33.0`), None elsewhere: a
    first component with a `.` or `:`, or `localhost`, is another registry's host."""
    first, sep, rest = image.partition("/")
    if not sep:
        return image
    if first in DOCKER_HUB_HOSTS:
        return rest
    return None if ("." in first or ":" in first or first == "localhost") else image


def is_docker_hub(image: str) -> bool:
    """Whether an image reference names Docker Hub, as the container runtimes read it."""
    return _hub_path(image) is not None


def cached_image(image: str, account_id: str, region: str) -> str:
    """The image's reference through the pull-through cache; images elsewhere are unchanged.
    Docker Hub official images (`ubuntu:24.04`) live under `library/`."""
    path = _hub_path(image)
    if path is None:
        return image
    name = path if "/" in path.split("@")[0].split(":")[0] else f"library/{path}"
    return f"{account_id}.dkr.ecr.{region}.amazonaws.com/{DOCKER_HUB_PREFIX}/{name}"


def is_cached(image: str, account_id: str, region: str) -> bool:
    """Whether `image` is a reference through this account's pull-through cache (its first pull
    imports it, so the pulling node's role needs `PULL_THROUGH_ACTIONS`)."""
    return image.startswith(f"{account_id}.dkr.ecr.{region}.amazonaws.com/{DOCKER_HUB_PREFIX}/")


def same_cache(image: str, like: str) -> str:
    """`image` through the pull-through cache that `like` comes through, or unchanged when `like`
    is not a cached reference: a helper image (the node cache's copier) follows the model's."""
    prefix, sep, _ = like.partition(f"/{DOCKER_HUB_PREFIX}/")
    host = prefix.split(".")
    if not sep or len(host) < 6 or host[1:3] != ["dkr", "ecr"]:
        return image
    return cached_image(image, host[0], host[3])


def node_pull_through_policy(partition: str, region: str, account_id: str) -> dict[str, Any]:
    """What a node needs to pull an image through the cache for the first time: import it and
    create its repository, on the cached repositories only. Every node role whose nodes can be
    the first to pull a cached image gets it: the GPU nodes (models, staging, pre-pull) and the
    non-GPU nodes (the weights import Job runs the model's image; the routers)."""
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": "PullThroughDockerHub", "Effect": "Allow", "Action": list(PULL_THROUGH_ACTIONS),
        "Resource": f"arn:{partition}:ecr:{region}:{account_id}:repository/{DOCKER_HUB_PREFIX}/*"}]}
