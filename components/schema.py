"""The component package's schema, inferred as `pulumi package add` infers it, and its reference.

`analyze()` runs Pulumi's own schema inference (`pulumi.provider.experimental.analyzer`) over
the hosted components; `reference()` renders the result as the Markdown in
components/README.md (`python -m components.schema > components/README.md`), which a test keeps
in sync.
"""

import hashlib
import json
import sys
from typing import Any

from pulumi.provider.experimental.analyzer import (
    AnalyzeResult,
    Analyzer,
    ComponentDefinition,
    PropertyDefinition,
    TypeDefinition,
)
from pulumi.provider.experimental.schema import generate_schema

from .__main__ import HOSTED, PACKAGE, version

_HEADER = """# warmstart components

Generated from the components' Args and docstrings by Pulumi's schema inference
(`python -m components.schema > components/README.md`; a test keeps it current). Names are the
schema's (camelCase, as TypeScript, Go or YAML programs write them); Python programs use the
snake_case keys of each `...Args` TypedDict. *plain* inputs are decided when the program runs
(they shape what is created); *input* values may come from other resources' outputs.
"""


def analyze() -> AnalyzeResult:
    """Pulumi's schema inference over every hosted component."""
    return Analyzer(PACKAGE).analyze(HOSTED)


def schema() -> dict[str, Any]:
    """The package schema `pulumi package add` generates SDKs from."""
    result = analyze()
    return generate_schema(PACKAGE, version(), None, result["component_definitions"], result["type_definitions"],
                           sorted(result["dependencies"], key=lambda d: f"{d.name}{d.version}")).to_json()


def _shape(value: Any) -> Any:
    """A schema node without its descriptions: the names, types, required lists, plain flags and
    enum values a program in another language is compiled against."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items() if not (k == "description" and isinstance(v, str))}
    if isinstance(value, list):
        return [_shape(v) for v in value]
    return value


def fingerprints(doc: dict[str, Any] | None = None) -> dict[str, str]:
    """One fingerprint per component and type of the package schema (`schema()`, or `doc`), by
    name (`ServedModel`, `PlatformArgs`): the first 16 hex digits of the SHA-256 of its shape.
    Descriptions are left out, so a docstring's rewording is no API change; a key added, removed,
    retyped, made required or plain, or an enum value changed is. components/schema.lock keeps
    them per CHANGELOG.md version."""
    doc = schema() if doc is None else doc
    out: dict[str, str] = {}
    for section in ("resources", "types"):
        for token, node in doc.get(section, {}).items():
            text = json.dumps(_shape(node), sort_keys=True, separators=(",", ":"))
            out[token.rsplit(":", 1)[-1]] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return dict(sorted(out.items()))


def _text(doc: str | None) -> str:
    return " ".join((doc or "").split()).replace("|", "\\|")


def _type(p: PropertyDefinition) -> str:
    if p.ref:
        name = p.ref.rsplit(":", 1)[-1] if p.ref.startswith("#/types/") else p.ref.rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})" if p.ref.startswith("#/types/") else name
    if p.items is not None:
        return f"list of {_type(p.items)}"
    if p.additional_properties is not None:
        return f"map of {_type(p.additional_properties)}"
    return p.type.value if p.type else "any"


def _table(props: dict[str, PropertyDefinition], inputs: bool) -> list[str]:
    head = "| name | type | required | kind | description |" if inputs else "| name | type | description |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for name, p in props.items():
        if inputs:
            kind = "plain" if p.plain else "input"
            lines.append(f"| `{name}` | {_type(p)} | {'no' if p.optional else 'yes'} | {kind} | {_text(p.description)} |")
        else:
            lines.append(f"| `{name}` | {_type(p)} | {_text(p.description)} |")
    return lines


def _component(c: ComponentDefinition) -> list[str]:
    return [f"## {c.name}", "", _text(c.description), "", f"Token `{PACKAGE}:index:{c.name}`.", "",
            "Inputs:", "", *_table(c.inputs, True), "", "Outputs:", "", *_table(c.outputs, False), ""]


def _type_section(t: TypeDefinition) -> list[str]:
    out = [f"### {t.name}", "", _text(t.description), ""]
    if t.enum:
        out += ["| value | description |", "| --- | --- |"]
        out += [f"| `{json.dumps(e.value)}` | {_text(e.description)} |" for e in t.enum]
    else:
        out += _table(t.properties, True)
    return out + [""]


def reference() -> str:
    """components/README.md."""
    result = analyze()
    lines = [_HEADER]
    for c in result["component_definitions"].values():
        lines += _component(c)
    lines += ["## Types", ""]
    for name in sorted(result["type_definitions"]):
        lines += _type_section(result["type_definitions"][name])
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    if "--fingerprints" in sys.argv:
        sys.stdout.write(json.dumps(fingerprints(), indent=2) + "\n")
    else:
        sys.stdout.write(json.dumps(schema(), indent=2) + "\n" if "--json" in sys.argv else reference())
