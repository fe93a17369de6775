"""The security scan: checkov's Kubernetes checks over `warmstart render` of every stack in stacks/.

Every failed check must be one that docs/security-exceptions.yaml justifies, for the objects it
names; every justified exception must still fail somewhere (a fixed one is removed from the
list); docs/security.md explains each. checkov runs offline (`--skip-download`, no update check).

checkov (its pinned version: tests/support/tools.py) is installed before pytest starts, by
`python -m tests.install`; where it is missing these tests skip, naming that command.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

import pytest

from tests.support.checkov import (
    checkov_executable,
    justified,
    load_exceptions,
    run_checkov,
)
from tests.support.stacks import (
    ALL_STACK_NAMES,
    PLATFORM_STACK_NAMES,
    ROOT,
    render_doc,
    render_stack,
)
from tests.standby_pool.pooled import pooled_doc
from warmstart import render

SECURITY_DOC = ROOT / "docs" / "security.md"
POOLED = "pooled"
# Objects with a pod template: the ones that must be scanned (and reach checkov as such).
WORKLOAD_KINDS = {"Deployment", "Job", "DaemonSet", "StatefulSet", "CronJob", "ReplicaSet", "Pod"}


@pytest.fixture(scope="session")
def scans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[render.Rendered, dict[str, Any]]]:
    """Each stack's render and checkov's report over its kubernetes/ folder."""
    checkov_executable()  # skips (or fails, in CI) before rendering anything when checkov is missing
    out: dict[str, tuple[render.Rendered, dict[str, Any]]] = {}
    renders = {stack: render_stack(stack) for stack in ALL_STACK_NAMES}
    # A stack with a standby pool (no shipped stack has one): its hosts and pool actuator are scanned
    # too. Its members at minReplicas 1: a front-queue router's SMG container has no readiness probe
    # of its own (CKV_K8S_9), a finding of scale from zero that no shipped stack shows either.
    doc = pooled_doc()
    for m in doc["config"]["warmstart:models"]:
        m["autoscaling"]["minReplicas"] = 1
    renders[POOLED] = render_doc(doc, tmp_path_factory.mktemp("pooled-doc"), POOLED)
    for stack, rendered in renders.items():
        folder = tmp_path_factory.mktemp(f"render-{stack}")
        render.write(rendered, folder)
        out[stack] = (rendered, run_checkov(folder / "kubernetes"))
    return out


def _resource_id(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return ".".join(p for p in (obj["kind"], meta.get("namespace"), meta["name"]) if p)


def test_the_scanner_reads_every_workload_of_every_stack(scans):
    assert {"dev", "prod"} <= set(scans)
    for stack, (rendered, report) in scans.items():
        assert report["summary"]["parsing_errors"] == 0, stack
        results = report["results"]["passed_checks"] + report["results"]["failed_checks"]
        scanned = {r["resource"] for r in results}
        workloads = [o for o in rendered.kubernetes_objects if o["kind"] in WORKLOAD_KINDS]
        # A platform without inline models renders no workload of its own (its Helm add-ons
        # render at `up`; see docs/security.md); its model stacks' workloads are scanned there.
        assert workloads or stack in PLATFORM_STACK_NAMES, stack
        for obj in workloads:
            assert _resource_id(obj) in scanned, f"{stack}: checkov did not scan {_resource_id(obj)}"
        # The checks the issue named, on every serving Deployment: fixed, not skipped.
        passed = {(r["check_id"], r["resource"]) for r in report["results"]["passed_checks"]}
        exceptions = load_exceptions()
        for obj in rendered.kind("Deployment"):
            for check in ("CKV_K8S_28", "CKV_K8S_37", "CKV_K8S_38", "CKV_K8S_22", "CKV_K8S_23",
                          "CKV_K8S_40", "CKV_K8S_20"):
                # The router watches pods, so it mounts its token (CKV_K8S_38, justified).
                if justified(check, _resource_id(obj), exceptions) is not None:
                    continue
                assert (check, _resource_id(obj)) in passed, f"{stack}: {check} on {_resource_id(obj)}"


def test_no_failed_check_outside_the_justified_list(scans):
    exceptions = load_exceptions()
    unjustified = [f"{stack}: {r['check_id']} ({r['check_name']}) on {r['resource']}"
                   for stack, (_, report) in scans.items() for r in report["results"]["failed_checks"]
                   if justified(r["check_id"], r["resource"], exceptions) is None]
    assert not unjustified, ("fix these, or justify them in docs/security-exceptions.yaml and docs/security.md:\n"
                             + "\n".join(unjustified))


def test_every_justified_exception_still_fails_somewhere(scans):
    failed = [(r["check_id"], r["resource"]) for _, report in scans.values() for r in report["results"]["failed_checks"]]
    stale = [f"{e['check']} on {pattern}" for e in load_exceptions() for pattern in e["objects"]
             if not any(c == e["check"] and fnmatch.fnmatchcase(res, pattern) for c, res in failed)]
    assert not stale, "no longer failing anywhere, remove from docs/security-exceptions.yaml: " + ", ".join(stale)


def test_every_pod_has_a_network_policy(scans):
    for stack, (rendered, report) in scans.items():
        assert not [r for r in report["results"]["failed_checks"] if r["check_id"] == "CKV2_K8S_6"], stack
        passed = [r for r in report["results"]["passed_checks"] if r["check_id"] == "CKV2_K8S_6"]
        # One per pod template: every workload's pods are selected by some NetworkPolicy.
        assert len(passed) == len([o for o in rendered.kubernetes_objects if o["kind"] in WORKLOAD_KINDS]), stack


def test_security_doc_explains_every_exception():
    doc = SECURITY_DOC.read_text()
    exceptions = load_exceptions()
    assert len({e["check"] for e in exceptions}) == len(exceptions), "one entry per check"
    for e in exceptions:
        assert e["reason"].strip() and e["objects"], e["check"]
        rows = [line for line in doc.splitlines() if line.startswith("|") and f"`{e['check']}`" in line]
        assert rows, f"docs/security.md has no table row for {e['check']}"
    listed = {m.group(1) for line in doc.splitlines() if (m := re.match(r"\| `(CKV2?_[A-Z0-9]+_\d+)`", line))}
    assert listed == {e["check"] for e in exceptions}, "docs/security.md lists exactly the justified checks"


def test_exception_matching_is_by_check_and_object():
    exceptions = [{"check": "CKV_K8S_11", "objects": ["Deployment.*"], "reason": "r"}]
    assert justified("CKV_K8S_11", "Deployment.inference.m", exceptions)
    assert justified("CKV_K8S_11", "DaemonSet.inference.m", exceptions) is None
    assert justified("CKV_K8S_12", "Deployment.inference.m", exceptions) is None


def test_the_scanner_ran_its_kubernetes_checks(scans):
    """Not a handful of checks: checkov's Kubernetes check set ran over every stack."""
    for stack, (_, report) in scans.items():
        if stack in PLATFORM_STACK_NAMES:
            continue
        ran = {r["check_id"] for kind in ("passed_checks", "failed_checks") for r in report["results"][kind]}
        assert len(ran) > 40, (stack, sorted(ran))
