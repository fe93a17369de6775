"""`warmstart preview | up | destroy | refresh | outputs`: the Pulumi Automation API for CI.

Order of work, so that a CI job fails as early and as clearly as it can:

1. the stack config is validated by the same path as `warmstart render` (`render.load_plan`),
   before any engine call: a bad config exits 2 in well under a second;
2. every prerequisite (Pulumi CLI, provider plugins, the Python environment Pulumi runs the
   program and the policy pack in, AWS credentials, state backend, secrets passphrase) is
   checked, and everything missing is reported in ONE message with how to fix each, exit 4;
3. only then is the engine run (LocalWorkspace over this project directory), its output
   streamed live, the policy pack in `policy/` enforced on preview and up, and the outcome
   mapped to an exit code and, with `--summary FILE`, a JSON summary for CI.

The Automation API is imported late: `warmstart render` and the config-error path never load it.
"""

from __future__ import annotations

import argparse
import configparser
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from .errors import ConfigError, ConfigErrors

# Exit codes; cli.py holds the table (and documents it in --help).
from .cli import EXIT_CHANGES, EXIT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_POLICY, EXIT_PREREQUISITES

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

POLICY_PACK_DIR = "policy"
SECRET_MASK = "[secret]"
# Resource operations that are not a change (a `read` is a data lookup, repeated every run).
NO_CHANGE_OPS = frozenset({"same", "read"})

PULUMI_INSTALL = (
    "install the Pulumi CLI {version}: `curl -fsSL https://get.pulumi.com | sh -s -- --version {version}` "
    "and put ~/.pulumi/bin on PATH (GitHub Actions: `pulumi/actions@v6` with `pulumi-version: {version}`)"
)


# --------------------------------------------------------------------------------------
# Request and outcome


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

    @property
    def config_stack(self) -> str:
        """The stack file's name: Pulumi uses the last segment of a qualified stack name."""
        return self.stack.rsplit("/", 1)[-1]

    @property
    def policy_pack(self) -> Path:
        return self.project_dir / POLICY_PACK_DIR


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
    """succeeded | failed | changes-found | policy-violation | config-error | missing-prerequisites"""
    exit_code: int
    message: str = ""
    resource_changes: dict[str, int] | None = None
    outputs: dict[str, Any] | None = None
    policy_violations: list[PolicyViolation] = field(default_factory=list)
    missing: list[Missing] = field(default_factory=list)


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
        "durationSeconds": round(seconds, 3),
    }


# --------------------------------------------------------------------------------------
# Prerequisites


def _pulumi_sdk_version() -> str:
    return metadata.version("pulumi")


def required_plugins() -> list[tuple[str, str]]:
    """(name, version) of every resource plugin the pinned provider SDKs need.

    Read from each SDK's `pulumi-plugin.json` (what the SDK asks the engine for), for the
    `pulumi-*` runtime dependencies pyproject.toml pins; no SDK is imported.
    """
    found = []
    for req in metadata.requires("warmstart") or []:
        if "extra ==" in req:
            continue
        dist_name = req.split(";")[0].split("==")[0].split(">")[0].split("<")[0].strip()
        if not dist_name.startswith("pulumi-"):
            continue
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            continue
        for f in dist.files or []:
            if f.name == "pulumi-plugin.json" and len(f.parts) == 2:
                doc = json.loads(Path(dist.locate_file(f)).read_text())
                if doc.get("resource"):
                    found.append((doc["name"], doc["version"].lstrip("v")))
    return sorted(set(found))


def find_pulumi() -> tuple[Any | None, Missing | None]:
    """The Automation API's PulumiCommand for the CLI on PATH, or what is wrong with it."""
    version = _pulumi_sdk_version()
    if shutil.which("pulumi") is None:
        return None, Missing("Pulumi CLI", "`pulumi` is not on PATH", PULUMI_INSTALL.format(version=version))
    from pulumi.automation import PulumiCommand
    from pulumi.automation.errors import InvalidVersionError

    try:
        return PulumiCommand(), None
    except InvalidVersionError as err:
        return None, Missing("Pulumi CLI", str(err), PULUMI_INSTALL.format(version=version))
    except (OSError, subprocess.CalledProcessError) as err:
        return None, Missing("Pulumi CLI", f"`pulumi version` failed ({err})", PULUMI_INSTALL.format(version=version))


def missing_plugins(cmd: Any, project_dir: Path) -> list[Missing]:
    """Resource plugins not installed at the exact versions the SDKs ask for (`pulumi plugin ls`)."""
    wanted = required_plugins()
    try:
        out = cmd.run(["plugin", "ls", "--json"], str(project_dir), {}).stdout
        have = {(p.get("name"), str(p.get("version", "")).lstrip("v")) for p in json.loads(out or "[]")
                if p.get("kind") == "resource"}
    except Exception as err:  # noqa: BLE001 - any failure here is reported, not raised
        return [Missing("provider plugins", f"`pulumi plugin ls --json` failed ({err})",
                        "run `pulumi plugin ls` to see why")]
    absent = [(n, v) for n, v in wanted if (n, v) not in have]
    if not absent:
        return []
    names = ", ".join(f"{n} v{v}" for n, v in absent)
    fix = " && ".join(f"pulumi plugin install resource {n} v{v}" for n, v in absent)
    return [Missing("provider plugins", f"not installed: {names}", f"`{fix}` (or `pulumi install` in {project_dir})")]


AWS_CREDENTIALS_FIX = (
    "provide credentials for the target account: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY "
    "(+ AWS_SESSION_TOKEN), AWS_PROFILE naming a profile in ~/.aws/config (SSO: `aws sso login`), "
    "web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE; GitHub Actions: "
    "aws-actions/configure-aws-credentials with role-to-assume), or an instance/container role"
)


def aws_credentials_source(env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """Where AWS credentials would come from, or (None, what was looked at).

    Static and web-identity environment variables first (no I/O); then botocore's own
    provider chain when botocore is installed (shared files, SSO, credential_process,
    container and instance roles: the chain the AWS provider resolves too); without botocore,
    the shared credentials/config files for AWS_PROFILE (or `default`).
    """
    env = os.environ if env is None else env
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return "environment (AWS_ACCESS_KEY_ID)", ""
    if env.get("AWS_WEB_IDENTITY_TOKEN_FILE") and env.get("AWS_ROLE_ARN"):
        return "web identity (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE)", ""
    if env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        return "container credentials endpoint", ""
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    try:
        import botocore.exceptions
        import botocore.session
    except ImportError:
        botocore = None  # type: ignore[assignment]
    if botocore is not None and env is os.environ:
        try:
            creds = botocore.session.Session().get_credentials()
        except botocore.exceptions.BotoCoreError as err:
            return None, f"botocore could not resolve credentials for profile '{profile}' ({err})"
        if creds is not None:
            return f"botocore ({creds.method})", ""
        return None, ("none in the environment, the shared files, SSO, or a container/instance role "
                      f"(botocore's chain, profile '{profile}')")
    home = Path(env.get("HOME", str(Path.home())))
    files = [Path(env.get("AWS_SHARED_CREDENTIALS_FILE", home / ".aws" / "credentials")),
             Path(env.get("AWS_CONFIG_FILE", home / ".aws" / "config"))]
    keys = {"aws_access_key_id", "role_arn", "credential_process", "sso_session", "sso_start_url",
            "web_identity_token_file", "credential_source"}
    for path in files:
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except configparser.Error:
            continue
        for section in (profile, f"profile {profile}"):
            if parser.has_section(section) and keys & set(parser[section]):
                return f"shared file {path} (profile '{profile}')", ""
    return None, (f"none in the environment or in {files[0]} / {files[1]} for profile '{profile}' "
                  "(botocore is not installed, so instance and container roles were not probed)")


def stored_login(env: Mapping[str, str]) -> str | None:
    """The backend of a stored `pulumi login` (~/.pulumi/credentials.json `current`), if any."""
    home = Path(env.get("PULUMI_HOME") or Path(env.get("HOME", str(Path.home()))) / ".pulumi")
    try:
        return json.loads((home / "credentials.json").read_text()).get("current") or None
    except (OSError, ValueError, AttributeError):
        return None


def backend_url(request: Request, env: Mapping[str, str]) -> str | None:
    """The state backend Pulumi will use: --backend, PULUMI_BACKEND_URL, a stored login, or
    Pulumi Cloud when PULUMI_ACCESS_TOKEN is set."""
    return (request.backend or env.get("PULUMI_BACKEND_URL") or stored_login(env)
            or ("https://api.pulumi.com" if env.get("PULUMI_ACCESS_TOKEN") else None))


def _stack_file_secrets_provider(request: Request) -> str | None:
    """The stack file's `secretsprovider` (None: Pulumi's default, the passphrase)."""
    from .config import stack_file

    path = stack_file(request.project_dir / "stacks", request.config_stack)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    return doc.get("secretsprovider") if isinstance(doc, dict) else None


def _virtualenv_python(project_file: Path) -> Path | None:
    """The Python Pulumi runs a project or policy pack with (`runtime.options.virtualenv`)."""
    try:
        doc = yaml.safe_load(project_file.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    runtime = doc.get("runtime")
    venv = runtime.get("options", {}).get("virtualenv") if isinstance(runtime, dict) else None
    if not venv:
        return None
    return (project_file.parent / venv).resolve() / "bin" / "python"


def missing_python_env(request: Request) -> list[Missing]:
    """The program's and the policy pack's virtualenvs exist and hold warmstart and pulumi-policy.

    If a virtualenv named in Pulumi.yaml / PulumiPolicy.yaml is absent, Pulumi creates it and
    installs requirements.txt into it, which for this project would be an environment without
    warmstart's pinned providers.
    """
    found: list[Missing] = []
    checks = [(request.project_dir / "Pulumi.yaml", ("warmstart",))]
    if request.operation in POLICY_OPERATIONS:
        checks.append((request.policy_pack / "PulumiPolicy.yaml", ("warmstart", "pulumi-policy")))
    fix = (f"`python3 -m venv .venv && .venv/bin/pip install -e .` in {request.project_dir} "
           "(the program and the policy pack share it)")
    seen: set[Path] = set()
    for project_file, dists in checks:
        python = _virtualenv_python(project_file)
        if python is None or python in seen:
            continue
        seen.add(python)
        if not python.exists():
            found.append(Missing("Python environment", f"{python.parent.parent} (virtualenv of "
                                 f"{project_file.name}) does not exist", fix))
            continue
        probe = ("import importlib.metadata as m, sys\n"
                 "for d in sys.argv[1:]:\n"
                 "    try: m.version(d)\n"
                 "    except m.PackageNotFoundError: print(d)\n")
        try:
            out = subprocess.run([str(python), "-c", probe, *dists], capture_output=True, text=True,
                                 timeout=60, check=True).stdout.split()
        except (OSError, subprocess.SubprocessError) as err:
            found.append(Missing("Python environment", f"{python} does not run ({err})", fix))
            continue
        if out:
            found.append(Missing("Python environment", f"{python.parent.parent} lacks {', '.join(out)}", fix))
    return found


def check_prerequisites(request: Request, env: Mapping[str, str] | None = None) -> tuple[Any | None, list[Missing]]:
    """The PulumiCommand to run with, and every missing prerequisite (all of them, at once)."""
    env = os.environ if env is None else env
    missing: list[Missing] = []
    cmd, cli_missing = find_pulumi()
    if cli_missing:
        wanted = " && ".join(f"pulumi plugin install resource {n} v{v}" for n, v in required_plugins())
        missing.append(Missing(cli_missing.what, cli_missing.found,
                               cli_missing.fix + (f"; then the provider plugins: `{wanted}`"
                                                  if request.operation in ENGINE_OPERATIONS and wanted else "")))
    elif request.operation in ENGINE_OPERATIONS:
        missing += missing_plugins(cmd, request.project_dir)

    if request.operation in ENGINE_OPERATIONS:
        missing += missing_python_env(request)

    backend = backend_url(request, env)
    if backend is None:
        missing.append(Missing(
            "state backend", "no --backend, PULUMI_BACKEND_URL or Pulumi Cloud login",
            "pass --backend s3://BUCKET/PREFIX (real stacks) or --backend file://DIR (throwaway), "
            "or set PULUMI_BACKEND_URL, or PULUMI_ACCESS_TOKEN for Pulumi Cloud"))

    needs_aws = request.operation in ENGINE_OPERATIONS or (backend or "").startswith("s3://")
    if needs_aws:
        source, looked = aws_credentials_source(env)
        if source is None:
            missing.append(Missing("AWS credentials", looked, AWS_CREDENTIALS_FIX))

    provider = _stack_file_secrets_provider(request)
    self_managed = backend is not None and not backend.startswith(("https://", "http://"))
    if self_managed and (provider is None or provider.startswith("passphrase")):
        passphrase_file = env.get("PULUMI_CONFIG_PASSPHRASE_FILE")
        if passphrase_file and not Path(passphrase_file).is_file():
            missing.append(Missing("secrets passphrase", f"PULUMI_CONFIG_PASSPHRASE_FILE={passphrase_file} is not a file",
                                   "point it at the file holding the stack's passphrase"))
        elif "PULUMI_CONFIG_PASSPHRASE" not in env and not passphrase_file:
            missing.append(Missing(
                "secrets passphrase", f"the {backend.split('://')[0]}:// backend encrypts stack secrets with a "
                "passphrase and neither PULUMI_CONFIG_PASSPHRASE nor PULUMI_CONFIG_PASSPHRASE_FILE is set",
                "set one of them from your CI secret store (never commit the passphrase)"))
    return cmd, missing


# --------------------------------------------------------------------------------------
# Engine


def open_stack(request: Request, cmd: Any) -> Any:
    """The Automation API Stack over this project (LocalWorkspace), created where the
    operation may create it (preview, up), selected otherwise."""
    from pulumi import automation as auto

    env_vars = {"PULUMI_BACKEND_URL": request.backend} if request.backend else {}
    opts = auto.LocalWorkspaceOptions(env_vars=env_vars, pulumi_command=cmd)
    if request.operation in CREATING_OPERATIONS:
        return auto.create_or_select_stack(stack_name=request.stack, work_dir=str(request.project_dir), opts=opts)
    return auto.select_stack(stack_name=request.stack, work_dir=str(request.project_dir), opts=opts)


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
        return Outcome("failed", EXIT_FAILED, f"pulumi {op} failed: {_last_error_line(e)}", policy_violations=violations)
    n = changed(changes)
    if request.expect_no_changes and n:
        return Outcome("changes-found", EXIT_CHANGES,
                       f"{n} resource change(s) where none were expected: {json.dumps(count_changes(changes))}",
                       resource_changes=dict(changes or {}), outputs=outputs, policy_violations=violations)
    return Outcome("succeeded", EXIT_OK, resource_changes=dict(changes or {}), outputs=outputs,
                   policy_violations=violations)


def _last_error_line(e: Exception) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip().startswith(("error:", "stderr:"))]
    return lines[-1] if lines else type(e).__name__


# --------------------------------------------------------------------------------------
# Entry point


def execute(request: Request) -> int:
    """Validate, check prerequisites, run; print the outcome, write the summary, return the exit code."""
    started = time.perf_counter()
    say = functools.partial(print, flush=True)
    say_err = functools.partial(print, file=sys.stderr, flush=True)

    def finish(outcome: Outcome) -> int:
        if request.summary_path:
            request.summary_path.parent.mkdir(parents=True, exist_ok=True)
            doc = summary(request, outcome, time.perf_counter() - started)
            request.summary_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return outcome.exit_code

    if request.operation in VALIDATED_OPERATIONS:
        from . import render

        try:
            render.load_plan(request.project_dir / "stacks", request.config_stack)
        except (ConfigError, ConfigErrors) as err:
            finish(Outcome("config-error", EXIT_CONFIG, str(err)))
            raise  # cli.main prints it, exactly as `warmstart render` does

    cmd, missing = check_prerequisites(request)
    if missing:
        error = PrerequisitesMissing(request.operation, request.stack, missing)
        say_err(str(error))
        return finish(Outcome("missing-prerequisites", EXIT_PREREQUISITES, str(error), missing=missing))

    from pulumi.automation.errors import CommandError

    try:
        stack = open_stack(request, cmd)
    except CommandError as e:
        say_err(f"warmstart: could not open stack '{request.stack}': {_last_error_line(e)}")
        return finish(Outcome("failed", EXIT_FAILED, f"could not open stack: {_last_error_line(e)}"))
    outcome = run_engine(request, stack, say, say_err)
    if request.operation == "outputs" and outcome.outputs is not None:
        say(json.dumps(outcome.outputs, indent=2, sort_keys=True))
    if outcome.message:
        (say if outcome.exit_code == EXIT_OK else say_err)(f"warmstart: {outcome.message}")
    return finish(outcome)


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
    )
