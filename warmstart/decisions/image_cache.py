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


def is_docker_hub(image: str) -> bool:
    """Whether an image reference names Docker Hub: no registry host before its first `/`
    (a host has a `.` or `:`, or is `localhost`), as the container runtimes read it."""
    first, sep, _ = image.partition("/")
    return not sep or not ("." in first or ":" in first or first == "localhost")


def cached_image(image: str, account_id: str, region: str) -> str:
    """The image's reference through the pull-through cache; images elsewhere are unchanged.
    Docker Hub official images (`ubuntu:24.04`) live under `library/`."""
    if not is_docker_hub(image):
        return image
    name = image if "/" in image.split("@")[0].split(":")[0] else f"library/{image}"
    return f"{account_id}.dkr.ecr.{region}.amazonaws.com/{DOCKER_HUB_PREFIX}/{name}"


def node_pull_through_policy(partition: str, region: str, account_id: str) -> dict[str, Any]:
    """What GPU nodes need to pull an image through the cache for the first time: import it and
    create its repository, on the cached repositories only."""
    return {"Version": "2012-10-17", "Statement": [{
        "Sid": "PullThroughDockerHub", "Effect": "Allow", "Action": list(PULL_THROUGH_ACTIONS),
        "Resource": f"arn:{partition}:ecr:{region}:{account_id}:repository/{DOCKER_HUB_PREFIX}/*"}]}
