"""A local stand-in of the Hugging Face Hub's HTTP API, on 127.0.0.1, for the import tests.

It answers what the real `huggingface_hub` client asks when it lists and downloads a pinned
commit (`HF_ENDPOINT` points it here):

    GET  /api/models/<repo>/tree/<revision>[/<path>]   the file listing (RepoFile / RepoFolder)
    GET  /api/models/<repo>/revision/<revision>        repo info (older clients resolve with it)
    HEAD /<repo>/resolve/<revision>/<path>             file metadata: X-Repo-Commit, ETag, size
    GET  /<repo>/resolve/<revision>/<path>             the file, with Range for resumed downloads

and fails the way the Hub fails: 404 with `X-Error-Code: RepoNotFound` or `RevisionNotFound`,
and for a gated repository 401 (no token) or 403 (a token without access) with
`X-Error-Code: GatedRepo` on downloads, while its listing stays public, as on the Hub.
No xet headers are sent, so the client downloads over plain HTTP.

Plain classes (no pytest), like servers.py. The server socket binds port 0, so the port is the
kernel's free one by construction.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import re
import threading
import time
from typing import Any
from urllib.parse import unquote, urlsplit

from tests.support.loopback import LoopbackServer

_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
# Files the Hub keeps in LFS (its ETag is then the content's sha256).
_LFS_SUFFIXES = (".safetensors", ".bin", ".pth", ".model")


@dataclasses.dataclass
class Repo:
    commit: str
    files: dict[str, bytes]
    gated: bool = False
    readers: frozenset[str] = frozenset()
    """Tokens whose account accepted the gated repository's license."""


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubStandIn(LoopbackServer):
    """The Hub for a few repositories; `requests` records (method, path, token) of each request."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        # A download of this path sends half the file, then waits for `release` (bounded).
        self.stall: str | None = None
        self.release = threading.Event()
        self.stalled = threading.Event()
        # path -> how many more downloads of it get one flipped byte (same size, other content).
        self.corrupt: dict[str, int] = {}
        self._lock = threading.Lock()
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                hub._handle(self, body=True)

            def do_HEAD(self) -> None:  # noqa: N802
                hub._handle(self, body=False)

            def log_message(self, *args: object) -> None:
                pass

        self._serve(Handler)

    @property
    def url(self) -> str:
        return self.base_url

    def add(self, repo_id: str, commit: str, files: dict[str, bytes], *, gated: bool = False,
            readers: tuple[str, ...] = ()) -> Repo:
        repo = self.repos[repo_id] = Repo(commit, dict(files), gated, frozenset(readers))
        return repo

    def downloads(self) -> list[str]:
        """Paths of the file downloads (GET .../resolve/...) served so far."""
        return [p for m, p, _ in self.requests if m == "GET" and "/resolve/" in p]

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        super().__exit__(*exc)

    # ---- the API ------------------------------------------------------------------------

    def _send(self, h: http.server.BaseHTTPRequestHandler, status: int, body: bytes = b"", *,
              headers: dict[str, str] | None = None, write: bool = True) -> None:
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if write and body:
            h.wfile.write(body)

    def _error(self, h: http.server.BaseHTTPRequestHandler, status: int, code: str, message: str, write: bool) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(h, status, body, headers={"Content-Type": "application/json", "X-Error-Code": code,
                                             "X-Error-Message": message}, write=write)

    def _handle(self, h: http.server.BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        auth = h.headers.get("Authorization") or ""
        token = auth.removeprefix("Bearer ").strip() or None
        with self._lock:
            self.requests.append((h.command, path, token))
        for pattern, fn in ((_TREE, self._tree), (_INFO, self._info), (_RESOLVE, self._resolve)):
            m = pattern.match(path)
            if m:
                repo = self.repos.get(m["repo"])
                if repo is None:
                    return self._error(h, 404, "RepoNotFound", "Repository not found", body)
                if m["rev"] not in (repo.commit, "main"):
                    return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {m['rev']}", body)
                return fn(h, m, repo, token, body)
        self._error(h, 404, "EntryNotFound", "no such route", body)

    def _entry(self, name: str, data: bytes) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": name}
        if name.endswith(_LFS_SUFFIXES):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def _tree(self, h, m, repo: Repo, token, body: bool) -> None:
        base = (m["path"] or "").strip("/")
        recursive = "recursive=true" in (urlsplit(h.path).query or "").lower() or \
                    "recursive=1" in (urlsplit(h.path).query or "")
        entries, folders = [], set()
        for name, data in sorted(repo.files.items()):
            if base and not name.startswith(base + "/"):
                continue
            rest = name[len(base) + 1:] if base else name
            if "/" in rest and not recursive:
                folder = (f"{base}/" if base else "") + rest.split("/", 1)[0]
                if folder not in folders:
                    folders.add(folder)
                    entries.append({"type": "directory", "oid": git_blob_sha1(folder.encode()), "size": 0,
                                    "path": folder})
                continue
            entries.append(self._entry(name, data))
        self._send(h, 200, json.dumps(entries).encode(), headers={"Content-Type": "application/json"}, write=body)

    def _info(self, h, m, repo: Repo, token, body: bool) -> None:
        info = {"id": m["repo"], "modelId": m["repo"], "sha": repo.commit, "private": False,
                "gated": "manual" if repo.gated else False,
                "siblings": [{"rfilename": n} for n in sorted(repo.files)]}
        self._send(h, 200, json.dumps(info).encode(), headers={"Content-Type": "application/json"}, write=body)

    def _resolve(self, h, m, repo: Repo, token, body: bool) -> None:
        if repo.gated and token not in repo.readers:
            status, why = (401, "You must be authenticated to access it.") if token is None else \
                (403, "Your request to access this repo has not been accepted yet.")
            return self._error(h, status, "GatedRepo", f"Access to model {m['repo']} is restricted. {why}", body)
        data = repo.files.get(m["path"])
        if data is None:
            return self._error(h, 404, "EntryNotFound", f"{m['path']} does not exist", body)
        etag = self._entry(m["path"], data).get("lfs", {}).get("oid") or git_blob_sha1(data)
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        start, status = 0, 200
        rng = _RANGE.match(h.headers.get("Range") or "")
        if rng:
            start = int(rng[1])
            end = int(rng[2]) if rng[2] else len(data) - 1
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start:end + 1], 206
        if not body:
            return self._send(h, status, data, headers=headers, write=False)
        with self._lock:
            flip = self.corrupt.get(m["path"], 0) > 0 and len(data) > 0
            if flip:
                self.corrupt[m["path"]] -= 1
        if flip:
            data = data[:len(data) // 2] + bytes([data[len(data) // 2] ^ 0xFF]) + data[len(data) // 2 + 1:]
        if self.stall == m["path"] and start == 0:
            h.send_response(status)
            for k, v in headers.items():
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            self.stalled.set()
            # Bounded: the test kills the client long before this, and shutdown releases it.
            self.release.wait(timeout=60)
            return
        self._send(h, status, data, headers=headers)


def wait_for(event: threading.Event, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if event.wait(0.05):
            return True
    return False
