"""The README is part of the product: its config reference and commands must stay true."""

from __future__ import annotations

import re

from warmstart.reference import config_reference
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_config_reference_is_current():
    start, end = "<!-- config-reference:start -->\n", "<!-- config-reference:end -->"
    block = README[README.index(start) + len(start): README.index(end)]
    assert block == config_reference(), "README config reference is stale: run `warmstart config-reference`"


def test_readme_opens_with_exactly_two_commands():
    first_block = re.search(r"```sh\n(.*?)```", README, re.S).group(1).strip().splitlines()
    assert len(first_block) == 2
    assert "warmstart render --stack dev" in first_block[0]
    assert "pytest" in first_block[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert first_block[1] in ci, ".ci/run must run the README's test command"


def test_every_config_key_is_documented():
    from warmstart.config import StackConfig
    from pydantic import BaseModel

    def walk(model: type[BaseModel]):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"
            for arg in [info.annotation, *getattr(info.annotation, "__args__", ())]:
                for sub in [arg, *getattr(arg, "__args__", ())]:
                    if isinstance(sub, type) and issubclass(sub, BaseModel):
                        walk(sub)
    walk(StackConfig)


def test_the_readmes_component_example_runs():
    """The Python snippet of "Using the components on their own" works as printed."""
    import json

    from warmstart import mocks

    code = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "warmstart_components" in b)
    kubeconfig = json.dumps({"apiVersion": "v1", "kind": "Config", "clusters": [], "contexts": [], "users": []})
    found = mocks.run(lambda: exec(compile(code, "README.md", "exec"), {}), region="us-east-1", stack="readme",
                      config={"warmstart:kubeconfig": kubeconfig})
    (dep,) = [r.inputs for r in found if r.typ == "kubernetes:apps/v1:Deployment"]
    (vllm,) = dep["spec"]["template"]["spec"]["containers"]
    assert "--tensor-parallel-size=4" in vllm["args"], "the comment in the snippet says auto picks 4"
