"""WarmstartStack alone, from its own Args (a stack's config) under Pulumi mocks: one of each
platform component, one VllmModel per model, and each pod-side script shipped once per
namespace for all its models. (Each component's decisions inside it: tests/stack/test_components.py.)"""

from __future__ import annotations

from collections import Counter

import components
from tests.support.stacks import STACKS_DIR
from warmstart import mocks, render


def test_the_stack_registers_the_platform_once_and_each_model_once():
    _, plan = render.load_plan(STACKS_DIR, "prod")
    resources = mocks.run(lambda: components.WarmstartStack(
        "warmstart", components.WarmstartStackArgs(config=plan.config, stack="prod")), region=plan.config.region, stack="prod")
    types = Counter(r.typ for r in resources)
    for one in ("warmstart:index:Network", "warmstart:index:Cluster", "warmstart:index:ModelStorage"):
        assert types[one] == 1, one
    assert types["warmstart:index:VllmModel"] == len(plan.models) >= 1
    maps = Counter((r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"])
                   for r in resources if r.typ == "kubernetes:core/v1:ConfigMap")
    assert maps and all(n == 1 for n in maps.values()), maps
