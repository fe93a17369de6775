"""The warmstart-guardrails policy pack: `pulumi preview --policy-pack policy` (warmstart
preview/up pass it for you). The checks live in warmstart/policies/, so tests run them too."""

import sys
from pathlib import Path

# The repository root, so the pack imports the checks from this checkout even where the
# virtualenv holds warmstart only as a dependency of the program.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import PolicyPack  # noqa: E402

from warmstart.policy_pack import DEFAULT_ENFORCEMENT, PACK_NAME, policies_for_pack  # noqa: E402

PolicyPack(name=PACK_NAME, enforcement_level=DEFAULT_ENFORCEMENT, policies=policies_for_pack())
