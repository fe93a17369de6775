"""GPU instance facts, read from a data table (warmstart/data/gpu_instances.csv).

Accelerator knowledge lives in the table, not in branches on instance names: a new
instance type is a new row.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources

GIB = 1024**3
MIB = 1024**2
GB = 1000**3


@dataclass(frozen=True)
class GpuInstance:
    """One EC2 GPU instance type."""

    instance_type: str
    family: str
    gpu_model: str
    gpu_count: int
    gpu_memory_mib: int
    """Usable memory per GPU as EC2 reports it, in MiB."""
    nvme_total_gb: int
    """Total local NVMe instance store, in decimal GB (EC2 TotalSizeInGB); 0 when none."""
    vcpu: int
    memory_gib: int
    gpu_name_label: str
    """Lower-kebab GPU name used by the node labels (`h100`, `l40s`, ...)."""
    network_baseline_gbps: float
    auto_mode_supported: bool

    @property
    def gpu_memory_bytes(self) -> int:
        return self.gpu_memory_mib * MIB

    @property
    def nvme_total_bytes(self) -> int:
        return self.nvme_total_gb * GB


def _row(r: dict[str, str]) -> GpuInstance:
    return GpuInstance(
        instance_type=r["instance_type"],
        family=r["family"],
        gpu_model=r["gpu_model"],
        gpu_count=int(r["gpu_count"]),
        gpu_memory_mib=int(r["gpu_mem_per_gpu_mib"]),
        nvme_total_gb=int(r["nvme_total_gb"] or 0),
        vcpu=int(r["vcpu"]),
        memory_gib=int(r["memory_gib"]),
        gpu_name_label=r["karpenter_gpu_name_label"],
        network_baseline_gbps=float(r["network_baseline_gbps"]),
        auto_mode_supported=r["eks_auto_mode_supported_family"] == "yes",
    )


@cache
def catalog() -> dict[str, GpuInstance]:
    """All known GPU instance types, keyed by instance type."""
    text = resources.files("warmstart.data").joinpath("gpu_instances.csv").read_text()
    rows = csv.DictReader(text.splitlines())
    return {r["instance_type"]: _row(r) for r in rows}


class UnknownInstanceType(LookupError):
    def __init__(self, instance_type: str) -> None:
        self.instance_type = instance_type
        self.known = sorted(catalog())
        super().__init__(
            f"unknown GPU instance type {instance_type!r}; known: {', '.join(self.known)}"
        )


def lookup(instance_type: str) -> GpuInstance:
    """The facts for one instance type, or UnknownInstanceType listing the known ones."""
    try:
        return catalog()[instance_type]
    except KeyError:
        raise UnknownInstanceType(instance_type) from None
