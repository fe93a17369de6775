"""The Kubernetes client path against a stand-in API server on 127.0.0.1 that serves the
recorded objects, and the CLI end to end (report, plot, exit codes)."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from pathlib import Path

import pytest
import yaml

from tests.coldstart.cases import CASES, load, parse
from tests.podside.servers import free_ports
from warmstart import cli
from warmstart.coldstart import reader

NS = "inference"


class StandInApi:
    """Serves pods, events (by involvedObject.uid), nodes, nodeclaims and logs of the fixtures."""

    def __init__(self):
        self.cases = {c: load(c) for c in CASES}
        self.requests: list[str] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                api.requests.append(self.path)
                code, body = api.route(self.path)
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def route(self, path: str):
        url = urllib.parse.urlparse(path)
        q = dict(urllib.parse.parse_qsl(url.query))
        parts = url.path.strip("/").split("/")
        pods = {c["pod"]["metadata"]["name"]: c for c in self.cases.values()}
        if url.path == f"/api/v1/namespaces/{NS}/pods":
            items = [c["pod"] for c in self.cases.values()]
            if "labelSelector" in q:
                want = dict(kv.split("=") for kv in q["labelSelector"].split(","))
                items = [p for p in items if want.items() <= p["metadata"]["labels"].items()]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        if parts[:4] == ["api", "v1", "namespaces", NS] and parts[4] == "pods" and len(parts) == 6:
            c = pods.get(parts[5])
            return (200, c["pod"]) if c else (404, {"kind": "Status", "code": 404, "reason": "NotFound"})
        if parts[:4] == ["api", "v1", "namespaces", NS] and parts[4] == "pods" and parts[-1] == "log":
            c = pods.get(parts[5])
            text = c["logs"].get(q.get("container", "")) if c else None
            if text is None:
                return 400, {"kind": "Status", "code": 400, "reason": "BadRequest"}
            assert q.get("timestamps") == "true"
            return 200, text[: int(q.get("limitBytes", 10**9))]
        if url.path == f"/api/v1/namespaces/{NS}/events":
            uid = q["fieldSelector"].split("involvedObject.uid=", 1)[1]
            items = next((c["events"] for c in self.cases.values() if c["pod"]["metadata"]["uid"] == uid), [])
            return 200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items}
        if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
            n = next((c["node"] for c in self.cases.values() if c["node"]["metadata"]["name"] == parts[3]), None)
            return (200, n) if n else (404, {"kind": "Status", "code": 404})
        if parts[:4] == ["apis", "karpenter.sh", "v1", "nodeclaims"]:
            claims = {c["nodeclaim"]["metadata"]["name"]: c["nodeclaim"] for c in self.cases.values()}
            if len(parts) == 4:
                return 200, {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaimList", "items": list(claims.values())}
            return (200, claims[parts[4]]) if parts[4] in claims else (404, {"kind": "Status", "code": 404})
        return 404, {"kind": "Status", "code": 404, "reason": "NotFound"}

    def kubeconfig(self, path: Path) -> Path:
        port = self.httpd.server_address[1]
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
            "users": [{"name": "u", "user": {"token": "not-a-secret"}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "u"}}]}))
        return path

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api():
    with StandInApi() as server:
        yield server


@pytest.mark.parametrize("case", CASES)
def test_client_path_reads_what_the_parser_needs(api, tmp_path, case):
    cluster = reader.connect(str(api.kubeconfig(tmp_path / "kubeconfig")))
    name = api.cases[case]["pod"]["metadata"]["name"]
    got = reader.read_pod_start(cluster, NS, name)
    want = parse(case)
    assert [p.to_json() for p in got.phases] == [p.to_json() for p in want.phases]
    assert got.flags == want.flags
    uid = api.cases[case]["pod"]["metadata"]["uid"]
    assert any(f"involvedObject.uid%3D{uid}" in r or f"involvedObject.uid={uid}" in r for r in api.requests)
    assert all("timestamps=true" in r for r in api.requests if r.split("?")[0].endswith("/log"))


def test_cli_report_and_plot(api, tmp_path, capsys):
    kc = api.kubeconfig(tmp_path / "kubeconfig")
    png = tmp_path / "t.png"
    code = cli.main(["coldstart", "--stack", "dev", "--kubeconfig", str(kc), "--plot", str(png)])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK
    assert out.count("\npod inference/") + out.startswith("pod inference/") == 3
    assert "weights loaded" in out and "predicted" in out
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_json_has_predictions(api, tmp_path, capsys):
    kc = api.kubeconfig(tmp_path / "kubeconfig")
    name = api.cases["warm-node"]["pod"]["metadata"]["name"]
    assert cli.main(["coldstart", "--stack", "dev", "--pod", name, "--kubeconfig", str(kc), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["key"]: r for r in doc[0]["rows"]}
    assert rows["weights"]["predicted_s"] > 0 and rows["weights"]["predicted_basis"].startswith("https://")


def test_cli_without_a_cluster_fails_clearly(tmp_path, capsys):
    (port,) = free_ports(1)
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    assert cli.main(["coldstart", "--stack", "dev", "--kubeconfig", str(kc)]) == cli.EXIT_PREREQUISITES
    err = capsys.readouterr().err
    assert err.startswith("warmstart: ") and "Traceback" not in err
    assert cli.main(["coldstart", "--stack", "dev", "--kubeconfig", str(tmp_path / "none")]) == cli.EXIT_PREREQUISITES
    assert "kubeconfig" in capsys.readouterr().err
    assert cli.main(["bench-loader", "--stack", "dev", "--kubeconfig", str(tmp_path / "none")]) == cli.EXIT_PREREQUISITES
