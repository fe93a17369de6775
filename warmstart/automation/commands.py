"""The engine subcommands for cli.py: their arguments, the Request they make, and `execute`,
which validates, checks prerequisites, records a new stack's account (account.py), runs the
preflight (preflight.py), runs the engine and reports the outcome."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError, ConfigErrors
from ..exit_codes import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_PREFLIGHT, EXIT_PREREQUISITES, EXIT_QUOTA
# Called through their modules, so a test that replaces `prerequisites.check_prerequisites`,
# `preflight.run_preflight` or `engine.open_stack` replaces what `execute` calls.
from . import account, engine, preflight, prerequisites, quotas
from .request import (
    ENGINE_OPERATIONS,
    OPERATIONS,
    POLICY_OPERATIONS,
    PREFLIGHT_OPERATIONS,
    VALIDATED_OPERATIONS,
    Outcome,
    PreflightFailed,
    PrerequisitesMissing,
    Request,
    summary,
)


def execute(request: Request) -> int:
    """Validate, check prerequisites, find the account to record (a new stack without
    accountId), run the preflight, record the account, run; print the outcome, write the
    summary, return the exit code."""
    started = time.perf_counter()
    say = functools.partial(print, flush=True)
    say_err = functools.partial(print, file=sys.stderr, flush=True)

    def finish(outcome: Outcome) -> int:
        if request.summary_path:
            request.summary_path.parent.mkdir(parents=True, exist_ok=True)
            doc = summary(request, outcome, time.perf_counter() - started)
            request.summary_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return outcome.exit_code

    stack_plan = None
    raw: dict[str, str] = {}
    if request.operation in VALIDATED_OPERATIONS:
        from .. import render

        try:
            raw, stack_plan = render.load_plan(request.project_dir / "stacks", request.config_stack)
        except (ConfigError, ConfigErrors) as err:
            finish(Outcome("config-error", EXIT_CONFIG, str(err)))
            raise  # cli.main prints it, exactly as `warmstart render` does

    note = private_endpoint_note(request, stack_plan)
    if note:
        say_err(f"warmstart: note: {note}")

    cmd, missing = prerequisites.check_prerequisites(request)
    if missing:
        error = PrerequisitesMissing(request.operation, request.stack, missing)
        say_err(str(error))
        return finish(Outcome("missing-prerequisites", EXIT_PREREQUISITES, str(error), missing=missing))

    # The account's GPU quotas first, before the account step reads the stack's state: without
    # them no node launches, whatever else is right (quotas.py).
    if request.runs_preflight and stack_plan is not None:
        report = quotas.run_quota_preflight(stack_plan)
        for warning in report.warnings:
            say_err(f"warmstart: warning: {warning}")
        if report.short or report.refused:
            error = quotas.QuotaShortFailed(request.operation, request.stack, report.short, report.refused)
            say_err(str(error))
            return finish(Outcome("quota-short" if report.short else "capacity-refused", EXIT_QUOTA, str(error),
                                  quota_short=report.short))
        if report.checked:
            say(report.passed_line())

    # A stack without accountId that derives a bucket name: the deployer's account, recorded
    # below for a stack with nothing deployed yet (account.py). The preflight checks the names
    # the engine will deploy.
    step = None
    if stack_plan is not None and account.applies(request, stack_plan):
        try:
            step = account.decide(request, cmd, raw, stack_plan)
        except (ConfigError, ConfigErrors) as err:
            finish(Outcome("config-error", EXIT_CONFIG, str(err)))
            raise
        stack_plan = step.plan
        if step.note:
            say_err(f"warmstart: note: {step.note}")

    if request.runs_preflight and stack_plan is not None:
        problems = preflight.run_preflight(stack_plan, **({"account_id": step.account_id}
                                                          if step and step.account_id else {}))
        if problems:
            error = PreflightFailed(request.operation, request.stack, problems)
            say_err(str(error))
            return finish(Outcome("preflight-failed", EXIT_PREFLIGHT, str(error), preflight_problems=problems))
        models = stack_plan.models  # an environment's models, or a model stack's one
        imports = sum(m.weights_import is not None for m in models)
        say(f"warmstart: preflight passed: {len(models) - imports} model(s) ready in S3"
            + (f", {imports} left to their import Jobs" if imports else ""))
    elif request.skip_preflight:
        say_err("warmstart: --skip-preflight: the EC2 GPU quotas and the models' weights in S3 were not checked")

    from pulumi.automation.errors import CommandError

    try:
        stack = engine.open_stack(request, cmd)
    except CommandError as e:
        say_err(f"warmstart: could not open stack '{request.stack}': {engine.last_error_line(e)}")
        return finish(Outcome("failed", EXIT_FAILED, f"could not open stack: {engine.last_error_line(e)}"))
    if step is not None and step.record:
        try:
            say(f"warmstart: {account.record(request, stack, step)}")
        except (CommandError, account.RecordFailed) as e:
            why = engine.last_error_line(e) if isinstance(e, CommandError) else str(e)
            say_err(f"warmstart: could not record {account.ACCOUNT_KEY} in the stack file: {why}")
            return finish(Outcome("failed", EXIT_FAILED, f"could not record {account.ACCOUNT_KEY}: {why}"))
    outcome = engine.run_engine(request, stack, say, say_err)
    if request.operation == "outputs" and outcome.outputs is not None:
        say(json.dumps(outcome.outputs, indent=2, sort_keys=True))
    if outcome.message:
        (say if outcome.exit_code == EXIT_OK else say_err)(f"warmstart: {outcome.message}")
    return finish(outcome)


def private_endpoint_note(request: Request, stack_plan: Any) -> str | None:
    """What to say before an operation on a stack whose cluster has no public API endpoint
    (`cluster.endpointPublicAccess: false`): the engine reaches the cluster's Kubernetes objects
    through its private endpoint only, so it must run inside the VPC
    (https://docs.aws.amazon.com/eks/latest/userguide/cluster-endpoint.html)."""
    cluster = getattr(stack_plan, "cluster", None)
    if request.operation not in ENGINE_OPERATIONS or cluster is None or cluster.endpoint_public_access:
        return None
    return (f"cluster {cluster.name!r} has no public API endpoint (cluster.endpointPublicAccess: false): "
            f"`warmstart {request.operation}` reaches its Kubernetes objects through the private endpoint only, so "
            "run it from inside the VPC (or a network routed to it: VPN, Direct Connect, a bastion); from "
            "anywhere else the Kubernetes steps time out. The first `up` creates the cluster, then needs that "
            "network access too")


def add_parsers(sub: Any, handler: Callable[[argparse.Namespace], int]) -> None:
    """The engine subcommands, for cli.parser()."""
    helps = {
        "preview": "preview a stack's changes with the policy pack (Automation API)",
        "up": "deploy a stack with the policy pack (Automation API)",
        "destroy": "delete every resource of a stack (Automation API)",
        "refresh": "adopt the cloud's actual state into a stack's state; with --expect-no-changes, "
                   "report drift without writing state",
        "outputs": "print a stack's outputs as JSON (secrets masked)",
    }
    for op in OPERATIONS:
        p = sub.add_parser(op, help=helps[op])
        p.add_argument("--stack", required=True,
                       help="stack name; its config is stacks/Pulumi.<last segment of NAME>.yaml")
        p.add_argument("--backend", help="state backend URL (file://DIR, s3://BUCKET/PREFIX); "
                                         "default: PULUMI_BACKEND_URL or the Pulumi Cloud login")
        p.add_argument("--summary", type=Path, metavar="FILE", help="write a JSON summary for CI to FILE")
        if op in ("preview", "refresh"):
            p.add_argument("--expect-no-changes", action="store_true",
                           help="drift check: exit 3 if any resource would change")
        if op in POLICY_OPERATIONS:
            p.add_argument("--policy-config", type=Path, metavar="FILE",
                           help="policy pack config JSON (e.g. an enforcement level per policy)")
        if op in PREFLIGHT_OPERATIONS:
            tolerance = f"{preflight.WEIGHTS_TOLERANCE:.0%}".replace("%", "%%")  # argparse formats help
            p.add_argument("--skip-preflight", action="store_true",
                           help="emergencies only: skip the preflight, which checks with your AWS "
                                "credentials, before any engine call, that the EC2 vCPU quotas of the GPU "
                                f"families hold every pool at its limits (short: exit {EXIT_QUOTA}), and that "
                                "every model without `import:` "
                                "has config.json, every shard its model.safetensors.index.json names, and "
                                f"*.safetensors totalling its weightsGiB (within {tolerance}) directly under "
                                f"its S3 source; a failed preflight exits {EXIT_PREFLIGHT}"
                                + (" (a drift check, --expect-no-changes, never runs it)" if op == "preview" else ""))
        if op == "outputs":
            p.add_argument("--show-secrets", action="store_true", help="print secret outputs in clear")
        p.set_defaults(func=handler, operation=op)


def request_from_args(args: argparse.Namespace, project_dir: Path) -> Request:
    return Request(
        operation=args.operation,
        stack=args.stack,
        project_dir=project_dir,
        backend=args.backend,
        summary_path=args.summary,
        expect_no_changes=getattr(args, "expect_no_changes", False),
        policy_config=getattr(args, "policy_config", None),
        show_secrets=getattr(args, "show_secrets", False),
        skip_preflight=getattr(args, "skip_preflight", False),
    )
