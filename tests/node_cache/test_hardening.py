"""The node cache's pods follow the rules of every warmstart pod (tests/network/test_network_policy.py),
have their NetworkPolicies, wire the compile-cache key's `weights` factor, really run as the
non-root UID on a root-created node directory, and fail only the checkov checks
docs/security-exceptions.yaml justifies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

import kubernetes_validate
import pytest
import yaml

import components
from components.serving import plan as plan_model
from tests.support.node_cache import (
    DIGEST,
    IMAGE,
    K8S,
    SELECT,
    SOURCE,
    STAGE,
    model_files,
    node_cache_component,
)
from tests.support.pod_security import _selects, assert_pod_hardened
from warmstart.decisions import instances, placement
from warmstart.decisions import node_cache as decide
from warmstart.manifests import compile_cache as ccm
from warmstart.manifests import network_policy, serving
from warmstart.manifests import node_cache as nc
from warmstart.manifests.serving import deployment_spec, merge_extras


def _kind(r: Any) -> str:
    return r.typ.split(":")[2]


def _workloads(resources: list) -> list[tuple[dict, dict, dict]]:
    """(object, pod spec, pod labels) of the component's workloads (not the test's own Deployment)."""
    out = []
    for r in resources:
        if _kind(r) in ("DaemonSet", "Deployment") and r.name != "llama-deployment":
            tpl = r.inputs["spec"]["template"]
            out.append((dict(r.inputs), tpl["spec"], tpl["metadata"]["labels"]))
    return out


def test_every_node_cache_pod_is_hardened_and_selected_by_its_own_policy() -> None:
    _, resources = node_cache_component()
    policies = [dict(r.inputs) for r in resources if _kind(r) == "NetworkPolicy"]
    workloads = _workloads(resources)
    kinds = sorted(obj["metadata"]["name"] for obj, _, _ in workloads)
    assert kinds == ["l40s-warm-spare", "llama-weights-h100", "llama-weights-l40s"]
    for obj, spec, labels in workloads:
        name = obj["metadata"]["name"]
        assert assert_pod_hardened(name, spec, labels) >= 1
        (policy,) = [p for p in policies if _selects(p, obj["metadata"]["namespace"], labels)]
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and not policy["spec"].get("ingress")
        if name.endswith("-warm-spare"):
            assert not policy["spec"].get("egress"), "a placeholder sends nothing"
            assert spec["securityContext"]["runAsUser"] == nc.PAUSE_UID
        else:
            assert policy["spec"]["egress"] == network_policy.egress_rules()
            assert spec["securityContext"] == serving.pod_security_context()
    # Neither policy selects the model's serving pods (their own policy admits port 8000).
    for p in policies:
        assert not _selects(p, "inference", serving.labels("llama"))
    assert len(policies) == 2  # one for every staging pod of the model, one per placeholder Deployment


def test_without_network_policies_none_is_registered() -> None:
    _, resources = node_cache_component(network_policies=False)
    assert not [r for r in resources if _kind(r) == "NetworkPolicy"]


def test_the_staging_service_account_carries_the_role_and_only_the_pod_asks_for_a_token() -> None:
    _, resources = node_cache_component()
    (sa,) = [r.inputs for r in resources if _kind(r) == "ServiceAccount"]
    assert sa["metadata"]["name"] == nc.service_account_name("llama")
    assert sa["metadata"]["annotations"] == {serving.IRSA_ROLE_ANNOTATION: "arn:aws:iam::123456789012:role/llama-read"}
    assert sa["automountServiceAccountToken"] is False
    for obj, spec, _ in _workloads(resources):
        staging = obj["metadata"]["name"].startswith("llama-weights-")
        assert spec["automountServiceAccountToken"] is staging
        assert (spec.get("serviceAccountName") == sa["metadata"]["name"]) is staging
    # No role: no annotation (the copy then has no AWS credentials; the pods stream from S3).
    _, resources = node_cache_component(role_arn=None)
    (sa,) = [r.inputs for r in resources if _kind(r) == "ServiceAccount"]
    assert "annotations" not in sa["metadata"]


def _model():
    return plan_model(components.VllmModelArgs(model_name="llama", source=SOURCE, weights_gib=15,
                                               instance_type="g6e.xlarge", region="us-east-1",
                                               cluster_mode=components.ClusterMode.KARPENTER, node_pool="l40s"))


@pytest.mark.parametrize("pause, owner", [(0, False), (120, True)])
def test_the_picker_writes_the_node_directory_only_when_it_asks_for_a_pause(pause: int, owner: bool) -> None:
    m = _model()
    extras = nc.serving_extras(model="llama", source=SOURCE, digest=DIGEST, image=m.image,
                               nvme_mount=placement.NVME_MOUNT["karpenter"], pause_seconds=pause)
    dep = deployment_spec(m, "inference", "us-east-1", merge_extras(extras))
    spec = dep["spec"]["template"]["spec"]
    kubernetes_validate.validate(dep, K8S, strict=True)
    assert_pod_hardened("llama", spec, dep["spec"]["template"]["metadata"]["labels"])
    names = [c["name"] for c in spec["initContainers"]]
    assert (nc.WEIGHTS_OWNER_CONTAINER in names) is owner
    (select,) = [c for c in spec["initContainers"] if c["name"] == nc.SELECT_CONTAINER]
    (weights,) = [v for v in select["volumeMounts"] if v["name"] == nc.WEIGHTS_VOLUME]
    assert bool(weights.get("readOnly")) is not owner
    if owner:
        assert names.index(nc.WEIGHTS_OWNER_CONTAINER) < names.index(nc.SELECT_CONTAINER)


def test_restore_and_publish_read_the_picker_choice_in_the_same_pod() -> None:
    m = _model()
    assert m.compile_cache
    extras = merge_extras(
        nc.serving_extras(model="llama", source=SOURCE, digest=DIGEST, image=m.image,
                          nvme_mount=placement.NVME_MOUNT["karpenter"], pause_seconds=120),
        ccm.compile_cache_extras(m, "cache-bucket", "us-east-1", weights_choice=True))
    dep = deployment_spec(m, "inference", "us-east-1", extras)
    kubernetes_validate.validate(dep, K8S, strict=True)
    spec = dep["spec"]["template"]["spec"]
    assert_pod_hardened("llama", spec, dep["spec"]["template"]["metadata"]["labels"])
    names = [c["name"] for c in spec["initContainers"]]
    # The picker has written choice.json before the restore computes its key.
    assert names.index(nc.SELECT_CONTAINER) < names.index(ccm.RESTORE_CONTAINER) < names.index(ccm.PUBLISH_CONTAINER)
    assert [v["name"] for v in spec["volumes"]].count(nc.CHOICE_VOLUME) == 1
    for c in spec["initContainers"]:
        if c["name"] in (ccm.RESTORE_CONTAINER, ccm.PUBLISH_CONTAINER):
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["WARMSTART_WEIGHTS_CHOICE_FILE"] == nc.CHOICE_FILE
            (mount,) = [v for v in c["volumeMounts"] if v["name"] == nc.CHOICE_VOLUME]
            assert mount == {"name": nc.CHOICE_VOLUME, "mountPath": nc.CHOICE_MOUNT, "readOnly": True}
            assert nc.CHOICE_FILE.startswith(nc.CHOICE_MOUNT + "/")
    # Without the node cache nothing of it reaches the compile-cache containers.
    plain = ccm.compile_cache_extras(m, "cache-bucket", "us-east-1")
    for c in plain.init_containers:
        assert "WARMSTART_WEIGHTS_CHOICE_FILE" not in {e["name"] for e in c["env"]}
        assert nc.CHOICE_VOLUME not in {v["name"] for v in c["volumeMounts"]}


# ---------------------------------------------------------------------------------------------
# The real scripts as the pod's UID, on a directory "kubelet" created as root


UID = serving.RUN_AS_UID
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory every UID can traverse (pytest's tmp_path is 0700 root's)."""
    d = Path(tempfile.mkdtemp(prefix="warmstart-nc-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _as_root_with(caps: list[str], command: list[str]) -> subprocess.CompletedProcess:
    """Run as root holding only `caps` (the bounding set limits what root's exec gets)."""
    bounding = ",".join(["-all"] + [f"+{c.lower()}" for c in caps])
    return subprocess.run(["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", *command],
                          capture_output=True, text=True, timeout=30)


def _as_uid(command: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={serving.RUN_AS_GID}", "--clear-groups",
                           "--inh-caps=-all", "--bounding-set=-all", *command],
                          env=env, capture_output=True, text=True, timeout=timeout)


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in out.splitlines() if x.startswith("{")]


def test_the_stager_and_the_picker_run_as_the_pod_uid_after_the_owner(shared_tmp: Path, node, upload) -> None:
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip("needs root, setpriv and a system python3 (to switch to the pod's UID)")
    probe = _as_uid([SYSTEM_PYTHON, "-c", "print(1)"], env={"PATH": "/usr/bin:/bin"})
    if probe.returncode != 0:
        pytest.skip(f"cannot switch to UID {UID} here: {probe.stderr.strip()}")
    version = upload(model_files(41, mib=1))
    root = shared_tmp / "nvme" / "weights" / "llama"  # what kubelet's DirectoryOrCreate leaves: root's, 0755
    root.mkdir(parents=True, mode=0o755)
    # The scratch emptyDir (HOME, TMPDIR): `s5cmd sync` sorts its listings in temporary files
    # there and panics when it cannot write them.
    scratch = shared_tmp / "scratch"
    scratch.mkdir(mode=0o755)
    os.chown(scratch, UID, serving.RUN_AS_GID)
    scripts = shared_tmp / "scripts"
    scripts.mkdir(mode=0o755)
    for script in (STAGE, SELECT):  # each one built artifact, as its ConfigMap volume holds it
        shutil.copy(script, scripts / script.name)
    env = node.env(version, DIGEST, WARMSTART_WEIGHTS_ROOT=str(root), HOME=str(scratch), TMPDIR=str(scratch),
                   PYTHONDONTWRITEBYTECODE="1", PATH="/usr/bin:/bin")
    stage = [SYSTEM_PYTHON, str(scripts / STAGE.name), "stage"]
    # Without the owner the non-root stager cannot write the directory: one error line, exit 0.
    before = _as_uid(stage, env)
    assert before.returncode == 0 and [x["result"] for x in _lines(before.stdout)] == ["error"], before.stdout
    # The owner container's own command, on this directory, as root with CAP_CHOWN only.
    owner = nc.daemonset_spec(**{**_ds_args(), "nvme_mount": str(shared_tmp / "nvme")})
    (cmd,) = [c["command"] for c in owner["spec"]["template"]["spec"]["initContainers"]
              if c["name"] == nc.WEIGHTS_OWNER_CONTAINER]
    assert cmd[-1] == nc.CONTAINER_WEIGHTS_ROOT
    done = _as_root_with(["CHOWN"], [*cmd[:-1], str(root)])
    assert done.returncode == 0, done.stderr
    assert (root.stat().st_uid, root.stat().st_gid) == (UID, serving.RUN_AS_GID)
    after = _as_uid(stage, env)
    (line,) = _lines(after.stdout)
    assert line["result"] == "staged", after.stdout + after.stderr
    for path in [root, *root.rglob("*")]:
        assert path.stat().st_uid == UID, path  # everything below the root is the pod UID's own
    # The serving pod's picker, same UID: a complete copy is chosen; a pod of another digest
    # streams from S3 and writes its pause request under the node directory.
    out = shared_tmp / "choice"  # the pod's emptyDir
    out.mkdir()
    os.chown(out, UID, serving.RUN_AS_GID)
    pick_env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "WARMSTART_WEIGHTS_SOURCE": version.source,
                "WARMSTART_WEIGHTS_DIGEST": DIGEST, "WARMSTART_WEIGHTS_ROOT": str(root),
                "WARMSTART_WEIGHTS_OUT": str(out), "WARMSTART_LOADING_HOLD_S": "60", "POD_UID": "u-1"}
    (line,) = _lines(_as_uid([SYSTEM_PYTHON, str(scripts / SELECT.name)], pick_env).stdout)
    assert line["choice"] == "local", line["reason"]
    (line,) = _lines(_as_uid([SYSTEM_PYTHON, str(scripts / SELECT.name)],
                             pick_env | {"WARMSTART_WEIGHTS_DIGEST": "ffffffffffff", "POD_UID": "u-2"}).stdout)
    assert line["choice"] == "s3" and "not written" not in line["reason"], line
    assert (root / ".loading" / "u-2.json").is_file()


def _ds_args() -> dict[str, Any]:
    return {"model": "llama", "pool": "l40s", "namespace": "inference", "image": IMAGE, "source": SOURCE,
            "digest": DIGEST, "nvme_mount": placement.NVME_MOUNT["karpenter"], "region": "us-east-1",
            "deadline_seconds": decide.deadline_seconds(15 * instances.GIB)}


# ---------------------------------------------------------------------------------------------
# The scanner


def _scanned_objects() -> list[dict[str, Any]]:
    m = _model()
    extras = merge_extras(
        nc.serving_extras(model="llama", source=SOURCE, digest=DIGEST, image=m.image,
                          nvme_mount=placement.NVME_MOUNT["karpenter"], pause_seconds=120),
        ccm.compile_cache_extras(m, "cache-bucket", "us-east-1", weights_choice=True))
    return [
        nc.daemonset_spec(**_ds_args()),
        nc.placeholder_spec(pool="l40s", namespace="inference", warm_nodes=1, instance_type="g6e.xlarge", gpus=1),
        nc.staging_network_policy("llama", "inference"), nc.placeholder_network_policy("l40s", "inference"),
        nc.service_account_spec("llama", "inference", "arn:aws:iam::1:role/r"), nc.role_spec("llama", "inference"),
        nc.role_binding_spec("llama", "inference"),
        deployment_spec(m, "inference", "us-east-1", extras),
        network_policy.serving_network_policy("llama", "inference"),
    ]


@pytest.mark.servers
def test_the_scanner_fails_only_justified_checks_on_the_node_cache_objects(tmp_path: Path) -> None:
    from tests.support.checkov import justified, load_exceptions, run_checkov

    for i, obj in enumerate(_scanned_objects()):
        (tmp_path / f"{i}-{obj['kind'].lower()}.yaml").write_text(yaml.safe_dump(obj))
    report = run_checkov(tmp_path)
    assert report["summary"]["parsing_errors"] == 0
    exceptions = load_exceptions()
    failed = report["results"]["failed_checks"]
    unjustified = [f"{r['check_id']} on {r['resource']}" for r in failed
                   if justified(r["check_id"], r["resource"], exceptions) is None]
    assert not unjustified, unjustified
    # The new exceptions are used here (so they hold once a stack renders these objects), and
    # the checks fixed on every other pod pass on these too.
    ids = {(r["check_id"], r["resource"]) for r in failed}
    staging, spare = "DaemonSet.inference.llama-weights-l40s", "Deployment.inference.l40s-warm-spare"
    assert {("CKV_K8S_38", staging), ("CKV_K8S_25", staging), ("CKV_K8S_8", spare)} <= ids
    passed = {(r["check_id"], r["resource"]) for r in report["results"]["passed_checks"]}
    for resource in (staging, spare, "Deployment.inference.llama"):
        for check in ("CKV_K8S_11", "CKV_K8S_20", "CKV_K8S_22", "CKV_K8S_23", "CKV_K8S_28", "CKV_K8S_37",
                      "CKV_K8S_40"):
            if justified(check, resource, exceptions) is None:
                assert (check, resource) in passed, f"{check} on {resource}"
    # Every pod template is selected by a NetworkPolicy (checkov names them `Pod.<ns>.<name>.<labels>`).
    pods = {r["resource"].split(".")[2] for r in report["results"]["passed_checks"] if r["check_id"] == "CKV2_K8S_6"}
    assert pods == {"llama-weights-l40s", "l40s-warm-spare", "llama"}
    assert not [r for r in failed if r["check_id"] == "CKV2_K8S_6"]
