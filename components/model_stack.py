"""A model stack: one model deployed onto an environment's platform, read through a
`pulumi.StackReference` (docs/model-stacks.md).

The platform (an environment stack) exports its contract (`warmstart.plan.platform`); the model
stack reads it, plans its one model exactly as the environment plans an inline one, and creates
that model's resources only, through the same code (`model_layer.deploy_model`): its IRSA roles,
weights import, node cache, serving objects, router and autoscaling. The cluster, network,
buckets, namespace, shared scripts, KEDA and node-feature-discovery stay the platform's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
from pulumi.runtime.sync_await import _sync_await

from warmstart import config
from warmstart.plan import platform as contract_mod
from warmstart.config import ModelStackConfig
from warmstart.plan.platform import Contract, ModelStackPlan, plan_model_stack

from .model_layer import ModelPlatform, ModelResources, deploy_model
from .stack import program_config

# The environment stack's outputs its model stacks read (warmstart/plan/platform.py).
PLATFORM_OUTPUT = contract_mod.OUTPUT
KUBECONFIG_OUTPUT = contract_mod.KUBECONFIG_OUTPUT


def model_stack_config() -> ModelStackConfig:
    """The model stack config Pulumi handed this program (engine environment or mocks)."""
    return config.model_stack_from_pulumi_config(program_config())


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


def read_contract(ref: pulumi.StackReference, platform: str, stack: str) -> Contract:
    """The platform's contract, read while the program runs: a model's decisions (its pool, TP,
    sizes) shape its resources, so they cannot wait for an Output. The SDK's own synchronous
    invokes wait the same way (`pulumi.runtime.sync_await`)."""
    details = _sync_await(ref.get_output_details(contract_mod.OUTPUT))
    doc = details.value if details.value is not None else details.secret_value
    return contract_mod.parse(doc, platform, stack)


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
    resources: ModelResources
    """The model's components."""

    def __init__(self, name: str, args: ModelStackArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warmstart:index:ModelStack", name, None, opts)
        cfg = args.config
        ref = pulumi.StackReference(reference_name(cfg.platform), opts=pulumi.ResourceOptions(parent=self))
        contract = read_contract(ref, cfg.platform, args.stack)
        self.plan = plan = plan_model_stack(cfg, contract, args.stack)
        m = plan.model
        tags = {"warmstart:stack": args.stack, "warmstart:platform": contract.stack,
                "warmstart:prefix": contract.name_prefix} | dict(cfg.tags)
        self.aws_provider = aws.Provider(f"{name}-aws", region=contract.region,
                                         default_tags=aws.ProviderDefaultTagsArgs(tags=tags),
                                         opts=pulumi.ResourceOptions(parent=self))
        # The platform's kubeconfig, a secret output of its own.
        self.kubernetes_provider = k8s.Provider(
            f"{name}-k8s", kubeconfig=ref.require_output(contract_mod.KUBECONFIG_OUTPUT),
            opts=pulumi.ResourceOptions(parent=self))
        monitoring: dict[str, Any] = dict(contract.monitoring or {})
        hf_token = (pulumi.Config(config.NAMESPACE).get_secret("huggingFaceToken")
                    if m.weights_import and m.weights_import.kind == "huggingFace" else None)
        self.platform = ModelPlatform(
            name=name, namespace=contract.namespace, region=contract.region, cluster_mode=contract.cluster_mode,
            name_prefix=contract.name_prefix, nvme_check=contract.nvme_check, vpc_cidrs=contract.vpc_cidrs,
            service_cidr=contract.service_cidr, image_cache_account=contract.image_cache_account,
            scraper_pods=[(str(s["namespace"]), dict(s["podLabels"])) for s in monitoring.get("scraperPods") or []],
            oidc_provider_arn=contract.oidc_provider_arn, oidc_issuer=contract.oidc_issuer,
            compile_cache_bucket=contract.compile_cache_bucket, aws_provider=self.aws_provider,
            kubernetes_provider=self.kubernetes_provider, managed_scraper=bool(monitoring.get("managedScraper")),
            monitoring_server=monitoring.get("serverAddress"), monitoring_region=monitoring.get("region") or None,
            hugging_face_token=hf_token)
        spec = cfg.model.in_bucket(contract.model_bucket) if cfg.model.relative else cfg.model
        self.resources = deploy_model(self, self.platform, spec, m)
        self.register_outputs({})
