"""The providers a component builds for itself: one Kubernetes provider factory, so each
component given a kubeconfig gets the same provider under the same name (its URN is part of the
contract with existing state)."""

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s


def kubernetes_provider(name: str, kubeconfig: pulumi.Input[str],
                        opts: Optional[pulumi.ResourceOptions] = None) -> k8s.Provider:
    """The Kubernetes provider of component `name` for the cluster of `kubeconfig`, named
    `<name>-k8s` (every component's has been), with `opts` (its parent: the component)."""
    return k8s.Provider(f"{name}-k8s", kubeconfig=kubeconfig, opts=opts)
