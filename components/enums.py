"""Choices several components share, as enums so every Pulumi language sees their values."""

from enum import Enum


class ClusterMode(str, Enum):
    """Who runs the cluster's GPU nodes."""

    AUTO = "auto"
    """EKS Auto Mode: EKS runs the nodes, the device plugin and the node lifecycle."""
    KARPENTER = "karpenter"
    """Self-managed Karpenter on a small managed system node group."""


class NvmeCheckMode(str, Enum):
    """What a serving pod's start-up check does when the compile cache is not on local NVMe."""

    WARN = "warn"
    """Log it and start anyway (slower, on EBS)."""
    FAIL = "fail"
    """Stop the pod with the reason, so it never silently runs from EBS."""


def mode_value(value: object) -> str:
    """The plain value of an enum member, or of a string a Python caller passed."""
    return value.value if isinstance(value, Enum) else str(value)
