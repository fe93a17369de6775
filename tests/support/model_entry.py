"""The check that keeps a `models[]` entry's declarations one: every field of `ModelConfig` is a
key of the generated `ModelEntryArgs` (and back). (That every key changes what is deployed is
tests/support/config_reach.py's.)

It takes the model as a parameter, so a test can hand it a model with a throw-away field and
see it name it (tests/served_model/test_throwaway_field.py).
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

from components.model_args_gen import camel_case

GENERATED = "components/model_args.py"
REFRESH = "python -m tests.golden"
MODELS_KEY = "warmstart:models"
THIS_FILE = "tests/support/model_entry.py"

# --------------------------------------------------------------------------------------
# ModelConfig <-> ModelEntryArgs


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _typeddicts_in(annotation: Any) -> list[type]:
    if typing.is_typeddict(annotation):
        return [annotation]
    return [t for arg in typing.get_args(annotation) for t in _typeddicts_in(arg)]


def _generated_file(args: type) -> str:
    """The generated module that declares `args` (components/model_args.py, section_args.py)."""
    return f"components/{args.__module__.rsplit('.', 1)[-1]}.py" if args.__module__.startswith("components.") \
        else GENERATED


def args_gaps(model: type[BaseModel], args: type, path: str = "") -> list[str]:
    """Where `model`'s fields (recursively) and the TypedDict `args` differ: a field without a
    key, a key without a field, a nested model without a nested TypedDict, a field required in
    one and not the other. Empty when they agree."""
    gaps: list[str] = []
    hints = typing.get_type_hints(args, include_extras=True)
    required = set(getattr(args, "__required_keys__", ()))
    where = path or model.__name__
    generated = _generated_file(args)
    for name, info in model.model_fields.items():
        key = f"{where}.{name}"
        if name not in hints:
            gaps.append(f"{key} (`{camel_case(name)}`) is missing from {generated} ({args.__name__}); "
                        f"regenerate it with `{REFRESH}`")
            continue
        if info.is_required() != (name in required):
            gaps.append(f"{key} is {'required' if info.is_required() else 'optional'} in {model.__name__} but not "
                        f"in {generated} ({args.__name__}.{name}); regenerate it with `{REFRESH}`")
        for inner in _models_in(info.annotation):
            typed = _typeddicts_in(hints[name])
            if not typed:
                gaps.append(f"{key} is the model {inner.__name__} but {args.__name__}.{name} no TypedDict; "
                            f"regenerate {generated} with `{REFRESH}`")
            else:
                gaps += args_gaps(inner, typed[0], key)
    for name in hints:
        if name not in model.model_fields:
            gaps.append(f"{args.__name__}.{name} in {generated} is no field of {where} ({model.__name__}); "
                        f"regenerate it with `{REFRESH}`")
    return gaps
