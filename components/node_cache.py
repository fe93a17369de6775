"""A model's weights staged on the NVMe of its GPU pool's nodes (node-local model cache).

Registers, from the pure builders in `warmstart.manifests.node_cache`: the staging
ServiceAccount (the model's read-only IRSA role), its Role/RoleBinding on NodeFeature objects,
the script ConfigMaps, and one staging DaemonSet per pool, running the model's own image.
The DaemonSet gets a long custom timeout and pulumi-kubernetes awaits its rollout, so a
serving Deployment that `depends_on` `ModelNodeCache.daemon_sets` rolls only after every node
has pulled the image and tried to stage the new version. Optionally the shared
PriorityClasses and a warm-spare placeholder Deployment per pool. With `network_policies`
(default), a NetworkPolicy for the staging pods (no ingress; DNS and HTTPS out) and one per
placeholder Deployment (nothing in or out).
"""

from typing import NotRequired, Optional, TypedDict

import pulumi
import pulumi_kubernetes as k8s

from warmstart import versions
from warmstart.decisions import image_cache, naming
from warmstart.decisions import node_cache as decide
from warmstart.decisions import placement
from warmstart.manifests import node_cache as manifests
from warmstart.errors import ConfigError
from warmstart.manifests.pod_scripts import config_map_spec

from .enums import ClusterMode, mode_value


class WarmSpareArgs(TypedDict):
    """Spare nodes of one pool kept staged by placeholder pods."""

    warm_nodes: int
    """Number of spare nodes (0: none)."""
    instance_type: str
    """Instance type of the spares: the serving model's, so a scale-out fits once it preempts."""
    gpus: int
    """GPUs each placeholder holds: the whole node's, so the spare is empty for a serving pod."""


class ModelNodeCacheArgs(TypedDict):
    """Inputs of the ModelNodeCache component."""

    model_name: str
    """The model (a DNS label): names the DaemonSets, the node label `weights.warmstart.io/<model>`
    and the node directory `<nvme>/weights/<model>/`."""
    source: str
    """`s3://bucket/prefix` of the weights; must be immutable for a given digest."""
    digest: str
    """Version digest (`warmstart.decisions.node_cache.model_version_digest`)."""
    image: str
    """The model's serving image: the staging pods run it, which pre-pulls it on every node."""
    pools: list[str]
    """GPU pools (NodePool names) whose nodes stage the weights: one DaemonSet each."""
    weights_gib: float
    """Total weights in GiB (2^30 bytes): sizes the copy's deadline."""
    region: str
    """AWS region of the bucket."""
    namespace: NotRequired[str]
    """Namespace of the objects (default `default`); the serving pods' namespace."""
    cluster_mode: NotRequired[ClusterMode]
    """Decides the NVMe mount the node directory lives under (default auto)."""
    role_arn: NotRequired[pulumi.Input[str]]
    """The staging copy's read-only IAM role (IRSA: the ServiceAccount `<model>-weights` gets
    the `eks.amazonaws.com/role-arn` annotation); its trust policy must admit exactly
    `system:serviceaccount:<namespace>:<model>-weights`. Without it the copy has no AWS
    credentials and every node streams from S3."""
    ship_pod_scripts: NotRequired[bool]
    """Create the staging and picker script ConfigMaps (default true)."""
    create_priority_classes: NotRequired[bool]
    """Create the two cluster-wide PriorityClasses (default true; false when another
    ModelNodeCache of the stack already does)."""
    warm_spares: NotRequired[dict[str, WarmSpareArgs]]
    """Per pool name: spare nodes kept staged by placeholders (default none)."""
    network_policies: NotRequired[bool]
    """Register the staging and placeholder NetworkPolicies (default true)."""
    content_check: NotRequired[str]
    """How the stager checks a copy's bytes against what S3 vouches for: `auto` (default), `etag`,
    `sha256` or `size` (`WARMSTART_CONTENT_CHECK`; the stack key `models[].nodeCacheContentCheck`,
    see docs/node-cache.md)."""


class ModelNodeCache(pulumi.ComponentResource):
    """A model's weights staged on its pools' NVMe, a node label per complete copy, and
    optional warm spare nodes."""

    daemon_sets: list[k8s.apps.v1.DaemonSet]
    """The staging DaemonSets: make the serving Deployment depend on them."""
    label_key: str
    """The node label a complete copy publishes; its value is `digest`."""

    def __init__(self, name: str, args: ModelNodeCacheArgs, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("warmstart:index:ModelNodeCache", name, None, opts)
        model, ns = args["model_name"], args.get("namespace") or "default"
        mode = mode_value(args.get("cluster_mode", ClusterMode.AUTO))
        check = args.get("content_check") or "auto"
        if check not in decide.CONTENT_CHECKS:
            raise ConfigError("ModelNodeCacheArgs.contentCheck", f"must be one of {', '.join(decide.CONTENT_CHECKS)}",
                              "use auto (the strongest check S3 vouches for, per file)", check)
        child = pulumi.ResourceOptions(parent=self)
        before: list[pulumi.Resource] = []
        if args.get("create_priority_classes", True):
            for pc in manifests.priority_class_specs():
                before.append(k8s.scheduling.v1.PriorityClass(
                    f"{name}-{pc['metadata']['name']}", metadata=pc["metadata"], value=pc["value"],
                    global_default=pc["globalDefault"], preemption_policy=pc["preemptionPolicy"],
                    description=pc["description"], opts=child))
        if args.get("ship_pod_scripts", True):
            for cm_name, key in ((manifests.STAGE_CONFIGMAP, manifests.STAGE_SCRIPT),
                                 (manifests.SELECT_CONFIGMAP, manifests.SELECT_SCRIPT)):
                spec = config_map_spec(naming.script_config_map(cm_name, model, own=True), ns, key)
                before.append(k8s.core.v1.ConfigMap(f"{name}-{key.removesuffix('.py').replace('_', '-')}",
                                                    metadata=spec["metadata"], binary_data=spec["binaryData"], opts=child))
        stage_map = naming.script_config_map(manifests.STAGE_CONFIGMAP, model, bool(args.get("ship_pod_scripts", True)))
        sa = manifests.service_account_spec(model, ns, args.get("role_arn"))
        before.append(k8s.core.v1.ServiceAccount(f"{name}-sa", metadata=sa["metadata"],
                                                 automount_service_account_token=sa["automountServiceAccountToken"],
                                                 opts=child))
        policies = args.get("network_policies", True)
        if policies:
            # Before the pods: a staging pod is never up without its policy.
            pol = manifests.staging_network_policy(model, ns)
            before.append(k8s.networking.v1.NetworkPolicy(f"{name}-netpol", metadata=pol["metadata"],
                                                          spec=pol["spec"], opts=child))
        role = manifests.role_spec(model, ns)
        before.append(k8s.rbac.v1.Role(f"{name}-role", metadata=role["metadata"], rules=role["rules"], opts=child))
        binding = manifests.role_binding_spec(model, ns)
        before.append(k8s.rbac.v1.RoleBinding(f"{name}-rolebinding", metadata=binding["metadata"],
                                              role_ref=binding["roleRef"], subjects=binding["subjects"], opts=child))
        deadline = decide.deadline_seconds(int(args["weights_gib"] * 2**30))
        self.daemon_sets = []
        for pool in sorted(set(args["pools"])):
            ds = manifests.daemonset_spec(model=model, pool=pool, namespace=ns, image=args["image"],
                                          source=args["source"], digest=args["digest"],
                                          nvme_mount=placement.NVME_MOUNT[mode], region=args["region"],
                                          deadline_seconds=deadline, script_config_map=stage_map,
                                          copier_image=image_cache.same_cache(versions.S5CMD_IMAGE, args["image"]),
                                          content_check=check)
            wait = decide.rollout_timeout_seconds(deadline)
            self.daemon_sets.append(k8s.apps.v1.DaemonSet(
                f"{name}-{pool}", metadata=ds["metadata"], spec=ds["spec"],
                opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                    depends_on=before,
                    custom_timeouts=pulumi.CustomTimeouts(create=f"{wait}s", update=f"{wait}s")))))
        for pool, spare in sorted((args.get("warm_spares") or {}).items()):
            register_warm_spares(name, pool, ns, spare, child, after=before, network_policy=policies)
        self.label_key = manifests.label_key(model)
        self.register_outputs({"labelKey": self.label_key})


def register_warm_spares(name: str, pool: str, namespace: str, spare: WarmSpareArgs, opts: pulumi.ResourceOptions,
                         after: list[pulumi.Resource], network_policy: bool = True) -> None:
    """A pool's placeholder Deployment (and its deny-all NetworkPolicy, first), which keeps
    `spare["warm_nodes"]` spare nodes up; nothing for zero."""
    if spare["warm_nodes"] <= 0:
        return
    dep = manifests.placeholder_spec(pool=pool, namespace=namespace, warm_nodes=spare["warm_nodes"],
                                     instance_type=spare["instance_type"], gpus=spare["gpus"])
    before = list(after)
    if network_policy:
        pol = manifests.placeholder_network_policy(pool, namespace)
        before.append(k8s.networking.v1.NetworkPolicy(
            f"{name}-{pool}-warm-spare-netpol", metadata=pol["metadata"], spec=pol["spec"],
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=list(after)))))
    k8s.apps.v1.Deployment(f"{name}-{pool}-warm-spare", metadata=dep["metadata"], spec=dep["spec"],
                           opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=before)))


__all__ = ["ModelNodeCache", "ModelNodeCacheArgs", "WarmSpareArgs", "register_warm_spares"]
