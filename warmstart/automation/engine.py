"""Running an operation on an Automation API Stack (LocalWorkspace over the project) and mapping
what it returns, policy violations included, to an Outcome."""

from __future__ import annotations

import json
import threading
from typing import Any, Callable

from ..exit_codes import EXIT_CHANGES, EXIT_FAILED, EXIT_OK, EXIT_POLICY
from .request import (
    CREATING_OPERATIONS,
    POLICY_OPERATIONS,
    Outcome,
    PolicyViolation,
    Request,
    changed,
    count_changes,
    mask_outputs,
)


def _workspace_options(request: Request, cmd: Any) -> Any:
    from pulumi import automation as auto

    env_vars = {"PULUMI_BACKEND_URL": request.backend} if request.backend else {}
    return auto.LocalWorkspaceOptions(env_vars=env_vars, pulumi_command=cmd)


# `pulumi stack select` / `stack init` rewrite the project's current-stack file under
# ~/.pulumi/workspaces, so two threads must not create or select stacks of one project at once
# (https://github.com/pulumi/pulumi/issues/8186; a corrupted file in
# https://github.com/pulumi/pulumi/issues/6287). The operations after them pass `--stack` and may
# run side by side (`warmstart up --env`).
_SELECTING = threading.Lock()


def open_stack(request: Request, cmd: Any) -> Any:
    """The Automation API Stack over this project (LocalWorkspace), created where the
    operation may create it (preview, up), selected otherwise."""
    from pulumi import automation as auto

    opts = _workspace_options(request, cmd)
    with _SELECTING:
        if request.operation in CREATING_OPERATIONS:
            return auto.create_or_select_stack(stack_name=request.stack, work_dir=str(request.project_dir), opts=opts)
        return auto.select_stack(stack_name=request.stack, work_dir=str(request.project_dir), opts=opts)


# State entries that are not a deployed resource: the root stack and the providers.
_NOT_DEPLOYED = ("pulumi:pulumi:Stack",)
_PROVIDER_TYPES = "pulumi:providers:"


def deployed_resources(request: Request, cmd: Any) -> list[dict[str, Any]]:
    """The resources in the stack's state (`pulumi stack export`), pending creates included,
    without the root stack and the providers; [] for a stack the backend does not have yet.
    Selects the stack, never creates it. Raises CommandError when the state cannot be read."""
    from pulumi import automation as auto
    from pulumi.automation.errors import StackNotFoundError

    try:
        with _SELECTING:
            stack = auto.select_stack(stack_name=request.stack, work_dir=str(request.project_dir),
                                      opts=_workspace_options(request, cmd))
    except StackNotFoundError:
        return []
    deployment = stack.export_stack().deployment or {}
    entries = list(deployment.get("resources") or [])
    entries += [op.get("resource") or {} for op in deployment.get("pending_operations") or []]
    return [r for r in entries if r.get("type") not in _NOT_DEPLOYED
            and not str(r.get("type", "")).startswith(_PROVIDER_TYPES)]


def set_stack_config(stack: Any, key: str, value: str) -> None:
    """Write a plaintext `key: value` into the stack's config (`pulumi config set`, which
    writes `stacks/Pulumi.<stack>.yaml` as Pulumi keeps it)."""
    from pulumi import automation as auto

    stack.set_config(key, auto.ConfigValue(value=value, secret=False))


def _policy_collector(violations: list[PolicyViolation]) -> Callable[[Any], None]:
    def on_event(event: Any) -> None:
        p = getattr(event, "policy_event", None)
        if p is not None:
            violations.append(PolicyViolation(policy=p.policy_name, message=p.message,
                                              enforcement=p.enforcement_level, resource=p.resource_urn))
    return on_event


def run_engine(request: Request, stack: Any, out: Callable[[str], Any], err: Callable[[str], Any]) -> Outcome:
    """Run the operation on an Automation API Stack and map what it returns to an Outcome."""
    from pulumi.automation.errors import CommandError, StackNotFoundError

    violations: list[PolicyViolation] = []
    policy_args: dict[str, Any] = {}
    if request.operation in POLICY_OPERATIONS:
        policy_args["policy_packs"] = [str(request.policy_pack)]
        if request.policy_config:
            policy_args["policy_pack_configs"] = [str(request.policy_config)]
    common = {"on_output": out, "on_error": err, "on_event": _policy_collector(violations)}
    op = request.operation
    try:
        if op == "outputs":
            return Outcome("succeeded", EXIT_OK, outputs=mask_outputs(stack.outputs(), request.show_secrets))
        if op == "preview":
            changes = stack.preview(**common, **policy_args).change_summary
            outputs = None
        elif op == "up":
            result = stack.up(**common, **policy_args)
            changes, outputs = result.summary.resource_changes, mask_outputs(result.outputs)
        elif op == "destroy":
            changes, outputs = stack.destroy(**common).summary.resource_changes, None
        elif op == "refresh" and request.expect_no_changes:
            # A drift check must not write state: refresh --preview-only shows what a refresh
            # would adopt, and the next night's check still sees the same drift.
            changes, outputs = stack.preview_refresh(**common).change_summary, None
        elif op == "refresh":
            changes, outputs = stack.refresh(**common).summary.resource_changes, None
        else:  # pragma: no cover - argparse restricts the choices
            raise ValueError(op)
    except StackNotFoundError:
        return Outcome("failed", EXIT_FAILED, f"stack '{request.stack}' does not exist in the backend; "
                       "run `warmstart up` (or `preview`) once to create it")
    except CommandError as e:
        blocking = [v for v in violations if v.enforcement.lower() == "mandatory"]
        if blocking:
            return Outcome("policy-violation", EXIT_POLICY,
                           f"{len(blocking)} mandatory policy violation(s): "
                           + "; ".join(f"{v.policy}: {v.message.strip()}" for v in blocking),
                           policy_violations=violations)
        return Outcome("failed", EXIT_FAILED, f"pulumi {op} failed: {last_error_line(e)}", policy_violations=violations)
    n = changed(changes)
    if request.expect_no_changes and n:
        return Outcome("changes-found", EXIT_CHANGES,
                       f"{n} resource change(s) where none were expected: {json.dumps(count_changes(changes))}",
                       resource_changes=dict(changes or {}), outputs=outputs, policy_violations=violations)
    return Outcome("succeeded", EXIT_OK, resource_changes=dict(changes or {}), outputs=outputs,
                   policy_violations=violations)


def last_error_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip().startswith(("error:", "stderr:"))]
    return lines[-1] if lines else type(e).__name__
