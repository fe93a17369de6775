"""Writes the components' Args that are parts of the stack config, as TypedDicts generated from
`warmstart.config`'s pydantic models, so that each has exactly one declaration (the pydantic
model) and no component's Args can drift from it (as awsx generates its types from one schema):

- components/model_args.py: one `models[]` entry (`ModelConfig`), as `ModelEntry*Args`, which
  ServedModel takes;
- components/section_args.py: the platform sections (`network`, `cluster`, `gpuPools[]`,
  `modelBucket`, `compileCacheBucket`, `monitoring`), as `*SectionArgs`, which Network, Cluster,
  ModelStorage and Monitoring take nested beside their wired inputs (`components.sections` reads
  one back).

Pulumi's schema inference (`pulumi.provider.experimental.analyzer`) reads a component's Args from
TypedDicts whose attribute docstrings sit in real source (it calls `inspect.getsource`), so the
types are written out as modules, not built at run time. `python -m tests.golden` rewrites them
(`write()`); tests/served_model/test_model_args.py and tests/stack/test_section_args.py fail while
one is stale.

How a pydantic field becomes a key:

- the key is the field's *name* (snake_case: Pulumi's schema camelCases it), so `weights_import`
  stays `weights_import` (`weightsImport` in the schema, `import` in a stack file) and
  `weights_gib` is `weightsGib` in the schema (`weightsGiB` in a stack file); the docstring says
  so where the two spellings differ;
- a field without a default is a plain key, one with a default (None included) `NotRequired`;
- `X | None` is `X` (omitting the key is None);
- `Literal["a", "b"]` is `str` whose docstring lists the allowed values: `ModelConfig` validates
  them (`components.model_entry.model_config`), and an Enum would add a schema type per literal
  whose values pydantic already owns;
- a union of a `Literal` holding just the field's default with one other type
  (`tensor_parallel_size: Literal["auto"] | int = "auto"`) is that other type, documented "omit
  the key for `auto`": Pulumi's schema has no unions (the analyzer refuses them), and omitting
  the key is how every language, YAML included, gets the default. A Python caller may still pass
  `"auto"`, which `ModelConfig` accepts. Any other union is an error here, to be decided when it
  appears;
- `Literal[1, 3, ...]` (integers) is `int` whose docstring lists the allowed values, the same way;
- a `datetime` is `str` (ISO 8601), which the pydantic model parses;
- a nested model is its own TypedDict, named apart from components/' other types, which the
  schema shares one namespace with: `ModelEntry<Name>Args` in model_args.py (`<Name>`: the
  model's class name without a trailing `Tuning`, `Config` or `Source`), `<Name>SectionArgs` in
  section_args.py (`<Name>`: without a trailing `Config`).

Each key's docstring is the field's description (its attribute docstring), then "Default: ..."
where the default is a value (not None, which each description explains itself).
"""

from __future__ import annotations

import ast
import json
import textwrap
import typing
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from warmstart.config import (ClusterConfig, CompileCacheBucketConfig, GpuPool, ModelBucketConfig, ModelConfig,
                              MonitoringConfig, NetworkConfig, StackConfig)

HERE = Path(__file__).resolve().parent
TARGET = HERE / "model_args.py"
SECTIONS_TARGET = HERE / "section_args.py"
# The stack config's sections a platform component takes nested (each with the models nested in it).
SECTIONS: tuple[type[BaseModel], ...] = (NetworkConfig, ClusterConfig, GpuPool, ModelBucketConfig,
                                         CompileCacheBucketConfig, MonitoringConfig)
TOP = "ModelEntryArgs"
_SUFFIXES = ("Tuning", "Config", "Source")
_SCALARS = {str: "str", int: "int", float: "float", bool: "bool"}
WIDTH = 100

HEADER = '''\
# Generated from warmstart.config.ModelConfig by components/model_args_gen.py: do not edit.
# Regenerate with `python -m tests.golden` (tests/served_model/test_model_args.py fails while stale).
"""One `models[]` entry of a stack as Args: every field of `warmstart.config.ModelConfig`, key for
key, for the components that take a model entry (validate one with
`components.model_entry.model_config`)."""

from typing import NotRequired, TypedDict
'''

SECTIONS_HEADER = '''\
# Generated from warmstart.config's platform sections by components/model_args_gen.py: do not edit.
# Regenerate with `python -m tests.golden` (tests/stack/test_section_args.py fails while stale).
"""The platform sections of a stack config as Args: every field of each of
`warmstart.config.NetworkConfig`, `ClusterConfig`, `GpuPool`, `ModelBucketConfig`,
`CompileCacheBucketConfig` and `MonitoringConfig`, key for key, for the components that take a
section nested (Network, Cluster, ModelStorage, Monitoring; `components.sections.section_config`
validates one)."""

from typing import NotRequired, TypedDict
'''


def camel_case(name: str) -> str:
    """The schema's name of a key, as Pulumi's analyzer derives it."""
    from pulumi.provider.experimental.util import camel_case as pulumi_camel_case

    return pulumi_camel_case(name)


def args_name(model: type[BaseModel], top: type[BaseModel] = ModelConfig) -> str:
    """`ModelEntryArgs` for the entry itself, `ModelEntry<Name>Args` for a model nested in it."""
    if model is top:
        return TOP
    name = model.__name__
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name != suffix:
            name = name.removesuffix(suffix)
            break
    return f"ModelEntry{name}Args"


def section_name(model: type[BaseModel]) -> str:
    """`<Name>SectionArgs` of a platform section or a model nested in one (`NetworkConfig`:
    `NetworkSectionArgs`, `GpuPool`: `GpuPoolSectionArgs`)."""
    return f"{model.__name__.removesuffix('Config')}SectionArgs"


def stack_key(model: type[BaseModel]) -> str | None:
    """The stack file's key of a section (`network`, `gpuPools[]`), None for a nested model."""
    for name, info in StackConfig.model_fields.items():
        if model in _models_in(info.annotation):
            list_of = typing.get_origin(_strip(info.annotation)) is list
            return (info.alias or name) + ("[]" if list_of else "")
    return None


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    annotation = _strip(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


@dataclass(frozen=True)
class Target:
    """One generated module: its path, its first lines, the models it declares (each with the
    models nested in it), how a model's TypedDict is named and what a root's docstring adds."""

    path: Path
    header: str
    roots: tuple[type[BaseModel], ...]
    name: Callable[[type[BaseModel]], str]
    root_doc: Callable[[type[BaseModel]], str]


def model_entry_target(top: type[BaseModel] = ModelConfig) -> Target:
    """components/model_args.py, from `top` (ModelConfig; a test passes another)."""
    return Target(TARGET, HEADER, (top,), lambda m: args_name(m, top),
                  lambda m: (f" A stack's `models[]` entry (`{m.__module__}.{m.__name__}`), key for key; its "
                             "validation and defaults are that model's."))


def sections_target() -> Target:
    """components/section_args.py, from the platform sections."""
    return Target(SECTIONS_TARGET, SECTIONS_HEADER, SECTIONS, section_name,
                  lambda m: (f" The stack's `{stack_key(m)}` section (`{m.__module__}.{m.__name__}`), key for key; "
                             "its validation and defaults are that model's."))


def targets() -> tuple[Target, ...]:
    """Every generated module."""
    return (model_entry_target(), sections_target())


def _namer(top: type[BaseModel] | Target) -> Callable[[type[BaseModel]], str]:
    return top.name if isinstance(top, Target) else (lambda m: args_name(m, top))


class Unsupported(TypeError):
    """A field whose type has no Pulumi schema type yet: decide one here."""


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, UnionType)


def type_of(annotation: Any, default: Any, where: str, nested: list[type[BaseModel]],
            top: type[BaseModel] | Target) -> tuple[str, list[str]]:
    """(the Args type, notes for the docstring) of one pydantic annotation. Nested models are
    appended to `nested`; `top`: the generated module (or the model whose entry it declares)."""
    annotation = _strip(annotation)
    if _is_union(annotation):
        members = [_strip(a) for a in typing.get_args(annotation) if a is not NoneType]
        if len(members) == 1:
            return type_of(members[0], default, where, nested, top)
        literals = [m for m in members if typing.get_origin(m) is Literal]
        others = [m for m in members if typing.get_origin(m) is not Literal]
        if len(literals) == 1 and len(others) == 1 and list(typing.get_args(literals[0])) == [default]:
            expr, notes = type_of(others[0], None, where, nested, top)
            return expr, [*notes, f"Omit the key for `{default}` (the schema has no unions)."]
        raise Unsupported(f"{where}: union {annotation!r} has no Pulumi schema type; decide one in "
                          f"components/model_args_gen.py (see its docstring)")
    if typing.get_origin(annotation) is Literal:
        values = typing.get_args(annotation)
        for kind in (str, int):
            if all(type(v) is kind for v in values):
                return _SCALARS[kind], ["One of " + ", ".join(f"`{v}`" for v in values) + "."]
        raise Unsupported(f"{where}: Literal {values!r} is neither all strings nor all integers")
    if annotation in _SCALARS:
        return _SCALARS[annotation], []
    if annotation is datetime:
        return "str", ["An ISO 8601 date and time."]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list and len(args) == 1:
        inner, notes = type_of(args[0], None, where, nested, top)
        return f"list[{inner}]", notes
    if origin is dict and len(args) == 2 and _strip(args[0]) is str:
        inner, notes = type_of(args[1], None, where, nested, top)
        return f"dict[str, {inner}]", notes
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation not in nested:
            nested.append(annotation)
        return _namer(top)(annotation), []
    raise Unsupported(f"{where}: type {annotation!r} has no Pulumi schema type; add it to "
                      "components/model_args_gen.py")


def default_text(info: FieldInfo) -> str | None:
    """'Default: ...' of a field whose default is a value; None for none or None."""
    default = info.get_default(call_default_factory=True) if info.default_factory else info.default
    if default is PydanticUndefined or default is None:
        return None
    if isinstance(default, BaseModel):
        if default == type(default)():
            return "Default: every key at its default."
        return f"Default: `{json.dumps(default.model_dump(mode='json', by_alias=False))}`."
    if isinstance(default, str):
        return f"Default: `{default}`."
    return f"Default: `{json.dumps(default)}`."


def _docstring(text: str, indent: str) -> list[str]:
    text = " ".join(text.split()).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    lines = textwrap.wrap(text, WIDTH - len(indent) - 3, break_long_words=False, break_on_hyphens=False)
    lines[0] = '"""' + lines[0]
    lines[-1] += '"""'
    return [indent + line for line in lines]


def _class(model: type[BaseModel], nested: list[type[BaseModel]], target: Target) -> list[str]:
    doc = model.__doc__ or model.__name__
    if model in target.roots:
        doc += target.root_doc(model)
    out = [f"class {target.name(model)}(TypedDict):", *_docstring(doc, "    "), ""]
    for name, info in model.model_fields.items():
        where = f"{model.__name__}.{name}"
        expr, notes = type_of(info.annotation, info.default, where, nested, target)
        key = info.alias or name
        if key != camel_case(name):
            notes.append(f"In a stack file the key is `{key}`.")
        default = default_text(info)
        parts = [info.description or "", *notes, *([default] if default else [])]
        if not parts[0]:
            raise Unsupported(f"{where}: no description; give the field an attribute docstring")
        out.append(f"    {name}: {expr if info.is_required() else f'NotRequired[{expr}]'}")
        out += _docstring(" ".join(parts), "    ")
    return out


def source(top: type[BaseModel] | Target = ModelConfig) -> str:
    """A generated module's text: components/model_args.py as generated from `top` (ModelConfig;
    a test passes another), or the module of the Target `top`."""
    target = top if isinstance(top, Target) else model_entry_target(top)
    classes: dict[type[BaseModel], list[str]] = {}
    order: list[type[BaseModel]] = []

    def visit(model: type[BaseModel]) -> None:
        nested: list[type[BaseModel]] = []
        classes[model] = _class(model, nested, target)
        for inner in nested:
            if inner not in classes:
                visit(inner)
        order.append(model)  # after its nested types: the module needs no forward references

    for root in target.roots:
        if root not in classes:
            visit(root)
    names = [target.name(m) for m in order]
    clash = sorted(set(names) & existing_type_names())
    if clash:
        raise Unsupported(f"generated names {clash} are already types in components/ (Pulumi's schema has one "
                          "namespace); rename them in components/model_args_gen.py (args_name, section_name)")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise Unsupported(f"two models would both be {twice}; rename one in components/model_args_gen.py")
    body = "\n\n\n".join("\n".join(classes[m]) for m in order)
    all_names = "".join(f'    "{n}",\n' for n in sorted(names))
    return f"{target.header}\n\n{body}\n\n\n__all__ = [\n{all_names}]\n"


def existing_type_names() -> set[str]:
    """Class names defined in components/ other than in the generated modules."""
    generated = {TARGET, SECTIONS_TARGET}
    names: set[str] = set()
    for path in sorted(HERE.glob("*.py")):
        if path in generated:
            continue
        tree = ast.parse(path.read_text())
        names |= {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    return names


def write() -> list[Path]:
    """Rewrite every generated module (components/model_args.py, components/section_args.py);
    returns their paths."""
    for target in targets():
        target.path.write_text(source(target))
    return [target.path for target in targets()]


if __name__ == "__main__":
    for path in write():
        print(f"wrote {path}")
