"""The cluster behind the stand-in API (tests/support/kube_api.py): its controllers, scheduler,
node autoscaler, kubelet and pod autoscaler, modelled from their documented behaviour and kept
apart from the drill's code, so the drill is tested against a cluster that acts, not replayed events.

- ReplicaSet: a Deployment's `spec.replicas` pods from its template (`generateName`, owner
  reference); a surplus removes a not-Ready pod first, then the lowest
  `controller.kubernetes.io/pod-deletion-cost` (https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/).
- Job: one pod per Job (`job-name` label); `succeeded`/`failed` from its phase;
  `activeDeadlineSeconds` fails it and ends its pod.
- Scheduler: a pending pod goes to a node that is not cordoned (`spec.unschedulable`) and has the
  GPUs it requests free; CPU pods to the CPU node. `PodScheduled` with its transition time.
- Node autoscaler (Karpenter's part): a GPU pod no node fits launches one node, which registers
  `node_launch_s` later (a new Node object, created then).
- Node cache: the nodes named in `prepared` carry the model's staged-weights label
  (`weights.warmstart.io/<model>`, manifests/node_cache.py); a pod whose template has the weights
  picker (`weights-select`) gets its `warmstart.weights` line in that container's log, `hit` on a
  prepared node and `miss` (streams from S3, `cold_load_s`) elsewhere, as weights_select.py
  decides from the node's copy; new nodes are never prepared.
- Kubelet: pulls the image unless the node has it (`pull_s`), then runs the containers: a vLLM
  container is tests/routing/fake_vllm.py, started after `load_s` (weights, compile; `cold_load_s`
  for a pod whose caches are bypassed), Ready when its /health answers, and the real first-token
  sidecar (warmstart/podside/first_token.py) beside it; any other container runs its own command
  as a process (python3 is this interpreter), with the cluster's DNS names rewritten to this
  machine's addresses. Its stdout is the container's log.
- Router: the real SMG (the `smg` binary of its pinned wheel, tests/routing/router.py) with the
  rendered router Deployment's arguments, its Kubernetes pod watch replaced by SMG's file
  discovery, which this model writes from the pods the rendered `--selector` selects that are
  Ready (what SMG's Kubernetes discovery admits, https://github.com/smg-project/smg).
  For a model behind a front queue (a router Deployment with a `front-queue` container: scale from
  zero), the real front queue (warmstart/podside/front_queue.py) is run as a process through its
  command line, as that container runs it, in front of SMG; the model's Service URL is the front
  queue's, else SMG's.
- Pod autoscaler (KEDA + HPA): every `hpa_period_s`, replicas = ceil(waiting requests /
  target per replica) within the range, never lower during the test (the scale-down hold); at
  zero replicas KEDA's metrics-api trigger on the front queue's held count (the rendered
  ScaledObject's `valueLocation`) above its `activationTargetValue` activates one replica.
- The standby actuator is the real one (its built artifact, warmstart/podside/standby/) over the engines' URLs, its
  routing labels file copied onto the pods' labels, its stdout the log of an actuator pod.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.routing.fake_vllm import FakeVllm
from tests.support.kube_api import KubeApi, now_rfc3339
from tests.support.pod_scripts import artifact
from warmstart.manifests import node_cache, serving
from warmstart.manifests import standby as standby_manifests
from warmstart.podside import first_token

GPU = "nvidia.com/gpu"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Timing:
    pull_s: float = 1.0
    load_s: float = 1.0
    cold_load_s: float = 3.0
    node_launch_s: float = 3.0
    hpa_period_s: float = 1.0
    wake_s_per_gib: float = 3 / 64
    delay_ms: float = 300.0
    max_num_seqs: int = 2


@dataclass
class Running:
    engine: FakeVllm | None = None
    procs: list[subprocess.Popen] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


class Router:
    """The model's endpoint: SMG with the rendered router's flags and file discovery, and in front
    of it the front queue when the rendered router pod has one."""

    # The listeners and the discovery are the stand-in's (loopback ports, a file for the pod watch).
    _OWN = {"--host", "--port", "--health-check-port", "--prometheus-host", "--prometheus-port",
            "--discovery-provider", "--service-discovery-namespace", "--service-discovery-port", "--selector"}

    def __init__(self, router_deployment: dict[str, Any], tmp: Path) -> None:
        from tests.podside.servers import free_ports
        from tests.routing.router import SmgRouter, write_discovery_file
        from warmstart.podside import front_queue

        containers = {c["name"]: c for c in router_deployment["spec"]["template"]["spec"]["containers"]}
        args = list(containers["router"].get("args") or [])
        flags: list[str] = []
        self.selector: dict[str, str] = {}
        i = 0
        while i < len(args):
            a = args[i]
            if a in self._OWN:
                j = i + 1
                while j < len(args) and not args[j].startswith("--"):
                    if a == "--selector":
                        k, _, v = args[j].partition("=")
                        self.selector[k] = v
                    j += 1
                i = j
                continue
            flags.append(a)
            i += 1
        assert self.selector, "the rendered router has no --selector"
        self.discovery = tmp / "smg-discovery.json"
        self._write = write_discovery_file
        self._write(self.discovery, [])
        self.selected: list[str] = []
        self.smg = SmgRouter([*flags, "--discovery-provider", "file", "--discovery-file", str(self.discovery),
                              "--discovery-check-interval-secs", "1"], ready_timeout_s=60)
        self.url = self.smg.url
        self.queue: subprocess.Popen | None = None
        fq = containers.get("front-queue")
        if fq is not None:
            (port,) = free_ports(1)
            cmd = list(fq["command"])
            script = artifact("front_queue.pyz")  # what the router pod's ConfigMap volume holds
            argv = [sys.executable if a == "python3" else str(script) if a.endswith("/" + script.name) else a
                    for a in cmd]
            for flag, value in (("--port", str(port)), ("--upstream", self.smg.url),
                                ("--ready-url", f"http://127.0.0.1:{self.smg.probe_port}/readiness")):
                argv[argv.index(flag) + 1] = value
            argv += ["--host", "127.0.0.1"]
            self.queue = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          env={"PATH": "/usr/bin:/bin"})
            self.url = f"http://127.0.0.1:{port}"
            self.held_url = self.url + front_queue.HELD_PATH
            deadline = time.monotonic() + 30
            while True:
                try:
                    self.held()
                    break
                except OSError:
                    if time.monotonic() > deadline or self.queue.poll() is not None:
                        self.stop()
                        raise RuntimeError("the front queue did not start") from None
                    time.sleep(0.1)

    def held(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.held_url, timeout=5) as r:  # noqa: S310
            return json.loads(r.read())

    def select(self, urls: list[str]) -> None:
        """The pods the pod watch would hand SMG, written when they change."""
        urls = sorted(urls)
        if urls != self.selected:
            self._write(self.discovery, urls)
            self.selected = urls

    def stop(self) -> None:
        if self.queue is not None and self.queue.poll() is None:
            self.queue.terminate()
            try:
                self.queue.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.queue.kill()
        self.smg.__exit__()


class ClusterModel:
    """Drives `api`'s objects. `model`: the ModelPlan whose Deployment it runs."""

    def __init__(self, api: KubeApi, m: Any, namespace: str, timing: Timing, *, gpus_per_node: int,
                 nodes: int, router: dict[str, Any], spare_nodes: int = 0, standby_count: int = 0,
                 target_waiting: float = 5.0, scaled_object: dict[str, Any] | None = None,
                 prepared: tuple[str, ...] = ()) -> None:
        self.api, self.m, self.ns, self.t = api, m, namespace, timing
        self.gpus_per_node = gpus_per_node
        self.running: dict[str, Running] = {}
        self.engines: dict[str, str] = {}  # pod -> engine URL
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.tmp = Path(tempfile.mkdtemp(prefix="cluster-model-"))
        self.labels_file = self.tmp / "labels.json"
        self.router_deployment = router
        # The engines answer to the rendered --served-model-name, as vLLM does (SMG routes by it).
        self.served = m.name
        self.router: Router | None = None
        # KEDA's metrics-api trigger on the front queue (a model scaled to zero pods): the JSON
        # field it reads and the value above which it activates one replica.
        trig = next((t["metadata"] for t in (scaled_object or {}).get("spec", {}).get("triggers", [])
                     if t["type"] == "metrics-api"), None)
        self.activation = (trig["valueLocation"], float(trig.get("activationTargetValue") or 0)) if trig else None
        self.target_waiting = target_waiting
        self.standby_count = standby_count
        self.launching: list[float] = []
        self.actuator: subprocess.Popen | None = None
        self.extra_env: dict[str, dict[str, str]] = {}
        api.put("nodes", self._node("cpu-node", 0))
        for i in range(nodes + spare_nodes):
            node = self._node(f"gpu-node-{i}", gpus_per_node, image=True)
            if node["metadata"]["name"] in prepared:
                node["metadata"]["labels"][node_cache.label_key(m.name)] = "sha256-staged"
            api.put("nodes", node)

    # -- objects

    def _node(self, name: str, gpus: int, image: bool = False) -> dict[str, Any]:
        labels = {"kubernetes.io/hostname": name}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels,
                                                                 "annotations": {"model/image": "yes" if image else ""}},
                "spec": {}, "status": {"capacity": {GPU: str(gpus)}, "allocatable": {GPU: str(gpus)}}}

    def deploy(self, deployment: dict[str, Any], replicas: int) -> None:
        d = copy.deepcopy(deployment)
        d["spec"]["replicas"] = replicas
        self.api.put("deployments", d)

    # -- the loop

    def __enter__(self) -> "ClusterModel":
        self.router = Router(self.router_deployment, self.tmp)
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_ev.set()
        self.thread.join(timeout=30)
        if self.actuator is not None:
            self.actuator.terminate()
            try:
                self.actuator.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.actuator.kill()
        for name in list(self.running):
            self._end(name)
        if self.router is not None:
            self.router.stop()

    def _loop(self) -> None:
        next_hpa = time.monotonic() + self.t.hpa_period_s
        while not self.stop_ev.is_set():
            try:
                self._replicasets()
                self._jobs()
                self._schedule()
                self._kubelet()
                self._labels()
                self._discover()
                if time.monotonic() >= next_hpa:
                    self._autoscale()
                    next_hpa = time.monotonic() + self.t.hpa_period_s
            except Exception as exc:  # a model bug must show, not hang the test
                print(f"cluster model: {type(exc).__name__}: {exc}", file=sys.stderr)
                raise
            self.stop_ev.wait(0.2)

    def _owned(self, kind: str, name: str) -> list[dict[str, Any]]:
        return [p for p in self.api.items("pods", self.ns)
                if any(o.get("kind") == kind and o.get("name") == name for o in p["metadata"].get("ownerReferences") or [])]

    def _replicasets(self) -> None:
        for d in self.api.items("deployments", self.ns):
            rs = f"{d['metadata']['name']}-rs"
            pods = self._owned("ReplicaSet", rs)
            want = int(d["spec"].get("replicas", 1))
            for _ in range(want - len(pods)):
                t = copy.deepcopy(d["spec"]["template"])
                self.api.put("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "generateName": f"{rs}-", "namespace": self.ns, "labels": t["metadata"].get("labels", {}),
                    "annotations": t["metadata"].get("annotations", {}),
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": rs,
                                         "controller": True}]},
                    "spec": t["spec"], "status": {"phase": "Pending"}})
            if len(pods) > want:
                def rank(p: dict[str, Any]) -> tuple[int, int]:
                    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
                    cost = int((p["metadata"].get("annotations") or {}).get("controller.kubernetes.io/pod-deletion-cost", 0))
                    return (1 if ready else 0, cost)
                for p in sorted(pods, key=rank)[: len(pods) - want]:
                    self.api.remove("pods", self.ns, p["metadata"]["name"])
            d.setdefault("status", {})["replicas"] = min(want, len(pods))

    def _jobs(self) -> None:
        for j in self.api.items("jobs", self.ns):
            name = j["metadata"]["name"]
            pods = [p for p in self.api.items("pods", self.ns) if (p["metadata"].get("labels") or {}).get("job-name") == name]
            st = j.setdefault("status", {})
            if not pods and not st.get("startTime"):
                st["startTime"] = now_rfc3339()
                t = copy.deepcopy(j["spec"]["template"])
                labels = {**t["metadata"].get("labels", {}), "job-name": name}
                self.api.put("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "generateName": f"{name}-", "namespace": self.ns, "labels": labels,
                    "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                         "uid": j["metadata"]["uid"], "controller": True}]},
                    "spec": t["spec"], "status": {"phase": "Pending"}, "_started": time.monotonic()})
                j["_started"] = time.monotonic()
                continue
            for p in pods:
                if p["status"]["phase"] == "Succeeded":
                    st["succeeded"] = 1
                elif p["status"]["phase"] == "Failed":
                    st["failed"] = 1
            deadline = j["spec"].get("activeDeadlineSeconds")
            if deadline and not (st.get("succeeded") or st.get("failed")) and time.monotonic() - j["_started"] > deadline:
                st["failed"] = 1
                for p in pods:
                    self._end(p["metadata"]["name"])
                    p["status"]["phase"] = "Failed"

    def _gpus(self, pod: dict[str, Any]) -> int:
        return sum(int((c.get("resources") or {}).get("limits", {}).get(GPU, 0)) for c in pod["spec"].get("containers", []))

    def _free(self, node: dict[str, Any]) -> int:
        used = sum(self._gpus(p) for p in self.api.items("pods") if p["spec"].get("nodeName") == node["metadata"]["name"]
                   and p["status"].get("phase") not in ("Succeeded", "Failed"))
        return int(node["status"]["allocatable"][GPU]) - used

    def _schedule(self) -> None:
        now = time.monotonic()
        for when in [w for w in self.launching if w <= now]:
            self.launching.remove(when)
            self.api.put("nodes", self._node(f"gpu-node-new-{int(when * 1000) % 100000}", self.gpus_per_node))
        unplaced = 0
        for p in self.api.items("pods", self.ns):
            if p["spec"].get("nodeName") or p["status"].get("phase") != "Pending":
                continue
            need = self._gpus(p)
            nodes = [n for n in self.api.items("nodes") if not n["spec"].get("unschedulable")
                     and (need == 0 and n["metadata"]["name"] == "cpu-node" or need and self._free(n) >= need)]
            if not nodes:
                unplaced += 1
                continue
            p["spec"]["nodeName"] = nodes[0]["metadata"]["name"]
            p["status"].setdefault("conditions", []).append(
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()})
            self.api.put("pods", p)
        if unplaced > len(self.launching):
            self.launching += [now + self.t.node_launch_s] * (unplaced - len(self.launching))

    def _kubelet(self) -> None:
        live = set()
        for p in self.api.items("pods", self.ns):
            name = p["metadata"]["name"]
            live.add(name)
            if p["spec"].get("nodeName") and name not in self.running and p["status"]["phase"] == "Pending":
                self.running[name] = Running()
                threading.Thread(target=self._run_pod, args=(p,), daemon=True).start()
            dl = p["spec"].get("activeDeadlineSeconds")
            if dl and p["status"].get("phase") == "Running" and "_t" in p and time.monotonic() - p["_t"] > dl:
                self._end(name)
                p["status"]["phase"] = "Failed"
        for name in [n for n in self.running if n not in live]:
            self._end(name)

    def _end(self, name: str) -> None:
        r = self.running.pop(name, None)
        if r is None:
            return
        r.stop.set()
        if r.engine is not None:
            r.engine.stop()
        for proc in r.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        with self.lock:
            self.engines.pop(name, None)

    def _set(self, name: str, **status: Any) -> dict[str, Any] | None:
        p = self.api.get("pods", self.ns, name)
        if p is None:
            return None
        p["status"].update(status)
        self.api.put("pods", p)
        return p

    def _condition(self, name: str, kind: str) -> None:
        p = self.api.get("pods", self.ns, name)
        if p is not None:
            p["status"].setdefault("conditions", []).append(
                {"type": kind, "status": "True", "lastTransitionTime": now_rfc3339()})
            self.api.put("pods", p)

    def _run_pod(self, p: dict[str, Any]) -> None:
        name, r = p["metadata"]["name"], self.running[p["metadata"]["name"]]
        node = self.api.get("nodes", "", p["spec"]["nodeName"])
        if node and not (node["metadata"].get("annotations") or {}).get("model/image"):
            if r.stop.wait(self.t.pull_s):
                return
            node["metadata"]["annotations"]["model/image"] = "yes"
        p["_t"] = time.monotonic()
        self._set(name, phase="Running", startTime=now_rfc3339())
        names = [c["name"] for c in p["spec"]["containers"]]
        if "vllm" in names:
            self._run_engine(p, r)
        else:
            self._run_command(p, r)

    def _run_engine(self, p: dict[str, Any], r: Running) -> None:
        name = p["metadata"]["name"]
        env = {e["name"]: e.get("value", "") for c in p["spec"]["containers"] for e in c.get("env") or []}
        cold = env.get("WARMSTART_CACHE_BYPASS") == "1"
        if any(c["name"] == node_cache.SELECT_CONTAINER for c in p["spec"].get("initContainers") or []):
            node = self.api.get("nodes", "", p["spec"]["nodeName"]) or {"metadata": {}}
            hit = node_cache.label_key(self.m.name) in (node["metadata"].get("labels") or {}) and not cold
            line = {"event": "warmstart.weights", "choice": "local" if hit else "s3", "result": "hit" if hit else "miss",
                    "source": "node-cache" if hit else "s3",
                    "reason": "complete copy of this digest on the node" if hit else "not staged on this node"}
            self.api.append_log(self.ns, name, node_cache.SELECT_CONTAINER, json.dumps(line))
            cold = cold or not hit
        sleeper = (p["metadata"].get("annotations") or {}).get("model/standby") == "asleep"
        if r.stop.wait(self.t.cold_load_s if cold else self.t.load_s):
            return
        gib = self.m.weights_bytes / 2**30
        engine = FakeVllm(name, delay_ms=self.t.delay_ms, dev_mode=self.standby_count > 0, asleep=sleeper,
                          weights_gib=gib, wake_s_per_gib=self.t.wake_s_per_gib, max_num_seqs=self.t.max_num_seqs,
                          served_model=self.served)
        r.engine = engine
        if r.stop.is_set():
            engine.stop()
            return
        self._condition(name, "Ready")
        with self.lock:
            self.engines[name] = engine.url
        state = self.tmp / name
        state.mkdir(exist_ok=True)
        fenv = {"PATH": "/usr/bin:/bin", "WARMSTART_HEALTH_URL": f"{engine.url}/health",
                "WARMSTART_COMPLETIONS_URL": f"{engine.url}/v1/completions", "WARMSTART_SERVED_MODEL": self.served,
                "WARMSTART_STATE_DIR": str(state), "WARMSTART_WEIGHTS_CHOICE_FILE": str(state / "none.json"),
                "POD_NAME": name, "POD_NAMESPACE": self.ns, "WARMSTART_REQUEST_TIMEOUT_S": "60"}
        if sleeper:
            return  # a sleeping standby engine served its first token before it slept
        self._pipe(p, "first-token", [sys.executable, "-I", "-S", str(artifact("first_token.pyz")), "--once"], fenv, r)

    def _pipe(self, p: dict[str, Any], container: str, argv: list[str], env: dict[str, str], r: Running) -> int:
        name = p["metadata"]["name"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        r.procs.append(proc)
        for line in proc.stdout:  # type: ignore[union-attr]
            self.api.append_log(self.ns, name, container, line)
        return proc.wait()

    def _run_command(self, p: dict[str, Any], r: Running) -> None:
        c = p["spec"]["containers"][0]
        argv = [sys.executable if a == "python3" else a for a in [*c.get("command", []), *c.get("args", [])]]
        host = f"{self.m.name}.{self.ns}.svc:{serving.HTTP_PORT}"
        argv = [a.replace(f"http://{host}", self.router.url) for a in argv]  # type: ignore[union-attr]
        env = {"PATH": "/usr/bin:/bin", **{e["name"]: e.get("value", "") for e in c.get("env") or []},
               **self.extra_env.get(c["name"], {})}
        rc = self._pipe(p, c["name"], argv, env, r)
        if not r.stop.is_set():
            self._set(p["metadata"]["name"], phase="Succeeded" if rc == 0 else "Failed")

    # -- the Service, the autoscaler, the actuator

    def _discover(self) -> None:
        """SMG's pod watch: the pods its rendered selector matches that are Ready."""
        sel = self.router.selector  # type: ignore[union-attr]
        with self.lock:
            engines = dict(self.engines)
        urls = []
        for name, url in engines.items():
            p = self.api.get("pods", self.ns, name)
            if p is None or p["status"].get("phase") != "Running":
                continue
            labels = p["metadata"].get("labels") or {}
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
            if ready and all(labels.get(k) == v for k, v in sel.items()):
                urls.append(url)
        self.router.select(urls)  # type: ignore[union-attr]

    def _waiting(self) -> float:
        total = 0.0
        for url in list(self.engines.values()):
            try:
                with urllib.request.urlopen(url + "/metrics", timeout=2) as resp:  # noqa: S310
                    for line in resp.read().decode().splitlines():
                        if line.startswith("vllm:num_requests_waiting"):
                            total += float(line.rsplit(" ", 1)[1])
            except OSError:
                pass
        return total

    def _autoscale(self) -> None:
        a = self.m.autoscaling
        if a is None:
            return
        d = self.api.get("deployments", self.ns, self.m.name)
        if d is None:
            return
        cur = int(d["spec"]["replicas"])
        if cur == 0 and self.activation is not None:
            key, above = self.activation
            try:
                value = float(self.router.held()[key])  # type: ignore[union-attr]
            except (OSError, KeyError, ValueError):
                value = 0.0
            if value > above:
                d["spec"]["replicas"] = 1
                self.api.put("deployments", d)
            return
        want = math.ceil(self._waiting() / self.target_waiting)
        hi = a.max_replicas + self.standby_count
        new = max(cur, min(hi, max(a.min_replicas + self.standby_count, cur + (1 if want > cur else 0))))
        if new != cur:
            d["spec"]["replicas"] = new
            self.api.put("deployments", d)

    def start_actuator(self) -> None:
        """The real standby actuator over the engines up now, its labels copied onto the pods."""
        with self.lock:
            urls = dict(self.engines)
        labels = {}
        for name, url in urls.items():
            p = self.api.get("pods", self.ns, name)
            labels[url] = (p["metadata"].get("labels") or {}).get(serving.ENGINE_LABEL, serving.ENGINE_AWAKE)
        self.labels_file.write_text(json.dumps(labels))
        pod = self.api.put("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{self.m.name}-standby-0", "namespace": self.ns, "labels": standby_manifests.labels(self.m.name)},
            "spec": {"nodeName": "cpu-node", "containers": [{"name": "actuator", "image": "x"}]},
            "status": {"phase": "Running"}})
        self.actuator = subprocess.Popen(
            [sys.executable, "-I", "-S", str(artifact("standby.pyz")), "--model", self.served, "--engines", ",".join(sorted(urls.values())),
             "--labels-file", str(self.labels_file), "--period", "1", "--probe-timeout", "2", "--standby",
             str(self.standby_count), "--min-awake", str(self.m.autoscaling.min_replicas), "--target-waiting",
             f"{self.target_waiting:g}", "--awake-idle-seconds", "600"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={"PATH": "/usr/bin:/bin"})
        self._url_pod = {u: n for n, u in urls.items()}

        def read() -> None:
            for line in self.actuator.stdout:  # type: ignore[union-attr]
                try:
                    doc = json.loads(line)
                    if doc.get("url") in self._url_pod:
                        doc["pod"] = self._url_pod[doc["url"]]
                    line = json.dumps(doc, sort_keys=True)
                except ValueError:
                    pass
                self.api.append_log(self.ns, pod["metadata"]["name"], "actuator", line)
        threading.Thread(target=read, daemon=True).start()

    def _labels(self) -> None:
        if self.actuator is None:
            return
        try:
            labels = json.loads(self.labels_file.read_text())
        except (OSError, ValueError):
            return
        for url, value in labels.items():
            name = self._url_pod.get(url)
            p = self.api.get("pods", self.ns, name) if name else None
            if p is not None and (p["metadata"].get("labels") or {}).get(serving.ENGINE_LABEL) != value:
                p["metadata"]["labels"][serving.ENGINE_LABEL] = value
                self.api.put("pods", p)
