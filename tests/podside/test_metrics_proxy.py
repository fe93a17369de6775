"""The vLLM pod's metrics-only port (warmstart/podside/metrics_proxy.py), run as the pod runs it:
the file, with the interpreter in isolated mode and no site-packages (standard library only), in
front of a real fake vLLM replica (tests/routing/fake_vllm.py) on 127.0.0.1."""

from __future__ import annotations

import base64
import http.client
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from warmstart.podside import metrics_proxy
from tests.podside.servers import FakeS3, free_ports
from tests.routing.fake_vllm import FakeVllm
from tests.support.pod_scripts import artifact

pytestmark = pytest.mark.servers  # a fake vLLM and the metrics proxy script

SCRIPT = artifact("metrics_proxy.pyz")
MARGIN_S = 2.0  # scheduling slack on a loaded machine


class Proxy:
    """One metrics_proxy.py process on a checked-free 127.0.0.1 port; stopped by pid."""

    def __init__(self, upstream: str, *args: str):
        for _ in range(3):  # a port taken between choosing and binding: the script exits, try another
            (self.port,) = free_ports(1)
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(SCRIPT), "--host", "127.0.0.1", "--port", str(self.port),
                 "--upstream", upstream, *args],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env={"PATH": "/usr/bin:/bin"})
            if self._wait_ready(15.0):
                return
            self.stop()
        raise RuntimeError(f"metrics proxy did not start: {self.stderr}")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if self.request("GET", "/healthz", timeout=1)[0] == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def request(self, method: str, path: str, headers: dict | None = None, body: bytes | None = None,
                timeout: float = 10) -> tuple[int, str, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.getheader("Content-Type") or "", r.read()
        finally:
            conn.close()

    def stop(self) -> int:
        """Kill it (by its pid, through its Popen) if still running; its stderr is then `stderr`."""
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait(timeout=10)
        if self.proc.stderr and not self.proc.stderr.closed:
            self.stderr = self.proc.stderr.read()
            self.proc.stderr.close()
        if self.proc.stdout:
            self.proc.stdout.close()
        return code


@pytest.fixture
def backend() -> Iterator[FakeVllm]:
    with FakeVllm("m1") as b:
        yield b


@pytest.fixture
def proxy_for() -> Iterator:
    started: list[Proxy] = []

    def start(upstream: str, *args: str) -> Proxy:
        started.append(Proxy(upstream, *args))
        return started[-1]

    yield start
    for p in started:
        p.stop()


def _upstream_paths(backend: FakeVllm) -> dict[str, int]:
    return {k: v for k, v in backend.stats()["paths"].items() if k not in ("/health", "/fake/stats")}


def test_metrics_pass_through_with_the_negotiated_content_type(backend, proxy_for):
    proxy = proxy_for(f"{backend.url}/metrics")
    code, ctype, body = proxy.request("GET", "/metrics?name[]=ignored")
    assert code == 200 and ctype == "text/plain; version=0.0.4"
    assert b'vllm:num_requests_running{model_name="fake-model"}' in body and b"# EOF" not in body
    om = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    code, ctype, body = proxy.request("GET", "/metrics", headers={"Accept": om})
    assert code == 200 and ctype.startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    assert _upstream_paths(backend) == {"/metrics": 2}
    assert proxy.request("GET", "/healthz")[0] == 200
    assert _upstream_paths(backend) == {"/metrics": 2}  # its own probe never calls vLLM


@pytest.mark.parametrize("method,path,expected", [
    ("GET", "/v1/models", 404), ("POST", "/v1/completions", 404), ("GET", "/health", 404),
    ("GET", "/", 404), ("GET", "/metrics/../v1/models", 404), ("POST", "/metrics", 405), ("HEAD", "/metrics", 405),
    ("PUT", "/metrics", 405), ("DELETE", "/metrics", 405), ("BREW", "/metrics", 405), ("OPTIONS", "*", 404),
])
def test_only_get_metrics_reaches_vllm(backend, proxy_for, method, path, expected):
    proxy = proxy_for(f"{backend.url}/metrics")
    body = b'{"model": "fake-model", "prompt": "hi"}' if method in ("POST", "PUT") else None
    code, _, _ = proxy.request(method, path, body=body, headers={"Content-Type": "application/json"})
    assert code == expected
    assert proxy.request("GET", "/healthz")[0] == 200  # still serving after it
    assert _upstream_paths(backend) == {}
    proxy.stop()
    assert proxy.stderr == ""  # no log line for a request


def test_an_upstream_that_is_down_is_a_fast_502(proxy_for):
    (port,) = free_ports(1)  # nothing listens there
    proxy = proxy_for(f"http://127.0.0.1:{port}/metrics", "--timeout", "10")
    start = time.monotonic()
    code, ctype, body = proxy.request("GET", "/metrics")
    assert code == 502 and ctype.startswith("text/plain") and b"unreachable" in body
    assert time.monotonic() - start < MARGIN_S  # refused at once, not the 10 s deadline
    assert proxy.request("GET", "/healthz")[0] == 200
    proxy.stop()
    assert proxy.stderr.count("\n") == 1 and "502" in proxy.stderr  # one line per error


def test_an_upstream_that_stalls_is_a_504_within_the_deadline(backend, proxy_for):
    proxy = proxy_for(f"{backend.url}/metrics", "--timeout", "1")
    backend.pause()  # SIGSTOP: the kernel still accepts the connection, nothing answers
    try:
        start = time.monotonic()
        code, _, body = proxy.request("GET", "/metrics")
        elapsed = time.monotonic() - start
    finally:
        backend.resume()
    assert code == 504 and b"within 1 s" in body
    assert 0.9 <= elapsed < 1 + MARGIN_S
    assert proxy.request("GET", "/metrics")[0] == 200  # and recovers with its upstream


def test_an_upstream_that_trickles_is_cut_at_the_deadline_not_per_read(proxy_for):
    # One byte every 50 ms, 200 bytes: every read is well inside the 1 s timeout, the whole is not.
    with FakeS3("trickle", body=b"x" * 200, byte_interval_s=0.05) as slow:
        proxy = proxy_for(f"{slow.endpoint}/metrics", "--timeout", "1")
        start = time.monotonic()
        code, _, _ = proxy.request("GET", "/metrics")
        elapsed = time.monotonic() - start
    assert code == 504 and 0.9 <= elapsed < 1 + MARGIN_S


def test_an_oversized_upstream_is_a_502(backend, proxy_for):
    proxy = proxy_for(f"{backend.url}/metrics", "--max-bytes", "64")  # the fake's page is ~300 bytes
    code, _, body = proxy.request("GET", "/metrics")
    assert code == 502 and b"exceeds 64" in body
    assert proxy.request("GET", "/healthz")[0] == 200


def test_sigterm_exits_0_within_a_second_even_mid_fetch(backend, proxy_for):
    proxy = proxy_for(f"{backend.url}/metrics", "--timeout", "30")
    backend.pause()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
    try:
        conn.request("GET", "/metrics")  # held: its upstream is stopped
        # The fetch is in flight once the (stopped) backend's kernel has the connection; poll for it.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not _established_to(backend.port):
            time.sleep(0.02)
        start = time.monotonic()
        proxy.proc.send_signal(signal.SIGTERM)
        assert proxy.proc.wait(timeout=2) == 0
        assert time.monotonic() - start < 2
    finally:
        conn.close()
        backend.resume()


def _established_to(port: int) -> bool:
    """Whether some TCP connection to 127.0.0.1:`port` is established (/proc/net/tcp, Linux)."""
    try:
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return True  # cannot tell: the bound on the exit is asserted regardless
    return any(r.split()[2].endswith(f":{port:04X}") and r.split()[3] == "01" for r in rows)


def test_bad_arguments_are_refused():
    run = subprocess.run([sys.executable, "-I", "-S", str(SCRIPT), "--port", "1", "--upstream", "ftp://x/metrics"],
                         capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 2 and "--upstream must be an http:// URL" in run.stderr


# --------------------------------------------------------------------------------------
# The pod wiring (warmstart/manifests/metrics_proxy.py)


def test_the_sidecar_validates_in_a_pod_and_mounts_its_script():
    import kubernetes_validate

    from warmstart.manifests import metrics_proxy as wiring
    from warmstart.manifests import pod_scripts
    from warmstart.versions import DEFAULT_KUBERNETES_VERSION

    extras = wiring.metrics_proxy_extras("registry.example/vllm/vllm-openai:v1", "m1-metrics-proxy")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "inference"},
           "spec": {"initContainers": list(extras.init_containers),
                    "containers": [{"name": "vllm", "image": "registry.example/vllm/vllm-openai:v1"}],
                    "volumes": list(extras.volumes)}}
    kubernetes_validate.validate(pod, DEFAULT_KUBERNETES_VERSION, strict=True)
    (c,) = extras.init_containers
    assert c["restartPolicy"] == "Always"
    assert c["ports"] == [{"name": "metrics", "containerPort": 8001, "protocol": "TCP"}]
    # Restarted when stuck, and never the reason the serving pod leaves its Service.
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"} and "readinessProbe" not in c
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["resources"] == {"requests": {"cpu": "10m", "memory": "32Mi"},
                              "limits": {"cpu": "200m", "memory": "128Mi"}}
    (mount,) = c["volumeMounts"]
    (volume,) = extras.volumes
    assert mount["readOnly"] and mount["name"] == volume["name"] and volume["configMap"] == {"name": "m1-metrics-proxy"}
    assert c["command"][:2] == ["python3", f"{mount['mountPath']}/{wiring.SCRIPT_KEY}"]
    assert c["command"][c["command"].index("--upstream") + 1] == "http://127.0.0.1:8000/metrics"
    cm = pod_scripts.config_map_spec(wiring.CONFIGMAP_NAME, "inference", wiring.SCRIPT_KEY)
    assert cm["binaryData"] == {"metrics_proxy.pyz": base64.b64encode(SCRIPT.read_bytes()).decode()}
    assert extras.pod_annotations == {wiring.SCRIPT_ANNOTATION: pod_scripts.script_digest(wiring.SCRIPT_KEY)}
    with pytest.raises(ValueError, match="DNS label"):
        wiring.metrics_proxy_container("img", "Not_A.Label")
