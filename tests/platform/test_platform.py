"""ServingPlatform from its own Args, its `PlatformArgs` output, and that output as the
document a platform stack exports and a model stack reads back."""

from __future__ import annotations

import dataclasses
import json

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import components
from components import platform as platform_component
from components.platform import POD_SCRIPTS, PlatformArgs
from components.model_args_gen import camel_case
from components.serving import ScraperPodsArgs
from tests.support import config_reach as reach
from tests.support.hand_args import hand_args_gaps
from tests.support.platforms import PLATFORM
from tests.support.stacks import STACKS_DIR, render_stack
from warmstart import mocks
from warmstart.plan import platform as contract
from warmstart.config import CompileCacheConfig, LoaderTuning, ScraperPodsConfig
from warmstart.plan import platform_args


def _platform(**more):
    built = {}
    args = {"platform": PLATFORM} | more
    resources = mocks.run(lambda: built.setdefault("p", components.ServingPlatform("research", args)),  # type: ignore[arg-type]
                          region="us-east-1", stack="alone")
    return built["p"], resources


def _kinds(resources):
    return sorted(r.inputs["kind"] for r in resources if r.typ.startswith("kubernetes:") and "kind" in r.inputs)


def test_it_ships_every_pod_script_once_into_its_namespace_and_offers_them():
    p, rs = _platform()
    maps = [r.inputs for r in rs if r.typ == "kubernetes:core/v1:ConfigMap"]
    assert sorted(m["metadata"]["name"] for m in maps) == sorted(c for _, c, _ in POD_SCRIPTS)
    assert {m["metadata"]["namespace"] for m in maps} == {"inference"}
    assert _kinds(rs).count("Namespace") == 1
    # Nothing staged, no spares: no PriorityClasses, no node-feature-discovery.
    assert "PriorityClass" not in _kinds(rs) and not [r for r in rs if r.typ.endswith(":Release")]
    assert p.args["pod_scripts"] is True and p.args["node_cache"] is False
    for r in rs:
        if r.typ.startswith("kubernetes:") and "apiVersion" in r.inputs:
            kubernetes_validate.validate(r.inputs, "1.33", strict=True)


def test_its_output_is_a_platform_args_a_served_model_deploys_on():
    built = {}

    def program():
        p = components.ServingPlatform("research", {"platform": PLATFORM})
        built["m"] = components.ServedModel("research-llama-70b", {
            "model": {"name": "llama-70b", "source": "s3://team-models/llama", "weights_gib": 140, "pool": "h100",
                      "node_cache": "on"}, "platform": p.args | {"node_cache": True}},
            opts=__import__("pulumi").ResourceOptions(depends_on=p.ready))

    _, rs = _platform(platform=PLATFORM | {"node_cache": True})
    assert "PriorityClass" in _kinds(rs) and [r for r in rs if r.typ.endswith(":Release")]
    rs = mocks.run(program, region="us-east-1", stack="alone")
    # The model uses the platform's scripts instead of shipping its own.
    own = [r for r in rs if r.typ == "kubernetes:core/v1:ConfigMap" and r.inputs["metadata"]["name"].startswith("llama")]
    assert own == [] and built["m"].plan.staged


def test_warm_spares_and_the_docker_hub_cache_are_its_own():
    spares = {"h100": {"warm_nodes": 1, "instance_type": "p5.48xlarge", "gpus": 8}}
    _, rs = _platform(platform=PLATFORM | {"image_cache_account": "123456789012"}, warm_spares=spares,
                      docker_hub_credential_arn="arn:aws:secretsmanager:us-east-1:123456789012:secret:ecr-pullthroughcache/hub")
    assert [r.name for r in rs if r.typ == "kubernetes:apps/v1:Deployment"] == ["research-h100-warm-spare"]
    assert "PriorityClass" in _kinds(rs)
    (rule,) = [r for r in rs if r.typ == "aws:ecr/pullThroughCacheRule:PullThroughCacheRule"]
    assert rule.inputs["ecrRepositoryPrefix"] == "docker-hub"


def _by_urn(resources):
    return {r.urn: (r.typ, json.dumps(r.inputs, sort_keys=True, default=str)) for r in resources}


@pytest.mark.parametrize("switch, gone", [
    ({"create_namespace": False}, ["kubernetes:core/v1:Namespace"]),
    ({"create_node_feature_discovery": False}, ["kubernetes:helm.sh/v3:Release"]),
    ({"create_namespace": False, "create_node_feature_discovery": False},
     ["kubernetes:core/v1:Namespace", "kubernetes:helm.sh/v3:Release"]),
])
def test_a_namespace_or_node_feature_discovery_of_the_users_own_is_not_created_and_the_rest_is_unchanged(switch, gone):
    """The `create` switches remove exactly the part the user owns: every other object is the
    same (URN and inputs), still valid, in the same namespace, and the platform still says it
    stages (node-feature-discovery is there, only not its)."""
    spares = {"h100": {"warm_nodes": 1, "instance_type": "p5.48xlarge", "gpus": 8}}
    staged = PLATFORM | {"node_cache": True}
    ours_p, ours = _platform(platform=staged, warm_spares=spares)
    theirs_p, theirs = _platform(platform=staged, warm_spares=spares, **switch)
    a, b = _by_urn(ours), _by_urn(theirs)
    assert sorted(t for u, (t, _) in a.items() if u not in b) == gone and set(b) <= set(a)
    assert {u: v for u, v in a.items() if u in b} == b
    assert theirs_p.args == ours_p.args and theirs_p.args["node_cache"] is True
    removed = {u for u in a if u not in b}
    for r in theirs:
        assert not removed & set(r.dependencies), f"{r.name} still waits for a resource not created"
        if r.typ.startswith("kubernetes:") and "apiVersion" in r.inputs:
            kubernetes_validate.validate(r.inputs, "1.33", strict=True)
            assert r.inputs["metadata"].get("namespace", "inference") == "inference"


def test_platform_args_and_the_checked_contract_have_the_same_facts():
    """One declaration per platform fact (PlatformArgsSpec): the components' TypedDict has
    exactly its keys, and the checked view the planners read is derived from it, so a new fact
    cannot reach one and not the other."""
    spec = set(platform_args.PlatformArgsSpec.model_fields) - {"contract_version", "warmstart_version"}
    assert set(PlatformArgs.__annotations__) == spec
    assert set(platform_component.PlatformPoolArgs.__annotations__) == set(platform_args.PoolArgsSpec.model_fields)
    assert {f.name for f in dataclasses.fields(contract.Contract)} == spec - {"kubeconfig"}


# The fields of the exported document that are no PlatformArgs key (its contract's and warmstart's versions).
DOCUMENT_ONLY = frozenset({"contract_version", "warmstart_version"})


def test_platform_args_and_every_type_nested_in_it_have_the_validators_keys_at_every_depth():
    """PlatformArgs is written by hand (tests/support/hand_args.py says why), its nested types too
    (`LoaderArgs`, `PlatformCompileCacheArgs`, `PlatformMonitoringArgs`, `ScraperPodsArgs`,
    `NonGpuPlacementArgs`, ...): each has exactly the keys, in the schema's camelCase, and the
    required ones of the model that validates it, so a field added to `LoaderTuning`,
    `CompileCacheConfig` or a platform fact without its Args key fails here, naming the file."""
    assert hand_args_gaps(platform_args.PlatformArgsSpec, PlatformArgs, skip=DOCUMENT_ONLY) == []
    # The Prometheus pods a platform names are the stack config's `monitoring.scraper`.
    assert hand_args_gaps(ScraperPodsConfig, ScraperPodsArgs) == []


@pytest.mark.parametrize("field, model", [("loader", LoaderTuning), ("compile_cache", CompileCacheConfig)])
def test_a_config_field_the_platform_carries_without_its_args_key_is_named_with_the_file(field, model):
    probe = reach.replace_field(platform_args.PlatformArgsSpec, field, reach.with_probe(model))
    (gap,) = hand_args_gaps(probe, PlatformArgs, skip=DOCUMENT_ONLY)
    args = PlatformArgs.__annotations__[field].__args__[0]
    assert gap.startswith(f"PlatformArgsSpec.{camel_case(field)}.throwawayProbe ") and \
        f"has no key in {args.__name__} ({args.__module__.replace('.', '/')}.py)" in gap, gap


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_the_plan_gives_every_fact_the_program_does_not(stack):
    """`platform_facts` returns exactly the facts a platform's plan decides: with those the
    program adds from its resources, every PlatformArgsSpec fact (but the document's versions)."""
    from warmstart import config
    from warmstart.plan import stack as plan_stack

    cfg = config.from_pulumi_config(config.read_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml"))
    facts = contract.platform_facts(plan_stack.plan_stack(cfg, stack))
    resources = set(platform_args.resource_facts())
    assert resources and not resources & set(facts)
    assert set(facts) | resources == set(platform_args.PlatformArgsSpec.model_fields) - {"contract_version", "warmstart_version"}


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_the_exported_document_reads_back_as_the_same_platform_args(stack):
    """What a platform stack exports (`warmstartPlatform`) is its PlatformArgs in the schema's
    camelCase, and a model stack reads exactly those facts back."""
    doc = render_stack(stack).outputs[contract.OUTPUT]
    assert doc["contractVersion"] == contract.CONTRACT_VERSION and "clusterMode" in doc and "podScripts" in doc
    back = contract.platform_args(doc, stack, "reader")
    assert contract.document(back) == doc
    # The same facts, checked, as the planners read them.
    assert contract.from_args(back) == contract.parse(doc, stack, "reader")


def test_a_platform_exported_before_pod_scripts_were_listed_still_offers_them():
    doc = render_stack("staging").outputs[contract.OUTPUT]
    old = {k: v for k, v in doc.items() if k != "podScripts"}
    assert contract.parse(old, "staging", "reader").pod_scripts is True


_LABEL_KEY = st.from_regex(r"[a-z]([a-z0-9-]{0,4}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,4}[a-z0-9])?)?\.(io|com)/[A-Za-z]([A-Za-z0-9_.-]{0,12}[A-Za-z0-9])?",
                           fullmatch=True)
_TOLERATION = st.one_of(
    st.builds(lambda k, v, e: {"key": k, "operator": "Equal", "value": v, "effect": e},
              _LABEL_KEY, st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True), st.sampled_from(["NoSchedule", "NoExecute"])),
    st.builds(lambda k: {"key": k, "operator": "Exists"}, _LABEL_KEY))


@settings(max_examples=40, deadline=None)
@given(selector=st.dictionaries(_LABEL_KEY, st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True), max_size=3),
       tolerations=st.lists(_TOLERATION, max_size=2))
def test_a_non_gpu_placement_reads_back_from_the_exported_document(selector, tolerations):
    """`nonGpuPlacement` crosses the contract intact: camelCase field names, label keys (with
    capitals and underscores) never re-cased, the same placement on the other side."""
    from warmstart.decisions import placement

    wanted = {"node_selector": selector, "tolerations": tolerations}
    args = dict(PLATFORM) | {"non_gpu_placement": wanted}
    doc = contract.document(args)
    assert doc["nonGpuPlacement"]["nodeSelector"] == selector
    back = contract.platform_args(json.loads(json.dumps(doc)), "research", "reader")
    assert contract.from_args(back).non_gpu_placement == placement.placement_from_args(wanted)
    assert contract.from_args(back).non_gpu_placement.args() == wanted | {
        "tolerations": [placement.Toleration(t["key"], t["operator"], t.get("value"), t.get("effect")).as_dict()
                        for t in tolerations]}
