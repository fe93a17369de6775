"""A stand-in Kubernetes API server on 127.0.0.1 for the drill: the REST paths it sends, with the
API's documented behaviour, every request checked against the OpenAPI schema and an RBAC rule set.

Behaviour, from the API reference (https://kubernetes.io/docs/reference/using-api/api-concepts/):
- paths `/api/v1[/namespaces/NS]/RES[/NAME[/SUB]]` and `/apis/GROUP/VERSION[/namespaces/NS]/RES[/NAME[/SUB]]`;
  verbs get (a name), list (no name; `labelSelector` `k=v` and `k` terms ANDed), create (POST, a
  `generateName` completed with five characters), patch (`application/merge-patch+json`, RFC 7386:
  null deletes a key), delete (a Job's pods with it, as the garbage collector does for
  `propagationPolicy: Background`);
- `metadata.uid`, `resourceVersion` (one counter), `creationTimestamp` (RFC 3339, whole seconds);
- `deployments/NAME/scale`: an `autoscaling/v1` Scale read from and written to the Deployment's
  `spec.replicas`;
- `pods/NAME/eviction`: a `policy/v1` Eviction deletes the pod unless a PodDisruptionBudget
  (`policy/v1`, put in the store by the test) whose selector matches the pod allows no disruption
  now: then `429 Too Many Requests` and the pod stays, as the Eviction API documents
  (https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/). Allowed disruptions:
  healthy (Ready) matching pods minus `minAvailable`, or minus (matching pods - `maxUnavailable`)
  (https://kubernetes.io/docs/tasks/run-application/configure-pdb/), integers only here;
- `pods/NAME/log?container=C&timestamps=true`: the container's lines, each prefixed by its
  RFC 3339 time with nanoseconds, as the kubelet serves them;
- 404 for a missing object, 409 for a name taken, 403 for a request outside the caller's rules,
  422 for an object the schema refuses.

Checks: each request's identity (its bearer token) maps to an RBAC rule set ((apiGroup, resource,
verbs), the shape of warmstart/drill/manifests.py); a request outside it is answered 403 and kept
in `denied`. Each object created, and each object as a patch leaves it, is validated with
kubernetes-validate (strict: unknown fields refused) for the stack's Kubernetes version; a
refusal is answered 422 and kept in `invalid`. `requests` keeps (identity, verb, resource, path).

The cluster's controllers are not here (tests/support/cluster_model.py): this is only the API.
"""

from __future__ import annotations

import copy
import http.server
import json
import re
import secrets
import threading
import time
import urllib.parse
from datetime import datetime, timezone
from typing import Any, Iterable

import kubernetes_validate

from tests.support.loopback import LoopbackServer

Rules = Iterable[tuple[str, str, Iterable[str]]]
DELETE_OPTIONS_FIELDS = {"apiVersion", "kind", "propagationPolicy", "gracePeriodSeconds", "dryRun",
                         "orphanDependents", "preconditions"}
_PATH = re.compile(r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                   r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$")
KINDS = {"pods": "Pod", "nodes": "Node", "events": "Event", "serviceaccounts": "ServiceAccount",
         "deployments": "Deployment", "jobs": "Job", "networkpolicies": "NetworkPolicy", "roles": "Role",
         "rolebindings": "RoleBinding", "clusterroles": "ClusterRole", "clusterrolebindings": "ClusterRoleBinding",
         "poddisruptionbudgets": "PodDisruptionBudget"}


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (selector or "").split(",")):
        if "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.rstrip("=")) != v.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


class KubeApi(LoopbackServer):
    """The API and its store. `identities`: token -> rule set; `version`: for the schemas."""

    def __init__(self, identities: dict[str, Rules], version: str) -> None:
        self.identities = {t: [(g, r, set(v)) for g, r, v in rules] for t, rules in identities.items()}
        self.version = version
        self.lock = threading.RLock()
        self.store: dict[tuple[str, str, str], dict[str, Any]] = {}  # (resource, namespace or "", name)
        self.logs: dict[tuple[str, str, str], list[str]] = {}  # (namespace, pod, container) -> lines
        self.rv = 0
        self.requests: list[tuple[str, str, str, str]] = []
        self.denied: list[tuple[str, str, str, str]] = []
        self.invalid: list[tuple[str, str]] = []
        self.evicted: list[tuple[str, str]] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def _answer(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) and ctype != "application/json" else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
                code, body, ctype = api.handle(self.command, self.path, raw, token, self.headers.get("Content-Type") or "")
                self._answer(code, body, ctype)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _any  # noqa: N815

        self._serve(Handler)

    # -- the store, for the cluster model (no HTTP, no checks: the controllers' own identity)

    def put(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            meta = obj.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
            meta.setdefault("uid", secrets.token_hex(16))
            meta.setdefault("creationTimestamp", now_rfc3339())
            self.rv += 1
            meta["resourceVersion"] = str(self.rv)
            self.store[(resource, meta.get("namespace", ""), meta["name"])] = obj
            return obj

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.store.get((resource, namespace, name))

    def items(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [o for (r, ns, _), o in sorted(self.store.items(), key=lambda kv: kv[0])
                    if r == resource and (namespace is None or ns == namespace)]

    def remove(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.store.pop((resource, namespace, name), None)

    def append_log(self, namespace: str, pod: str, container: str, line: str) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
        with self.lock:
            self.logs.setdefault((namespace, pod, container), []).append(f"{stamp} {line.rstrip()}")

    # -- the API

    def _allowed(self, token: str, verb: str, group: str, resource: str) -> bool:
        rules = self.identities.get(token)
        return rules is not None and any(g == group and r == resource and verb in v for g, r, v in rules)

    def _validate(self, obj: dict[str, Any], what: str) -> str | None:
        try:
            kubernetes_validate.validate(obj, self.version, strict=True)
        except Exception as exc:  # the validator's own error types
            self.invalid.append((what, str(exc)[:400]))
            return str(exc)[:400]
        return None

    def handle(self, method: str, raw_path: str, raw: bytes, token: str, ctype: str) -> tuple[int, Any, str]:
        u = urllib.parse.urlsplit(raw_path)
        q = dict(urllib.parse.parse_qsl(u.query))
        m = _PATH.match(u.path)
        if not m:
            return 404, {"kind": "Status", "code": 404, "message": f"no route {u.path}"}, "application/json"
        group = "" if m["core"] else m["group"]
        res, ns, name, sub = m["res"], m["ns"] or "", m["name"], m["sub"]
        verb = {"GET": "get" if name else ("watch" if q.get("watch") in ("1", "true") else "list"),
                "POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}[method]
        resource = f"{res}/{sub}" if sub else res
        with self.lock:
            self.requests.append((token, verb, resource, u.path))
        if not self._allowed(token, verb, group, resource):
            with self.lock:
                self.denied.append((token, verb, resource, u.path))
            return 403, {"kind": "Status", "code": 403, "message": f"{verb} {resource} forbidden"}, "application/json"
        body = json.loads(raw) if raw else None
        with self.lock:
            return self._act(verb, res, ns, name, sub, q, body, ctype)

    def _status(self, code: int, message: str) -> tuple[int, Any, str]:
        return code, {"kind": "Status", "apiVersion": "v1", "code": code, "message": message}, "application/json"

    def _act(self, verb: str, res: str, ns: str, name: str | None, sub: str | None, q: dict[str, str], body: Any,
             ctype: str) -> tuple[int, Any, str]:
        if verb in ("list", "watch"):
            items = [o for o in self.items(res, ns if ns else None)
                     if matches(o["metadata"].get("labels") or {}, q.get("labelSelector", ""))]
            fs = q.get("fieldSelector", "")
            if fs.startswith("involvedObject.uid="):
                items = [o for o in items if (o.get("involvedObject") or {}).get("uid") == fs.split("=", 1)[1]]
            return 200, {"kind": KINDS.get(res, "") + "List", "apiVersion": "v1",
                         "metadata": {"resourceVersion": str(self.rv)}, "items": copy.deepcopy(items)}, "application/json"
        if verb == "create" and not name:
            if not isinstance(body, dict) or body.get("kind") != KINDS.get(res):
                return self._status(400, f"a {KINDS.get(res)} was expected")
            err = self._validate(body, f"create {res}")
            if err:
                return self._status(422, err)
            meta = body.setdefault("metadata", {})
            if ns:
                if meta.get("namespace", ns) != ns:
                    return self._status(400, "the namespace of the object does not match the path")
                meta["namespace"] = ns
            if meta.get("name") and self.get(res, ns, meta["name"]) is not None:
                return self._status(409, f"{res} {meta['name']} already exists")
            if res == "pods":  # a new pod is Pending until scheduled and started
                body["status"] = {"phase": "Pending"}
            return 201, copy.deepcopy(self.put(res, body)), "application/json"
        obj = self.get(res, ns, name or "")
        if obj is None:
            return self._status(404, f"{res} {name} not found")
        if sub == "log" and verb == "get":
            lines = self.logs.get((ns, name, q.get("container", "")), [])
            text = "\n".join(lines) + ("\n" if lines else "")
            if q.get("timestamps") not in ("true", "1"):
                text = "\n".join(l.split(" ", 1)[1] for l in lines)
            return 200, text[: int(q.get("limitBytes") or len(text) or 1)], "text/plain"
        if sub == "eviction" and verb == "create":
            if not isinstance(body, dict) or body.get("kind") != "Eviction":
                return self._status(400, "an Eviction was expected")
            err = self._validate(body, "create pods/eviction")
            if err:
                return self._status(422, err)
            blocking = self._budget_refuses(ns, obj)
            if blocking:
                return 429, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429,
                             "reason": "TooManyRequests",
                             "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                             "details": {"causes": [{"reason": "DisruptionBudget",
                                                     "message": f"The disruption budget {blocking} is exhausted"}]}
                             }, "application/json"
            self.evicted.append((ns, name or ""))
            self.remove("pods", ns, name or "")
            return 201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}, "application/json"
        if sub == "scale":
            scale = {"apiVersion": "autoscaling/v1", "kind": "Scale",
                     "metadata": {"name": name, "namespace": ns, "uid": obj["metadata"]["uid"],
                                  "resourceVersion": obj["metadata"]["resourceVersion"]},
                     "spec": {"replicas": obj["spec"].get("replicas", 1)},
                     "status": {"replicas": obj.get("status", {}).get("replicas", 0)}}
            if verb == "get":
                return 200, scale, "application/json"
            if verb == "patch":
                if ctype.split(";")[0].strip() != "application/merge-patch+json":
                    return self._status(415, f"patch content type {ctype} is not handled here")
                new = merge_patch(scale, body)
                err = self._validate(new, "patch deployments/scale")
                if err:
                    return self._status(422, err)
                obj["spec"]["replicas"] = new["spec"]["replicas"]
                self.put(res, obj)
                return 200, new, "application/json"
        if sub:
            return self._status(404, f"subresource {sub} not served here")
        if verb == "get":
            return 200, copy.deepcopy(obj), "application/json"
        if verb == "patch":
            if ctype.split(";")[0].strip() != "application/merge-patch+json":
                return self._status(415, f"patch content type {ctype} is not handled here")
            new = merge_patch(obj, body)
            err = self._validate(new, f"patch {res}")
            if err:
                return self._status(422, err)
            self.put(res, new)
            return 200, copy.deepcopy(new), "application/json"
        if verb == "delete":
            if body is not None and (not isinstance(body, dict) or set(body) - DELETE_OPTIONS_FIELDS):
                self.invalid.append(("delete options", json.dumps(body)[:200]))
                return self._status(400, "not a DeleteOptions")
            gone = self.remove(res, ns, name or "")
            if res == "jobs":  # the garbage collector removes the Job's pods (Background propagation)
                for p in self.items("pods", ns):
                    if (p["metadata"].get("labels") or {}).get("job-name") == name:
                        self.remove("pods", ns, p["metadata"]["name"])
            return 200, copy.deepcopy(gone), "application/json"
        return self._status(405, f"{verb} not served here")

    def _budget_refuses(self, ns: str, pod: dict[str, Any]) -> str | None:
        """The name of a PodDisruptionBudget that allows no disruption of `pod` now, if any."""
        labels = pod["metadata"].get("labels") or {}
        for pdb in self.items("poddisruptionbudgets", ns):
            want = (pdb["spec"].get("selector") or {}).get("matchLabels") or {}
            if not want or any(labels.get(k) != v for k, v in want.items()):
                continue
            matching = [p for p in self.items("pods", ns)
                        if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())]
            healthy = sum(1 for p in matching if any(c.get("type") == "Ready" and c.get("status") == "True"
                                                     for c in (p.get("status") or {}).get("conditions") or []))
            spec = pdb["spec"]
            if "minAvailable" in spec:
                allowed = healthy - int(spec["minAvailable"])
            else:
                allowed = healthy - (len(matching) - int(spec.get("maxUnavailable", 1)))
            if allowed < 1:
                return pdb["metadata"]["name"]
        return None

    def kubeconfig(self, path: str, token: str) -> str:
        """A kubeconfig file for the Kubernetes client pointing here, with `token`."""
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "standin",
               "clusters": [{"name": "standin", "cluster": {"server": self.base_url}}],
               "users": [{"name": "u", "user": {"token": token}}],
               "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "u"}}]}
        with open(path, "w") as f:
            json.dump(doc, f)
        return path


def wait_for(pred: Any, timeout_s: float, step_s: float = 0.1) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step_s)
    return bool(pred())
