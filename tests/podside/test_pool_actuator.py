"""The standby actuator's pool mode, its pure parts: pool.json refused with one line naming the key
(warmstart/podside/standby/pool_spec.py), and the pool's decision (pool_decide.py): who rises onto
which spare, what goes back to sleep, each member's figure, the hosts the pool keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmstart.podside.engine_host.pool import ASLEEP, AWAKE, STARTING, HostView
from warmstart.podside.standby.observe import Engine
from warmstart.podside.standby.pool_decide import MemberView, Memory, decide_pool
from warmstart.podside.standby.pool_spec import PoolSpecError, parse

ROOT = Path(__file__).resolve().parents[2]


def member(model: str, port: int, **over: object) -> dict:
    return {"model": model, "port": port, "deployment": model,
            "selector": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": model},
            "minReplicas": 0, "targetWaiting": 5, "targetRequests": 0, "awakeIdleSeconds": 300,
            "frontQueue": {"service": f"{model}-front", "port": 8081}, **over}


def pool_doc(models: tuple[str, ...] = ("m0", "m1"), **over: object) -> dict:
    return {"pool": "shared", "namespace": "inference", "hostSelector": {"warmstart.io/standby-pool": "shared"},
            "hostDeployment": "shared-hosts", "spares": 1, "maxHosts": 4, "supervisorPort": 8090, "sleepLevel": 1,
            "members": [member(m, 8100 + i) for i, m in enumerate(models)], **over}


# --- pool.json ---------------------------------------------------------------------------------


def test_a_rendered_pool_parses() -> None:
    spec = parse(pool_doc())
    assert [m.model for m in spec.members] == ["m0", "m1"]
    assert spec.member("m1").port == 8101
    assert spec.member("m0").front_queue.service == "m0-front"
    assert spec.host_selector == (("warmstart.io/standby-pool", "shared"),)


def _bad(path: str, value: object) -> dict:
    doc = pool_doc()
    where, key = doc, path.split(".")
    for k in key[:-1]:
        where = where[int(k)] if k.isdigit() else where[k]
    if value is KeyError:
        del where[key[-1]]
    else:
        where[key[-1]] = value
    return doc


@pytest.mark.parametrize(("path", "value", "named"), [
    ("spares", -1, "spares"),
    ("spares", True, "spares"),
    ("maxHosts", 0, "maxHosts"),
    ("supervisorPort", "8090", "supervisorPort"),
    ("sleepLevel", 3, "sleepLevel"),
    ("hostSelector", {}, "hostSelector"),
    ("hostSelector", {"bad key!": "x"}, "hostSelector"),
    ("hostDeployment", "Hosts_1", "hostDeployment"),
    ("members", [], "members"),
    ("members.0.model", "M0", "members[0].model"),
    ("members.1.model", "m0", "members[1].model"),
    ("members.1.port", 8100, "members[1].port"),
    ("members.0.port", 8090, "members[0].port"),
    ("members.0.targetWaiting", 0, "members[0].targetWaiting"),
    ("members.0.awakeIdleSeconds", float("nan"), "members[0].awakeIdleSeconds"),
    ("members.0.frontQueue", [], "members[0].frontQueue"),
    ("members.0.frontQueue.port", 0, "members[0].frontQueue.port"),
    ("members.0.selector", KeyError, "members[0].selector"),
    ("members.0.replicas", 2, "members[0].replicas"),
    ("extra", 1, "extra"),
])
def test_a_bad_pool_json_names_its_key(path: str, value: object, named: str) -> None:
    with pytest.raises(PoolSpecError) as err:
        parse(_bad(path, value))
    assert str(err.value).startswith(named + " "), str(err.value)
    assert "\n" not in str(err.value)


def test_maxhosts_below_spares_is_refused() -> None:
    with pytest.raises(PoolSpecError, match="^maxHosts must be at least spares"):
        parse(pool_doc(spares=3, maxHosts=2))


def test_the_actuator_refuses_a_bad_pool_json_with_one_line_and_exit_2(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from warmstart.podside.standby.main import main  # the entry point standby.pyz runs: its --pool-spec hook
    f = tmp_path / "pool.json"
    f.write_text(json.dumps(_bad("members.0.port", 80)))
    assert main(["--pool-spec", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "members[0].port must be an integer in [1024, 65535]" in err
    assert main([f"--pool-spec={tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err
    assert "missing" in err and err.strip().count("\n") == 0


def test_a_configmap_symlink_is_read(tmp_path: Path) -> None:
    """The kubelet mounts a ConfigMap key as a link into `..data` (atomic_writer.go)."""
    from warmstart.podside.standby.pool_spec import load
    (tmp_path / "..data").mkdir()
    (tmp_path / "..data" / "pool.json").write_text(json.dumps(pool_doc()))
    (tmp_path / "pool.json").symlink_to("..data/pool.json")
    assert load(tmp_path / "pool.json").pool == "shared"


# --- the decision ------------------------------------------------------------------------------

SPEC = parse(pool_doc(("m0", "m1", "m2", "m3")))


def host(name: str, **states: str) -> HostView:
    return HostView(name=name, url=f"http://{name}:8090", states={m: states.get(m, ASLEEP) for m in ("m0", "m1", "m2", "m3")})


def engine(url: str, waiting: float = 0, running: float = 0, ready: bool = True) -> Engine:
    return Engine(url, url, ready=ready, waiting=waiting, running=running)


def test_held_requests_with_no_engine_wake_the_member_on_a_spare_and_raise_a_replacement() -> None:
    mem = Memory()
    out = decide_pool(SPEC, [host("h0")], {"m0": MemberView(own=[], held=3)}, mem, now=10.0)
    assert [(w.model, w.host, w.engine_url) for w in out.wakes] == [("m0", "h0", "http://h0:8090/engines/m0")]
    assert out.cold == []
    assert out.hosts == 2  # the woken host, plus the spare the pool keeps
    # The pooled engine counts as awake: the member's own Deployment goes to one pod behind it.
    assert out.figures["m0"]["pods"] == 1
    assert out.figures["m1"]["pods"] == 0


def test_two_rises_on_one_spare_get_a_wake_then_a_cold_start_in_arrival_order() -> None:
    mem = Memory()
    # m3 rose first (a tick earlier, while m0 was quiet); m0 rises now: m3 gets the spare.
    decide_pool(SPEC, [], {"m3": MemberView(own=[], held=1)}, mem, now=1.0)
    out = decide_pool(SPEC, [host("h0")], {"m0": MemberView(own=[], held=9), "m3": MemberView(own=[], held=1)},
                      mem, now=2.0)
    assert [(w.model, w.host) for w in out.wakes] == [("m3", "h0")]
    assert out.rise_at == {"m3": 1.0}  # the wake's signal phase starts when the rise was first seen
    assert out.cold == ["m0"]
    assert out.figures["m0"]["pods"] == 2  # its queue (9 at 5 per engine), its own start
    assert out.figures["m3"]["pods"] == 1


def test_a_cold_rise_asks_for_one_more_own_pod_even_under_the_queue_rule() -> None:
    mem = Memory()
    own = [engine("m1-a", waiting=6)]
    out = decide_pool(SPEC, [host("h0", m0=AWAKE)], {"m1": MemberView(own=own)}, mem, now=1.0)
    assert out.cold == ["m1"] and out.wakes == []
    assert out.figures["m1"]["pods"] == 2


def test_a_member_with_a_pooled_engine_does_not_take_a_second_host() -> None:
    mem = Memory()
    views = {"m0": MemberView(own=[], held=50, pooled={"h0": engine("h0/m0", waiting=20)})}
    out = decide_pool(SPEC, [host("h0", m0=AWAKE), host("h1")], views, mem, now=1.0)
    assert out.wakes == [] and out.cold == []
    assert out.sleeps == []


def test_the_pooled_engine_sleeps_once_the_members_own_engines_carry_the_load() -> None:
    mem = Memory()
    pooled = engine("h0/m0", running=1)
    views = {"m0": MemberView(own=[engine("m0-a", ready=False)], pooled={"h0": pooled})}
    out = decide_pool(SPEC, [host("h0", m0=AWAKE)], views, mem, now=1.0)
    assert out.sleeps == []  # its own pod is still loading
    views["m0"].own = [engine("m0-a", waiting=2, running=3)]
    out = decide_pool(SPEC, [host("h0", m0=AWAKE)], views, mem, now=2.0)
    assert out.sleeps == [("h0", "m0")]
    # Not while the queue is more than its own engines carry.
    views["m0"].own = [engine("m0-a", waiting=6)]
    assert decide_pool(SPEC, [host("h0", m0=AWAKE)], views, mem, now=3.0).sleeps == []


def test_an_idle_pooled_engine_sleeps_after_awake_idle_seconds() -> None:
    mem = Memory()
    views = {"m0": MemberView(own=[], pooled={"h0": engine("h0/m0", running=1)})}
    assert decide_pool(SPEC, [host("h0", m0=AWAKE)], views, mem, now=100.0).sleeps == []
    views["m0"].pooled["h0"] = engine("h0/m0")
    assert decide_pool(SPEC, [host("h0", m0=AWAKE)], views, mem, now=399.0).sleeps == []
    assert decide_pool(SPEC, [host("h0", m0=AWAKE)], views, mem, now=400.5).sleeps == [("h0", "m0")]


def test_a_rise_cancels_its_members_drain_instead_of_waking_another_host() -> None:
    mem = Memory()
    views = {"m0": MemberView(own=[], held=4)}
    out = decide_pool(SPEC, [host("h0", m0=AWAKE), host("h1")], views, mem, now=1.0, draining={"h0": "m0"})
    assert out.cancel == ["h0"]
    # The spare stays a spare: the engine being drained is kept awake instead.
    assert out.wakes == [] and out.cold == []
    # The drain had already put it to sleep: the next tick's rise takes a spare.
    out = decide_pool(SPEC, [host("h0"), host("h1")], views, mem, now=2.0)
    assert [(w.model, w.host) for w in out.wakes] == [("m0", "h0")]


def test_hosts_and_costs_follow_the_serving_hosts() -> None:
    hosts = [host("h0", m0=AWAKE), host("h1"), host("h2", m1=STARTING)]
    out = decide_pool(SPEC, hosts, {}, Memory(), now=1.0)
    assert out.hosts == 2
    assert out.costs == {"h0": "0", "h1": "-100", "h2": "100"}
    assert decide_pool(parse(pool_doc(("m0", "m1", "m2", "m3"), maxHosts=1)), hosts, {}, Memory(), now=1.0).hosts == 1


MODELS = ("m0", "m1", "m2", "m3")
states = st.sampled_from([ASLEEP, ASLEEP, ASLEEP, AWAKE, STARTING])


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[HostView], dict[str, MemberView], dict[str, str], dict[str, str]]:
    hosts = []
    for i in range(draw(st.integers(0, 5))):
        s = {m: draw(states) for m in MODELS}
        awake = [m for m in MODELS if s[m] == AWAKE]
        for m in awake[1:]:  # the supervisor lets one engine be awake per host
            s[m] = ASLEEP
        hosts.append(HostView(f"h{i}", f"http://h{i}:8090", s))
    views = {}
    for m in MODELS:
        own = [engine(f"{m}-{k}", waiting=draw(st.integers(0, 20)), running=draw(st.integers(0, 8)),
                      ready=draw(st.booleans())) for k in range(draw(st.integers(0, 3)))]
        pooled = {h.name: engine(f"{h.name}/{m}", waiting=draw(st.integers(0, 20))) for h in hosts if h.serving == m}
        views[m] = MemberView(own=own, pooled=pooled, held=draw(st.integers(0, 10)))
    names = [h.name for h in hosts]
    waking = {h: draw(st.sampled_from(MODELS)) for h in draw(st.lists(st.sampled_from(names), unique=True))} if names else {}
    draining = {h.name: h.serving for h in hosts if h.serving and h.name not in waking and draw(st.booleans())}
    return hosts, views, waking, draining


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_the_pool_never_double_books_a_host_nor_drops_a_rise(world: tuple) -> None:
    hosts, views, waking, draining = world
    spec = parse(pool_doc(MODELS, maxHosts=5))
    out = decide_pool(spec, hosts, views, Memory(), 5.0, waking, draining)
    by_name = {h.name: h for h in hosts}
    woken_hosts = [w.host for w in out.wakes]
    assert len(woken_hosts) == len(set(woken_hosts))  # one wake per host
    for w in out.wakes:
        assert by_name[w.host].spare and w.host not in waking and w.host not in draining
    # A member with a pooled engine serving or waking never rises onto another host.
    has_pooled = {h.serving for h in hosts if h.serving and h.name not in draining} | set(waking.values())
    assert not ({w.model for w in out.wakes} | set(out.cold)) & has_pooled
    # Every rise is served: a wake or a cold start, never both, never neither.
    assert not {w.model for w in out.wakes} & set(out.cold)
    spares = [h for h in hosts if h.spare and h.name not in waking and h.name not in draining]
    assert len(out.wakes) <= len(spares)
    if out.cold:  # every host holds every member's engine: a cold start only once the spares are gone
        assert len(out.wakes) == len(spares)
    assert out.hosts <= spec.max_hosts
    for m in MODELS:
        assert out.figures[m]["pods"] >= spec.member(m).min_replicas
    for w in out.wakes:
        assert out.figures[w.model]["pods"] >= 1  # its own Deployment scales up behind the pooled engine
    for model in out.cold:
        assert out.figures[model]["pods"] > len([e for e in views[model].own if e.ready])
    for h, model in out.sleeps:
        assert by_name[h].serving == model and h not in waking and h not in draining


def test_the_figure_holds_the_pooled_engines_place_while_it_serves_and_lets_go_after() -> None:
    mem = Memory()
    decide_pool(SPEC, [host("h0")], {"m0": MemberView(own=[], held=2)}, mem, now=1.0)
    # The pooled engine serves everything: no queue left, yet the member's own pod is still wanted.
    views = {"m0": MemberView(own=[], pooled={"h0": engine("h0/m0", running=2)})}
    for now in (2.0, 100.0, 250.0):
        assert decide_pool(SPEC, [host("h0", m0=AWAKE)], views, mem, now=now).figures["m0"]["pods"] == 1
    # Asleep again (its own pods took over, or it idled out): the floor goes with it.
    assert decide_pool(SPEC, [host("h0")], {"m0": MemberView(own=[])}, mem, now=300.0).figures["m0"]["pods"] == 0


def test_a_cold_rise_holds_its_extra_pod_for_the_hold_then_lets_go() -> None:
    mem = Memory()
    busy = [host("h0", m0=AWAKE)]
    decide_pool(SPEC, busy, {"m1": MemberView(own=[engine("m1-a", waiting=6)])}, mem, now=1.0, hold=60)
    calm = {"m1": MemberView(own=[engine("m1-a", waiting=1)])}
    assert decide_pool(SPEC, busy, calm, mem, now=30.0, hold=60).figures["m1"]["pods"] == 2
    assert decide_pool(SPEC, busy, calm, mem, now=62.0, hold=60).figures["m1"]["pods"] == 1


def test_the_pool_is_not_lowered_on_a_reading_that_missed_a_host(tmp_path: Path) -> None:
    """A host whose `/engines` did not answer may be the one serving: the hosts' Deployment is not
    lowered on that tick (the ReplicaSet would remove a spare, and the next tick raise another)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.podside.servers import free_ports
    from warmstart.podside.standby import pool_mode

    class Spare(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"spare": True, "awake": None, "sleepLevel": 1, "engines": [
                {"model": m, "state": "asleep"} for m in ("m0", "m1")]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Spare)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    (dead,) = free_ports(1)
    static, scale = tmp_path / "static.json", tmp_path / "scale.json"
    static.write_text(json.dumps({"hosts": {"h0": f"http://127.0.0.1:{server.server_address[1]}",
                                            "h1": f"http://127.0.0.1:{dead}"}, "members": {}}))
    scale.write_text(json.dumps({"replicas": 3}))
    args = pool_mode.parse_args(["--pool-spec", "unused", "--static", str(static), "--scale-file", str(scale)])
    spec = parse(pool_doc())
    source = pool_mode.PoolStatic(str(static), "", str(scale))
    state = pool_mode.PoolState(replicas=3)
    with ThreadPoolExecutor(4) as pool:
        try:
            pool_mode.tick(args, spec, source, state, pool)
            assert json.loads(scale.read_text()) == {"replicas": 3}
            static.write_text(json.dumps({"hosts": {"h0": f"http://127.0.0.1:{server.server_address[1]}"}, "members": {}}))
            pool_mode.tick(args, spec, source, state, pool)
            assert json.loads(scale.read_text()) == {"replicas": 1}  # the spares the pool keeps
        finally:
            server.shutdown()


@pytest.mark.servers  # a stand-in Kubernetes API on 127.0.0.1
def test_the_pool_reads_and_writes_kubernetes_as_its_role_allows(tmp_path: Path) -> None:
    """Pods of the hosts' and the members' selectors (one not being deleted), host labels by JSON
    merge patch (`serves` removed with null, RFC 7386), the hosts' Deployment through its scale
    subresource with the resourceVersion read: nothing else is called."""
    import http.server
    import urllib.parse

    from tests.support.loopback import LoopbackServer
    from warmstart.podside.common.kube import InCluster
    from warmstart.podside.standby.pool_mode import PoolKubernetes

    calls: list[tuple[str, str, str, object]] = []

    class Api(LoopbackServer):
        def __init__(self) -> None:
            class Handler(http.server.BaseHTTPRequestHandler):
                def log_message(self, *a: object) -> None:
                    pass

                def _send(self, doc: object) -> None:
                    body = json.dumps(doc).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

                def _record(self) -> None:
                    raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    calls.append((self.command, self.path, self.headers.get("Content-Type", ""),
                                  json.loads(raw) if raw else None))

                def do_GET(self) -> None:
                    self._record()
                    u = urllib.parse.urlsplit(self.path)
                    if u.path.endswith("/scale"):
                        return self._send({"metadata": {"resourceVersion": "9"}, "spec": {"replicas": 1}})
                    sel = urllib.parse.parse_qs(u.query)["labelSelector"][0]
                    self._send({"items": [
                        {"metadata": {"name": f"{sel}-a"}, "status": {"podIP": "10.0.0.1"}},
                        {"metadata": {"name": f"{sel}-b", "deletionTimestamp": "x"}, "status": {"podIP": "10.0.0.2"}}]})

                def do_PATCH(self) -> None:
                    self._record()
                    self._send({})

            self._serve(Handler)

    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t0ken\n")
    doc = pool_doc()
    doc["members"][1]["frontQueue"]["selector"] = {"app.kubernetes.io/name": "router"}
    spec = parse(doc)
    with Api() as api:
        k = PoolKubernetes(spec, InCluster(api.base_url, sa))
        assert k.hosts() == [("warmstart.io/standby-pool=shared-a", "http://10.0.0.1:8090")]
        assert k.member_engines(spec.member("m1")) == [
            ("app.kubernetes.io/instance=m1,app.kubernetes.io/name=vllm-a", "http://10.0.0.1:8101")]
        assert k.front_queues(spec.member("m0")) == ["http://m0-front.inference.svc:8081"]
        assert k.front_queues(spec.member("m1")) == ["http://10.0.0.1:8081"]
        calls.clear()
        k.set_host_labels("h0", "m0")
        k.set_host_labels("h0", None)
        k.set_cost("h0", "-100")
        assert k.set_replicas(3) == (1, 3)
        assert k.set_replicas(1) is None
    scale = "/apis/apps/v1/namespaces/inference/deployments/shared-hosts/scale"
    assert calls == [
        ("PATCH", "/api/v1/namespaces/inference/pods/h0", "application/merge-patch+json",
         {"metadata": {"labels": {"warmstart.io/serves": "m0", "warmstart.io/engine": "awake"}}}),
        ("PATCH", "/api/v1/namespaces/inference/pods/h0", "application/merge-patch+json",
         {"metadata": {"labels": {"warmstart.io/serves": None, "warmstart.io/engine": "asleep"}}}),
        ("PATCH", "/api/v1/namespaces/inference/pods/h0", "application/merge-patch+json",
         {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-100"}}}),
        ("GET", scale, "application/json", None),
        ("PATCH", scale, "application/merge-patch+json", {"metadata": {"resourceVersion": "9"}, "spec": {"replicas": 3}}),
        ("GET", scale, "application/json", None),
    ]
