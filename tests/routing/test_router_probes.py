"""The router pod's probes, run as the kubelet runs them against the processes its rendered
containers start: the pinned SMG with the router container's own arguments, and the front queue
with its own command (tests/support/kubelet.py: an httpGet goes to the pod's IP, an exec runs in
the container). A probe that cannot pass on a real node (a listener on the pod's loopback probed
at the pod's IP, say) restarts the router forever, which no schema check sees. Prod's model is
rendered as shipped (SMG on the serving port) and scaled from zero (SMG behind the front queue,
on the pod's loopback). Bounded waits only; nothing is timed."""

from __future__ import annotations

import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.podside import front_queue_pod
from tests.podside.servers import free_ports
from tests.routing.fake_vllm import FakeVllm
from tests.routing.router import smg_binary, write_discovery_file
from tests.support import kubelet
from tests.support.stacks import load_stack_doc, render_doc
from warmstart.decisions import routing
from warmstart.podside import front_queue

pytestmark = [pytest.mark.slow, pytest.mark.servers]  # the real smg router, the front queue

BOUND_S = 60.0
PORTS = (routing.ROUTER_PORT, routing.PROBE_PORT, routing.METRICS_PORT, routing.SMG_BEHIND_QUEUE_PORT)


def _router_pod(tmp_path: Path, from_zero: bool) -> dict:
    doc = load_stack_doc("prod")
    if from_zero:
        doc["config"]["warmstart:models"][0]["autoscaling"]["minReplicas"] = 0
    rendered = render_doc(doc, tmp_path, "prod-zero" if from_zero else "prod")
    (dep,) = [o for o in rendered.kubernetes_objects
              if o["kind"] == "Deployment" and o["metadata"]["name"] == "qwen-67b-router"]
    return dep["spec"]["template"]["spec"]


def _rewrite(argv: list[str], ports: dict[int, int]) -> list[str]:
    """The container's arguments with its ports mapped to free ones, and every address of the pod
    (0.0.0.0) to the pod IP's stand-in; the pod's loopback (127.0.0.1) stays as it is."""
    out = []
    for a in argv:
        for container_port, local in ports.items():
            a = a.replace(f":{container_port}", f":{local}")
            if a == str(container_port):
                a = str(local)
        out.append(kubelet.POD_IP if a == "0.0.0.0" else a)
    return out


def _smg_argv(container: dict, ports: dict[int, int], manifest: Path) -> list[str]:
    """`smg launch` with the container's arguments (its entrypoint adds only the control-plane
    key); the Kubernetes discovery, which needs a cluster, replaced by a file of the same workers."""
    args = list(container["args"])
    start = args.index("--discovery-provider")
    end = args.index("--service-discovery-port") + 2
    args[start:end] = ["--discovery-provider", "file", "--discovery-file", str(manifest),
                       "--discovery-check-interval-secs", "1"]
    return [smg_binary(), "launch", *_rewrite(args, ports)]


def _queue_argv(container: dict, ports: dict[int, int]) -> list[str]:
    command = _rewrite(container["command"], ports)
    assert command[0] == "python3" and command[1].endswith(f"/{front_queue.__name__.rsplit('.', 1)[1]}.pyz")
    # No --host rendered: the script's default binds every address of the pod.
    return [*front_queue_pod.interpreter(), "--host", kubelet.POD_IP, *command[2:]]


def _start(stack: ExitStack, argv: list[str], log: Path) -> subprocess.Popen:
    out = log.open("wb")
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={"PATH": "/usr/bin:/bin"})

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        out.close()
    stack.callback(stop)
    return proc


def _until(check, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {BOUND_S}s: {what}\n" + "\n".join(p.read_text(errors="replace")[-2000:]
                                                                       for p in logs))


@pytest.mark.parametrize("from_zero", [False, True], ids=["smg-on-the-serving-port", "smg-behind-the-front-queue"])
def test_every_probe_of_the_router_pod_passes_as_the_kubelet_runs_it(tmp_path, from_zero):
    pod = _router_pod(tmp_path, from_zero)
    containers = {c["name"]: c for c in pod["containers"]}
    assert ("front-queue" in containers) == from_zero
    ports = dict(zip(PORTS, free_ports(len(PORTS))))
    rewrite = {f":{p}": f":{q}" for p, q in ports.items()}
    manifest = tmp_path / "workers.json"
    write_discovery_file(manifest, [])
    with ExitStack() as stack:
        logs = [tmp_path / "smg.log"]
        smg = _start(stack, _smg_argv(containers["router"], ports, manifest), logs[0])
        if from_zero:
            logs.append(tmp_path / "queue.log")
            _start(stack, _queue_argv(containers["front-queue"], ports), logs[1])

        def probe(name: str, kind: str) -> bool:
            return kubelet.run_probe(containers[name], kind, ports, rewrite)

        _until(lambda: smg.poll() is None and probe("router", "livenessProbe"), "the router's liveness passes", logs)
        if from_zero:
            _until(lambda: probe("front-queue", "livenessProbe") and probe("front-queue", "readinessProbe"),
                   "the front queue's probes pass (it is Ready with no engine: it holds)", logs)
            assert "readinessProbe" not in containers["router"]
        else:
            assert not probe("router", "readinessProbe"), "no engine yet: not Ready"
            engine = stack.enter_context(FakeVllm("w0"))
            write_discovery_file(manifest, [engine.url])
            _until(lambda: probe("router", "readinessProbe"), "Ready once an engine is", logs)
        assert smg.poll() is None
