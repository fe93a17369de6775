"""The stack config reference, generated from the pydantic models' field docs."""

from __future__ import annotations

import json
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .config import NAMESPACE, StackConfig


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation) if a is not type(None))
    if origin is typing.Literal:
        return " or ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin is list:
        return f"list of {_type_name(typing.get_args(annotation)[0])}"
    if origin is dict:
        return "map of string"
    if isinstance(annotation, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__)
    return str(annotation)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    d = info.default if info.default is not PydanticUndefined else info.default_factory()
    if isinstance(d, BaseModel):
        return "see below"
    if d is None:
        return "derived"
    return f"`{json.dumps(d)}`" if isinstance(d, (list, dict)) else f"`{d}`"


def config_reference() -> str:
    """Markdown tables of every key, one per object, in declaration order."""
    out: list[str] = []
    seen: set[type[BaseModel]] = set()
    queue: list[tuple[str, type[BaseModel]]] = [(f"{NAMESPACE}:<key>", StackConfig)]
    while queue:
        path, model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        out.append(f"#### `{path}` ({model.__name__})\n")
        out.append(" ".join((model.__doc__ or "").split()) + "\n")
        out.append("| key | type | default | description |\n| --- | --- | --- | --- |")
        for name, info in model.model_fields.items():
            key = info.alias or name
            desc = " ".join((info.description or "").split())
            out.append(f"| `{key}` | {_type_name(info.annotation)} | {_default(info)} | {desc} |")
            for sub in _models_in(info.annotation):
                queue.append((f"{path.replace('<key>', '')}{key}" if path.endswith("<key>") else f"{path}.{key}", sub))
        out.append("")
    return "\n".join(out)
