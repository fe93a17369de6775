"""The standby actuator (warmstart/podside/standby/) as its pod runs it: the built artifact
`standby.pyz`, the interpreter isolated, standard library only, over static engine URLs, bounded
in ticks; its JSON lines collected; stopped by pid. Shared by tests/podside/test_standby_actuator.py
and tests/standby/test_surplus.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from tests.routing.fake_vllm import MODEL
from tests.support.pod_scripts import artifact


class Actuator:
    """One standby.pyz process over static engine URLs, bounded in ticks; its JSON lines
    collected; stopped by pid. Its stderr is discarded (nothing reads it; an unread pipe could
    fill and block the actuator)."""

    def __init__(self, engines: list[str], *args: str, ticks: int = 200) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(artifact("standby.pyz")), "--model", MODEL, "--engines", ",".join(engines),
             "--period", "0.2", "--probe-timeout", "2", "--max-ticks", str(ticks), *args],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={"PATH": "/usr/bin:/bin"})
        self.lines: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                pass

    def events(self, name: str) -> list[dict]:
        return [e for e in list(self.lines) if e.get("event") == name]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._reader.join(timeout=5)
