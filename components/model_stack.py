"""A model stack: one model deployed onto an environment's platform, read through a
`pulumi.StackReference` (docs/model-stacks.md).

The platform (an environment stack) exports its `PlatformArgs` (`warmstartPlatform`, a
versioned document; warmstart/plan/platform.py); the model stack reads it with the public
`StackReference` API, checks its one model against it (`plan_model_stack`: the rules an inline
model has, and those only a model added to a platform can break), and creates a `ServedModel`
from its model entry and that `PlatformArgs`, as the environment does for an inline one. The
cluster, network, buckets, namespace, shared scripts, KEDA and node-feature-discovery stay the
platform's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from warmstart import config
from warmstart.config import ModelStackConfig
from warmstart.errors import rekeyed
from warmstart.plan import platform as contract_mod
from warmstart.plan.platform import ModelStackPlan, plan_model_stack

from warmstart.sdk_private import program_config, sync_await
from .providers import kubernetes_provider
from .served_model import KEY as SERVED_MODEL_KEY
from .served_model import ServedModel, _args
from .stack import model_entry

# The environment stack's outputs its model stacks read (warmstart/plan/platform.py).
PLATFORM_OUTPUT = contract_mod.OUTPUT
KUBECONFIG_OUTPUT = contract_mod.KUBECONFIG_OUTPUT


def model_stack_config() -> ModelStackConfig:
    """The model stack config Pulumi handed this program (engine environment or mocks)."""
    return config.model_stack_from_pulumi_config(config.with_stack_file(program_config(), pulumi.get_stack()))


def is_model_stack() -> bool:
    """Whether this program runs a model stack (its config names a platform)."""
    return config.is_model_stack(program_config())


def reference_name(platform: str) -> str:
    """The StackReference name of a platform: as given when qualified (`org/project/stack`),
    else the stack of that name in this project and organization
    (https://www.pulumi.com/docs/iac/concepts/stacks/#stackreferences)."""
    if "/" in platform:
        return platform
    # A self-managed backend has no organization and names it `organization`.
    return f"{pulumi.get_organization() or 'organization'}/{pulumi.get_project()}/{platform}"


def read_platform(ref: pulumi.StackReference, platform: str, stack: str) -> dict[str, Any]:
    """The platform's `PlatformArgs`, checked, read while the program runs
    (`StackReference.get_output_details`, waited for by `sync_await`)."""
    details = sync_await(ref.get_output_details(contract_mod.OUTPUT))
    doc = details.value if details.value is not None else details.secret_value
    return contract_mod.platform_args(doc, platform, stack)


@dataclass(frozen=True)
class ModelStackArgs:
    """Inputs of a model stack."""

    config: ModelStackConfig
    """The model stack config (`stacks/Pulumi.<env>-<model>.yaml`)."""
    stack: str
    """The model stack's name."""


class ModelStack(pulumi.ComponentResource):
    """One model on an existing warmstart platform."""

    plan: ModelStackPlan
    """Every decision of the model stack (`warmstart render`'s plan.json)."""
    served: ServedModel
    """The model's component."""

    def __init__(self, name: str, args: ModelStackArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warmstart:index:ModelStack", name, None, opts)
        cfg = args.config
        ref = pulumi.StackReference(reference_name(cfg.platform), opts=pulumi.ResourceOptions(parent=self))
        platform = read_platform(ref, cfg.platform, args.stack)
        contract = contract_mod.from_args(platform)
        self.plan = plan = plan_model_stack(cfg, contract, args.stack)
        m = plan.model
        tags = {"warmstart:stack": args.stack, "warmstart:platform": contract.stack,
                "warmstart:prefix": contract.name_prefix} | dict(cfg.tags)
        self.aws_provider = aws.Provider(f"{name}-aws", region=contract.region,
                                         default_tags=aws.ProviderDefaultTagsArgs(tags=tags),
                                         opts=pulumi.ResourceOptions(parent=self))
        # The platform's kubeconfig, a secret output of its own.
        self.kubernetes_provider = kubernetes_provider(name, ref.require_output(contract_mod.KUBECONFIG_OUTPUT),
                                                       pulumi.ResourceOptions(parent=self))
        hf_token = (pulumi.Config(config.NAMESPACE).get_secret("huggingFaceToken")
                    if m.weights_import and m.weights_import.kind == "huggingFace" else None)
        with rekeyed(SERVED_MODEL_KEY, f"{config.NAMESPACE}:model"):  # the stack key, not the Args'
            self.served = ServedModel(
                f"{name}-{m.name}", _args(model=model_entry(cfg.model), platform=platform,  # type: ignore[typeddict-item]
                                          hugging_face_token=hf_token),
                opts=pulumi.ResourceOptions(parent=self, providers=[self.aws_provider, self.kubernetes_provider]))
        self.register_outputs({})
