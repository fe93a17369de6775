"""A stack file of the user's own in stacks/ (anything but the shipped stacks of
tests/conftest.py's SHIPPED_STACK_NAMES): rendered and validated like a shipped one, never compared
with a golden file, and an invalid one is one failure that names it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from tests.support.stacks import (
    ROOT,
    SHIPPED_STACK_NAMES,
    STACKS_DIR,
    USER_STACK_NAMES,
    render_stack,
)
from tests.support.validation import validate_rendered
from warmstart.errors import ConfigError, ConfigErrors

# Set in the copy of the project the test below runs, so that the copy does not run it again.
INNER = "WARMSTART_USER_STACKS_INNER"


@pytest.mark.parametrize("stack", USER_STACK_NAMES or [
    pytest.param(None, marks=pytest.mark.skip(reason="stacks/ holds only the shipped stacks"))])
def test_a_stack_of_your_own_renders_and_validates(stack):
    try:
        rendered = render_stack(stack)
    except (ConfigError, ConfigErrors) as err:
        problems = [str(e) for e in err.errors] if isinstance(err, ConfigErrors) else [str(err)]
        pytest.fail(f"stacks/Pulumi.{stack}.yaml is invalid ({len(problems)} problem(s)):\n  - "
                    + "\n  - ".join(problems), pytrace=False)
    validate_rendered(rendered)


def _project_copy(dest: Path) -> Path:
    """The committed and working files of the project (no virtualenv, no build output)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split("\n")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _outcomes(junit: Path) -> dict[str, str]:
    """`{test id: passed | failed | error | skipped}` from pytest's JUnit XML."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        state = next((k for k in ("failure", "error", "skipped") if k in kinds), "passed")
        out[f"{case.get('classname')}::{case.get('name')}"] = {"failure": "failed"}.get(state, state)
    return out


@pytest.mark.servers
@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get(INNER)), reason="runs in the outer suite only")
def test_your_stacks_never_break_the_shipped_stacks_tests(tmp_path):
    """In a copy of the project, with a valid stack of the user's own (dev's config under another
    prefix) and an invalid one (a typo'd key) in stacks/: the suite's collection names neither
    outside this file, the tests that pin the shipped stacks (golden renders, the CI matrix) pass,
    and the only failure is the invalid stack's, naming it."""
    project = _project_copy(tmp_path / "project")
    dev = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    mine = dev["config"] | {"warmstart:namePrefix": "ws-mine"}
    (project / "stacks" / "Pulumi.yours-ok.yaml").write_text(yaml.safe_dump({"config": mine}))
    broken = dev["config"] | {"warmstart:gpuPool": dev["config"]["warmstart:gpuPools"]}
    (project / "stacks" / "Pulumi.yours-typo.yaml").write_text(yaml.safe_dump({"config": broken}))
    env = {**os.environ, INNER: "1", "PYTHONPATH": str(project)}
    run = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"]

    collected = subprocess.run([*run, "--collect-only"], cwd=project, env=env, capture_output=True, text=True,
                               timeout=600)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert len(ids) > 500, "the whole suite was collected"
    leaked = [i for i in ids if ("yours-" in i) and not i.startswith("tests/stack/test_user_stacks.py")]
    assert not leaked, f"tests outside test_user_stacks.py are parametrized over the user's stacks: {leaked[:5]}"

    junit = tmp_path / "junit.xml"
    proc = subprocess.run([*run, f"--junitxml={junit}", "tests/stack/test_user_stacks.py", "tests/golden/test_golden.py",
                           "tests/automation/test_automation.py::test_workflow_runs_the_readme_tests_and_the_engine_commands"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=900)
    outcomes = _outcomes(junit)
    failed = [t for t, state in outcomes.items() if state in ("failed", "error")]
    assert failed == ["tests.stack.test_user_stacks::test_a_stack_of_your_own_renders_and_validates[yours-typo]"], \
        proc.stdout[-4000:]
    assert "stacks/Pulumi.yours-typo.yaml is invalid" in proc.stdout and "did you mean `gpuPools`" in proc.stdout, \
        proc.stdout[-4000:]
    assert outcomes["tests.stack.test_user_stacks::test_a_stack_of_your_own_renders_and_validates[yours-ok]"] == "passed"
    golden = [t for t in outcomes if t.startswith("tests.golden.test_golden::test_render_matches_its_golden_files")]
    assert sorted(golden) == sorted(f"tests.golden.test_golden::test_render_matches_its_golden_files[{s}]"
                                    for s in SHIPPED_STACK_NAMES)
    assert all(outcomes[t] == "passed" for t in outcomes if t not in failed and "[yours-typo]" not in t
               and outcomes[t] != "skipped"), outcomes
