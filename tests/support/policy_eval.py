"""A small IAM policy evaluator for tests: enough of the AWS evaluation logic (explicit Deny
wins, then any Allow, else implicit deny; wildcard actions and resources; the condition
operators warmstart's policies use) to ask "may this request happen?" instead of comparing
policy text with itself.
"""

from __future__ import annotations

import fnmatch
import json
from typing import Any

ALLOW, DENY, IMPLICIT_DENY = "allow", "deny", "implicit-deny"


def _as_list(v: Any) -> list:
    return v if isinstance(v, list) else [v]


def _like(pattern: str, value: str, case_sensitive: bool = True) -> bool:
    # IAM wildcards: * any run of characters, ? one character (fnmatchcase also knows [...],
    # which never appears in these policies).
    if not case_sensitive:
        pattern, value = pattern.lower(), value.lower()
    return fnmatch.fnmatchcase(value, pattern)


_OPS = {
    "StringEquals": lambda p, v: p == v,
    "StringLike": lambda p, v: _like(p, v),
    "ArnLike": lambda p, v: _like(p, v),
    "ArnEquals": lambda p, v: p == v,
    "Bool": lambda p, v: str(p).lower() == str(v).lower(),
}


def _condition_holds(cond: dict[str, dict[str, Any]], context: dict[str, Any]) -> bool:
    for op, pairs in cond.items():
        negated = "Not" in op
        base = op.replace("Not", "", 1)
        if base not in _OPS:
            raise NotImplementedError(op)
        match = _OPS[base]
        for key, patterns in pairs.items():
            # Condition keys are case-insensitive.
            ctx = {k.lower(): v for k, v in context.items()}
            if key.lower() not in ctx:
                if not negated:
                    return False
                continue
            value = ctx[key.lower()]
            hit = any(match(p, value) for p in _as_list(patterns))
            if hit == negated:
                return False
    return True


def _statement_applies(st: dict[str, Any], action: str, resource: str, context: dict[str, Any]) -> bool:
    if not any(_like(a, action, case_sensitive=False) for a in _as_list(st["Action"])):
        return False
    if not any(_like(r, resource) for r in _as_list(st["Resource"])):
        return False
    return _condition_holds(st.get("Condition", {}), context)


def evaluate(policy: dict[str, Any] | str, action: str, resource: str, context: dict[str, Any] | None = None) -> str:
    """ALLOW, DENY (explicit) or IMPLICIT_DENY for one request against one policy; `context`
    holds the request's condition keys (`aws:SecureTransport`, `s3:prefix`, ...)."""
    context = context or {}
    doc = json.loads(policy) if isinstance(policy, str) else policy
    effects = {st["Effect"] for st in doc["Statement"] if _statement_applies(st, action, resource, context)}
    if "Deny" in effects:
        return DENY
    return ALLOW if "Allow" in effects else IMPLICIT_DENY


def allowed(policy: dict[str, Any] | str, action: str, resource: str, context: dict[str, Any] | None = None) -> bool:
    return evaluate(policy, action, resource, context) == ALLOW


def evaluate_all(policies: list[dict[str, Any] | str], action: str, resource: str,
                 context: dict[str, Any] | None = None) -> str:
    """One request of a principal in the bucket's own account against its identity policy and
    the resource's policy together: an explicit Deny in any of them wins, else an Allow in any
    of them allows, else implicit deny (no SCPs, boundaries or session policies; the
    same-account case of https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html)."""
    results = [evaluate(p, action, resource, context) for p in policies]
    if DENY in results:
        return DENY
    return ALLOW if ALLOW in results else IMPLICIT_DENY


def statements(policy: dict[str, Any] | str) -> list[dict[str, Any]]:
    doc = json.loads(policy) if isinstance(policy, str) else policy
    return doc["Statement"]
