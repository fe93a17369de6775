"""Golden files: what every stack in stacks/ renders to, and the URNs of existing state.

- `render/<stack>/`: `warmstart render` of the stack (Kubernetes objects, cloud.json,
  plan.json). A test fails when a render changes; a deliberate change is committed together
  with the refreshed files, so the diff is reviewed: `python -m tests.golden` rewrites them.
  A pod script's ConfigMap is recorded by what its artifact holds (the file list and digest of
  its annotations), its base64 blob by its digest only (`golden_form`): a diff names the module
  that changed instead of a wall of base64.
- the generated parts of the docs: the README's sample of `warmstart render --stack dev` (its
  first command's output) and docs/config-reference.md, so a change to renders or to the config
  models is one refresh;
- components/model_args.py and components/section_args.py, the TypedDicts of a `models[]`
  entry and of the platform sections, generated from `warmstart.config`'s models
  (components/model_args_gen.py).
- components/schema.lock, the component schema's fingerprints for CHANGELOG.md's newest entry,
  only while that entry is `Unreleased` (a released version's stay as they were released:
  tests/support/changelog.py).
- `state/urns-<stack>.json`: the URN of every resource of each stack as it was before the
  components moved to `components/` (that is, what deployed stacks hold in their state), and
  `state/urns-<stack>@<version>.json` as each stack was at that warmstart version (0.3: before
  a model became the `ServedModel` component). Never regenerated: every one of these must keep
  resolving, by URN or by an alias.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent
RENDER = GOLDEN / "render"
STATE = GOLDEN / "state"


ROOT = GOLDEN.parent.parent
README = ROOT / "README.md"
CONFIG_REFERENCE = ROOT / "docs" / "config-reference.md"
SAMPLE_START, SAMPLE_END = "<!-- render-sample:start -->\n", "<!-- render-sample:end -->"
REFERENCE_START, REFERENCE_END = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"


def render_dev_output() -> str:
    """What the README's first command prints: `warmstart render --stack dev`, run in the
    project root (it writes build/dev, as the command does)."""
    import contextlib
    import io
    import os

    from warmstart import cli

    out, here = io.StringIO(), Path.cwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            assert cli.main(["render", "--stack", "dev"]) == cli.EXIT_OK
    finally:
        os.chdir(here)
    return out.getvalue()


def between(text: str, start: str, end: str) -> str:
    return text[text.index(start) + len(start): text.index(end)]


def replaced(text: str, start: str, end: str, block: str) -> str:
    return text[:text.index(start) + len(start)] + block + text[text.index(end):]


def sample_block(output: str) -> str:
    return "```\n" + output.rstrip("\n") + "\n```\n"


def elapsed_free(text: str) -> str:
    """The render's output without its one varying figure, the seconds it took."""
    return re.sub(r" in \d+\.\d\ds$", " in <seconds>s", text.strip(), flags=re.M)


def golden_form(folder: Path) -> None:
    """Rewrite a render's pod-script ConfigMaps in `folder` in the form the goldens record: the
    binaryData blob as its sha256 and size, the annotations' file list one line per file."""
    import base64
    import hashlib

    import yaml

    class Literal(str):
        pass

    def literal(dumper, value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")

    dumper = type("GoldenDumper", (yaml.SafeDumper,), {})
    dumper.add_representer(Literal, literal)
    for path in sorted(folder.glob("kubernetes/*-configmap-*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if not doc.get("binaryData"):
            continue
        blobs = {k: base64.b64decode(v) for k, v in doc["binaryData"].items()}
        doc["binaryData"] = {k: f"<{len(b)} bytes, sha256 {hashlib.sha256(b).hexdigest()}>" for k, b in blobs.items()}
        notes = doc["metadata"].get("annotations") or {}
        doc["metadata"]["annotations"] = {k: Literal(v) if "\n" in v else v for k, v in notes.items()}
        path.write_text(yaml.dump(doc, Dumper=dumper, sort_keys=False, default_flow_style=False, width=100))


def update() -> None:
    """Rewrite render/<stack>/ for every shipped stack, the README's render sample,
    docs/config-reference.md, the generated Args (components/model_args.py, section_args.py), the
    schema's fingerprints (components/schema.lock) and the components' reference
    (components/README.md)."""
    from components import model_args_gen
    from tests.support.stacks import ALL_STACK_NAMES, STACKS_DIR
    from warmstart import render
    from warmstart.reference import config_reference

    for stack in ALL_STACK_NAMES:
        out = RENDER / stack
        shutil.rmtree(out, ignore_errors=True)
        render.write(render.run_program(STACKS_DIR, stack), out)
        golden_form(out)
        print(f"wrote {out}")
    sample, readme = sample_block(render_dev_output()), README.read_text()
    # Only when more than the seconds changed: a refresh leaves the README alone otherwise.
    if elapsed_free(sample) != elapsed_free(between(readme, SAMPLE_START, SAMPLE_END)):
        README.write_text(replaced(readme, SAMPLE_START, SAMPLE_END, sample))
        print(f"wrote the render sample in {README}")
    CONFIG_REFERENCE.write_text(replaced(CONFIG_REFERENCE.read_text(), REFERENCE_START, REFERENCE_END,
                                         config_reference()))
    print(f"wrote {CONFIG_REFERENCE}")
    for path in model_args_gen.write():
        print(f"wrote {path}")
    # The schema is fingerprinted in a fresh interpreter: this one imported the components (and
    # their generated Args) before the generator rewrote them, and would record the old schema.
    import subprocess
    import sys

    recorded = subprocess.run([sys.executable, "-c", "from components import schema; from tests.support import "
                               "changelog; print(changelog.record(schema.fingerprints()))"],
                              cwd=ROOT, check=True, capture_output=True, text=True)
    print(recorded.stdout.strip())
    # The components' reference other languages read, from the same fresh schema.
    reference = subprocess.run([sys.executable, "-m", "components.schema"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout
    components_readme = ROOT / "components" / "README.md"
    if components_readme.read_text() != reference:
        components_readme.write_text(reference)
        print(f"wrote {components_readme}")
