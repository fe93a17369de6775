"""Hypothesis strategies shaped like the config's own constraints (DNS labels; prefix <= 20,
model <= 40)."""

from __future__ import annotations

import re
import types
import typing

from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from warmstart.config import DNS_LABEL


def dns_label(max_size: int) -> st.SearchStrategy[str]:
    return st.from_regex(re.compile(DNS_LABEL[:-1] + r"\Z"), fullmatch=True).filter(lambda s: len(s) <= max_size)


prefixes = dns_label(20)
models = dns_label(40)


def _unwrap(annotation):
    """The annotation without `Annotated` and `| None`, and the constraints `Annotated` carried."""
    metadata: list = []
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation, *extra = typing.get_args(annotation)
            for e in extra:
                metadata += list(e.metadata) if isinstance(e, FieldInfo) else [e]
            continue
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) == 1:
                annotation = members[0]
                continue
        return annotation, metadata


def _bound(metadata: list, *names: str):
    return next((getattr(m, n) for m in metadata for n in names if getattr(m, n, None) is not None), None)


def _of_type(annotation, metadata: list, path: str, overrides: dict) -> st.SearchStrategy:
    annotation, extra = _unwrap(annotation)
    metadata = [*metadata, *extra]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return st.sampled_from(typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return st.one_of([_of_type(a, metadata, path, overrides) for a in typing.get_args(annotation)
                          if a is not type(None)])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return config_entries(annotation, overrides, f"{path}.")
    if origin is list:
        return st.lists(_of_type(typing.get_args(annotation)[0], [], path, overrides),
                        min_size=_bound(metadata, "min_length") or 0, max_size=max(2, _bound(metadata, "min_length") or 0))
    if origin is dict:
        return st.dictionaries(st.from_regex(r"[a-z]{1,8}", fullmatch=True), st.from_regex(r"[a-z]{0,8}", fullmatch=True),
                               min_size=_bound(metadata, "min_length") or 0, max_size=2)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        lo = _bound(metadata, "ge")
        lo = lo if lo is not None else (_bound(metadata, "gt") + 1 if _bound(metadata, "gt") is not None else 0)
        hi = _bound(metadata, "le")
        return st.integers(lo, min(hi, lo + 64) if hi is not None else lo + 64)
    if annotation is float:
        lo, hi = _bound(metadata, "ge", "gt"), _bound(metadata, "le", "lt")
        return st.floats(lo if lo is not None else 0.0, hi if hi is not None else (lo or 0.0) + 64,
                         exclude_min=_bound(metadata, "gt") is not None, allow_nan=False, allow_infinity=False)
    if annotation is str:
        pattern = _bound(metadata, "pattern")
        return st.from_regex(pattern, fullmatch=True) if pattern else st.from_regex(r"[a-z][a-z0-9-]{0,11}", fullmatch=True)
    raise TypeError(f"no strategy for {path} ({annotation!r}): give one in the overrides")


def config_entries(model, overrides: dict[str, st.SearchStrategy] | None = None, prefix: str = "",
                   always: frozenset[str] = frozenset()) -> st.SearchStrategy:
    """Mappings of `model` (a config model) in a stack file's spelling, one key per field, drawn
    from the field's type and bounds: the required keys always, the others sometimes. A new field
    of the model is drawn without an edit; `overrides` (by key path, `routing.policy`) replace a
    key's strategy where the config's cross-field rules would refuse most draws; `always` names
    optional keys drawn every time (a key another key's rule requires)."""
    overrides = overrides or {}
    required, optional = {}, {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        path = f"{prefix}{key}"
        strategy = overrides[path] if path in overrides else _of_type(info.annotation, list(info.metadata), path, overrides)
        (required if info.is_required() or path in always else optional)[key] = strategy
    return st.fixed_dictionaries(required, optional=optional)


def key_paths(model, prefix: str = "") -> set[str]:
    """Every key path of a config model (`routing`, `routing.policy`), for checking overrides."""
    out = set()
    for name, info in model.model_fields.items():
        path = f"{prefix}{info.alias or name}"
        out.add(path)
        inner, _ = _unwrap(info.annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            out |= key_paths(inner, f"{path}.")
    return out
