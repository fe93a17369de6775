"""Node allocatable against independent figures: nodeadm's arithmetic done by hand, and the
allocatable Karpenter publishes per instance type."""

from __future__ import annotations

import csv
from importlib import resources

import pytest

from warmstart.decisions import node_fit
from warmstart.decisions.node_fit import Allocatable


def test_m7i_large_by_hand():
    # 3 ENIs x (10 - 1) + 2 = 29 pods; CPU: 6% of 1000m + 1% of 1000m = 60 + 10 = 70m reserved;
    # memory: 11 x 29 + 255 = 574Mi kube-reserved, 100Mi eviction, 8192Mi less ceil(8192 x 0.075) = 615Mi.
    nt = node_fit.node_type("m7i.large")
    assert (nt.vcpu, nt.memory_gib) == (2, 8)
    assert node_fit.max_pods(nt) == 29
    assert node_fit.kube_reserved_cpu_millis(2) == 70
    assert node_fit.kube_reserved_memory_mib(29) == 574
    assert node_fit.node_memory_mib(8) == 8192 - 615
    assert node_fit.allocatable("m7i.large") == Allocatable(cpu_millis=1930, memory_mib=8192 - 615 - 574 - 100, pods=29)


@pytest.mark.parametrize(("vcpu", "reserved"), [
    (1, 60),                      # 6% of the first core
    (2, 70),                      # + 1% of the second
    (4, 80),                      # + 0.5% of cores 3-4 (2 x 5m)
    (8, 90),                      # + 0.25% of 4 more cores (4 x 2.5m)
    (16, 110),                    # + 0.25% of 12 more cores
    (192, 60 + 10 + 10 + 470),    # 188 cores above 4 x 2.5m = 470m
])
def test_cpu_reservation_by_ranges(vcpu, reserved):
    assert node_fit.kube_reserved_cpu_millis(vcpu) == reserved


# Karpenter's published AL2023 resources, "after the instance overhead has been subtracted", with
# its default VM_MEMORY_OVERHEAD_PERCENT:
# https://github.com/aws/karpenter-provider-aws/blob/1d927085dd81a9df9301e613f371dac5b4d16bfe/website/content/en/v1.14/reference/instance-types.md
KARPENTER_PUBLISHED = {
    "m7i.large": (1930, 6903, 29),
    "m7i.xlarge": (3920, 14162, 58),
    "m7i-flex.large": (1930, 6903, 29),
    "m5.large": (1930, 6903, 29),
    "c7i.large": (1930, 3114, 29),
    "r7i.4xlarge": (15890, 118312, 234),
    "p5.48xlarge": (191450, 1938410, 100),
    "g6e.2xlarge": (7910, 59627, 58),
}


@pytest.mark.parametrize("instance_type", sorted(KARPENTER_PUBLISHED))
def test_matches_karpenters_published_allocatable(instance_type):
    assert node_fit.allocatable(instance_type) == Allocatable(*KARPENTER_PUBLISHED[instance_type])


def test_memory_overhead_rounds_up():
    # 4 GiB: 4096 x 0.075 = 307.2 -> 308 MiB of overhead, not 307.
    assert node_fit.node_memory_mib(4) == 4096 - 308


def _rows(name: str) -> list[dict[str, str]]:
    return list(csv.DictReader(resources.files("warmstart.data").joinpath(name).read_text().splitlines()))


def test_system_table_lists_the_families_and_sizes():
    want = {f"{fam}.{size}" for fam in ("m5", "m6i", "m7i", "m7i-flex", "c7i", "r7i")
            for size in ("large", "xlarge", "2xlarge", "4xlarge")}
    assert {r["instance_type"] for r in _rows("node_instances.csv")} == want


def test_every_gpu_type_has_eni_data_and_allocatable():
    gpu = {r["instance_type"] for r in _rows("gpu_instances.csv")}
    assert {r["instance_type"] for r in _rows("gpu_instance_enis.csv")} == gpu
    for t in gpu:
        a = node_fit.allocatable(t)
        nt = node_fit.node_type(t)
        assert 0 < a.cpu_millis < nt.vcpu * 1000
        assert 0 < a.memory_mib < nt.memory_gib * 1024
        assert a.pods >= 10


def test_every_row_names_its_source():
    for name in ("node_instances.csv", "gpu_instance_enis.csv"):
        for r in _rows(name):
            assert "amazon-eks-ami@81fec2e8" in r["source"], (name, r)
    for r in _rows("node_instances.csv"):
        assert r["source"].startswith("ec2-instancetypes-"), r


def test_unknown_instance_type_is_a_value_error_naming_it():
    with pytest.raises(ValueError) as err:
        node_fit.allocatable("m7i.metal-48xl")
    text = str(err.value)
    assert "'m7i.metal-48xl'" in text and "list only" in text and "m7i.large" in text and "p5.48xlarge" in text


def test_managed_node_groups_cap_max_pods():
    # EKS managed node groups: at most 110 pods below 30 vCPUs, 250 above.
    plain, managed = node_fit.allocatable("m7i.4xlarge"), node_fit.allocatable("m7i.4xlarge", managed=True)
    assert (plain.pods, managed.pods) == (234, 110)
    assert (managed.cpu_millis, managed.memory_mib) == (plain.cpu_millis, plain.memory_mib)
    assert node_fit.allocatable("m7i.large", managed=True) == node_fit.allocatable("m7i.large")
    assert node_fit.allocatable("p5.48xlarge", managed=True).pods == 100  # under the 250 ceiling
    assert node_fit.allocatable("g6e.48xlarge", managed=True).pods == 250  # 10 x 49 + 2 = 492 capped
    assert node_fit.managed_node_group_max_pods(29) == 110 and node_fit.managed_node_group_max_pods(30) == 250
