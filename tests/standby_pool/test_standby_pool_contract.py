"""The render's pooled-standby objects against the pod-side code that reads them: what the pool
actuator's and the engine hosts' pods are given (the rendered pool.json, the host spec, the
command lines) is what the pool mode's and the supervisor's own parsers accept, and the ports and
URLs that the ScaledObjects, the Services and the routers use are the ones those pods serve on.
The render and the pod side were built apart (docs/scale-out.md "Pooled standby" and "The pool
actuator"); this is where a drift between them would fail before a cluster does."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from tests.standby_pool.pooled import MODELS, POOL, pooled_doc
from tests.support.stacks import render_doc
from warmstart.podside.engine_host import main as host_main
from warmstart.podside.engine_host import spec as host_spec
from warmstart.podside.standby import pool_mode, pool_spec

HOSTS = f"{POOL}-engine-host"
ACTUATOR = f"{POOL}-standby-pool"


@functools.cache
def objects() -> dict[tuple[str, str], dict]:
    r = render_doc(pooled_doc("karpenter"), Path(tempfile.mkdtemp(prefix="pooled-contract-")), "pooled-contract")
    return {(o["kind"], o["metadata"]["name"]): o for o in r.kubernetes_objects}


def container(deployment: str) -> dict:
    return objects()[("Deployment", deployment)]["spec"]["template"]["spec"]["containers"][0]


def argv_after(c: dict, script: str) -> list[str]:
    line = [*c.get("command", []), *c.get("args", [])]
    (at,) = [i for i, a in enumerate(line) if a.endswith(script)]
    return line[at + 1:]


def test_the_pool_actuator_accepts_its_rendered_command_and_pool_json():
    c = container(ACTUATOR)
    argv = argv_after(c, "standby.pyz")
    # The package's entry dispatches on --pool-spec (standby/main.py): the pool mode's parser then
    # takes every rendered flag.
    assert "--pool-spec" in argv
    args = pool_mode.parse_args(argv)
    spec = pool_spec.parse(json.loads(objects()[("ConfigMap", ACTUATOR)]["data"]["pool.json"]))
    assert spec.pool == POOL and sorted(m.model for m in spec.members) == sorted(MODELS)
    # The mount the flag points into is the pool.json ConfigMap's.
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in objects()[("Deployment", ACTUATOR)]["spec"]["template"]["spec"]["volumes"]}
    folder = str(Path(args.pool_spec).parent)
    assert volumes[mounts[folder]]["configMap"]["name"] == ACTUATOR
    # Its figure is served where every member's ScaledObject reads it, through its Service.
    service = objects()[("Service", ACTUATOR)]["spec"]
    (sport,) = service["ports"]
    (cport,) = [p for p in c["ports"] if p.get("name") == sport["targetPort"]]
    assert cport["containerPort"] == args.figure_port
    for model in MODELS:
        (trigger,) = [t for t in objects()[("ScaledObject", model)]["spec"]["triggers"] if t["name"] == "standby-pods"]
        url = urlsplit(trigger["metadata"]["url"])
        assert (url.hostname, url.port) == (f"{ACTUATOR}.{spec.namespace}.svc", sport["port"])
        assert url.path == f"/warmstart/pods/{model}"
    # The hosts it scales and reads are the rendered ones.
    hosts = objects()[("Deployment", HOSTS)]
    assert spec.host_deployment == HOSTS
    labels = hosts["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in spec.host_selector)


def test_each_front_queue_the_pool_actuator_counts_is_the_members_router_pods():
    pool = pool_spec.parse(json.loads(objects()[("ConfigMap", ACTUATOR)]["data"]["pool.json"]))
    queued = [m for m in pool.members if m.front_queue is not None]
    # The fixture has two members at minReplicas 0, which hold requests in their front queues.
    assert len(queued) == 2
    for m in queued:
        router = objects()[("Deployment", f"{m.model}-router")]["spec"]["template"]
        # Summed over the router pods (a Service would answer for one of them).
        assert m.front_queue.selector, m.model
        assert all(router["metadata"]["labels"].get(k) == v for k, v in m.front_queue.selector)
        assert m.front_queue.port in {p["containerPort"] for c in router["spec"]["containers"] for p in c.get("ports", [])}


def test_the_engine_host_accepts_its_rendered_spec_and_serves_each_member_on_its_port():
    c = container(HOSTS)
    argv = argv_after(c, "engine_host.pyz")
    args = host_main.parse_args(argv)
    spec = host_spec.parse(json.loads(objects()[("ConfigMap", HOSTS)]["data"]["spec.json"]))
    pool = pool_spec.parse(json.loads(objects()[("ConfigMap", ACTUATOR)]["data"]["pool.json"]))
    ports = {e.model: e.port for e in spec.engines}
    for e in spec.engines:
        # Each engine's own vLLM command line serves on the port the supervisor knows it by.
        line = " ".join(e.argv)
        assert f"--port={e.port}" in line or f"--port {e.port}" in line, e.model
    assert ports == {m.model: m.port for m in pool.members}
    # Every engine port and the supervisor's are container ports of the host; the actuator reads
    # the supervisor on the port pool.json names.
    declared = {p["containerPort"] for p in c["ports"]}
    assert set(ports.values()) | {args.port} <= declared
    assert pool.supervisor_port == args.port
    # Each member's routers discover its engines on that same port, in its own pods too.
    for model, port in ports.items():
        router = objects()[("Deployment", f"{model}-router")]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert router[router.index("--service-discovery-port") + 1] == str(port)
        (vllm,) = [x for x in objects()[("Deployment", model)]["spec"]["template"]["spec"]["containers"]
                   if x["name"] == "vllm"]
        assert port in {p["containerPort"] for p in vllm["ports"]}
