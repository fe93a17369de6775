"""`warmstart preview | up | destroy | refresh | outputs`: the Pulumi Automation API for CI.

Order of work, so that a CI job fails as early and as clearly as it can:

1. the stack config is validated by the same path as `warmstart render` (`render.load_plan`),
   before any engine call: a bad config exits 2 in well under a second;
2. every prerequisite (Pulumi CLI, provider plugins, the Python environment Pulumi runs the
   program and the policy pack in, the AWS CLI v2, AWS credentials, boto3 for the preflight,
   state backend, secrets passphrase) is checked, and everything missing is reported in ONE
   message with how to fix each, exit 4;
3. `preview` and `up` (not a drift check, not `--skip-preflight`) read the account's EC2 vCPU
   quotas for the GPU families the pools launch and compare them with every node the pools
   may hold at their GPU limits (a model stack: its own model at maxReplicas plus a surge pod
   on its platform's pool): a short quota exits 4 with the request that raises it; so do a
   missing EC2 Spot service-linked role for a Karpenter spot pool and a reserved-only pool
   none of whose reservations can hold a node; no permission to read any of it is a warning
   (quotas.py, docs/capacity.md);
3b. `preview` and `up` (not a drift check) of a stack config without `accountId` that derives a
   bucket name resolve the deployer's account with STS and read the stack's state (selecting
   it, never creating it): a stack with nothing deployed yet will have the account recorded in
   its stack file (step 5), so the derived names are unique to the account; a stack with
   deployed resources is left as it is, with a one-line note (account.py);
4. `preview` and `up` (not a drift check, not `--skip-preflight`) run the preflight: with the
   deployer's AWS credentials, every model without `import:` must have config.json and its
   safetensors (all the index names, totalling weightsGiB within 5 %) directly under its S3
   source, in a bucket that exists; every problem of every model in ONE message, exit 6;
5. only then is the stack opened, the account recorded (`pulumi config set
   warmstart:accountId`, with a line asking to commit the file), and the engine run
   (LocalWorkspace over this project directory), its output streamed live, the policy pack in
   `policy/` enforced on preview and up, and the outcome mapped to an exit code and, with
   `--summary FILE`, a JSON summary for CI.

The Automation API is imported late: `warmstart render` and the config-error path never load it.

Modules, by concern:

- `request`: the operation sets, `Request`, `Outcome`, `Missing`, `PolicyViolation`,
  `PrerequisitesMissing`, and the pure summaries (`count_changes`, `changed`, `mask_outputs`,
  `summary`);
- `prerequisites`: the Pulumi CLI, plugin, Python environment, AWS CLI, AWS credential, boto3,
  backend and passphrase checks;
- `account`: recording the deployer's account as `accountId` in a new stack's file;
- `quotas`: the EC2 vCPU quotas of the GPU pools, before any engine call;
- `preflight`: the models' weights in S3, before any engine call;
- `engine`: opening the LocalWorkspace stack, running the operation, mapping the result;
- `commands`: `add_parsers`, `request_from_args` and `execute`, for cli.py.

The exit codes are in `warmstart.exit_codes`. This package re-exports the names callers use.
"""

from __future__ import annotations

from .commands import add_parsers, execute, request_from_args
from .preflight import WEIGHTS_TOLERANCE, check_models, run_preflight
from .account import ACCOUNT_KEY, AccountStep
from .engine import deployed_resources, last_error_line, open_stack, run_engine
from .prerequisites import (
    AWS_CLI_INSTALL,
    AWS_CREDENTIALS_FIX,
    PULUMI_INSTALL,
    aws_credentials_source,
    backend_url,
    check_prerequisites,
    find_pulumi,
    missing_aws_cli,
    missing_boto3,
    missing_plugins,
    missing_python_env,
    required_plugins,
    stored_login,
)
from .request import (
    ACCOUNT_OPERATIONS,
    CREATING_OPERATIONS,
    ENGINE_OPERATIONS,
    NO_CHANGE_OPS,
    OPERATIONS,
    POLICY_OPERATIONS,
    POLICY_PACK_DIR,
    PREFLIGHT_OPERATIONS,
    SECRET_MASK,
    VALIDATED_OPERATIONS,
    Missing,
    Outcome,
    PolicyViolation,
    PreflightFailed,
    PreflightProblem,
    PrerequisitesMissing,
    Request,
    changed,
    count_changes,
    mask_outputs,
    summary,
)

__all__ = [
    "ACCOUNT_KEY",
    "ACCOUNT_OPERATIONS",
    "AWS_CLI_INSTALL",
    "AccountStep",
    "AWS_CREDENTIALS_FIX",
    "CREATING_OPERATIONS",
    "ENGINE_OPERATIONS",
    "NO_CHANGE_OPS",
    "OPERATIONS",
    "POLICY_OPERATIONS",
    "POLICY_PACK_DIR",
    "PREFLIGHT_OPERATIONS",
    "PULUMI_INSTALL",
    "SECRET_MASK",
    "VALIDATED_OPERATIONS",
    "WEIGHTS_TOLERANCE",
    "Missing",
    "Outcome",
    "PolicyViolation",
    "PreflightFailed",
    "PreflightProblem",
    "PrerequisitesMissing",
    "Request",
    "add_parsers",
    "aws_credentials_source",
    "backend_url",
    "changed",
    "check_models",
    "check_prerequisites",
    "count_changes",
    "deployed_resources",
    "execute",
    "find_pulumi",
    "last_error_line",
    "mask_outputs",
    "missing_aws_cli",
    "missing_boto3",
    "missing_plugins",
    "missing_python_env",
    "open_stack",
    "request_from_args",
    "required_plugins",
    "run_engine",
    "run_preflight",
    "stored_login",
    "summary",
]
