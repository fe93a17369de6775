"""The records the checks read, and the helpers every check shares.

A `Resource` is one resource as a policy sees it (type token, logical name, properties, and
the engine's property dependencies); `UNKNOWN` stands for a value not known yet during a
preview; a `Violation` is what a check reports. The helpers follow references between
resources, read IAM policy documents and Kubernetes quantities, and pick Kubernetes objects.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence


class _Unknown:
    """A value the engine does not know yet (preview of a resource that depends on others)."""

    _instance: "_Unknown | None" = None

    def __new__(cls) -> "_Unknown":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN: Any = _Unknown()


def is_unknown(value: Any) -> bool:
    return value is UNKNOWN


@dataclass(frozen=True)
class Resource:
    """One resource as a policy sees it: Pulumi type token, logical name, properties."""

    typ: str
    name: str
    props: Mapping[str, Any]
    urn: str = ""
    deps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Property name -> keys (URNs) of the resources that property was computed from."""

    @property
    def key(self) -> str:
        return self.urn or f"{self.typ}::{self.name}"

    def identities(self) -> set[str]:
        """The values other resources may reference this one by: id, ARN, name, bucket."""
        return {v for k in ("id", "arn", "name", "bucket") if isinstance(v := self.props.get(k), str)}

    def get(self, *path: str | int, default: Any = None) -> Any:
        """A nested property; `default` where a step is missing, UNKNOWN where one is unknown."""
        cur: Any = self.props
        for p in path:
            if is_unknown(cur):
                return UNKNOWN
            if isinstance(p, int):
                if not isinstance(cur, list) or p >= len(cur):
                    return default
                cur = cur[p]
            else:
                if not isinstance(cur, Mapping) or p not in cur:
                    return default
                cur = cur[p]
        return cur

    def label(self) -> str:
        """How a message names the resource: its Kubernetes name or physical name, and logical name."""
        meta = self.props.get("metadata")
        if isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
            ns = meta.get("namespace")
            return f"{self.props.get('kind', self.typ)} {ns + '/' if isinstance(ns, str) else ''}{meta['name']}"
        physical = next((v for k in ("bucket", "name") if isinstance(v := self.props.get(k), str)), None)
        kind = self.typ.rsplit(":", 1)[-1]
        return f"{kind} '{physical}' ({self.name})" if physical and physical != self.name else f"{kind} '{self.name}'"


@dataclass(frozen=True)
class Violation:
    policy: str
    resource: Resource
    message: str

    def __str__(self) -> str:
        return f"[{self.policy}] {self.message}"


def as_resources(items: Iterable[Any]) -> list[Resource]:
    """Resources from Resource, (typ, name, props) tuples, or objects with typ/name/inputs."""
    out = []
    for it in items:
        if isinstance(it, Resource):
            out.append(it)
        elif isinstance(it, tuple):
            out.append(Resource(*it))
        else:
            out.append(Resource(it.typ, it.name, it.inputs))
    return out


def refers(src: Resource, prop: str, target: Resource) -> bool | None:
    """Does `src.props[prop]` reference `target`? True, False, or None (not knowable yet)."""
    deps = src.deps.get(prop, ())
    if target.key in deps:
        return True
    value = src.props.get(prop)
    values = value if isinstance(value, list) else [value]
    ids = target.identities()
    if any(isinstance(v, str) and v in ids for v in values):
        return True
    # An unknown value came from other resources' outputs, and the engine lists every one of
    # them as a dependency of the property: with dependencies recorded, absence is an answer.
    return None if any(is_unknown(v) for v in values) and not deps else False


def related(resources: Sequence[Resource], types: Iterable[str], prop: str, target: Resource
            ) -> tuple[list[Resource], bool]:
    """Resources of `types` whose `prop` references `target`, and whether some might (unknown)."""
    types = set(types)
    found, maybe = [], False
    for r in resources:
        if r.typ in types:
            hit = refers(r, prop, target)
            if hit:
                found.append(r)
            elif hit is None:
                maybe = True
    return found, maybe


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def policy_document(value: Any) -> dict[str, Any] | None:
    """An IAM policy as data (JSON string or object); None when unknown or not parseable."""
    if is_unknown(value) or value is None:
        return None
    if isinstance(value, Mapping):
        return dict(value)
    try:
        doc = json.loads(value)
    except (TypeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def statements(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for s in as_list(doc.get("Statement")) if isinstance(s, Mapping)]


def iam_match(pattern: str, value: str, case_sensitive: bool = True) -> bool:
    """IAM wildcard matching: `*` any run, `?` one character, nothing else special."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, value, 0 if case_sensitive else re.IGNORECASE) is not None


def conditions(stmt: Mapping[str, Any], *operators: str) -> dict[str, Any]:
    """Condition keys (lower-cased; IAM condition keys are case-insensitive) under `operators`."""
    cond = stmt.get("Condition")
    out: dict[str, Any] = {}
    if not isinstance(cond, Mapping):
        return out
    wanted = {o.lower() for o in operators}
    for op, block in cond.items():
        if op.lower() in wanted and isinstance(block, Mapping):
            for k, v in block.items():
                out[k.lower()] = v
    return out


_QUANTITY = re.compile(r"^([0-9.]+(?:[eE][-+]?[0-9]+)?)([KMGTPE]i?|k|m)?$")
_SUFFIX = {None: 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60, "m": 1e-3}


def quantity_bytes(q: Any) -> float | None:
    """A Kubernetes quantity ("80Gi", "500G", 1000) in bytes; None if unparseable."""
    if isinstance(q, (int, float)) and not isinstance(q, bool):
        return float(q)
    if not isinstance(q, str):
        return None
    m = _QUANTITY.match(q.strip())
    return float(m.group(1)) * _SUFFIX[m.group(2)] if m else None


def k8s(resources: Sequence[Resource], kind: str, group: str | None = None) -> list[Resource]:
    """Kubernetes objects of a kind (and API group), whatever type token they came in as."""
    out = []
    for r in resources:
        if not r.typ.startswith("kubernetes:") or r.props.get("kind") != kind:
            continue
        api = r.props.get("apiVersion")
        if group is None or (isinstance(api, str) and api.rsplit("/", 1)[0] == group):
            out.append(r)
    return out


# ARN partitions: a pattern in any of them is compared as if it were in `aws`.
PARTITIONS = ("aws", "aws-cn", "aws-us-gov")


def _any_partition(arn_pattern: str) -> str:
    for p in PARTITIONS:
        if arn_pattern.startswith(f"arn:{p}:"):
            return "arn:aws:" + arn_pattern[len(f"arn:{p}:"):]
    return arn_pattern
