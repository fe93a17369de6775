"""`warmstart preview | up | refresh | destroy --env ENV`, up to the Pulumi CLI boundary.

The engine is faked where tests/automation/test_automation.py fakes it: `engine.open_stack` hands back a
Stack (FakeStack, the Automation API's own result classes and CommandError) per stack name, and
every engine call is recorded, in order, across the threads the model stacks run in. Everything
before it is real: argument parsing, the environment's stack files, the single-stack path each
stack goes through, the summary and the exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from pulumi import automation as auto
from pulumi.automation._cmd import CommandResult
from pulumi.automation.errors import StackNotFoundError

from tests.support.automation import FakeStack
from tests.support.stacks import ROOT
from warmstart import automation, cli, config, render
from warmstart.automation import environment
from warmstart.errors import ConfigError, ConfigErrors

MODELS = ("dev-a", "dev-b", "dev-c")
PLATFORM_OUTPUTS = {environment.PLATFORM_OUTPUT: auto.OutputValue({"clusterName": "ws-dev"}, False)}


# --------------------------------------------------------------------------------------
# A project in tmp_path: platform stacks dev and prod, model stacks of each


def _model_file(stacks: Path, name: str, platform: str) -> None:
    (stacks / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": {
        config.PLATFORM_KEY: platform, "warmstart:model": {"name": name.split("-", 1)[1]}}}))


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    for platform in ("dev", "prod"):
        (stacks / f"Pulumi.{platform}.yaml").write_text((ROOT / "stacks" / f"Pulumi.{platform}.yaml").read_text())
    for name in reversed(MODELS):  # created out of order: the environment sorts them
        _model_file(stacks, name, "dev")
    _model_file(stacks, "prod-x", "prod")
    monkeypatch.chdir(tmp_path)
    # A model stack's own config (`warmstart:model`) is the model-stack program's to validate and
    # is tested there; here each model stack goes through the single-stack path with its
    # platform's plan, and a platform stack with its own.
    real = render.load_plan

    def load_plan(stacks_dir, stack):
        raw = config.read_stack_file(config.stack_file(stacks_dir, stack))
        return real(stacks_dir, raw.get(config.PLATFORM_KEY, stack))
    monkeypatch.setattr(render, "load_plan", load_plan)
    return tmp_path


class Recorder:
    """The engine boundary of every stack: what was opened and run, in order, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[tuple[str, str, str]] = []
        self.stacks: dict[str, FakeStack] = {}
        self.not_in_backend: set[str] = set()
        self.barrier: threading.Barrier | None = None
        """When set, every model stack's operation waits for all of them: only a concurrent run passes."""

    def record(self, *event: str) -> None:
        with self.lock:
            self.log.append(event)

    def stack(self, name: str, **kw) -> FakeStack:
        recorder = self

        class Recorded(FakeStack):
            def _run(self, op, kwargs):
                recorder.record("start", name, op)
                try:
                    if recorder.barrier is not None and name != "dev":
                        recorder.barrier.wait(timeout=20)
                    super()._run(op, kwargs)
                finally:
                    recorder.record("end", name, op)

            def outputs(self):
                recorder.record("outputs", name, "")
                return super().outputs()
        self.stacks[name] = Recorded(**kw)
        return self.stacks[name]

    def open_stack(self, request, cmd):
        self.record("open", request.stack, request.operation)
        if request.stack in self.not_in_backend and request.operation not in automation.CREATING_OPERATIONS:
            raise StackNotFoundError(CommandResult(stdout="", stderr=f"error: no stack named '{request.stack}' found",
                                                   code=255))
        return self.stacks[request.stack]

    def ops(self, kind: str = "start") -> list[tuple[str, str]]:
        return [(s, op) for k, s, op in self.log if k == kind]

    def index(self, kind: str, stack: str) -> int:
        return next(i for i, e in enumerate(self.log) if e[0] == kind and e[1] == stack)


@pytest.fixture
def engine(project, monkeypatch) -> Recorder:
    """Prerequisites satisfied, the preflight passed, no STS; a deployed platform with its
    outputs and three model stacks that succeed."""
    rec = Recorder()
    monkeypatch.setattr(automation.prerequisites, "check_prerequisites", lambda request, env=None: (object(), []))
    monkeypatch.setattr(automation.preflight, "run_preflight", lambda stack_plan, **kw: [])
    monkeypatch.setattr(automation.preflight, "caller_account", lambda region: None)
    monkeypatch.setattr(automation.engine, "open_stack", rec.open_stack)
    rec.stack("dev", changes={"same": 40, "update": 1}, outputs=PLATFORM_OUTPUTS)
    for name in MODELS:
        rec.stack(name, changes={"same": 9, "create": 2})
    return rec


def _summary(path: Path) -> dict:
    return json.loads(path.read_text())


def _rows(doc: dict) -> dict[str, dict]:
    return {s["stack"]: s for s in doc["stacks"]}


# --------------------------------------------------------------------------------------
# Which stacks an environment has


def test_model_stacks_are_the_files_naming_the_platform_sorted(project):
    stacks = project / "stacks"
    assert environment.model_stacks(stacks, "dev") == list(MODELS)
    assert environment.model_stacks(stacks, "prod") == ["prod-x"]
    (stacks / "Pulumi.prod-x.yaml").unlink()
    assert environment.model_stacks(stacks, "prod") == []


@pytest.mark.parametrize("env, expect", [
    ("staging", "--env='staging': no platform stack file stacks/Pulumi.staging.yaml; "
                "fix: pick one of the platform stacks: dev, prod"),
    ("dev-a", "--env='dev-a': stacks/Pulumi.dev-a.yaml is a model stack (it has warmstart:platform: dev)"),
])
def test_unknown_env_is_a_config_error_before_any_engine_call(env, expect, engine, capsys):
    with pytest.raises(ConfigErrors) as err:
        environment.model_stacks(Path("stacks"), env)
    assert expect in str(err.value)
    path = Path("env.json")
    assert cli.main(["up", "--env", env, "--summary", str(path)]) == cli.EXIT_CONFIG
    out = capsys.readouterr()
    assert expect in out.err and "Traceback" not in out.err
    assert engine.log == []
    doc = _summary(path)
    assert (doc["result"], doc["exitCode"], doc["environment"]) == ("config-error", cli.EXIT_CONFIG, env)
    assert expect in doc["message"]


def test_a_model_stack_naming_a_missing_platform_names_both(engine, project, capsys):
    _model_file(project / "stacks", "stg-a", "stg")
    assert cli.main(["up", "--env", "dev"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert ("stacks/Pulumi.stg-a.yaml: warmstart:platform='stg': model stack 'stg-a' names platform stack 'stg', "
            "but there is no stacks/Pulumi.stg.yaml") in err
    assert "set it to one of the platform stacks (dev, prod)" in err
    assert engine.log == [], "a misspelt platform stops every environment before the engine"


def test_a_model_stack_naming_a_model_stack_is_an_error(project):
    _model_file(project / "stacks", "dev-z", "dev-a")
    with pytest.raises(ConfigErrors, match="'dev-z' names 'dev-a', which is itself a model stack"):
        environment.model_stacks(project / "stacks", "dev")


def test_every_stacks_config_is_validated_before_any_engine_call(engine, monkeypatch, capsys):
    validated = render.load_plan

    def load_plan(stacks_dir, stack):
        if stack in ("dev-b", "dev-c"):
            raise ConfigError("warmstart:model.pool", f"{stack}: no such pool", "name a pool of platform dev")
        return validated(stacks_dir, stack)
    monkeypatch.setattr(render, "load_plan", load_plan)
    assert cli.main(["up", "--env", "dev"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "invalid stack config (2 problems)" in err
    for name in ("dev-b", "dev-c"):
        assert f"stacks/Pulumi.{name}.yaml: warmstart:model.pool: {name}: no such pool" in err
    assert engine.log == []


# --------------------------------------------------------------------------------------
# up / preview / refresh: the platform first, then its model stacks at once


def test_up_runs_the_platform_then_every_model_stack_concurrently(engine, project, capsys):
    engine.barrier = threading.Barrier(len(MODELS))
    path = project / "out" / "env.json"
    assert cli.main(["up", "--env", "dev", "--summary", str(path)]) == cli.EXIT_OK
    assert engine.ops()[0] == ("dev", "up")
    assert sorted(engine.ops()[1:]) == [(m, "up") for m in MODELS]
    platform_done = engine.index("end", "dev")
    assert all(engine.index("open", m) > platform_done for m in MODELS), \
        "no model stack is opened before the platform is up"
    # Each stack ran through the single-stack path: the policy pack, its own stack name.
    assert all(s.calls[0][1]["policy_packs"] == [str(project / "policy")] for s in engine.stacks.values())

    doc = _summary(path)
    assert (doc["environment"], doc["operation"], doc["result"], doc["exitCode"]) == ("dev", "up", "succeeded", 0)
    assert [s["stack"] for s in doc["stacks"]] == ["dev", *MODELS]
    assert [s["role"] for s in doc["stacks"]] == ["platform", "model", "model", "model"]
    rows = _rows(doc)
    assert rows["dev"]["counts"]["updated"] == 1 and rows["dev-a"]["counts"]["created"] == 2
    assert rows["dev-b"]["summary"]["stack"] == "dev-b", "each stack's own --summary document is kept"

    out = capsys.readouterr().out
    for m in MODELS:
        assert f"[{m}] fake engine output for up" in out, "live output is labelled with its stack"
    table = out[out.index("STACK"):]
    assert [ln.split()[0] for ln in table.splitlines()[1:5]] == ["dev", *MODELS]
    assert "2 created" in table and "1 updated" in table
    assert "up of environment 'dev': 4 stack(s), 4 succeeded" in out


def test_the_platform_failing_stops_everything_after_it(engine, project, capsys):
    engine.stacks["dev"].fail = True
    path = project / "env.json"
    assert cli.main(["up", "--env", "dev", "--summary", str(path)]) == cli.EXIT_FAILED
    assert engine.ops() == [("dev", "up")]
    rows = _rows(_summary(path))
    assert rows["dev"]["result"] == "failed" and "update failed" in rows["dev"]["message"]
    assert {rows[m]["result"] for m in MODELS} == {"skipped"}
    assert rows["dev-a"]["message"] == "skipped: platform dev did not up (failed)"


def test_one_model_stack_failing_does_not_stop_the_others(engine, project, capsys):
    engine.barrier = threading.Barrier(len(MODELS))
    engine.stacks["dev-b"].fail = True
    path = project / "env.json"
    assert cli.main(["up", "--env", "dev", "--summary", str(path)]) == cli.EXIT_FAILED
    assert sorted(engine.ops("end")) == sorted([("dev", "up"), *((m, "up") for m in MODELS)])
    doc = _summary(path)
    assert (doc["result"], doc["exitCode"]) == ("failed", cli.EXIT_FAILED)
    rows = _rows(doc)
    assert {m: rows[m]["result"] for m in MODELS} == {"dev-a": "succeeded", "dev-b": "failed", "dev-c": "succeeded"}
    captured = capsys.readouterr()
    out = captured.out
    (failed,) = [ln for ln in out.splitlines() if ln.startswith("dev-b ")]
    assert failed.split()[:4] == ["dev-b", "model", "up", "failed"] and "update failed" in failed
    assert "[dev-b] warmstart: pulumi up failed" in captured.err, "the full message, labelled, as it happened"
    assert "4 stack(s), 3 succeeded, 1 failed" in out


@pytest.mark.parametrize("drift, fail, expected", [
    ((), (), cli.EXIT_OK),
    (("dev-a",), (), cli.EXIT_CHANGES),
    (("dev", "dev-a"), ("dev-c",), cli.EXIT_FAILED),  # an error outranks drift
])
def test_drift_check_of_an_environment_exits_with_the_worst_result(drift, fail, expected, engine, project):
    for name, stack in engine.stacks.items():
        stack.changes = {"same": 10, "update": 1} if name in drift else {"same": 10}
        stack.fail = name in fail
    path = project / "env.json"
    assert cli.main(["refresh", "--env", "dev", "--expect-no-changes", "--summary", str(path)]) == expected
    # Drift in the platform is a finding: its model stacks are still checked.
    assert sorted(engine.ops()) == sorted([("dev", "preview_refresh"), *((m, "preview_refresh") for m in MODELS)])
    rows = _rows(_summary(path))
    assert {n for n, r in rows.items() if r["result"] == "changes-found"} == set(drift)


def test_preview_of_an_undeployed_platform_skips_its_model_stacks(engine, project, capsys):
    engine.stacks["dev"].outputs_map = {}  # previewed (created in the backend), never deployed
    path = project / "env.json"
    assert cli.main(["preview", "--env", "dev", "--summary", str(path)]) == cli.EXIT_OK
    assert engine.ops() == [("dev", "preview")]
    assert engine.ops("outputs") == [("dev", "")], "the platform's outputs are read after its preview"
    assert engine.index("outputs", "dev") > engine.index("end", "dev")
    rows = _rows(_summary(path))
    for m in MODELS:
        assert rows[m]["result"] == "skipped"
        assert rows[m]["message"] == "skipped: platform dev has no outputs yet (up it first)"
    out = capsys.readouterr().out
    assert "skipped: platform dev has no outputs yet (up it first)" in out


def test_preview_of_a_deployed_platform_previews_its_model_stacks(engine, project):
    assert cli.main(["preview", "--env", "dev"]) == cli.EXIT_OK
    assert engine.ops()[0] == ("dev", "preview")
    assert sorted(engine.ops()[1:]) == [(m, "preview") for m in MODELS]
    assert engine.index("outputs", "dev") < min(engine.index("start", m) for m in MODELS)


def test_a_qualified_env_qualifies_its_model_stacks(engine, project):
    for name in ["dev", *MODELS]:
        engine.stacks[f"org/warmstart/{name}"] = engine.stacks.pop(name)
    assert cli.main(["up", "--env", "org/warmstart/dev"]) == cli.EXIT_OK
    assert sorted(engine.ops("open")) == sorted((f"org/warmstart/{n}", "up") for n in ["dev", *MODELS])


def test_models_run_at_most_max_parallel_at_once(engine, project, monkeypatch):
    running, peak, started = [0], [0], [0]
    changed = threading.Condition()
    real = engine.open_stack

    def counting(request, cmd):
        stack = real(request, cmd)
        inner = stack.up
        if request.stack not in MODELS:  # the platform runs alone, first
            return stack

        def up(**kw):
            with changed:
                running[0] += 1
                started[0] += 1
                peak[0] = max(peak[0], running[0])
                changed.notify_all()
                # Stay running until a second one runs beside it (or none is left to start), so
                # the overlap never depends on how fast a loaded machine starts threads; bounded.
                changed.wait_for(lambda: running[0] >= 2 or started[0] >= len(MODELS), timeout=10)
            try:
                return inner(**kw)
            finally:
                with changed:
                    running[0] -= 1
                    changed.notify_all()
        stack.up = up
        return stack
    monkeypatch.setattr(automation.engine, "open_stack", counting)
    request = environment.request_from_args(cli.parser().parse_args(["up", "--env", "dev"]), project)
    assert environment.run_environment(request, max_parallel=2) == cli.EXIT_OK
    assert peak[0] == 2


# --------------------------------------------------------------------------------------
# destroy: the model stacks first, the platform last and only if they are all gone


def test_destroy_runs_every_model_stack_before_the_platform(engine, project):
    engine.barrier = threading.Barrier(len(MODELS))
    path = project / "env.json"
    assert cli.main(["destroy", "--env", "dev", "--summary", str(path)]) == cli.EXIT_OK
    assert sorted(engine.ops()[:-1]) == [(m, "destroy") for m in MODELS]
    assert engine.ops()[-1] == ("dev", "destroy")
    assert engine.index("start", "dev") > max(engine.index("end", m) for m in MODELS)
    assert [s["stack"] for s in _summary(path)["stacks"]] == [*MODELS, "dev"]


def test_destroy_keeps_the_platform_when_a_model_stack_fails(engine, project, capsys):
    engine.stacks["dev-c"].fail = True
    path = project / "env.json"
    assert cli.main(["destroy", "--env", "dev", "--summary", str(path)]) == cli.EXIT_FAILED
    assert ("dev", "destroy") not in engine.ops()
    assert sorted(engine.ops()) == [(m, "destroy") for m in MODELS]
    rows = _rows(_summary(path))
    assert rows["dev"]["result"] == "skipped" and "dev-c" in rows["dev"]["message"]
    assert rows["dev-a"]["result"] == rows["dev-b"]["result"] == "succeeded"


def test_destroy_skips_model_stacks_not_in_the_backend(engine, project):
    engine.not_in_backend.add("dev-b")
    path = project / "env.json"
    assert cli.main(["destroy", "--env", "dev", "--summary", str(path)]) == cli.EXIT_OK
    assert ("dev-b", "destroy") not in engine.ops() and engine.ops()[-1] == ("dev", "destroy")
    assert _rows(_summary(path))["dev-b"]["message"] == "not in the backend: nothing to destroy"
    # Run again once everything is gone: nothing to do, nothing fails.
    engine.not_in_backend |= {"dev", *MODELS}
    engine.log.clear()
    assert cli.main(["destroy", "--env", "dev"]) == cli.EXIT_OK
    assert engine.ops() == []


# --------------------------------------------------------------------------------------
# The command line


@pytest.mark.parametrize("argv", [
    ["up"],                                   # one of --stack, --env is required
    ["up", "--stack", "dev", "--env", "dev"],  # not both
    ["outputs", "--env", "dev"],              # an environment has no single set of outputs
])
def test_env_and_stack_are_exclusive_and_one_is_required(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.parser().parse_args(argv)
    assert e.value.code == cli.EXIT_CONFIG


def test_env_keeps_the_single_stack_options(project):
    args = cli.parser().parse_args(["preview", "--env", "dev", "--backend", "s3://state/ws", "--expect-no-changes",
                                    "--skip-preflight", "--policy-config", "p.json"])
    req = environment.request_from_args(args, project)
    assert (req.operation, req.stack, req.backend, req.expect_no_changes, req.skip_preflight, req.policy_config) == \
        ("preview", "dev", "s3://state/ws", True, True, Path("p.json"))
    assert cli.parser().parse_args(["up", "--stack", "dev"]).env is None


def test_without_a_pulumi_cli_nothing_runs_and_one_message_says_why(bare_env, project, monkeypatch, capsys):
    rec = Recorder()
    monkeypatch.setattr(automation.engine, "open_stack", rec.open_stack)
    monkeypatch.chdir(project)
    path = project / "env.json"
    assert cli.main(["up", "--env", "dev", "--summary", str(path)]) == cli.EXIT_PREREQUISITES
    out = capsys.readouterr()
    assert out.err.count("warmstart: cannot run `up`") == 1 and "Pulumi CLI: `pulumi` is not on PATH" in out.err
    assert "Traceback" not in out.err and rec.log == []
    doc = _summary(path)
    assert doc["exitCode"] == cli.EXIT_PREREQUISITES
    assert {s["stack"]: s["result"] for s in doc["stacks"]} == dict.fromkeys(["dev", *MODELS], "not-run")


@pytest.mark.servers
def test_real_cli_without_pulumi_exits_4_without_a_traceback(project, tmp_path):
    """`warmstart destroy --env dev` for real, in a subprocess, with no `pulumi` on PATH."""
    exe = Path(sys.executable).parent / "warmstart"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-c", "import sys; from warmstart.cli import main; sys.exit(main())"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PULUMI_"))}
    env |= {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path / "home"), "AWS_EC2_METADATA_DISABLED": "true"}
    assert not any((Path(p) / "pulumi").exists() for p in env["PATH"].split(os.pathsep))
    proc = subprocess.run([*argv, "destroy", "--env", "dev"], cwd=project, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == cli.EXIT_PREREQUISITES, proc.stderr
    assert proc.stderr.count("Pulumi CLI: `pulumi` is not on PATH") == 1
    assert "Traceback" not in proc.stderr
    assert "not-run" in proc.stdout and all(m in proc.stdout for m in MODELS)
