"""GpuPools alone, from its own Args under Pulumi mocks: per pool one node class and one NodePool,
of the cluster mode's kinds, valid against the vendored CRDs (tests/support/node_classes.py)."""

from __future__ import annotations

import pytest

from components.gpu_pools import GpuPools, GpuPoolsArgs
from tests.support.node_classes import validator
from tests.support.stacks import STACKS_DIR
from warmstart import mocks, render

KINDS = {"auto": "NodeClass", "karpenter": "EC2NodeClass"}


@pytest.mark.parametrize("stack", ["dev", "prod"])  # one stack of each cluster mode
def test_each_pool_gets_a_valid_node_class_and_nodepool_of_its_mode(stack):
    _, plan = render.load_plan(STACKS_DIR, stack)
    cluster = plan.cluster
    args = GpuPoolsArgs(plan=cluster, node_role_name="team-gpu-nodes",
                        subnet_selector_terms=[{"tags": {"karpenter.sh/discovery": "team"}}],
                        security_group_selector_terms=[{"id": "sg-0000000a"}])
    built = {}
    resources = mocks.run(lambda: built.setdefault("p", GpuPools("gpu", args)), region=plan.config.region, stack=stack)
    # Karpenter mode: the GPU pools and the general-purpose pool of the non-GPU pods.
    pools = [p.name for p in cluster.pools] + ([cluster.cpu_pool.name] if cluster.cpu_pool else [])
    assert sorted(built["p"].node_pools) == sorted(built["p"].node_classes) == sorted(pools)
    objects = [r.inputs for r in resources if r.typ.startswith("kubernetes:")]
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(["NodePool", KINDS[str(cluster.mode)]] * len(pools))
    for o in objects:
        errors = sorted(validator(o["kind"]).iter_errors(o), key=str)
        assert not errors, [e.message for e in errors]
