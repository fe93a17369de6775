"""Pod-side scripts (warmstart/podside/*.py) shipped to the serving namespace in ConfigMaps.

The scripts need only the Python standard library (and boto3), so they run in the model's own
vLLM image: no extra image to pull, build or pin.
"""

from __future__ import annotations

import hashlib
from importlib import resources

import pulumi
import pulumi_kubernetes as k8s


def script_source(key: str) -> str:
    """The text of warmstart/podside/<key>."""
    return resources.files("warmstart.podside").joinpath(key).read_text()


def script_digest(key: str) -> str:
    """Short digest of a script, for a pod annotation that rolls pods onto a new version."""
    return hashlib.sha256(script_source(key).encode()).hexdigest()[:16]


class PodScript(pulumi.ComponentResource):
    """One ConfigMap carrying one pod-side script."""

    config_map: k8s.core.v1.ConfigMap

    def __init__(self, name: str, namespace: pulumi.Input[str], config_map_name: str, script_key: str,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warmstart:serving:PodScript", name, None, opts)
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-script",
            metadata={"name": config_map_name, "namespace": namespace,
                      "labels": {"app.kubernetes.io/name": config_map_name, "app.kubernetes.io/part-of": "warmstart",
                                 "app.kubernetes.io/managed-by": "pulumi"}},
            data={script_key: script_source(script_key)},
            opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({})
