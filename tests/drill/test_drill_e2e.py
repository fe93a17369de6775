"""`warmstart drill` end to end, offline: the stand-in API server (tests/support/kube_api.py)
with the cluster model behind it (tests/support/cluster_model.py: ReplicaSet and Job controllers,
scheduler, node autoscaler, kubelet running fake vLLM engines and the real first-token sidecar,
pod autoscaler, the real standby actuator), prod's qwen-67b Deployment as rendered. Every request
the drill sends goes through the Kubernetes Python client with a kubeconfig, is checked against
the OpenAPI schema and against the RBAC docs/drill.md lists (manifests.DRILL_*_RULES)."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import subprocess
import sys
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.cluster_model import ClusterModel, Timing
from tests.support.kube_api import KubeApi, wait_for
from tests.support.prometheus import StandInPrometheus
from tests.support.stacks import load_stack_doc, render_doc
from warmstart import render
from warmstart.coldstart import reader
from warmstart.drill import command, manifests, restore, run
from warmstart.drill import plan as dp
from warmstart.exit_codes import EXIT_DRILL_FAILED, EXIT_OK
from warmstart.manifests import serving

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.servers
DRILL, RESTORE = "drill-user-token", "restore-job-token"


@pytest.fixture(scope="module")
def prod():
    r = render.run_program(ROOT / "stacks", "prod")
    m = next(x for x in r.stack_plan.models if x.name == "qwen-67b")
    dep = next(o for o in r.kubernetes_objects if o["kind"] == "Deployment" and o["metadata"]["name"] == m.name)
    router = next(o for o in r.kubernetes_objects if o["kind"] == "Deployment" and o["metadata"]["name"] == f"{m.name}-router")
    so = next(o for o in r.kubernetes_objects if o["kind"] == "ScaledObject" and o["metadata"]["name"] == m.name)
    return r.stack_plan, m, dep, router, so


@contextmanager
def cluster(prod, tmp_path, timing: Timing):
    stack_plan, m, dep, router, _ = prod
    ns = stack_plan.config.namespace
    api = KubeApi({DRILL: manifests.DRILL_NAMESPACE_RULES + manifests.DRILL_CLUSTER_RULES,
                   RESTORE: manifests.RESTORE_NAMESPACE_RULES + manifests.RESTORE_CLUSTER_RULES},
                  stack_plan.config.kubernetes_version)
    with api:
        # TP=2 on nodes of two GPUs: one pod a node, so a scale-out needs the spare or a new node.
        with ClusterModel(api, m, ns, timing, gpus_per_node=2, nodes=3, spare_nodes=1, router=router,
                          standby_count=m.standby.count) as cm:
            cm.deploy(dep, m.autoscaling.min_replicas + m.standby.count)
            assert wait_for(lambda: len(cm.engines) == 3, 60), "the model's pods never came up"
            sleeper = sorted(cm.engines)[0]
            urllib.request.urlopen(urllib.request.Request(cm.engines[sleeper] + "/sleep?level=1", data=b"",
                                                          method="POST"), timeout=10).read()
            pod = api.get("pods", ns, sleeper)
            pod["metadata"]["labels"][serving.ENGINE_LABEL] = "asleep"
            api.put("pods", pod)
            cm.start_actuator()
            call = run.kube_call(reader.connect(api.kubeconfig(str(tmp_path / "kubeconfig"), DRILL)).api_client)
            yield api, cm, call, m, ns


def bounds() -> dp.Bounds:
    return dp.Bounds(rate=30, duration_s=15, concurrency=64, prefix_groups=4, settle_s=45)


def left_behind(api: KubeApi, run_id: str) -> list[str]:
    out = []
    for (res, ns, name), obj in list(api.store.items()):
        meta = obj["metadata"]
        if (meta.get("labels") or {}).get(dp.RUN_LABEL) == run_id or dp.REPLICAS_ANNOTATION in (meta.get("annotations") or {}) \
                or dp.CORDON_ANNOTATION in (meta.get("annotations") or {}) or obj.get("spec", {}).get("unschedulable") \
                or dp.PROTECT_ANNOTATION in (meta.get("annotations") or {}):
            out.append(f"{res} {ns}/{name}")
    return out


def assert_clean_requests(api: KubeApi) -> None:
    assert api.denied == [], api.denied
    assert api.invalid == [], api.invalid
    assert any(t == DRILL for t, *_ in api.requests)


def _stats(engines: dict[str, str]) -> dict[str, dict]:
    out = {}
    for name, url in engines.items():
        try:
            out[name] = json.loads(urllib.request.urlopen(url + "/fake/stats", timeout=10).read())
        except OSError:
            pass
    return out


def test_a_drill_measures_every_new_replica_and_restores(prod, tmp_path, monkeypatch):
    *_, so = prod
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDSTANDIN")  # the user's credentials, from the default chain
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "standin-secret")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    with cluster(prod, tmp_path, Timing()) as (api, cm, call, m, ns):
        def engines():
            with cm.lock:
                return dict(cm.engines)
        region = next(t["metadata"]["awsRegion"] for t in so["spec"]["triggers"] if t["type"] == "prometheus")
        with StandInPrometheus(engines, ns, interval_s=2.0, region=region, access_key="AKIDSTANDIN",
                               secret_key="standin-secret") as prom:
            # The rendered ScaledObject, its serverAddress the stand-in workspace's.
            obj = copy.deepcopy(so)
            for t in obj["spec"]["triggers"]:
                if t["type"] == "prometheus":
                    t["metadata"]["serverAddress"] = prom.url
            api.put("scaledobjects", obj)
            before = _stats(engines())
            p = dp.plan("prod", m, ns, 1, bounds(), fallback=True)
            out = run.execute(p, m, call, poll_s=1.0, say=lambda s: None, scrape_interval_s=2.0)
            after = _stats(engines())  # the restore has stopped the bypassed pod's engine (no traffic)
        assert prom.refused == [] and len(prom.queries) == 2, (prom.refused, prom.queries)
        (routing,) = [l for l in out.lines if l.path == "routing"]
        hits = sum(a["hit_tokens"] - before.get(n, {}).get("hit_tokens", 0) for n, a in after.items())
        looked = sum(a["prompt_tokens"] - before.get(n, {}).get("prompt_tokens", 0) for n, a in after.items())
        # The engines' own counters over the load, through scrapes and increase(): within the
        # extrapolation's weighting of engines that started mid-window.
        assert routing.measured is not None and abs(routing.measured - hits / looked) < 0.1, \
            (routing.as_json(), hits, looked)
        assert_clean_requests(api)
        assert left_behind(api, p.run_id) == []
        paths = {line.path for line in out.lines}
        assert dp.WAKE in paths, ([l.as_json() for l in out.lines], api.logs.get((ns, f"{m.name}-standby-0", "actuator"), [])[-5:])
        assert dp.COLD in paths
        assert paths & {dp.WARM_SPARE, dp.NEW_NODE}, [l.as_json() for l in out.lines]
        for line in out.lines:
            if line.path in dp.PATHS:
                t = line.times
                assert t["first_inference"] is not None and t["requested"] <= t["first_inference"], line.as_json()
                assert line.predicted == p.predictions[line.path].seconds
        assert out.load and out.load["ok"] > 0 and out.load["failed"] == 0, out.load
        # Every answered request went through the real SMG (its requests for the served model),
        # routed by the rendered prefix_hash policy.
        assert cm.router.smg.metric_sum("smg_router_requests_total", model=m.name) >= out.load["ok"]
        assert cm.router.smg.metric_sum("smg_prefix_hash_policy_branch_total") > 0
        assert all(line.passed for line in out.lines), [l.as_json() for l in out.lines if not l.passed]


def test_a_wake_slower_than_predicted_fails_its_line_and_the_exit_code(prod, tmp_path):
    # 67 GiB at 12/67 s per GiB: a 12 s wake, past the prediction's 2x (~4 s -> limit ~9 s).
    with cluster(prod, tmp_path, Timing(wake_s_per_gib=12 / 67)) as (api, cm, call, m, ns):
        args = argparse.Namespace(stack="prod", model=m.name, apply=True, restore=False, confirm_production=False,
                                  rate=30.0, duration=15, concurrency=64, max_requests=0, max_tokens=8, prefix_groups=4,
                                  settle=45, no_fallback=True, lose_prepared_node=False, plot=str(tmp_path / "d.png"),
                                  record_dir=str(tmp_path / "rec"), json=False, no_record=True, kubeconfig=None, context=None)
        rc = command.drill(args, ROOT, call=call)
        assert_clean_requests(api)
        assert rc == EXIT_DRILL_FAILED
        rec = next((tmp_path / "rec").glob("drill-*.json")).read_text()
        assert '"path": "wake"' in rec and '"pass": false' in rec
        assert (tmp_path / "d.png").stat().st_size > 1000


def test_a_cancelled_run_restores_everything(prod, tmp_path):
    with cluster(prod, tmp_path, Timing()) as (api, cm, call, m, ns):
        p = dp.plan("prod", m, ns, 1, bounds(), fallback=True)
        polls = []
        out = run.execute(p, m, call, poll_s=1.0, say=lambda s: None, cancel=lambda: bool(polls.append(1)) or len(polls) > 2)
        assert out.cancelled
        assert_clean_requests(api)
        assert left_behind(api, p.run_id) == []


def test_the_restore_job_undoes_a_run_whose_client_was_lost(prod, tmp_path):
    """What the in-cluster expiry runs: the restore Job's own container command, with its own
    identity (the Role it is given), after a client that made its changes and vanished."""
    stack_plan, m, dep, _, _ = prod
    with cluster(prod, tmp_path, Timing()) as (api, cm, call, m, ns):
        m2 = dataclasses.replace(m, autoscaling=None)
        p = dp.plan("prod", m2, ns, 1, bounds(), fallback=True, lose_node=False)
        a = run.Api(call)
        for obj in manifests.restore_objects(p, cluster_scope=True):
            a.create(run._path_of(obj), obj)
        apps = f"/apis/apps/v1/namespaces/{ns}/deployments/{m.name}"
        a.patch(apps, {"metadata": {"annotations": {dp.REPLICAS_ANNOTATION: "3", dp.RUN_LABEL: p.run_id}}})
        a.patch(apps + "/scale", {"spec": {"replicas": 4}})
        job = manifests.load_job(p, m.name)
        a.create(run._path_of(job), job)
        a.create(run._path_of(manifests.fallback_network_policy(p)), manifests.fallback_network_policy(p))
        a.create(run._path_of(manifests.fallback_pod(p, dep)), manifests.fallback_pod(p, dep))
        node = "gpu-node-0"
        a.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True},
                                          "metadata": {"annotations": {dp.CORDON_ANNOTATION: p.run_id}}})
        # The client is gone. The restore Job's command, --wait 0 (its expiry has come):
        rj = next(o for o in manifests.restore_objects(p, cluster_scope=True) if o["kind"] == "Job")
        c = rj["spec"]["template"]["spec"]["containers"][0]
        args = list(c["args"])
        args[args.index("--wait") + 1] = "0"
        env = {"PATH": "/usr/bin:/bin", "WARMSTART_KUBE_API": api.base_url, "WARMSTART_KUBE_TOKEN": RESTORE,
               **{e["name"]: e["value"] for e in c["env"]}}
        done = subprocess.run([sys.executable, *c["command"][1:], *args], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert [d for d in api.denied if d[0] == RESTORE] == [], api.denied
        assert api.get("deployments", ns, m.name)["spec"]["replicas"] == 3
        remaining = [r for r in left_behind(api, p.run_id)
                     if not r.startswith(f"pods {ns}/{manifests.restore_name(p.run_id)}-")]  # its own Job's pod
        # Its own Job (removed by its TTL) and the rules bound to no one are what it leaves.
        assert sorted(remaining) == sorted([f"jobs {ns}/{manifests.restore_name(p.run_id)}",
                                            f"roles {ns}/{manifests.restore_name(p.run_id)}",
                                            f"clusterroles /{ns}-{manifests.restore_name(p.run_id)}"]), remaining
        # The client's --restore removes the rest.
        restore.restore(call, ns, None)
        assert left_behind(api, p.run_id) == []
        assert_clean_requests(api)


@pytest.fixture(scope="module")
def zero(tmp_path_factory):
    """prod's qwen-67b without standby at minReplicas 0: zero pods, a front queue before SMG."""
    doc = copy.deepcopy(load_stack_doc("prod"))
    model = next(x for x in doc["config"]["warmstart:models"] if x["name"] == "qwen-67b")
    model.pop("standby")
    model["autoscaling"]["minReplicas"] = 0
    r = render_doc(doc, tmp_path_factory.mktemp("zero"), "prod-zero")
    m = next(x for x in r.stack_plan.models if x.name == "qwen-67b")
    by = {(o["kind"], o["metadata"]["name"]): o for o in r.kubernetes_objects}
    return r.stack_plan, m, by[("Deployment", m.name)], by[("Deployment", f"{m.name}-router")], by[("ScaledObject", m.name)]


def test_a_drill_from_zero_pods_is_held_by_the_front_queue_and_measured(zero, tmp_path):
    """The load reaches a model at zero pods through the real front queue (its command line as
    the router pod runs it) and SMG: held, KEDA's activation adds a replica, nothing fails."""
    stack_plan, m, dep, router, so = zero
    assert any(c["name"] == "front-queue" for c in router["spec"]["template"]["spec"]["containers"])
    ns = stack_plan.config.namespace
    api = KubeApi({DRILL: manifests.DRILL_NAMESPACE_RULES + manifests.DRILL_CLUSTER_RULES},
                  stack_plan.config.kubernetes_version)
    with api, ClusterModel(api, m, ns, Timing(), gpus_per_node=2, nodes=0, spare_nodes=1, router=router,
                           scaled_object=so) as cm:
        cm.deploy(dep, 0)
        call = run.kube_call(reader.connect(api.kubeconfig(str(tmp_path / "kubeconfig"), DRILL)).api_client)
        p = dp.plan("prod-zero", m, ns, 1, dp.Bounds(rate=5, duration_s=10, concurrency=32, prefix_groups=2,
                                                      settle_s=45), fallback=False)
        out = run.execute(p, m, call, poll_s=1.0, say=lambda s: None)
        assert_clean_requests(api)
        assert left_behind(api, p.run_id) == []
        assert out.load and out.load["ok"] == out.load["sent"] > 0 and out.load["failed"] == 0, out.load
        # The first replica, activated from zero, took the spare node (any later one a new node).
        line = min((l for l in out.lines if l.path in dp.PATHS), key=lambda l: l.times["requested"])
        assert line.path == dp.WARM_SPARE and line.passed, line.as_json()
        # The first request, sent at zero pods, was held and answered once the replica was Ready
        # (samples: [sent at, time to first token, status], seconds after the load started).
        sent_at, ttft, status = out.load["samples"][0]
        assert status == 200 and sent_at + ttft >= line.times["ready"], (out.load["samples"][:3], line.as_json())
        assert all(l.passed for l in out.lines), [l.as_json() for l in out.lines if not l.passed]


@pytest.fixture(scope="module")
def staged():
    """staging-llama-3-1-8b: weights staged on its g6e nodes' NVMe (the weights picker in its
    pods), one GPU a node, a PodDisruptionBudget of maxUnavailable 1."""
    r = render.run_program(ROOT / "stacks", "staging-llama-3-1-8b")
    (m,) = r.stack_plan.models
    assert m.staged
    by = {(o["kind"], o["metadata"]["name"]): o for o in r.kubernetes_objects}
    return r.stack_plan.contract.namespace, m, by[("Deployment", m.name)], by[("Deployment", f"{m.name}-router")], \
        by[("PodDisruptionBudget", m.name)]


@contextmanager
def staged_cluster(staged, tmp_path, prepared, pdb_patch=None, node_annotations=None):
    ns, m, dep, router, pdb = staged
    api = KubeApi({DRILL: manifests.DRILL_NAMESPACE_RULES + manifests.DRILL_CLUSTER_RULES}, "1.33")
    with api, ClusterModel(api, m, ns, Timing(), gpus_per_node=1, nodes=2, spare_nodes=1, router=router,
                           prepared=prepared) as cm:
        api.put("poddisruptionbudgets", {**copy.deepcopy(pdb), "spec": {**pdb["spec"], **(pdb_patch or {})}})
        for name, ann in (node_annotations or {}).items():
            api.get("nodes", "", name)["metadata"]["annotations"].update(ann)
        cm.deploy(dep, 2)
        assert wait_for(lambda: len(cm.engines) == 2, 60), "the model's pods never came up"
        call = run.kube_call(reader.connect(api.kubeconfig(str(tmp_path / "kubeconfig"), DRILL)).api_client)
        yield api, cm, call, m, ns


def _lose_node_run(api, call, m, ns, retry_s=30.0):
    p = dp.plan("staging-llama-3-1-8b", m, ns, 1, dp.Bounds(rate=2, duration_s=10, concurrency=8, prefix_groups=2,
                                                             settle_s=45), fallback=False, lose_node=True)
    held = []

    def say(s):
        if "cordoned" in s:  # the node as the drill left it while holding it
            node = api.get("nodes", "", "gpu-node-0")
            held.append((dict(node["metadata"]["annotations"]), node["spec"].get("unschedulable")))

    return p, run.execute(p, m, call, poll_s=1.0, say=say, eviction_retry_s=retry_s), held


@pytest.mark.parametrize("prepared, path, weights", [
    (("gpu-node-0", "gpu-node-1", "gpu-node-2"), dp.WARM_SPARE, "weights from the node cache"),
    (("gpu-node-0", "gpu-node-1"), dp.S3_FALLBACK, "weights streamed from S3 (degraded: not staged on this node)"),
])
def test_a_lost_prepared_node_is_replaced_on_another_prepared_node_or_from_s3(staged, tmp_path, prepared, path,
                                                                              weights):
    """--lose-prepared-node: the node serving a pod is cordoned and protected from Karpenter's
    consolidation while the drill holds it, its pod evicted (the budget allows one); the
    ReplicaSet's replacement lands on the spare node, prepared (node cache hit) or not (S3, its
    degraded start judged against the S3 prediction); everything restored."""
    with staged_cluster(staged, tmp_path, prepared) as (api, cm, call, m, ns):
        p, out, held = _lose_node_run(api, call, m, ns)
        assert_clean_requests(api)
        assert held and held[0][1] is True, held
        assert held[0][0].get("karpenter.sh/do-not-disrupt") == "true", held
        assert out.lost == {"node": "gpu-node-0", "evicted": [api.evicted[0][1]], "refused": [], "retry_s": 30.0}
        (line,) = [l for l in out.lines if l.path in dp.PATHS]
        assert line.path == path and weights in line.detail and "on gpu-node-2" in line.detail, line.as_json()
        assert line.predicted == p.predictions[path].seconds and line.passed, line.as_json()
        node = api.get("nodes", "", "gpu-node-0")
        assert "karpenter.sh/do-not-disrupt" not in node["metadata"]["annotations"]
        assert left_behind(api, p.run_id) == []


def test_an_eviction_the_budget_refuses_is_reported_not_forced(staged, tmp_path):
    """A budget that allows no disruption now: the API answers 429, the drill retries for its
    bound, then says so in a failing line; the pod is never deleted around the budget; the node is
    uncordoned and a do-not-disrupt annotation the user set is left in place."""
    with staged_cluster(staged, tmp_path, ("gpu-node-0", "gpu-node-1"), pdb_patch={"maxUnavailable": 0},
                        node_annotations={"gpu-node-0": {"karpenter.sh/do-not-disrupt": "true"}}) as (api, cm, call, m, ns):
        before = {p["metadata"]["name"] for p in api.items("pods", ns) if p["spec"].get("nodeName") == "gpu-node-0"}
        p, out, held = _lose_node_run(api, call, m, ns, retry_s=3.0)
        assert_clean_requests(api)
        assert api.evicted == [] and out.lost["refused"] == sorted(before), out.lost
        assert before <= {p["metadata"]["name"] for p in api.items("pods", ns)}
        (lost,) = [l for l in out.lines if l.path == "lost node"]
        assert not lost.passed and "429" in lost.detail, lost.as_json()
        assert api.get("nodes", "", "gpu-node-0")["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
        assert dp.PROTECT_ANNOTATION not in held[0][0]
        assert left_behind(api, p.run_id) == []
