"""The one in-cluster Kubernetes API client of the pod scripts (standard library only).

A pod reaches the API server at the address the kubelet puts in its environment
(KUBERNETES_SERVICE_HOST/_PORT), authenticates with its service account's token and trusts the
cluster's CA, both mounted at /var/run/secrets/kubernetes.io/serviceaccount
(https://kubernetes.io/docs/tasks/run-application/access-api-from-pod/#without-using-a-proxy).
The token is bound and rotated by the kubelet, so it is read again on every call
(https://kubernetes.io/docs/concepts/security/service-accounts/#bound-service-account-tokens).
`WARMSTART_KUBE_API` and `WARMSTART_SA_DIR` point it elsewhere (the tests' stand-in API server
on 127.0.0.1, over plain HTTP).
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping

from .shared import parse_json

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Most bytes read of one answer: a pod list of a namespace is a few MiB at most; a peer that sends
# more is cut there (the read then fails to parse: the caller's error, never its memory).
MAX_READ_BYTES = 16 << 20
# A pod list nests about ten deep (items[].spec.containers[].env[].valueFrom...).
MAX_JSON_DEPTH = 64
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


class ApiError(OSError):
    """The API server could not be reached, or answered with an error or a body that is not a
    JSON object: one failed call, never the caller's end."""


def api_address(env: Mapping[str, str]) -> str:
    """The API server's base URL: WARMSTART_KUBE_API, else the in-cluster service's (empty
    outside a cluster)."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
    return env.get("WARMSTART_KUBE_API") or (f"https://{host}:{port}" if host else "")


class InCluster:
    """Calls to the API server at `base` with the token and CA of the service account in `sa_dir`."""

    def __init__(self, base: str, sa_dir: str | Path = SA_DIR, timeout: float = 10.0) -> None:
        self.base, self.sa_dir, self.timeout = base.rstrip("/"), Path(sa_dir), timeout
        self._context: ssl.SSLContext | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, timeout: float = 10.0) -> "InCluster":
        env = os.environ if env is None else env
        return cls(api_address(env), env.get("WARMSTART_SA_DIR", SA_DIR), timeout)

    def _ssl(self) -> ssl.SSLContext | None:
        if not self.base.startswith("https://"):
            return None
        if self._context is None:
            self._context = ssl.create_default_context(cafile=str(self.sa_dir / "ca.crt"))
        return self._context

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                timeout: float | None = None) -> tuple[int, bytes]:
        """(status, body read up to MAX_READ_BYTES) of one call. Raises ApiError when the server
        cannot be reached or its answer is not HTTP; an error status is returned, not raised."""
        try:
            token = (self.sa_dir / "token").read_text().strip()
            req = urllib.request.Request(self.base + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {token}", "Content-Type": content_type,
                                                  "Accept": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout if timeout is None else timeout,
                                            context=self._ssl()) as resp:
                    return resp.status, resp.read(MAX_READ_BYTES)
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read(MAX_READ_BYTES)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            if isinstance(exc, ApiError):
                raise
            raise ApiError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc

    def object(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> dict:
        """The JSON object a successful call answers. Raises ApiError otherwise."""
        status, raw = self.request(method, path, body, content_type)
        if not 200 <= status < 300:
            raise ApiError(f"{method} {path}: HTTP {status}")
        doc, why = parse_json(raw, MAX_JSON_DEPTH)
        if why:
            raise ApiError(f"{method} {path}: the answer is {why}")
        if not isinstance(doc, dict):
            raise ApiError(f"{method} {path}: the answer is a JSON {type(doc).__name__}, not an object")
        return doc
