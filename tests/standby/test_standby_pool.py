"""Pooled standby's pure plan (warmstart/decisions/standby_pool.py): the GPU budget beside the
sleepers, host RAM at each sleep level, the member rules and their refusals, the wake paths, the
replacement host's window and the spares' cost. The engine host that runs the plan is tested for
real in tests/podside/test_engine_host.py."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from warmstart.decisions import instances, phases, tuning
from warmstart.decisions import standby as standby_mod
from warmstart.decisions import standby_pool as sp
from warmstart.decisions.instances import GIB
from warmstart.errors import ConfigError, ConfigErrors

GPU_TYPES = sorted(instances.catalog())


def spec(instance_type: str = "p5.48xlarge", gpus: int = 1, **kw) -> sp.PoolSpec:
    return sp.PoolSpec(name="shared", key="warmstart:standbyPools[0]", namespace="inference",
                       instance=instances.lookup(instance_type), gpus=gpus, **kw)


def member(i: int, gib: float = 15.0, instance_type: str = "p5.48xlarge", tp: int = 1, **kw) -> sp.PoolMember:
    return sp.PoolMember(name=f"m{i}", key=f"warmstart:models[{i}]", namespace=kw.pop("namespace", "inference"),
                         instance_type=instance_type, tensor_parallel_size=tp, weights_bytes=int(gib * GIB), **kw)


def errors_of(s: sp.PoolSpec, members: list[sp.PoolMember]) -> list[ConfigError]:
    with pytest.raises(ConfigErrors) as caught:
        sp.plan_pool(s, members)
    return caught.value.errors


# --- the GPU budget ------------------------------------------------------------------------------


@given(gpu_gib=st.integers(16, 200), engines=st.integers(1, 8), residue_mib=st.integers(0, 12 * 1024))
def test_the_awake_engine_and_every_sleeper_fit_on_the_gpu(gpu_gib: int, engines: int, residue_mib: int) -> None:
    total, residue = gpu_gib * GIB, residue_mib * 2**20
    u = sp.derived_utilization(total, engines, residue)
    if u <= 0:
        return
    # The awake engine's budget, its own context and the other sleepers, and the headroom: within the GPU.
    assert u * total + engines * residue + sp.HEADROOM_FRACTION * total <= total + 1
    # And not needlessly small: one step more would break the bound.
    assert (u + sp.UTILIZATION_STEP) * total + engines * residue + sp.HEADROOM_FRACTION * total > total


@given(gpu_gib=st.integers(16, 200), engines=st.integers(1, 7), residue_mib=st.integers(0, 12 * 1024),
       more_mib=st.integers(0, 4096))
def test_more_or_larger_sleepers_never_raise_the_awake_engines_utilization(gpu_gib: int, engines: int, residue_mib: int,
                                                                            more_mib: int) -> None:
    total, residue = gpu_gib * GIB, residue_mib * 2**20
    u = sp.derived_utilization(total, engines, residue)
    assert sp.derived_utilization(total, engines + 1, residue) <= u
    assert sp.derived_utilization(total, engines, residue + more_mib * 2**20) <= u


@settings(max_examples=60)
@given(instance_type=st.sampled_from(GPU_TYPES), n=st.integers(1, 8), gib=st.floats(0.5, 40),
       residue_gib=st.none() | st.floats(0.5, 10))
def test_a_pool_that_plans_passes_vllms_start_check_for_every_engine_in_turn(instance_type: str, n: int, gib: float,
                                                                             residue_gib: float | None) -> None:
    inst = instances.lookup(instance_type)
    s = spec(instance_type, residue_bytes=None if residue_gib is None else int(residue_gib * GIB))
    try:
        plan = sp.plan_pool(s, [member(i, gib, instance_type) for i in range(n)])
    except ConfigErrors:
        return
    # vLLM refuses to start when free memory < total x utilization (gpu_worker.init_device): engine
    # k starts beside k sleepers, so every k in start order must pass.
    assert all(plan.gpu.start_fits(k) for k in range(n))
    for e in plan.engines:
        assert e.gpu_memory_utilization <= plan.gpu.utilization
        # Its weights leave the TP rule's KV share under the derived utilization.
        assert e.weights_bytes <= inst.gpu_memory_bytes * (e.gpu_memory_utilization - tuning.MIN_KV_CACHE_FRACTION)
    assert sum(1 for _ in plan.engines) == n


def test_a_measured_residue_replaces_the_default_and_is_named_as_measured() -> None:
    default = sp.plan_pool(spec(), [member(i) for i in range(4)])
    measured = sp.plan_pool(spec(residue_bytes=int(1.5 * GIB)), [member(i) for i in range(4)])
    assert not default.gpu.residue_measured and measured.gpu.residue_measured
    assert measured.gpu.utilization > default.gpu.utilization
    assert default.gpu.residue_bytes == sp.DEFAULT_RESIDUE_BYTES
    # At TP > 1 the default counts NCCL's and the custom all-reduce's buffers too.
    assert sp.default_residue_bytes(2) > sp.default_residue_bytes(1)


def test_a_models_own_lower_utilization_is_kept_never_raised() -> None:
    plan = sp.plan_pool(spec(), [member(0, gpu_memory_utilization=0.5), member(1)])
    by = {e.model: e.gpu_memory_utilization for e in plan.engines}
    assert by["m0"] == 0.5 and by["m1"] == plan.gpu.utilization > 0.5


def test_too_many_sleepers_for_the_weights_is_refused_with_the_figures() -> None:
    # Eight 40 GiB models on one 80 GiB H100: 8 x 4 GiB of residue leaves 0.58, and 40 GiB > 0.43 x 80.
    errs = errors_of(spec(), [member(i, 40) for i in range(8)])
    assert errs and all(e.key.endswith(".standby.pool") for e in errs)
    text = str(errs[0])
    for figure in ("0.58", "4.0 GiB", "the planning default", "40.0 GiB per GPU", "wake-bench", "sleepingResidueGiB"):
        assert figure in text, text
    # The same models, two per pool, fit: the refusal is about the sleepers, not the model.
    sp.plan_pool(spec(), [member(i, 40) for i in range(2)])


# --- host RAM ------------------------------------------------------------------------------------


@settings(max_examples=60)
@given(instance_type=st.sampled_from(GPU_TYPES), gibs=st.lists(st.floats(0.5, 60), min_size=1, max_size=6))
def test_auto_picks_level_1_exactly_where_host_ram_holds_every_members_weights(instance_type: str,
                                                                                 gibs: list[float]) -> None:
    s = spec(instance_type)
    members = [member(i, g, instance_type) for i, g in enumerate(gibs)]
    one = sp.host_memory(s.instance, 1, members, 1)
    two = sp.host_memory(s.instance, 1, members, 2)
    # Level 1 holds every member's weights on top of what level 2 holds.
    assert one.need_bytes - two.need_bytes == sum(m.weights_bytes for m in members)
    assert one.need_bytes == sum(standby_mod.sleeping_host_bytes(m.weights_bytes, 1) for m in members) + one.shm_bytes
    level, _, host, err = sp.choose_sleep_level(s, members)
    if one.fits:
        assert (level, err) == (1, None) and host.fits
    elif two.fits:
        assert (level, err) == (2, None) and host.fits
    else:
        assert err is not None and err.key.endswith(".sleepLevel")


def test_level_1_that_does_not_fit_is_refused_naming_each_member_and_the_limit() -> None:
    # g6e.2xlarge: 64 GiB of RAM for one GPU; three 14 GiB models pin 42 GiB + 3 processes + shm.
    s = spec("g6e.2xlarge", sleep_level=1)
    members = [member(i, 14, "g6e.2xlarge") for i in range(3)]
    err = next(e for e in errors_of(s, members) if e.key.endswith(".sleepLevel"))
    for part in ("m0 22.0", "m1 22.0", "m2 22.0", "GiB limit", "sleepLevel: 2 or auto", "g6e.2xlarge"):
        assert part in str(err), str(err)
    auto = sp.plan_pool(spec("g6e.2xlarge"), members)
    assert auto.sleep_level == 2 and "level 1 would need" in auto.sleep_level_reason


# --- member rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("bad, key_end, words", [
    (dict(extra_args=("--trust-remote-code",)), ".extraArgs", "runs remote code"),
    (dict(extra_args=("--trust-remote-code=true",)), ".extraArgs", "runs remote code"),
    (dict(namespace="other"), ".standby.pool", "one namespace"),
    (dict(instance_type="p4d.24xlarge"), ".standby.pool", "p5.48xlarge"),
    (dict(tp=2), ".standby.pool", "tensorParallelSize=2"),
    (dict(autoscaled=False), ".standby.pool", "no autoscaling"),
    (dict(routed=False), ".standby.pool", "routing is none"),
    (dict(per_model_standby=True), ".standby", "one kind of standby"),
])
def test_each_member_rule_refuses_with_the_models_key_and_a_fix(bad: dict, key_end: str, words: str) -> None:
    kw = dict(bad)
    m = member(1, 15, kw.pop("instance_type", "p5.48xlarge"), kw.pop("tp", 1), **kw)
    errs = errors_of(spec(), [member(0), m])
    assert len(errs) == 1, errs
    assert errs[0].key == f"warmstart:models[1]{key_end}" and words in errs[0].rule and errs[0].fix
    # The same model without the fault plans.
    sp.plan_pool(spec(), [member(0), member(1)])


def test_an_empty_pool_a_crowded_one_and_a_bad_gpu_set_are_refused() -> None:
    assert "has no member" in str(errors_of(spec(), []))
    crowded = errors_of(spec(residue_bytes=1), [member(i, 1) for i in range(sp.MAX_ENGINES_PER_HOST + 1)])
    assert any("split the models over two pools" in e.fix for e in crowded)
    assert errors_of(spec(gpus=3), [member(0, tp=3)])[0].key == "warmstart:standbyPools[0].gpus"
    assert errors_of(spec(spares=0), [member(0)])[0].key == "warmstart:standbyPools[0].spares"


# --- paths, window, cost ------------------------------------------------------------------------------


def test_four_models_on_one_spare_wake_in_seconds_and_cost_one_gpu_set_against_four() -> None:
    s = spec(node_hourly_price_usd=98.32)
    plan = sp.plan_pool(s, [member(i, 15) for i in range(4)])
    assert plan.sleep_level == 1
    for p in plan.paths:
        assert p.wake_source == "host RAM" and p.total_seconds < 20
        assert p.wake == pytest.approx(phases.wake_seconds(15 * GIB, 1, s.instance))
    assert (plan.cost.pool_gpus, plan.cost.per_model_gpus) == (1, 4)
    assert plan.cost.per_model_hourly_usd == pytest.approx(4 * plan.cost.pool_hourly_usd)
    assert plan.cost.pool_hourly_usd == pytest.approx(98.32 / 8)
    # At most maxHosts hosts (by default the spare plus one per member woken at once): the most it costs.
    assert plan.max_hosts == 5 and plan.cost.max_gpus == 5
    assert plan.cost.max_hourly_usd == pytest.approx(5 * 98.32 / 8)
    assert sp.plan_pool(spec(node_hourly_price_usd=98.32, max_hosts=2), [member(i, 15) for i in range(4)]).cost.max_gpus == 2


def test_a_level_2_wake_reads_the_nodes_nvme_where_staged_and_s3_otherwise() -> None:
    s = spec("g6e.2xlarge", sleep_level=2)
    plan = sp.plan_pool(s, [member(0, 14, "g6e.2xlarge", staged=True), member(1, 14, "g6e.2xlarge")])
    assert plan.path("m0").wake_source == "node NVMe"
    assert plan.path("m0").wake == pytest.approx(phases.weights_local_seconds(14 * GIB))
    assert plan.path("m1").wake_source == "S3"
    assert plan.path("m1").wake == pytest.approx(phases.weights_s3_seconds(14 * GIB, s.instance))


def test_a_replacement_on_a_new_node_loads_from_s3_and_on_a_staged_node_from_its_nvme() -> None:
    # A new node's staging pod starts beside the host: no engine there finds a complete copy.
    inst = instances.lookup("g6e.2xlarge")
    staged = [member(0, 14, "g6e.2xlarge", staged=True)]
    unstaged = [member(0, 14, "g6e.2xlarge")]
    assert sp.replacement_window(staged, inst, 2).total_seconds == pytest.approx(
        sp.replacement_window(unstaged, inst, 2).total_seconds)
    warm = sp.replacement_window(staged, inst, 2, new_node=False).engines[0][1]
    assert warm < sp.replacement_window(unstaged, inst, 2, new_node=False).engines[0][1]


@given(n=st.integers(1, 7), gib=st.floats(1, 30))
def test_the_no_spare_window_grows_with_every_engine_started_in_turn(n: int, gib: float) -> None:
    inst = instances.lookup("p5.48xlarge")
    ms = [member(i, gib) for i in range(n)]
    w = sp.replacement_window(ms, inst, 1)
    more = sp.replacement_window([*ms, member(n, gib)], inst, 1)
    assert more.total_seconds > w.total_seconds
    # On a new node: the launch and the image come first, then every engine in turn, each longer
    # than a per-model sleeper's own replacement pod on a warm node would load.
    assert w.node_launch == phases.NODE_LAUNCH_SECONDS and w.total_seconds > phases.NODE_LAUNCH_SECONDS
    assert len(w.engines) == n


@given(times=st.lists(st.floats(0, 2000), min_size=1, max_size=12), spares=st.integers(1, 3),
       window=st.floats(1, 1000))
def test_rises_take_the_spares_in_order_and_the_rest_start_cold(times: list[float], spares: int, window: float) -> None:
    out = sp.rises_served(times, spares, window)
    assert len(out) == len(times) and out[0] == "wake"
    ordered = sorted(times)
    # Within any window no more wakes than spares.
    for i, t in enumerate(ordered):
        inside = [k for k, u in enumerate(ordered) if t <= u < t + window and out[k] == "wake"]
        assert len(inside) <= spares
    # Rises all inside one window: exactly the first `spares` are wakes.
    assume(max(times) - min(times) < window)
    assert out == ["wake"] * min(spares, len(times)) + ["cold"] * max(0, len(times) - spares)


def test_engines_get_distinct_ports_and_distributed_ranges_in_start_order() -> None:
    plan = sp.plan_pool(spec(), [member(i, 5) for i in (3, 1, 2, 0)])
    assert [e.model for e in plan.engines] == ["m0", "m1", "m2", "m3"]
    assert [e.order for e in plan.engines] == [0, 1, 2, 3]
    ports = {e.port for e in plan.engines} | {e.dist_port + k for e in plan.engines for k in range(sp.DIST_PORT_STRIDE)}
    assert len(ports) == 4 + 4 * sp.DIST_PORT_STRIDE
    assert sp.SUPERVISOR_PORT not in ports
    assert {e.port for e in plan.engines} == {sp.member_port(f"m{i}") for i in range(4)}
    # Below the kernel's default ephemeral range (32768-60999), from which outgoing connections draw.
    assert max(ports) < 32768


def test_the_supervisors_spec_carries_the_plan_and_the_supervisor_reads_it() -> None:
    from warmstart.podside.engine_host import spec as host_spec_file

    plan = sp.plan_pool(spec(gpus=2), [member(i, 30, tp=2) for i in range(3)])
    # The model's own pods' command, as manifests/serving.py renders it: its port, TP and utilization
    # are replaced by the pool's, everything else is kept.
    own = {f"m{i}": ["vllm", "serve", f"s3://b/m{i}", "--port=8000", "--tensor-parallel-size=2",
                     "--gpu-memory-utilization=0.9", "--max-model-len=8192", standby_mod.SLEEP_MODE_FLAG]
           for i in range(3)}
    parsed = host_spec_file.parse(sp.host_spec(plan, own))
    assert parsed.sleep_level == plan.sleep_level
    assert [(e.model, e.port) for e in parsed.engines] == [(s.model, s.port) for s in plan.engines]
    for e, slot in zip(parsed.engines, plan.engines):
        flags = [a.split("=", 1) for a in e.argv if a.startswith("--")]
        names = [f[0] for f in flags]
        assert len(names) == len(set(names))  # each flag once: the pool's value, not both
        values = {f[0]: f[1] for f in flags if len(f) == 2}
        assert float(values["--gpu-memory-utilization"]) == slot.gpu_memory_utilization
        assert values["--tensor-parallel-size"] == "2" and values["--port"] == str(slot.port)
        assert values["--max-model-len"] == "8192" and list(e.argv[:3]) == ["vllm", "serve", f"s3://b/{slot.model}"]
        assert standby_mod.SLEEP_MODE_FLAG in names
        assert e.env["VLLM_PORT"] == str(slot.dist_port) and e.env[standby_mod.DEV_MODE_ENV] == "1"
        assert e.env[standby_mod.PINNED_HOST_ALLOC_ENV] == standby_mod.PINNED_HOST_ALLOC_CONF
    # One engine's start may take the longest start-up budget of any member before it is cut.
    assert parsed.startup_timeout_s == tuning.startup_budget_seconds(30 * GIB)


# --- a member's port, image and the hosts' capacity --------------------------------------------------


@given(st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True), min_size=2, max_size=8, unique=True))
@settings(max_examples=60, deadline=None)
def test_a_members_port_never_moves_when_another_joins_or_leaves(names: list[str]) -> None:
    # Its port is in its own pods' command: a port that moved would roll the model's GPU pods.
    def ports(ms: list[str]) -> dict[str, int]:
        try:
            plan = sp.plan_pool(spec(residue_bytes=1), [sp.PoolMember(name=n, key=f"warmstart:models[{i}]",
                                namespace="inference", instance_type="p5.48xlarge", tensor_parallel_size=1,
                                weights_bytes=GIB) for i, n in enumerate(ms)])
        except ConfigErrors as e:
            assert all(x.key.endswith(".standby.pool") and "standby.port" in x.fix for x in e.errors), e.errors
            assume(False)
        return {e.model: e.port for e in plan.engines}

    whole, fewer = ports(names), ports(names[1:])
    assert all(whole[n] == fewer[n] for n in names[1:])
    assert all(sp.MEMBER_PORT_BASE <= p < sp.MEMBER_PORT_BASE + sp.MEMBER_PORT_SPAN for p in whole.values())


def test_two_members_on_one_port_are_refused_and_standby_port_resolves_it() -> None:
    taken = sp.member_port("m0")
    errs = errors_of(spec(), [member(0), member(1, given_port=taken)])
    assert [e.key for e in errs] == ["warmstart:models[1].standby.port"] and str(taken) in errs[0].rule
    assert "standby.port of m1" in errs[0].fix
    plan = sp.plan_pool(spec(), [member(0), member(1, given_port=taken + 1 if taken < 8999 else taken - 1)])
    assert len({e.port for e in plan.engines}) == 2


def test_members_of_two_images_and_a_spot_only_gpu_pool_are_refused() -> None:
    errs = errors_of(spec(), [member(0, image="vllm:a"), member(1, image="vllm:b")])
    assert [e.key for e in errs] == ["warmstart:models[1].image"] and "vllm:a" in errs[0].rule
    errs = errors_of(spec(capacity_types=("spot",), gpu_pool="h100"), [member(0)])
    assert [e.key for e in errs] == ["warmstart:standbyPools[0].gpuPool"] and "spot" in errs[0].rule
    plan = sp.plan_pool(spec(capacity_types=("reserved", "spot", "onDemand")), [member(0)])
    assert plan.host_capacity_types == ("reserved", "onDemand")
