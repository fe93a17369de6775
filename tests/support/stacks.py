"""The shipped stacks by kind, and rendering them (real program, Pulumi mocks) once per test
session: what test modules import, so no test module imports a conftest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from warmstart import config, render

ROOT = Path(__file__).resolve().parent.parent.parent
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


def policy_json(value: Any) -> dict[str, Any]:
    """An IAM policy input as data, whether rendered as a JSON string or an object."""
    return json.loads(value) if isinstance(value, str) else value
