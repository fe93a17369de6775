"""`accountId` without anyone having to remember it, before `preview` and `up`.

S3 bucket names are global across all AWS accounts, and a derived bucket name
(`naming.bucket_name`: `<namePrefix>-<purpose>-<hash8>`) hashes stack config only. Two
organisations that deploy the same stack file (the shipped `dev`, say) would derive the same
names, and the second one's `up` would fail on BucketAlreadyExists, unless `accountId`, which
the hash includes, tells them apart. So, when the stack config has no `accountId` and derives a
bucket name (`modelBucket` or `compileCacheBucket` without `name`):

- the deployer's account is resolved with STS GetCallerIdentity (the preflight's client);
- a stack with no deployed resources yet (not in the backend, or its state empty) gets it
  recorded in its stack file (`pulumi config set warmstart:accountId`, through the Automation
  API) right before the engine runs; the preflight and the engine see the names that include
  it, and one line asks for the file to be committed;
- a stack with deployed resources is never changed: its derived names are deployed, and a new
  hash input would rename, i.e. replace, its buckets. One line says so. Only when the deployed
  buckets carry the names this account's id derives (it was recorded once, and the file that
  says so was never committed, as in a CI checkout) is it an error: without the key this run
  would replace them.

The rule that a stack naming its account deploys nowhere else (the provider's
`allowedAccountIds`) is unchanged: the recorded id is that rule from then on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import config
from ..plan import aws as plan_aws
from ..config import NAMESPACE
from ..errors import ConfigError
from ..plan.platform import platform_stack
from ..plan.stack import StackPlan, plan_stack
# Called through their modules, so tests that replace `preflight.caller_account` or
# `engine.deployed_resources` replace what runs here.
from . import engine, preflight
from .request import Request

ACCOUNT_KEY = f"{NAMESPACE}:accountId"


@dataclass(frozen=True)
class AccountStep:
    """What `decide` found: the plan to go by, and what to record or say."""

    plan: StackPlan
    """The plan the preflight and the engine go by: with the account when it is recorded."""
    account_id: str | None = None
    """The deployer's account, when STS was asked and answered."""
    record: bool = False
    """Write `accountId: <account_id>` into the stack file before the engine runs."""
    note: str | None = None
    """One line to print instead, when nothing is recorded."""


def stack_file(request: Request) -> Path:
    return config.stack_file(request.project_dir / "stacks", request.config_stack)


def _shown(request: Request, path: Path) -> str:
    try:
        return str(path.relative_to(request.project_dir))
    except ValueError:
        return str(path)


def _deployed_names(resources: list[dict[str, Any]]) -> set[str]:
    """Physical names (ids, and `bucket` inputs and outputs) of deployed resources."""
    names = set()
    for r in resources:
        names.add(str(r.get("id") or ""))
        for part in ("inputs", "outputs"):
            value = (r.get(part) or {}).get("bucket")
            if isinstance(value, str):
                names.add(value)
    return names - {""}


def applies(request: Request, stack_plan: StackPlan) -> bool:
    """Whether the operation looks for the account: preview or up (not a drift check) of a
    stack config without `accountId` that derives a bucket name. Never for a model stack: it
    derives no bucket name of its own (its model's relative source is in its platform's model
    bucket, named in the platform's contract) and has no `accountId` to record."""
    if platform_stack(stack_plan) is not None:
        return False
    cfg = stack_plan.config
    return request.records_account and cfg.account_id is None and plan_aws.derives_bucket_name(cfg)


def decide(request: Request, cmd: Any, raw: dict[str, str], stack_plan: StackPlan) -> AccountStep:
    """Whether to record the deployer's account in the stack file, and the plan to go by.

    `raw`: the stack file's config as `render.load_plan` read it; `stack_plan`: its plan.
    Raises ConfigError when the deployed buckets show the account was recorded once and lost.
    """
    if not applies(request, stack_plan):
        return AccountStep(stack_plan)
    account = preflight.caller_account(stack_plan.config.region)
    if account is None:
        return AccountStep(stack_plan, note=(
            f"could not resolve the deployer's AWS account (STS GetCallerIdentity), so {ACCOUNT_KEY} is not "
            "recorded and the derived bucket names include no account; set it yourself before the first deploy"))
    with_account = plan_stack(config.from_pulumi_config({**raw, ACCOUNT_KEY: account}), request.config_stack)
    from pulumi.automation.errors import CommandError

    try:
        deployed = engine.deployed_resources(request, cmd)
    except CommandError as e:
        return AccountStep(stack_plan, account, note=(
            f"could not read stack '{request.stack}''s state ({engine.last_error_line(e)}), so {ACCOUNT_KEY} is "
            "not recorded: a stack with deployed buckets must keep the names they have"))
    if not deployed:
        return AccountStep(with_account, account, record=True)
    path = _shown(request, stack_file(request))
    lost = sorted(set(with_account.derived_bucket_names) & _deployed_names(deployed))
    if lost:
        raise ConfigError(
            ACCOUNT_KEY, f"stack '{request.stack}' has deployed bucket(s) {', '.join(lost)}, named with account "
            f"{account}'s id, but {path} has no accountId (recorded once, and the file never committed?): "
            "without it this run would rename, i.e. replace, them",
            f'add `{ACCOUNT_KEY}: "{account}"` to {path} and commit it')
    return AccountStep(stack_plan, account, note=(
        f"stack '{request.stack}' has deployed resources and no {ACCOUNT_KEY}, so nothing is recorded: its derived "
        "bucket names stay the ones deployed, without the account (adding accountId now would rename, i.e. "
        "replace, those buckets)"))


class RecordFailed(Exception):
    """`pulumi config set` did not leave the account in the stack file warmstart reads."""


def record(request: Request, stack: Any, step: AccountStep) -> str:
    """Write the account into the stack file through the Automation API, check that the file
    warmstart and the program read holds it, and return the line to print."""
    assert step.record and step.account_id
    engine.set_stack_config(stack, ACCOUNT_KEY, step.account_id)
    path = stack_file(request)
    written = config.read_stack_file(path).get(ACCOUNT_KEY)
    if written != step.account_id:
        raise RecordFailed(f"`pulumi config set {ACCOUNT_KEY}` did not write {step.account_id} into "
                           f"{_shown(request, path)} (it holds {written!r}); set it there yourself and run again")
    names = ", ".join(step.plan.derived_bucket_names)
    return (f'recorded {ACCOUNT_KEY}: "{step.account_id}" (the deployer\'s account) in {_shown(request, path)}, so '
            f"the derived bucket names include it{f' ({names})' if names else ''}; commit the file")
