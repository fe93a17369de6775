"""The ConfigMap that carries one pod-side script into a namespace.

The stack ships each script once per namespace for all its models; a VllmModel used alone
ships its own copies. The object is built by `warmstart.manifests.pod_scripts` (pure).
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from warmstart.manifests.pod_scripts import config_map_spec


class PodScript(pulumi.ComponentResource):
    """One ConfigMap carrying one pod-side script's built artifact (not hosted on its own)."""

    config_map: k8s.core.v1.ConfigMap

    def __init__(self, name: str, namespace: pulumi.Input[str], config_map_name: str, script_key: str,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warmstart:serving:PodScript", name, None, opts)
        spec = config_map_spec(config_map_name, namespace, script_key)
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-script", metadata=spec["metadata"], binary_data=spec["binaryData"],
            opts=pulumi.ResourceOptions(parent=self))
        self.register_outputs({})
