"""The README is part of the product: its commands, sample output, YAML and figures stay true."""

from __future__ import annotations

import math
import re
import shlex

import yaml

from tests.golden import (
    CONFIG_REFERENCE,
    REFERENCE_END,
    REFERENCE_START,
    SAMPLE_END,
    SAMPLE_START,
    between,
    elapsed_free,
    render_dev_output,
    sample_block,
)
from tests.support.stacks import ROOT, load_stack_doc, render_doc
from warmstart import cli, exit_codes, render
from warmstart.reference import config_reference

README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def _blocks(lang: str, text: str = README) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _two_commands() -> list[str]:
    return _blocks("sh")[0].strip().splitlines()


def test_the_readme_is_read_in_five_minutes():
    assert len(README.splitlines()) <= 300


def test_readme_opens_with_exactly_two_commands():
    first, second = _two_commands()
    assert README.index("```sh") < README.index("```yaml"), "the two commands come first"
    # The first installs the project without extras (only what rendering needs) and renders dev.
    assert re.search(r"pip install -q -e \. ", first) and first.endswith("warmstart render --stack dev")
    # The second installs everything the tests need before pytest starts, then runs it.
    assert second.index("-m tests.install") < second.index("-m pytest")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci.index(first) < ci.index(second), ".ci/run runs the README's two commands, in order"


def test_the_render_sample_is_the_first_commands_output():
    """Refreshed with the golden files: `python -m tests.golden`."""
    sample = between(README, SAMPLE_START, SAMPLE_END)
    assert elapsed_free(sample) == elapsed_free(sample_block(render_dev_output())), \
        "the README's render sample is stale: run `python -m tests.golden`"


def test_config_reference_is_current():
    block = between(CONFIG_REFERENCE.read_text(), REFERENCE_START, REFERENCE_END)
    assert block == config_reference(), "docs/config-reference.md is stale: run `python -m tests.golden`"


# Commands of the README that cannot run inside the tests, and why. Every other command runs below.
NEEDS_MORE_THAN_THIS_MACHINE = {
    "python3 -m venv": "makes the virtualenv the tests run in",
    ".venv/bin/pip install": "downloads packages",
    ".venv/bin/python -m tests.install": "downloads packages and tools",
    ".venv/bin/python -m pytest": "is this suite",
    "pulumi ": "the Pulumi CLI and a backend",
    ".venv/bin/warmstart up": "an AWS account",
    ".venv/bin/warmstart preview": "an AWS account",
    ".venv/bin/warmstart coldstart": "a cluster",
    "aws ": "an AWS account",
    "kubectl ": "a cluster",
    "curl ": "a served model",
}


def _commands() -> list[str]:
    return [part.strip() for block in _blocks("sh") for line in block.strip().splitlines()
            for part in re.split(r" && | &$", line.strip()) if part.strip() and not part.startswith("#")]


def test_every_readme_command_that_can_run_offline_runs(monkeypatch, capsys):
    offline = [c for c in _commands() if not c.startswith(tuple(NEEDS_MORE_THAN_THIS_MACHINE))]
    assert {c.split()[1] for c in offline} >= {"render", "validate"}
    monkeypatch.chdir(ROOT)
    for command in offline:
        argv = shlex.split(command)
        assert argv[0] == ".venv/bin/warmstart", f"{command!r}: classify it in NEEDS_MORE_THAN_THIS_MACHINE or run it"
        assert cli.main(argv[1:]) == cli.EXIT_OK, (command, capsys.readouterr().err)
        assert capsys.readouterr().out.strip(), command


def _merged(config: dict, fragment: dict) -> dict:
    """A recipe's YAML applied to a stack's config: models by name (merged into the entry of
    that name, else appended), other mappings key by key."""
    out = dict(config)
    for key, value in fragment.items():
        if key == "warmstart:models":
            models = [dict(m) for m in out.get(key, [])]
            for entry in value:
                same = next((m for m in models if m["name"] == entry["name"]), None)
                if same is None:
                    models.append(dict(entry))
                else:
                    same.update(entry)
            out[key] = models
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = out[key] | value
        else:
            out[key] = value
    return out


def test_the_recipes_yaml_is_the_dev_stack_and_each_step_renders(tmp_path):
    first, *steps = [yaml.safe_load(b) for b in _blocks("yaml")]
    assert first == {"config": load_stack_doc("dev")["config"]}, "recipe 1 shows stacks/Pulumi.dev.yaml"
    assert len(steps) == 5
    config = first["config"]
    for i, step in enumerate(steps, start=2):
        config = _merged(config, step)
        rendered = render_doc({"config": config}, tmp_path, stack=f"recipe-{i}")
        names = [m.name for m in rendered.stack_plan.models]
        assert names == [m["name"] for m in config["warmstart:models"]], i
    qwen = next(m for m in rendered.stack_plan.models if m.name == "qwen-2-5-7b")
    assert qwen.autoscaling is not None and qwen.routing_policy == "prefix_hash"
    assert qwen.serving.standby is not None and qwen.serving.standby.count == 1
    assert any(o["kind"] == "Deployment" and o["metadata"]["name"] == "qwen-2-5-7b-standby"
               for o in rendered.kubernetes_objects), "the recipe's standby gets its actuator"
    assert rendered.stack_plan.config.compile_cache_bucket.expire_after_days == 90
    assert any(o["kind"] == "ScaledObject" and o["metadata"]["name"].startswith("qwen-2-5-7b")
               for o in rendered.kubernetes_objects)


def test_the_exit_code_table_is_exit_codes_py():
    codes = {v for k, v in vars(exit_codes).items() if k.startswith("EXIT_")}
    rows = re.findall(r"^  \| (\d) \| ", README, re.M)
    assert sorted(int(r) for r in rows) == sorted(codes)


def test_the_quota_table_is_the_shipped_pools_limits():
    """The GPU nodes at most and the vCPUs of quota the README gives per shipped stack are what
    the pools' GPU limits come to, in the table's vCPUs per instance type."""
    rows = {m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"^  \| `([\w-]+)`[^|]* \| [^|]+ \| (\d+) \| L-\w+: (\d+) vCPUs", README, re.M)}
    assert set(rows) == {"dev", "staging", "prod"}
    for stack, (nodes, vcpus) in rows.items():
        (pool,) = render.load_plan(ROOT / "stacks", stack)[1].cluster.pools
        (inst,) = pool.instances
        assert nodes == math.ceil(pool.max_gpus / inst.gpu_count), stack
        assert vcpus == nodes * inst.vcpu, stack


def _links(text: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if not t.startswith("http")]


def test_every_docs_page_is_in_the_readme_table_and_every_link_resolves():
    table = [line for line in README.splitlines() if line.startswith("| ") and "](docs/" in line]
    linked = {t for line in table for t in _links(line)}
    assert linked == {f"docs/{p.name}" for p in DOCS.glob("*.md")}, "one row per docs page"
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for target in _links(page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_the_diagram_is_in_docs_and_shown():
    assert "](docs/stack.png)" in README and (DOCS / "stack.png").stat().st_size > 10_000


def test_every_config_key_is_documented():
    from pydantic import BaseModel

    from warmstart.config import StackConfig

    def walk(model: type[BaseModel]):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"
            for arg in [info.annotation, *getattr(info.annotation, "__args__", ())]:
                for sub in [arg, *getattr(arg, "__args__", ())]:
                    if isinstance(sub, type) and issubclass(sub, BaseModel):
                        walk(sub)
    walk(StackConfig)


COMPONENTS_DOC = (DOCS / "components.md").read_text()


def test_the_components_page_names_every_hosted_component():
    import components.__main__ as package

    named = re.search(r"The package hosts (.*?) \(`HOSTED`", COMPONENTS_DOC, re.S).group(1)
    assert sorted(re.split(r",\s*|\s+and\s+", " ".join(named.split()))) == sorted(c.__name__ for c in package.HOSTED)


def test_the_components_pages_python_example_runs():
    """The Python snippet of docs/components.md works as printed."""
    import json

    from warmstart import mocks

    code = next(b for b in _blocks("python", COMPONENTS_DOC) if "warmstart_components" in b)
    kubeconfig = json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []})
    found = mocks.run(lambda: exec(compile(code, "docs/components.md", "exec"), {}), region="us-east-1",
                      stack="readme", config={"warmstart:kubeconfig": kubeconfig})
    (dep,) = [r.inputs for r in found if r.typ == "kubernetes:apps/v1:Deployment"]
    (vllm,) = dep["spec"]["template"]["spec"]["containers"]
    assert "--tensor-parallel-size=4" in vllm["args"], "the comment in the snippet says auto picks 4"


def test_the_first_pods_minutes_are_the_plans_estimate():
    """"About N minutes for dev's model": the scale-out estimate of the same model on a new node,
    as the model stack staging-llama-3-1-8b (dev's model, autoscaled) renders it."""
    m = render.load_plan(ROOT / "stacks", "staging-llama-3-1-8b")[1].model
    (dev,) = render.load_plan(ROOT / "stacks", "dev")[1].models
    assert (m.name, m.instance, m.weights_bytes) == (dev.name, dev.instance, dev.weights_bytes)
    seconds = int(re.search(r"serves after ~(\d+)s", render.scale_out_line(m)).group(1))
    stated = int(re.search(r"about (\d+) minutes for dev's model", README).group(1))
    assert stated == round(seconds / 60), seconds


def test_the_import_deadline_minutes_are_the_plans():
    """The first `up`'s import Job bound the README gives for dev is the Job's own deadline."""
    (dev,) = render.load_plan(ROOT / "stacks", "dev")[1].models
    stated = int(re.search(r"about (\d+) minutes for dev's 15 GiB", README).group(1))
    deadline = dev.weights_import.deadline_seconds
    assert stated == round(deadline / 60), deadline
