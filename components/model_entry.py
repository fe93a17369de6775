"""A `models[]` entry given as Args (`ModelEntryArgs`, generated from `ModelConfig`) back into
the `ModelConfig` it declares (or, for a model without a platform, the `ModelSpec` and pool
it declares), with the stack file's validation and errors."""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any

from pydantic import BaseModel

from warmstart.config import ModelConfig, ModelSpec, parse_spec
from warmstart.errors import ConfigError, ConfigErrors

from .model_args import ModelEntryArgs
from .model_args_gen import camel_case

__all__ = ["ModelEntryArgs", "model_config", "model_spec"]


def _plain(value: Any) -> Any:
    """Args as pydantic reads them: enum members become their values, unset (None) keys go."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _schema_key(model: type[BaseModel], path: str) -> str:
    """A key path as `parse_spec` writes it (the stack file's keys: `import.huggingFace`) in the
    schema's names (`weightsImport.huggingFace`), which is what a component's caller wrote."""
    out: list[str] = []
    holder: type[BaseModel] | None = model
    for part in re.split(r"(\[\d+\])|\.", path):
        if not part:
            continue
        if part.startswith("["):
            out[-1:] = [(out[-1] if out else "") + part]
            continue
        found = next(((n, f) for n, f in holder.model_fields.items() if part in (n, f.alias)), None) \
            if holder else None
        if found is None:
            out.append(part)
            holder = None
            continue
        name, info = found
        out.append(camel_case(name))
        inner = _models_in(info.annotation)
        holder = inner[0] if inner else None
    return ".".join(out)


def _parse(model: type[ModelSpec], values: Mapping[str, Any], key: str) -> Any:
    prefix = f"{key}."
    try:
        return parse_spec(model, _plain(dict(values)), prefix)
    except ConfigErrors as err:
        raise ConfigErrors([
            ConfigError(prefix + _schema_key(model, e.key.removeprefix(prefix)) if e.key.startswith(prefix)
                        else e.key, e.rule, e.fix, e.value)
            for e in err.errors]) from None


def model_config(entry: ModelEntryArgs | Mapping[str, Any], key: str) -> ModelConfig:
    """The `ModelConfig` of one model entry given as Args (snake_case keys, enum members or
    values), validated as a stack file's `models[]` entry is. ConfigErrors keyed
    `<key>.<camelKey>` in the schema's names (`<key>.weightsImport.huggingFace.repo`)."""
    return _parse(ModelConfig, entry, key)


def model_spec(entry: ModelEntryArgs | Mapping[str, Any], key: str) -> tuple[ModelSpec, str | None]:
    """The `ModelSpec` and `pool` of one model entry given as Args, for a model without a
    platform (the VllmModel component): every key but `pool` is validated as the entry's
    `ModelConfig` validates it, except `source`, which must be `s3://bucket/prefix` in full
    (no model bucket resolves a key prefix); `pool` (a NodePool name) may be left out.
    ConfigErrors keyed as `model_config`'s."""
    values = dict(entry)
    pool = values.pop("pool", None)
    if pool is not None and not (isinstance(pool, str) and pool):
        raise ConfigError(f"{key}.pool", "must be the name of the NodePool the pods land on",
                          "give a NodePool name, e.g. gpu-l40s, or leave pool out for any node of instanceType",
                          pool)
    return _parse(ModelSpec, values, key), pool
