"""The front queue as its pod runs it: the built artifact (`front_queue.pyz`, which carries the
pinned h11: warmstart/manifests/pod_scripts.py), started as `python3 <artifact>` with nothing of
this environment's site-packages (`-I -S`), so the tests prove the zip alone is enough."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import time

from tests.podside.servers import free_ports
from tests.support.pod_scripts import artifact
from warmstart.podside import front_queue


def interpreter() -> list[str]:
    """The command that runs the script as the pod does, before its arguments."""
    return [sys.executable, "-I", "-S", str(artifact("front_queue.pyz"))]


class FrontQueue:
    """The front queue started as its pod runs it (`interpreter()`), on a free port of 127.0.0.1,
    in front of `upstream`; `stop()` sends SIGTERM, as the kubelet does, and waits."""

    def __init__(self, upstream: str, ready_url: str, *args: str, stderr: int = subprocess.DEVNULL) -> None:
        for _ in range(3):  # a free port can be taken between the pick and the bind
            (self.port,) = free_ports(1)
            self.url = f"http://127.0.0.1:{self.port}"
            self.proc = subprocess.Popen(
                [*interpreter(), "--host", "127.0.0.1", "--port", str(self.port),
                 "--upstream", upstream, "--ready-url", ready_url, *args],
                stdout=subprocess.DEVNULL, stderr=stderr, env={"PATH": "/usr/bin:/bin"})
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    self.held()
                    return
                except OSError:
                    time.sleep(0.1)
            self.stop()
        raise RuntimeError("the front queue did not start")

    def held(self) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", front_queue.HELD_PATH)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
