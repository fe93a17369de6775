"""Every prerequisite of an engine command, checked before the engine runs and reported at once:
the Pulumi CLI, provider plugins, the Python environment Pulumi runs the program and the policy
pack in, the AWS CLI v2, AWS credentials, boto3 for the preflight, the state backend and the
secrets passphrase."""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import yaml

from .request import ENGINE_OPERATIONS, POLICY_OPERATIONS, Missing, Request

PULUMI_INSTALL = (
    "install the Pulumi CLI {version}: `curl -fsSL https://get.pulumi.com | sh -s -- --version {version}` "
    "and put ~/.pulumi/bin on PATH (GitHub Actions: `pulumi/actions@v6` with `pulumi-version: {version}`)"
)


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


AWS_CLI_INSTALL = (
    "install the AWS CLI v2 (https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html; "
    "Linux x86_64: `curl -fsSL https://awscli.amazonaws.com/awscli-exe-linux-x86_64.zip -o awscliv2.zip && "
    "unzip -q awscliv2.zip && sudo ./aws/install`; GitHub-hosted runners have it) and put it first on PATH; "
    "the `awscli` package from pip is v1: uninstall it"
)


def missing_aws_cli() -> list[Missing]:
    """The AWS CLI v2 on PATH: the kubeconfig pulumi-eks writes runs `aws eks get-token`, so every
    engine operation that reaches the cluster needs it."""
    path = shutil.which("aws")
    if path is None:
        return [Missing("AWS CLI v2", "`aws` is not on PATH (the cluster's kubeconfig runs "
                        "`aws eks get-token`)", AWS_CLI_INSTALL)]
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return [Missing("AWS CLI v2", f"`{path} --version` failed ({err})", AWS_CLI_INSTALL)]
    # `aws-cli/2.27.0 Python/3.13.2 ...` on stdout; older v1 releases print it on stderr.
    text = f"{proc.stdout}\n{proc.stderr}"
    found = re.search(r"aws-cli/(\d+)\.[\w.]+", text)
    if proc.returncode != 0 or found is None:
        first = (text.strip().splitlines() or ["no output"])[0]
        return [Missing("AWS CLI v2", f"`{path} --version` did not report a version "
                        f"(exit {proc.returncode}: {first})", AWS_CLI_INSTALL)]
    if int(found[1]) < 2:
        return [Missing("AWS CLI v2", f"{path} is {found[0]}, not v2 (the cluster's kubeconfig runs "
                        "`aws eks get-token`)", AWS_CLI_INSTALL)]
    return []


def _pinned(dist: str) -> str | None:
    """The version warmstart's pyproject.toml pins `dist` at (in any extra), if any."""
    for req in metadata.requires("warmstart") or []:
        found = re.match(rf"{re.escape(dist)}\s*==\s*([\w.]+)", req)
        if found:
            return found[1]
    return None


def missing_boto3() -> list[Missing]:
    """boto3 in the environment `warmstart` runs in: the preflight reads S3 with it."""
    try:
        metadata.version("boto3")
    except metadata.PackageNotFoundError:
        version = _pinned("boto3")
        spec = f"boto3=={version}" if version else "boto3"
        return [Missing("boto3", "not installed in the Python environment running warmstart (the "
                        "preflight checks the models' weights in S3 with it)",
                        f"`pip install '{spec}'` into that environment, or pass --skip-preflight")]
    return []


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
    from ..config import stack_file

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
        missing += missing_aws_cli()
    if request.runs_preflight:
        missing += missing_boto3()

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
