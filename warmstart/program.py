"""The Pulumi program: read the stack config, plan, build the stack component, export."""

from __future__ import annotations

import pulumi
from pulumi.runtime import config as runtime_config

from . import config, plan
from .components.stack import WarmstartStack


def current_config() -> config.StackConfig:
    """The stack config Pulumi handed this program (engine env or mocks)."""
    raw = dict(runtime_config.get_config_env()) | dict(runtime_config.CONFIG.get())
    return config.from_pulumi_config(raw)


def main() -> None:
    stack_plan = plan.plan_stack(current_config(), pulumi.get_stack())
    stack = WarmstartStack("warmstart", stack_plan)
    pulumi.export("plan", stack_plan.summary())
    pulumi.export("clusterName", stack.cluster.name)
    # `pulumi stack output kubeconfig --show-secrets > kubeconfig` for kubectl.
    pulumi.export("kubeconfig", pulumi.Output.secret(stack.cluster.eks.kubeconfig_json))
    pulumi.export("modelBucket", stack.storage.model_bucket)
    pulumi.export("compileCacheBucket", stack.storage.compile_cache_bucket)
    pulumi.export("roleArns", stack.identity.role_arns)
    pulumi.export("services", {name: m.service_name for name, m in stack.models.items()})
