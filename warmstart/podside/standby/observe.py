"""The standby actuator's reading of the world (part of the standby package, whose __init__
and main.py say what it does): each engine's state from its own endpoints, the front queues'
held requests, the engines' pods.

Only an answer of the expected shape is read: an engine whose `/is_sleeping` is not a JSON
object with a JSON boolean `is_sleeping` (vLLM's `{"is_sleeping": bool}`,
`vllm/entrypoints/serve/dev/sleep/api_router.py` at v0.33.0), or that answers with something
that is not HTTP, is unreadable: `probe` says why, and the loop leaves the engine alone that
tick. A string "false" is not false.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from ..common.kube import InCluster, MERGE_PATCH
from ..common.shared import emit_line, parse_json

# The routing label: the routers select engines on `warmstart.io/engine=awake` (the serving
# manifests put it on every serving pod's template; the Deployment's, the Service's and the PDB's
# selectors leave it out, so relabelling a pod never orphans it nor takes it out of its budget).
ENGINE_LABEL = "warmstart.io/engine"
AWAKE, ASLEEP = "awake", "asleep"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
_SAMPLE = re.compile(r'^(vllm:num_requests_(?:waiting|running))(\{[^}]*\})?\s+([0-9.eE+-]+|NaN)\s*$')
# Most bytes read of one answer: an engine's /metrics is tens of KiB; a peer that sends more is
# cut there (the read then fails to parse: that engine's tick, never the actuator's memory).
MAX_READ_BYTES = 16 << 20
# vLLM's answers are flat objects; anything nested deeper is not one.
MAX_JSON_DEPTH = 8
# What a call to a peer raises when the peer is away or its answer is not HTTP (a garbage
# status line is an http.client.HTTPException, not an OSError).
READ_ERRORS = (OSError, ValueError, http.client.HTTPException)


def log(event: str, **fields: object) -> None:
    emit_line({"event": event, "time": round(time.time(), 3), **fields}, sort_keys=True)


class Unreadable(ValueError):
    """An answer that is HTTP but not of the shape asked for."""


@dataclass
class Engine:
    url: str
    pod: str = ""
    ready: bool = False
    """/health answered: loaded (else loading or dead: never touched)."""
    sleeping: bool = False
    waiting: float = 0.0
    running: float = 0.0
    served: bool = False
    """Seen with a request running or waiting since it last woke."""
    idle_since: float = 0.0
    cost: str | None = None
    """The deletion cost last written to its pod."""
    label: str | None = None
    """The ENGINE_LABEL value last written to its pod."""
    seen_ready: bool = False
    prelabelled: bool = False
    """Labelled asleep by this actuator before it was ever Ready (a sleeper to be), and not
    labelled awake since: never in a router."""
    fresh_until: float = 0.0
    """Until when (time.time()) it is a freshly loaded engine that has never slept: the pod a
    scale-up started, which `decide` puts to sleep first while sleepers are missing, even if the
    routers already sent it requests (main.py `reconcile` sets it)."""


def parse_metrics(text: str, model: str | None = None) -> tuple[float, float]:
    """(waiting, running) summed over `text`'s samples (of `model_name=model` when given). A
    sample that is not a finite count (NaN, an infinity, a negative) counts nothing."""
    out = {"vllm:num_requests_waiting": 0.0, "vllm:num_requests_running": 0.0}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or m[3] == "NaN":
            continue
        if model is not None and m[2] and f'model_name="{model}"' not in m[2]:
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            out[m[1]] += value
    return out["vllm:num_requests_waiting"], out["vllm:num_requests_running"]


def http(method: str, url: str, body: object = None, timeout: float = 2.0) -> tuple[int, bytes]:
    """(status, body up to MAX_READ_BYTES); raises one of READ_ERRORS."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(MAX_READ_BYTES)
    except urllib.error.HTTPError as e:
        return e.code, e.read(MAX_READ_BYTES)


def json_object(body: bytes) -> dict:
    """`body` as a JSON object, else Unreadable saying what it is."""
    doc, why = parse_json(body, MAX_JSON_DEPTH)
    if why:
        raise Unreadable(f"the answer is {why}")
    if not isinstance(doc, dict):
        raise Unreadable(f"the answer is a JSON {type(doc).__name__}, not an object")
    return doc


def is_sleeping(body: bytes) -> bool:
    """vLLM's `/is_sleeping` answer, `{"is_sleeping": true|false}`: only a JSON boolean is one."""
    value = json_object(body).get("is_sleeping")
    if not isinstance(value, bool):
        raise Unreadable(f"is_sleeping is {json.dumps(value)[:40]}, not a JSON boolean")
    return value


def probe(e: Engine, model: str | None, timeout: float) -> str | None:
    """Read one engine's state into `e`: loading when /health does not answer 200. Returns why
    the answers of an engine that is up could not be read (`e` is then left as it was), else None."""
    try:
        up = http("GET", e.url + "/health", timeout=timeout)[0] == 200
    except READ_ERRORS:
        up = False
    if not up:
        e.ready = False
        return None
    try:
        code, body = http("GET", e.url + "/is_sleeping", timeout=timeout)
        if code != 200:
            return f"/is_sleeping answered HTTP {code}"
        sleeping = is_sleeping(body)
        code, body = http("GET", e.url + "/metrics", timeout=timeout)
        waiting, running = parse_metrics(body.decode(errors="replace"), model) if code == 200 else (0.0, 0.0)
    except Unreadable as exc:
        return f"/is_sleeping: {exc}"
    except READ_ERRORS as exc:
        return f"{type(exc).__name__}: {exc}"[:200]
    e.ready, e.sleeping, e.waiting, e.running = True, sleeping, waiting, running
    return None


def listed(routers: list[str], e: Engine, timeout: float) -> bool | None:
    """Whether any router lists `e` among its workers (SMG `GET /workers`); None when none answered."""
    want = e.url.split("://", 1)[-1].rstrip("/")
    answered = False
    for r in routers:
        try:
            code, body = http("GET", r.rstrip("/") + "/workers", timeout=timeout)
            if code != 200:
                continue
            got, why = parse_json(body, MAX_JSON_DEPTH)
        except READ_ERRORS:
            continue
        if why:
            continue
        answered = True
        workers = got.get("workers", []) if isinstance(got, dict) else got
        if not isinstance(workers, list):
            workers = []
        if any(str(w.get("url", "")).split("://", 1)[-1].rstrip("/") == want for w in workers if isinstance(w, dict)):
            return True
    return False if answered else None


def held_requests(url: str | None, timeout: float) -> tuple[int, str | None]:
    """(requests a front queue holds, None) (warmstart/podside/front_queue.py, `GET
    /warmstart/held`, `{"held": H, ...}`), or (0, why) when it cannot be read: only a JSON integer
    of zero or more is a count. (0, None) without a front queue."""
    if not url:
        return 0, None
    try:
        code, body = http("GET", url.rstrip("/") + "/warmstart/held", timeout=timeout)
        if code != 200:
            return 0, f"HTTP {code}"
        held = json_object(body).get("held")
    except READ_ERRORS as exc:
        return 0, f"{type(exc).__name__}: {exc}"[:200]
    if isinstance(held, bool) or not isinstance(held, int) or held < 0:
        return 0, f"held is {json.dumps(held)[:40]}, not a count"
    return held, None


# --------------------------------------------------------------------------------------
# Where the engines are


class Kubernetes:
    """The pods of one selector in one namespace, through the in-cluster API (common/kube.py)."""

    def __init__(self, namespace: str, selector: str, port: int, api: InCluster | None = None) -> None:
        self.api = api or InCluster.from_env(timeout=5)
        self.namespace = namespace
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.selector, self.port = selector, port

    def running(self, selector: str) -> list[tuple[str, str]]:
        """(name, IP) of every running pod of `selector` not being deleted. A pod entry without
        them is skipped; a list that is not one raises ApiError."""
        q = urllib.parse.urlencode({"labelSelector": selector, "fieldSelector": "status.phase=Running"})
        items = self.api.object("GET", f"{self.path}?{q}").get("items")
        if not isinstance(items, list):
            raise ValueError("the pod list has no list of items")
        out = []
        for p in items:
            meta, status = (p.get("metadata"), p.get("status")) if isinstance(p, dict) else (None, None)
            if not isinstance(meta, dict) or not isinstance(status, dict) or meta.get("deletionTimestamp"):
                continue
            name, ip = meta.get("name"), status.get("podIP")
            if isinstance(name, str) and name and isinstance(ip, str) and ip:
                out.append((name, ip))
        return sorted(out)

    def engines(self) -> list[tuple[str, str]]:
        """(pod name, engine URL) of every running pod not being deleted."""
        return [(name, f"http://{ip}:{self.port}") for name, ip in self.running(self.selector)]

    def front_queues(self, selector: str, port: int) -> list[str]:
        """The front-queue URLs of the router pods `selector` matches."""
        return [f"http://{ip}:{port}" for _, ip in self.running(selector)]

    labels = True
    """Relabelling a pod takes it out of the routers' discovery."""

    def patch(self, pod: str, body: dict) -> None:
        status, _ = self.api.request("PATCH", f"{self.path}/{pod}", body, MERGE_PATCH)
        if not 200 <= status < 300:
            raise OSError(f"PATCH pod {pod}: HTTP {status}")

    def set_cost(self, pod: str, cost: str) -> None:
        self.patch(pod, {"metadata": {"annotations": {DELETION_COST: cost}}})

    def set_label(self, pod: str, value: str) -> None:
        # The same `patch pods` the deletion cost uses; nothing broader.
        self.patch(pod, {"metadata": {"labels": {ENGINE_LABEL: value}}})

    def raise_replicas(self, deployment: str, want: int) -> tuple[int, int] | None:
        """Raise `deployment`'s replicas to `want` through its scale subresource (never lower
        them): (before, after), or None when they were already there (`scale`)."""
        return self.scale(deployment, want, lower=False)

    def scale(self, deployment: str, want: int, *, lower: bool) -> tuple[int, int] | None:
        """`deployment`'s replicas to `want` through its scale subresource, down too only with
        `lower`: (before, after), or None when nothing was to change. The patch carries the
        resourceVersion read, so a write of the HPA's in between fails it (409) rather than being
        overwritten (https://kubernetes.io/docs/reference/using-api/api-concepts/#conflicts).
        Raises OSError or ValueError when the API refused."""
        path = f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{deployment}/scale"
        scale = self.api.object("GET", path)
        meta, spec = scale.get("metadata"), scale.get("spec")
        have = spec.get("replicas", 0) if isinstance(spec, dict) else None
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if isinstance(have, bool) or not isinstance(have, int) or not isinstance(version, str):
            raise ValueError(f"GET {path}: not a Scale with spec.replicas and a resourceVersion")
        if have == want or (have > want and not lower):
            return None
        status, _ = self.api.request("PATCH", path, {"metadata": {"resourceVersion": version},
                                                     "spec": {"replicas": want}}, MERGE_PATCH)
        if not 200 <= status < 300:
            raise OSError(f"PATCH {path}: HTTP {status}")
        return have, want


class Static:
    """Engines by URL (tests, benchmarks). With `labels_file`, the routing label of each (its URL
    standing for its pod) is written there as JSON, `{url: "awake" | "asleep"}`, replaced whole
    on every change: what a stand-in for SMG's label-selected pod watch reads. With `costs_file`,
    each pod's deletion cost the same way, `{url: "-100"}` (the bench's ReplicaSet reads it). With
    `scale_file`, the Deployment's replicas stand there as JSON `{"replicas": n}` (the bench's
    ReplicaSet reads and writes it), standing in for the scale subresource. With `pods_file`, only
    the URLs of its JSON list are engines (the bench's ReplicaSet writes the pods it has there),
    standing in for the pod list: an engine not created yet is no pod, not a pod loading."""

    def __init__(self, urls: list[str], labels_file: str = "", scale_file: str = "", costs_file: str = "",
                 pods_file: str = "") -> None:
        self.urls, self.labels_file, self.scale_file, self.costs_file = urls, labels_file, scale_file, costs_file
        self.pods_file = pods_file
        self.labels = bool(labels_file)
        self._written = _read_map(labels_file)
        self._costs = _read_map(costs_file)

    def engines(self) -> list[tuple[str, str]]:
        if self.pods_file:
            with open(self.pods_file) as f:
                pods = json.load(f)
            if not isinstance(pods, list):
                raise ValueError(f"{self.pods_file}: not a JSON list of engine URLs")
            return [(u, u) for u in self.urls if u in pods]
        return [(u, u) for u in self.urls]

    def set_cost(self, pod: str, cost: str) -> None:
        if self.costs_file:
            self._costs[pod] = cost
            _write_map(self.costs_file, self._costs)

    def set_label(self, pod: str, value: str) -> None:
        if not self.labels_file:
            return
        self._written[pod] = value
        _write_map(self.labels_file, self._written)

    def raise_replicas(self, deployment: str, want: int) -> tuple[int, int] | None:
        if not self.scale_file:
            return None
        with open(self.scale_file) as f:
            have = int(json.load(f)["replicas"])
        if have >= want:
            return None
        tmp = f"{self.scale_file}.actuator.tmp"
        with open(tmp, "w") as f:
            json.dump({"replicas": want}, f)
        os.replace(tmp, self.scale_file)
        return have, want


def _read_map(path: str) -> dict[str, str]:
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return {str(k): str(v) for k, v in json.load(f).items()}


def _write_map(path: str, doc: dict[str, str]) -> None:
    """Replace `path` whole (a reader never sees half a file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, sort_keys=True)
    os.replace(tmp, path)
