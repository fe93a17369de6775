"""Writes components/model_args.py: one `models[]` entry of a stack as TypedDicts, generated from
`warmstart.config.ModelConfig` so that the entry has exactly one declaration (the pydantic model)
and the component's Args can never drift from it (as awsx generates its types from one schema).

Pulumi's schema inference (`pulumi.provider.experimental.analyzer`) reads a component's Args from
TypedDicts whose attribute docstrings sit in real source (it calls `inspect.getsource`), so the
types are written out as a module, not built at run time. `python -m tests.golden` rewrites it
(`write()`); tests/served_model/test_model_args.py fails while it is stale.

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
- a nested model is its own TypedDict `ModelEntry<Name>Args` (`<Name>`: the model's class name
  without a trailing `Tuning`, `Config` or `Source`), named apart from components/' other types,
  which the schema shares one namespace with.

Each key's docstring is the field's description (its attribute docstring), then "Default: ..."
where the default is a value (not None, which each description explains itself).
"""

from __future__ import annotations

import ast
import json
import textwrap
import typing
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from warmstart.config import ModelConfig

HERE = Path(__file__).resolve().parent
TARGET = HERE / "model_args.py"
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


class Unsupported(TypeError):
    """A field whose type has no Pulumi schema type yet: decide one here."""


def _strip(annotation: Any) -> Any:
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, UnionType)


def type_of(annotation: Any, default: Any, where: str, nested: list[type[BaseModel]],
            top: type[BaseModel]) -> tuple[str, list[str]]:
    """(the Args type, notes for the docstring) of one pydantic annotation. Nested models are
    appended to `nested`."""
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
        if not all(isinstance(v, str) for v in values):
            raise Unsupported(f"{where}: Literal {values!r} of non-strings")
        return "str", ["One of " + ", ".join(f"`{v}`" for v in values) + "."]
    if annotation in _SCALARS:
        return _SCALARS[annotation], []
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
        return args_name(annotation, top), []
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


def _class(model: type[BaseModel], nested: list[type[BaseModel]], top: type[BaseModel]) -> list[str]:
    doc = model.__doc__ or model.__name__
    if model is top:
        doc += (f" A stack's `models[]` entry (`{top.__module__}.{top.__name__}`), key for key; its "
                "validation and defaults are that model's.")
    out = [f"class {args_name(model, top)}(TypedDict):", *_docstring(doc, "    "), ""]
    for name, info in model.model_fields.items():
        where = f"{model.__name__}.{name}"
        expr, notes = type_of(info.annotation, info.default, where, nested, top)
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


def source(top: type[BaseModel] = ModelConfig) -> str:
    """components/model_args.py as generated from `top` (ModelConfig; a test passes another)."""
    classes: dict[type[BaseModel], list[str]] = {}
    order: list[type[BaseModel]] = []

    def visit(model: type[BaseModel]) -> None:
        nested: list[type[BaseModel]] = []
        classes[model] = _class(model, nested, top)
        for inner in nested:
            if inner not in classes:
                visit(inner)
        order.append(model)  # after its nested types: the module needs no forward references

    visit(top)
    names = [args_name(m, top) for m in order]
    clash = sorted(set(names) & existing_type_names())
    if clash:
        raise Unsupported(f"generated names {clash} are already types in components/ (Pulumi's schema has one "
                          "namespace); rename them in components/model_args_gen.py (args_name)")
    body = "\n\n\n".join("\n".join(classes[m]) for m in order)
    all_names = "".join(f'    "{n}",\n' for n in sorted(names))
    return f"{HEADER}\n\n{body}\n\n\n__all__ = [\n{all_names}]\n"


def existing_type_names() -> set[str]:
    """Class names defined in components/ other than the generated module."""
    names: set[str] = set()
    for path in sorted(HERE.glob("*.py")):
        if path == TARGET:
            continue
        tree = ast.parse(path.read_text())
        names |= {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    return names


def write() -> Path:
    """Rewrite components/model_args.py; returns its path."""
    TARGET.write_text(source())
    return TARGET


if __name__ == "__main__":
    print(f"wrote {write()}")
