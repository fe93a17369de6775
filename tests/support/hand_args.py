"""The check that keeps a hand-written Args TypedDict one with the pydantic model that validates
it (`PlatformArgs` with `warmstart/plan/platform_args.py`'s `PlatformArgsSpec`, nested types
included): the same keys, in the schema's camelCase, at every depth, and the same required ones.

`PlatformArgs` stays written by hand, not generated as `components/section_args.py` is: its
wired facts are `pulumi.Input[...]`, two of its facts are the schema's enum types (`ClusterMode`,
`NvmeCheckMode`), its docstrings are the schema's (the validator's fields are documented there),
and its nested types are shared by other components' Args (`ScraperPodsArgs`, `NonGpuPlacementArgs`).
So the check names the file to edit instead of a generator to run. It takes both sides as
parameters, so a test can hand it a model with a throw-away field and see it named.
"""

from __future__ import annotations

import inspect
import typing
from pathlib import Path

from pydantic import BaseModel

from components.model_args_gen import camel_case
from tests.support.model_entry import _models_in, _typeddicts_in

ROOT = Path(__file__).resolve().parents[2]


def _file(obj: type) -> str:
    """Where `obj` is declared, relative to the repository (a class made at run time: its base's)."""
    try:
        path = Path(inspect.getsourcefile(obj) or "")
    except TypeError:
        path = Path("")
    if not path.is_file():
        base = next((b for b in obj.__mro__[1:] if b is not BaseModel and issubclass(b, BaseModel)), None)
        return _file(base) if base is not None else obj.__module__
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def _hints(args: type) -> dict[str, typing.Any]:
    """A TypedDict's keys and types. `pulumi.Input` names `Output` by a forward reference that
    `get_type_hints` cannot resolve, and the components' modules annotate eagerly, so their
    `__annotations__` already hold the types."""
    try:
        return typing.get_type_hints(args, include_extras=True)
    except NameError:
        return dict(args.__annotations__)


def _key(model: type[BaseModel], name: str) -> str:
    """The camelCase key of a model's field, as a document spells it (its alias)."""
    info = model.model_fields[name]
    return info.alias or camel_case(name)


def hand_args_gaps(model: type[BaseModel], args: type, path: str = "",
                   skip: frozenset[str] = frozenset()) -> list[str]:
    """Where the pydantic `model` (recursively) and the hand-written TypedDict `args` differ: a
    field without a key, a key without a field, a nested model without a nested TypedDict, a field
    required in one and not the other. `skip`: fields of `model` that are no key of the Args (the
    exported document's own). Empty when they agree; each line names the file to edit."""
    gaps: list[str] = []
    hints = _hints(args)
    by_camel = {camel_case(k): k for k in hints}
    required = {camel_case(k) for k in getattr(args, "__required_keys__", ())}
    where = path or model.__name__
    edit = f"{args.__name__} ({_file(args)})"
    fields = {_key(model, n): n for n in model.model_fields if n not in skip}
    for camel, name in fields.items():
        key = f"{where}.{camel}"
        info = model.model_fields[name]
        if camel not in by_camel:
            gaps.append(f"{key} ({model.__name__} in {_file(model)}) has no key in {edit}: add `{name}` there, "
                        "with its docstring")
            continue
        if info.is_required() != (camel in required):
            gaps.append(f"{key} is {'required' if info.is_required() else 'optional'} in {model.__name__} but not "
                        f"in {edit}: make `{name}` {'a plain key' if info.is_required() else 'NotRequired'}")
        for inner in _models_in(info.annotation):
            typed = _typeddicts_in(hints[by_camel[camel]])
            if not typed:
                gaps.append(f"{key} is the model {inner.__name__} but {args.__name__}.{by_camel[camel]} is no "
                            f"TypedDict: declare one in {_file(args)}")
            else:
                gaps += hand_args_gaps(inner, typed[0], key)
    for camel, name in by_camel.items():
        if camel not in fields:
            gaps.append(f"{args.__name__}.{name} ({_file(args)}) is no field of {where} ({model.__name__} in "
                        f"{_file(model)}): add the field there (its validation), or remove the key")
    return gaps
