"""The quota preflight: before `preview` or `up` reach the engine, read the account's EC2 vCPU
quotas for the GPU families the pools launch, with the deployer's own credentials, and compare
them with what the pools need at their limits; and check what else a pool's nodes need of the
account before any of them can launch (the EC2 Spot service-linked role, the reservations).

On a fresh account the quota for P and G instances is usually too small for one p5.48xlarge
(192 vCPUs) or a few g6e nodes; Karpenter or Auto Mode then cannot launch a node, the vLLM pods
stay Pending and the first `up` waits out the Deployments' timeout. So:

- need, of an environment stack: every node each pool may hold at its GPU limit (`maxGpus`,
  derived or given: the limit bounds the nodes whoever asks for them, its model stacks
  included), the mix of its instance types with the most vCPUs (`gpu_pools.launch_nodes`);
  of a model stack: its own model at `maxReplicas` (or `replicas`) plus a rollout's surge pod
  on its platform's pool. In vCPUs, per quota: the On-Demand quota of the family class where
  the pool may run on-demand or reserved (reservations count against it), the Spot quota
  where it may run spot (decisions/capacity.py);
- each quota is read with Service Quotas `GetServiceQuota` (the account's applied value; the
  AWS default where none is applied). A quota the account does not list at all with a
  fallback (the P5 families' spot quota) is replaced by its fallback, and the line says which
  was read. A quota below the need stops the command with exit 4 (`EXIT_QUOTA`), naming the
  quota, its value, the need and the exact request that raises it;
- a Karpenter-mode pool that may run spot needs the EC2 Spot service-linked role: without it
  Karpenter's CreateFleet fails with AuthFailure.ServiceLinkedRoleCreationNotPermitted (its
  controller may not create the role), it marks spot unavailable and launches on-demand, and a
  spot-only pool launches nothing (aws/karpenter-provider-aws
  pkg/providers/instance/instance.go; https://karpenter.sh/docs/troubleshooting/#missing-service-linked-role;
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/service-linked-roles-spot-instance-requests.html).
  It is read with IAM GetRole; a missing role exits 4 with the one command that creates it;
- each reservation given by id is read (EC2 DescribeCapacityReservations: its AZ, state and
  start); a reservation the pool's nodes cannot use (an AZ none of the GPU subnets is in, a
  Capacity Block that has not started, another instance type, not active) is a warning where
  the pool falls back to other capacity, and exits 4 where the pool is `reserved` only and
  none of its reservations is usable;
- no permission to read any of it, an answer without a value, credentials that cannot be
  loaded (a stale AWS_PROFILE) or no answer at all is a warning that says what was not
  checked, never a failure: the engine still runs, and the pods wait for capacity as they
  would have.

A reservation id left at the shipped placeholder is named too (a warning: nodes then launch
on-demand, as the fallback allows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from .. import config
from ..config import CAPACITY_TYPE_LABEL_VALUE, NAMESPACE
from ..decisions import capacity, gpu_pools, node_fit
from ..plan.platform import platform_fact
from .preflight import credentials_problem

SERVICE_CODE = "ec2"
# Error codes that say the caller may not read quotas (Service Quotas, or an SCP in front of it).
DENIED = frozenset({"AccessDeniedException", "AccessDenied", "UnauthorizedOperation", "NoAvailableOrganizationException"})
# The EC2 Spot service-linked role, and the one command that creates it
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/service-linked-roles-spot-instance-requests.html).
SPOT_ROLE = "AWSServiceRoleForEC2Spot"
SPOT_ROLE_COMMAND = "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com"
# DescribeCapacityReservations `State` values in which instances launch into a reservation
# (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CapacityReservation.html).
USABLE_RESERVATION_STATES = frozenset({"active"})


@dataclass(frozen=True)
class QuotaShort:
    """One quota below what the pools need."""

    code: str
    name: str
    value: float
    need: int
    pools: tuple[str, ...]
    region: str
    instead_of: str | None = None
    """The quota code the account does not list, whose need this one holds instead."""

    @property
    def request(self) -> str:
        return capacity.increase_command(self.code, self.need, self.region)

    def __str__(self) -> str:
        read = (f" (read because the account lists no quota {self.instead_of}: this one holds those instances "
                "instead)" if self.instead_of else "")
        return (f"EC2 quota \"{self.name}\" ({self.code}) in {self.region} is {self.value:g} vCPUs{read}, but the GPU "
                f"pools need {self.need} at their limits ({', '.join(self.pools)}): Karpenter / Auto Mode could not "
                f"launch the nodes and the pods would stay Pending; fix: `{self.request}` (then wait for the increase), "
                "or lower the pools' maxGpus, maxReplicas, warmNodes or instance sizes")


@dataclass
class QuotaReport:
    """What the quota preflight found."""

    checked: list[tuple[capacity.QuotaNeed, float]] = field(default_factory=list)
    """Each quota read and its value."""
    short: list[QuotaShort] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """What else stops the pools' nodes from launching (the Spot role, unusable reservations)."""
    warnings: list[str] = field(default_factory=list)

    def passed_line(self) -> str:
        parts = [f"{n.name} ({n.code}{f', read as the account lists no {n.instead_of}' if n.instead_of else ''}) "
                 f"{v:g} vCPUs >= {n.vcpus} needed" for n, v in self.checked]
        return "warmstart: quota preflight passed: " + ("; ".join(parts) if parts else "no quota was read")


class QuotaShortFailed(Exception):
    def __init__(self, operation: str, stack: str, short: list[QuotaShort], refused: list[str] | None = None) -> None:
        self.short = short
        self.refused = list(refused or [])
        n = len(short)
        what = []
        if n:
            what.append(f"{n} EC2 vCPU quota{'s are' if n > 1 else ' is'} below what the GPU pools need")
        k = len(self.refused)
        if k:
            what.append(f"{k} other account prerequisite{'s' if k > 1 else ''} of the GPU pools' nodes "
                        f"{'are' if k > 1 else 'is'} missing")
        lines = [f"warmstart: cannot run `{operation}` on stack '{stack}': {'; '.join(what)} (no engine call was "
                 "made; `--skip-preflight` skips this check):"]
        lines += [f"  - {s}" for s in short] + [f"  - {r}" for r in self.refused]
        super().__init__("\n".join(lines))


def stack_region(stack_plan: Any) -> str:
    """The region of an environment stack (its config) or of a model stack (its platform's)."""
    return str(platform_fact(stack_plan, "region"))


def _types(labels: Any) -> tuple[str, ...]:
    """A platform contract's capacity-type label values as `capacity.types` names."""
    back = {v: k for k, v in CAPACITY_TYPE_LABEL_VALUE.items()}
    return tuple(back.get(str(t), str(t)) for t in labels)


def pool_limits(stack_plan: Any) -> list[capacity.PoolLimit]:
    """What each pool may launch, for `capacity.quota_needs`. An environment stack's pools at
    their GPU limits. A model stack's platform owns the pool and checks it at its limit; the
    model stack checks its own model there at maxReplicas (or replicas) plus a surge pod."""
    cluster = getattr(stack_plan, "cluster", None)
    if cluster is not None:
        return [(p.name, p.capacity.types, p.instances, p.max_gpus) for p in cluster.pools]
    contract, model = getattr(stack_plan, "contract", None), getattr(stack_plan, "model", None)
    facts = {p.name: p for p in contract.pools}.get(model.pool) if contract is not None and model is not None else None
    if facts is None:
        return []
    from ..plan.cluster import pool_model

    pods = model.max_replicas + gpu_pools.SURGE_PODS
    nodes = gpu_pools.nodes_for(pool_model(model), pods)
    what = "maxReplicas" if model.autoscaling is not None else "replicas"
    return [(f"{facts.name} of platform {contract.stack!r}, for {model.name} at {what} {model.max_replicas} plus "
             f"{gpu_pools.SURGE_PODS} surge pod", _types(facts.capacity_types), [model.instance],
             nodes * model.instance.gpu_count)]


def standard_parts(stack_plan: Any) -> list[tuple[str, int]]:
    """The non-GPU node groups of an environment stack at their limits, in vCPUs: the
    Karpenter-mode CPU pool at its `limits.cpu` (Karpenter counts whole nodes' capacity against
    it, https://karpenter.sh/v1.14/concepts/nodepools/#speclimits; the limit already holds one
    node more for the last node's unused part) and the system node group at its size. Auto Mode's
    own general-purpose pool has no limit warmstart sets; a model stack's routers use its
    platform's pool, counted there."""
    cluster = getattr(stack_plan, "cluster", None)
    if cluster is None:
        return []
    parts = []
    if cluster.cpu_pool is not None:
        parts.append((f"{cluster.cpu_pool.name} (CPU limit {cluster.cpu_pool.cpu_limit})", cluster.cpu_pool.cpu_limit))
    group = cluster.system_node_group
    if group is not None:
        largest = max(group.instance_types, key=lambda t: node_fit.node_type(t).vcpu)
        parts.append((f"system nodes ({group.size} x {largest})", group.size * node_fit.node_type(largest).vcpu))
    return parts


def stack_needs(stack_plan: Any, unlisted: tuple[str, ...] = ()) -> list[capacity.QuotaNeed]:
    """The vCPUs each quota must allow for a stack (`pool_limits`, `standard_parts`). `unlisted`:
    quota codes the account does not have (their needs move to their fallback)."""
    needs = capacity.quota_needs(pool_limits(stack_plan), unlisted)
    standard = capacity.standard_need(standard_parts(stack_plan))
    return sorted([*needs, standard] if standard is not None else needs, key=lambda n: n.code)


def placeholder_warnings(stack_plan: Any) -> list[str]:
    """One line per reservation id still at the shipped placeholder."""
    cluster = getattr(stack_plan, "cluster", None)
    out = []
    for i, pool in enumerate(cluster.pools if cluster else ()):
        for j, (rid, _, _) in enumerate(pool.capacity.reservation_terms):
            if rid == capacity.PLACEHOLDER_RESERVATION_ID:
                fallback = [t for t in pool.capacity.types if t != "reserved"]
                then = (f"its nodes launch as {', then '.join(config.CAPACITY_TYPE_LABEL_VALUE[t] for t in fallback)} instead" if fallback else
                        "no node can launch at all (reserved is its only capacity type)")
                out.append(f"{NAMESPACE}:gpuPools[{i}].capacity.reservations[{j}].id is the placeholder {rid}, not a "
                           f"reservation of yours: pool {pool.name!r} launches into no reservation, {then}; fix: put "
                           f"your reservation's id there (`aws ec2 describe-capacity-reservations --region "
                           f"{stack_region(stack_plan)}`)")
    return out


def _code(err: Exception) -> str:
    return str((getattr(err, "response", None) or {}).get("Error", {}).get("Code", ""))


class Unreadable(Exception):
    """An answer that does not say what was asked (a Service Quotas answer without a value)."""


class NotListed(Exception):
    """The account has no quota of that code (NoSuchResourceException for its applied value and
    its AWS default alike)."""


def _value_of(answer: Any) -> tuple[float, str] | None:
    quota = answer.get("Quota") if isinstance(answer, dict) else None
    value = quota.get("Value") if isinstance(quota, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value), str(quota.get("QuotaName") or "")


def read_quota(client: Any, code: str) -> tuple[float, str]:
    """(value, name) of one EC2 quota: the account's applied value, else the AWS default.
    NotListed when the account has neither; Unreadable when the answer holds no finite value."""
    from botocore.exceptions import ClientError

    try:
        found = _value_of(client.get_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=code))
    except ClientError as err:
        if _code(err) != "NoSuchResourceException":
            raise
        found = None
    if found is not None:
        return found
    try:
        answer = client.get_aws_default_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=code)
    except ClientError as err:
        if _code(err) == "NoSuchResourceException":
            raise NotListed(code) from None
        raise
    found = _value_of(answer)
    if found is None:
        part = "Quota" if not isinstance(answer, dict) or not isinstance(answer.get("Quota"), dict) else "Value"
        raise Unreadable(f"Service Quotas answered without a {part} for it, applied or default")
    return found


def _check_yourself(code: str, region: str) -> str:
    return f"`aws service-quotas get-service-quota --service-code ec2 --quota-code {code} --region {region}`"


def check_quotas(stack_plan: Any, client: Any) -> QuotaReport:
    """Every quota the stack's pools need, read with `client` (a boto3 Service Quotas client)."""
    from botocore.exceptions import BotoCoreError, ClientError

    report = QuotaReport(warnings=placeholder_warnings(stack_plan))
    region = stack_region(stack_plan)
    values: dict[str, tuple[float, str]] = {}
    failed: dict[str, Exception] = {}
    unlisted: list[str] = []
    # A quota with a fallback is read first: whether the account lists it decides which quota
    # holds its instances (capacity.QuotaClass.spot_fallback_code).
    for need in stack_needs(stack_plan):
        if need.fallback is None:
            continue
        try:
            values[need.code] = read_quota(client, need.code)
        except NotListed:
            unlisted.append(need.code)
        except (ClientError, BotoCoreError, Unreadable) as err:
            failed[need.code] = err  # reported below, in the order of the codes
    needs = stack_needs(stack_plan, tuple(unlisted))
    for i, need in enumerate(needs):
        try:
            if need.code in failed:
                raise failed[need.code]
            value, name = values[need.code] if need.code in values else read_quota(client, need.code)
        except (ClientError, BotoCoreError, NotListed, Unreadable) as err:
            code = _code(err)
            if isinstance(err, NotListed):
                why = "Service Quotas knows no such quota in this account (NoSuchResourceException)"
            elif isinstance(err, Unreadable):
                why = str(err)
            elif code in DENIED:
                why = f"no permission to read it ({code}); give the deployer servicequotas:GetServiceQuota"
            else:
                why = f"Service Quotas did not answer ({code or type(err).__name__}: {err})"
            report.warnings.append(
                f"could not check EC2 quota \"{need.name}\" ({need.code}) in {region}: {why}. The pools need "
                f"{need.vcpus} vCPUs of it ({', '.join(need.pools)}); check it yourself: "
                f"{_check_yourself(need.code, region)}")
            if isinstance(err, (ClientError, BotoCoreError)) and code not in DENIED:
                # No answer at all: the next quota would only wait as long.
                rest = [f'"{n.name}" ({n.code}, {n.vcpus} vCPUs)' for n in needs[i + 1:]]
                if rest:
                    report.warnings.append(f"not checked either: {', '.join(rest)}")
                break
            continue
        name = name or need.name
        report.checked.append((capacity.QuotaNeed(need.code, name, need.vcpus, need.pools, need.fallback,
                                                  need.instead_of), value))
        if value < need.vcpus:
            report.short.append(QuotaShort(need.code, name, value, need.vcpus, need.pools, region, need.instead_of))
    return report


# --------------------------------------------------------------------------------------
# The EC2 Spot service-linked role


def spot_pools(stack_plan: Any) -> list[str]:
    """The Karpenter-mode pools that may launch spot (a model stack: its platform's pool)."""
    cluster = getattr(stack_plan, "cluster", None)
    if cluster is not None:
        return [p.name for p in cluster.pools if cluster.mode == "karpenter" and "spot" in p.capacity.types]
    contract, model = getattr(stack_plan, "contract", None), getattr(stack_plan, "model", None)
    if contract is None or model is None or contract.cluster_mode != "karpenter":
        return []
    return [p.name for p in contract.pools if p.name == model.pool and "spot" in _types(p.capacity_types)]


def check_spot_role(stack_plan: Any, iam: Any, report: QuotaReport) -> None:
    """Whether the account has the EC2 Spot service-linked role its spot pools need (IAM GetRole)."""
    from botocore.exceptions import BotoCoreError, ClientError

    pools = spot_pools(stack_plan)
    if not pools:
        return
    named = ", ".join(repr(p) for p in pools)
    try:
        iam.get_role(RoleName=SPOT_ROLE)
    except ClientError as err:
        code = _code(err)
        if code == "NoSuchEntity":
            report.refused.append(
                f"the account has no EC2 Spot service-linked role ({SPOT_ROLE}), which Karpenter's spot launches for "
                f"pool(s) {named} need and its controller may not create: EC2 answers "
                "AuthFailure.ServiceLinkedRoleCreationNotPermitted, Karpenter marks spot unavailable and launches "
                "on-demand at on-demand prices (a spot-only pool launches nothing); fix: "
                f"`{SPOT_ROLE_COMMAND}` (once per account), or remove spot from the pools' capacity.types")
            return
        why = (f"no permission to read it ({code}); give the deployer iam:GetRole on role/aws-service-role/"
               f"spot.amazonaws.com/{SPOT_ROLE}" if code in DENIED else f"IAM did not answer ({code}: {err})")
        report.warnings.append(f"could not check the EC2 Spot service-linked role {SPOT_ROLE} that pool(s) {named} "
                               f"need: {why}; check it yourself: `aws iam get-role --role-name {SPOT_ROLE}` "
                               f"(create it with `{SPOT_ROLE_COMMAND}`)")
    except BotoCoreError as err:
        report.warnings.append(f"could not check the EC2 Spot service-linked role {SPOT_ROLE} that pool(s) {named} "
                               f"need: IAM did not answer ({type(err).__name__}: {err}); check it yourself: "
                               f"`aws iam get-role --role-name {SPOT_ROLE}`")


# --------------------------------------------------------------------------------------
# Reservations


def reservation_pools(stack_plan: Any) -> list[tuple[int, Any, list[str]]]:
    """(index, pool, reservation ids) of each pool of an environment stack that names
    reservations by id (the shipped placeholder left out: it is warned about on its own)."""
    cluster = getattr(stack_plan, "cluster", None)
    out = []
    for i, pool in enumerate(cluster.pools if cluster else ()):
        ids = [rid for rid, _, _ in pool.capacity.reservation_terms
               if rid is not None and rid != capacity.PLACEHOLDER_RESERVATION_ID]
        if ids and pool.capacity.reserved:
            out.append((i, pool, ids))
    return out


def subnet_zones(stack_plan: Any, ec2: Any) -> list[tuple[str, str | None]]:
    """(AZ name, AZ id) of the subnets the GPU node classes select (the private subnets): a
    pinned list, else the region's first `azCount` available AZs, as the network component
    picks them; an existing VPC's private subnets as EC2 describes them."""
    net = stack_plan.aws.network
    if not net.create:
        subnets = ec2.describe_subnets(SubnetIds=list(net.private_subnet_ids)).get("Subnets", [])
        return sorted({(str(s["AvailabilityZone"]), s.get("AvailabilityZoneId")) for s in subnets})
    zones = ec2.describe_availability_zones(Filters=[
        {"Name": "opt-in-status", "Values": ["opt-in-not-required"]},
        {"Name": "state", "Values": ["available"]}]).get("AvailabilityZones", [])
    ids = {str(z["ZoneName"]): z.get("ZoneId") for z in zones}
    names = list(net.availability_zones) if net.availability_zones else sorted(ids)[:net.az_count]
    return [(n, ids.get(n)) for n in names]


def _when(t: datetime, now: datetime) -> str:
    hours = (t - now).total_seconds() / 3600
    return f"{t.astimezone(timezone.utc).isoformat()} (in {hours:.1f} h)"


def reservation_problem(r: dict, pool: Any, zones: list[tuple[str, str | None]], now: datetime) -> str | None:
    """Why the pool's nodes cannot launch into reservation `r` (a DescribeCapacityReservations
    entry) now, or None."""
    rid = r.get("CapacityReservationId")
    kind = "Capacity Block" if r.get("ReservationType") == "capacity-block" else "reservation"
    start = r.get("StartDate")
    state = str(r.get("State") or "unknown")
    if isinstance(start, datetime) and start > now:
        return (f"{kind} {rid} has not started: it starts {_when(start, now)}, its state is {state}; no instance "
                "launches into it before then; fix: run this once it has started")
    if state not in USABLE_RESERVATION_STATES:
        return (f"{kind} {rid} is {state}, not active: no instance launches into it; fix: name an active "
                "reservation's id")
    az, az_id = r.get("AvailabilityZone"), r.get("AvailabilityZoneId")
    ours = [n for n, _ in zones]
    # AZ ids name the same zone in every account (a shared reservation's name may differ).
    matches = any(az_id == i if (az_id is not None and i is not None) else az == n for n, i in zones)
    if not matches:
        return (f"{kind} {rid} is in {az}{f' ({az_id})' if az_id else ''}, but the GPU nodes' subnets are in "
                f"{', '.join(ours) or 'no AZ'}: no node of the pool can launch there; fix: add a private subnet in "
                f"{az} (network.availabilityZones, or network.privateSubnetIds for an existing VPC), or use a "
                f"reservation in {' or '.join(ours) or 'one of their AZs'}")
    itype = r.get("InstanceType")
    if itype and itype not in pool.instance_types:
        return (f"{kind} {rid} holds {itype}, which is not one of pool {pool.name!r}'s instanceTypes "
                f"({', '.join(pool.instance_types)}); fix: add {itype} to the pool's instanceTypes")
    return None


def check_reservations(stack_plan: Any, ec2: Any, report: QuotaReport, now: datetime | None = None) -> None:
    """Each reservation a pool names by id, read (DescribeCapacityReservations): one its nodes
    cannot use is a warning where the pool falls back to other capacity, and a refusal where
    the pool is `reserved` only and has no usable reservation left."""
    from botocore.exceptions import BotoCoreError, ClientError

    pools = reservation_pools(stack_plan)
    if not pools:
        return
    now = now or datetime.now(timezone.utc)
    region = stack_region(stack_plan)
    try:
        zones = subnet_zones(stack_plan, ec2)
    except (ClientError, BotoCoreError) as err:
        report.warnings.append(f"could not check the GPU pools' reservations: the AZs of the GPU subnets could not be "
                               f"read ({_code(err) or type(err).__name__}: {err}); give the deployer "
                               "ec2:DescribeSubnets and ec2:DescribeAvailabilityZones, or check them yourself: "
                               f"`aws ec2 describe-capacity-reservations --region {region}`")
        return
    for i, pool, ids in pools:
        key = f"{NAMESPACE}:gpuPools[{i}].capacity"
        unusable, unchecked = [], []
        for rid in ids:
            try:
                found = ec2.describe_capacity_reservations(CapacityReservationIds=[rid]).get("CapacityReservations", [])
            except (ClientError, BotoCoreError) as err:
                code = _code(err)
                if code.startswith("InvalidCapacityReservationId"):
                    unusable.append(f"reservation {rid} does not exist in {region} for this account ({code}); fix: "
                                    "put the id of one of your reservations there (`aws ec2 "
                                    f"describe-capacity-reservations --region {region}`)")
                    continue
                why = (f"no permission ({code}); give the deployer ec2:DescribeCapacityReservations" if code in DENIED
                       else f"EC2 did not answer ({code or type(err).__name__}: {err})")
                unchecked.append(rid)
                report.warnings.append(f"could not check reservation {rid} of pool {pool.name!r}: {why}; check it "
                                       f"yourself: `aws ec2 describe-capacity-reservations --capacity-reservation-ids "
                                       f"{rid} --region {region}`")
                continue
            problem = reservation_problem(found[0], pool, zones, now) if found else (
                f"reservation {rid} is not in DescribeCapacityReservations' answer")
            if problem:
                unusable.append(problem)
        if not unusable:
            continue
        fallback = [t for t in pool.capacity.types if t != "reserved"]
        by_tags = any(rid is None for rid, _, _ in pool.capacity.reservation_terms)
        usable_left = len(ids) - len(unusable) - len(unchecked) > 0 or unchecked or by_tags
        if fallback or usable_left:
            then = (f"its nodes launch as {', then '.join(CAPACITY_TYPE_LABEL_VALUE[t] for t in fallback)} instead"
                    if not usable_left else "its nodes launch into its other reservations only")
            report.warnings.extend(f"{key}.reservations: pool {pool.name!r}: {u}; meanwhile {then}" for u in unusable)
        else:
            report.refused.extend(f"{key}.reservations: pool {pool.name!r} launches into its reservations only "
                                  f"(capacity.types: [reserved]), and none can hold a node: {u}; or add onDemand to "
                                  "capacity.types so the pool falls back" for u in unusable)


# --------------------------------------------------------------------------------------
# Clients and the whole preflight


def quotas_client(region: str) -> Any:
    """A Service Quotas client for the deployer's credentials: one attempt, short timeouts (a
    quota that cannot be read is only a warning)."""
    from .preflight import aws_client

    return aws_client("service-quotas", region, attempts=2, read_timeout=10)


def iam_client(region: str) -> Any:
    """An IAM client for the deployer's credentials (IAM is global; the region picks the partition)."""
    from .preflight import aws_client

    return aws_client("iam", region, attempts=2, read_timeout=10)


def ec2_client(region: str) -> Any:
    """An EC2 client for the deployer's credentials in the stack's region."""
    from .preflight import aws_client

    return aws_client("ec2", region, attempts=2, read_timeout=10)


def _client(factory: Callable[[str], Any], region: str, what: str, report: QuotaReport) -> Any | None:
    from botocore.exceptions import BotoCoreError

    try:
        return factory(region)
    except BotoCoreError as err:
        why, fix = credentials_problem(err)
        report.warnings.append(f"could not check {what}: {why}; fix: {fix}")
        return None


def run_quota_preflight(stack_plan: Any, client: Any | None = None, *, iam: Any | None = None, ec2: Any | None = None,
                        now: datetime | None = None) -> QuotaReport:
    """The quota preflight of a stack (and its Spot-role and reservation checks); each client
    defaults to the deployer's in the stack's region."""
    region = stack_region(stack_plan)
    needs = stack_needs(stack_plan)
    report = QuotaReport(warnings=placeholder_warnings(stack_plan))
    if needs:
        what = "the EC2 vCPU quotas the GPU pools need (" + ", ".join(f'"{n.name}" ({n.code}, {n.vcpus} vCPUs)'
                                                                     for n in needs) + ")"
        client = client if client is not None else _client(quotas_client, region, what, report)
        if client is not None:
            report = check_quotas(stack_plan, client)  # its warnings start with the placeholders'
    if spot_pools(stack_plan):
        iam = iam if iam is not None else _client(iam_client, region, f"the EC2 Spot service-linked role {SPOT_ROLE}",
                                                  report)
        if iam is not None:
            check_spot_role(stack_plan, iam, report)
    if reservation_pools(stack_plan):
        ec2 = ec2 if ec2 is not None else _client(ec2_client, region, "the GPU pools' reservations", report)
        if ec2 is not None:
            check_reservations(stack_plan, ec2, report, now)
    return report
