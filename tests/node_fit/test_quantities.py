"""Kubernetes quantity parsing
(https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/)."""

from __future__ import annotations

import pytest

from warmstart.decisions.node_fit import parse_cpu, parse_memory


@pytest.mark.parametrize(("text", "millis"), [
    ("500m", 500), ("1", 1000), ("1.5", 1500), ("0.1", 100), ("2", 2000), (".5", 500),
    ("250m", 250), ("1500m", 1500), ("0.0001", 1), ("1k", 1_000_000), (1, 1000), (0.25, 250),
    ("100u", 1),  # rounded up to a whole millicore, as the API server does
])
def test_cpu(text, millis):
    assert parse_cpu(text) == millis


@pytest.mark.parametrize(("text", "mib"), [
    ("512Mi", 512), ("1Gi", 1024), ("1000Mi", 1000), ("100Mi", 100), ("2Ti", 2 * 1024 * 1024),
    ("100M", 96),            # 100e6 bytes = 95.37 MiB, rounded up
    ("1G", 954),             # 1e9 bytes = 953.67 MiB
    ("128974848", 123),      # bytes: 123 MiB exactly
    (128974849, 124),        # one byte more rounds up
    (1, 1), (0, 0), ("1Ki", 1), ("1024Ki", 1), ("1025Ki", 2), ("1e9", 954), ("0.5Gi", 512),
])
def test_memory(text, mib):
    assert parse_memory(text) == mib


@pytest.mark.parametrize("bad", ["", "abc", "1.5.2", "10 Mi", "1mi", "1MB", "-1", "Mi", True])
def test_malformed_quantities_are_value_errors(bad):
    with pytest.raises(ValueError):
        parse_memory(bad)
    with pytest.raises(ValueError):
        parse_cpu(bad)


def test_pod_requests_sum_containers_and_take_the_largest_init_container():
    from warmstart.decisions.node_fit import pod_requests

    # aws-node as the VPC CNI manifest has it: init 25m, two containers 25m each -> 50m.
    aws_node = {"initContainers": [{"name": "init", "resources": {"requests": {"cpu": "25m"}}}],
                "containers": [{"name": "aws-node", "resources": {"requests": {"cpu": "25m"}}},
                               {"name": "aws-eks-nodeagent", "resources": {"requests": {"cpu": "25m"}}}]}
    assert pod_requests(aws_node) == (50, 0)
    # A big init container wins over the app containers, per resource.
    spec = {"initContainers": [{"resources": {"requests": {"cpu": "2", "memory": "10Mi"}}}],
            "containers": [{"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}, {"name": "no-requests"}]}
    assert pod_requests(spec) == (2000, 1024)
    # A sidecar (restartPolicy Always) adds to the app containers and to later init containers.
    spec = {"initContainers": [{"restartPolicy": "Always", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
                               {"resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}],
            "containers": [{"resources": {"requests": {"cpu": "200m", "memory": "256Mi"}}}]}
    assert pod_requests(spec) == (1100, 320)
    assert pod_requests({}) == (0, 0)
