"""The same stack file gets the same answer from `warmstart render` (which reads it with PyYAML,
YAML 1.1) and from `pulumi up` (whose CLI reads it with gopkg.in/yaml.v2 and hands the program a
flat map of JSON texts, read by `components.stack.stack_config`).

What yaml.v2 v2.4.0 makes of each unquoted word is the table below, read in its source
(resolve.go: `resolveMapList`, the `strconv.ParseInt(plain, 0, 64)` after removing `_`, "Base 60
floats ... purposefully unsupported"; decode.go: a timestamp into `interface{}` stays its text) and
in Pulumi's (sdk/go/common/resource/config/object.go: every value read into `any`, a scalar handed
as its JSON text, an object as JSON). There is no Pulumi CLI here to ask, so the table is the
reference the port (`config.yaml_v2_reads`) is checked against."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pulumi
import pytest
from pulumi.runtime import config as runtime_config
import yaml

from warmstart import cli, config
from warmstart.errors import ConfigError, ConfigErrors

HERE = Path(__file__).parent

# Unquoted text -> the JSON value Pulumi hands the program for it (yaml.v2 v2.4.0).
PULUMI_READS = {
    "no": False, "No": False, "off": False, "OFF": False, "n": False, "N": False, "false": False,
    "yes": True, "on": True, "y": True, "Y": True, "true": True, "True": True,
    "5:00": "5:00", "2:16:32": "2:16:32",  # no base 60
    "010000": 4096, "0o17": 15, "0x1F": 31, "0b101": 5, "1_000": 1000, "+5": 5, "-3": -3, "0": 0,
    "1e3": 1000, "1.5": 1.5, ".5": 0.5, "10000": 10000,
    "~": None, "null": None,
    "2027-03-01T11:30:00Z": "2027-03-01T11:30:00Z",
    "g6e.2xlarge": "g6e.2xlarge", "1.30": 1.3,
}


@pytest.mark.parametrize("text", sorted(PULUMI_READS))
def test_the_port_of_pulumis_reader_agrees_with_its_source(text):
    got, want = config.yaml_v2_reads(text), PULUMI_READS[text]
    assert type(got) is type(want) and got == want, (text, got, want)
    assert math.isnan(config.yaml_v2_reads(".nan")) and config.yaml_v2_reads("-.Inf") == float("-inf")


def _pulumi_flat_map(text: str) -> dict[str, str]:
    """The flat config map Pulumi hands the program for the stack file `text`: each unquoted
    scalar as PULUMI_READS (via the port checked above), a quoted one as its text; a top-level
    scalar as its JSON text (a string as itself), an object or a list as JSON."""
    def value(node: yaml.Node):
        if isinstance(node, yaml.MappingNode):
            return {k.value: value(v) for k, v in node.value}
        if isinstance(node, yaml.SequenceNode):
            return [value(v) for v in node.value]
        return config.yaml_v2_reads(node.value) if node.style is None else node.value

    doc = value(yaml.compose(text))
    return {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in (doc.get("config") or {}).items()}


# The fixtures of values the two readers read alike but wrongly, or differently.
CASES = [HERE / f"{n}.yaml" for n in ("yaml-boolean-where-a-number-goes", "yaml-standby-count-true",
                                     "yaml-sexagesimal-seconds", "yaml-octal-max-model-len", "yaml-readers-disagree",
                                     "account-id-unquoted-octal")]


def _project(tmp_path: Path, text: str) -> Path:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks" / "Pulumi.bad.yaml").write_text(text)
    return tmp_path


def _problems(err: str) -> list[str]:
    return sorted(line.removeprefix("  - ") for line in err.splitlines() if line.startswith("  - "))


@pytest.mark.parametrize("case", CASES, ids=[p.stem for p in CASES])
def test_render_and_the_programs_path_refuse_the_same_file_alike(case, tmp_path, monkeypatch, capsys):
    from components import stack as stack_component

    text = yaml.safe_load(case.read_text())["stackFile"]
    monkeypatch.chdir(_project(tmp_path, text))
    assert cli.main(["validate", "--stack", "bad"]) == cli.EXIT_CONFIG
    rendered = _problems(capsys.readouterr().err)
    assert rendered
    # The program as the engine runs it: PULUMI_CONFIG from Pulumi's reader, the project its cwd.
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(_pulumi_flat_map(text)))
    monkeypatch.setattr(pulumi, "get_stack", lambda: "bad")
    token = runtime_config.CONFIG.set({})  # no mocks' config left from another test
    try:
        with pytest.raises((ConfigError, ConfigErrors)) as err:
            stack_component.stack_config()
    finally:
        runtime_config.CONFIG.reset(token)
    errors = err.value.errors if isinstance(err.value, ConfigErrors) else [err.value]
    assert sorted(str(e) for e in errors) == rendered


def test_a_top_level_boolean_is_handed_as_text_and_refused_the_same(tmp_path, monkeypatch):
    """Pulumi hands a top-level scalar as its JSON text (`"false"`): the program's path still
    names the word the file has."""
    text = (HERE / "yaml-readers-disagree.yaml").read_text()
    flat = _pulumi_flat_map(yaml.safe_load(text)["stackFile"])
    assert json.loads(flat["warmstart:tags"]) == {"oncall": True}
    assert re.fullmatch(r"\{.*\}", flat["warmstart:tags"])
