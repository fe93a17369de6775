"""The pulumi_policy adapters around warmstart.policies: one Pulumi policy per check.

`policy/__main__.py` serves `policies()` as the `warmstart-guardrails` pack. Each adapter turns
the engine's view of resources (proxies that raise on values unknown during a preview) into
plain `policies.Resource` records, with unknown values as `policies.UNKNOWN` and the engine's
property dependencies kept, and calls the same pure check the tests call.
"""

from __future__ import annotations

from typing import Any, Mapping

from pulumi_policy import (
    EnforcementLevel,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from . import policies
from .sdk_private import DictProxy, ListProxy, is_unknown

PACK_NAME = "warmstart-guardrails"
# Guardrails block by default; a team can lower one policy with a policy-pack config file
# (`warmstart preview --policy-config FILE`, {"<policy>": "advisory"}).
DEFAULT_ENFORCEMENT = EnforcementLevel.MANDATORY


def plain(value: Any) -> Any:
    """A property value without the SDK's unknown-checking proxies; unknowns become UNKNOWN."""
    if isinstance(value, DictProxy):
        value = value["__target"]
    elif isinstance(value, ListProxy):
        value = value["__target"]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if is_unknown(value):
        return policies.UNKNOWN
    return value


def record(typ: str, name: str, props: Any, urn: str = "",
           property_dependencies: Mapping[str, Any] | None = None) -> policies.Resource:
    deps = {k: tuple(getattr(d, "urn", d) for d in v) for k, v in (property_dependencies or {}).items()}
    return policies.Resource(typ, name, plain(props) or {}, urn, deps)


def _resource_validator(check: policies.Check):
    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        if check.types and args.resource_type not in check.types:
            return
        for v in check.fn([record(args.resource_type, args.name, args.props, args.urn)]):
            report(v.message, None)
    return validate


def _stack_validator(check: policies.Check):
    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        resources = [record(r.resource_type, r.name, r.props, r.urn, r.property_dependencies)
                     for r in args.resources]
        for v in check.fn(resources):
            report(v.message, v.resource.urn or None)
    return validate


def enforcement_of(check: policies.Check) -> EnforcementLevel:
    """The check's own level: mandatory (the default) or advisory (`Check.enforcement`)."""
    return EnforcementLevel.ADVISORY if check.enforcement == "advisory" else DEFAULT_ENFORCEMENT


def policies_for_pack() -> list[ResourceValidationPolicy | StackValidationPolicy]:
    """One pulumi_policy Policy per warmstart check, at the check's own level unless configured."""
    out: list[ResourceValidationPolicy | StackValidationPolicy] = []
    for check in policies.CHECKS:
        if check.scope == "resource":
            out.append(ResourceValidationPolicy(name=check.name, description=check.description,
                                                validate=_resource_validator(check),
                                                enforcement_level=enforcement_of(check)))
        else:
            out.append(StackValidationPolicy(name=check.name, description=check.description,
                                             validate=_stack_validator(check),
                                             enforcement_level=enforcement_of(check)))
    return out
