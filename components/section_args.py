# Generated from warmstart.config's platform sections by components/model_args_gen.py: do not edit.
# Regenerate with `python -m tests.golden` (tests/stack/test_section_args.py fails while stale).
"""The platform sections of a stack config as Args: every field of each of
`warmstart.config.NetworkConfig`, `ClusterConfig`, `GpuPool`, `ModelBucketConfig`,
`CompileCacheBucketConfig` and `MonitoringConfig`, key for key, for the components that take a
section nested (Network, Cluster, ModelStorage, Monitoring; `components.sections.section_config`
validates one)."""

from typing import NotRequired, TypedDict


class NetworkSectionArgs(TypedDict):
    """The VPC the cluster and GPU nodes run in: created by warmstart (default), or an existing one
    given by `vpcId`. Either way GPU subnets reach S3 through an S3 Gateway endpoint on every
    private route table, not through NAT (see [Accelerate model loading on Amazon
    EKS](https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html)).
    The stack's `network` section (`warmstart.config.NetworkConfig`), key for key; its validation
    and defaults are that model's."""

    vpc_id: NotRequired[str]
    """Use this existing VPC instead of creating one; then `privateSubnetIds` and
    `privateRouteTableIds` are required."""
    private_subnet_ids: NotRequired[list[str]]
    """Existing VPC only: the private subnets (at least two, in different AZs) the cluster and GPU
    nodes use. Default: `[]`."""
    private_route_table_ids: NotRequired[list[str]]
    """Existing VPC only: every route table associated with `privateSubnetIds` (including the VPC's
    main route table if a subnet has no explicit association). The S3 Gateway endpoint is
    attached to each. Default: `[]`."""
    public_subnet_ids: NotRequired[list[str]]
    """Existing VPC only: public subnets for internet-facing load balancers (optional). Default:
    `[]`."""
    cidr: NotRequired[str]
    """Created VPC only: its IPv4 CIDR, /16 to /22. Private subnets get one eighth each, public
    subnets one sixty-fourth. Default: `10.0.0.0/16`."""
    availability_zones: NotRequired[list[str]]
    """Created VPC only: AZ names to use. Default: the first `azCount` AZs the region reports
    available. Pin them when a GPU instance type is offered only in some AZs."""
    az_count: NotRequired[int]
    """Created VPC only: number of AZs (one public and one private subnet each) when
    `availabilityZones` is not given. Default: `3`."""
    single_nat_gateway: NotRequired[bool]
    """Created VPC only: one NAT gateway for all AZs (cheaper, but egress fails with its AZ) instead
    of one per AZ. Default: `false`."""
    s3_gateway_endpoint: NotRequired[bool]
    """Create the S3 Gateway endpoint on every private route table, so model and cache traffic
    bypasses NAT. Default: `true`."""
    allow_s3_via_nat: NotRequired[bool]
    """Explicit opt-out: allow `s3GatewayEndpoint: false`, i.e. GPU nodes reach S3 through NAT
    (shared bandwidth ceiling, per-GB charge). Default: `false`."""


class SystemNodeGroupSectionArgs(TypedDict):
    """`clusterMode: karpenter` only: the EKS managed node group that runs the Karpenter controller
    and CoreDNS (every other non-GPU pod runs on warmstart's elastic `general-purpose` NodePool).
    Karpenter must not run on nodes it launches, and its chart spreads two replicas over hosts
    and zones, so the group needs two nodes or more."""

    instance_types: NotRequired[list[str]]
    """On-demand x86_64 instance types of the group (no GPU needed). Default: `["m7i.large"]`."""
    size: NotRequired[int]
    """Nodes in the group, spread over the private subnets' AZs; at least 2. Default: the fewest (at
    least 2) that hold what runs there, the Karpenter controller and CoreDNS, with the nodes'
    kubelet reservation (`warmstart render` shows the count; a set size that cannot hold them is
    refused with the numbers)."""


class ClusterSectionArgs(TypedDict):
    """The EKS cluster, in either mode (see docs/cluster-modes.md). The stack's `cluster` section
    (`warmstart.config.ClusterConfig`), key for key; its validation and defaults are that
    model's."""

    admins: NotRequired[list[str]]
    """IAM role or user ARNs (exact, no wildcards) given cluster-admin access through EKS access
    entries (`AmazonEKSClusterAdminPolicy`, cluster scope). The identity that deploys the stack
    is admin anyway (cluster creator). Default: `[]`."""
    viewers: NotRequired[list[str]]
    """IAM role or user ARNs (exact) given read-only access to the whole cluster, Secrets included,
    through EKS access entries: what `warmstart refresh` and `preview` (the CI drift check) need
    to read every object the stack owns. Default: `[]`."""
    log_types: NotRequired[list[str]]
    """Control-plane log types sent to CloudWatch Logs. One of `api`, `audit`, `authenticator`,
    `controllerManager`, `scheduler`. Default: `["api", "audit", "authenticator"]`."""
    log_retention_days: NotRequired[int]
    """Days CloudWatch keeps the control-plane logs (EKS's own default is forever). One of `1`, `3`,
    `5`, `7`, `14`, `30`, `60`, `90`, `120`, `150`, `180`, `365`, `400`, `545`, `731`, `1096`,
    `1827`, `2192`, `2557`, `2922`, `3288`, `3653`. Default: `90`."""
    system_node_group: NotRequired[SystemNodeGroupSectionArgs]
    """`clusterMode: karpenter` only (ignored in auto mode, whose built-in `system` pool runs the
    add-ons): the managed node group for the controller and add-ons. Required there. Default:
    every key at its default."""
    service_cidr: NotRequired[str]
    """The cluster's Kubernetes Service range (`serviceIpv4Cidr`), create-only. Default: the one EKS
    would pick, 172.20.0.0/16 when a VPC CIDR block is in 10.0.0.0/8, else 10.100.0.0/16; set
    explicitly, so the routers' NetworkPolicy can name the API server's ClusterIP."""
    nvme_check: NotRequired[str]
    """What the serving pod's start-up NVMe check does when the compile-cache path is not on the
    node's local NVMe: `warn` logs it and starts anyway (slower, on EBS); `fail` stops the pod
    with the reason, so it never silently runs from EBS. One of `warn`, `fail`. Default: `warn`."""
    endpoint_public_access: NotRequired[bool]
    """The EKS API server's public endpoint (`endpointPublicAccess`, EKS's default true). The
    private endpoint is always on, so nodes and pods reach the API inside the VPC. `false`:
    private only, and `warmstart preview`/`up` (the Kubernetes objects) must run from inside the
    VPC or a network routed to it (VPN, Direct Connect, a bastion)
    (https://docs.aws.amazon.com/eks/latest/userguide/cluster-endpoint.html). Default: `true`."""
    public_access_cidrs: NotRequired[list[str]]
    """The public IPv4 blocks that may reach the public endpoint (`publicAccessCidrs`, EKS's default
    0.0.0.0/0; at most 40): e.g. your office's and CI runners' egress addresses. Only with
    `endpointPublicAccess: true`. Default: `["0.0.0.0/0"]`."""


class CapacityReservationSectionArgs(TypedDict):
    """One capacity-reservation selector term (an On-Demand Capacity Reservation or a Capacity
    Block): by `id` alone, or by `tags` (optionally of one owner account). The same term becomes
    the node class's `capacityReservationSelectorTerms` entry in either mode
    (https://karpenter.sh/docs/tasks/odcrs/,
    https://docs.aws.amazon.com/eks/latest/userguide/auto-odcr.html)."""

    id: NotRequired[str]
    """The reservation's id (`cr-...`); alone in its term (the EC2NodeClass CRD refuses it with tags
    or an owner)."""
    tags: NotRequired[dict[str, str]]
    """Tags the reservations carry (`"*"` matches any value of a key); at most 20, none empty."""
    owner_id: NotRequired[str]
    """With `tags`: only reservations of this account (a reservation shared with you)."""


class CapacityBlockSectionArgs(TypedDict):
    """The pool's reservations are EC2 Capacity Blocks for ML: capacity for a fixed window, whose
    instances EC2 terminates 30 minutes before the block ends
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-capacity-blocks.html)."""

    ends_at: NotRequired[str]
    """When the block ends (ISO 8601 with a zone, e.g. `2027-03-01T11:30:00Z`); the render says when
    its nodes are drained. An end in the past is an error. An ISO 8601 date and time."""


class PoolCapacitySectionArgs(TypedDict):
    """Where a pool's nodes come from, in the order the engine tries them."""

    types: NotRequired[list[str]]
    """Purchase options, first choice first: `reserved` (the `reservations`), `spot`, `onDemand`.
    Both engines always try reserved, then spot, then on-demand, so the list is written in that
    order, e.g. `[reserved, onDemand]` or `[spot, onDemand]`. One of `reserved`, `spot`,
    `onDemand`. Default: `["onDemand"]`."""
    reservations: NotRequired[list[CapacityReservationSectionArgs]]
    """With `reserved`: the reservations (ODCRs or Capacity Blocks) the pool launches into. Default:
    `[]`."""
    capacity_block: NotRequired[CapacityBlockSectionArgs]
    """Set when the reservations are Capacity Blocks for ML (Karpenter >= 1.6)."""
    reserved_nodes: NotRequired[int]
    """How many of the pool's nodes the reservations hold (their free instance count), for the
    render's cost and scale-out prediction: a launch beyond it falls back to the next type.
    Default: unknown."""
    spot_hourly_price_usd: NotRequired[float]
    """With `spot`: your expected spot price of one node per hour, for the render's costs (spot
    prices move; warmstart ships none). Default: unknown."""


class GpuPoolSectionArgs(TypedDict):
    """A set of GPU nodes (one Karpenter / Auto Mode NodePool). The stack's `gpuPools[]` section
    (`warmstart.config.GpuPool`), key for key; its validation and defaults are that model's."""

    name: str
    """Pool name; also the NodePool and node class name."""
    instance_types: list[str]
    """EC2 instance types the pool may launch; each must be in warmstart's GPU table."""
    capacity_types: NotRequired[list[str]]
    """Superseded by `capacity` (kept so existing stack files read the same): `on-demand` and/or
    `spot`. Give one of the two, not both. One of `on-demand`, `spot`. Default: `["on-demand"]`."""
    capacity: NotRequired[PoolCapacitySectionArgs]
    """Where the pool's nodes come from: reservations (ODCRs, Capacity Blocks), spot, on-demand, in
    order (see `PoolCapacity`). Default: `capacityTypes`, i.e. on-demand."""
    max_gpus: NotRequired[int]
    """Upper bound on GPUs the pool may run (NodePool `limits`). Default: enough for every model on
    the pool to surge one replica, plus the warm spare nodes."""
    warm_nodes: NotRequired[int]
    """Spare nodes kept up and staged (the image, and the weights of every staged model on the pool)
    by low-priority placeholder pods that any serving pod preempts, so a scale-out lands on a
    warm node; Karpenter or Auto Mode then launches a replacement spare. Each spare costs its
    instance's price around the clock. The pool's models must share one instance type. Default:
    `0`."""
    hourly_price_usd: NotRequired[float]
    """Your price of one node of the pool per hour (on-demand or negotiated; a reserved node is
    billed at it whether used or not), for the render's cost of `warmNodes` and of each model at
    its min and max replicas; warmstart ships no price list (prices differ by region and change)."""
    ephemeral_storage_gib: NotRequired[int]
    """`clusterMode: auto` only: the NodeClass `ephemeralStorage.size`, in GiB. Auto Mode puts
    ephemeral storage on the local NVMe (RAID0) only while this is smaller than the NVMe of the
    instance, and otherwise silently on EBS. Default: 80, or less when the pool's smallest NVMe
    needs it; a value at or above that NVMe is an error. In a stack file the key is
    `ephemeralStorageGiB`."""


class ModelBucketSectionArgs(TypedDict):
    """The S3 bucket that holds every model's weights: a `models[].source` written as a key prefix
    is in it, and one written as `s3://bucket/prefix` must name it. The stack's `modelBucket`
    section (`warmstart.config.ModelBucketConfig`), key for key; its validation and defaults are
    that model's."""

    name: NotRequired[str]
    """Bucket name. Default (created bucket): `<namePrefix>-models-<hash8>`, unique to the account
    once `accountId` is recorded (see docs/aws-layer.md)."""
    create: NotRequired[bool]
    """Create the bucket with warmstart's baseline (private, encrypted, TLS-only, versioned,
    owner-enforced). `false`: use the existing bucket `name`, whose settings warmstart leaves
    alone. Default: `true`."""
    restrict_to_vpc_endpoint: NotRequired[bool]
    """Deny object access and bucket listings that do not come through the stack's S3 Gateway
    endpoint (`aws:SourceVpce`), except by the `admins` principals; the identities that deploy
    keep HeadBucket/ListBucket and the bucket's configuration. Needs `create: true`. Default:
    `false`."""
    admins: NotRequired[list[str]]
    """IAM role or user ARNs (`*` wildcards allowed, e.g. for SSO roles) exempt from
    `restrictToVpcEndpoint`, so they can upload and inspect weights from outside the VPC.
    Required with `restrictToVpcEndpoint`. Default: `[]`."""
    deployers: NotRequired[list[str]]
    """With `restrictToVpcEndpoint`: every role that runs preview, up or refresh on the stack (a CI
    deploy role and its read-only drift-check role), exempt from the listing Deny only, so each
    can read the bucket; the policy then names exactly these, whoever runs. Default: the identity
    running the deployment, so another role's preview sees a policy change. Default: `[]`."""
    delete_on_destroy: NotRequired[bool]
    """`false` (default): `destroy` keeps a created bucket, its weights and its settings (they leave
    the stack's state only). `true`: `destroy` deletes the bucket and every object in it.
    Default: `false`."""


class CompileCacheBucketSectionArgs(TypedDict):
    """The S3 bucket that holds the torch.compile cache, one key prefix per model. The stack's
    `compileCacheBucket` section (`warmstart.config.CompileCacheBucketConfig`), key for key; its
    validation and defaults are that model's."""

    name: NotRequired[str]
    """Bucket name. Default: `<namePrefix>-compile-cache-<hash8>`, unique to the account once
    `accountId` is recorded (see docs/aws-layer.md)."""
    expire_after_days: NotRequired[int]
    """Days after which a cache object (and, one day later, its noncurrent versions) is deleted.
    Entries are cheap to rebuild and their keys change with every image, so old ones are only
    cost. Default: `30`."""


class ScraperPodsSectionArgs(TypedDict):
    """The pods of your own Prometheus, which the NetworkPolicies admit to the metrics ports."""

    namespace: str
    """Namespace of the Prometheus pods (e.g. `monitoring`)."""
    pod_labels: dict[str, str]
    """Labels that select exactly the Prometheus server pods (e.g. `{app.kubernetes.io/name:
    prometheus}`, as prometheus-operator labels them)."""


class KedaSectionArgs(TypedDict):
    """KEDA, which scales each autoscaled model's Deployment (its ScaledObject)."""

    create: NotRequired[bool]
    """Install KEDA (its pinned chart, in `namespace`) when a model autoscales or
    `modelStacks.autoscaling` is set. `false`: a KEDA of your own already runs in `namespace`;
    warmstart installs none but still creates the ScaledObjects, which need its CRDs
    (`keda.sh/v1alpha1`). On the managed Prometheus path (no `prometheusUrl`) the query role then
    trusts `<namespace>/<operatorServiceAccount>`: annotate that ServiceAccount with the role
    (`eks.amazonaws.com/role-arn`, the stack's `kedaOperatorRoleArn`). Default: `true`."""
    namespace: NotRequired[str]
    """Namespace KEDA runs in: warmstart's (created with it), or yours with `create: false`.
    Default: `keda`."""
    operator_service_account: NotRequired[str]
    """The KEDA operator's ServiceAccount (the chart's `serviceAccount.operator.name`): the subject
    the query role's trust policy names. Default: `keda-operator`."""


class MonitoringSectionArgs(TypedDict):
    """Where vLLM's metrics go, for `models[].autoscaling`. The stack's `monitoring` section
    (`warmstart.config.MonitoringConfig`), key for key; its validation and defaults are that
    model's."""

    prometheus_url: NotRequired[str]
    """An existing Prometheus-compatible query endpoint that already scrapes the vLLM pods (e.g.
    `http://prometheus-operated.monitoring.svc:9090`); KEDA queries it without AWS signing.
    Default: warmstart creates an Amazon Managed Service for Prometheus workspace and its managed
    collector when a model autoscales."""
    scraper: NotRequired[ScraperPodsSectionArgs]
    """With `prometheusUrl`: the Prometheus pods that scrape the vLLM pods and the routers. Every
    warmstart pod sits behind a NetworkPolicy, so only the pods named here may read the metrics
    ports (vLLM's metrics-only port and the routers' metrics listener); required when a model
    autoscales on your Prometheus."""
    keda: NotRequired[KedaSectionArgs]
    """KEDA: warmstart's own (default) or one you run already (`create: false`). Default: every key
    at its default."""


__all__ = [
    "CapacityBlockSectionArgs",
    "CapacityReservationSectionArgs",
    "ClusterSectionArgs",
    "CompileCacheBucketSectionArgs",
    "GpuPoolSectionArgs",
    "KedaSectionArgs",
    "ModelBucketSectionArgs",
    "MonitoringSectionArgs",
    "NetworkSectionArgs",
    "PoolCapacitySectionArgs",
    "ScraperPodsSectionArgs",
    "SystemNodeGroupSectionArgs",
]
