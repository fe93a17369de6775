"""Loading the recorded fixtures: Pod, Events, NodeClaim, Node JSON and container logs per case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures"
CASES = ("cold-new-node", "warm-node", "automode-new-node")


def load(case: str) -> dict[str, Any]:
    d = FIXTURES / case

    def j(name: str) -> Any:
        p = d / f"{name}.json"
        return json.loads(p.read_text()) if p.exists() else None

    return {"pod": j("pod"), "events": j("events"), "nodeclaim": j("nodeclaim"), "node": j("node"),
            "logs": {p.stem: p.read_text() for p in sorted((d / "logs").glob("*.log"))}}


def parse(case: str, **changes: Any):
    from warmstart.coldstart.parser import parse_pod_start

    f = load(case) | changes
    return parse_pod_start(f["pod"], f["events"], f["nodeclaim"], f["node"], f["logs"])
