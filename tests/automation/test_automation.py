"""`warmstart preview | up | destroy | refresh | outputs`, up to the Pulumi CLI boundary.

The engine is faked exactly where the Automation API hands results back: a Stack whose methods
return the API's own result classes (PreviewResult.change_summary, UpResult.summary /
.outputs with OutputValue(value, secret), UpdateSummary.resource_changes) and raise its own
CommandError. Everything before that boundary is real: argument parsing, config validation,
prerequisite detection (with a PATH that has no `pulumi`, or a stand-in `pulumi` script).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto
from pulumi.automation import events
from pulumi.automation._cmd import CommandResult

from tests.support.automation import FakeStack
from tests.support.stacks import ALL_STACK_NAMES, ROOT, load_stack_doc
from warmstart import automation, cli
from warmstart.exit_codes import EXIT_PREFLIGHT

BAD_CONFIG = ROOT / "tests" / "bad_configs" / "bad-cluster-mode.yaml"


# --------------------------------------------------------------------------------------
# Fakes at the Automation API boundary






@pytest.fixture
def engine(monkeypatch):
    """Prerequisites satisfied, the preflight passed (tests/automation/test_preflight.py runs it for real)
    and the Stack faked; returns a setter for the fake."""
    state: dict = {"stack": FakeStack()}
    monkeypatch.setattr(automation.prerequisites, "check_prerequisites", lambda request, env=None: (object(), []))
    monkeypatch.setattr(automation.preflight, "run_preflight", lambda stack_plan, **kw: [])
    monkeypatch.setattr(automation.engine, "open_stack", lambda request, cmd: state["stack"])
    # No STS in tests: the account step notes it and records nothing (see the account tests).
    monkeypatch.setattr(automation.preflight, "caller_account", lambda region: None)

    def use(stack: FakeStack) -> FakeStack:
        state["stack"] = stack
        return stack
    return use


def _no_engine(monkeypatch) -> None:
    def boom(*a, **k):
        raise AssertionError("the engine must not be reached")
    monkeypatch.setattr(automation.prerequisites, "check_prerequisites", boom)
    monkeypatch.setattr(automation.preflight, "run_preflight", boom)
    monkeypatch.setattr(automation.engine, "open_stack", boom)


# --------------------------------------------------------------------------------------
# Argument parsing


def test_engine_commands_parse_their_options():
    args = cli.parser().parse_args(["preview", "--stack", "org/warmstart/prod", "--backend", "s3://state/ws",
                                    "--summary", "out/s.json", "--expect-no-changes", "--policy-config", "p.json"])
    req = automation.request_from_args(args, ROOT)
    assert (req.operation, req.stack, req.config_stack) == ("preview", "org/warmstart/prod", "prod")
    assert req.backend == "s3://state/ws" and req.summary_path == Path("out/s.json")
    assert req.expect_no_changes and req.policy_config == Path("p.json")
    assert req.policy_pack == ROOT / "policy"


@pytest.mark.parametrize("argv", [
    ["preview"],                                       # --stack is required for engine commands
    ["up", "--stack", "dev", "--expect-no-changes"],   # drift checks are preview/refresh only
    ["destroy", "--stack", "dev", "--policy-config", "x"],
    ["outputs", "--stack", "dev", "--expect-no-changes"],
])
def test_engine_commands_reject_what_does_not_apply(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parser().parse_args(argv)
    assert e.value.code == 2


def test_exit_codes_are_distinct():
    codes = [cli.EXIT_OK, cli.EXIT_FAILED, cli.EXIT_CONFIG, cli.EXIT_CHANGES, cli.EXIT_PREREQUISITES, cli.EXIT_POLICY,
             EXIT_PREFLIGHT]
    assert len(set(codes)) == len(codes)


# --------------------------------------------------------------------------------------
# Config errors: exit 2, fast, before any engine call


def _bad_project(tmp_path: Path) -> Path:
    doc = yaml.safe_load(BAD_CONFIG.read_text())
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks" / "Pulumi.bad.yaml").write_text(yaml.safe_dump({"config": doc["config"]}))
    return tmp_path


@pytest.mark.parametrize("op", sorted(automation.VALIDATED_OPERATIONS))
def test_bad_config_exits_2_fast_without_the_engine(op, tmp_path, monkeypatch, capsys):
    expect = yaml.safe_load(BAD_CONFIG.read_text())["expect"]
    monkeypatch.chdir(_bad_project(tmp_path))
    _no_engine(monkeypatch)
    summary = tmp_path / "summary.json"
    started = time.perf_counter()
    rc = cli.main([op, "--stack", "bad", "--summary", str(summary)])
    elapsed = time.perf_counter() - started
    err = capsys.readouterr().err
    assert rc == cli.EXIT_CONFIG
    assert elapsed < 1.0, f"config errors must fail in under a second, took {elapsed:.2f}s"
    assert "invalid stack config" in err and re.search(expect, err) and "fix:" in err
    doc = json.loads(summary.read_text())
    assert (doc["result"], doc["exitCode"], doc["operation"]) == ("config-error", cli.EXIT_CONFIG, op)


def test_same_message_as_render(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(_bad_project(tmp_path))
    _no_engine(monkeypatch)
    assert cli.main(["render", "--stack", "bad"]) == cli.EXIT_CONFIG
    rendered = capsys.readouterr().err
    assert cli.main(["preview", "--stack", "bad"]) == cli.EXIT_CONFIG
    assert capsys.readouterr().err == rendered


def test_destroy_and_outputs_do_not_block_on_config(tmp_path, monkeypatch, engine):
    # A config broken since the last `up` must not stop a teardown or an outputs read.
    monkeypatch.chdir(_bad_project(tmp_path))
    stack = engine(FakeStack(changes={"delete": 3}))
    assert cli.main(["destroy", "--stack", "bad"]) == cli.EXIT_OK
    assert cli.main(["outputs", "--stack", "bad"]) == cli.EXIT_OK
    assert [c[0] for c in stack.calls] == ["destroy", "outputs"]


# --------------------------------------------------------------------------------------
# Missing prerequisites: one message, exit 4




@pytest.mark.servers
def test_missing_cli_says_which_and_how(bare_env, capsys, tmp_path):
    summary = tmp_path / "s.json"
    rc = cli.main(["preview", "--stack", "dev", "--summary", str(summary)])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_PREREQUISITES
    assert err.count("warmstart: cannot run `preview`") == 1, "one message for everything missing"
    assert "Pulumi CLI: `pulumi` is not on PATH" in err and "get.pulumi.com" in err
    for name, version in automation.required_plugins():
        assert f"pulumi plugin install resource {name} v{version}" in err
    assert "AWS credentials" in err and "state backend" in err
    doc = json.loads(summary.read_text())
    assert doc["result"] == "missing-prerequisites" and doc["exitCode"] == cli.EXIT_PREREQUISITES
    assert {m["what"] for m in doc["missingPrerequisites"]} >= {"Pulumi CLI", "AWS credentials", "state backend"}


def _fake_pulumi(bin_dir: Path, plugins: list[dict]) -> None:
    """A stand-in `pulumi`: answers `version` and `plugin ls --json` like the real CLI."""
    script = bin_dir / "pulumi"
    script.write_text("#!/bin/sh\n"
                      'for a in "$@"; do case "$a" in version) echo v3.272.0; exit 0;; ls) '
                      f"echo '{json.dumps(plugins)}'; exit 0;; esac; done\nexit 1\n")
    script.chmod(0o755)


@pytest.mark.servers
def test_missing_plugins_are_named_with_their_install_command(bare_env, capsys, monkeypatch, tmp_path):
    wanted = automation.required_plugins()
    have, *absent = wanted
    _fake_pulumi(bare_env, [{"name": have[0], "kind": "resource", "version": have[1]},
                            {"name": absent[0][0], "kind": "resource", "version": "0.0.1"}])
    monkeypatch.setenv("PULUMI_BACKEND_URL", f"file://{tmp_path}/state")
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example")
    monkeypatch.setattr(automation.prerequisites, "missing_python_env", lambda request: [])
    monkeypatch.setattr(automation.prerequisites, "missing_aws_cli", lambda: [])
    rc = cli.main(["preview", "--stack", "dev"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_PREREQUISITES
    assert "1 prerequisite missing" in err and "provider plugins" in err
    for name, version in absent:
        assert f"pulumi plugin install resource {name} v{version}" in err
    assert f"resource {have[0]} v{have[1]}" not in err


def test_required_plugins_follow_the_pinned_provider_sdks():
    pins = dict(re.findall(r'"pulumi-([a-z-]+)==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()))
    pins.pop("policy", None)
    assert {n: v for n, v in automation.required_plugins()} == pins


@pytest.mark.servers
def test_real_cli_run_without_pulumi_exits_with_the_missing_cli_message(tmp_path):
    """`warmstart preview --stack dev` for real, in a subprocess, with no `pulumi` on PATH."""
    exe = Path(sys.executable).parent / "warmstart"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-c", "import sys; from warmstart.cli import main; sys.exit(main())"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PULUMI_"))}
    env |= {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true"}
    assert not any((Path(p) / "pulumi").exists() for p in env["PATH"].split(os.pathsep))
    proc = subprocess.run([*argv, "preview", "--stack", "dev"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == cli.EXIT_PREREQUISITES, proc.stderr
    assert "Pulumi CLI: `pulumi` is not on PATH" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.servers
def test_passphrase_is_required_for_self_managed_backends_only(tmp_path):
    req = automation.Request("preview", "dev", ROOT, backend=f"file://{tmp_path}")

    def missing(env):
        return [m.what for m in automation.check_prerequisites(req, env)[1] if m.what == "secrets passphrase"]
    assert missing({}) == ["secrets passphrase"]
    assert missing({"PULUMI_CONFIG_PASSPHRASE_FILE": str(tmp_path / "nope")}) == ["secrets passphrase"]
    (tmp_path / "pass").write_text("x")
    assert missing({"PULUMI_CONFIG_PASSPHRASE_FILE": str(tmp_path / "pass")}) == []
    cloud = automation.Request("preview", "org/warmstart/dev", ROOT, backend="https://api.pulumi.com")
    assert not [m for m in automation.check_prerequisites(cloud, {})[1] if m.what == "secrets passphrase"]


def test_aws_credentials_detection(tmp_path):
    home = tmp_path / "home"
    assert automation.aws_credentials_source({"HOME": str(home)})[0] is None
    assert automation.aws_credentials_source({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"})[0]
    assert automation.aws_credentials_source({"AWS_ROLE_ARN": "arn", "AWS_WEB_IDENTITY_TOKEN_FILE": "/t"})[0]
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "config").write_text("[profile ci]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = b\n")
    assert automation.aws_credentials_source({"HOME": str(home)})[0] is None  # `default` has nothing
    assert "profile 'ci'" in automation.aws_credentials_source({"HOME": str(home), "AWS_PROFILE": "ci"})[0]


# --------------------------------------------------------------------------------------
# The engine path, faked at the Automation API boundary


def test_preview_and_up_run_the_policy_pack_and_stream_output(engine, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    stack = engine(FakeStack())
    assert cli.main(["preview", "--stack", "dev"]) == cli.EXIT_OK
    assert cli.main(["up", "--stack", "dev", "--policy-config", "cfg.json"]) == cli.EXIT_OK
    (_, preview), (_, up) = stack.calls
    assert preview["policy_packs"] == [str(ROOT / "policy")] == up["policy_packs"]
    assert up["policy_pack_configs"] == ["cfg.json"]
    assert "fake engine output for preview" in capsys.readouterr().out


def test_up_summary_shape_and_masked_secrets(engine, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    engine(FakeStack(changes={"create": 4, "update": 1, "delete": 2, "replace": 1, "create-replacement": 1,
                              "delete-replaced": 1, "same": 30},
                     outputs={"services": auto.OutputValue({"llama": "llama.inference"}, False),
                              "token": auto.OutputValue("s3cr3t-value", True)}))
    path = tmp_path / "ci" / "summary.json"
    assert cli.main(["up", "--stack", "dev", "--summary", str(path)]) == cli.EXIT_OK
    text = path.read_text()
    doc = json.loads(text)
    assert "s3cr3t-value" not in text
    assert set(doc) >= {"operation", "stack", "result", "exitCode", "counts", "outputs", "resourceChanges"}
    assert (doc["operation"], doc["stack"], doc["result"], doc["exitCode"]) == ("up", "dev", "succeeded", 0)
    assert doc["counts"] == {"created": 4, "updated": 1, "deleted": 2, "replaced": 1, "same": 30}
    assert doc["outputs"] == {"services": {"llama": "llama.inference"}, "token": "[secret]"}


def test_outputs_prints_masked_json(engine, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    engine(FakeStack(outputs={"a": auto.OutputValue(1, False), "b": auto.OutputValue("pw", True)}))
    assert cli.main(["outputs", "--stack", "dev"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out) == {"a": 1, "b": "[secret]"}
    assert cli.main(["outputs", "--stack", "dev", "--show-secrets"]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out) == {"a": 1, "b": "pw"}


@pytest.mark.parametrize("changes, expected", [
    ({"same": 40}, cli.EXIT_OK),
    ({"same": 40, "read": 2}, cli.EXIT_OK),
    ({"same": 39, "update": 1}, cli.EXIT_CHANGES),
    ({"same": 38, "create": 2}, cli.EXIT_CHANGES),
])
def test_preview_drift_check(changes, expected, engine, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    engine(FakeStack(changes=changes))
    path = tmp_path / "s.json"
    assert cli.main(["preview", "--stack", "dev", "--expect-no-changes", "--summary", str(path)]) == expected
    doc = json.loads(path.read_text())
    assert doc["result"] == ("changes-found" if expected else "succeeded")
    # Without the flag, changes are the point of a preview.
    assert cli.main(["preview", "--stack", "dev"]) == cli.EXIT_OK


def test_refresh_drift_check_does_not_write_state(engine, monkeypatch):
    monkeypatch.chdir(ROOT)
    stack = engine(FakeStack(changes={"same": 10, "update": 1}))
    assert cli.main(["refresh", "--stack", "dev", "--expect-no-changes"]) == cli.EXIT_CHANGES
    assert cli.main(["refresh", "--stack", "dev"]) == cli.EXIT_OK
    assert [c[0] for c in stack.calls] == ["preview_refresh", "refresh"]
    assert "policy_packs" not in stack.calls[0][1]


def test_mandatory_policy_violation_exits_5_with_the_violation(engine, monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(ROOT)
    violation = events.PolicyEvent(message="bucket has no public access block", color="never",
                                   policy_name="s3-bucket-guardrails", policy_pack_name="warmstart-guardrails",
                                   policy_pack_version="0.1.0", policy_pack_version_tag="0.1.0",
                                   enforcement_level="mandatory", resource_urn="urn:pulumi:dev::warmstart::b")
    engine(FakeStack(fail=True, policy_events=[violation]))
    path = tmp_path / "s.json"
    assert cli.main(["up", "--stack", "dev", "--summary", str(path)]) == cli.EXIT_POLICY
    doc = json.loads(path.read_text())
    assert doc["result"] == "policy-violation"
    assert doc["policyViolations"][0]["policy"] == "s3-bucket-guardrails"
    assert "s3-bucket-guardrails" in capsys.readouterr().err


def test_engine_failure_exits_1(engine, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    advisory = events.PolicyEvent(message="m", color="never", policy_name="p", policy_pack_name="x",
                                  policy_pack_version="1", policy_pack_version_tag="1", enforcement_level="advisory")
    engine(FakeStack(fail=True, policy_events=[advisory]))
    path = tmp_path / "s.json"
    assert cli.main(["up", "--stack", "dev", "--summary", str(path)]) == cli.EXIT_FAILED
    doc = json.loads(path.read_text())
    assert doc["result"] == "failed" and "update failed" in doc["message"]


@pytest.mark.parametrize("op, creates", [("preview", True), ("up", True), ("destroy", False),
                                          ("refresh", False), ("outputs", False)])
def test_open_stack_uses_a_local_workspace_over_the_project(op, creates, monkeypatch):
    seen = {}

    def fake(kind):
        def f(stack_name, work_dir, opts):
            seen.update(kind=kind, stack_name=stack_name, work_dir=work_dir, env=opts.env_vars,
                        cmd=opts.pulumi_command)
            return "stack"
        return f
    monkeypatch.setattr(auto, "create_or_select_stack", fake("create_or_select"))
    monkeypatch.setattr(auto, "select_stack", fake("select"))
    cmd = object()
    req = automation.Request(op, "dev", ROOT, backend="s3://state/warmstart")
    assert automation.open_stack(req, cmd) == "stack"
    assert seen == {"kind": "create_or_select" if creates else "select", "stack_name": "dev",
                    "work_dir": str(ROOT), "env": {"PULUMI_BACKEND_URL": "s3://state/warmstart"}, "cmd": cmd}


# --------------------------------------------------------------------------------------
# accountId: recorded for a new stack that derives a bucket name, never for a deployed one


ACCOUNT = "111122223333"


def _boom(what: str):
    def f(*a, **k):
        raise AssertionError(f"{what} must not be called")
    return f


@pytest.fixture
def account_project(tmp_path, monkeypatch, engine):
    """A project in tmp_path with the shipped dev stack file, STS answering ACCOUNT, a new
    stack (no state) and the preflight recording the plan it is given. Returns (stack file,
    FakeStack, what the preflight saw)."""
    from warmstart.automation import account

    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks").mkdir()
    path = tmp_path / "stacks" / "Pulumi.dev.yaml"
    path.write_text((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(automation.preflight, "caller_account", lambda region: ACCOUNT)
    monkeypatch.setattr(automation.engine, "deployed_resources", lambda request, cmd: [])
    seen: dict = {}
    monkeypatch.setattr(automation.preflight, "run_preflight", lambda stack_plan, **kw: seen.update(plan=stack_plan, **kw) or [])
    stack = engine(FakeStack())
    stack.config_file = path
    assert account.ACCOUNT_KEY == "warmstart:accountId"
    return path, stack, seen


def _offline_plan(stacks_dir: Path, stack: str = "dev"):
    from warmstart import render
    return render.load_plan(stacks_dir, stack)[1]


@pytest.mark.parametrize("op", ["preview", "up"])
def test_a_new_stack_gets_the_deployers_account_recorded(op, account_project, capsys):
    from warmstart.decisions import naming

    path, stack, seen = account_project
    before = _offline_plan(path.parent)
    assert before.config.account_id is None
    assert cli.main([op, "--stack", "dev"]) == cli.EXIT_OK
    # Recorded through the Automation API, after the preflight and before the engine runs.
    assert [c[0] for c in stack.calls] == ["set_config", op]
    assert stack.calls[0][1] == {"key": "warmstart:accountId", "value": ACCOUNT, "secret": False}
    assert yaml.safe_load(path.read_text())["config"]["warmstart:accountId"] == ACCOUNT
    # The derived names now include the account, in the preflight's plan and in the file's.
    after = _offline_plan(path.parent)
    models = naming.bucket_name("ws-dev", "models", "dev", "us-west-2", ACCOUNT)
    cache = naming.bucket_name("ws-dev", "compile-cache", "dev", "us-west-2", ACCOUNT)
    assert after.derived_bucket_names == [models, cache] == seen["plan"].derived_bucket_names
    assert set(after.derived_bucket_names).isdisjoint(before.derived_bucket_names)
    assert after.models[0].source == f"s3://{models}/meta-llama/Llama-3.1-8B-Instruct" == seen["plan"].models[0].source
    assert after.config.account_id == ACCOUNT == seen["account_id"]
    out = capsys.readouterr().out.splitlines()
    (line,) = [ln for ln in out if "recorded warmstart:accountId" in ln]
    assert f'"{ACCOUNT}"' in line and "stacks/Pulumi.dev.yaml" in line and models in line and "commit the file" in line
    # The next run finds it set and leaves everything alone.
    text = path.read_text()
    assert cli.main([op, "--stack", "dev"]) == cli.EXIT_OK
    assert path.read_text() == text and [c[0] for c in stack.calls].count("set_config") == 1


def test_a_deployed_stack_without_account_id_is_left_alone_with_a_note(account_project, monkeypatch, capsys):
    path, stack, seen = account_project
    text = path.read_text()
    monkeypatch.setattr(automation.engine, "deployed_resources",
                        lambda request, cmd: [{"type": "aws:ec2/vpc:Vpc", "id": "vpc-0123456789abcdef0"}])
    assert cli.main(["up", "--stack", "dev"]) == cli.EXIT_OK
    assert path.read_text() == text
    assert [c[0] for c in stack.calls] == ["up"]
    assert seen["plan"].derived_bucket_names == _offline_plan(path.parent).derived_bucket_names
    err = capsys.readouterr().err
    (note,) = [ln for ln in err.splitlines() if "warmstart: note:" in ln]
    assert "has deployed resources and no warmstart:accountId" in note and "nothing is recorded" in note


def test_deployed_buckets_named_with_the_account_but_no_account_id_is_an_error(account_project, monkeypatch, capsys):
    """accountId was recorded once and the file not committed (a CI checkout): without it the
    run would rename, i.e. replace, the buckets."""
    from warmstart.decisions import naming

    path, stack, seen = account_project
    text = path.read_text()
    deployed = naming.bucket_name("ws-dev", "models", "dev", "us-west-2", ACCOUNT)
    monkeypatch.setattr(automation.engine, "deployed_resources", lambda request, cmd: [
        {"type": "aws:s3/bucket:Bucket", "id": deployed, "outputs": {"bucket": deployed}}])
    assert cli.main(["up", "--stack", "dev"]) == cli.EXIT_CONFIG
    assert stack.calls == [] and "plan" not in seen and path.read_text() == text
    err = capsys.readouterr().err
    assert f"warmstart:accountId: stack 'dev' has deployed bucket(s) {deployed}" in err
    assert f'add `warmstart:accountId: "{ACCOUNT}"` to stacks/Pulumi.dev.yaml and commit it' in err


def test_a_stack_with_account_id_set_is_left_alone(account_project, monkeypatch):
    path, stack, seen = account_project
    path.write_text(path.read_text() + '  warmstart:accountId: "444455556666"\n')
    text = path.read_text()
    monkeypatch.setattr(automation.preflight, "caller_account", _boom("STS"))
    monkeypatch.setattr(automation.engine, "deployed_resources", _boom("the state lookup"))
    assert cli.main(["up", "--stack", "dev"]) == cli.EXIT_OK
    assert path.read_text() == text and [c[0] for c in stack.calls] == ["up"]
    assert seen["plan"].config.account_id == "444455556666" and "account_id" not in seen


def test_a_stack_naming_both_buckets_is_left_alone(account_project, monkeypatch):
    path, stack, seen = account_project
    doc = yaml.safe_load(path.read_text())
    doc["config"]["warmstart:modelBucket"] = {"name": "team-weights"}
    doc["config"]["warmstart:compileCacheBucket"] = {"name": "team-compile-cache"}
    path.write_text(yaml.safe_dump(doc))
    text = path.read_text()
    monkeypatch.setattr(automation.preflight, "caller_account", _boom("STS"))
    monkeypatch.setattr(automation.engine, "deployed_resources", _boom("the state lookup"))
    assert cli.main(["up", "--stack", "dev"]) == cli.EXIT_OK
    assert path.read_text() == text and [c[0] for c in stack.calls] == ["up"]
    assert seen["plan"].derived_bucket_names == []
    assert seen["plan"].models[0].source == "s3://team-weights/meta-llama/Llama-3.1-8B-Instruct"


def test_a_drift_check_never_records(account_project, monkeypatch):
    path, stack, _ = account_project
    text = path.read_text()
    monkeypatch.setattr(automation.preflight, "caller_account", _boom("STS"))
    assert cli.main(["preview", "--stack", "dev", "--expect-no-changes"]) == cli.EXIT_OK
    assert path.read_text() == text and [c[0] for c in stack.calls] == ["preview"]


def test_without_sts_nothing_is_recorded_and_a_note_says_so(account_project, monkeypatch, capsys):
    path, stack, _ = account_project
    text = path.read_text()
    monkeypatch.setattr(automation.preflight, "caller_account", lambda region: None)
    monkeypatch.setattr(automation.engine, "deployed_resources", _boom("the state lookup"))
    assert cli.main(["preview", "--stack", "dev"]) == cli.EXIT_OK
    assert path.read_text() == text and [c[0] for c in stack.calls] == ["preview"]
    assert "could not resolve the deployer's AWS account" in capsys.readouterr().err


def test_a_record_that_misses_the_stack_file_stops_before_the_engine(account_project, capsys):
    path, stack, _ = account_project
    stack.config_file = None  # `pulumi config set` wrote somewhere else
    assert cli.main(["up", "--stack", "dev"]) == cli.EXIT_FAILED
    assert [c[0] for c in stack.calls] == ["set_config"]
    assert "could not record warmstart:accountId" in capsys.readouterr().err


def test_deployed_resources_selects_the_stack_and_ignores_the_root_and_providers(monkeypatch):
    from pulumi.automation.errors import StackNotFoundError

    class Exported:
        def export_stack(self):
            return auto.Deployment(version=3, deployment={"resources": [
                {"type": "pulumi:pulumi:Stack", "urn": "urn:pulumi:dev::warmstart::pulumi:pulumi:Stack::warmstart-dev"},
                {"type": "pulumi:providers:aws", "id": "p"}], "pending_operations": []})

    def created(*a, **k):
        raise AssertionError("the state lookup must never create the stack")
    monkeypatch.setattr(auto, "create_or_select_stack", created)
    req = automation.Request("up", "dev", ROOT)
    monkeypatch.setattr(auto, "select_stack", lambda **kw: Exported())
    assert automation.deployed_resources(req, object()) == []
    bucket = {"type": "aws:s3/bucket:Bucket", "id": "ws-dev-models-0"}
    Exported.export_stack = lambda self: auto.Deployment(version=3, deployment={
        "resources": [], "pending_operations": [{"resource": bucket, "type": "creating"}]})
    assert automation.deployed_resources(req, object()) == [bucket]

    def missing(**kw):
        raise StackNotFoundError(CommandResult(stdout="", stderr="error: no stack named 'dev' found", code=255))
    monkeypatch.setattr(auto, "select_stack", missing)
    assert automation.deployed_resources(req, object()) == []


def test_render_notes_that_up_records_the_account(tmp_path):
    from warmstart import render

    note = "`warmstart up` (or `preview`) of a stack with no resources yet records the deployer's account"
    table = render.table(_offline_plan(ROOT / "stacks"))
    assert note in table and "warmstart:accountId is not set" in table
    assert all(n in table for n in _offline_plan(ROOT / "stacks").derived_bucket_names)
    (tmp_path / "stacks").mkdir()
    doc = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    (tmp_path / "stacks" / "Pulumi.a.yaml").write_text(yaml.safe_dump(
        {"config": doc["config"] | {"warmstart:accountId": ACCOUNT}}))
    (tmp_path / "stacks" / "Pulumi.named.yaml").write_text(yaml.safe_dump({"config": doc["config"] | {
        "warmstart:modelBucket": {"name": "team-weights"}, "warmstart:compileCacheBucket": {"name": "team-cache"}}}))
    assert _offline_plan(tmp_path / "stacks", "a").config.account_id == ACCOUNT  # a quoted id stays a string
    for stack in ("a", "named"):
        assert "accountId" not in render.table(_offline_plan(tmp_path / "stacks", stack))


# --------------------------------------------------------------------------------------
# The CI workflow


WORKFLOW = ROOT / ".github" / "workflows" / "warmstart.yml"


def test_workflow_runs_the_readme_tests_and_the_engine_commands():
    text = WORKFLOW.read_text()
    doc = yaml.safe_load(text)
    readme = (ROOT / "README.md").read_text()
    test_command = re.search(r"```sh\n(.*?)```", readme, re.S).group(1).strip().splitlines()[1]
    # The test job runs .ci/run, which runs the README's test command (tests/test_readme.py).
    assert ".ci/run" in [s.get("run") for s in doc["jobs"]["test"]["steps"]], "the test job runs .ci/run"
    assert test_command in (ROOT / ".ci" / "run").read_text(), "the workflow must run the README's test command"
    triggers = doc.get("on", doc.get(True))
    assert {"pull_request", "push", "schedule"} <= set(triggers)
    runs = "\n".join(s.get("run", "") for job in doc["jobs"].values() for s in job.get("steps", []))
    for needle in ("warmstart preview --stack", "warmstart up --stack", "--expect-no-changes", "--summary"):
        assert needle in runs, needle
    # The shipped stacks, named (a stack file of the user's own is not in the matrix).
    stacks = {s: load_stack_doc(s)["config"] for s in ALL_STACK_NAMES}
    for job in ("preview", "up", "drift"):
        matrix = doc["jobs"][job]["strategy"]["matrix"]
        assert sorted(matrix["stack"]) == sorted(stacks), f"{job}: the matrix must list every shipped stack"
        regions = {i["stack"]: i["region"] for i in matrix["include"]}
        # A model stack runs in its platform's region.
        assert regions == {s: stacks[c.get("warmstart:platform", s)]["warmstart:region"] for s, c in stacks.items()}, \
            f"{job}: region per stack"
        order = matrix["stack"]
        for s, c in stacks.items():
            if "warmstart:platform" in c:
                assert order.index(c["warmstart:platform"]) < order.index(s), f"{job}: {s} after its platform"
    assert "environment" in doc["jobs"]["up"], "up runs in a GitHub environment (approvals for prod)"
    assert "PULUMI_CONFIG_PASSPHRASE: ${{ secrets." in text, "the passphrase only ever comes from a secret"


def test_a_private_only_cluster_says_preview_and_up_must_run_inside_the_vpc(engine, monkeypatch, tmp_path, capsys):
    """cluster.endpointPublicAccess: false renders (the private endpoint only) and the engine
    commands say where they must run before they start; a public cluster says nothing."""
    doc = load_stack_doc("dev")
    doc["config"]["warmstart:cluster"] = dict(doc["config"].get("warmstart:cluster") or {}) | {
        "endpointPublicAccess": False}
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text((ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "stacks" / "Pulumi.dev.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "stacks" / "Pulumi.public.yaml").write_text(yaml.safe_dump(load_stack_doc("dev")))
    monkeypatch.chdir(tmp_path)
    engine(FakeStack())
    for op in ("preview", "up"):
        assert cli.main([op, "--stack", "dev"]) == cli.EXIT_OK
        err = capsys.readouterr().err
        assert "no public API endpoint" in err and "inside the VPC" in err and f"`warmstart {op}`" in err, err
    assert cli.main(["preview", "--stack", "public"]) == cli.EXIT_OK
    assert "no public API endpoint" not in capsys.readouterr().err
