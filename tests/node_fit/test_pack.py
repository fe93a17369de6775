"""The packer: hypothesis properties, checked against the inputs (not the packer's own bookkeeping),
and worked examples computed by hand."""

from __future__ import annotations

import dataclasses
import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from warmstart.decisions import node_fit
from warmstart.decisions.node_fit import DaemonDemand, NodeGroup, PodDemand, nodes_needed, pack

SMALL_TYPES = ("m7i.large", "c7i.large", "m5.xlarge", "r7i.large")


def _by_instance(pods: list[PodDemand]) -> dict[str, PodDemand]:
    return {f"{p.name}#{i}": p for p in pods for i in range(1, p.count + 1)}


# --- strategies ----------------------------------------------------------------------------

daemons_st = st.lists(
    st.builds(DaemonDemand, name=st.sampled_from(["ds-a", "ds-b", "ds-c"]),
              cpu_millis=st.integers(0, 300), memory_mib=st.integers(0, 300)),
    max_size=3, unique_by=lambda d: d.name)


@st.composite
def pods_st(draw) -> list[PodDemand]:
    n = draw(st.integers(0, 8))
    out = []
    for i in range(n):
        out.append(PodDemand(
            name=f"p{i}",
            cpu_millis=draw(st.integers(0, 2200)),
            memory_mib=draw(st.integers(0, 4000)),
            count=draw(st.integers(0, 5)),
            spread=draw(st.none() | st.sampled_from(["g1", "g2"])),
            max_per_node=draw(st.none() | st.integers(1, 3)),
        ))
    return out


# --- properties ----------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SMALL_TYPES), st.integers(0, 6), daemons_st, pods_st())
def test_placement_never_exceeds_a_node_and_loses_no_pod(instance_type, nodes, daemons, pods):
    group = NodeGroup("g", instance_type, nodes)
    result = pack(group, daemons, pods)
    alloc = node_fit.allocatable(instance_type)
    instances = _by_instance(pods)
    daemon_of = {f"{d.name}@{i}": d for d in daemons for i in range(nodes)}

    seen: list[str] = []
    assert sorted(result.placed) == list(range(nodes))
    for i, names in result.placed.items():
        demands = [instances.get(n) or daemon_of[n] for n in names]
        assert sum(d.cpu_millis for d in demands) <= alloc.cpu_millis
        assert sum(d.memory_mib for d in demands) <= alloc.memory_mib
        assert len(names) <= alloc.pods
        free = result.free[i]
        assert free.cpu_millis == alloc.cpu_millis - sum(d.cpu_millis for d in demands)
        assert free.memory_mib == alloc.memory_mib - sum(d.memory_mib for d in demands)
        assert free.pods == alloc.pods - len(names)
        for n in names:
            if n in daemon_of:
                assert n.endswith(f"@{i}")  # a daemon's pod stays on its own node
        seen.extend(names)
    seen.extend(result.unplaced)
    # Every pod and every daemon pod is placed once or reported unplaced, never both, never lost.
    assert sorted(seen) == sorted([*instances, *daemon_of])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SMALL_TYPES), st.integers(1, 6), daemons_st, pods_st())
def test_anti_affinity_and_spread_are_honoured(instance_type, nodes, daemons, pods):
    result = pack(NodeGroup("g", instance_type, nodes), daemons, pods)
    instances = _by_instance(pods)
    group_size: dict[str, int] = {}
    for p in pods:
        if p.spread:
            group_size[p.spread] = group_size.get(p.spread, 0) + p.count
    for names in result.placed.values():
        mine = [instances[n] for n in names if n in instances]
        for p in pods:
            if p.max_per_node is not None:
                assert sum(1 for q in mine if q.name == p.name) <= p.max_per_node
        for g, size in group_size.items():
            assert sum(1 for q in mine if q.spread == g) <= math.ceil(size / nodes)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SMALL_TYPES), st.integers(0, 5), daemons_st, pods_st())
def test_adding_a_node_never_leaves_more_unplaced(instance_type, nodes, daemons, pods):
    # Without spread groups the first `nodes` nodes fill exactly as before and the new node only
    # takes what was left over. (A spread group's cap ceil(size / nodes) falls as nodes are added,
    # which can leave more unplaced: see the next test.)
    pods = [dataclasses.replace(p, spread=None) for p in pods]
    fewer = pack(NodeGroup("g", instance_type, nodes), daemons, pods)
    more = pack(NodeGroup("g", instance_type, nodes + 1), daemons, pods)
    # Daemon pods are per node (one more node, one more of each); pods: a subset of those left before.
    assert {n for n in more.unplaced if "#" in n} <= {n for n in fewer.unplaced if "#" in n}


def test_a_spread_group_can_leave_more_unplaced_on_more_nodes():
    # c7i.large, 1930m. Three 1291m pods take nodes 0-2 (639m left each, too little for a 921m
    # pod). Six 921m pods spread: on 5 nodes at most ceil(6/5) = 2 per node, nodes 3-4 take four
    # and two are left; on 6 nodes at most 1 per node, nodes 3-5 take three and three are left.
    # kube-scheduler's maxSkew rule is stricter still (nodes 0-2 hold none of the group, so no node
    # may hold more than one); both need 9 nodes.
    pods = [PodDemand("big", 1291, 2549, count=3), PodDemand("mid", 921, 360, count=6, spread="g")]
    assert pack(NodeGroup("g", "c7i.large", 5), [], pods).unplaced == ["mid#5", "mid#6"]
    assert pack(NodeGroup("g", "c7i.large", 6), [], pods).unplaced == ["mid#4", "mid#5", "mid#6"]
    assert nodes_needed("c7i.large", [], pods, minimum=1) == 9


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(SMALL_TYPES), st.integers(1, 4), daemons_st, pods_st())
def test_nodes_needed_is_the_minimum(instance_type, minimum, daemons, pods):
    n = nodes_needed(instance_type, daemons, pods, minimum=minimum, limit=8)
    if n is None:
        assert not pack(NodeGroup("g", instance_type, 8), daemons, pods).fits
        return
    assert minimum <= n <= 8
    assert pack(NodeGroup("g", instance_type, n), daemons, pods).fits
    if n > minimum:
        assert not pack(NodeGroup("g", instance_type, n - 1), daemons, pods).fits


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(SMALL_TYPES), st.integers(1, 5), daemons_st, pods_st(), st.randoms())
def test_the_order_of_the_demands_does_not_matter(instance_type, nodes, daemons, pods, rnd):
    group = NodeGroup("g", instance_type, nodes)
    shuffled = list(pods)
    rnd.shuffle(shuffled)
    a, b = pack(group, daemons, pods), pack(group, daemons, shuffled)
    assert (a.placed, a.unplaced) == (b.placed, b.unplaced)


# --- worked examples -----------------------------------------------------------------------

def test_first_fit_decreasing_by_hand():
    # m7i.large: 1930m each. Order: big (1200m), then the two 600m by memory (b before a), then c.
    pods = [PodDemand("a", 600, 100), PodDemand("b", 600, 200), PodDemand("big", 1200, 10), PodDemand("c", 800, 10)]
    r = pack(NodeGroup("g", "m7i.large", 2), [], pods)
    assert r.placed == {0: ["big#1", "b#1"], 1: ["c#1", "a#1"]}
    assert r.unplaced == []
    assert [f.cpu_millis for f in r.free] == [1930 - 1800, 1930 - 1400]


def test_max_pods_counts_daemons_and_pods():
    # 29 pod slots on m7i.large; two daemons take two, so 27 tiny pods fit and the 28th does not.
    daemons = [DaemonDemand("ds1", 0, 0), DaemonDemand("ds2", 0, 0)]
    r = pack(NodeGroup("g", "m7i.large", 1), daemons, [PodDemand("tiny", 1, 1, count=28)])
    assert r.unplaced == ["tiny#28"]
    assert r.free[0].pods == 0


def test_max_per_node_one_needs_a_node_per_replica():
    pods = [PodDemand("ctl", 100, 100, count=3, max_per_node=1)]
    assert pack(NodeGroup("g", "m7i.xlarge", 2), [], pods).unplaced == ["ctl#3"]
    assert nodes_needed("m7i.xlarge", [], pods, minimum=1) == 3


def test_spread_caps_each_node_at_the_ceiling():
    # 3 spread pods over 2 nodes: at most 2 per node, although one node has room for all three.
    pods = [PodDemand("r", 100, 100, count=3, spread="router")]
    r = pack(NodeGroup("g", "m7i.xlarge", 2), [], pods)
    assert r.placed == {0: ["r#1", "r#2"], 1: ["r#3"]}


def test_a_daemon_that_does_not_fit_is_unplaced_on_every_node():
    r = pack(NodeGroup("g", "m7i.large", 2), [DaemonDemand("huge", 5000, 0)], [])
    assert r.unplaced == ["huge@0", "huge@1"]


def test_a_pod_bigger_than_the_type_never_fits():
    assert nodes_needed("m7i.large", [], [PodDemand("x", 2000, 1)], minimum=1) is None


# The issue's case: the Karpenter-mode system group of 2 x m7i.large.
ISSUE_DAEMONS = [node_fit.KUBE_PROXY, node_fit.AWS_NODE]
ISSUE_PODS = [
    node_fit.KARPENTER_CONTROLLER,
    PodDemand("router-a", 500, 512, count=2, spread="router-a"),
    *node_fit.KEDA_PODS,
    node_fit.COREDNS,
]


def test_the_issue_case_does_not_fit_two_m7i_large():
    # By hand: daemons 100m + 50m leave 1780m per node. Karpenter 1000m on each (anti-affinity),
    # one router each (spread), 280m left per node. The 100m pods by memory: the three KEDA pods
    # (100Mi) then CoreDNS (70Mi): two KEDA on node 0 (80m left), one KEDA + one CoreDNS on node 1
    # (80m left); the second CoreDNS finds 80m anywhere. 3800m asked of 3860m, yet it does not fit.
    group = NodeGroup("system", "m7i.large", 2)
    r = pack(group, ISSUE_DAEMONS, ISSUE_PODS)
    assert r.unplaced == ["coredns#2"]
    assert r.requested_cpu_millis == 3800
    assert [f.cpu_millis for f in r.free] == [80, 80]
    assert r.placed[0] == ["kube-proxy@0", "aws-node@0", "karpenter#1", "router-a#1",
                           "keda-admission-webhooks#1", "keda-operator#1"]


def test_the_issue_case_fits_three_m7i_large():
    r = pack(NodeGroup("system", "m7i.large", 3), ISSUE_DAEMONS, ISSUE_PODS)
    assert r.fits
    assert r.placed[2] == ["kube-proxy@2", "aws-node@2", "coredns#2"]
    assert nodes_needed("m7i.large", ISSUE_DAEMONS, ISSUE_PODS, minimum=2) == 3


def test_with_nfd_and_a_second_model_two_m7i_xlarge_fit():
    pods = [*ISSUE_PODS, *node_fit.NFD_PODS, PodDemand("router-b", 500, 512, count=2, spread="router-b")]
    assert nodes_needed("m7i.large", ISSUE_DAEMONS, pods, minimum=2) == 4
    assert nodes_needed("m7i.xlarge", ISSUE_DAEMONS, pods, minimum=2) == 2


def test_explain_names_the_pods_group_type_and_numbers():
    group = NodeGroup("system", "m7i.large", 2)
    text = node_fit.explain(pack(group, ISSUE_DAEMONS, ISSUE_PODS), group)
    assert "\n" not in text
    for part in ("'system'", "2 x m7i.large", "coredns#2 (100m CPU, 70Mi)", "1930m CPU", "6903Mi",
                 "requested 3800m CPU", "3860m CPU", "13806Mi"):
        assert part in text, (part, text)


def test_addon_table_holds_the_published_figures():
    a = node_fit.ADDON_DEMANDS
    assert (a["kube-proxy"].cpu_millis, a["aws-node"].cpu_millis) == (100, 50)
    assert (a["coredns"].cpu_millis, a["coredns"].memory_mib, a["coredns"].count) == (100, 70, 2)
    assert (a["karpenter"].cpu_millis, a["karpenter"].memory_mib, a["karpenter"].max_per_node) == (1000, 1024, 1)
    assert (a["nfd-master"].cpu_millis, a["nfd-master"].memory_mib) == (100, 128)
    assert (a["nfd-gc"].cpu_millis, a["nfd-gc"].memory_mib) == (10, 128)
    assert all(isinstance(d, DaemonDemand) for d in node_fit.NODE_DAEMONS)


def test_the_addon_figures_match_what_warmstart_renders():
    from warmstart.decisions import karpenter
    from warmstart.manifests import autoscaling

    ctl = karpenter.CONTROLLER_RESOURCES["requests"]
    assert node_fit.parse_cpu(ctl["cpu"]) == node_fit.KARPENTER_CONTROLLER.cpu_millis
    assert node_fit.parse_memory(ctl["memory"]) == node_fit.KARPENTER_CONTROLLER.memory_mib
    keda = autoscaling.KEDA_RESOURCES["requests"]
    for pod in node_fit.KEDA_PODS:
        assert (pod.cpu_millis, pod.memory_mib) == (node_fit.parse_cpu(keda["cpu"]), node_fit.parse_memory(keda["memory"]))


def test_duplicate_demand_names_are_refused():
    try:
        pack(NodeGroup("g", "m7i.large", 1), [], [PodDemand("x", 1, 1), PodDemand("x", 2, 2)])
    except ValueError as err:
        assert "x" in str(err)
    else:
        raise AssertionError("duplicate names accepted")


def test_randomised_packings_are_reproducible():
    rnd = random.Random(7)
    pods = [PodDemand(f"p{i}", rnd.randint(0, 900), rnd.randint(0, 3000), count=rnd.randint(1, 3)) for i in range(10)]
    first = pack(NodeGroup("g", "m7i.xlarge", 3), [node_fit.AWS_NODE], pods)
    second = pack(NodeGroup("g", "m7i.xlarge", 3), [node_fit.AWS_NODE], pods)
    assert first == second


def test_a_managed_group_packs_against_the_capped_max_pods():
    pods = [PodDemand("tiny", 1, 1, count=120)]
    assert pack(NodeGroup("g", "m7i.4xlarge", 1), [], pods).fits
    capped = pack(NodeGroup("g", "m7i.4xlarge", 1, managed=True), [], pods)
    assert capped.unplaced == [f"tiny#{i}" for i in range(111, 121)]
    assert nodes_needed("m7i.4xlarge", [], pods, minimum=1, managed=True) == 2
