"""What one engine command asks for and what it ends with, and the pure summaries of it.

The operation sets say which steps each operation goes through; `Outcome` becomes the exit code
and the `--summary FILE` document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

OPERATIONS = ("preview", "up", "destroy", "refresh", "outputs")
# Operations that run the program or talk to AWS.
ENGINE_OPERATIONS = frozenset({"preview", "up", "destroy", "refresh"})
# Operations whose stack config is validated first. `destroy` and `outputs` are not: neither
# runs the program, and a config broken since the last `up` must not block tearing a stack
# down or reading its outputs.
VALIDATED_OPERATIONS = frozenset({"preview", "up", "refresh"})
# Operations the policy pack runs on (Pulumi runs policy packs on preview and update only).
POLICY_OPERATIONS = frozenset({"preview", "up"})
# Operations that may create the stack in the backend; the others select an existing one.
CREATING_OPERATIONS = frozenset({"preview", "up"})
# Operations whose models' weights are checked in S3 before the engine runs (preflight.py):
# not `refresh` or `destroy` (a drift check or a teardown must not depend on the weights), and
# not `preview --expect-no-changes`, the other half of the nightly drift check.
PREFLIGHT_OPERATIONS = frozenset({"preview", "up"})
# Operations that record the deployer's account as `accountId` in a new stack's file when the
# stack derives a bucket name (account.py); not a drift check (`--expect-no-changes`), which
# changes nothing.
ACCOUNT_OPERATIONS = frozenset({"preview", "up"})

POLICY_PACK_DIR = "policy"
SECRET_MASK = "[secret]"
# Resource operations that are not a change (a `read` is a data lookup, repeated every run).
NO_CHANGE_OPS = frozenset({"same", "read"})


@dataclass(frozen=True)
class Request:
    """One `warmstart <operation>` invocation."""

    operation: str
    stack: str
    """Stack name as the backend knows it (`dev`, or `org/warmstart/dev` on Pulumi Cloud)."""
    project_dir: Path
    backend: str | None = None
    """`--backend`; else PULUMI_BACKEND_URL (or a Pulumi Cloud login) decides."""
    summary_path: Path | None = None
    expect_no_changes: bool = False
    policy_config: Path | None = None
    show_secrets: bool = False
    skip_preflight: bool = False
    """`--skip-preflight`: do not check the models' weights in S3 before the engine runs."""

    @property
    def config_stack(self) -> str:
        """The stack file's name: Pulumi uses the last segment of a qualified stack name."""
        return self.stack.rsplit("/", 1)[-1]

    @property
    def policy_pack(self) -> Path:
        return self.project_dir / POLICY_PACK_DIR

    @property
    def records_account(self) -> bool:
        """Whether a missing `accountId` may be recorded in the stack file first (account.py)."""
        return self.operation in ACCOUNT_OPERATIONS and not self.expect_no_changes

    @property
    def runs_preflight(self) -> bool:
        """Whether the models' weights are checked in S3 before the engine runs (preflight.py)."""
        return (self.operation in PREFLIGHT_OPERATIONS and not self.skip_preflight
                and not self.expect_no_changes)


@dataclass(frozen=True)
class Missing:
    """A prerequisite that is not there: what, what was found, and how to provide it."""

    what: str
    found: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}: {self.found}; fix: {self.fix}"


class PrerequisitesMissing(Exception):
    def __init__(self, operation: str, stack: str, missing: list[Missing]) -> None:
        self.missing = missing
        n = len(missing)
        lines = [f"warmstart: cannot run `{operation}` on stack '{stack}': "
                 f"{n} prerequisite{'s' if n > 1 else ''} missing:"]
        lines += [f"  - {m}" for m in missing]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class PreflightProblem:
    """One model whose weights are not ready to stream: which (`warmstart:models[i]`), what is
    wrong, and how to fix it."""

    key: str
    model: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.key} ({self.model}): {self.problem}; fix: {self.fix}"


class PreflightFailed(Exception):
    def __init__(self, operation: str, stack: str, problems: list[PreflightProblem]) -> None:
        self.problems = problems
        n = len(problems)
        models = len({p.key for p in problems})
        lines = [f"warmstart: cannot run `{operation}` on stack '{stack}': the preflight found "
                 f"{n} problem{'s' if n > 1 else ''} with the weights of {models} "
                 f"model{'s' if models > 1 else ''} (no engine call was made; `--skip-preflight` "
                 "skips this check):"]
        lines += [f"  - {p}" for p in problems]
        super().__init__("\n".join(lines))


@dataclass
class PolicyViolation:
    policy: str
    message: str
    enforcement: str
    resource: str | None = None


@dataclass
class Outcome:
    """What an operation ended with; becomes the exit code and the JSON summary."""

    result: str
    """succeeded | failed | changes-found | policy-violation | config-error | missing-prerequisites
    | quota-short | capacity-refused | preflight-failed"""
    exit_code: int
    message: str = ""
    resource_changes: dict[str, int] | None = None
    outputs: dict[str, Any] | None = None
    policy_violations: list[PolicyViolation] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)
    preflight_problems: list[PreflightProblem] = field(default_factory=list)
    quota_short: list[Any] = field(default_factory=list)
    """quotas.QuotaShort: each EC2 quota below what the pools need."""



# --------------------------------------------------------------------------------------
# Summaries (pure)


def count_changes(resource_changes: Mapping[str, int] | None) -> dict[str, int]:
    """created/updated/deleted/replaced/same from Pulumi's per-operation counts.

    `replace` counts replaced resources once; its `create-replacement` / `delete-replaced`
    steps are parts of the same replacement and are not counted again.
    """
    rc = {str(getattr(k, "value", k)): int(v) for k, v in (resource_changes or {}).items()}
    return {
        "created": rc.get("create", 0) + rc.get("import", 0),
        "updated": rc.get("update", 0),
        "deleted": rc.get("delete", 0),
        "replaced": rc.get("replace", 0),
        "same": rc.get("same", 0),
    }


def changed(resource_changes: Mapping[str, int] | None) -> int:
    """Resources an operation would change (anything but `same` and data reads)."""
    return sum(int(v) for k, v in (resource_changes or {}).items()
               if str(getattr(k, "value", k)) not in NO_CHANGE_OPS)


def mask_outputs(outputs: Mapping[str, Any] | None, show_secrets: bool = False) -> dict[str, Any] | None:
    """Stack outputs (Automation API OutputValue(value, secret)) as plain JSON, secrets masked."""
    if outputs is None:
        return None
    return {k: (v.value if show_secrets or not v.secret else SECRET_MASK) for k, v in sorted(outputs.items())}


def summary(request: Request, outcome: Outcome, seconds: float) -> dict[str, Any]:
    """The `--summary FILE` document."""
    rc = outcome.resource_changes
    return {
        "operation": request.operation,
        "stack": request.stack,
        "result": outcome.result,
        "exitCode": outcome.exit_code,
        "message": outcome.message,
        "counts": count_changes(rc) if rc is not None else None,
        "resourceChanges": ({str(getattr(k, "value", k)): int(v) for k, v in sorted(rc.items(), key=lambda kv: str(kv[0]))}
                            if rc is not None else None),
        "outputs": outcome.outputs,
        "policyViolations": [vars(v) for v in outcome.policy_violations],
        "missingPrerequisites": [vars(m) for m in outcome.missing],
        "preflightProblems": [vars(p) for p in outcome.preflight_problems],
        "quotaShort": [{"code": q.code, "name": q.name, "value": q.value, "need": q.need, "request": q.request}
                       for q in outcome.quota_short],
        "durationSeconds": round(seconds, 3),
    }
