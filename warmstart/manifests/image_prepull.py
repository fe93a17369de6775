"""The image pre-pull DaemonSet of a model whose weights are not staged on the nodes (pure).

A staged model's staging DaemonSet (manifests/node_cache.py) already runs the model's image on
every node of its pool. A model that streams from S3 gets this one instead: one idle pod of the
model's own image per node of its pool, so the image is on every node before the Deployment
rolls (pulumi-kubernetes awaits a DaemonSet's rollout, https://github.com/pulumi/pulumi-kubernetes/pull/2953,
and the Deployment depends on it), and a new node pulls it as soon as it joins rather than when
a serving pod lands there. A pre-pull DaemonSet is the one way to pre-stage existing nodes for a
rollout in both cluster modes (Auto Mode's node configuration is not open to image-cache
tooling; https://docs.aws.amazon.com/eks/latest/userguide/auto-configure-nodes.html).
"""

from __future__ import annotations

from typing import Any

from ..decisions import placement
from ..plan.records import ServingPlan
from . import network_policy
from .serving import ANNOTATION_DOMAIN, IMAGE_PULL_POLICY, container_security_context, pod_security_context

CONTAINER = "image-hold"
# The image's own interpreter waits for SIGTERM: no extra image, nothing to pull but the model's.
HOLD_COMMAND = ["python3", "-c", "import signal; signal.pause()"]


# How long `pulumi up` waits for the pre-pull DaemonSet's rollout: every node of the pool has
# pulled the image (an image of tens of GB over a node's link, on a pool of many nodes).
ROLLOUT_TIMEOUT_SECONDS = 1800

def name(model: str, pool: str) -> str:
    return f"{model}-image-{pool}"


def labels(model: str, pool: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "warmstart-image-prepull", "app.kubernetes.io/instance": model,
            "app.kubernetes.io/component": "image-prepull", "app.kubernetes.io/part-of": "warmstart",
            f"{ANNOTATION_DOMAIN}/pool": pool}


def daemonset_spec(m: ServingPlan, namespace: Any) -> dict[str, Any]:
    """One idle pod of `m.image` on every node of the model's pool."""
    assert m.pool is not None, "a pre-pull DaemonSet needs the model's NodePool"
    pod_labels = labels(m.name, m.pool)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name(m.name, m.pool), "namespace": namespace, "labels": pod_labels,
                     # The rollout ends once every node of the pool has pulled the image.
                     "annotations": {"pulumi.com/timeoutSeconds": str(ROLLOUT_TIMEOUT_SECONDS)}},
        "spec": {
            "selector": {"matchLabels": pod_labels},
            # Every node pulls at once: each pull is independent of the others.
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "nodeSelector": {placement.NODEPOOL_LABEL: m.pool,
                                     placement.INSTANCE_TYPE_LABEL: m.instance.instance_type},
                    "tolerations": [{"key": placement.GPU_TAINT_KEY, "operator": "Exists",
                                     "effect": placement.GPU_TAINT_EFFECT}],
                    "containers": [{
                        "name": CONTAINER,
                        "image": m.image,
                        "imagePullPolicy": IMAGE_PULL_POLICY,
                        "command": HOLD_COMMAND,
                        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                      "limits": {"cpu": "100m", "memory": "64Mi"}},
                        "securityContext": container_security_context(),
                    }],
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": pod_security_context(),
                },
            },
        },
    }


def network_policy_spec(m: ServingPlan, namespace: Any) -> dict[str, Any]:
    """The pre-pull pods neither accept nor send anything."""
    assert m.pool is not None
    return network_policy.deny_all_network_policy(name(m.name, m.pool), namespace, labels(m.name, m.pool),
                                                  labels(m.name, m.pool))
