"""A rendered container's probes run as the kubelet runs them, against processes on this machine.

The kubelet sends an httpGet probe to the pod's IP, not to its loopback
(https://kubernetes.io/docs/tasks/configure-pod-container/configure-liveness-readiness-startup-probes/#http-probes:
"host: Host name to connect to, defaults to the pod IP"), and runs an exec probe inside the
container. Here the pod's IP is stood in for by another loopback address, POD_IP (127.0.0.2): a
test starts a process whose rendered arguments bind 0.0.0.0 (every address of the pod) on POD_IP
instead, and one that binds 127.0.0.1 (the pod's loopback) as it is; a listener on 127.0.0.1
refuses a connection to 127.0.0.2, as a pod's loopback listener refuses the kubelet.
An exec probe runs its command here, `python3` being this interpreter. `ports` maps the
container's port numbers to those the test's processes listen on (their free ports).
"""

from __future__ import annotations

import http.client
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

POD_IP = "127.0.0.2"


def _port(container: Mapping[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    # A named port resolves on the container's own ports (the kubelet's FindPort).
    (number,) = [p["containerPort"] for p in container.get("ports", []) if p.get("name") == port]
    return number


def run_probe(container: Mapping[str, Any], kind: str, ports: Mapping[int, int] | None = None,
              rewrite: Mapping[str, str] | None = None, pod_ip: str = POD_IP) -> bool:
    """Whether `container`'s `kind` probe ("readinessProbe", "livenessProbe", "startupProbe")
    succeeds once, run as the kubelet runs it. `rewrite`: substrings of an exec command replaced
    (the container's ports in a URL by the test's). `pod_ip`: where an httpGet goes (a stand-in
    process that listens on every address, as the real one does, may be reached on 127.0.0.1)."""
    probe = container[kind]
    ports = ports or {}
    timeout = probe.get("timeoutSeconds", 1)
    if "httpGet" in probe:
        get = probe["httpGet"]
        number = _port(container, get["port"])
        conn = http.client.HTTPConnection(get.get("host", pod_ip), ports.get(number, number), timeout=timeout)
        try:
            conn.request("GET", get.get("path", "/"))
            # "Any code greater than or equal to 200 and less than 400 indicates success."
            return 200 <= conn.getresponse().status < 400
        except OSError:
            return False
        finally:
            conn.close()
    if "exec" in probe:
        command = list(probe["exec"]["command"])
        for old, new in (rewrite or {}).items():
            command = [c.replace(old, new) for c in command]
        if command[0] == "python3":
            command = [sys.executable, "-I", "-S", *command[1:]]
        try:
            # The probe's own timeout, plus slack for an interpreter starting on a loaded test machine.
            return subprocess.run(command, capture_output=True, timeout=timeout + 10).returncode == 0
        except subprocess.TimeoutExpired:
            return False
    raise AssertionError(f"a probe this helper does not run: {sorted(probe)}")
