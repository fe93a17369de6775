"""checkov's Kubernetes checks, run offline over a folder of manifests, and the justified
exceptions (docs/security-exceptions.yaml) a failed check must match."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support import tools

ROOT = Path(__file__).resolve().parent.parent.parent
EXCEPTIONS_FILE = ROOT / "docs" / "security-exceptions.yaml"
CHECKOV_VERSION = tools.CHECKOV_VERSION
SCAN_TIMEOUT_S = 300


def checkov_executable() -> Path:
    """The pinned checkov, from the tools cache (tests/support/tools.py); skips when it is missing."""
    return tools.require("checkov")


def run_checkov(directory: Path) -> dict[str, Any]:
    """checkov's JSON report of the Kubernetes manifests in `directory`, offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BC_", "PRISMA_"))}
    env["CKV_SKIP_PACKAGE_UPDATE_CHECK"] = "true"
    proc = subprocess.run(
        [str(checkov_executable()), "-d", str(directory), "--framework", "kubernetes", "-o", "json",
         "--skip-download"],
        capture_output=True, text=True, timeout=SCAN_TIMEOUT_S, env=env, cwd=directory)
    # Exit 1 means "some check failed"; anything else, or no JSON, is the scanner failing.
    assert proc.returncode in (0, 1), f"checkov exited {proc.returncode}: {proc.stderr[-4000:]}"
    report = json.loads(proc.stdout)
    assert isinstance(report, dict) and report.get("check_type") == "kubernetes", proc.stdout[:2000]
    return report


def load_exceptions() -> list[dict[str, Any]]:
    doc = yaml.safe_load(EXCEPTIONS_FILE.read_text())
    assert doc["checkov_version"] == CHECKOV_VERSION, "the exceptions were judged against another checkov"
    return doc["exceptions"]


def justified(check_id: str, resource: str, exceptions: list[dict[str, Any]]) -> dict[str, Any] | None:
    for e in exceptions:
        if e["check"] == check_id and any(fnmatch.fnmatchcase(resource, p) for p in e["objects"]):
            return e
    return None
