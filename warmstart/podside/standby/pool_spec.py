"""The pool actuator's configuration: `pool.json`, rendered per pool (warmstart/decisions/standby_pool.py)
into a ConfigMap mounted at /etc/warmstart/pool/pool.json. Part of the standby package (pool_mode.py
says what the pool mode does).

    {"pool": "shared-h100", "namespace": "inference",
     "hostSelector": {"warmstart.io/standby-pool": "shared-h100"},
     "hostDeployment": "shared-h100-hosts", "spares": 1, "maxHosts": 4, "supervisorPort": 8090,
     "sleepLevel": 1,
     "members": [{"model": "qwen-7b", "port": 8100, "deployment": "qwen-7b",
                  "selector": {"app.kubernetes.io/instance": "qwen-7b"},
                  "minReplicas": 0, "targetWaiting": 5, "targetRequests": 37, "awakeIdleSeconds": 300,
                  "frontQueue": {"service": "qwen-7b-front", "port": 8081, "selector": {...}}}]}

The file is read bounded and every field checked (a pod trusts nothing it reads); an unknown key is
refused rather than ignored, so a render and an actuator that disagree fail at the pod's start with
the key named, never run on half a configuration. A bad file is one line naming the key and the
rule, and exit code 2.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..common.shared import parse_json, read_regular

MAX_SPEC_BYTES = 1 << 20
MAX_MEMBERS = 16
# A model's name is a DNS label (it names the member's Deployment and sits in the host's
# `/engines/<model>` routes: engine_host/spec.py MODEL_NAME).
MODEL_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
# Kubernetes object names (RFC 1123 subdomain, at most 253) and label keys/values
# (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set).
OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")

TOP_KEYS = {"pool", "namespace", "hostSelector", "hostDeployment", "spares", "maxHosts", "supervisorPort",
            "sleepLevel", "members"}
MEMBER_KEYS = {"model", "port", "deployment", "selector", "minReplicas", "targetWaiting", "targetRequests",
               "awakeIdleSeconds", "frontQueue"}
FRONT_QUEUE_KEYS = {"service", "port", "selector"}


class PoolSpecError(ValueError):
    """A key of pool.json that cannot be run: the message names it, the rule and the fix."""


@dataclass(frozen=True)
class FrontQueue:
    service: str
    port: int
    selector: tuple[tuple[str, str], ...] = ()
    """The router pods that each hold a front queue: their held counts are summed. Without it the
    Service is asked, which answers for one router pod (an undercount with several routers)."""


@dataclass(frozen=True)
class Member:
    model: str
    port: int
    """The member port: its engine's port in its own pods and on every host."""
    deployment: str
    selector: tuple[tuple[str, str], ...]
    min_replicas: int
    target_waiting: float
    target_requests: float
    awake_idle_seconds: float
    front_queue: FrontQueue | None


@dataclass(frozen=True)
class PoolSpec:
    pool: str
    namespace: str
    host_selector: tuple[tuple[str, str], ...]
    host_deployment: str
    spares: int
    max_hosts: int
    supervisor_port: int
    sleep_level: int
    members: tuple[Member, ...]

    def member(self, model: str) -> Member | None:
        return next((m for m in self.members if m.model == model), None)


def selector_text(labels: tuple[tuple[str, str], ...]) -> str:
    """A label selector's query form (`k=v,k2=v2`), as the pods API's `labelSelector` takes it."""
    return ",".join(f"{k}={v}" for k, v in labels)


def _fail(key: str, rule: str, got: object) -> PoolSpecError:
    text = repr(got)
    return PoolSpecError(f"{key} {rule}, got {text[:80]}{'...' if len(text) > 80 else ''}; "
                         "fix the pool's render (warmstart/decisions/standby_pool.py) or the ConfigMap")


def _integer(doc: dict, key: str, where: str, low: int, high: int) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise _fail(f"{where}{key}", f"must be an integer in [{low}, {high}]", v)
    return v


def _number(doc: dict, key: str, where: str, low: float, high: float) -> float:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        raise _fail(f"{where}{key}", f"must be a number in [{low:g}, {high:g}]", v)
    return float(v)


def _name(doc: dict, key: str, where: str, pattern: re.Pattern = OBJECT_NAME) -> str:
    v = doc.get(key)
    if not isinstance(v, str) or not pattern.match(v):
        raise _fail(f"{where}{key}", "must be a Kubernetes name (lower-case letters, digits, '-')", v)
    return v


def _selector(doc: dict, key: str, where: str) -> tuple[tuple[str, str], ...]:
    v = doc.get(key)
    if (not isinstance(v, dict) or not v or not all(isinstance(k, str) and LABEL_KEY.match(k) and isinstance(x, str)
                                                     and LABEL_VALUE.match(x) for k, x in v.items())):
        raise _fail(f"{where}{key}", "must be a non-empty map of label keys to label values", v)
    return tuple(sorted(v.items()))


def _keys(doc: object, allowed: set[str], where: str) -> dict:
    if not isinstance(doc, dict):
        raise _fail(where.rstrip(".") or "pool.json", "must be a JSON object", doc)
    unknown = sorted(set(doc) - allowed)
    if unknown:
        raise PoolSpecError(f"{where}{unknown[0]} is not a pool.json key (known: {', '.join(sorted(allowed))}); "
                            "the render and the actuator disagree: render both from one warmstart version")
    # A front queue's selector is optional (FrontQueue.selector says what its absence costs).
    missing = sorted(k for k in allowed - set(doc) if not (allowed is FRONT_QUEUE_KEYS and k == "selector"))
    if missing:
        raise PoolSpecError(f"{where}{missing[0]} is missing: pool.json must give {', '.join(sorted(allowed))}; "
                             "render both from one warmstart version")
    return doc


def parse(doc: object) -> PoolSpec:
    """The pool's configuration from its JSON document; PoolSpecError names the first bad key."""
    doc = _keys(doc, TOP_KEYS, "")
    raw = doc["members"]
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_MEMBERS:
        raise _fail("members", f"must be a list of 1 to {MAX_MEMBERS} members", raw)
    spares = _integer(doc, "spares", "", 0, 64)
    max_hosts = _integer(doc, "maxHosts", "", 1, 256)
    if max_hosts < spares:
        raise _fail("maxHosts", f"must be at least spares ({spares})", max_hosts)
    members: list[Member] = []
    ports: set[int] = set()
    supervisor_port = _integer(doc, "supervisorPort", "", 1024, 65535)
    for i, m in enumerate(raw):
        where = f"members[{i}]."
        m = _keys(m, MEMBER_KEYS, where)
        model = _name(m, "model", where, MODEL_NAME)
        if any(x.model == model for x in members):
            raise _fail(f"{where}model", "must be unique in the pool", model)
        port = _integer(m, "port", where, 1024, 65535)
        if port in ports or port == supervisor_port:
            raise _fail(f"{where}port", "must be unique in the pool and not the supervisor's port", port)
        ports.add(port)
        fq = m["frontQueue"]
        front = None
        if fq is not None:
            fq = _keys(fq, FRONT_QUEUE_KEYS, f"{where}frontQueue.")
            front = FrontQueue(service=_name(fq, "service", f"{where}frontQueue."),
                               port=_integer(fq, "port", f"{where}frontQueue.", 1, 65535),
                               selector=_selector(fq, "selector", f"{where}frontQueue.") if "selector" in fq else ())
        members.append(Member(
            model=model, port=port, deployment=_name(m, "deployment", where), selector=_selector(m, "selector", where),
            min_replicas=_integer(m, "minReplicas", where, 0, 10_000),
            target_waiting=_number(m, "targetWaiting", where, 0.01, 1e6),
            target_requests=_number(m, "targetRequests", where, 0, 1e6),
            awake_idle_seconds=_number(m, "awakeIdleSeconds", where, 0, 86400), front_queue=front))
    level = doc["sleepLevel"]
    if level not in (1, 2) or isinstance(level, bool):
        raise _fail("sleepLevel", "must be 1 or 2", level)
    return PoolSpec(pool=_name(doc, "pool", ""), namespace=_name(doc, "namespace", ""),
                    host_selector=_selector(doc, "hostSelector", ""), host_deployment=_name(doc, "hostDeployment", ""),
                    spares=spares, max_hosts=max_hosts, supervisor_port=supervisor_port, sleep_level=level,
                    members=tuple(members))


def load(path: str | Path) -> PoolSpec:
    """pool.json at `path`. A ConfigMap's file is a symbolic link into its `..data` folder, which
    the kubelet swaps atomically on an update (kubernetes pkg/volume/util/atomic_writer.go), so the
    path is resolved first and the file it names read without following a link."""
    real = Path(os.path.realpath(path))
    raw = read_regular(real, MAX_SPEC_BYTES)
    if isinstance(raw, str):
        raise PoolSpecError(f"--pool-spec {path}: {raw}; mount the pool's ConfigMap there")
    doc, why = parse_json(raw, max_depth=8)
    if why is not None:
        raise PoolSpecError(f"--pool-spec {path}: {why}")
    return parse(doc)
