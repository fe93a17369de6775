"""GPU capacity a team can get: reservations (ODCRs, Capacity Blocks), spot with fallback, on-demand.

- What the pools render (node class selector terms, NodePool capacity types, Karpenter's feature
  gate) is validated against the vendored CRDs, in both cluster modes.
- A selector term the CRD would refuse (its schema, or a CEL rule a schema validator does not
  evaluate) is a config error first, naming the term.
- Spot only where every model survives an interruption.
"""

from __future__ import annotations

import copy
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.node_classes import crd_schema, validator
from tests.support.stacks import load_stack_doc, render_doc, render_stack
from warmstart import config
from warmstart.decisions import capacity, karpenter
from warmstart.errors import ConfigError, ConfigErrors
from warmstart.manifests import gpu_pools as manifests
from warmstart.plan import stack as plan

SCHEMAS = Path(__file__).parent.parent / "schemas"
MODES = ("auto", "karpenter")
TERMS = "capacityReservationSelectorTerms"


def _terms_schema() -> dict[str, Any]:
    return crd_schema("karpenter.k8s.aws_ec2nodeclasses.yaml")["properties"]["spec"]["properties"][TERMS]


def _cel_refuses(terms: list[dict]) -> list[str]:
    """The EC2NodeClass CRD's CEL rules on the selector terms, evaluated here (jsonschema does not
    evaluate CEL): each rule is read from the CRD, so a changed rule fails the check below."""
    schema = _terms_schema()
    rules = {v["rule"]: v["message"] for v in schema["x-kubernetes-validations"]}
    tag_rule = schema["items"]["properties"]["tags"]["x-kubernetes-validations"][0]
    # The three rules this function implements, as the CRD spells them.
    assert set(rules) == {"self.all(x, has(x.tags) || has(x.id) || has(x.instanceMatchCriteria))",
                          "!self.all(x, has(x.id) && (has(x.tags) || has(x.ownerID) || has(x.instanceMatchCriteria)))"}
    assert tag_rule["rule"] == "self.all(k, k != '' && self[k] != '')"
    refused = []
    if not all("tags" in x or "id" in x or "instanceMatchCriteria" in x for x in terms):
        refused.append(rules["self.all(x, has(x.tags) || has(x.id) || has(x.instanceMatchCriteria))"])
    if terms and all("id" in x and ("tags" in x or "ownerID" in x or "instanceMatchCriteria" in x) for x in terms):
        refused.append(rules["!self.all(x, has(x.id) && (has(x.tags) || has(x.ownerID) || has(x.instanceMatchCriteria)))"])
    if any(k == "" or v == "" for x in terms for k, v in (x.get("tags") or {}).items()):
        refused.append(tag_rule["message"])
    return refused


def _stack(mode: str, pool_capacity: dict, models: list[dict] | None = None, **pool: Any) -> dict:
    return {
        "clusterMode": mode, "region": "us-east-1",
        "gpuPools": [{"name": "h100", "instanceTypes": ["p5.48xlarge"], "capacity": pool_capacity, **pool}],
        "models": models if models is not None else [
            {"name": "qwen", "source": "org/qwen", "weightsGiB": 67, "pool": "h100",
             "autoscaling": {"minReplicas": 2, "maxReplicas": 4}}],
    }


def _plan(values: dict) -> plan.StackPlan:
    return plan.plan_stack(config.parse_config(values), "test")


def _objects(p: plan.StackPlan) -> list[dict]:
    """Every pool's node class and NodePool, as the Cluster component registers them."""
    mode = p.cluster.mode
    out = []
    for pool in p.cluster.pools:
        subnets = [{"id": "subnet-0123456789abcdef0"}] if mode == "auto" else [{"tags": {"karpenter.sh/discovery": "c"}}]
        groups = [{"id": "sg-0123456789abcdef0"}] if mode == "auto" else [{"tags": {"karpenter.sh/discovery": "c"}}]
        out.append(manifests.node_class(mode, pool, role="ws-test-gpu-node", subnet_terms=subnets,
                                        security_group_terms=groups, tags={"environment": "test"}))
        out.append(manifests.node_pool(mode, pool))
    return out


def _errors(values: dict) -> str:
    with pytest.raises((ConfigError, ConfigErrors)) as err:
        _plan(values)
    return str(err.value)


FUTURE = (datetime.now(timezone.utc) + timedelta(days=30)).replace(microsecond=0).isoformat()
VALID_CAPACITIES = {
    "odcr-by-id": {"types": ["reserved", "onDemand"], "reservations": [{"id": "cr-0123456789abcdef0"}]},
    "odcr-by-tags-of-an-owner": {"types": ["reserved", "onDemand"],
                                 "reservations": [{"tags": {"team": "inference", "purpose": "*"}, "ownerId": "111122223333"},
                                                  {"id": "cr-0fedcba9876543210"}]},
    "reserved-only": {"types": ["reserved"], "reservations": [{"id": "cr-0123456789abcdef0"}], "reservedNodes": 3},
    "capacity-block": {"types": ["reserved"], "reservations": [{"id": "cr-0123456789abcdef0"}],
                       "capacityBlock": {"endsAt": FUTURE}},
    "spot-with-fallback": {"types": ["spot", "onDemand"]},
    "everything": {"types": ["reserved", "spot", "onDemand"], "reservations": [{"tags": {"team": "inference"}}]},
}


# --------------------------------------------------------------------------------------
# Rendered objects against the vendored CRDs


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(VALID_CAPACITIES))
def test_rendered_pools_with_reservations_validate_against_the_crds(mode, case):
    p = _plan(_stack(mode, VALID_CAPACITIES[case]))
    (pool,) = p.cluster.pools
    objects = _objects(p)
    for obj in objects:
        errors = sorted(validator(obj["kind"]).iter_errors(obj), key=str)
        assert not errors, f"{case}/{obj['kind']}: {[e.message for e in errors]}"
    node_class = next(o for o in objects if o["kind"] != "NodePool")
    terms = node_class["spec"].get(TERMS, [])
    if mode == "karpenter":
        assert not _cel_refuses(terms)
    # The NodePool may launch exactly the pool's capacity types, reserved only with a selector.
    (req,) = [r for r in next(o for o in objects if o["kind"] == "NodePool")["spec"]["template"]["spec"]["requirements"]
              if r["key"] == "karpenter.sh/capacity-type"]
    assert sorted(req["values"]) == sorted(config.CAPACITY_TYPE_LABEL_VALUE[t] for t in VALID_CAPACITIES[case]["types"])
    assert ("reserved" in req["values"]) == bool(terms) == pool.capacity.reserved
    # Each term selects by id alone, or by tags (and an owner, in the mode's own spelling).
    owner_key = "ownerID" if mode == "karpenter" else "owner"
    for term, given in zip(terms, VALID_CAPACITIES[case].get("reservations", [])):
        assert term == ({"id": given["id"]} if "id" in given else
                        {"tags": given["tags"], **({owner_key: given["ownerId"]} if "ownerId" in given else {})})


def test_the_shipped_prod_stack_takes_p5_from_a_reservation_then_on_demand():
    r = render_stack("prod")
    (pool,) = [p for p in r.stack_plan.cluster.pools if any(i.family == "p5" for i in p.instances)]
    assert pool.capacity.types == ("reserved", "onDemand")
    assert pool.capacity.placeholder_ids == (capacity.PLACEHOLDER_RESERVATION_ID,)
    (nc,) = [o for o in r.kind("EC2NodeClass") if o["metadata"]["name"] == pool.name]
    assert nc["spec"][TERMS] == [{"id": capacity.PLACEHOLDER_RESERVATION_ID}]
    assert not list(validator("EC2NodeClass").iter_errors(nc)) and not _cel_refuses(nc["spec"][TERMS])
    # The reservation is only used with the feature gate on (it is the chart's default in 1.14, and
    # set explicitly so a chart default never decides it).
    (controller,) = [x for x in r.of_type("kubernetes:helm.sh/v3:Release") if x.inputs.get("name") == "karpenter"]
    assert controller.inputs["values"]["settings"]["featureGates"] == {"reservedCapacity": True}


def test_the_feature_gate_is_a_key_of_the_pinned_chart():
    values = yaml.safe_load((SCHEMAS / "karpenter" / "helm-values-v1.14.1.yaml").read_text())
    assert capacity.RESERVED_CAPACITY_FEATURE_GATE in values["settings"]["featureGates"]


def test_a_stack_without_reservations_leaves_the_karpenter_chart_as_it_was():
    v = karpenter.controller_values("c", "c", {}, "repo:1.0@sha256:" + "0" * 64)
    assert "featureGates" not in v["settings"]
    assert karpenter.controller_values("c", "c", {}, "repo:1.0@sha256:" + "0" * 64,
                                       reserved_capacity=True)["settings"]["featureGates"] == {"reservedCapacity": True}


def test_the_controller_may_describe_and_launch_into_reservations():
    docs = karpenter.controller_policies("aws", "us-east-1", "111122223333", "c", "arn:aws:iam::111122223333:role/n",
                                         "arn:aws:sqs:us-east-1:111122223333:c")
    reads = [s for s in docs["resource-discovery"]["Statement"] if s["Sid"] == "AllowRegionalReadActions"]
    assert "ec2:DescribeCapacityReservations" in reads[0]["Action"]
    assert reads[0]["Condition"] == {"StringEquals": {"aws:RequestedRegion": "us-east-1"}}
    (launch,) = [s for s in docs["node-lifecycle"]["Statement"] if s["Sid"] == "AllowScopedEC2InstanceAccessActions"]
    assert "arn:aws:ec2:us-east-1:*:capacity-reservation/*" in launch["Resource"]
    # A reservation that ends or is reclaimed interrupts its instances: the queue hears of it.
    assert "EC2 Capacity Reservation Instance Interruption Warning" in [
        e["detail-type"][0] for e in karpenter.INTERRUPTION_EVENTS.values()]


@pytest.mark.parametrize("mode", MODES)
def test_a_flipped_prod_renders_its_reservation_in_auto_mode_too(mode, tmp_path):
    doc = copy.deepcopy(load_stack_doc("prod"))
    doc["config"]["warmstart:clusterMode"] = mode
    r = render_doc(doc, tmp_path, stack="prod")
    kind = "NodeClass" if mode == "auto" else "EC2NodeClass"
    # The GPU pool's node class (Karpenter mode also has the general-purpose pool's, without reservations).
    (nc,) = [c for c in r.kind(kind) if c["metadata"]["name"] == r.stack_plan.cluster.pools[0].name]
    assert all(TERMS not in c["spec"] for c in r.kind(kind) if c is not nc)
    assert nc["spec"][TERMS] == [{"id": capacity.PLACEHOLDER_RESERVATION_ID}]
    assert not list(validator(kind).iter_errors(nc))
    for np_ in r.kind("NodePool"):
        assert not list(validator("NodePool").iter_errors(np_))


# --------------------------------------------------------------------------------------
# A selector the CRD would refuse is a config error first


REFUSED_TERMS = {
    # term (config spelling), its EC2NodeClass rendering, the config error expected
    "id-with-tags": ({"id": "cr-0123456789abcdef0", "tags": {"team": "ml"}},
                     {"id": "cr-0123456789abcdef0", "tags": {"team": "ml"}}, "gives `id` together with"),
    "id-with-owner": ({"id": "cr-0123456789abcdef0", "ownerId": "111122223333"},
                      {"id": "cr-0123456789abcdef0", "ownerID": "111122223333"}, "gives `id` together with"),
    "owner-alone": ({"ownerId": "111122223333"}, {"ownerID": "111122223333"}, "has neither `id` nor `tags`"),
    "empty-tag-value": ({"tags": {"team": ""}}, {"tags": {"team": ""}}, "empty tag key or value"),
    "malformed-id": ({"id": "odcr-123"}, {"id": "odcr-123"}, r"String should match pattern '\^cr-\[0-9a-z\]\+\$'"),
    "owner-not-an-account": ({"tags": {"team": "ml"}, "ownerId": "me"}, {"tags": {"team": "ml"}, "ownerID": "me"},
                             r"must be a 12-digit AWS account ID"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_TERMS))
def test_a_selector_term_the_crd_refuses_is_a_config_error_first(case):
    term, rendered, expect = REFUSED_TERMS[case]
    # The CRD does refuse the rendered term: by its schema, or by one of its CEL rules.
    nc = {"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "h100"},
          "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                   "subnetSelectorTerms": [{"id": "subnet-0"}], "securityGroupSelectorTerms": [{"id": "sg-0"}],
                   TERMS: [rendered]}}
    assert list(validator("EC2NodeClass").iter_errors(nc)) or _cel_refuses([rendered]), case
    # ... and warmstart says so before anything renders, naming the pool's key.
    msg = _errors(_stack("karpenter", {"types": ["reserved", "onDemand"], "reservations": [term]}))
    assert "warmstart:gpuPools[0].capacity.reservations[0]" in msg
    assert re.search(expect, msg), msg
    assert "fix:" in msg


def test_more_reservation_terms_than_the_crd_allows_are_refused():
    limit = _terms_schema()["maxItems"]
    terms = [{"id": f"cr-{i:017x}"} for i in range(limit + 1)]
    msg = _errors(_stack("karpenter", {"types": ["reserved"], "reservations": terms}))
    assert "warmstart:gpuPools[0].capacity.reservations" in msg and str(limit) in msg


def test_the_config_field_rules_agree_with_the_crds_patterns():
    crd = _terms_schema()["items"]["properties"]
    ours = config.CapacityReservation.model_json_schema(by_alias=True)["properties"]
    assert ours["id"]["anyOf"][0]["pattern"] == crd["id"]["pattern"]
    assert re.fullmatch(ours["ownerId"]["anyOf"][0]["pattern"].replace(r"\d", "[0-9]"), "111122223333")
    assert crd["ownerID"]["pattern"] == r"^[0-9]{12}$"
    assert ours["tags"]["anyOf"][0]["maxProperties"] == crd["tags"]["maxProperties"]
    assert config.PoolCapacity.model_json_schema(by_alias=True)["properties"]["reservations"]["maxItems"] == \
        _terms_schema()["maxItems"]


# --------------------------------------------------------------------------------------
# Other capacity rules


def test_reservations_without_reserved_are_refused_as_they_would_change_auto_mode_cluster_wide():
    msg = _errors(_stack("auto", {"types": ["onDemand"], "reservations": [{"id": "cr-0123456789abcdef0"}]}))
    assert "selects reservations but capacity.types has no `reserved`" in msg


def test_capacity_and_the_legacy_capacity_types_are_not_both_given():
    msg = _errors(_stack("auto", {"types": ["onDemand"]}, capacityTypes=["on-demand"]))
    assert "warmstart:gpuPools[0].capacityTypes" in msg and "superseded by capacity.types" in msg


def test_a_capacity_block_that_ends_is_refused_once_it_has_ended():
    ends = datetime(2027, 3, 1, 11, 30, tzinfo=timezone.utc)
    values = _stack("karpenter", {"types": ["reserved"], "reservations": [{"id": "cr-0123456789abcdef0"}],
                                  "capacityBlock": {"endsAt": ends.isoformat()}})
    cfg = config.parse_config(values)
    from warmstart.errors import Problems
    from warmstart.plan.cluster import plan_capacity

    for now, ok in ((ends - timedelta(minutes=1), True), (ends, False), (ends + timedelta(days=1), False)):
        problems = Problems()
        plan_capacity(cfg.gpu_pools[0], mode="karpenter", key="k", errors=problems, now=now)
        with (pytest.raises(ConfigErrors) if not ok else _nothing()):
            problems.raise_if_any()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_capacity_block_drain_comes_before_ec2_terminates():
    ends = datetime(2027, 3, 1, 11, 30, tzinfo=timezone.utc)
    drain, terminate = capacity.capacity_block_times(ends)
    assert drain < terminate < ends
    assert ends - terminate == timedelta(minutes=30) and terminate - drain == timedelta(minutes=10)


@pytest.mark.parametrize("version,reserved,block,ok", [
    ("1.2.3", True, False, False), ("1.3.0", True, False, True), ("1.5.9", True, True, False),
    ("1.6.0", True, True, True), ("1.2.0", False, False, True)])
def test_karpenter_versions_that_cannot_use_reservations_are_named(version, reserved, block, ok):
    assert (capacity.karpenter_version_problem(version, reserved, block) is None) == ok


@pytest.mark.parametrize("mode", MODES)
def test_spot_is_accepted_only_where_every_model_has_another_replica(mode):
    fixed_two = [{"name": "a", "source": "org/a", "weightsGiB": 67, "pool": "h100", "replicas": 2}]
    assert _plan(_stack(mode, {"types": ["spot", "onDemand"]}, fixed_two)).cluster.pools[0].capacity.types == (
        "spot", "onDemand")
    scaled_from_one = [{"name": "a", "source": "org/a", "weightsGiB": 67, "pool": "h100",
                        "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}]
    msg = _errors(_stack(mode, {"types": ["spot", "onDemand"]}, scaled_from_one))
    assert "model 'a' runs 1 replica(s) at its fewest" in msg and "warmstart:models[0]" in msg


def test_every_gpu_family_has_its_vcpu_quotas():
    from warmstart.decisions import instances

    for inst in instances.catalog().values():
        q = capacity.quota_class(inst)
        assert re.fullmatch(r"L-[0-9A-F]{8}", q.on_demand_code) and re.fullmatch(r"L-[0-9A-F]{8}", q.spot_code)
    classes = capacity.quota_classes()
    on_demand = {q.on_demand_code for q in classes}
    spot = {q.spot_code for q in classes} | {q.spot_fallback_code for q in classes if q.spot_fallback_code}
    assert not on_demand & spot  # no quota is both
    families = [f for q in classes for f in q.families]
    assert len(set(families)) == len(families)  # each family in one class


def test_the_p5_families_spot_quota_is_its_own_with_the_p_quota_as_fallback():
    # Accounts list "All P5 Spot Instance Requests" (L-C4BD4855) apart from L-7212CCBC ("All P4, P3
    # and P2 Spot Instance Requests"; "All P Spot Instance Requests" where it covers every P family).
    p5 = capacity.quota_class(instances.lookup("p5.48xlarge"))
    p4 = capacity.quota_class(instances.lookup("p4d.24xlarge"))
    assert (p5.spot_code, p5.spot_name) == ("L-C4BD4855", "All P5 Spot Instance Requests")
    assert p5.spot_fallback_code == p4.spot_code == "L-7212CCBC"
    pools = [("h100", ["spot"], [instances.lookup("p5.48xlarge")], 16), ("a100", ["spot"], [instances.lookup("p4d.24xlarge")], 8)]
    assert {n.code: n.vcpus for n in capacity.quota_needs(pools)} == {"L-C4BD4855": 384, "L-7212CCBC": 96}
    # Where the account has no L-C4BD4855, both pools' spot nodes count against L-7212CCBC.
    (moved,) = capacity.quota_needs(pools, unlisted=["L-C4BD4855"])
    assert (moved.code, moved.vcpus, moved.instead_of) == ("L-7212CCBC", 480, "L-C4BD4855")


# --------------------------------------------------------------------------------------
# Cost and where a scale-out's node comes from (the render table)


def _table(values: dict) -> str:
    from warmstart import render

    return render.table(_plan(values))


def test_the_table_prices_each_pool_and_each_model_at_min_and_max_with_spares():
    from warmstart import render

    values = _stack("karpenter", {"types": ["reserved", "onDemand"], "reservations": [{"id": "cr-0123456789abcdef0"}],
                                  "reservedNodes": 1}, hourlyPriceUsd=50.0, warmNodes=1)
    p = _plan(values)
    (m,) = p.models
    # qwen: TP 2 on 8 GPUs, 4 pods a node: 2 replicas -> 1 node, 4 -> 1 node; plus the spare.
    assert render.node_price(p.cluster.pools[0]) == "$50.00"
    assert render.model_cost(p, m) == "$100.00"
    table = render.table(p)
    head, rule, row = table.splitlines()[:3]
    assert "node $/h" in head and "model $/h (min-max)" in head
    assert row.split()[-2:] == ["$50.00", "$100.00"]
    # 2 nodes run (the model's and the spare); the third is beyond the reservation's 1.
    assert "beyond the reservation's 1 nodes (it is node 3), so it falls back to on-demand ($50.00/node-hour)" in table


def test_without_a_price_the_cost_is_unknown_never_invented():
    # A region the shipped price table does not cover: nothing is priced, and the render says why.
    values = _stack("auto", {"types": ["spot", "onDemand"]},
                    [{"name": "a", "source": "org/a", "weightsGiB": 67, "pool": "h100",
                      "autoscaling": {"minReplicas": 2, "maxReplicas": 8}}]) | {"region": "ap-southeast-3"}
    table = _table(values)
    row = table.splitlines()[2]
    assert row.split()[-2:] == ["unknown", "unknown"]
    assert ("its new node comes from spot (price unknown: set gpuPools[].capacity.spotHourlyPriceUsd), then "
            "on-demand (price unknown: set gpuPools[].hourlyPriceUsd) when that has none") in table
    assert ("price h100: unknown: ap-southeast-3 is not in warmstart's price table "
            "(warmstart/data/ondemand_prices.csv); set gpuPools[].hourlyPriceUsd") in table


def test_the_shipped_on_demand_price_stands_in_where_the_stack_gives_none_and_the_stacks_own_wins():
    from warmstart import render

    p = _plan(_stack("karpenter", {"types": ["onDemand"]}))
    pool = p.cluster.pools[0]
    assert (pool.hourly_price_usd, pool.price_source) == (55.04, "on-demand list price, 2025-06")
    assert render.model_cost(p, p.models[0]) == "$55.04"
    assert "price h100: $55.04/node-hour (on-demand list price, 2025-06)" in render.table(p)
    own = _plan(_stack("karpenter", {"types": ["onDemand"]}, hourlyPriceUsd=40.0)).cluster.pools[0]
    assert (own.hourly_price_usd, own.price_source) == (40.0, "hourlyPriceUsd")
    # Spot is never taken from the table: its price moves.
    spot = _plan(_stack("karpenter", {"types": ["spot", "onDemand"]}))
    assert render.model_cost(spot, spot.models[0]) == "unknown"


def test_a_standby_models_sleepers_are_in_the_replicas_column_and_in_its_price():
    """g6e.2xlarge (one GPU a node) with minReplicas 0 and two sleepers: KEDA keeps 2-5 pods, so
    the cost is 2-5 nodes, not 0-3 (issue: `$0.00-$4.48` where the autoscaler keeps more)."""
    from warmstart import render

    values = {"clusterMode": "auto", "region": "us-east-1",
              "gpuPools": [{"name": "l40s", "instanceTypes": ["g6e.2xlarge"]}],
              "models": [{"name": "m", "source": "org/m", "weightsGiB": 15, "pool": "l40s",
                          "autoscaling": {"minReplicas": 0, "maxReplicas": 3},
                          "standby": {"count": 2}}]}
    p = _plan(values)
    (m,) = p.models
    assert render.replicas_cell(m) == "0-3 (KEDA) +2 asleep"
    assert render.model_cost(p, m) == "$4.48-$11.21"
    row = render.table(p).splitlines()[2]
    assert "0-3 (KEDA) +2 asleep" in row and row.endswith("$4.48-$11.21")


def test_spot_and_on_demand_prices_are_shown_apart():
    from warmstart import render

    p = _plan(_stack("karpenter", {"types": ["spot", "onDemand"], "spotHourlyPriceUsd": 20.0}, hourlyPriceUsd=55.0))
    assert render.node_price(p.cluster.pools[0]) == "$20.00 spot / $55.00 on-demand"
    assert render.model_cost(p, p.models[0]) == "$20.00"


def test_auto_mode_reservations_warn_of_the_cluster_wide_effect_and_karpenter_does_not():
    cap = {"types": ["reserved", "onDemand"], "reservations": [{"tags": {"team": "inference"}}]}
    assert "no longer launches into open ODCRs for ANY NodeClass" in _table(_stack("auto", cap))
    assert "open ODCRs" not in _table(_stack("karpenter", cap))


def test_the_table_says_when_a_capacity_block_ends_and_its_nodes_drain():
    cap = {"types": ["reserved", "onDemand"], "reservations": [{"id": "cr-0123456789abcdef0"}],
           "capacityBlock": {"endsAt": "2099-03-01T11:30:00Z"}}
    table = _table(_stack("karpenter", cap))
    assert ("capacity block h100: ends 2099-03-01T11:30:00+00:00; EC2 terminates its instances from "
            "2099-03-01T11:00:00+00:00 and Karpenter drains them from 2099-03-01T10:50:00+00:00, before; then the "
            "pool launches on-demand") in table


def test_a_reserved_only_pool_beyond_its_reservation_says_the_pod_stays_pending():
    cap = {"types": ["reserved"], "reservations": [{"id": "cr-0123456789abcdef0"}], "reservedNodes": 1}
    assert "has no capacity: the reservations hold 1 and the pool allows nothing else" in _table(_stack("karpenter", cap))


# --------------------------------------------------------------------------------------
# Quota needs (pure)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from warmstart.decisions import gpu_pools, instances  # noqa: E402

_TYPES = sorted(instances.catalog())
_ORDERS = [["onDemand"], ["spot", "onDemand"], ["reserved", "onDemand"], ["reserved"], ["spot"], ["reserved", "spot", "onDemand"]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from(_TYPES), min_size=1, max_size=3), st.sampled_from(_ORDERS),
                          st.integers(1, 24)), min_size=1, max_size=4))
def test_each_quota_holds_every_node_of_every_pool_that_may_use_it(pools):
    planned = [(f"p{i}", order, [instances.lookup(t) for t in types], limit)
               for i, (types, order, limit) in enumerate(pools)]
    needs = {n.code: n.vcpus for n in capacity.quota_needs(planned)}
    for q in capacity.quota_classes():
        for code, counts_for in ((q.on_demand_code, {"onDemand", "reserved"}), (q.spot_code, {"spot"})):
            # Each pool at its GPU limit, in the nodes of the types this quota covers.
            expected = sum(count * inst.vcpu for _, order, insts, limit in planned if counts_for & set(order)
                           for inst, count in gpu_pools.launch_nodes(
                               [i for i in insts if code in (capacity.quota_class(i).on_demand_code,
                                                             capacity.quota_class(i).spot_code)], limit))
            assert needs.get(code, 0) == expected


def _most_vcpus_by_search(insts, limit):
    """The most vCPUs of whole nodes within `limit` GPUs, by trying every count of every type."""
    best = 0

    def walk(k, gpus, vcpus):
        nonlocal best
        best = max(best, vcpus)
        for j in range(k, len(insts)):
            if gpus + insts[j].gpu_count <= limit:
                walk(j, gpus + insts[j].gpu_count, vcpus + insts[j].vcpu)
    walk(0, 0, 0)
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(_TYPES), min_size=1, max_size=3, unique=True), st.integers(0, 17))
def test_a_pool_is_counted_at_its_gpu_limit_in_the_worst_mix_of_its_types(types, limit):
    insts = [instances.lookup(t) for t in types]
    nodes = gpu_pools.launch_nodes(insts, limit)
    # Within the limit Karpenter counts against, whole nodes of the pool's own types ...
    assert sum(n * i.gpu_count for i, n in nodes) <= limit
    assert {i.instance_type for i, _ in nodes} <= set(types)
    # ... and no mix of them has more vCPUs (so no single type has either).
    vcpus = sum(n * i.vcpu for i, n in nodes)
    assert vcpus == _most_vcpus_by_search(insts, limit)
    for i in insts:
        assert vcpus >= (limit // i.gpu_count) * i.vcpu


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(_TYPES), st.integers(1, 32))
def test_the_need_grows_with_the_gpu_limit(t, limit):
    inst = instances.lookup(t)

    def need(gpus: int) -> int:
        return sum(n.vcpus for n in capacity.quota_needs([("p", ["onDemand"], [inst], gpus)]))
    assert need(limit) <= need(limit + 1)
    assert need(limit) == (limit // inst.gpu_count) * inst.vcpu


def test_a_mix_of_types_is_counted_at_its_worst_not_at_one_node():
    # g6e.16xlarge: 1 GPU, 64 vCPUs; g6e.12xlarge: 4 GPUs, 48 vCPUs. At maxGpus 4 the pool may
    # hold four g6e.16xlarge (256 vCPUs), not one node of its largest type.
    (need,) = capacity.quota_needs([("l40s", ["onDemand"], [instances.lookup("g6e.12xlarge"),
                                                           instances.lookup("g6e.16xlarge")], 4)])
    assert (need.vcpus, need.pools) == (256, ("l40s (4 x g6e.16xlarge)",))


def test_a_standby_model_on_a_spot_first_pool_is_noted_with_what_an_interruption_costs():
    from warmstart import render

    model = {"name": "qwen", "source": "org/qwen", "weightsGiB": 67, "pool": "h100",
             "autoscaling": {"minReplicas": 2, "maxReplicas": 4}, "standby": {"count": 1}}
    spot = _plan(_stack("karpenter", {"types": ["spot", "onDemand"]}, [model]))
    (note,) = render.standby_spot_notes(spot)
    assert "'qwen' keeps 1 standby engine(s) on pool h100" in note and "spot first" in note
    assert "capacity.types are [onDemand] or start with reserved" in note and note in render.table(spot)
    assert render.standby_spot_notes(_plan(_stack("karpenter", {"types": ["onDemand"]}, [model]))) == []
