"""Pulumi entry point: an environment stack, or a model stack on one (its config names a platform)."""

import pulumi

from components import (KUBECONFIG_OUTPUT, PLATFORM_OUTPUT, ModelStack, ModelStackArgs, WarmstartStack,
                        WarmstartStackArgs, is_model_stack, model_stack_config, stack_config)

if is_model_stack():
    model = ModelStack("warmstart", ModelStackArgs(config=model_stack_config(), stack=pulumi.get_stack()))
    pulumi.export("plan", model.plan.summary())
    pulumi.export("roleArns", {model.plan.model.name: model.served.role_arn})
    pulumi.export("services", {model.plan.model.name: model.served.service_name})
else:
    stack = WarmstartStack("warmstart", WarmstartStackArgs(config=stack_config(), stack=pulumi.get_stack()))
    pulumi.export("plan", stack.plan.summary())
    pulumi.export("clusterName", stack.cluster.cluster_name)
    # `pulumi stack output kubeconfig --show-secrets > kubeconfig` for kubectl; model stacks read it too.
    pulumi.export(KUBECONFIG_OUTPUT, stack.cluster.kubeconfig)
    pulumi.export("modelBucket", stack.storage.model_bucket)
    pulumi.export("compileCacheBucket", stack.storage.compile_cache_bucket)
    pulumi.export("roleArns", {name: role.role_arn for name, role in stack.roles.items()})
    pulumi.export("services", {name: m.service_name for name, m in stack.models.items()})
    if stack.monitoring is not None:
        # What a KEDA of your own (monitoring.keda.create: false) annotates its operator with.
        pulumi.export("kedaOperatorRoleArn", stack.monitoring.keda_operator_role_arn)
    # The versioned contract model stacks on this environment read (docs/model-stacks.md).
    pulumi.export(PLATFORM_OUTPUT, stack.platform_contract)
