"""Golden files: what every stack in stacks/ renders to, and the URNs of existing state.

- `render/<stack>/`: `warmstart render` of the stack (Kubernetes objects, cloud.json,
  plan.json). A test fails when a render changes; a deliberate change is committed together
  with the refreshed files, so the diff is reviewed: `python -m tests.golden` rewrites them.
- `state/urns-<stack>.json`: the URN of every resource of each stack as it was before the
  components moved to `components/` (that is, what deployed stacks hold in their state). Never
  regenerated: every one of these must keep resolving, by URN or by an alias.
"""

from __future__ import annotations

import shutil
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent
RENDER = GOLDEN / "render"
STATE = GOLDEN / "state"


def update() -> None:
    """Rewrite render/<stack>/ for every stack in stacks/."""
    from tests.conftest import ALL_STACK_NAMES, STACKS_DIR
    from warmstart import render

    for stack in ALL_STACK_NAMES:
        out = RENDER / stack
        shutil.rmtree(out, ignore_errors=True)
        render.write(render.run_program(STACKS_DIR, stack), out)
        print(f"wrote {out}")
