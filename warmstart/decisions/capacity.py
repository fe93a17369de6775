"""Where a GPU pool's nodes come from, and what the account must allow for them (pure).

- Both engines try reserved capacity first, then spot, then on-demand: Karpenter models a
  reservation as free and prioritises it ("Prioritization Behavior",
  https://karpenter.sh/docs/tasks/odcrs/), and EKS Auto Mode prioritises a NodeClass's selected
  reservations over on-demand and spot (https://docs.aws.amazon.com/eks/latest/userguide/auto-odcr.html).
  A pool's `capacity.types` is that order; another order cannot be rendered.
- Reservations need Karpenter >= 1.3 with the `ReservedCapacity` feature gate, Capacity Blocks
  >= 1.6 (https://karpenter.sh/docs/tasks/odcrs/).
- A Capacity Block's instances are terminated by EC2 from 30 minutes before its end; Karpenter
  starts draining them 10 minutes before that (https://karpenter.sh/docs/tasks/odcrs/#capacity-blocks).
- EC2 bounds the vCPUs of running GPU instances per account, region and family class, on-demand
  and spot separately (warmstart/data/ec2_vcpu_quotas.csv and its SOURCES.md).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from importlib import resources

from . import gpu_pools
from .instances import GpuInstance

# The engines' order of preference (lower first).
ENGINE_PRIORITY = ("reserved", "spot", "onDemand")
KARPENTER_MIN_RESERVED = (1, 3)
KARPENTER_MIN_CAPACITY_BLOCK = (1, 6)
# The chart's feature-gate value (charts/karpenter/values.yaml `settings.featureGates`, v1.14.1).
RESERVED_CAPACITY_FEATURE_GATE = "reservedCapacity"
# Capacity Blocks: EC2 terminates from 30 min before the end; Karpenter drains 10 min before that.
CAPACITY_BLOCK_EC2_TERMINATES_BEFORE_END = timedelta(minutes=30)
CAPACITY_BLOCK_KARPENTER_DRAINS_BEFORE_TERMINATION = timedelta(minutes=10)
# Karpenter's label for the kind of reservation a reserved node runs in (`default` | `capacity-block`).
CAPACITY_RESERVATION_TYPE_LABEL = "karpenter.k8s.aws/capacity-reservation-type"
# Spot survives only where a replica can go away: the model keeps serving on the others.
MIN_SPOT_REPLICAS = 2


def spot_replicas_problem(pool: str, capacity_types: Sequence[str], model: str, fewest: int) -> str | None:
    """Why `model`, at its fewest `fewest` replicas, cannot run on `pool` (None when it can):
    the one rule of a model meeting a pool that may run on spot, which an inline model, a model
    stack and a ServedModel each run (warmstart/plan/platform_rules.py `spot_problem`). A spot
    node can be reclaimed with two minutes' warning
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html).
    Every model keeps a PDB (maxUnavailable 1, manifests/serving.py) and each mode drains the
    node on the warning (Karpenter through the stack's interruption queue, Auto Mode on its
    own), so a model survives it only with another replica serving meanwhile."""
    if "spot" not in capacity_types or fewest >= MIN_SPOT_REPLICAS:
        return None
    return (f"pool {pool!r} may run on spot, but model {model!r} runs {fewest} replica(s) at its fewest: a spot "
            "interruption would take it offline until a new node has loaded it")


# A reservation id in a shipped stack file that a team must replace with its own.
PLACEHOLDER_RESERVATION_ID = "cr-00000000000000000"


def version_tuple(version: str) -> tuple[int, int]:
    major, minor, *_ = version.split(".")
    return int(major), int(minor)


def order_problem(types: Sequence[str]) -> str | None:
    """Why `types` cannot be rendered (repeated, or not in the engines' order), or None."""
    if len(set(types)) != len(types):
        return "lists a capacity type more than once"
    ranked = sorted(types, key=ENGINE_PRIORITY.index)
    if list(types) != ranked:
        return (f"is not in the order both engines try capacity in (reserved, then spot, then onDemand), "
                f"which a NodePool cannot change: write it as [{', '.join(ranked)}]")
    return None


def selector_term(mode: str, id: str | None, tags: dict[str, str] | None, owner_id: str | None) -> dict:
    """One `capacityReservationSelectorTerms` entry in the mode's spelling: the EC2NodeClass
    names the owner `ownerID` (CRD v1.14.1), the Auto Mode NodeClass `owner` (auto-odcr page)."""
    if id is not None:
        return {"id": id}
    term: dict = {"tags": dict(sorted((tags or {}).items()))}
    if owner_id is not None:
        term["ownerID" if mode == "karpenter" else "owner"] = owner_id
    return term


def selector_term_problem(id: str | None, tags: dict[str, str] | None, owner_id: str | None) -> str | None:
    """What the EC2NodeClass CRD's rules would refuse in one term (its CEL rules are not
    checked offline by a schema validator, so they are checked here first), or None."""
    if id is not None and (tags is not None or owner_id is not None):
        return "gives `id` together with `tags` or `ownerId`; the CRD allows an id only alone in its term"
    if id is None and tags is None:
        return "has neither `id` nor `tags`; the CRD needs one of them (an `ownerId` alone selects nothing)"
    if tags is not None and any(k == "" or v == "" for k, v in tags.items()):
        return "has an empty tag key or value, which the CRD refuses"
    return None


def karpenter_version_problem(version: str, reserved: bool, capacity_block: bool) -> str | None:
    v = version_tuple(version)
    if capacity_block and v < KARPENTER_MIN_CAPACITY_BLOCK:
        return f"Capacity Blocks need Karpenter >= {'.'.join(map(str, KARPENTER_MIN_CAPACITY_BLOCK))}, pinned is {version}"
    if reserved and v < KARPENTER_MIN_RESERVED:
        return f"capacity reservations need Karpenter >= {'.'.join(map(str, KARPENTER_MIN_RESERVED))}, pinned is {version}"
    return None


def capacity_block_times(ends_at: datetime) -> tuple[datetime, datetime]:
    """(when Karpenter starts draining, when EC2 starts terminating) a Capacity Block's nodes."""
    terminate = ends_at - CAPACITY_BLOCK_EC2_TERMINATES_BEFORE_END
    return terminate - CAPACITY_BLOCK_KARPENTER_DRAINS_BEFORE_TERMINATION, terminate


# --------------------------------------------------------------------------------------
# vCPU quotas


@dataclass(frozen=True)
class QuotaClass:
    """One family class's EC2 vCPU quotas (warmstart/data/ec2_vcpu_quotas.csv)."""

    name: str
    families: frozenset[str]
    on_demand_code: str
    on_demand_name: str
    spot_code: str
    spot_name: str
    spot_fallback_code: str | None = None
    """The spot quota that holds these families in an account that does not list `spot_code`:
    the P5 families' "All P5 Spot Instance Requests" (L-C4BD4855) is a quota of its own in some
    accounts, and in others "All P Spot Instance Requests" (L-7212CCBC) covers every P family."""
    spot_fallback_name: str | None = None


@cache
def quota_classes() -> tuple[QuotaClass, ...]:
    text = resources.files("warmstart.data").joinpath("ec2_vcpu_quotas.csv").read_text()
    return tuple(QuotaClass(r["quota_class"], frozenset(r["families"].split()), r["on_demand_quota_code"],
                            r["on_demand_quota_name"], r["spot_quota_code"], r["spot_quota_name"],
                            r["spot_quota_fallback_code"] or None, r["spot_quota_fallback_name"] or None)
                 for r in csv.DictReader(text.splitlines()))


def quota_class(instance: GpuInstance) -> QuotaClass:
    for q in quota_classes():
        if instance.family in q.families:
            return q
    raise LookupError(f"no EC2 vCPU quota class covers family {instance.family!r} "
                      "(add it to warmstart/data/ec2_vcpu_quotas.csv)")


@dataclass(frozen=True)
class QuotaNeed:
    """vCPUs one quota must allow for the stack's pools at their limits."""

    code: str
    name: str
    vcpus: int
    pools: tuple[str, ...]
    """The pools (and their node counts) that need it, for the message: `h100 (3 x p5.48xlarge)`."""
    fallback: tuple[str, str] | None = None
    """(code, name) of the quota that holds this need instead where the account does not list
    `code` (QuotaClass.spot_fallback_code)."""
    instead_of: str | None = None
    """The code this need was moved from because the account does not list it, if any."""


PoolLimit = tuple[str, Sequence[str], Sequence[GpuInstance], int]
"""One pool for `quota_needs`: (name, capacity types, instance types, GPU limit)."""


def _quotas_of(inst: GpuInstance, types: Sequence[str], unlisted: frozenset[str]
               ) -> list[tuple[str, str, tuple[str, str] | None, str | None]]:
    """(code, name, fallback, instead_of) of each quota a node of `inst` counts against."""
    q = quota_class(inst)
    out: list[tuple[str, str, tuple[str, str] | None, str | None]] = []
    if "onDemand" in types or "reserved" in types:
        out.append((q.on_demand_code, q.on_demand_name, None, None))
    if "spot" in types:
        fallback = (q.spot_fallback_code, q.spot_fallback_name or "") if q.spot_fallback_code else None
        if fallback is not None and q.spot_code in unlisted:
            out.append((fallback[0], fallback[1], None, q.spot_code))
        else:
            out.append((q.spot_code, q.spot_name, fallback, None))
    return out


def quota_needs(pools: Iterable[PoolLimit], unlisted: Iterable[str] = ()) -> list[QuotaNeed]:
    """What each quota must allow: per pool `(name, capacity types, instance types, GPU
    limit)`, the nodes within the limit with the most vCPUs of that quota
    (`gpu_pools.launch_nodes` over the pool's types the quota covers), counted against the
    on-demand quota of their class when the pool may run on-demand or reserved (reservations
    count against it), and against the spot quota when it may run spot (either may end up
    holding all of them). `unlisted`: quota codes the account does not have, whose needs move
    to their fallback. Sorted by code."""
    gone = frozenset(unlisted)
    need: dict[str, tuple[str, int, list[str], tuple[str, str] | None, str | None]] = {}
    for name, types, insts, max_gpus in pools:
        groups: dict[str, list[GpuInstance]] = {}
        meta: dict[str, tuple[str, tuple[str, str] | None, str | None]] = {}
        for inst in insts:
            for code, qname, fallback, instead_of in _quotas_of(inst, types, gone):
                groups.setdefault(code, []).append(inst)
                meta.setdefault(code, (qname, fallback, instead_of))
        for code, group in groups.items():
            nodes = gpu_pools.launch_nodes(group, max_gpus)
            if not nodes:
                continue
            qname, fallback, instead_of = meta[code]
            n0, vcpus, who, fb, io = need.get(code, (qname, 0, [], fallback, instead_of))
            shown = " + ".join(f"{count} x {inst.instance_type}" for inst, count in nodes)
            need[code] = (n0, vcpus + sum(count * inst.vcpu for inst, count in nodes),
                          who + [f"{name} ({shown})"], fb or fallback, io or instead_of)
    return [QuotaNeed(code, n, v, tuple(w), fb, io) for code, (n, v, w, fb, io) in sorted(need.items())]


# The non-GPU nodes (the Karpenter-mode `general-purpose` pool, the system node group: m6i/m7i)
# count against "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances", L-1216C47A,
# in vCPUs (https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html; the
# code as the Service Quotas console's page for it names it). New accounts start low on it.
STANDARD_ON_DEMAND_CODE = "L-1216C47A"
STANDARD_ON_DEMAND_NAME = "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"


def standard_need(parts: Sequence[tuple[str, int]]) -> QuotaNeed | None:
    """The on-demand Standard quota's need: `(what, vCPUs)` per non-GPU node group at its limit
    (the CPU pool at its `limits.cpu`, the system node group at its size); None when empty."""
    parts = [(what, vcpus) for what, vcpus in parts if vcpus > 0]
    if not parts:
        return None
    return QuotaNeed(STANDARD_ON_DEMAND_CODE, STANDARD_ON_DEMAND_NAME, sum(v for _, v in parts),
                     tuple(what for what, _ in parts))


def increase_command(code: str, vcpus: int, region: str) -> str:
    """The exact AWS CLI request that raises a quota to `vcpus`."""
    return (f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} "
            f"--desired-value {vcpus} --region {region}")


# --------------------------------------------------------------------------------------
# Prices and where the next node comes from (for the render)

LABEL = {"reserved": "reserved", "spot": "spot", "onDemand": "on-demand"}


def price_of(capacity_type: str, hourly_price_usd: float | None, spot_hourly_price_usd: float | None) -> float | None:
    """Price of one node-hour of a capacity type, when known. A reserved node is billed at the
    reservation's (on-demand or negotiated) rate whether a node runs in it or not
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-capacity-reservations.html), so its
    price is `hourlyPriceUsd`; spot's moves and is only what the config says."""
    return spot_hourly_price_usd if capacity_type == "spot" else hourly_price_usd


def usd(value: float | None) -> str:
    return f"${value:,.2f}" if value is not None else "unknown"


def node_source(types: Sequence[str], node_index: int, reserved_nodes: int | None) -> tuple[str, str | None]:
    """(capacity type the `node_index`-th node of a pool (1-based) comes from, the type it falls
    back to when that one has none). Reserved holds `reserved_nodes` nodes when that is known;
    beyond it the next type serves."""
    first = types[0]
    rest = list(types[1:])
    if first == "reserved" and reserved_nodes is not None and node_index > reserved_nodes:
        return (rest[0], rest[1] if len(rest) > 1 else None) if rest else ("none", None)
    return first, rest[0] if rest else None
