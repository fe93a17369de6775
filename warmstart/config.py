"""The stack config: one strict pydantic model tree, loaded once per program run.

A stack file (`stacks/Pulumi.<stack>.yaml`) holds `warmstart:<key>` entries; each key is a
field of `StackConfig` (camelCase, as Pulumi config is written). Unknown keys are errors.
Every field's description is the config reference (`warmstart config-reference`).
"""

from __future__ import annotations

import difflib
import json
import re
import typing
import unicodedata
from collections.abc import Mapping
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, PydanticUndefined

from . import versions
from .docstrings import describe_models
from .decisions import instances, tuning
from .decisions import autoscaling as scaling_rules
from .decisions import network as network_rules
from .decisions import routing as routing_rules
from .errors import ConfigError, ConfigErrors, listing

NAMESPACE = "warmstart"

# Every pattern here spells its classes in ASCII (`[0-9]`, `[A-Za-z0-9_]`), never `\d` or `\w`:
# both match any Unicode digit or letter in pydantic's Rust `regex` patterns and in Python's `re`
# (https://docs.rs/regex/latest/regex/#perl-character-classes-unicode-friendly), so an
# Arabic-Indic or fullwidth digit would pass as an account id, a region or an ARN.

DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# The largest `maxModelLen` a stack may ask for: 2^24 tokens, above the longest context any public
# model declares (Llama 4 Scout's 10M, https://ai.meta.com/blog/llama-4-multimodal-intelligence/);
# past it a typo (10^8, 2^63) would reach vLLM's arguments.
MAX_MODEL_LEN_CEILING = 2**24
# The smallest `targetWaitingPerReplica`: KEDA hands the HPA its threshold as a milli-quantity
# (`GetMetricTargetMili`, kedacore/keda pkg/scalers/scaler.go), so under 0.001 it is 0; under 0.1
# one waiting request would ask for more than ten replicas per replica, i.e. maxReplicas at once.
TARGET_WAITING_MIN = 0.1
# The longest `namePrefix` (given, or derived `ws-<stack>`): cluster, IAM role and bucket names are built on it.
NAME_PREFIX_MAX = 20
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<prefix>[^\s]*[^\s/])/?$")
# A stack model's `source` relative to the stack's model bucket: a key prefix, no scheme.
KEY_PREFIX = re.compile(r"^(?![a-zA-Z][a-zA-Z0-9+.-]*:)(?!/)(?!.*//)[^\s]*[^\s/]/?$")


def _full_s3_uri(v: str) -> str:
    if not S3_URI.match(v):
        raise ValueError("must be s3://bucket/prefix with a valid bucket name and a non-empty prefix")
    return v.rstrip("/")


def split_source(source: str) -> tuple[str | None, str]:
    """(bucket, prefix) of a model source: `s3://bucket/prefix`, or a relative prefix (bucket
    None). The prefix has no trailing slash."""
    if source.startswith("s3://"):
        bucket, _, prefix = source.removeprefix("s3://").partition("/")
        return bucket, prefix.rstrip("/")
    return None, source.rstrip("/")


def _rule(rule: str, fix: str, value: object) -> PydanticCustomError:
    """A validator's error that carries its own fix (and the offending value) to the CLI's
    message, instead of the generic one `_from_validation_error` gives pydantic's errors."""
    return PydanticCustomError("warmstart_rule", "{rule}", {"rule": rule, "fix": fix, "value": value})


def _gpu_instance_type(instance_type: str) -> str:
    """`instance_type` when warmstart's GPU table has it; else one line saying it has no GPU
    warmstart knows of, and naming the GPU families (not every type: the table has dozens)."""
    table = instances.catalog()
    if instance_type in table:
        return instance_type
    family = instance_type.split(".", 1)[0]
    sizes = [t for t, i in table.items() if i.family == family]
    if sizes:
        raise _rule(f"unknown GPU instance type: warmstart's GPU table has no {instance_type}",
                    f"use one of {', '.join(sizes)}", instance_type)
    families: dict[str, str] = {}
    for i in table.values():
        families.setdefault(i.family, i.gpu_model.removeprefix("NVIDIA ").split(" Server")[0])
    example = next(iter(table))
    raise _rule(f"unknown GPU instance type: {instance_type} has no GPU warmstart knows of (its family "
                f"{family} is not in warmstart/data/gpu_instances.csv)",
                f"use a type of a GPU family, e.g. {example}: "
                + ", ".join(f"{f} ({gpu})" for f, gpu in sorted(families.items())), instance_type)


# AWS's tag rules (https://docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html): at most
# 50 user tags per resource, a key of 1-128 and a value of 0-256 characters, of letters, numbers
# and spaces (any script) and `_ . : / = + - @`; no key or value starting with `aws:` in any case.
TAGS_PER_RESOURCE_MAX = 50
TAG_KEY_MAX, TAG_VALUE_MAX = 128, 256
_TAG_SYMBOLS = set("_.:/=+-@")
# Tags warmstart puts on one resource besides the stack's: `warmstart:stack` and
# `warmstart:prefix` on every one, and on a GPU node those of its launcher (Karpenter's `Name`,
# `karpenter.sh/nodeclaim`, `karpenter.sh/nodepool`, `karpenter.k8s.aws/ec2nodeclass`,
# `kubernetes.io/cluster/<cluster>`, `eks:eks-cluster-name`); a model stack's role carries
# `warmstart:stack`, `warmstart:platform`, `warmstart:prefix`, `Name`, `warmstart:model` and
# `warmstart:purpose`.
OWN_TAGS_ENVIRONMENT, OWN_TAGS_MODEL_STACK = 8, 6
# Keys the EC2NodeClass CRD refuses in `spec.tags`, which a karpenter-mode stack's tags reach
# (https://github.com/aws/karpenter-provider-aws/blob/v1.14.1/pkg/apis/crds/karpenter.k8s.aws_ec2nodeclasses.yaml).
_NODE_CLASS_RESTRICTED = ("eks:eks-cluster-name", "kubernetes.io/cluster", "karpenter.sh/nodepool",
                          "karpenter.sh/nodeclaim", "karpenter.k8s.aws/ec2nodeclass")


def _tag_text_problem(text: str, limit: int, wildcard: bool = False) -> str | None:
    if len(text) > limit:
        return f"is {len(text)} characters long, above AWS's {limit}"
    if wildcard and text == "*":
        return None
    bad = sorted({c for c in text if not (c in _TAG_SYMBOLS or c == " "
                                          or unicodedata.category(c)[0] in "LNZ")})
    if bad:
        return f"holds {', '.join(repr(c) for c in bad[:5])}, which AWS tags do not take"
    return None


def _aws_tags(own: int | None, selector: bool = False) -> AfterValidator:
    """A `tags` map checked against AWS's tag rules. `own`: how many tags warmstart adds to a
    resource besides these (None: a selector of existing resources' tags, not tags warmstart
    writes, so neither the count nor the `aws:` prefix applies, and `*` is any value)."""

    def check(tags: dict[str, str]) -> dict[str, str]:
        fix = "see AWS's tag rules: https://docs.aws.amazon.com/tag-editor/latest/userguide/tagging.html"
        if own is not None and len(tags) > TAGS_PER_RESOURCE_MAX - own:
            raise _rule(f"{len(tags)} tags: AWS allows {TAGS_PER_RESOURCE_MAX} per resource and warmstart adds up "
                        f"to {own} of its own to one", f"keep at most {TAGS_PER_RESOURCE_MAX - own} tags", None)
        for key, value in tags.items():
            problem = "is empty" if not key else _tag_text_problem(key, TAG_KEY_MAX)
            if problem is None and not selector and key.lower().startswith("aws:"):
                problem = "starts with `aws:`, which AWS reserves for its own tags"
            if problem is None and not selector and key.startswith(_NODE_CLASS_RESTRICTED):
                problem = "is a tag Karpenter sets on the nodes itself (the EC2NodeClass refuses it)"
            if problem is not None:
                raise _rule(f"tag key {key[:40]!r} {problem}", f"rename or remove the tag ({fix})", None)
            problem = _tag_text_problem(value, TAG_VALUE_MAX, wildcard=selector)
            if problem is None and not selector and value.lower().startswith("aws:"):
                problem = "starts with `aws:`, which AWS reserves for its own tags"
            if problem is not None:
                raise _rule(f"the value of tag {key[:40]!r} {problem}", f"change the value ({fix})", None)
        return tags

    return AfterValidator(check)


def _unique_instance_types(types: list[str]) -> list[str]:
    """`types` when each is listed once; else one line naming the repeated ones."""
    counts: dict[str, int] = {}
    for t in types:
        counts[t] = counts.get(t, 0) + 1
    repeated = [t for t, n in counts.items() if n > 1]
    if repeated:
        raise _rule(f"duplicate instance type{'s' if len(repeated) > 1 else ''} {listing(repeated)}: "
                    f"{len(types)} entries for {len(counts)} types", "list each instance type once",
                    repeated[0] if len(repeated) == 1 else None)
    return types


# Upper bounds far above any real value that keep the render's arithmetic finite (1e300 GiB
# overflows to inf in bytes; a price of 1e308 to inf in a cost): 1 PiB of weights, $100,000 an hour.
WEIGHTS_MAX_GIB = 1_048_576
# A standby pool's name is a DNS label inside `<name>-engine-host` and `<name>-standby-pool` label values.
STANDBY_POOL_NAME_MAX = 40
# A pooled member's serving port (decisions/standby_pool.py MEMBER_PORT_BASE): above the engine's
# own 8000/8001, the router's 8010 and the host supervisor's 8090, below the engines' distributed ports.
MEMBER_PORT_MIN = 8100
MEMBER_PORT_MAX = 8999
PRICE_PER_HOUR_MAX_USD = 100_000


def _numeric_only(annotation: Any) -> bool:
    """Whether a field takes a number and never a boolean (`int`, `float`, `Literal["auto"] | int`)."""
    kinds: set[Any] = set()

    def walk(a: Any) -> None:
        origin = typing.get_origin(a)
        if origin is Annotated:
            walk(typing.get_args(a)[0])
        elif origin is Literal:
            kinds.update(type(v) for v in typing.get_args(a))
        elif typing.get_args(a):
            for arg in typing.get_args(a):
                walk(arg)
        else:
            kinds.add(a)
    walk(annotation)
    return bool(kinds & {int, float}) and bool not in kinds


class _Strict(BaseModel):
    model_config = ConfigDict(
        # No key takes NaN or an infinity (`.nan`, `.inf` pass `gt=0`; a price of inf renders as `$inf`).
        allow_inf_nan=False,
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        # Field descriptions from the attribute docstrings: describe_models below, in one pass
        # (pydantic's use_attribute_docstrings took half of this module's import).
    )

    @field_validator("*", mode="before")
    @classmethod
    def _a_number_is_not_a_boolean(cls, value: Any, info: Any) -> Any:
        # pydantic's lax mode reads True as 1 and False as 0 for an int or a float, and both YAML
        # readers read `no`, `off` and `false` as a boolean: `minReplicas: no` would be scale to zero.
        if isinstance(value, bool) and info.field_name in cls.model_fields \
                and _numeric_only(cls.model_fields[info.field_name].annotation):
            raise PydanticCustomError("number_not_boolean", "takes a number, not a boolean", {"truth": value})
        return value


class LoaderTuning(_Strict):
    """Run:ai Model Streamer tuning, as AWS recommends in [Accelerate model loading on Amazon
    EKS](https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html)."""

    chunk_bytes: Annotated[int, Field(ge=tuning.MIN_S3_CHUNK_BYTES)] = tuning.DEFAULT_CHUNK_BYTES
    """Bytes per ranged S3 read (`RUNAI_STREAMER_CHUNK_BYTESIZE`). 4 GiB is about one request per
    safetensors shard; larger than a shard was 56 % slower."""
    request_timeout_ms: Annotated[int, Field(ge=1000)] = tuning.DEFAULT_REQUEST_TIMEOUT_MS
    """Low-speed window after which a stalled connection is cut and its part retried
    (`RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS`; the S3 client rounds it down to whole seconds, at
    least 3)."""
    low_speed_limit_bytes_per_second: Annotated[int, Field(ge=1)] = tuning.DEFAULT_LOW_SPEED_LIMIT_BYTES_PER_S
    """Throughput below which a connection counts as stalled (`RUNAI_STREAMER_S3_LOW_SPEED_LIMIT`).
    Keep it far below a healthy connection's rate: a load whose connections all stay under it
    for longer than the retry window fails."""
    retry_window_seconds: Annotated[int, Field(ge=0)] = tuning.DEFAULT_RETRY_WINDOW_SECONDS
    """How long after its first request a chunk whose transfer failed (a stall cut the S3 client
    gave up retrying, a 5xx, a throttle) is requested again (`RUNAI_STREAMER_S3_TIMEOUT`, read by
    runai-model-streamer 0.16 and later). 0: never; the first such failure fails the whole load and
    vLLM exits."""


class CompileCacheConfig(_Strict):
    """torch.compile cache on the node's NVMe, pre-warmed from S3, as in [Accelerate model loading on
    Amazon EKS](https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html)."""

    enabled: bool = True
    """Default for every model that does not run eager; a model can opt out with
    `compileCache: false`."""
    host_path: str | None = None
    """Node directory for the cache. Default: `/mnt/.ephemeral/compile-cache` (auto) or
    `/mnt/k8s-disks/0/compile-cache` (karpenter), the NVMe mount of each mode."""


CapacityType = Literal["reserved", "spot", "onDemand"]
# Karpenter's `karpenter.sh/capacity-type` value of each `capacity.types` entry.
CAPACITY_TYPE_LABEL_VALUE: dict[str, str] = {"reserved": "reserved", "spot": "spot", "onDemand": "on-demand"}


class CapacityReservation(_Strict):
    """One capacity-reservation selector term (an On-Demand Capacity Reservation or a Capacity
    Block): by `id` alone, or by `tags` (optionally of one owner account). The same term becomes
    the node class's `capacityReservationSelectorTerms` entry in either mode
    (https://karpenter.sh/docs/tasks/odcrs/, https://docs.aws.amazon.com/eks/latest/userguide/auto-odcr.html)."""

    id: Annotated[str, Field(pattern=r"^cr-[0-9a-z]+$")] | None = None
    """The reservation's id (`cr-...`); alone in its term (the EC2NodeClass CRD refuses it with
    tags or an owner)."""
    tags: Annotated[dict[str, str], Field(min_length=1, max_length=20), _aws_tags(None, selector=True)] | None = None
    """Tags the reservations carry (`"*"` matches any value of a key); at most 20, none empty."""
    owner_id: Annotated[str, Field(pattern=r"^[0-9]{12}$")] | None = None
    """With `tags`: only reservations of this account (a reservation shared with you)."""


class CapacityBlock(_Strict):
    """The pool's reservations are EC2 Capacity Blocks for ML: capacity for a fixed window, whose
    instances EC2 terminates 30 minutes before the block ends
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-capacity-blocks.html)."""

    ends_at: datetime | None = None
    """When the block ends (ISO 8601 with a zone, e.g. `2027-03-01T11:30:00Z`); the render says
    when its nodes are drained. An end in the past is an error."""


class PoolCapacity(_Strict):
    """Where a pool's nodes come from, in the order the engine tries them."""

    types: Annotated[list[CapacityType], Field(min_length=1)] = ["onDemand"]
    """Purchase options, first choice first: `reserved` (the `reservations`), `spot`,
    `onDemand`. Both engines always try reserved, then spot, then on-demand, so the list is
    written in that order, e.g. `[reserved, onDemand]` or `[spot, onDemand]`."""
    reservations: Annotated[list[CapacityReservation], Field(max_length=30)] = []
    """With `reserved`: the reservations (ODCRs or Capacity Blocks) the pool launches into."""
    capacity_block: CapacityBlock | None = None
    """Set when the reservations are Capacity Blocks for ML (Karpenter >= 1.6)."""
    reserved_nodes: Annotated[int, Field(ge=0)] | None = None
    """How many of the pool's nodes the reservations hold (their free instance count), for the
    render's cost and scale-out prediction: a launch beyond it falls back to the next type.
    Default: unknown."""
    spot_hourly_price_usd: Annotated[float, Field(gt=0, le=PRICE_PER_HOUR_MAX_USD)] | None = None
    """With `spot`: your expected spot price of one node per hour, for the render's costs
    (spot prices move; warmstart ships none). Default: unknown."""


class GpuPool(_Strict):
    """A set of GPU nodes (one Karpenter / Auto Mode NodePool)."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=40)]
    """Pool name; also the NodePool and node class name."""
    instance_types: Annotated[list[str], Field(min_length=1)]
    """EC2 instance types the pool may launch; each must be in warmstart's GPU table."""
    capacity_types: Annotated[
        list[Literal["on-demand", "spot"]], Field(min_length=1)
    ] = ["on-demand"]
    """Superseded by `capacity` (kept so existing stack files read the same): `on-demand` and/or
    `spot`. Give one of the two, not both."""
    capacity: PoolCapacity | None = None
    """Where the pool's nodes come from: reservations (ODCRs, Capacity Blocks), spot, on-demand,
    in order (see `PoolCapacity`). Default: `capacityTypes`, i.e. on-demand."""
    max_gpus: Annotated[int, Field(ge=1)] | None = None
    """Upper bound on GPUs the pool may run (NodePool `limits`). Default: enough for every
    model on the pool to surge one replica, plus the warm spare nodes."""
    warm_nodes: Annotated[int, Field(ge=0)] = 0
    """Spare nodes kept up and staged (the image, and the weights of every staged model on the
    pool) by low-priority placeholder pods that any serving pod preempts, so a scale-out lands
    on a warm node; Karpenter or Auto Mode then launches a replacement spare. Each spare costs
    its instance's price around the clock. The pool's models must share one instance type."""
    hourly_price_usd: Annotated[float, Field(gt=0, le=PRICE_PER_HOUR_MAX_USD)] | None = None
    """Your price of one node of the pool per hour (on-demand or negotiated; a reserved node is
    billed at it whether used or not), for the render's cost of `warmNodes` and of each model at
    its min and max replicas; warmstart ships no price list (prices differ by region and change)."""
    ephemeral_storage_gib: Annotated[Annotated[int, Field(ge=1)] | None, Field(alias="ephemeralStorageGiB")] = None
    """`clusterMode: auto` only: the NodeClass `ephemeralStorage.size`, in GiB. Auto Mode puts
    ephemeral storage on the local NVMe (RAID0) only while this is smaller than the NVMe of
    the instance, and otherwise silently on EBS. Default: 80, or less when the pool's smallest
    NVMe needs it; a value at or above that NVMe is an error."""

    @field_validator("instance_types")
    @classmethod
    def _gpu_instance_types(cls, v: list[str]) -> list[str]:
        return [_gpu_instance_type(t) for t in _unique_instance_types(v)]


class HuggingFaceSource(_Strict):
    """A Hugging Face Hub repository at a pinned commit."""

    repo: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")]
    """Repository id, e.g. `meta-llama/Llama-3.1-8B-Instruct`."""
    revision: Annotated[str, Field(pattern=r"^[0-9a-f]{40}$")]
    """The commit (40 hex characters) to copy: a branch or tag could move under the same config."""


class WeightsImport(_Strict):
    """Where `up` copies the model's weights from into `source`, once, before its pods start."""

    hugging_face: HuggingFaceSource | None = None
    """From the Hugging Face Hub. A gated repository needs the secret `warmstart:huggingFaceToken`."""
    s3: str | None = None
    """From another `s3://bucket/prefix`, which the import's role may read."""

    @field_validator("s3")
    @classmethod
    def _s3_uri(cls, v: str | None) -> str | None:
        if v is not None and not S3_URI.match(v):
            raise ValueError("must be s3://bucket/prefix with a valid bucket name and a non-empty prefix")
        return v.rstrip("/") if v else v

    @model_validator(mode="after")
    def _exactly_one(self) -> "WeightsImport":
        if (self.hugging_face is None) == (self.s3 is None):
            raise ValueError("give exactly one of huggingFace or s3")
        return self


class RoutingConfig(_Strict):
    """How requests reach the model's replicas: a router (SMG, https://github.com/smg-project/smg)
    in front of the vLLM pods, behind the model's one Service (see docs/routing.md)."""

    policy: Literal["auto", "prefix_hash", "round_robin", "none"] = "auto"
    """`prefix_hash`: the same prompt prefix goes to the same replica, which then reuses its
    prefix cache, unless that replica is over the load bound (consistent hashing with bounded
    loads). `round_robin`: plain load balancing. `none`: no router; the Service spreads requests
    over the pods at random. `auto`: `prefix_hash` when the model can have more than one replica
    (`replicas > 1` or `autoscaling.maxReplicas > 1`), else `none`."""
    load_factor: Annotated[float, Field(ge=1.0)] = routing_rules.DEFAULT_LOAD_FACTOR
    """Load bound, relative: a replica with more requests in flight than this multiple of the
    replicas' mean (and more than `maxExcessRequests` over it) is skipped for the least-loaded
    one."""
    max_excess_requests: Annotated[int, Field(ge=0)] = routing_rules.DEFAULT_MAX_EXCESS_REQUESTS
    """Load bound, absolute: requests in flight a replica may carry over the mean, across the
    whole fleet, before it is skipped (each of the two routers applies its share). Below SMG's
    10, which left one replica in seven up to 17 % off the mean share in warmstart's benchmark
    (docs/routing.md)."""
    internal_load_balancer: bool = False
    """Also expose the router through an internal Network Load Balancer (reachable from the
    VPC only), for clients outside the cluster."""


class AutoscalingConfig(_Strict):
    """Replicas scaled by KEDA on vLLM's own metrics, queried from Prometheus (Amazon Managed
    Service for Prometheus by default)."""

    min_replicas: Annotated[int, Field(ge=0)] = 1
    """Fewest serving pods (awake engines). 0 needs a router: a front queue in it holds the
    requests that arrive until an engine serves (429 with Retry-After past its bounds). With
    `standby` engines 0 keeps only the sleepers and a held request wakes one; without, 0 is zero
    pods (the GPU released) and KEDA scales from zero on the front queues' held requests."""
    max_replicas: Annotated[int, Field(ge=1)]
    """Most serving pods; the GPU pool's limit must hold them plus one surge pod."""
    target_waiting_per_replica: Annotated[float, Field(ge=TARGET_WAITING_MIN)] = scaling_rules.DEFAULT_TARGET_WAITING_PER_REPLICA
    """Requests waiting in vLLM's queue per replica (`vllm:num_requests_waiting`) above which a
    replica is added."""
    kv_cache_usage_ceiling: Annotated[float, Field(gt=0, le=1)] | None = None
    """Also scale up when any replica's KV cache is fuller than this fraction
    (`vllm:kv_cache_usage_perc`). Default: not used."""
    target_requests_per_replica: Annotated[float, Field(gt=0)] = scaling_rules.DEFAULT_TARGET_REQUESTS_PER_REPLICA
    """Requests one engine carries, running plus waiting (`vllm:num_requests_running` +
    `vllm:num_requests_waiting`): KEDA keeps ceil(total / this) engines awake, plus the standby
    sleepers, so a load the engines carry without a queue is not scaled away. Set it to the running
    requests one engine holds at your latency target."""


class StandbyConfig(_Strict):
    """Engines kept started and asleep beside the awake ones, woken in seconds when the load
    rises (vLLM sleep mode; see docs/scale-out.md). Needs `autoscaling`: KEDA owns how many pods
    exist, awake plus standby."""

    count: Annotated[int, Field(ge=1)] = 1
    """Engines kept asleep. Each holds its GPUs while asleep (it costs what an awake replica
    costs); what it saves is the cold start of a scale-out."""
    sleep_level: Annotated[int, Field(ge=1, le=2)] = 1
    """vLLM's sleep level. 1: the weights move to host RAM (the pod's memory must hold them) and
    waking copies them back (about 3 s per 64 GiB). 2: the weights are dropped and reloaded from
    their source on wake (slower; for an instance whose RAM cannot hold them)."""
    awake_idle_seconds: Annotated[int, Field(ge=0)] = 300
    """How long an awake engine must have had no request running or waiting before it may be put
    back to sleep (only while fewer than `count` engines sleep). An engine the load does not need
    (more awake than `minReplicas` and the engines its requests need at `targetRequestsPerReplica`)
    sleeps sooner, its requests drained first (docs/scale-out.md)."""
    pool: Annotated[str, Field(pattern=DNS_LABEL, max_length=STANDBY_POOL_NAME_MAX)] | None = None
    """Name of a `standbyPools` entry: the model's engine sleeps on the pool's spare engine hosts,
    which it shares with the pool's other models, instead of on sleepers of its own (see
    docs/scale-out.md, "Pooled standby"). `count` and `sleepLevel` are then the pool's and may not
    be given. Default: per-model standby."""
    port: Annotated[int, Field(ge=MEMBER_PORT_MIN, le=MEMBER_PORT_MAX)] | None = None
    """With `pool`: the port the model's vLLM serves on, in its own pods and on the pool's hosts
    (its routers reach both on one port), unique in the pool. It never changes when another model
    joins or leaves the pool. Default: derived from the model's name (8100-8999); set it only when
    two members' derived ports collide (the render says so)."""


class StandbyPoolConfig(_Strict):
    """A standby pool: spare engine hosts, each one GPU set running every member model's engine
    asleep, so a scale-out of any member is a wake in seconds at the GPU cost of `spares` GPU
    sets, not one sleeper per model (see docs/scale-out.md, "Pooled standby"). A model joins with
    `standby: {pool: <name>}`."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=STANDBY_POOL_NAME_MAX)]
    """Pool name (a DNS label); its engine hosts' Deployment is `<name>-engine-host`, its actuator's
    `<name>-standby-pool`."""
    gpu_pool: str
    """Name of the `gpuPools` entry the hosts run on (on-demand or reserved capacity: a spare on
    spot would be taken by an interruption)."""
    instance_type: str | None = None
    """Instance type of the hosts; every member runs on it. Default: the GPU pool's only type."""
    gpus: Annotated[int, Field(ge=1, le=8)] = 1
    """GPUs of one host: every member's `tensorParallelSize`."""
    spares: Annotated[int, Field(ge=1, le=16)] = 1
    """Hosts kept with every member asleep. Each holds `gpus` GPUs around the clock."""
    max_hosts: Annotated[int, Field(ge=1, le=64)] | None = None
    """The most hosts at once (spares plus hosts serving a woken engine). Default: spares plus
    the number of members."""
    sleep_level: Literal[1, 2, "auto"] = "auto"
    """vLLM's sleep level of every member. 1: every member's weights stay in the host's RAM at
    once; 2: none, reloaded on wake from the node's NVMe where the node cache stages them, else
    from S3. `auto`: 1 where the host's RAM holds them all, else 2."""
    sleeping_residue_gib: Annotated[Annotated[float, Field(gt=0, le=200)] | None,
                                    Field(alias="sleepingResidueGiB")] = None
    """GPU memory one sleeping engine keeps on each GPU (its CUDA context, CUDA graphs, NCCL
    buffers at TP > 1), as measured on your node (`warmstart wake-bench`). Default: 4 GiB (5 at
    gpus > 1), a stated planning figure."""

    @field_validator("instance_type")
    @classmethod
    def _known_instance_type(cls, v: str | None) -> str | None:
        return v if v is None else _gpu_instance_type(v)


class ModelSpec(_Strict):
    """What one model is and how it is served, wherever it runs (the `VllmModel` component's
    spec; a stack's `models[]` entry adds the pool it runs on)."""

    name: Annotated[str, Field(pattern=DNS_LABEL, max_length=40)]
    """Deployment, Service and ServiceAccount name (a DNS label, at most 40 characters)."""
    source: str
    """`s3://bucket/prefix`: safetensors shards plus config and tokenizer files directly under
    the prefix (the streamer does not list recursively)."""
    weights_gib: Annotated[float, Field(gt=0, le=WEIGHTS_MAX_GIB, alias="weightsGiB")]
    """Total size of the safetensors weights in GiB (2^30 bytes)."""
    instance_type: str | None = None
    """Instance type within the pool; default: the pool's only instance type."""
    tensor_parallel_size: Literal["auto"] | Annotated[int, Field(ge=1)] = "auto"
    """GPUs per replica. `auto`: the fewest of 1, 2, 4, 8 that hold the weights and leave 15 %
    of each GPU for KV cache."""
    replicas: Annotated[int, Field(ge=0)] = 1
    """Number of serving pods."""
    image: str = versions.VLLM_IMAGE
    """vLLM container image (>= 0.11.1 for distributed loading); pin by `@sha256:` digest."""
    max_model_len: Annotated[int, Field(ge=1, le=MAX_MODEL_LEN_CEILING)] | None = None
    """`--max-model-len`; bounds KV memory and start-up profiling. Default: the model's. At most
    16,777,216 (2^24). vLLM refuses one above the model's own `max_position_embeddings` (times
    its RoPE scaling factor, `--hf-overrides` included) when the engine starts; a model with
    `import` is checked against its `config.json` by the import Job, before any copy."""
    gpu_memory_utilization: Annotated[float, Field(gt=0.3, le=0.98)] = tuning.DEFAULT_GPU_MEMORY_UTILIZATION
    """`--gpu-memory-utilization`; also the basis of the tensor-parallel rule."""
    eager: bool = False
    """Run with `--enforce-eager`: no torch.compile or CUDA graphs (faster start, 5-30 % lower
    throughput). Incompatible with distributed loading and with the compile cache."""
    compile_cache: bool | None = None
    """Use the compile cache. Default: the stack's `compileCache.enabled`, off for eager models."""
    extra_args: list[str] = []
    """Extra `vllm serve` arguments, appended after the ones warmstart manages."""
    loader: LoaderTuning | None = None
    """Per-model override of the stack's `loader`."""
    weights_import: Annotated[WeightsImport | None, Field(alias="import")] = None
    """Copy the weights into `source` during `up` (a Job on non-GPU nodes), verified and
    recorded in a manifest; without it `source` must already hold them."""
    routing: RoutingConfig = RoutingConfig()
    """The router in front of the replicas (see `RoutingConfig`)."""
    autoscaling: AutoscalingConfig | None = None
    """Scale the replicas on vLLM's metrics; `replicas` is then only the first `up`'s count.
    Default: a fixed `replicas`."""
    standby: StandbyConfig | None = None
    """Keep engines started and asleep, woken in seconds on load (see `StandbyConfig`). Default:
    none; a scale-out starts a new pod."""
    priority_class_name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] | None = None
    """PriorityClass of the serving pods (an existing one), e.g. so they preempt batch work on a
    shared pool; not a `system-*` class (kube-system only) nor warmstart's own `warmstart-*`
    (the node cache's, ranked below every serving pod). Default: the cluster's default."""
    node_cache: Literal["auto", "on", "off"] = "auto"
    """Stage the weights on each GPU node's NVMe ahead of time (a DaemonSet that also pulls the
    model's image there), so pods on those nodes load them locally and pods elsewhere stream
    from S3 (see docs/node-cache.md). `auto`: where the plan predicts a load from NVMe that
    saves at least 10 s and a quarter of tuned streaming from S3 on the model's instance type."""
    node_cache_content_check: Literal["auto", "etag", "sha256", "size"] = "auto"
    """How a staged copy's bytes are checked against what S3 vouches for (see docs/node-cache.md).
    `auto`: per file the import manifest's sha256, else S3's `ChecksumSHA256`, else the ETag where
    S3 computed it from the bytes (unencrypted or SSE-S3); a file none applies to (SSE-KMS without
    a sha256) is kept on its size, named in the stager's log. `etag`: as auto, but such a file
    refuses the copy. `sha256`: every file by a sha256, else refused. `size`: sizes and ETags
    only. A refused copy stays on the node and is not copied again."""

    @field_validator("source")
    @classmethod
    def _s3_uri(cls, v: str) -> str:
        return _full_s3_uri(v)

    @property
    def bucket(self) -> str | None:
        """The bucket of `source`; None for a stack model's relative source that `plan_stack`
        has not resolved into its model bucket yet."""
        bucket, _ = split_source(self.source)
        return bucket

    @property
    def prefix(self) -> str:
        """The key prefix of `source`, without a trailing slash."""
        return split_source(self.source)[1]

    @field_validator("instance_type")
    @classmethod
    def _known_instance_type(cls, v: str | None) -> str | None:
        return v if v is None else _gpu_instance_type(v)

    @field_validator("priority_class_name")
    @classmethod
    def _not_a_system_class(cls, v: str | None) -> str | None:
        # Kubernetes admits `system-node-critical` and `system-cluster-critical` pods only in
        # kube-system (https://kubernetes.io/docs/concepts/scheduling-eviction/pod-priority-preemption/#priorityclass).
        if v is not None and v.startswith("system-"):
            raise ValueError("system- PriorityClasses are for kube-system only; name a class of your own")
        # The warm spares' and staging pods' classes rank below serving pods so that these preempt them.
        if v is not None and v.startswith("warmstart-"):
            raise ValueError("warmstart- PriorityClasses are the node cache's own, below every serving pod; "
                             "name a class of your own")
        return v

    @field_validator("image")
    @classmethod
    def _pinned_image(cls, v: str) -> str:
        if "@sha256:" not in v and (":" not in v.rsplit("/", 1)[-1] or v.endswith(":latest")):
            raise ValueError("image must carry an explicit version tag or an @sha256 digest, not latest")
        return v


class ModelConfig(ModelSpec):
    """One served model: one vLLM Deployment."""

    source: str
    """Where the weights are: a key prefix in the stack's model bucket (`meta-llama/Llama-3.1-8B-Instruct`,
    no scheme), or `s3://bucket/prefix` in full. Either way the safetensors shards plus config and
    tokenizer files sit directly under the prefix (the streamer does not list recursively)."""
    pool: str
    """Name of the `gpuPools` entry the model runs on."""

    @field_validator("source")
    @classmethod
    def _s3_uri(cls, v: str) -> str:  # replaces ModelSpec's rule: a relative prefix is allowed too
        if not (S3_URI.match(v) if v.startswith("s3://") else KEY_PREFIX.match(v)):
            raise ValueError(
                "must be s3://bucket/prefix with a valid bucket name and a non-empty prefix, or a key prefix "
                "in the stack's model bucket without a scheme, leading slash, empty segment or whitespace "
                "(e.g. meta-llama/Llama-3.1-8B-Instruct)")
        return v.rstrip("/")

    @property
    def relative(self) -> bool:
        """Whether `source` is a key prefix in the stack's model bucket (not yet a full URI)."""
        return self.bucket is None

    def in_bucket(self, bucket: str) -> "ModelConfig":
        """This model with a relative `source` made `s3://<bucket>/<prefix>` (itself otherwise)."""
        return self.model_copy(update={"source": f"s3://{bucket}/{self.prefix}"}) if self.relative else self


IAM_PRINCIPAL_ARN = r"^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/[A-Za-z0-9_+=,.@/*-]+$"


class NetworkConfig(_Strict):
    """The VPC the cluster and GPU nodes run in: created by warmstart (default), or an existing
    one given by `vpcId`. Either way GPU subnets reach S3 through an S3 Gateway endpoint on
    every private route table, not through NAT (see [Accelerate model loading on Amazon
    EKS](https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html))."""

    vpc_id: Annotated[str, Field(pattern=r"^vpc-[0-9a-f]{8,17}$")] | None = None
    """Use this existing VPC instead of creating one; then `privateSubnetIds` and
    `privateRouteTableIds` are required."""
    private_subnet_ids: list[Annotated[str, Field(pattern=r"^subnet-[0-9a-f]{8,17}$")]] = []
    """Existing VPC only: the private subnets (at least two, in different AZs) the cluster and
    GPU nodes use."""
    private_route_table_ids: list[Annotated[str, Field(pattern=r"^rtb-[0-9a-f]{8,17}$")]] = []
    """Existing VPC only: every route table associated with `privateSubnetIds` (including the
    VPC's main route table if a subnet has no explicit association). The S3 Gateway endpoint
    is attached to each."""
    public_subnet_ids: list[Annotated[str, Field(pattern=r"^subnet-[0-9a-f]{8,17}$")]] = []
    """Existing VPC only: public subnets for internet-facing load balancers (optional)."""
    cidr: str = "10.0.0.0/16"
    """Created VPC only: its IPv4 CIDR, /16 to /22. Private subnets get one eighth each, public
    subnets one sixty-fourth."""
    availability_zones: Annotated[list[str], Field(min_length=2, max_length=6)] | None = None
    """Created VPC only: AZ names to use. Default: the first `azCount` AZs the region reports
    available. Pin them when a GPU instance type is offered only in some AZs."""
    az_count: Annotated[int, Field(ge=2, le=6)] = 3
    """Created VPC only: number of AZs (one public and one private subnet each) when
    `availabilityZones` is not given."""
    single_nat_gateway: bool = False
    """Created VPC only: one NAT gateway for all AZs (cheaper, but egress fails with its AZ)
    instead of one per AZ."""
    s3_gateway_endpoint: bool = True
    """Create the S3 Gateway endpoint on every private route table, so model and cache traffic
    bypasses NAT."""
    allow_s3_via_nat: bool = False
    """Explicit opt-out: allow `s3GatewayEndpoint: false`, i.e. GPU nodes reach S3 through NAT
    (shared bandwidth ceiling, per-GB charge)."""


class ModelBucketConfig(_Strict):
    """The S3 bucket that holds every model's weights: a `models[].source` written as a key
    prefix is in it, and one written as `s3://bucket/prefix` must name it."""

    name: str | None = None
    """Bucket name. Default (created bucket): `<namePrefix>-models-<hash8>`, unique to the
    account once `accountId` is recorded (see docs/aws-layer.md)."""
    create: bool = True
    """Create the bucket with warmstart's baseline (private, encrypted, TLS-only, versioned,
    owner-enforced). `false`: use the existing bucket `name`, whose settings warmstart leaves
    alone."""
    restrict_to_vpc_endpoint: bool = False
    """Deny object access and bucket listings that do not come through the stack's S3 Gateway
    endpoint (`aws:SourceVpce`), except by the `admins` principals; the identities that deploy
    keep HeadBucket/ListBucket and the bucket's configuration. Needs `create: true`."""
    admins: list[Annotated[str, Field(pattern=IAM_PRINCIPAL_ARN)]] = []
    """IAM role or user ARNs (`*` wildcards allowed, e.g. for SSO roles) exempt from
    `restrictToVpcEndpoint`, so they can upload and inspect weights from outside the VPC.
    Required with `restrictToVpcEndpoint`."""
    deployers: list[Annotated[str, Field(pattern=IAM_PRINCIPAL_ARN)]] = []
    """With `restrictToVpcEndpoint`: every role that runs preview, up or refresh on the stack
    (a CI deploy role and its read-only drift-check role), exempt from the listing Deny only, so
    each can read the bucket; the policy then names exactly these, whoever runs. Default: the
    identity running the deployment, so another role's preview sees a policy change."""
    delete_on_destroy: bool = False
    """`false` (default): `destroy` keeps a created bucket, its weights and its settings (they
    leave the stack's state only). `true`: `destroy` deletes the bucket and every object in it."""


class CompileCacheBucketConfig(_Strict):
    """The S3 bucket that holds the torch.compile cache, one key prefix per model."""

    name: str | None = None
    """Bucket name. Default: `<namePrefix>-compile-cache-<hash8>`, unique to the account once
    `accountId` is recorded (see docs/aws-layer.md)."""
    expire_after_days: Annotated[int, Field(ge=1)] = 30
    """Days after which a cache object (and, one day later, its noncurrent versions) is
    deleted. Entries are cheap to rebuild and their keys change with every image, so old ones
    are only cost."""


# An exact IAM role or user ARN: access entries take no wildcards.
IAM_PRINCIPAL_EXACT_ARN = r"^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/[A-Za-z0-9_+=,.@/-]+$"
# Retention periods CloudWatch Logs accepts (PutRetentionPolicy).
LogRetentionDays = Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096,
                           1827, 2192, 2557, 2922, 3288, 3653]


class SystemNodeGroupConfig(_Strict):
    """`clusterMode: karpenter` only: the EKS managed node group that runs the Karpenter
    controller and CoreDNS (every other non-GPU pod runs on warmstart's elastic `general-purpose`
    NodePool). Karpenter must not run on nodes it launches, and its chart spreads two replicas
    over hosts and zones, so the group needs two nodes or more."""

    instance_types: Annotated[list[str], Field(min_length=1)] = ["m7i.large"]
    """On-demand x86_64 instance types of the group (no GPU needed)."""
    size: Annotated[int, Field(ge=1)] | None = None
    """Nodes in the group, spread over the private subnets' AZs; at least 2. Default: the fewest
    (at least 2) that hold what runs there, the Karpenter controller and CoreDNS, with the nodes'
    kubelet reservation (`warmstart render` shows the count; a set size that cannot hold them is
    refused with the numbers)."""

    @field_validator("instance_types")
    @classmethod
    def _each_type_once(cls, v: list[str]) -> list[str]:
        return _unique_instance_types(v)


class ClusterConfig(_Strict):
    """The EKS cluster, in either mode (see docs/cluster-modes.md)."""

    admins: list[Annotated[str, Field(pattern=IAM_PRINCIPAL_EXACT_ARN)]] = []
    """IAM role or user ARNs (exact, no wildcards) given cluster-admin access through EKS
    access entries (`AmazonEKSClusterAdminPolicy`, cluster scope). The identity that deploys
    the stack is admin anyway (cluster creator)."""
    viewers: list[Annotated[str, Field(pattern=IAM_PRINCIPAL_EXACT_ARN)]] = []
    """IAM role or user ARNs (exact) given read-only access to the whole cluster, Secrets
    included, through EKS access entries: what `warmstart refresh` and `preview` (the CI drift
    check) need to read every object the stack owns."""
    log_types: list[Literal["api", "audit", "authenticator", "controllerManager", "scheduler"]] = [
        "api", "audit", "authenticator"]
    """Control-plane log types sent to CloudWatch Logs."""
    log_retention_days: LogRetentionDays = 90
    """Days CloudWatch keeps the control-plane logs (EKS's own default is forever)."""
    system_node_group: SystemNodeGroupConfig | None = SystemNodeGroupConfig()
    """`clusterMode: karpenter` only (ignored in auto mode, whose built-in `system` pool runs
    the add-ons): the managed node group for the controller and add-ons. Required there."""
    service_cidr: Annotated[str, Field(pattern=r"^[0-9]{1,3}(\.[0-9]{1,3}){3}/[0-9]{1,2}$")] | None = None
    """The cluster's Kubernetes Service range (`serviceIpv4Cidr`), create-only. Default: the one
    EKS would pick, 172.20.0.0/16 when a VPC CIDR block is in 10.0.0.0/8, else 10.100.0.0/16; set
    explicitly, so the routers' NetworkPolicy can name the API server's ClusterIP."""
    nvme_check: Literal["warn", "fail"] = "warn"
    """What the serving pod's start-up NVMe check does when the compile-cache path is not on
    the node's local NVMe: `warn` logs it and starts anyway (slower, on EBS); `fail` stops
    the pod with the reason, so it never silently runs from EBS."""
    endpoint_public_access: bool = True
    """The EKS API server's public endpoint (`endpointPublicAccess`, EKS's default true). The
    private endpoint is always on, so nodes and pods reach the API inside the VPC. `false`:
    private only, and `warmstart preview`/`up` (the Kubernetes objects) must run from inside the
    VPC or a network routed to it (VPN, Direct Connect, a bastion)
    (https://docs.aws.amazon.com/eks/latest/userguide/cluster-endpoint.html)."""
    public_access_cidrs: Annotated[list[str], Field(min_length=1, max_length=network_rules.MAX_PUBLIC_ACCESS_CIDRS)] = \
        list(network_rules.EKS_PUBLIC_ACCESS_CIDRS)
    """The public IPv4 blocks that may reach the public endpoint (`publicAccessCidrs`, EKS's
    default 0.0.0.0/0; at most 40): e.g. your office's and CI runners' egress addresses. Only
    with `endpointPublicAccess: true`."""

    @field_validator("public_access_cidrs")
    @classmethod
    def _public_cidrs(cls, cidrs: list[str]) -> list[str]:
        for c in cidrs:
            why = network_rules.public_access_cidr_problem(c)
            if why:
                raise _rule(f"{c} {why}", "list public IPv4 blocks, e.g. 203.0.113.0/24 (the default, 0.0.0.0/0, "
                            "is every address)", c)
        if len(set(cidrs)) != len(cidrs):
            raise _rule("lists a block more than once", "list each block once", sorted(c for c in set(cidrs)
                                                                                       if cidrs.count(c) > 1))
        return cidrs


class EcrPullThroughConfig(_Strict):
    """Pull Docker Hub images through an ECR pull-through cache in the stack's account."""

    credential_arn: Annotated[str, Field(pattern=r"^arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:[0-9]{12}:secret:ecr-pullthroughcache/[A-Za-z0-9_/+=.@-]+$")]
    """Secrets Manager secret (name `ecr-pullthroughcache/...`, in the stack's account and region)
    holding the Docker Hub `username` and `accessToken` ECR authenticates upstream with."""


class ImageCacheConfig(_Strict):
    """Where the nodes pull the models' images from."""

    ecr_pull_through: EcrPullThroughConfig | None = None
    """Docker Hub images (the default vLLM image is one) through an ECR pull-through cache rule:
    the first pull of a tag imports it into ECR in the stack's region, later pulls come from there,
    out of Docker Hub's rate limits. Needs `accountId`. Default: pull from Docker Hub."""


class ScraperPodsConfig(_Strict):
    """The pods of your own Prometheus, which the NetworkPolicies admit to the metrics ports."""

    namespace: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
    """Namespace of the Prometheus pods (e.g. `monitoring`)."""
    pod_labels: Annotated[dict[str, str], Field(min_length=1)]
    """Labels that select exactly the Prometheus server pods (e.g.
    `{app.kubernetes.io/name: prometheus}`, as prometheus-operator labels them)."""


class KedaConfig(_Strict):
    """KEDA, which scales each autoscaled model's Deployment (its ScaledObject)."""

    create: bool = True
    """Install KEDA (its pinned chart, in `namespace`) when a model autoscales or
    `modelStacks.autoscaling` is set. `false`: a KEDA of your own already runs in `namespace`;
    warmstart installs none but still creates the ScaledObjects, which need its CRDs
    (`keda.sh/v1alpha1`). On the managed Prometheus path (no `prometheusUrl`) the query role then
    trusts `<namespace>/<operatorServiceAccount>`: annotate that ServiceAccount with the role
    (`eks.amazonaws.com/role-arn`, the stack's `kedaOperatorRoleArn`)."""
    namespace: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] = "keda"
    """Namespace KEDA runs in: warmstart's (created with it), or yours with `create: false`."""
    operator_service_account: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] = "keda-operator"
    """The KEDA operator's ServiceAccount (the chart's `serviceAccount.operator.name`): the
    subject the query role's trust policy names."""


class MonitoringConfig(_Strict):
    """Where vLLM's metrics go, for `models[].autoscaling`."""

    prometheus_url: Annotated[str, Field(pattern=r"^https?://[^\s]+$")] | None = None
    """An existing Prometheus-compatible query endpoint that already scrapes the vLLM pods
    (e.g. `http://prometheus-operated.monitoring.svc:9090`); KEDA queries it without AWS
    signing. Default: warmstart creates an Amazon Managed Service for Prometheus workspace and
    its managed collector when a model autoscales."""
    scraper: ScraperPodsConfig | None = None
    """With `prometheusUrl`: the Prometheus pods that scrape the vLLM pods and the routers. Every
    warmstart pod sits behind a NetworkPolicy, so only the pods named here may read the metrics
    ports (vLLM's metrics-only port and the routers' metrics listener); required when a model
    autoscales on your Prometheus."""
    keda: KedaConfig = KedaConfig()
    """KEDA: warmstart's own (default) or one you run already (`create: false`)."""


class NodeFeatureDiscoveryConfig(_Strict):
    """node-feature-discovery, which turns the weights stager's NodeFeature objects into the node
    labels a staged model's pods prefer (docs/node-cache.md)."""

    create: bool = True
    """Install node-feature-discovery (its pinned chart: the master and its garbage collector)
    when a model is staged or `modelStacks.nodeCache` is set. `false`: one of your own already
    runs; staging still needs it, serving the NodeFeature API (its `NodeFeatureAPI` feature gate,
    on by default since v0.14) and allowing the `weights.warmstart.io` label namespace
    (`master.extraLabelNs`), or no node is ever labelled and pods fall back to S3."""


class ModelStacksConfig(_Strict):
    """What model stacks on this environment may use (see docs/model-stacks.md): the parts a
    model stack cannot create itself, because they are one per cluster."""

    autoscaling: bool = False
    """Run KEDA and the metrics collection even when no inline model autoscales, so a model
    stack's model can."""
    node_cache: bool = False
    """Run node-feature-discovery and the node cache's PriorityClasses even when no inline model
    is staged, so a model stack's model can be."""


class StackConfig(_Strict):
    """Everything one environment (stack) deploys."""

    cluster_mode: Literal["auto", "karpenter"]
    """`auto`: EKS Auto Mode; `karpenter`: EKS with self-managed Karpenter."""
    region: Annotated[str, Field(pattern=r"^[a-z]{2}(-[a-z]+)+-[0-9]$")]
    """AWS region of every resource."""
    name_prefix: Annotated[str, Field(pattern=DNS_LABEL, max_length=NAME_PREFIX_MAX)] | None = None
    """Prefix of every derived resource name. Default: `ws-<stack>`."""
    tags: Annotated[dict[str, str], _aws_tags(OWN_TAGS_ENVIRONMENT)] = {}
    """Tags on every taggable AWS resource (also the AWS provider's default tags), within AWS's
    tag rules: at most 42 (warmstart adds up to 8 of its own to a resource), keys of 1-128 and
    values of 0-256 letters, digits, spaces and `_ . : / = + - @`, none starting with `aws:`."""
    kubernetes_version: Annotated[str, Field(pattern=r"^1\.[0-9]{2}$")] = versions.DEFAULT_KUBERNETES_VERSION
    """EKS Kubernetes version; rendered objects are validated against its schemas."""
    namespace: Annotated[str, Field(pattern=DNS_LABEL, max_length=63)] = "inference"
    """Kubernetes namespace of the serving objects."""
    namespace_create: bool = True
    """Create the `namespace` (labelled `app.kubernetes.io/part-of: warmstart`). `false`: it is
    yours and exists before `up`; warmstart deploys into it all the same."""
    gpu_pools: Annotated[list[GpuPool], Field(min_length=1)]
    """GPU node pools."""
    loader: LoaderTuning = LoaderTuning()
    """Weight-streaming tuning for every model."""
    compile_cache: CompileCacheConfig = CompileCacheConfig()
    """torch.compile cache settings."""
    models: list[ModelConfig] = []
    """Served models, inline (each may instead be a model stack of its own, see
    docs/model-stacks.md)."""
    standby_pools: list[StandbyPoolConfig] = []
    """Standby pools: spare engine hosts shared by the models that name them in
    `standby.pool` (see docs/scale-out.md, "Pooled standby")."""
    account_id: Annotated[str, Field(pattern=r"^[0-9]{12}$")] | None = None
    """AWS account the stack deploys to. When set, the provider refuses any other account,
    and the id is part of the derived bucket names' hash, which makes them unique to the
    account. `warmstart preview` / `up` of a stack that derives a bucket name and has nothing
    deployed yet record the deployer's account here (commit the file); a deployed stack's is
    never changed, as that would rename its buckets."""
    network: NetworkConfig = NetworkConfig()
    """VPC, subnets and the S3 Gateway endpoint."""
    model_bucket: ModelBucketConfig = ModelBucketConfig()
    """Bucket of the model weights."""
    compile_cache_bucket: CompileCacheBucketConfig = CompileCacheBucketConfig()
    """Bucket of the torch.compile cache."""
    cluster: ClusterConfig = ClusterConfig()
    """EKS cluster settings: admins, control-plane logs, the system node group, the NVMe check."""
    monitoring: MonitoringConfig = MonitoringConfig()
    """Metrics for autoscaling: a managed Prometheus workspace, or an endpoint of your own."""
    node_feature_discovery: NodeFeatureDiscoveryConfig = NodeFeatureDiscoveryConfig()
    """node-feature-discovery for staged weights: warmstart's own (default) or yours."""
    image_cache: ImageCacheConfig = ImageCacheConfig()
    """Pulling the models' images through an ECR pull-through cache (off by default)."""
    model_stacks: ModelStacksConfig = ModelStacksConfig()
    """What the environment provides to its model stacks (`stacks/Pulumi.<env>-<model>.yaml`)."""
    hugging_face_token: str | dict[str, str] | None = None
    """Hugging Face token for `models[].import.huggingFace` of gated repositories. Set it as a
    secret (`pulumi config set --secret warmstart:huggingFaceToken hf_...`); it reaches only the
    import Jobs, through a Kubernetes Secret."""
    production: bool = False
    """This stack serves production traffic. `warmstart drill --apply` (docs/drill.md), which adds
    load and replicas to the cluster, refuses such a stack unless also given
    `--confirm-production`; nothing else reads it."""


STACK_NAME = r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,99}$"


class ModelStackConfig(_Strict):
    """A model stack (`stacks/Pulumi.<env>-<model>.yaml`): one model on an environment's
    platform, read through a `pulumi.StackReference` (docs/model-stacks.md)."""

    platform: Annotated[str, Field(pattern=STACK_NAME)]
    """The environment (platform) stack the model runs on, e.g. `prod`; in another project or
    organization, `org/project/stack`."""
    model: ModelConfig
    """The model: the same keys as an entry of an environment's `models`."""
    tags: Annotated[dict[str, str], _aws_tags(OWN_TAGS_MODEL_STACK)] = {}
    """Tags on the model's AWS resources (its IAM roles), besides the platform's; AWS's tag
    rules as for an environment's `tags`, at most 44."""
    hugging_face_token: str | dict[str, str] | None = None
    """Hugging Face token for the model's `import.huggingFace` of a gated repository (set it as a
    secret, as in an environment stack)."""


# --------------------------------------------------------------------------------------
# Loading


_Spec = TypeVar("_Spec", bound=BaseModel)


def _key_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


REFERENCE = "docs/config-reference.md"

_FIXES = {
    "missing": f"add the key (see {REFERENCE})",
}
# pydantic's error types for a value of the wrong type, and what the key expects instead.
_EXPECTED = {
    "int": "an integer", "float": "a number", "bool": "true or false", "string": "a string",
    "list": "a list", "dict": "a mapping of keys to values", "model": "a mapping of keys to values",
    "model_attributes": "a mapping of keys to values",
}
_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
_GENERIC_EXAMPLE = {"int": "1", "float": "1.5", "bool": "true", "string": "text", "list": "[a, b]",
                    "dict": "{key: value}", "model": "{}", "model_attributes": "{}"}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _key_of(field_name: str, info: FieldInfo) -> str:
    return info.alias or field_name


def _field_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model that holds the key `loc` ends with, and that key's field (None for either when
    `loc` leaves the model tree, e.g. inside a `tags` map)."""
    field = None
    for i, part in enumerate(loc):
        if isinstance(part, int):
            continue
        if model is None:
            return None, None
        field = next((f for n, f in model.model_fields.items() if part in (n, _key_of(n, f))), None)
        if field is None:
            return (model if i == len(loc) - 1 else None), None
        if i < len(loc) - 1:
            inner = _models_in(field.annotation)
            model = inner[0] if inner else None
    return model, field


def _as_written(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """`loc` with each field's key as a stack file spells it (`instanceType`, not the
    `instance_type` a component's Args give)."""
    out = []
    for i, part in enumerate(loc):
        holder, field = _field_at(model, loc[:i + 1]) if isinstance(part, str) else (None, None)
        name = next((n for n, f in holder.model_fields.items() if f is field), None) if holder and field else None
        out.append(part if name is None or field is None else _key_of(name, field))
    return tuple(out)


def _key_elsewhere(root: type[BaseModel] | None, loc: tuple[Any, ...]) -> str | None:
    """Where a key unknown at `loc` lives in the tree, when it is a key of another mapping
    (`prometheusUrl` at the top: `monitoring.prometheusUrl`) or names one with its parent's key
    (`kedaNamespace`: `monitoring.keda.namespace`); case-insensitive, the shallowest first."""
    if root is None:
        return None
    name = str(loc[-1]).lower()
    here = tuple(p for p in loc[:-1] if not isinstance(p, int))
    found: list[tuple[int, str]] = []

    def walk(model: type[BaseModel], path: tuple[str, ...], shown: str) -> None:
        if len(path) > 4:
            return
        for n, f in model.model_fields.items():
            key = _key_of(n, f)
            compound = path[-1] + key[:1].upper() + key[1:] if path else ""
            # A key of the same name elsewhere only for one given at the top (a flat `prometheusUrl`):
            # deeper, a common name (`enabled`) would point at an unrelated mapping.
            if path != here and (name == compound.lower() or (not here and name == key.lower())):
                found.append((len(path), f"{shown}{key}"))
            listed = "list" in str(f.annotation) or typing.get_origin(f.annotation) is list
            for inner in _models_in(f.annotation):
                walk(inner, (*path, key), f"{shown}{key}{'[]' if listed else ''}.")

    walk(root, (), "")
    return min(found)[1] if found else None


def _unknown_key(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    """The fix for an unknown key: the nearest known key of the same mapping (difflib's ratio,
    case-insensitive), or the known keys when none is near."""
    holder, _ = _field_at(model, loc)
    known = [_key_of(n, f) for n, f in holder.model_fields.items()] if holder else []
    by_lower = {k.lower(): k for k in known}
    # A near miss of a key of this very mapping (one letter off: `gpuPool` for `gpuPools`) is a
    # typo before it is a key moved from elsewhere, even where a nested mapping has a key of that
    # exact name (`standbyPools[].gpuPool`).
    close = difflib.get_close_matches(str(loc[-1]).lower(), list(by_lower), n=1, cutoff=0.9)
    if close:
        return f"did you mean `{by_lower[close[0]]}`? Rename the key (every key: {REFERENCE})"
    elsewhere = _key_elsewhere(model, loc)
    if elsewhere and str(loc[-1]).lower() not in by_lower:
        return f"move it: the key is `{elsewhere}` (every key: {REFERENCE})"
    near = difflib.get_close_matches(str(loc[-1]).lower(), list(by_lower), n=1, cutoff=0.6)
    if near:
        return f"did you mean `{by_lower[near[0]]}`? Rename the key (every key: {REFERENCE})"
    return f"remove the key; the keys here are {', '.join(f'`{k}`' for k in known)}" if known else \
        f"remove the key (every key: {REFERENCE})"


def _example(kind: str, key: str, field: FieldInfo | None, given: object) -> str:
    """`key: value` as it would be written in the stack file: a single value given for a list
    wrapped in one, else the field's default where that is a value of the expected kind, else a
    generic value of it."""
    if kind == "list" and isinstance(given, (str, int, float)):
        return f"`{key}: [{given}]`"
    default = None if field is None else field.default
    wanted = {"int": int, "float": (int, float), "bool": bool, "string": str, "list": list}.get(kind)
    if (default is not None and default is not PydanticUndefined and wanted is not None and default != []
            and isinstance(default, wanted) and not (kind in ("int", "float") and isinstance(default, bool))):
        value = yaml.safe_dump(default, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
    else:
        value = _GENERIC_EXAMPLE[kind]
    return f"`{key}: {value}`"


# The rule of each name pattern in words, for an error a user reads (pydantic would print the
# regular expression): (rule, fix).
_PATTERN_WORDS = {
    DNS_LABEL: ("must be a DNS label: lowercase letters, digits and hyphens, starting with a letter and not "
                "ending with a hyphen", "lowercase it and replace `_`, `.` and spaces with `-` (e.g. `llama-3-1-8b`)"),
    DNS_SUBDOMAIN: ("must be a DNS subdomain: lowercase letters, digits, hyphens and dots, each part starting and "
                    "ending with a letter or digit", "e.g. `high-priority`"),
    r"^[a-z]{2}(-[a-z]+)+-[0-9]$": ("must be an AWS region code: lowercase, like `us-east-1` (area, direction, "
                                    "number)", "use the region's code as the console shows it, e.g. `us-west-2`"),
    r"^[0-9]{12}$": ("must be a 12-digit AWS account ID", "quote it so YAML keeps its leading zeros, e.g. "
                     "'012345678901'"),
    r"^[0-9a-f]{40}$": ("must be a full 40-character commit hash (lowercase hex)", "copy the commit's full hash"),
}


def _from_validation_error(err: ValidationError, prefix: str = f"{NAMESPACE}:",
                           model: type[BaseModel] | None = None,
                           plain_words: Mapping[tuple[Any, ...], str] | None = None) -> ConfigErrors:
    """pydantic's errors in warmstart's words: each names the key, the rule and the fix. `model`
    is the model validated, whose fields give the nearest key to an unknown one and an example
    of the type a key expects; `plain_words` how the stack file wrote each unquoted boolean or
    number."""
    found = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith(("function-", "literal["))))
        # pydantic reports union branches by their type name; keep the user's key path.
        given = tuple(p for p in loc if p not in ("int", "constrained-int", "float", "str", "bool"))
        loc = _as_written(model, given)
        key = prefix + _key_path(loc) if loc else prefix.rstrip(":.")
        rule = e["msg"].removeprefix("Value error, ")
        fix = _FIXES.get(e["type"], f"correct the value (see {REFERENCE})")
        value = e.get("input") if e["type"] not in ("missing", "extra_forbidden") else None
        kind = e["type"].removesuffix("_type").removesuffix("_parsing")
        ctx = e.get("ctx") or {}
        bound = next((f"{op} {ctx[k]}" for k, op in _BOUNDS.items() if k in ctx), None)
        if e["type"] == "warmstart_rule":
            fix, value = ctx["fix"], ctx["value"]
        elif e["type"] == "string_pattern_mismatch" and ctx.get("pattern") in _PATTERN_WORDS:
            rule, fix = _PATTERN_WORDS[ctx["pattern"]]
        elif e["type"] == "number_not_boolean":
            _, field = _field_at(model, loc)
            name = next((p for p in reversed(loc) if isinstance(p, str)), key)
            written = (plain_words or {}).get(given)
            truth = bool(ctx.get("truth"))
            spelt = f"the unquoted `{written}`" if written is not None else \
                " or ".join(f"`{w}`" for w in _BOOLEAN_WORDS[truth])
            rule = (f"takes a number, not a boolean; YAML read {spelt} as the boolean {str(truth).lower()} "
                    "(YAML 1.1 reads yes/no, on/off, true/false unquoted as booleans)")
            fix = f"write the number, e.g. {_example('int', name, field, None)}"
        elif e["type"] == "literal_error":
            fix = f"use one of: {ctx['expected']}"
        elif bound is not None and e["type"].startswith(("greater_than", "less_than")):
            fix = f"use a value {bound}"
        elif e["type"] == "finite_number":
            _, field = _field_at(model, loc)
            name = next((p for p in reversed(loc) if isinstance(p, str)), key)
            rule = "must be a finite number, not NaN or an infinity (`.nan`, `.inf`)"
            fix = f"write a number, e.g. {_example('float', name, field, value)}"
        elif e["type"] == "extra_forbidden" and _field_at(model, given)[1] is not None:
            # A known key's other spelling: pydantic reads one of the two and calls the other unknown.
            holder, twin = _field_at(model, given)
            name = next(n for n, f in holder.model_fields.items() if f is twin)  # type: ignore[union-attr]
            rule = f"given twice, as `{_key_of(name, twin)}` and `{name}`"
            fix = f"keep one of the two, `{_key_of(name, twin)}` as the stack files write it"
        elif e["type"] == "extra_forbidden":
            rule, fix = "unknown key", _unknown_key(model, loc)
        elif kind in _EXPECTED and e["type"] != "int_from_float" and loc:
            _, field = _field_at(model, loc)
            name = next((p for p in reversed(loc) if isinstance(p, str)), key)
            rule = f"expected {_EXPECTED[kind]}"
            fix = f"write it as {_EXPECTED[kind]}, e.g. {_example(kind, name, field, value)}"
        written = (plain_words or {}).get(given)
        word = written if written is not None and written.lower() in (*_BOOLEAN_WORDS[True], *_BOOLEAN_WORDS[False]) \
            else None
        # A top-level key's boolean reaches the model as the text Pulumi hands a program ("true").
        top_level = (prefix == f"{NAMESPACE}:" and len(given) == 1 and value in ("true", "false")
                     and (plain_words is None or word is not None))
        truth = value if isinstance(value, bool) else (value == "true" if top_level else None)
        texty = e["type"] in ("literal_error", "string_type", "enum", "string_pattern_mismatch")
        if truth is not None and texty:
            rule, fix = _boolean_hint(model, given, loc, truth, word, e["type"], rule, fix,
                                      certain=isinstance(value, bool) or word is not None)
        elif written is not None and word is None and texty and written != str(value):
            # YAML 1.1 reads `1.30` as 1.3, `0755` as octal 493, `1_000` as 1000, `1:30` as 90.
            name = next((p for p in reversed(loc) if isinstance(p, str)), "the key")
            rule += f"; YAML read the unquoted `{written}` as the number {value}"
            if _accepts(model, given, written, e["type"]):
                depth = _list_depth(given)
                fix = f'quote it: `{name}: {"[" * depth}"{written}"{"]" * depth}`'
        if isinstance(value, (dict, list)):
            value = None
        found.append(ConfigError(key, rule, fix, value))
    # One message per key: union branches repeat the same location.
    unique: dict[str, ConfigError] = {}
    for f in found:
        unique.setdefault(f.key, f)
    return ConfigErrors(list(unique.values()))


# YAML 1.1 (PyYAML, and Pulumi's stack files as warmstart reads them) reads these words unquoted,
# in lower, Title or UPPER case, as booleans: https://yaml.org/type/bool.html
_BOOLEAN_WORDS = {True: ("yes", "on", "true"), False: ("no", "off", "false")}


def _list_depth(given: tuple[Any, ...]) -> int:
    """How many list indexes end a key path (`extraArgs[0]`: 1)."""
    ints = 0
    while ints < len(given) and isinstance(given[len(given) - 1 - ints], int):
        ints += 1
    return ints


def _accepts(model: type[BaseModel] | None, given: tuple[Any, ...], text: str, error_type: str) -> bool:
    """Whether the key at `given` takes the string `text` (checked on the model that holds it)."""
    ints = _list_depth(given)
    holder, field = _field_at(model, given)
    if holder is None or field is None:
        # Inside a free mapping (`tags`, `podLabels`): a string value is what it takes.
        return error_type == "string_type"
    value: Any = text
    for _ in range(ints):
        value = [value]
    key = given[len(given) - 1 - ints]
    try:
        holder.model_validate({key: value})
    except ValidationError as err:
        return not any(e["loc"][:1] == (key,) for e in err.errors())
    return True


def _boolean_hint(model: type[BaseModel] | None, given: tuple[Any, ...], loc: tuple[Any, ...], truth: bool,
                  word: str | None, error_type: str, rule: str, fix: str, certain: bool = True) -> tuple[str, str]:
    """The rule and fix of a key that does not take a boolean but got one from an unquoted YAML
    word: the word as written (when the stack file is known), and a quoted value the key takes
    (the word itself, or another word of the same truth), else the error's own fix. `certain`:
    False for a top-level key's text `true`, which Pulumi hands alike for a quoted "true"."""
    shown = str(truth).lower()
    spelt = f"`{word}`" if word is not None else " or ".join(f"`{w}`" for w in _BOOLEAN_WORDS[truth])
    rule += (f"; YAML read the unquoted {spelt} as the boolean {shown}" if certain else
             f"; if the stack file has it unquoted, YAML read {spelt} as the boolean {shown}")
    name = next((p for p in reversed(loc) if isinstance(p, str)), "the key")
    candidates = [] if word is None else list(dict.fromkeys([word, word.lower()]))
    candidates += [w for w in _BOOLEAN_WORDS[truth] if w not in candidates]
    valid = next((c for c in candidates if _accepts(model, given, c, error_type)), None)
    if valid is None:
        return rule, fix  # no quoting makes a value this key takes: its own fix stands
    depth = _list_depth(given)
    quoted = "[" * depth + f'"{valid}"' + "]" * depth  # an item of a list: `extraArgs: ["yes"]`
    if word is None or valid == word:
        return rule, f"quote it: `{name}: {quoted}`"
    return rule, f'write `{name}: {quoted}`, quoted (`"{word}"` is not one of its values either)'


def parse_spec(model: type[_Spec], values: dict[str, Any], prefix: str) -> _Spec:
    """One config model from plain values (a component's Args), errors keyed `<prefix><key>`."""
    try:
        return model.model_validate(values)
    except ValidationError as err:
        raise _from_validation_error(err, prefix, model) from None


def spec_from_args(model: type[_Spec], args: Mapping[str, Any], prefix: str) -> _Spec:
    """The config model `model` from a component's Args (a dict with snake_case keys): only the
    keys the model has are read, enum members become their values, errors are keyed
    `<prefix><key>`."""
    values = {k: (v.value if isinstance(v, Enum) else v) for k, v in args.items()
              if k in model.model_fields and v is not None}
    return parse_spec(model, values, prefix)


def parse_config(values: dict[str, Any], plain_words: Mapping[tuple[Any, ...], str] | None = None) -> StackConfig:
    """Build the StackConfig from `{field: value}` (keys without the `warmstart:` prefix);
    `plain_words`: how the stack file wrote each unquoted boolean or number (`StackFileConfig`)."""
    try:
        return StackConfig.model_validate(values)
    except ValidationError as err:
        raise _from_validation_error(err, model=StackConfig, plain_words=plain_words) from None


def _config_values(config: Mapping[str, str]) -> dict[str, Any]:
    """`{field: value}` of Pulumi's flat config map (`{"warmstart:models": "<json>", ...}`).

    Pulumi hands an object or a list as its JSON text and a scalar as its string: only the
    former are decoded, so a string that reads as a number (`accountId: "123456789012"`,
    `kubernetesVersion: "1.35"`) stays the string its key requires."""
    values: dict[str, Any] = {}
    for full_key, raw in config.items():
        ns, _, key = full_key.partition(":")
        if ns != NAMESPACE:
            continue
        try:
            decoded = json.loads(raw)
        except (TypeError, json.JSONDecodeError):
            decoded = raw
        values[key] = decoded if isinstance(decoded, (dict, list)) else raw
    return values


def _with_yaml_problems(model: type[_Spec], config: Mapping[str, str], parse: typing.Callable[[], _Spec]) -> _Spec:
    """`parse()`, with the stack file's YAML problems (`_yaml_problems`) reported before its own
    errors, one per key."""
    problems = _yaml_problems(model, getattr(config, "plain_scalars", None) or {})
    try:
        parsed = parse()
    except ConfigErrors as err:
        keys = {p.key for p in problems}
        raise ConfigErrors(problems + [e for e in err.errors if e.key not in keys]) from None
    if problems:
        raise ConfigErrors(problems)
    return parsed


def from_pulumi_config(config: dict[str, str]) -> StackConfig:
    """An environment stack's config from Pulumi's flat config map (see `_config_values`)."""
    return _with_yaml_problems(StackConfig, config, lambda: parse_config(_config_values(config),
                                                                         getattr(config, "plain_words", None)))


def with_stack_file(flat: dict[str, str], stack: str, project_dir: Path | None = None) -> dict[str, str]:
    """Pulumi's flat config map as the program got it from the engine, with how the stack's file
    wrote each unquoted value (`StackFileConfig`), so `pulumi up` refuses what `warmstart render`
    refuses (`_yaml_problems`): the map alone cannot tell `010000` from 4096. The file is
    `<stackConfigDir>/Pulumi.<stack>.yaml` of the project the program runs in (its working
    directory). Only under the engine (PULUMI_CONFIG set: `pulumi.runtime.config.get_config_env`);
    under the mocks the render path has read the file already. A file that cannot be read leaves
    the map as it is: the engine read it."""
    import os

    if "PULUMI_CONFIG" not in os.environ:
        return flat
    project_dir = project_dir or Path.cwd()
    try:
        project = yaml.safe_load((project_dir / "Pulumi.yaml").read_text(encoding="utf-8")) or {}
        folder = project_dir / str(project.get("stackConfigDir") or "") if isinstance(project, dict) else project_dir
        path = stack_file(folder, stack)
        if not path.is_file():
            return flat
        read = read_stack_file(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ConfigError, ConfigErrors):
        return flat
    out = StackFileConfig(flat)
    out.plain_words, out.plain_scalars = read.plain_words, read.plain_scalars  # type: ignore[attr-defined]
    return out


PLATFORM_KEY = f"{NAMESPACE}:platform"


def is_model_stack(config: Mapping[str, str]) -> bool:
    """Whether a Pulumi config map is a model stack's (it names its platform)."""
    return PLATFORM_KEY in config


def model_stack_from_pulumi_config(config: dict[str, str]) -> ModelStackConfig:
    """A model stack's config from Pulumi's flat config map (see `_config_values`)."""
    def parse() -> ModelStackConfig:
        try:
            return ModelStackConfig.model_validate(_config_values(config))
        except ValidationError as err:
            raise _from_validation_error(err, model=ModelStackConfig,
                                         plain_words=getattr(config, "plain_words", None)) from None
    return _with_yaml_problems(ModelStackConfig, config, parse)


def stack_file(stacks_dir: Path, stack: str) -> Path:
    return stacks_dir / f"Pulumi.{stack}.yaml"


def stack_names(stacks_dir: Path) -> list[str]:
    """The stacks in a folder: NAME of every Pulumi.NAME.yaml."""
    return sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in stacks_dir.glob("Pulumi.*.yaml"))


class StackFileConfig(dict):
    """A stack file's config as `read_stack_file` reads it (`{ns:key: json-or-string}`), and how
    each unquoted YAML boolean or number in it was written (`plain_words`, by key path), for the
    hint of an error on a key that takes neither."""

    plain_words: dict[tuple[Any, ...], str] = {}
    # Every unquoted scalar of the warmstart keys, by key path (`_yaml_problems`).
    plain_scalars: dict[tuple[Any, ...], str] = {}


def read_stack_file(path: Path) -> dict[str, str]:
    """A stack file's config as Pulumi hands it to a program: `{ns:key: json-or-string}`."""
    if not path.is_file():
        stack = path.name.removeprefix("Pulumi.").removesuffix(".yaml")
        known = stack_names(path.parent)
        raise ConfigError(
            "stack", f"no stack {stack!r} in {path.parent.name}/",
            (f"use one of: {', '.join(known)}" if known else "create one")
            + f" (stack NAME is the file {path.parent.name}/Pulumi.NAME.yaml)", stack)
    shown = f"{path.parent.name}/{path.name}"
    try:
        plain: dict[tuple[Any, ...], str] = {}
        doc, words = _load_stack_yaml(path.read_text(encoding="utf-8"), plain)
    except UnicodeDecodeError as err:
        raise ConfigError(shown, f"not UTF-8 text (byte {err.start} is {err.object[err.start:err.start + 1]!r})",
                          "save the file as UTF-8") from None
    except yaml.MarkedYAMLError as err:
        raise ConfigError(shown, f"not valid YAML: {_yaml_problem(err)}", "fix the YAML syntax") from None
    except yaml.YAMLError as err:
        raise ConfigError(shown, f"not valid YAML: {' '.join(str(err).split())}", "fix the YAML syntax") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(shown, f"the document is {_yaml_kind(doc)}, not a mapping",
                          f"write the file as `config:` with `{NAMESPACE}:<key>: value` entries under it (see {REFERENCE})")
    config = doc.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: config", "must be a mapping of keys to values", f"see {REFERENCE}")
    out = StackFileConfig()
    # `{warmstart:models: ...}` paths as a config key's error names them (`models`, 0, ...).
    out.plain_words = {(p[1].partition(":")[2], *p[2:]): w for p, w in words.items()
                      if len(p) > 1 and p[0] == "config" and str(p[1]).startswith(f"{NAMESPACE}:")}
    out.plain_scalars = {(p[1].partition(":")[2], *p[2:]): w for p, w in plain.items()
                         if len(p) > 1 and p[0] == "config" and str(p[1]).startswith(f"{NAMESPACE}:")}
    for k, v in config.items():
        if not isinstance(k, str):
            raise ConfigError(f"config.{k}", f"a config key must be text, not {_yaml_kind(k)}",
                              f"write it as `{NAMESPACE}:<key>` (see {REFERENCE})")
        _check_namespace(k)
        try:
            # A NaN or an infinity passes as JSON's NaN / Infinity: the models refuse them by the key.
            out[k] = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        except TypeError:
            raise ConfigError(k, "holds a value of a YAML type a stack config cannot carry (a `!!binary` or "
                              "`!!set`)", "write it as text, a number, true/false, a list or a mapping") from None
        except ValueError:  # json's "Circular reference detected"
            raise ConfigError(k, "holds itself (a YAML alias inside the anchor it names)",
                              "write the value out instead of the alias") from None
    return out


def _check_namespace(key: str) -> None:
    """A key in a namespace one slip away from warmstart's (`warmstrat:models`) would be read by no
    one, so the stack would deploy without it: refuse it. Other namespaces (`aws:`, a provider's,
    the user's own) pass untouched."""
    ns, sep, rest = key.partition(":")
    if not sep or ns == NAMESPACE:
        return
    if difflib.SequenceMatcher(None, ns.lower(), NAMESPACE).ratio() >= 0.75:
        raise ConfigError(key, f"its namespace {ns!r} is not warmstart's ({NAMESPACE!r}), so warmstart would ignore "
                          "the key and deploy without it", f"rename it {NAMESPACE}:{rest}")


class _StackFileLoader(yaml.SafeLoader):
    """PyYAML's safe loader as warmstart reads a stack file (`load_stack_yaml`)."""


def _timestamp_as_text(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    # No stack key takes a YAML timestamp: `capacityBlock.endsAt: 2027-03-01T11:30:00Z` written
    # unquoted, as the reference shows it, is the ISO 8601 text the key parses (and a date-only
    # one is refused there for its missing time zone), as a Pulumi program receives it.
    # https://yaml.org/type/timestamp.html
    return loader.construct_scalar(node)


_StackFileLoader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp_as_text)


def _yaml_kind(value: object) -> str:
    return {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), f"a {type(value).__name__}")


def _yaml_problem(err: yaml.MarkedYAMLError) -> str:
    """PyYAML's error in one line: the problem and where (PyYAML's own text spans several
    lines, with a quote of the file)."""
    mark = err.problem_mark or err.context_mark
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = " ".join(part for part in (err.context, err.problem) if part)
    return f"{what}{where}"


def _yaml_path(path: tuple[Any, ...]) -> str:
    """A node's path as the stack key it is (`warmstart:models[0].name`), or from the document's
    top for a key outside `config`."""
    if len(path) > 1 and path[0] == "config":
        head, rest = str(path[1]), path[2:]
        return head + (("." if rest and not isinstance(rest[0], int) else "") + _key_path(rest) if rest else "")
    return _key_path(path) or "the document"


_PLAIN_TAGS = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


def _check_nodes(node: yaml.Node, path: tuple[Any, ...], seen_nodes: set[int], words: dict[tuple[Any, ...], str],
                 plain: dict[tuple[Any, ...], str] | None = None) -> None:
    """A key given twice in one mapping is an error: YAML requires unique keys
    (https://yaml.org/spec/1.2.2/#mapping) and PyYAML would silently keep the last one. Records
    in `words` how each unquoted boolean or number was written (`yes`, `1.30`, ...), by its path,
    and in `plain` every unquoted scalar."""
    if id(node) in seen_nodes:  # an alias of a node already walked (or a recursive one)
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.ScalarNode) and node.tag in _PLAIN_TAGS:
        words[path] = node.value
    if isinstance(node, yaml.ScalarNode) and node.style is None and plain is not None:
        plain[path] = node.value
    if isinstance(node, yaml.MappingNode):
        lines: dict[str, str] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                _check_nodes(value_node, path, seen_nodes, words, plain)
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            where = f"line {key_node.start_mark.line + 1}, column {key_node.start_mark.column + 1}"
            if key is not None and key in lines:
                raise ConfigError(_yaml_path((*path, key)),
                                  f"duplicate key, given twice in one mapping (at {lines[key]} and {where}), "
                                  "of which YAML would silently keep only the last", "remove one of the two")
            if key is not None:
                lines[key] = where
            _check_nodes(value_node, (*path, key if key is not None else "?"), seen_nodes, words, plain)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_nodes(item, (*path, i), seen_nodes, words, plain)


def _load_stack_yaml(text: str, plain: dict[tuple[Any, ...], str] | None = None) -> tuple[Any, dict[tuple[Any, ...], str]]:
    """A stack file's one YAML document, read as PyYAML's safe loader reads it except that a key
    given twice is a ConfigError and a timestamp stays its text; and how each unquoted boolean or
    number was written, by its path (every unquoted scalar into `plain`, when given). Raises
    yaml.YAMLError for a file that is not YAML."""
    loader = _StackFileLoader(text)
    words: dict[tuple[Any, ...], str] = {}
    try:
        node = loader.get_single_node()
        if node is None:
            return None, words
        _check_nodes(node, (), set(), words, plain)
        return loader.construct_document(node), words
    finally:
        loader.dispose()


# ---- what Pulumi's own YAML reader makes of a stack file ------------------------------------
# `pulumi up` does not read the stack file with PyYAML: the CLI reads Pulumi.<stack>.yaml with
# gopkg.in/yaml.v2 (v2.4.0; `yaml.Unmarshal` in pulumi sdk/go/common/encoding/marshal.go), each
# config value into `any` (`object.UnmarshalYAML`, sdk/go/common/resource/config/object.go), and
# hands the program a scalar as its JSON text and an object as JSON. yaml.v2's resolver
# (resolve.go at v2.4.0) reads unquoted: y/Y/yes/on/true (any case of those words) as true and
# n/N/no/off/false as false, `~`/null as null, an integer of Go's `strconv.ParseInt(s, 0, 64)`
# after removing `_` (so `010000` is octal 4096, `0o17` 15, `0x1F` 31, `0b101` 5), a float of
# `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$` (`1e3` is 1000), no base-60 number
# ("Base 60 floats are a bad idea ... purposefully unsupported": `5:00` stays the text), and a
# timestamp into `any` as its text (decode.go: "for backward compatibility reasons we set it as a
# string"). PyYAML (YAML 1.1, what `warmstart render` reads) differs on `y`/`n`, `0o17`, `1e3`
# and `5:00`: a value the two read differently is refused on both paths, and a number written in
# a base other than ten where a number goes is refused on both (they agree on it, wrongly).
_V2_TRUE = ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")
_V2_FALSE = ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")
_V2_SPECIAL_FLOATS = ((float("nan"), (".nan", ".NaN", ".NAN")), (float("inf"), (".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF")),
                      (float("-inf"), ("-.inf", "-.Inf", "-.INF")))
_V2_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_GO_INT = re.compile(r"([-+]?)(0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)")
_DECIMAL = re.compile(r"[-+]?(0|[1-9][0-9]*)")


def _go_parse_int(text: str) -> int | None:
    """Go's `strconv.ParseInt(text, 0, 64)`, or ParseUint's where that overflows (yaml.v2 tries
    both); None where neither reads it."""
    m = _GO_INT.fullmatch(text)
    if m is None:
        return None
    sign, digits = m.groups()
    low = digits.lower()
    base = 16 if low.startswith("0x") else 8 if low.startswith("0o") else 2 if low.startswith("0b") else \
        8 if len(digits) > 1 and digits.startswith("0") else 10
    value = int(digits[2:] if low[:2] in ("0x", "0o", "0b") else digits, base)
    value = -value if sign == "-" else value
    fits = -2**63 <= value < 2**63 or (sign == "" and value < 2**64)
    return value if fits else None


def yaml_v2_reads(text: str) -> Any:
    """What gopkg.in/yaml.v2 (v2.4.0) decodes an unquoted scalar `text` to inside `any`, as the
    JSON value Pulumi hands the program (see above)."""
    if text in _V2_TRUE:
        return True
    if text in _V2_FALSE:
        return False
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    for value, spellings in _V2_SPECIAL_FLOATS:
        if text in spellings:
            return value
    if text[0] == ".":
        return float(text) if _V2_FLOAT.fullmatch(text) else text
    if text[0] in "+-0123456789":
        if _TIMESTAMP.fullmatch(text):
            return text
        plain = text.replace("_", "")
        as_int = _go_parse_int(plain)
        if as_int is not None:
            return as_int
        if _V2_FLOAT.fullmatch(plain):
            number = float(plain)
            # Go's json.Marshal writes an integral float64 without a fraction: the program reads an int.
            return int(number) if number.is_integer() and abs(number) < 1e21 else number
    return text


# yaml.v2's timestamp forms (resolve.go `allowedTimestampFormats`), by their shape.
_TIMESTAMP = re.compile(r"\d{4}-\d{1,2}-\d{1,2}(([Tt]|[ \t]+)\d{1,2}:\d{2}:\d{2}(\.\d*)?(\s*(Z|[-+]\d{1,2}(:\d{2})?))?)?")


def _same_reading(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # NaN, refused by the keys themselves
    return type(a) is bool if type(b) is bool else (a == b and type(a) is not bool)


def _pyyaml_reads(text: str) -> Any:
    value = yaml.load(text, _StackFileLoader)  # noqa: S506 - the safe loader, timestamps as text
    return json.loads(json.dumps(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _yaml_problems(model: type[BaseModel], plain: Mapping[tuple[Any, ...], str], prefix: str = f"{NAMESPACE}:") \
        -> list[ConfigError]:
    """The unquoted values of a stack file that the two YAML readers read differently, and the
    numbers written in another base than ten where a number goes (`010000`, `5:00`, `0x10`): one
    error each, the same on `warmstart render` and on `pulumi up`, which both read the file."""
    found: dict[str, ConfigError] = {}
    for path, text in plain.items():
        if not text:
            continue
        key = prefix + _key_path(path)
        name = next((p for p in reversed(path) if isinstance(p, str)), key)
        _, field = _field_at(model, path)
        numeric = field is not None and _numeric_only(field.annotation)
        py, v2 = _pyyaml_reads(text), yaml_v2_reads(text)
        if numeric and isinstance(py, int) and not isinstance(py, bool) and not _DECIMAL.fullmatch(text):
            base = "base 60 (sexagesimal)" if ":" in text else "octal" if re.fullmatch(r"[-+]?0[0-7]+", text) else \
                "hexadecimal" if "x" in text.lower() else "binary" if "b" in text.lower() else "digits split by `_`"
            meant = text.lstrip("+0") or "0" if base == "octal" else str(py)
            found.setdefault(key, ConfigError(
                key, f"YAML 1.1 reads the unquoted `{text}` as the {base} number {py}"
                + ("" if _same_reading(py, v2) else f", Pulumi's reader as {json.dumps(v2)}"),
                f"write the number in decimal digits, e.g. `{name}: {meant}`", text))
        elif not _same_reading(py, v2) and not (isinstance(py, str) and isinstance(v2, str)):
            found.setdefault(key, ConfigError(
                key, f"the unquoted `{text}` reads as {json.dumps(py)} to warmstart (YAML 1.1) but as "
                f"{json.dumps(v2)} to Pulumi's own reader (gopkg.in/yaml.v2), which `pulumi up` uses",
                f'quote it if it is text (`{name}: "{text}"`), else write a decimal number or true/false', text))
    return list(found.values())


# Every model is defined: their field descriptions from the attribute docstrings (docstrings.py).
describe_models(__name__)
