"""What every stack's render must pass, a shipped stack's or one of the user's own: the
Kubernetes objects against their schemas, and warmstart's policies."""

from __future__ import annotations

import kubernetes_validate

from tests.support.keda import validate_keda
from warmstart import mocks, policies, render
from warmstart.plan import platform


def validate_rendered(r: render.Rendered) -> None:
    """What every stack's render must pass, a shipped stack's or one of the user's own."""
    for obj in r.kubernetes_objects:
        if obj["apiVersion"].startswith("keda.sh/"):
            validate_keda(obj)
        elif not obj["apiVersion"].startswith(("karpenter.", "eks.amazonaws.com/")):
            kubernetes_validate.validate(obj, r.stack_plan.kubernetes_version
                                         if isinstance(r.stack_plan, platform.ModelStackPlan)
                                         else r.stack_plan.config.kubernetes_version, strict=True)
    region = r.stack_plan.contract.region if isinstance(r.stack_plan, platform.ModelStackPlan) else r.stack_plan.config.region
    assert [str(v) for v in policies.run_all(mocks.policy_records(r.resources, region))] == []
