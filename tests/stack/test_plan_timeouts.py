"""The waits a model's objects carry are its plan's records (warmstart/plan/records.py), not
numbers a component reads back out of built annotations."""

from __future__ import annotations

import pytest

from tests.support.stacks import ALL_STACK_NAMES, render_stack

TIMEOUT = "pulumi.com/timeoutSeconds"


@pytest.mark.parametrize("stack", ALL_STACK_NAMES)
def test_every_model_and_router_waits_as_long_as_its_plan_says(stack):
    r = render_stack(stack)
    deployments = {o["metadata"]["name"]: o for o in r.kubernetes_objects if o["kind"] == "Deployment"}
    for m in r.stack_plan.models:
        dep = deployments[m.name]
        assert dep["spec"]["progressDeadlineSeconds"] == m.rollout_timeout_seconds > m.startup_budget_seconds
        assert dep["metadata"]["annotations"][TIMEOUT] == str(m.rollout_timeout_seconds)
        if m.routed:
            router = deployments[f"{m.name}-router"]
            assert router["metadata"]["annotations"][TIMEOUT] == str(m.router_ready_timeout_seconds)
            # The routers wait for a vLLM pod, and with an import for the import Job before it.
            assert m.router_ready_timeout_seconds >= m.rollout_timeout_seconds + (
                m.weights_import.deadline_seconds if m.weights_import else 0)
