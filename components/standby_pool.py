"""One standby pool's objects on a cluster (docs/scale-out.md "Pooled standby"): what
`warmstart.manifests.standby_pool` builds from the pool's plan, plus the hosts' IRSA role (reading
only the members' weights prefixes, `warmstart.decisions.iam.pool_host_role_policy`) and the
supervisor's script ConfigMap.

Python only: a WarmstartStack registers one per `standbyPools` entry from its plan (the pool is
planned with every member's model plan, which only the stack has); it is not part of the
multi-language component package.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from warmstart.config import S3_URI
from warmstart.decisions import iam, naming
from warmstart.decisions import standby_pool as decide
from warmstart.manifests import standby as actuator_objects
from warmstart.manifests import standby_pool as objects

from .pod_scripts import PodScript

ROLE_POLICY_NAME = "weights"


class StandbyPool(pulumi.ComponentResource):
    """A pool's engine hosts, its actuator, their identities and NetworkPolicies."""

    host_role_arn: pulumi.Output[str]
    """The engine hosts' IRSA role."""

    def __init__(self, name: str, plan: decide.PoolPlan, wiring: objects.PoolWiring, *, name_prefix: str,
                 oidc_provider_arn: pulumi.Input[str], oidc_issuer: pulumi.Input[str], region: str,
                 ship_actuator_script: bool = False,
                 opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("warmstart:index:StandbyPool", name, None, opts)
        self.plan = plan
        child = pulumi.ResourceOptions(parent=self)
        sources = []
        for m in wiring.members:
            match = S3_URI.match(m.source)
            assert match is not None  # a planned model's source is a full URI
            sources.append((match["bucket"], match["prefix"].rstrip("/")))
        role_name = naming.role_name(name_prefix, plan.deployment_name)
        service_account = plan.deployment_name
        trust = pulumi.Output.all(oidc_provider_arn, oidc_issuer).apply(
            lambda v: iam.to_json(iam.irsa_trust_policy(v[0], v[1].removeprefix("https://"), wiring.namespace,
                                                        service_account)))
        role = aws.iam.Role(f"{name}-host-role", name=role_name, assume_role_policy=trust,
                            description=f"warmstart: {wiring.namespace}/{service_account} reads the weights of "
                                        f"standby pool {plan.name}'s members",
                            tags={"Name": role_name, "warmstart:standby-pool": plan.name}, opts=child)
        attached = aws.iam.RolePolicy(f"{name}-host-s3", role=role.name, name=ROLE_POLICY_NAME,
                                      policy=iam.to_json(iam.pool_host_role_policy(naming.partition(region), sources)),
                                      opts=child)
        # The ARN resolves once the policy is attached: no host assumes a role that cannot read yet.
        self.host_role_arn = pulumi.Output.all(role.arn, attached.id).apply(lambda v: v[0])
        wired = dataclasses.replace(wiring, role_arn=self.host_role_arn)
        needs: list[pulumi.Resource] = [PodScript(f"{name}-host-script", wiring.namespace,
                                                  objects.host_script_config_map(plan.name), objects.HOST_SCRIPT_KEY,
                                                  opts=child)]
        actuator_map = actuator_objects.CONFIGMAP_NAME
        if ship_actuator_script:
            actuator_map = f"{plan.actuator_name}-script"
            needs.append(PodScript(f"{name}-actuator-script", wiring.namespace, actuator_map,
                                   actuator_objects.SCRIPT_KEY, opts=child))
        for obj in objects.objects(plan, wired, actuator_map):
            kind, meta = obj["kind"], obj["metadata"]
            after = pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=list(needs)))
            rname = f"{name}-{meta['name']}-{kind.lower()}"
            if kind == "NetworkPolicy":
                r: pulumi.Resource = k8s.networking.v1.NetworkPolicy(rname, metadata=meta, spec=obj["spec"], opts=after)
            elif kind == "ServiceAccount":
                r = k8s.core.v1.ServiceAccount(rname, metadata=meta,
                                               automount_service_account_token=obj["automountServiceAccountToken"],
                                               opts=after)
            elif kind == "ConfigMap":
                r = k8s.core.v1.ConfigMap(rname, metadata=meta, data=obj["data"], opts=after)
            elif kind == "Role":
                r = k8s.rbac.v1.Role(rname, metadata=meta, rules=obj["rules"], opts=after)
            elif kind == "RoleBinding":
                r = k8s.rbac.v1.RoleBinding(rname, metadata=meta, role_ref=obj["roleRef"], subjects=obj["subjects"],
                                            opts=after)
            elif kind == "Service":
                r = k8s.core.v1.Service(rname, metadata=meta, spec=obj["spec"], opts=after)
            elif kind == "PodDisruptionBudget":
                r = k8s.policy.v1.PodDisruptionBudget(rname, metadata=meta, spec=obj["spec"], opts=after)
            else:
                hosts = meta["name"] == plan.deployment_name
                # The pool actuator owns the hosts' replicas after the first create (as KEDA owns a
                # model's): a later `up` leaves them where it put them. Pulumi does not wait for the
                # hosts (minutes of engine starts): the render prints that window.
                r = k8s.apps.v1.Deployment(
                    rname, metadata={**meta, "annotations": {**meta.get("annotations", {}),
                                                             "pulumi.com/skipAwait": "true"}} if hosts else meta,
                    spec=obj["spec"],
                    opts=pulumi.ResourceOptions.merge(after, pulumi.ResourceOptions(
                        ignore_changes=["spec.replicas"] if hosts else None)))
            needs.append(r)
        self.register_outputs({"hostRoleArn": self.host_role_arn})
