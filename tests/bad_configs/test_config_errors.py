"""Known-bad stack configs: each fails with its own message naming key, rule and fix."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from warmstart import cli
from warmstart.errors import ConfigErrors

BAD = sorted((Path(__file__).parent).glob("*.yaml"))


def _write_stack(tmp_path: Path, case: Path) -> Path:
    doc = yaml.safe_load(case.read_text())
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    # `stackFile`: the stack file verbatim, for what a load and dump would not keep (a key given
    # twice, a document that is not a mapping); else the fixture's `config`, dumped.
    text = doc["stackFile"] if "stackFile" in doc else yaml.safe_dump({"config": doc["config"]})
    (stacks / "Pulumi.bad.yaml").write_text(text)
    return tmp_path


def test_there_are_at_least_ten_known_bad_configs():
    assert len(BAD) >= 10


@pytest.mark.parametrize("case", BAD, ids=[p.stem for p in BAD])
def test_bad_config_fails_with_its_message(case, tmp_path, monkeypatch, capsys):
    expect = yaml.safe_load(case.read_text())["expect"]
    monkeypatch.chdir(_write_stack(tmp_path, case))
    rc = cli.main(["render", "--stack", "bad"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_CONFIG
    assert re.search(expect, err), err
    assert "fix:" in err
    assert all(line.startswith("  - ") for line in err.splitlines()[1:]), f"one line per problem: {err}"
    assert max(len(line) for line in err.splitlines()) < 1000, "a problem's line stays short"
    assert not (tmp_path / "build").exists(), "a failed render must not write output"


def test_messages_are_distinct():
    expects = [yaml.safe_load(p.read_text())["expect"] for p in BAD]
    assert len(set(expects)) == len(expects)


@pytest.mark.servers
def test_cli_exits_2_without_traceback(tmp_path):
    root = _write_stack(tmp_path, BAD[0])
    proc = subprocess.run([sys.executable, "-m", "warmstart.cli", "render", "--stack", "bad"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "invalid stack config" in proc.stderr


def test_missing_stack_file_is_a_config_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\n")
    (tmp_path / "stacks").mkdir()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["render", "--stack", "nope"]) == cli.EXIT_CONFIG
    assert "no stack 'nope' in stacks/" in capsys.readouterr().err


def _render_err(tmp_path: Path, monkeypatch, capsys, config: dict, stack: str = "bad") -> tuple[int, str, str]:
    stacks = tmp_path / "stacks"
    stacks.mkdir(exist_ok=True)
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    (stacks / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump({"config": config}))
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["validate", "--stack", stack])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_an_instance_without_a_gpu_is_one_line_naming_every_gpu_family(tmp_path, monkeypatch, capsys):
    """The one problem of a pool of m7i.2xlarge (a model on it, no instanceType of its own): one
    line, short, that says there is no GPU and names each family of the GPU table once."""
    from warmstart.decisions import instances

    doc = yaml.safe_load((Path(__file__).parent / "non-gpu-instance-type.yaml").read_text())
    rc, _, err = _render_err(tmp_path, monkeypatch, capsys, doc["config"])
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert rc == cli.EXIT_CONFIG and len(problems) == 1, err
    (line,) = problems
    assert "has no GPU" in line and len(line) < 400, line
    families = {i.family for i in instances.catalog().values()}
    assert all(f"{f} (" in line for f in families), line
    assert not any(t in line for t in instances.catalog() if t != next(iter(instances.catalog()))), \
        "families, not the table's every instance type"


def test_an_unknown_size_of_a_gpu_family_lists_that_familys_sizes(tmp_path, monkeypatch, capsys):
    from warmstart.decisions import instances

    doc = yaml.safe_load((Path(__file__).parent / "non-gpu-instance-type.yaml").read_text())
    doc["config"]["warmstart:gpuPools"][0]["instanceTypes"] = ["g6e.3xlarge"]
    rc, _, err = _render_err(tmp_path, monkeypatch, capsys, doc["config"])
    sizes = [t for t, i in instances.catalog().items() if i.family == "g6e"]
    assert rc == cli.EXIT_CONFIG and "warmstart's GPU table has no g6e.3xlarge" in err
    assert f"use one of {', '.join(sizes)}" in err


def test_a_router_in_front_of_a_model_that_never_has_two_replicas_is_a_note(tmp_path, monkeypatch, capsys,
                                                                             stack_doc):
    """Noted, not refused (why: warmstart/render.py, lone_router_notes): the note names the model
    and the fix, and appears exactly where the model can never have a second replica."""
    def note_for(model_keys: dict) -> list[str]:
        doc = stack_doc("dev")
        doc["config"]["warmstart:models"][0].update(model_keys)
        rc, out, err = _render_err(tmp_path, monkeypatch, capsys, doc["config"], stack="lone")
        assert rc == 0, err
        return [line for line in out.splitlines() if "can never have two replicas" in line]

    (note,) = note_for({"routing": {"policy": "prefix_hash"}})
    assert "'llama-3-1-8b'" in note and "replicas 1, no autoscaling" in note and "routing.policy: auto" in note
    (note,) = note_for({"routing": {"policy": "round_robin"}, "replicas": 0})
    assert "replicas 0, no autoscaling" in note
    assert note_for({"routing": {"policy": "prefix_hash"}, "replicas": 2}) == []
    assert note_for({"routing": {"policy": "prefix_hash"}, "autoscaling": {"maxReplicas": 2}}) == []
    assert note_for({}) == [], "auto puts no router in front of one replica"


def test_a_missing_stack_is_named_with_the_stacks_there(tmp_path, monkeypatch, capsys):
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\n")
    (tmp_path / "stacks").mkdir()
    for name in ("dev", "prod-eu"):
        (tmp_path / "stacks" / f"Pulumi.{name}.yaml").write_text("config: {}\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["render", "--stack", "dve"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "stack='dve': no stack 'dve' in stacks/; fix: use one of: dev, prod-eu" in err, err
    assert str(tmp_path) not in err and "Pulumi.dve.yaml" not in err, "the stack, not a file path"


def test_an_unquoted_timestamp_reads_as_the_text_the_key_parses(tmp_path, monkeypatch, capsys):
    """`capacityBlock.endsAt: 2027-03-01T11:30:00Z` unquoted, as docs/config-reference.md shows it:
    YAML reads a timestamp; the stack file reads as if it were quoted, and validates."""
    text = """config:
  warmstart:clusterMode: karpenter
  warmstart:region: us-west-2
  warmstart:gpuPools:
    - name: l40s
      instanceTypes: [g6e.2xlarge]
      capacity:
        types: [reserved, onDemand]
        reservations: [{id: cr-0123}]
        capacityBlock: {endsAt: %s}
  warmstart:models:
    - {name: a, source: org/a, weightsGiB: 15, pool: l40s}
"""
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.bare.yaml").write_text(text % "2099-03-01T11:30:00Z")
    (stacks / "Pulumi.quoted.yaml").write_text(text % '"2099-03-01T11:30:00Z"')
    from warmstart import config

    bare, quoted = (config.read_stack_file(stacks / f"Pulumi.{s}.yaml") for s in ("bare", "quoted"))
    assert bare == quoted
    ends = config.from_pulumi_config(bare).gpu_pools[0].capacity.capacity_block.ends_at
    assert ends.isoformat() == "2099-03-01T11:30:00+00:00"
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["validate", "--stack", "bare"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan", ".NaN", '"inf"', '"nan"', '"Infinity"'])
def test_no_float_key_takes_nan_or_an_infinity(text):
    """Every float a stack file holds is finite: checked on every float field of the config tree,
    not only the ones the fixtures name."""
    from pydantic import ValidationError

    from warmstart import config

    value = yaml.safe_load(f"v: {text}")["v"]
    floats = [(m, n) for m in _models_under(config.ModelStackConfig, _models_under(config.StackConfig)) for n, f in m.model_fields.items()
              if float in _leaf_types(f.annotation)]
    assert len(floats) >= 7, floats  # prices, weightsGiB, gpuMemoryUtilization, routing, autoscaling
    for model, name in floats:
        with pytest.raises(ValidationError) as err:
            model.model_validate({name: value})
        kinds = {e["type"] for e in err.value.errors() if e["loc"][:1] == (name,)}
        assert kinds == {"finite_number"}, (model.__name__, name, err.value)


def _leaf_types(annotation) -> set:
    import typing

    args = typing.get_args(annotation)
    return {annotation} if not args else {t for a in args for t in _leaf_types(a)}


def _models_under(model, seen=None) -> list:
    from pydantic import BaseModel

    seen = [] if seen is None else seen
    if model not in seen:
        seen.append(model)
        for f in model.model_fields.values():
            for t in _leaf_types(f.annotation):
                if isinstance(t, type) and issubclass(t, BaseModel):
                    _models_under(t, seen)
    return seen


_ARABIC_INDIC_THREE, _FULLWIDTH_ONE = "\u0663", "\uff11"


@pytest.mark.parametrize("digit", [_ARABIC_INDIC_THREE, _FULLWIDTH_ONE])
@pytest.mark.parametrize("key,value", [
    ("accountId", "12345678901{d}"),
    ("region", "us-west-{d}"),
    ("kubernetesVersion", "1.3{d}"),
    ("cluster", {"admins": ["arn:aws:iam::12345678901{d}:role/admin"]}),
    ("cluster", {"serviceCidr": "172.20.0.0/1{d}"}),
    ("modelBucket", {"admins": ["arn:aws:iam::12345678901{d}:role/admin"]}),
    ("imageCache", {"ecrPullThrough": {"credentialArn":
                    "arn:aws:secretsmanager:us-west-2:12345678901{d}:secret:ecr-pullthroughcache/hub"}}),
    ("gpuPools", [{"name": "l40s", "instanceTypes": ["g6e.2xlarge"], "capacity": {
        "types": ["reserved"], "reservations": [{"tags": {"team": "ml"}, "ownerId": "12345678901{d}"}]}}]),
    ("models", [{"name": "a", "source": "org/a", "weightsGiB": 15, "pool": "l40s",
                 "import": {"huggingFace": {"repo": "org/m{d}", "revision": "0" * 40}}}]),
])
def test_a_unicode_digit_is_no_ascii_digit(key, value, digit):
    """Account ids, regions, versions, CIDRs, ARNs and repository ids take ASCII digits only: a
    digit of another script (`\\d` and `\\w` match it) is refused by the key it is in."""
    from warmstart import config

    values = {"clusterMode": "karpenter", "region": "us-west-2",
              "gpuPools": [{"name": "l40s", "instanceTypes": ["g6e.2xlarge"]}]}
    config.parse_config({**values, key: _with(value, "1")})  # the same value with an ASCII digit is valid
    with pytest.raises(ConfigErrors) as err:
        config.parse_config({**values, key: _with(value, digit)})
    assert all(e.key.startswith(f"warmstart:{key}") for e in err.value.errors), err.value


def _with(v, digit: str):
    if isinstance(v, str):
        return v.replace("{d}", digit)
    if isinstance(v, list):
        return [_with(x, digit) for x in v]
    return {k: _with(x, digit) for k, x in v.items()} if isinstance(v, dict) else v


@pytest.mark.parametrize("digit", [_ARABIC_INDIC_THREE, _FULLWIDTH_ONE])
def test_the_arn_and_name_checks_outside_the_config_take_ascii_digits_only(digit):
    """The AMP workspace ARN KEDA's policy names, an IAM role name and an EKS version string
    take ASCII digits only, as their AWS services do."""
    from warmstart import versions
    from warmstart.decisions import autoscaling, naming

    good = "arn:aws:aps:us-west-2:123456789012:workspace/ws-1"
    autoscaling.keda_query_policy(good)
    with pytest.raises(ValueError):
        autoscaling.keda_query_policy(good.replace("9012:", f"901{digit}:"))
    assert naming.role_name_valid("ws-dev-model-1") and not naming.role_name_valid(f"ws-dev-model-{digit}")
    assert versions._minor("1.33") == (1, 33) and versions._minor(f"1.3{digit}") is None


@pytest.mark.parametrize("truth", [True, False])
def test_every_boolean_hint_suggests_a_value_the_key_takes(truth):
    """For every text key of the config tree that YAML's unquoted yes/no/on/off would turn into
    a boolean: the hint names YAML's reading, and a quoted value it suggests is one the key
    takes (never a word the key refuses too)."""
    from pydantic import ValidationError

    from warmstart import config

    checked = 0
    for holder in _models_under(config.ModelStackConfig, _models_under(config.StackConfig)):
        for name, field in holder.model_fields.items():
            if bool in _leaf_types(field.annotation) or not _takes_text(field.annotation):
                continue
            key = config._key_of(name, field)
            with pytest.raises(ValidationError) as err:
                holder.model_validate({key: truth})
            errors = config._from_validation_error(err.value, prefix="", model=holder).errors
            mine = next((e for e in errors if e.key == key), None)
            if mine is None:  # a union with an int (`tensorParallelSize`) takes true as 1
                continue
            assert f"as the boolean {str(truth).lower()}" in mine.rule, mine
            suggested = re.search(r'`[^`]*: "([^"]+)"`', mine.fix)
            if suggested:
                checked += 1
                try:
                    holder.model_validate({key: suggested.group(1)})
                except ValidationError as again:
                    assert not [e for e in again.errors() if e["loc"][:1] == (key,)], (holder.__name__, mine)
    assert checked >= 10


def _takes_text(annotation) -> bool:
    """Whether a field's value is one piece of text (`str`, a `Literal` of words), maybe optional."""
    import types
    import typing

    origin = typing.get_origin(annotation)
    if annotation is str:
        return True
    if origin is typing.Literal:
        return all(isinstance(a, str) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _takes_text(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_takes_text(a) for a in typing.get_args(annotation) if a is not type(None))
    return False


def test_an_inner_components_rule_is_reported_under_the_stack_key(tmp_path, monkeypatch, stack_doc):
    """A rule only the router component checks (here one made stricter for the test) names the
    stack key the user edits, `warmstart:models[0].routing.loadFactor`, not `ModelRouterArgs`;
    a value warmstart derives for the router names the model's `routing` block."""
    from warmstart import render
    from warmstart.decisions import routing
    from warmstart.errors import ConfigError

    def stricter(*args, key="routing", **kwargs):
        raise ConfigErrors([ConfigError(f"{key}.loadFactor", "above this test's bound", "lower it",
                                        kwargs["load_factor"]),
                            ConfigError(f"{key}.prefixTokens", "not this test's count", "derive another", 256)])

    monkeypatch.setattr(routing, "plan", stricter)
    doc = stack_doc("dev")
    doc["config"]["warmstart:models"][0].update({"replicas": 2, "routing": {"loadFactor": 1.5}})
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.routed.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigErrors) as err:
        render.run_program(stacks, "routed", program_dir=Path(__file__).resolve().parents[2])
    keys = [str(e) for e in err.value.errors]
    assert keys == ["warmstart:models[0].routing.loadFactor=1.5: above this test's bound; fix: lower it",
                    "warmstart:models[0].routing=256: (its prefixTokens) not this test's count; fix: derive another"], keys


def test_aws_tag_rules_hold_on_every_tags_key():
    """An environment's and a model stack's `tags` within AWS's count (less warmstart's own),
    any script's letters allowed; a reservation selector's `tags` match existing tags, so `*`
    and AWS's own `aws:` tags may be selected, within the lengths."""
    from warmstart import config

    env = {"clusterMode": "auto", "region": "us-west-2",
           "gpuPools": [{"name": "l40s", "instanceTypes": ["g6e.2xlarge"]}]}
    config.parse_config({**env, "tags": {"équipe": "données ML", "cost-center": "a_b.c:d/e=f+g-h@i"}})
    config.parse_config({**env, "tags": {f"t{i}": "" for i in range(config.TAGS_PER_RESOURCE_MAX
                                                                    - config.OWN_TAGS_ENVIRONMENT)}})
    model = {"name": "a", "source": "org/a", "weightsGiB": 15, "pool": "l40s"}
    most = config.TAGS_PER_RESOURCE_MAX - config.OWN_TAGS_MODEL_STACK
    config.ModelStackConfig.model_validate({"platform": "prod", "model": model, "tags": {f"t{i}": "x" for i in range(most)}})
    with pytest.raises(ConfigErrors, match=rf"warmstart:tags: {most + 1} tags: .*keep at most {most} tags"):
        config.model_stack_from_pulumi_config({"warmstart:platform": "prod", "warmstart:model": json.dumps(model),
                                               "warmstart:tags": json.dumps({f"t{i}": "x" for i in range(most + 1)})})
    with pytest.raises(ConfigErrors, match="warmstart:tags: tag key 'aws:x' starts with `aws:`"):
        config.model_stack_from_pulumi_config({"warmstart:platform": "prod", "warmstart:model": json.dumps(model),
                                               "warmstart:tags": json.dumps({"aws:x": "y"})})

    def pool(tags):
        return {**env, "gpuPools": [{"name": "l40s", "instanceTypes": ["g6e.2xlarge"], "capacity": {
            "types": ["reserved", "onDemand"], "reservations": [{"tags": tags}]}}]}

    config.parse_config(pool({"team": "*", "aws:cloudformation:stack-name": "gpu"}))
    with pytest.raises(ConfigErrors, match=r"reservations\[0\]\.tags: tag key 'kkkk.*' is 129 characters"):
        config.parse_config(pool({"k" * 129: "*"}))


@pytest.mark.parametrize("reserved,max_gpus,noted", [(3, 16, True), (2, 16, False), (1, None, False), (5, 32, True)])
def test_reserved_nodes_beyond_the_pools_gpu_limit_are_a_note(reserved, max_gpus, noted):
    """Reserved capacity is billed whether used or not: a pool whose `maxGpus` lets it run fewer
    nodes than `capacity.reservedNodes` says so, with the idle nodes' price where it is known."""
    from warmstart import config, render
    from warmstart.plan.stack import plan_stack

    pool = {"name": "h100", "instanceTypes": ["p5.48xlarge"], "hourlyPriceUsd": 50.0, "capacity": {
        "types": ["reserved", "onDemand"], "reservations": [{"id": "cr-0123456789abcdef0"}], "reservedNodes": reserved}}
    if max_gpus is not None:
        pool["maxGpus"] = max_gpus
    p = plan_stack(config.parse_config({"clusterMode": "karpenter", "region": "us-east-1", "gpuPools": [pool], "models": [
        {"name": "qwen", "source": "org/qwen", "weightsGiB": 67, "pool": "h100"}]}), "test")
    usable = p.cluster.pools[0].max_gpus // 8
    notes = [line for line in render.table(p).splitlines() if "reservedNodes" in line and "never used" in line]
    assert bool(notes) == noted == (reserved > usable), (usable, notes)
    if noted:
        (note,) = notes
        idle = reserved - usable
        assert f"{idle} reserved node(s) are billed and never used (${idle * 50:,.2f}/h" in note, note
        assert f"raise gpuPools[].maxGpus to {reserved * 8}" in note


def test_a_huge_value_is_cut_in_its_message(tmp_path, monkeypatch, capsys):
    """A value the message echoes (here a 30,000-character model name) is cut, so the line stays
    one short line."""
    rc, _, err = _render_err(tmp_path, monkeypatch, capsys, {
        "warmstart:clusterMode": "auto", "warmstart:region": "us-west-2",
        "warmstart:gpuPools": [{"name": "l40s", "instanceTypes": ["g6e.2xlarge"]}],
        "warmstart:models": [{"name": "a" * 30_000, "source": "org/a", "weightsGiB": 15, "pool": "l40s"}]})
    assert rc == cli.EXIT_CONFIG and "warmstart:models[0].name='aaaa" in err, err[:300]
    assert "(cut, 30000 characters)" in err and max(len(line) for line in err.splitlines()) < 500, err[:600]


def test_rekeyed_moves_only_the_inner_components_keys():
    from warmstart.errors import ConfigError, rekeyed

    errors = [ConfigError("ServedModelArgs.model.routing.loadFactor", "r", "f", 9.0),
              ConfigError("ServedModelArgs.model.extraArgs[2]", "r", "f"),
              ConfigError("ServedModelArgs.modelX", "r", "f"),
              ConfigError("ServedModelArgs.platform.namespace", "r", "f")]
    with pytest.raises(ConfigErrors) as err, rekeyed("ServedModelArgs.model", "warmstart:models[1]"):
        raise ConfigErrors(errors)
    assert [e.key for e in err.value.errors] == ["warmstart:models[1].routing.loadFactor", "warmstart:models[1].extraArgs[2]",
                                                 "ServedModelArgs.modelX", "ServedModelArgs.platform.namespace"]
    assert err.value.errors[0].value == 9.0
    with pytest.raises(ConfigError) as one, rekeyed("ModelRouterArgs", "m.routing", {"mode": "policy"}):
        raise ConfigError("ModelRouterArgs.mode", "r", "f", "x")
    assert str(one.value) == "m.routing.policy='x': r; fix: f"


def test_a_top_level_true_from_pulumi_gets_the_hint_as_a_possibility():
    """Pulumi hands a top-level key's unquoted boolean as the text `true`, the same as a quoted
    "true": without the stack file the hint says what YAML would have read, as a possibility."""
    from warmstart import config

    base = {"warmstart:region": "us-west-2", "warmstart:gpuPools": json.dumps([{"name": "l40s", "instanceTypes": ["g6e.2xlarge"]}])}
    with pytest.raises(ConfigErrors) as err:
        config.from_pulumi_config({**base, "warmstart:clusterMode": "false"})
    (e,) = err.value.errors
    assert e.key == "warmstart:clusterMode" and "if the stack file has it unquoted, YAML read `no` or `off` or `false`" \
        " as the boolean false" in e.rule and e.fix == "use one of: 'auto' or 'karpenter'", e


def test_a_stack_file_that_is_not_utf8_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "stacks").mkdir()
    (tmp_path / "Pulumi.yaml").write_text("name: warmstart\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks" / "Pulumi.latin1.yaml").write_bytes("config:\n  warmstart:tags: {équipe: ml}\n".encode("latin-1"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["validate", "--stack", "latin1"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "stacks/Pulumi.latin1.yaml: not UTF-8 text (byte 27 is b'\\xe9'); fix: save the file as UTF-8" in err, err


def test_a_stack_name_too_long_for_the_derived_name_prefix_names_the_stack_and_namePrefix(tmp_path, monkeypatch,
                                                                                            capsys):
    """No namePrefix: it is `ws-<stack>`; a stack name that makes it too long (its roles' names
    would be refused by IAM) is reported against warmstart:namePrefix with the stack's name, not
    as a component's Args field (or a traceback)."""
    stack = "a-very-long-stack-name-for-a-team"
    doc = yaml.safe_load((Path(__file__).parent / "standby-over-the-pool-limit.yaml").read_text())
    doc["config"]["warmstart:gpuPools"][0].pop("maxGpus")
    rc, _, err = _render_err(tmp_path, monkeypatch, capsys, doc["config"], stack=stack)
    assert rc == cli.EXIT_CONFIG, err
    assert f"warmstart:namePrefix='{stack}': not set, so it is derived from the stack name '{stack}'" in err, err
    assert "fix: set warmstart:namePrefix" in err and "ServingPlatformArgs" not in err
