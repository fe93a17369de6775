"""A drill run against the cluster: make the changes the plan lists, watch the step, measure,
restore (on finish, on an error, on Ctrl-C), report.

Every API call goes through one `call(method, path, query, body, content_type)` (restore.Call),
the user's kubeconfig behind it (`kube_call`), so what the drill sends is a short list of REST
requests (manifests.DRILL_*_RULES) that the tests check one by one against the Kubernetes
OpenAPI schema and that RBAC.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

from ..manifests import node_cache, serving
from ..manifests import standby as standby_manifests
from ..decisions.autoscaling import SCRAPE_INTERVAL_SECONDS
from . import manifests, measure, prefix, restore
from . import plan as dp
from .restore import MERGE, Call

POLL_S = 2.0
LOG_LIMIT_BYTES = 2 * 1024 * 1024
FIRST_TOKEN_CONTAINER = "first-token"
ACTUATOR_CONTAINER = "actuator"
WEIGHTS_CONTAINER = node_cache.SELECT_CONTAINER  # the weights picker's init container


class DrillError(RuntimeError):
    """The API refused or the cluster is not what the plan says; one line for the user."""


def kube_call(api_client: Any) -> Call:
    """`call` over the Kubernetes Python client's ApiClient (the user's kubeconfig, its auth
    plugins such as `aws eks get-token`): the raw JSON of each answer, never the client's models."""
    from kubernetes.client.exceptions import ApiException

    def call(method: str, path: str, query: dict[str, str] | None, body: Any, ctype: str) -> tuple[int, Any]:
        try:
            # The client's own request building: its auth (the kubeconfig's token or exec plugin,
            # e.g. `aws eks get-token`), host and TLS settings; the answer is read raw.
            params = api_client.param_serialize(method, path, query_params=list((query or {}).items()),
                                                header_params={"Content-Type": ctype,
                                                               "Accept": "application/json, */*"},
                                                body=body, auth_settings=["BearerToken"])
            r = api_client.call_api(*params, _request_timeout=30)
            status, data = r.status, r.read()
        except ApiException as exc:
            status, data = exc.status or 0, exc.body or b""
        except Exception as exc:  # urllib3's connection errors: one line, not a traceback
            if type(exc).__module__.startswith("urllib3"):
                raise DrillError(f"{method} {path}: {exc}") from None
            raise
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text
    return call


class Api:
    def __init__(self, call: Call) -> None:
        self.call = call

    def _do(self, method: str, path: str, query: dict[str, str] | None = None, body: Any = None,
            ctype: str = "application/json", ok: tuple[int, ...] = (200, 201, 202)) -> Any:
        status, doc = self.call(method, path, query, body, ctype)
        if status not in ok:
            reason = doc.get("message") if isinstance(doc, dict) else str(doc)[:200]
            hint = " (docs/drill.md lists the permissions the drill needs)" if status == 403 else ""
            raise DrillError(f"{method} {path}: HTTP {status} {reason or ''}{hint}".rstrip())
        return doc

    def get(self, path: str, **query: str) -> Any:
        return self._do("GET", path, query or None)

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        return self._do("POST", path, None, obj)

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return self._do("PATCH", path, None, body, MERGE)

    def log(self, namespace: str, pod: str, container: str) -> str:
        status, doc = self.call("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}/log",
                                {"container": container, "timestamps": "true", "limitBytes": str(LOG_LIMIT_BYTES)},
                                None, "application/json")
        if status != 200:
            return ""
        return doc if isinstance(doc, str) else json.dumps(doc)


def _path_of(obj: dict[str, Any]) -> str:
    kind, ns = obj["kind"], obj["metadata"].get("namespace")
    plural = {"ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings",
              "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings", "Job": "jobs",
              "Pod": "pods", "NetworkPolicy": "networkpolicies"}[kind]
    group = obj["apiVersion"]
    base = f"/api/{group}" if "/" not in group else f"/apis/{group}"
    return f"{base}/namespaces/{ns}/{plural}" if ns else f"{base}/{plural}"


def selector_query(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


@dataclass
class Outcome:
    lines: list[measure.Line] = field(default_factory=list)
    load: dict[str, Any] | None = None
    restored: list[str] = field(default_factory=list)
    cancelled: bool = False
    lost: dict[str, Any] | None = None
    """--lose-prepared-node: the node, the pods evicted and those the budget kept."""


def _ready(pod: dict[str, Any]) -> bool:
    return measure.condition_time(pod, "Ready") is not None


def execute(p: dp.DrillPlan, m: Any, call: Call, *, say: Callable[[str], None] = print, poll_s: float = POLL_S,
            clock: Callable[[], float] = time.monotonic, scrape_interval_s: float = SCRAPE_INTERVAL_SECONDS,
            aws_credentials: Any = None,
            cancel: Callable[[], bool] = lambda: False, eviction_retry_s: float = dp.EVICTION_RETRY_S) -> Outcome:
    """The run. Whatever happens after the first change, the finally block restores."""
    api, ns, out = Api(call), p.namespace, Outcome()
    apps = f"/apis/apps/v1/namespaces/{ns}/deployments/{m.name}"
    pods_path = f"/api/v1/namespaces/{ns}/pods"
    sel = selector_query(serving.selector(m.name))
    deployment = api.get(apps)
    before = {x["metadata"]["name"]: x for x in api.get(pods_path, labelSelector=sel).get("items") or []}
    say(f"drill {p.run_id}: {len(before)} pod(s) of {m.name} before the step")
    previous = signal.getsignal(signal.SIGTERM)

    def _term(*_: Any) -> None:
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGTERM, _term)
    except ValueError:  # not the main thread (tests drive it from one): Ctrl-C is the caller's
        previous = None
    try:
        for obj in manifests.restore_objects(p, cluster_scope=p.lose_node):
            api.create(_path_of(obj), obj)
        say(f"restore Job {ns}/{manifests.restore_name(p.run_id)} set for {p.expires_at:%H:%M:%SZ}")
        if p.scale_to is not None:
            api.patch(apps, {"metadata": {"annotations": {dp.REPLICAS_ANNOTATION: str(deployment["spec"]["replicas"]),
                                                          dp.RUN_LABEL: p.run_id}}})
            api.patch(f"{apps}/scale", {"spec": {"replicas": p.scale_to}})
            say(f"Deployment {ns}/{m.name}: replicas {deployment['spec']['replicas']} -> {p.scale_to}")
        job = manifests.load_job(p, served_model=m.name)
        step_at = datetime.now(timezone.utc)
        api.create(_path_of(job), job)
        say(f"load Job {ns}/{job['metadata']['name']}: {p.bounds.rate:g}/s for {p.bounds.duration_s} s")
        if p.fallback:
            np = manifests.fallback_network_policy(p)
            api.create(_path_of(np), np)
            pod = manifests.fallback_pod(p, deployment)
            api.create(_path_of(pod), pod)
            say(f"cache-bypassed pod {ns}/{pod['metadata']['name']} created")
        if p.lose_node:
            out.lost = _lose_node(api, p, m, before, say, eviction_retry_s, clock)
        load_name = manifests.load_job_name(p.run_id)
        t_end = clock() + p.bounds.deadline_s
        load_done_at: float | None = None
        while clock() < t_end:
            if cancel():
                raise KeyboardInterrupt
            jstat = api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{load_name}").get("status") or {}
            finished = bool(jstat.get("succeeded") or jstat.get("failed"))
            if finished and load_done_at is None:
                load_done_at = clock()
                say("load finished; waiting for the replicas it started")
            now_pods = api.get(pods_path, labelSelector=sel).get("items") or []
            new = [x for x in now_pods if x["metadata"]["name"] not in before]
            fb = [x for x in api.get(pods_path, labelSelector=f"{dp.RUN_LABEL}={p.run_id},app.kubernetes.io/component=drill-cold")
                  .get("items") or []]
            waiting = [x for x in new + fb if x["status"].get("phase") not in ("Failed", "Succeeded") and not
                       measure.first_inference(api.log(ns, x["metadata"]["name"], FIRST_TOKEN_CONTAINER))]
            if load_done_at is not None and (not waiting or clock() - load_done_at >= p.bounds.settle_s):
                break
            time.sleep(poll_s)
        out.lines, out.load = _measure(api, p, m, before, step_at, out.lost)
        out.lines.append(_routing_line(api, p, m, out.load, scrape_interval_s, aws_credentials))
    except KeyboardInterrupt:
        out.cancelled = True
        say("cancelled: restoring")
    finally:
        out.restored = restore.restore(call, ns, p.run_id)
        say(f"restored: {len(out.restored)} change(s) undone")
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return out


def _lose_node(api: Api, p: dp.DrillPlan, m: Any, before: dict[str, Any], say: Callable[[str], None],
               retry_s: float, clock: Callable[[], float]) -> dict[str, Any]:
    """Cordon a node that holds the model's staged weights and serves one of its pods, keep
    Karpenter from consolidating it while the drill holds it, then evict its pods of the model
    (policy/v1 Eviction: the API answers 429 while the PodDisruptionBudget allows no disruption,
    "retry later"; retried for `retry_s`, then reported, never forced with a delete)."""
    from ..manifests.node_cache import label_key

    label = label_key(m.name)
    nodes = api.get("/api/v1/nodes", labelSelector=label).get("items") or []
    serving_nodes = {(x.get("spec") or {}).get("nodeName") for x in before.values()}
    candidates = sorted((n for n in nodes if n["metadata"]["name"] in serving_nodes
                         and not (n.get("spec") or {}).get("unschedulable")), key=lambda n: n["metadata"]["name"])
    if not candidates:
        raise DrillError(f"--lose-prepared-node: no schedulable node labelled {label} serves {m.name}")
    node = candidates[0]["metadata"]["name"]
    ann: dict[str, Any] = {dp.CORDON_ANNOTATION: p.run_id}
    if dp.DO_NOT_DISRUPT not in (candidates[0]["metadata"].get("annotations") or {}):
        ann.update({dp.DO_NOT_DISRUPT: "true", dp.PROTECT_ANNOTATION: "added"})
    api.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}, "metadata": {"annotations": ann}})
    say(f"node {node} cordoned ({dp.DO_NOT_DISRUPT} while the drill holds it)")
    pending = sorted(name for name, pod in before.items() if (pod.get("spec") or {}).get("nodeName") == node)
    evicted: list[str] = []
    deadline = clock() + retry_s
    while pending:
        for name in list(pending):
            ev = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": p.namespace}}
            status, _ = api.call("POST", f"/api/v1/namespaces/{p.namespace}/pods/{name}/eviction", None, ev,
                                 "application/json")
            if status in (200, 201, 404):  # 404: already gone
                pending.remove(name)
                evicted.append(name)
                say(f"pod {name} evicted from {node}")
            elif status != 429:
                raise DrillError(f"evicting {p.namespace}/{name}: HTTP {status}")
        if not pending or clock() >= deadline:
            break
        time.sleep(min(5.0, max(0.5, retry_s / 10)))
    for name in pending:
        say(f"pod {name}: eviction refused by its PodDisruptionBudget (429) for {retry_s:g} s; left running")
    return {"node": node, "evicted": evicted, "refused": pending, "retry_s": retry_s}


def _measure(api: Api, p: dp.DrillPlan, m: Any, before: dict[str, Any], step_at: datetime,
             lost: dict[str, Any] | None = None
             ) -> tuple[list[measure.Line], dict[str, Any] | None]:
    ns = p.namespace
    pods_path = f"/api/v1/namespaces/{ns}/pods"
    load = None
    for lp in api.get(pods_path, labelSelector=f"job-name={manifests.load_job_name(p.run_id)}").get("items") or []:
        found = measure.log_lines(api.log(ns, lp["metadata"]["name"], "load"), "warmstart.drill_load")
        if found:
            load = found[-1][1]
    t0 = datetime.fromtimestamp(float(load["started"]), timezone.utc) if load and load.get("started") else step_at
    nodes = {n["metadata"]["name"]: n for n in api.get("/api/v1/nodes").get("items") or []}
    lines: list[measure.Line] = []
    # A wake: the standby actuator's record, after the step began.
    if m.standby is not None:
        for ap in api.get(pods_path, labelSelector=selector_query(standby_manifests.selector(m.name))).get("items") or []:
            for when, rec in measure.log_lines(api.log(ns, ap["metadata"]["name"], ACTUATOR_CONTAINER), measure.WAKE_EVENT):
                if when is not None and when >= t0:
                    lines.append(measure.wake_line(when, rec, p.predictions.get(dp.WAKE), t0))
    for pod in api.get(pods_path, labelSelector=selector_query(serving.selector(m.name))).get("items") or []:
        if pod["metadata"]["name"] in before:
            continue
        path = measure.classify(pod, nodes)
        first = measure.first_inference(api.log(ns, pod["metadata"]["name"], FIRST_TOKEN_CONTAINER))
        detail = f"on {pod['spec'].get('nodeName') or 'no node'}"
        weights = measure.weights_choice(api.log(ns, pod["metadata"]["name"], WEIGHTS_CONTAINER))
        if weights is not None:
            # The weights picker's verdict: a staged model's pod on a node without the copy streamed
            # from S3 (its degraded start, which the picker's line says and the record keeps).
            if weights.get("result") == "hit":
                detail += ", weights from the node cache (a prepared node)"
            else:
                detail += f", weights streamed from S3 (degraded: {weights.get('reason') or 'node cache miss'})"
                if path == dp.WARM_SPARE and dp.S3_FALLBACK in p.predictions:
                    path = dp.S3_FALLBACK
        lines.append(measure.pod_line(pod, path, p.predictions.get(path), t0, first, detail))
    for pod in api.get(pods_path, labelSelector=f"{dp.RUN_LABEL}={p.run_id},app.kubernetes.io/component=drill-cold").get("items") or []:
        first = measure.first_inference(api.log(ns, pod["metadata"]["name"], FIRST_TOKEN_CONTAINER))
        lines.append(measure.pod_line(pod, dp.COLD, p.predictions.get(dp.COLD), t0, first,
                                      f"caches bypassed, on {pod['spec'].get('nodeName') or 'no node'}"))
    if lost and lost["refused"]:
        lines.append(measure.Line(f"node {lost['node']} lost", "lost node", None, None, None,
                                  "its pods evicted and replaced",
                                  detail=f"the PodDisruptionBudget refused the eviction of {', '.join(lost['refused'])} "
                                         f"(HTTP 429) for {lost['retry_s']:g} s: the path was not exercised; rerun "
                                         "when the model has a disruption to spare (more replicas than the budget keeps)"))
    if not any(l.path != dp.COLD for l in lines):
        lines.append(measure.Line("scale-out", "any", None, None, None, "a replica added within the run",
                                  detail="no replica was added or woken: the load did not reach the autoscaler's "
                                         "target (raise --rate or --duration), or the pool had no capacity"))
    lines += measure.load_lines(load)
    return lines, load


def _routing_line(api: Api, p: dp.DrillPlan, m: Any, load: dict[str, Any] | None, scrape_s: float,
                  credentials: Any) -> measure.Line:
    """The prefix-cache hit rate over the load's window, from the metrics endpoint the model's
    ScaledObject names (prefix.py)."""
    def get(path: str) -> Any:
        status, doc = api.call("GET", path, None, None, "application/json")
        if status == 404:
            return None
        if status != 200:
            return f"reading {path}: HTTP {status}" + (" (docs/drill.md lists the permissions)" if status == 403 else "")
        return doc

    found = get(prefix.KEDA_SCALEDOBJECTS.format(ns=p.namespace, name=m.name))
    ep = found if isinstance(found, str) else prefix.endpoint(lambda _: found, p.namespace, m.name)
    return prefix.line(ep, m.name, p.namespace, load, scrape_s, credentials=credentials)


def expires_at_ok(p: dp.DrillPlan) -> bool:
    return p.expires_at > p.started_at + timedelta(seconds=p.bounds.deadline_s)


def write_record(p: dp.DrillPlan, rec: dict[str, Any], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"drill-{p.run_id}.json"
    out.write_text(json.dumps(rec, indent=1, sort_keys=True))
    return out
