"""Config reach: every leaf of the stack config changes what is deployed.

A leaf is a key of `StackConfig` (an environment stack) or `ModelStackConfig` (a model stack)
that holds a value rather than a mapping of further keys, at any depth: `cluster.logTypes`,
`gpuPools[0].capacity.reservedNodes`, `models[0].routing.policy`, `model.standby.count`. Each is
enumerated from the pydantic model itself (`leaves`), so a key added to warmstart/config.py is
checked without an edit here. The check (`Reach.check`) sets one leaf to a valid value other than
its baseline's and renders the stack under Pulumi mocks (warmstart/render.py): some registered
cloud resource, provider or Kubernetes object must differ from the baseline render. plan.json
and the stack's outputs do not count: a key that only they show is a setting that deploys
nothing.

Values are derived from the field (`derived_values`): a bool flipped, an int or a float moved
within its bounds, another member of a Literal, the simplest strings of its pattern; a leaf is
tried on the shipped stacks that set its sections (`staging`, `dev`, `prod`: the fastest render
first) until one deploys something else. `SAMPLES` and `MODEL_SAMPLES` hold the few values, setups
(a section no shipped stack sets, a condition the leaf acts under) and companion keys a rule
needs by hand. Every key they name is checked to exist (tests/stack/test_config_reach.py), and so
is every entry of `NO_REACH`, the keys that legitimately deploy nothing, which must also still
reach nothing, and of `KNOWN_UNREACHED`, xfail(strict) until another change wires them.

Both check functions take the config model as a parameter, so a test can hand them a model with
a throw-away field and see the check name it (`probe_config`).
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import re
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from tests.support.stacks import ROOT, load_stack_doc
from warmstart import config, render
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.plan.stack import plan_stack

THIS_FILE = "tests/support/config_reach.py"
NS = config.NAMESPACE

Doc = dict[str, Any]
Part = str | int
KeyPath = tuple[Part, ...]


# --------------------------------------------------------------------------------------
# Leaves


def _unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """The annotation without `| None` and `Annotated`, and the metadata `Annotated` carried."""
    metadata: list[Any] = []
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation, *extra = typing.get_args(annotation)
            for e in extra:
                metadata += list(getattr(e, "metadata", [e])) if isinstance(e, FieldInfo) else [e]
            continue
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) == 1:
                annotation = members[0]
                continue
        return annotation, metadata


def _model_of(annotation: Any) -> type[BaseModel] | None:
    inner, _ = _unwrap(annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    inner, _ = _unwrap(annotation)
    if typing.get_origin(inner) is list:
        return _model_of(typing.get_args(inner)[0])
    return None


def key_text(path: KeyPath) -> str:
    """A key path as a stack file's reader names it: `models[0].routing.drainSeconds`."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + p
    return out


@dataclass(frozen=True)
class Leaf:
    """One key that holds a value, at its path in a stack file's spelling."""

    path: KeyPath
    holder: type[BaseModel]
    """The config model whose field it is."""
    name: str
    """Its field name in `holder`."""
    sections: tuple[tuple[KeyPath, type[BaseModel]], ...]
    """The mappings on the way to it that a stack may leave unset (an optional section, a list
    of mappings), with their model: a stack must set each for the leaf to mean anything
    (`models[0].autoscaling` of `models[0].autoscaling.maxReplicas`)."""

    @property
    def info(self) -> FieldInfo:
        return self.holder.model_fields[self.name]

    @property
    def key(self) -> str:
        return key_text(self.path)


def leaves(model: type[BaseModel], prefix: KeyPath = (),
           sections: tuple[tuple[KeyPath, type[BaseModel]], ...] = ()) -> list[Leaf]:
    """Every leaf of `model`, recursing into nested models and into the first item of a list of
    models (`gpuPools[0]`, `models[0]`, `capacity.reservations[0]`). A mapping of free keys
    (`tags`), a list of values and a union of values are leaves themselves."""
    out: list[Leaf] = []
    for name, info in model.model_fields.items():
        path = (*prefix, info.alias or name)
        item = _list_item_model(info.annotation)
        inner = _model_of(info.annotation)
        if item is not None:
            out += leaves(item, (*path, 0), (*sections, ((*path, 0), item)))
        elif inner is not None:
            optional = info.default is None
            out += leaves(inner, path, (*sections, (path, inner)) if optional else sections)
        else:
            out.append(Leaf(path, model, name, sections))
    return out


# --------------------------------------------------------------------------------------
# Stack documents


def stack_key(path: KeyPath) -> str:
    return f"{NS}:{path[0]}"


_MISSING = object()


def get_at(doc: Doc, path: KeyPath) -> Any:
    """The value at `path` in a stack document, `_MISSING` where a key on the way is unset."""
    node: Any = doc["config"]
    for i, part in enumerate(path):
        k = stack_key(path) if i == 0 else part
        if isinstance(part, int):
            if not isinstance(node, list) or len(node) <= part:
                return _MISSING
            node = node[part]
        elif not isinstance(node, dict) or k not in node or node[k] is None:
            return _MISSING
        else:
            node = node[k]
    return node


def set_at(doc: Doc, path: KeyPath, value: Any) -> None:
    """Set `path` in a stack document, creating the mappings on the way (not list items)."""
    node: Any = doc["config"]
    for i, part in enumerate(path[:-1]):
        k = stack_key(path) if i == 0 else part
        if isinstance(part, int):
            node = node[part]
        else:
            if node.get(k) is None:
                node[k] = {}
            node = node[k]
    node[stack_key(path) if len(path) == 1 else path[-1]] = value


def current_value(doc: Doc, leaf: Leaf) -> Any:
    """The leaf's value in `doc`: as written, else its field's default (PydanticUndefined for a
    required field)."""
    written = get_at(doc, leaf.path)
    if written is not _MISSING:
        return written
    default = leaf.info.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return default.model_dump(mode="json", by_alias=True)
    return default


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return value


def sets_sections(doc: Doc, leaf: Leaf) -> list[str] | None:
    """Whether `doc` sets every section the leaf sits in; an optional section whose keys all have
    defaults is set to `{}` where unset (`models[0].loader`), so its leaves are checked on their
    defaults. The keys it set; None when a section is missing that it cannot set."""
    added: list[str] = []
    for path, model in leaf.sections:
        if get_at(doc, path) is not _MISSING:
            continue
        if isinstance(path[-1], int) or any(f.is_required() for f in model.model_fields.values()):
            return None
        set_at(doc, path, {})
        added.append(key_text(path))
    return added


# --------------------------------------------------------------------------------------
# Values


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    return {k: getattr(m, k) for m in metadata for k in ("ge", "gt", "le", "lt", "max_length", "min_length",
                                                          "pattern") if getattr(m, k, None) is not None}


def _simplest(parsed: Any, pick: int) -> str:
    """The shortest string a parsed regex matches, each character class's `pick`-th member
    (wrapping), the first branch of each alternation."""
    out = ""
    for op, arg in parsed:
        name = str(op)
        if name == "LITERAL":
            out += chr(arg)
        elif name == "IN":
            members: list[str] = []
            for kind, value in arg:
                if str(kind) == "LITERAL":
                    members.append(chr(value))
                elif str(kind) == "RANGE":
                    members += [chr(c) for c in range(value[0], min(value[1], value[0] + 2) + 1)]
                elif str(kind) == "CATEGORY":
                    members += ["0", "1"] if "DIGIT" in str(value) else ["a", "b"]
            out += members[pick % len(members)] if members and str(arg[0][0]) != "NEGATE" else "a"
        elif name == "ANY":
            out += "ab"[pick % 2]
        elif name in ("MAX_REPEAT", "MIN_REPEAT"):
            low, _, sub = arg
            out += _simplest(sub, pick) * max(low, 0)
        elif name == "SUBPATTERN":
            out += _simplest(arg[-1], pick)
        elif name == "BRANCH":
            out += _simplest(arg[1][0], pick)
    return out


def _pattern_strings(pattern: str, avoid: list[Any], max_length: int | None) -> list[str]:
    """Up to two strings of the pattern other than `avoid`, the simplest it matches (built from
    the parsed pattern, so the same every run). The stack's patterns are ASCII classes, anchors
    and repeats, which Python's `re` parses as pydantic's Rust `regex` does."""
    # re._parser: the parser `re` compiles with (its public alias sre_parse is deprecated in 3.11).
    import re._parser as parser  # type: ignore[import-not-found]

    parsed = parser.parse(pattern)
    out: list[str] = []
    for pick in range(4):
        s = _simplest(parsed, pick)
        if re.fullmatch(pattern, s) and s not in avoid and s not in out and (max_length is None or len(s) <= max_length):
            out.append(s)
    return out[:2]


def _scalar_values(annotation: Any, metadata: list[Any], current: Any) -> list[Any]:
    """Values of a scalar type other than `current` (None: the leaf is unset)."""
    bounds = _bounds(metadata)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return [v for v in typing.get_args(annotation) if v != current]
    if origin in (typing.Union, types.UnionType):
        out: list[Any] = []
        for member in typing.get_args(annotation):
            if member is type(None):
                continue
            inner, extra = _unwrap(member)
            out += [v for v in _scalar_values(inner, [*metadata, *extra], current) if v not in out]
        return out
    if annotation is bool:
        return [not current] if isinstance(current, bool) else [True, False]
    if annotation is int:
        lo = bounds.get("ge", bounds["gt"] + 1 if "gt" in bounds else None)
        hi = bounds.get("le", bounds["lt"] - 1 if "lt" in bounds else None)
        if not isinstance(current, int) or isinstance(current, bool):
            return [lo if lo is not None else 1]
        up, down = current + 1, current - 1
        return [v for v in (up, down) if (hi is None or v <= hi) and (lo is None or v >= lo)]
    if annotation is float:
        hi = bounds.get("le", bounds.get("lt"))
        lo = bounds.get("ge", bounds.get("gt"))
        if not isinstance(current, (int, float)) or isinstance(current, bool):
            base = lo if lo is not None else 0.0
            return [round((base + hi) / 2, 4) if hi is not None else float(base) + 1.0]
        out = [round((current + hi) / 2, 4) if hi is not None and hi > current else current * 2 if current else 1.0]
        if lo is not None and current > lo:
            out.append(round((current + lo) / 2, 4))
        return out
    if annotation is str:
        if "pattern" in bounds:
            return _pattern_strings(bounds["pattern"], [current], bounds.get("max_length"))
        if isinstance(current, str) and current:
            return [f"{current}-b"]
        return []
    if annotation is dt.datetime:
        return ["2099-01-01T00:00:00Z"]
    return []


def derived_values(leaf: Leaf, current: Any) -> list[Any]:
    """Values of the leaf other than `current` (its baseline's), in a stack file's spelling,
    derived from its field's type: empty when none can be."""
    return field_values(leaf.info, current)


def field_values(info: FieldInfo, current: Any) -> list[Any]:
    """Values of a config field other than `current`, derived from its type and bounds (what
    `derived_values` gives a leaf; tests/serving/test_vllm_model_entry.py samples the entry
    VllmModel takes with it)."""
    annotation, metadata = _unwrap(info.annotation)
    metadata = [*info.metadata, *metadata]
    if current is PydanticUndefined:
        current = None
    origin = typing.get_origin(annotation)
    if origin is list:
        item, item_meta = _unwrap(typing.get_args(annotation)[0])
        have = list(current or [])
        if typing.get_origin(item) is Literal:
            new = [v for v in typing.get_args(item) if v not in have]
        else:
            new = [v for v in _scalar_values(item, item_meta, None) if v not in have]
        out = [[*have, v] for v in new[:1]]
        if len(have) > 1:
            out.append(have[:-1])
        return out
    if origin is dict:
        return [{**(current or {}), "reach-probe": "b"}]
    return _scalar_values(annotation, metadata, current)


# --------------------------------------------------------------------------------------
# What a render deploys


def deployed(r: render.Rendered) -> frozenset[str]:
    """Every registered resource but the components themselves (whose inputs are their
    children's business), with its type, name and inputs, as comparable text: the cloud
    resources, the Kubernetes objects and the providers (their default tags and allowed
    accounts are what every AWS resource is created with)."""
    kept = [x for x in r.resources if not x.typ.startswith("warmstart:")]
    return frozenset(json.dumps([x.typ, x.name, x.inputs], sort_keys=True, default=str) for x in kept)


# --------------------------------------------------------------------------------------
# Hand tables

Setup = Callable[[Doc], None]


@dataclass(frozen=True)
class Sample:
    """A leaf's value where deriving one does not do: `value` (None: derive it) in a stack
    file's spelling, on `stack` (None: the first shipped stack that sets the leaf's sections),
    after `setup`, a change both the baseline and the leaf's render share (a condition the leaf
    acts under), named by `setup_name` so leaves of one setup share their baseline."""

    value: Any = None
    setup: Setup | None = None
    setup_name: str = ""
    stack: str | None = None
    also: Setup | None = None
    """A change only the leaf's render makes besides the value: a key the new value requires
    (`modelBucket.create: false` needs a `name`)."""


def _model(doc: Doc) -> Doc:
    """The model entry a leaf under `models[0]` / `model` sits in."""
    c = doc["config"]
    return c[f"{NS}:models"][0] if f"{NS}:models" in c else c[f"{NS}:model"]


def _platform(doc: Doc) -> Doc:
    """The environment a leaf's pools are in: the stack itself, or a model stack's platform."""
    return doc.get("platform") or doc


def _pool(doc: Doc) -> Doc:
    return _platform(doc)["config"][f"{NS}:gpuPools"][0]


def _two_instance_types(doc: Doc) -> None:
    _pool(doc)["instanceTypes"] = ["g6e.2xlarge", "g6e.4xlarge"]
    _model(doc)["instanceType"] = "g6e.2xlarge"


def _four_gpus(doc: Doc) -> None:
    _pool(doc)["instanceTypes"] = ["g6e.12xlarge"]


def _second_pool(doc: Doc) -> None:
    _platform(doc)["config"][f"{NS}:gpuPools"].append({"name": "l40s-b", "instanceTypes": ["g6e.2xlarge"], "maxGpus": 64})


def _reservation_by_tags(doc: Doc) -> None:
    _pool(doc)["capacity"]["reservations"] = [{"tags": {"team": "ml"}}]


def _models_follow_the_pool(doc: Doc) -> None:
    for m in doc["config"].get(f"{NS}:models", []):
        m["pool"] = _pool(doc)["name"]


def _spot(doc: Doc) -> None:
    _pool(doc)["capacity"] = {"types": ["spot", "onDemand"], "spotHourlyPriceUsd": 30.0}


def _existing_vpc(doc: Doc) -> None:
    doc["config"][f"{NS}:network"] = {
        "vpcId": "vpc-0123456789abcdef0",
        "privateSubnetIds": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
        "privateRouteTableIds": ["rtb-0123456789abcdef0"]}


def _own_prometheus(doc: Doc) -> None:
    doc["config"][f"{NS}:monitoring"] = {
        "prometheusUrl": "http://prometheus-operated.monitoring.svc:9090",
        "scraper": {"namespace": "monitoring", "podLabels": {"app.kubernetes.io/name": "prometheus"}}}


def _ecr_pull_through(doc: Doc) -> None:
    doc["config"][f"{NS}:accountId"] = "123456789012"
    doc["config"][f"{NS}:imageCache"] = {"ecrPullThrough": {
        "credentialArn": "arn:aws:secretsmanager:us-west-2:123456789012:secret:ecr-pullthroughcache/docker-hub"}}


def _restricted_bucket(doc: Doc) -> None:
    doc["config"][f"{NS}:modelBucket"] = {"restrictToVpcEndpoint": True,
                                          "admins": ["arn:aws:iam::123456789012:role/admin"]}


def _model_s3_import(doc: Doc) -> None:
    _model(doc)["import"] = {"s3": "s3://registry-bucket/meta-llama/Llama-3.1-8B-Instruct"}


def _pooled(doc: Doc) -> None:
    """The model autoscaled and in a standby pool `shared` on its GPU pool (docs/scale-out.md,
    "Pooled standby"); a model stack's model names the pool too (and is refused: MODEL_STACK_REFUSED)."""
    m = _model(doc)
    m["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}
    m["standby"] = {"pool": "shared"}
    if f"{NS}:models" in doc["config"]:
        doc["config"][f"{NS}:standbyPools"] = [{"name": "shared", "gpuPool": _pool(doc)["name"]}]


def _pooled_two_types(doc: Doc) -> None:
    _pooled(doc)
    _two_instance_types(doc)
    doc["config"][f"{NS}:standbyPools"][0]["instanceType"] = "g6e.2xlarge"


def _pooled_four_gpus(doc: Doc) -> None:
    _pooled(doc)
    _four_gpus(doc)
    _model(doc)["tensorParallelSize"] = 1


def _autoscaled(doc: Doc) -> None:
    _model(doc)["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}
    _model(doc).pop("standby", None)


def _add_pool_shared(doc: Doc) -> None:
    if f"{NS}:models" in doc["config"]:
        doc["config"][f"{NS}:standbyPools"] = [{"name": "shared", "gpuPool": _pool(doc)["name"]}]


# Keys are leaf keys relative to a model entry (`instanceType` is `models[0].instanceType` in an
# environment stack and `model.instanceType` in a model stack): one table for both.
MODEL_SAMPLES: dict[str, Sample] = {
    "instanceType": Sample("g6e.4xlarge", _two_instance_types, "a pool of g6e.2xlarge and g6e.4xlarge"),
    # `auto` is 1 for dev's 15 GiB on one L40S: 2 needs a type of more GPUs.
    "tensorParallelSize": Sample(2, _four_gpus, "a pool of g6e.12xlarge (4 GPUs)"),
    # A list of free text: nothing to derive an argument vLLM takes from.
    "extraArgs": Sample(["--seed", "7"]),
    "pool": Sample("l40s-b", _second_pool, "a second pool, l40s-b"),
    "import.s3": Sample("s3://other-weights/meta-llama/Llama-3.1-8B-Instruct", _model_s3_import, "an S3 import"),
    "standby.pool": Sample("shared", _autoscaled, "autoscaling", also=_add_pool_shared),
    "standby.port": Sample(8500, _pooled, "a standby pool"),
}
MODEL_PREFIXES = ("models[0].", "model.")

# Leaves of an environment or a model stack outside a model entry, by key.
SAMPLES: dict[str, Sample] = {
    "gpuPools[0].name": Sample("pool-b", also=_models_follow_the_pool),
    "gpuPools[0].instanceTypes": Sample(["g6e.4xlarge"]),
    "gpuPools[0].capacity.reservations[0].tags": Sample({"team": "other"}, _reservation_by_tags,
                                                        "a reservation selected by tags", "prod"),
    "gpuPools[0].capacity.reservations[0].ownerId": Sample("123456789012", _reservation_by_tags,
                                                           "a reservation selected by tags", "prod"),
    "gpuPools[0].capacity.spotHourlyPriceUsd": Sample(40.0, _spot, "a spot pool"),
    "network.vpcId": Sample("vpc-0123456789abcdef1", _existing_vpc, "an existing VPC"),
    "network.privateSubnetIds": Sample(["subnet-0123456789abcdef0", "subnet-0123456789abcdef2"], _existing_vpc,
                                       "an existing VPC"),
    "network.privateRouteTableIds": Sample(["rtb-0123456789abcdef1"], _existing_vpc, "an existing VPC"),
    "network.publicSubnetIds": Sample(["subnet-0123456789abcdef3"], _existing_vpc, "an existing VPC"),
    "network.cidr": Sample("10.1.0.0/16"),
    # `false` is refused unless the stack opts out of the endpoint explicitly.
    "network.s3GatewayEndpoint": Sample(False, also=lambda d: set_at(d, ("network", "allowS3ViaNat"), True)),
    "network.availabilityZones": Sample(["us-west-2a", "us-west-2b"]),
    "modelBucket.name": Sample("team-weights"),
    # An existing bucket must be named; a restricted one needs its admins.
    "modelBucket.create": Sample(False, also=lambda d: set_at(d, ("modelBucket", "name"), "team-weights")),
    "modelBucket.restrictToVpcEndpoint": Sample(True, also=lambda d: set_at(
        d, ("modelBucket", "admins"), ["arn:aws:iam::123456789012:role/admin"])),
    "modelBucket.admins": Sample(["arn:aws:iam::123456789012:role/other"], _restricted_bucket,
                                 "a bucket restricted to the VPC endpoint"),
    "modelBucket.deployers": Sample(["arn:aws:iam::123456789012:role/deploy"], _restricted_bucket,
                                    "a bucket restricted to the VPC endpoint"),
    "compileCacheBucket.name": Sample("team-compile-cache"),
    "cluster.serviceCidr": Sample("172.21.0.0/16"),
    "cluster.publicAccessCidrs": Sample(["203.0.113.0/24"]),
    "cluster.systemNodeGroup.instanceTypes": Sample(["m7i.xlarge"], stack="prod"),
    # karpenter mode only; at least 2, and as many as what runs there needs.
    "cluster.systemNodeGroup.size": Sample(6, stack="prod"),
    "compileCache.hostPath": Sample("/mnt/k8s-disks/0/other-cache", stack="prod"),
    "monitoring.prometheusUrl": Sample("http://prometheus.other.svc:9090", _own_prometheus, "your own Prometheus",
                                       "prod"),
    "monitoring.scraper.namespace": Sample(None, _own_prometheus, "your own Prometheus", "prod"),
    "monitoring.scraper.podLabels": Sample(None, _own_prometheus, "your own Prometheus", "prod"),
    "imageCache.ecrPullThrough.credentialArn": Sample(
        "arn:aws:secretsmanager:us-west-2:123456789012:secret:ecr-pullthroughcache/other", _ecr_pull_through,
        "an ECR pull-through cache"),
    "huggingFaceToken": Sample("hf_reach"),
    # A model stack's platform: another environment's stack file (the same platform under another name).
    "platform": Sample("staging-b"),
    # Unset, the first create's count is minReplicas plus the standby engine, 2: the derived 2 is it.
    "model.replicas": Sample(1),
    "standbyPools[0].name": Sample("pool-b", _pooled, "a standby pool", "dev",
                                   also=lambda d: _model(d)["standby"].update(pool="pool-b")),
    "standbyPools[0].gpuPool": Sample("l40s-b", _pooled, "a standby pool", "dev", also=_second_pool),
    "standbyPools[0].instanceType": Sample("g6e.4xlarge", _pooled_two_types, "a standby pool of two types", "dev",
                                           also=lambda d: _model(d).update(instanceType="g6e.4xlarge")),
    "standbyPools[0].gpus": Sample(2, _pooled_four_gpus, "a standby pool on g6e.12xlarge", "dev",
                                   also=lambda d: _model(d).update(tensorParallelSize=2)),
    "standbyPools[0].spares": Sample(2, _pooled, "a standby pool", "dev"),
    "standbyPools[0].maxHosts": Sample(3, _pooled, "a standby pool", "dev"),
    "standbyPools[0].sleepLevel": Sample(2, _pooled, "a standby pool", "dev"),
    "standbyPools[0].sleepingResidueGiB": Sample(2.0, _pooled, "a standby pool", "dev"),
}

# Model-stack leaves a model stack refuses (with the reason and the fix), by key: what the render
# must refuse under the named key instead of reaching an object.
MODEL_STACK_REFUSED: dict[str, str] = {
    "model.standby.pool": "model.standby.pool",
    "model.standby.port": "model.standby.pool",
}


# Leaves that legitimately deploy nothing: read only by the CLI, the preflight or the render's
# report. Each must exist and still reach nothing (tests/stack/test_config_reach.py), so the
# list stays the short list of what it claims.
NO_REACH: dict[str, str] = {
    "gpuPools[0].hourlyPriceUsd": "the render's cost of the pool's nodes and models (warmstart/render.py)",
    "gpuPools[0].capacity.spotHourlyPriceUsd": "the render's cost of a spot node (warmstart/render.py)",
    "gpuPools[0].capacity.reservedNodes": "the render's cost and scale-out prediction: which launch falls back "
                                          "beyond the reservation (warmstart/render.py capacity_source_line)",
    "gpuPools[0].capacity.capacityBlock.endsAt": "the render's note of when the block's nodes are drained; the "
                                                 "engine handles a block's end itself, from EC2's own record of it "
                                                 "(https://karpenter.sh/docs/tasks/odcrs/)",
    "production": "read only by `warmstart drill`, which refuses `--apply` on a stack marked production "
                  "without `--confirm-production` (warmstart/drill/command.py); it deploys nothing",
    "network.allowS3ViaNat": "only lifts the config rule that refuses `s3GatewayEndpoint: false` "
                             "(warmstart/plan/aws.py); the endpoint's own key decides what is created",
}

# Leaves that reach nothing today because of code another change is rewriting: xfail(strict),
# so each flips to a failure the moment it is wired and its entry must go.
KNOWN_UNREACHED: dict[str, str] = {
    # None today: every leaf but NO_REACH's reaches a deployed object on some shipped stack.
}


def sample_for(key: str) -> Sample | None:
    if key in SAMPLES:
        return SAMPLES[key]
    for prefix in MODEL_PREFIXES:
        if key.startswith(prefix) and key.removeprefix(prefix) in MODEL_SAMPLES:
            return MODEL_SAMPLES[key.removeprefix(prefix)]
    return None


# Where a key is read, by the start of its path: the component Args it reaches through, and the
# plan function that decides from it. The longest matching prefix wins.
WIRING: dict[str, str] = {
    "": "components/stack.py (WarmstartStack), which maps the stack config onto each component's Args",
    "models[0].": "components/model_args.py (ModelEntryArgs, generated: `python -m tests.golden`), read by "
                  "ServedModel (components/served_model.py) through warmstart/plan/platform.py "
                  "(plan_on_platform) into the ModelPlan (warmstart/plan/model.py), and the manifest builder in "
                  "warmstart/manifests/ or the component (components/serving.py, routing.py, autoscaling.py, "
                  "standby.py, node_cache.py, identity.py) that turns it into objects",
    "model.": "components/model_stack.py (ModelStack) -> ModelEntryArgs (components/model_args.py) -> ServedModel, "
              "as for an environment's `models[]`",
    "platform": "components/model_stack.py (ModelStack: the StackReference and the PlatformArgs it reads)",
    "tags": "components/stack.py (stack_tags: the AWS provider's default tags and each component's `tags`)",
    "network.": "components/stack.py -> NetworkArgs (components/network.py, Network), planned by "
                "warmstart/plan/aws.py",
    "cluster.": "components/stack.py -> ClusterArgs (components/cluster.py, Cluster), planned by "
                "warmstart/plan/cluster.py",
    "gpuPools[0].": "components/stack.py -> ClusterArgs.gpu_pools (components/cluster.py, gpu_pools.py, "
                    "karpenter.py), planned by warmstart/plan/cluster.py",
    "modelBucket.": "components/stack.py -> ModelStorageArgs.model_bucket (components/storage.py), planned by "
                    "warmstart/plan/aws.py",
    "compileCacheBucket.": "components/stack.py -> ModelStorageArgs.compile_cache_bucket (components/storage.py)",
    "monitoring.": "components/stack.py -> MonitoringArgs.monitoring (components/monitoring.py, Monitoring; its "
                   "platform_monitoring is the platform's monitoring)",
    "imageCache.": "components/stack.py -> ClusterArgs.image_cache_account and the ServingPlatform's "
                   "docker_hub_credential_arn (components/platform.py)",
    "modelStacks.": "warmstart/plan/platform.py (plan_runs_autoscaling, platform_facts) read by components/stack.py",
    "loader.": "warmstart/plan/platform.py (platform_facts) -> PlatformArgs -> ServedModel (components/served_model.py)",
    "compileCache.": "warmstart/plan/platform.py (platform_facts) -> PlatformArgs -> ServedModel",
}


def wiring(key: str, model_stack: bool) -> str:
    best = max((p for p in WIRING if key.startswith(p) and (p != "tags" or key == "tags")), key=len)
    if best == "tags" and model_stack:
        return "components/model_stack.py (ModelStack: the AWS provider's default tags)"
    return WIRING[best]


# --------------------------------------------------------------------------------------
# The check


@dataclass
class Reach:
    """What setting one leaf did to its renders."""

    key: str
    tried: list[tuple[str, Any]] = field(default_factory=list)
    """(where, value) of each render: the stack and setup, and the leaf's value."""
    refused: list[tuple[str, Any, str]] = field(default_factory=list)
    """(where, value, error) of each value the stack refused."""
    changed: bool = False
    model_stack: bool = False

    def message(self) -> str:
        if not self.tried:
            why = "; ".join(f"{v!r} on {w}: {e}" for w, v, e in self.refused[:3])
            return (f"`{self.key}` has no valid sample for the config-reach check: its type and the shipped "
                    f"stacks give none{' (refused: ' + why + ')' if why else ''}; add one to SAMPLES (or "
                    f"MODEL_SAMPLES, with a setup where it needs a condition) in {THIS_FILE}")
        tried = "; ".join(f"{json.dumps(v, default=str)} on {w}" for w, v in self.tried)
        return (f"`{self.key}` changes no deployed object (cloud resource, provider or Kubernetes object) when set "
                f"to {tried}: a key that reaches nothing is a setting that silently does nothing. Wire it through "
                f"{wiring(self.key, self.model_stack)}; if it acts only under a condition, give it a Sample with a "
                f"setup in {THIS_FILE}; if it is read only by the CLI, the preflight or the render's report, add it "
                f"to NO_REACH there with the reason")


ENVIRONMENTS = ("staging", "dev", "prod")
"""Environment stacks a leaf is tried on, in this order (fastest render first): those that set
the leaf's sections; `prod` covers karpenter mode, reservations, autoscaling and standby."""


def _invalid(err: Exception) -> str:
    return " ".join(str(err).split())[:300]


class Renders:
    """Renders stack documents under Pulumi mocks in one folder, each baseline once. A model
    stack's platform is rendered once per folder (warmstart/render.py caches it)."""

    def __init__(self, workdir: Path, model_stack: bool = False):
        self.workdir = workdir
        self.model_stack = model_stack
        self.stacks = workdir / "stacks"
        self.stacks.mkdir(parents=True, exist_ok=True)
        self._baselines: dict[str, frozenset[str] | Exception] = {}
        self.count = 0

    def render(self, doc: Doc) -> frozenset[str]:
        self.count += 1
        name = "reach"
        doc = copy.deepcopy(doc)
        platform = doc.pop("platform", None)
        if platform is not None:
            # The platform's file under the name the model stack gives, or under a name of its
            # own where a setup changed it (a platform is rendered once per folder and name).
            text = yaml.safe_dump(platform)
            target = doc["config"][config.PLATFORM_KEY]
            path = self.stacks / f"Pulumi.{target}.yaml"
            if path.is_file() and path.read_text() != text:
                target = f"{target}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
                path = self.stacks / f"Pulumi.{target}.yaml"
                doc["config"][config.PLATFORM_KEY] = target
            path.write_text(text)
        (self.stacks / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump(doc))
        return deployed(render.run_program(self.stacks, name, program_dir=ROOT))

    def baseline(self, name: str, doc: Doc) -> frozenset[str] | Exception:
        if name not in self._baselines:
            try:
                self._baselines[name] = self.render(doc)
            except (ConfigError, ConfigErrors) as err:
                self._baselines[name] = err
        return self._baselines[name]


def _bases(leaf: Leaf, sample: Sample | None, model_stack: bool,
           only: tuple[str, ...] | None = None) -> Iterator[tuple[str, Doc]]:
    """(name, document) of each baseline the leaf is tried on: the shipped stacks that set its
    sections (or the sample's stack, or `only`), after the sample's setup."""
    stacks = (list(only) if only else [sample.stack] if sample and sample.stack else
              ["staging-llama-3-1-8b"] if model_stack else
              list(ENVIRONMENTS))
    for stack in stacks:
        doc = copy.deepcopy(load_stack_doc(stack))
        if model_stack:
            doc["platform"] = copy.deepcopy(load_stack_doc(doc["config"][config.PLATFORM_KEY]))
            # A shipped platform's pool limit fits its model stacks as they are; room for a sample
            # of more replicas or GPUs per replica.
            for pool in doc["platform"]["config"][f"{NS}:gpuPools"]:
                pool["maxGpus"] = 64
        name = stack
        if sample and sample.setup:
            try:
                sample.setup(doc)
            except (KeyError, IndexError, TypeError):
                continue  # the setup needs what this stack lacks (a model, a capacity section)
            name += f" with {sample.setup_name}"
        added = sets_sections(doc, leaf)
        if added is not None:
            yield name + "".join(f" with `{k}: {{}}`" for k in added), doc


def check(leaf: Leaf, renders: Renders, only: tuple[str, ...] | None = None, first: bool = False) -> Reach:
    """Whether some value of `leaf` changes what some baseline deploys (on the stacks `only`
    names, else on every shipped stack that sets its sections, until one does); `first`: after
    the first value a stack takes, reached or not."""
    sample = sample_for(leaf.key)
    result = Reach(leaf.key, model_stack=renders.model_stack)
    for name, doc in _bases(leaf, sample, renders.model_stack, only):
        current = current_value(doc, leaf)
        values = [sample.value] if sample and sample.value is not None else derived_values(leaf, _jsonable(current))
        base: frozenset[str] | Exception | None = None
        for value in values:
            changed = copy.deepcopy(doc)
            set_at(changed, leaf.path, value)
            if sample and sample.also:
                sample.also(changed)
            try:
                config_check(changed, renders)
            except (ConfigError, ConfigErrors) as err:
                result.refused.append((name, value, _invalid(err)))
                continue
            if base is None:
                base = renders.baseline(name, doc)
            if isinstance(base, Exception):
                result.refused.append((name, "(baseline)", _invalid(base)))
                break
            try:
                after = renders.render(changed)
            except (ConfigError, ConfigErrors) as err:
                result.refused.append((name, value, _invalid(err)))
                continue
            result.tried.append((name, value))
            if after != base:
                result.changed = True
            if result.changed or first:
                return result
    return result


def config_check(doc: Doc, renders: Renders) -> None:
    """The config rules a render checks first (fast: no program run), so a refused value costs
    no render. ConfigError(s) when the stack refuses `doc`."""
    raw = {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in doc["config"].items()}
    if renders.model_stack:
        config.model_stack_from_pulumi_config(raw)
    else:
        plan_stack(config.from_pulumi_config(raw), "reach")


def params(leaves: list[Leaf]) -> list:
    """pytest params: one case per leaf, named by its key; a key another change is wiring is xfail(strict)."""
    out = []
    for leaf in leaves:
        why = KNOWN_UNREACHED.get(leaf.key)
        marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
        out.append(pytest.param(leaf, id=leaf.key, marks=marks))
    return out


def assert_reaches(leaf: Leaf, renders: Renders) -> None:
    # A key that deploys nothing is rendered once (its first valid value), not on every stack.
    if leaf.key in MODEL_STACK_REFUSED:
        # A model stack cannot join its platform's standby pool (warmstart/plan/platform.py
        # plan_on_platform): every value is refused under the pool's key, none renders.
        result = check(leaf, renders, first=True)
        want = f"{NS}:{MODEL_STACK_REFUSED[leaf.key]}"
        assert not result.tried and result.refused, result.message()
        assert all(want in e for _, _, e in result.refused), result.refused
        return
    result = check(leaf, renders, first=leaf.key in NO_REACH)
    if leaf.key in NO_REACH:
        assert result.tried, result.message()
        assert not result.changed, (f"`{leaf.key}` is in NO_REACH ({THIS_FILE}) but now changes a deployed "
                                    f"object ({result.tried[-1]}): remove its entry")
    else:
        assert result.changed, result.message()


# --------------------------------------------------------------------------------------
# Throw-away fields


PROBE = "throwaway_probe"


def with_probe(model: type[BaseModel], field_name: str = PROBE) -> type[BaseModel]:
    """`model` plus a bool field that nothing reads."""
    return create_model(model.__name__, __base__=model,
                        **{field_name: (bool, Field(False, description="A throw-away key that reaches nothing."))})


def replace_field(model: type[BaseModel], name: str, annotation: Any) -> type[BaseModel]:
    """`model` with field `name` of another type (a nested model with a probe), its default kept."""
    info = model.model_fields[name]
    default = info.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        default = _model_of(annotation)()  # type: ignore[misc]
    return create_model(model.__name__, __base__=model, **{name: (annotation, Field(
        default, alias=info.alias, description=info.description or name))})
