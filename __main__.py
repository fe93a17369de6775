"""Pulumi entry point: the stack config, the stack component, the outputs."""

import pulumi

from components import WarmstartStack, WarmstartStackArgs, stack_config

stack = WarmstartStack("warmstart", WarmstartStackArgs(config=stack_config(), stack=pulumi.get_stack()))
pulumi.export("plan", stack.plan.summary())
pulumi.export("clusterName", stack.cluster.cluster_name)
# `pulumi stack output kubeconfig --show-secrets > kubeconfig` for kubectl.
pulumi.export("kubeconfig", stack.cluster.kubeconfig)
pulumi.export("modelBucket", stack.storage.model_bucket)
pulumi.export("compileCacheBucket", stack.storage.compile_cache_bucket)
pulumi.export("roleArns", {name: role.role_arn for name, role in stack.roles.items()})
pulumi.export("services", {name: m.service_name for name, m in stack.models.items()})
