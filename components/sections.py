"""A platform section given as Args (a `*SectionArgs` of components/section_args.py, generated
from `warmstart.config`) back into the config model it declares, with the stack file's validation
and defaults, and errors keyed in the schema's names.

Network, Cluster and ModelStorage each take their section nested (`NetworkArgs.network`,
`ClusterArgs.cluster`, `ClusterArgs.gpuPools[]`, `ModelStorageArgs.modelBucket`, ...) beside
their wired inputs, and read it back here; the warmstart stack passes each section of its config
as `section_entry(section)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import pulumi
from pydantic import BaseModel

from warmstart.config import parse_spec
from warmstart.errors import ConfigError, ConfigErrors

from .model_args_gen import camel_case
from .model_entry import _plain, _schema_key

_Section = TypeVar("_Section", bound=BaseModel)


def section_entry(section: BaseModel) -> dict[str, Any]:
    """A config section as a component's nested Args: snake_case keys (the TypedDicts'), JSON
    values (a `datetime` as its ISO 8601 text, as the Args declare it), only the keys the stack
    set, so a default stays the config model's."""
    return section.model_dump(mode="json", exclude_unset=True)


def section_config(model: type[_Section], entry: Mapping[str, Any], key: str) -> _Section:
    """The config model `model` of one section given as Args (snake_case keys, enum members or
    values; an unset (None) key is left out), validated as the stack file's section is.
    ConfigErrors keyed `<key>.<camelKey>` in the schema's names (`<key>.ephemeralStorageGib`)."""
    prefix = f"{key}."
    try:
        return parse_spec(model, _plain(dict(entry)), prefix)
    except ConfigErrors as err:
        raise ConfigErrors([
            ConfigError(prefix + _schema_key(model, e.key.removeprefix(prefix)) if e.key.startswith(prefix)
                        else e.key, e.rule, e.fix, e.value)
            for e in err.errors]) from None


def nested_section(model: type[_Section], args: Mapping[str, Any], field: str, key: str,
                   resource: pulumi.Resource | None = None) -> tuple[_Section, str]:
    """The section `args[field]` of a component's Args (`key`, e.g. `ClusterArgs`) as `model`,
    and the key its errors are under (`ClusterArgs.cluster`).

    Deprecated, still read: the section's keys given flat at the top of the Args, as the Args
    had them before the section was nested (`ClusterArgs.admins` for `ClusterArgs.cluster.admins`).
    They are read as the section, with a warning, and their errors keep their old keys; the same
    key flat and nested is refused (one of the two would be ignored)."""
    flat = {k: v for k, v in args.items() if k in model.model_fields and k != field}
    nested = camel_case(field)
    if not flat:
        where = f"{key}.{nested}"
        return section_config(model, args.get(field) or {}, where), where
    names = ", ".join(camel_case(k) for k in sorted(flat))
    if args.get(field) is not None:
        raise ConfigError(f"{key}.{camel_case(sorted(flat)[0])}", f"is given at the top of {key} and "
                          f"`{nested}` is given too ({names} belong under `{nested}`)",
                          f"move {names} into `{nested}`", sorted(flat))
    pulumi.log.warn(f"{key}: {names} at the top of the Args are deprecated; pass them under `{nested}` "
                    f"({key}.{nested}.<key>), as the stack config's section", resource=resource)
    return section_config(model, flat, key), key
