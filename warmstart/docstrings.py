"""Pydantic field descriptions from attribute docstrings, read in one pass over a module.

pydantic's own `use_attribute_docstrings` finds each model's source, on Python < 3.13, by walking
the interpreter's frames and calling `inspect.getmodule` on each, then tokenises the class again
(pydantic/_internal/_docs_extraction.py `_extract_source_from_frame`): about half of
`import warmstart.config`, a tenth of a `warmstart render`. `describe_models` parses the module
once and applies pydantic's rule (`DocstringVisitor`, `_fields._update_fields_from_docstrings`):
a string statement right after an annotated assignment in a class body documents that field,
`inspect.cleandoc`-ed, and a `Field(description=...)` wins. Descriptions are read by the config
reference, the generated component Args and the tests; validation never reads them, so filling
them in after the models are built changes no validated value (only a `model_json_schema()`,
which warmstart never calls, would lack them). tests/stack/test_render.py checks the result
against pydantic's extractor for every model.
"""

from __future__ import annotations

import ast
import inspect
import sys

from pydantic import BaseModel


def _class_docs(tree: ast.Module) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs: dict[str, str] = {}
        target: str | None = None
        previous: ast.stmt | None = None
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                target = stmt.target.id
            elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                  and isinstance(stmt.value.value, str) and isinstance(previous, ast.AnnAssign)):
                if target:
                    docs[target] = inspect.cleandoc(stmt.value.value)
                target = None
            previous = stmt
        out[node.name] = docs
    return out


def describe_models(module_name: str) -> None:
    """Give every field of the module's pydantic models, inherited ones included, the docstring
    of the class that declares it, unless the field has a description already."""
    module = sys.modules[module_name]
    with open(module.__file__, encoding="utf-8") as f:  # type: ignore[arg-type]
        docs = _class_docs(ast.parse(f.read()))
    for cls in vars(module).values():
        if not (isinstance(cls, type) and issubclass(cls, BaseModel) and cls.__module__ == module_name):
            continue
        for name, info in cls.model_fields.items():
            if info.description is not None:
                continue
            # The class whose own body declares the field: pydantic reads that class's docs
            # (an inherited field keeps its parent's description; a redeclared one does not).
            owner = next((k for k in cls.__mro__ if name in vars(k).get("__annotations__", {})), None)
            if owner is not None and owner.__module__ == module_name:
                doc = docs.get(owner.__name__, {}).get(name)
                if doc is not None:
                    info.description = doc
