"""The node cache's Kubernetes objects and component, under Pulumi mocks, against real schemas."""

from __future__ import annotations

import email
import json
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

import components
from components.serving import plan as plan_model
from tests.support.node_cache import DIGEST, IMAGE, K8S, SOURCE, node_cache_component
from warmstart import versions
from warmstart.decisions import instances, node_cache as decide, placement, soci
from warmstart.manifests import node_cache as nc
from warmstart.manifests.serving import deployment_spec, merge_extras, vllm_args
from warmstart.podside.weights_stage import label as weights_stage_label
from warmstart.podside.weights_stage import settings as weights_stage_settings
from warmstart.podside.weights_stage import main as weights_stage

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


def crd_validator(path: Path, kind: str, version: str) -> jsonschema.Draft7Validator:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc["spec"]["names"]["kind"] == kind:
            (v,) = [v for v in doc["spec"]["versions"] if v["name"] == version]
            return jsonschema.Draft7Validator(v["schema"]["openAPIV3Schema"])
    raise LookupError(kind)


NODE_FEATURE = crd_validator(SCHEMAS / "node-feature-discovery/nfd-api-crds.yaml", "NodeFeature", "v1alpha1")
EC2_NODE_CLASS = crd_validator(SCHEMAS / "karpenter/karpenter.k8s.aws_ec2nodeclasses.yaml", "EC2NodeClass", "v1")


def _ds(mode: str = "karpenter") -> dict[str, Any]:
    return nc.daemonset_spec(model="llama", pool="l40s", namespace="inference", image=IMAGE, source=SOURCE,
                             digest=DIGEST, nvme_mount=placement.NVME_MOUNT[mode], region="us-east-1",
                             deadline_seconds=decide.deadline_seconds(15 * instances.GIB))


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod["spec"].get("initContainers", []) + pod["spec"]["containers"]


@pytest.mark.parametrize("mode", ["auto", "karpenter"])
def test_the_staging_daemonset_runs_the_model_image_without_gpus_on_its_pool(mode: str) -> None:
    ds = _ds(mode)
    kubernetes_validate.validate(ds, K8S, strict=True)
    pod = ds["spec"]["template"]
    images = {c["image"] for c in _containers(pod) if c["name"] != "s5cmd"}
    assert images == {IMAGE}, "staging must pull exactly the serving image"
    assert all(placement.GPU_RESOURCE not in c.get("resources", {}).get("requests", {}) for c in _containers(pod))
    assert pod["spec"]["nodeSelector"] == {placement.NODEPOOL_LABEL: "l40s"}
    (weights,) = [v for v in pod["spec"]["volumes"] if v["name"] == nc.WEIGHTS_VOLUME]
    assert placement.under(weights["hostPath"]["path"], placement.NVME_MOUNT[mode])
    classes = {p["metadata"]["name"]: p for p in nc.priority_class_specs()}
    assert classes[pod["spec"]["priorityClassName"]]["value"] < 0
    # The selector selects the template, and the template's env names the digest it stages.
    assert ds["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    inits = {c["name"]: c for c in pod["spec"]["initContainers"]}
    env = {e["name"]: e.get("value") for e in inits["weights-stage"]["env"]}
    assert (env["WARMSTART_WEIGHTS_DIGEST"], env["WARMSTART_WEIGHTS_SOURCE"]) == (DIGEST, SOURCE)
    assert inits["s5cmd"]["image"] == versions.S5CMD_IMAGE
    # The owner goes first: nothing writes the node directory before it belongs to the pod's UID.
    assert pod["spec"]["initContainers"][0]["name"] == nc.WEIGHTS_OWNER_CONTAINER


def test_priority_classes_never_preempt_and_placeholders_yield_to_staging() -> None:
    pcs = nc.priority_class_specs()
    for pc in pcs:
        kubernetes_validate.validate(pc, K8S, strict=True)
        assert pc["preemptionPolicy"] == "Never" and pc["value"] < 0 and not pc["globalDefault"]
    by = {p["metadata"]["name"]: p["value"] for p in pcs}
    assert by[nc.PLACEHOLDER_PRIORITY_CLASS] < by[nc.STAGING_PRIORITY_CLASS] < 0


def test_the_label_rbac_is_one_namespace_nodefeatures_only() -> None:
    role, binding = nc.role_spec("llama", "inference"), nc.role_binding_spec("llama", "inference")
    for obj in (role, binding, nc.service_account_spec("llama", "inference", "arn:aws:iam::1:role/r")):
        kubernetes_validate.validate(obj, K8S, strict=True)
    (rule,) = role["rules"]
    assert rule["apiGroups"] == ["nfd.k8s-sigs.io"] and rule["resources"] == ["nodefeatures"]
    assert set(rule["verbs"]) <= {"create", "patch", "delete"}
    assert binding["subjects"][0]["name"] == nc.service_account_name("llama") != "llama"


def _staging_settings(**env: str) -> weights_stage.Settings:
    return weights_stage.Settings.from_env({
        "WARMSTART_WEIGHTS_SOURCE": SOURCE, "WARMSTART_WEIGHTS_DIGEST": DIGEST, "WARMSTART_LABEL": nc.label_key("llama"),
        "NODE_NAME": "ip-10-0-1-2.ec2.internal", "POD_NAME": "llama-weights-l40s-abcde", "POD_UID": "u-1",
        "POD_NAMESPACE": "inference"} | env)


def test_the_node_feature_is_valid_owned_by_its_pod_and_names_the_node() -> None:
    obj = weights_stage_label.node_feature(_staging_settings())
    NODE_FEATURE.validate(obj)
    kubernetes_validate.validate({k: v for k, v in obj.items() if k != "spec"} | {"apiVersion": "v1", "kind": "ConfigMap"},
                                 K8S, strict=True)  # metadata (name, labels, ownerReferences) is valid
    assert obj["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": "ip-10-0-1-2.ec2.internal"}
    (owner,) = obj["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner.get("blockOwnerDeletion")) == ("Pod", "u-1", None)
    assert obj["spec"]["labels"] == {nc.label_key("llama"): DIGEST}


class FakeApi(BaseHTTPRequestHandler):
    calls: list[tuple[str, str, str, Any]] = []

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else None
        FakeApi.calls.append((self.command, self.path, self.headers.get("Authorization", ""), body))
        self.send_response(200 if self.command == "PATCH" else 404)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_PATCH = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake_api(tmp_path: Path):
    """An HTTPS API server on 127.0.0.1 with a CA of its own, as a pod sees the real one."""
    sa = tmp_path / "sa"
    sa.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(tmp_path / "key.pem"),
                    "-out", str(sa / "ca.crt")], check=True, capture_output=True)
    (sa / "token").write_text("tok-123\n")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeApi)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sa / "ca.crt", tmp_path / "key.pem")
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    FakeApi.calls = []
    yield f"https://127.0.0.1:{httpd.server_address[1]}", sa
    httpd.shutdown()
    httpd.server_close()


def test_the_label_follows_the_copy_through_the_api_with_the_pod_token(fake_api, tmp_path: Path) -> None:
    url, sa = fake_api
    s = _staging_settings(WARMSTART_KUBE_API=url, WARMSTART_SA_DIR=str(sa), WARMSTART_WEIGHTS_ROOT=str(tmp_path / "w"),
                          WARMSTART_RETRY_S="3600")
    # Complete copy: hold labels; the copy disappears: hold unlabels (its restage is refused offline).
    (tmp_path / "w" / DIGEST).mkdir(parents=True)
    (tmp_path / "w" / DIGEST / "m.safetensors").write_bytes(b"x")
    (tmp_path / "w" / DIGEST / weights_stage_settings.MARKER).write_text(json.dumps({
        "format": weights_stage_settings.MARKER_FORMAT, "digest": DIGEST, "source": SOURCE,
        "files": [{"key": "m.safetensors", "size": 1, "etag": "e"}]}))
    seen: list[int] = []

    def sleep(_: float) -> None:
        seen.append(len(FakeApi.calls))
        (tmp_path / "w" / DIGEST / weights_stage_settings.MARKER).unlink(missing_ok=True)

    weights_stage.hold(s, rounds=2, sleep=sleep, check_s=0)
    methods = [(m, p.split("?")[0].rsplit("/", 1)[-1]) for m, p, _, _ in FakeApi.calls]
    name = weights_stage_label.feature_name(s)
    assert methods == [("PATCH", name), ("DELETE", name)]
    method, path, auth, body = FakeApi.calls[0]
    assert path.startswith("/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/inference/nodefeatures/") and auth == "Bearer tok-123"
    assert "fieldManager=" in path and body == weights_stage_label.node_feature(s)


def test_serving_pods_prefer_cached_nodes_and_never_require_them() -> None:
    m = plan_model(components.VllmModelArgs(model_name="llama", source=SOURCE, weights_gib=15, instance_type="g6e.xlarge",
                                            region="us-east-1", cluster_mode=components.ClusterMode.KARPENTER,
                                            node_pool="l40s"))
    extras = nc.serving_extras(model="llama", source=SOURCE, digest=DIGEST, image=m.image,
                               nvme_mount=placement.NVME_MOUNT["karpenter"], pause_seconds=120)
    dep = deployment_spec(m, "inference", "us-east-1", merge_extras(extras))
    pod = dep["spec"]["template"]["spec"]
    pod["affinity"] = nc.serving_affinity("llama", DIGEST)
    (vllm,) = pod["containers"]
    vllm["command"], vllm["args"] = nc.serving_command(vllm_args(m))
    kubernetes_validate.validate(dep, K8S, strict=True)
    node_affinity = pod["affinity"]["nodeAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in node_affinity
    (pref,) = node_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pref["preference"]["matchExpressions"] == [{"key": nc.label_key("llama"), "operator": "In", "values": [DIGEST]}]
    names = [c["name"] for c in pod["initContainers"]]
    assert names[:2] == [nc.WEIGHTS_OWNER_CONTAINER, nc.SELECT_CONTAINER]  # pause requests: the owner first
    assert {c["image"] for c in pod["initContainers"][:2]} == {m.image}
    mounts = {mt["mountPath"]: mt for mt in vllm["volumeMounts"]}
    assert mounts[decide.CONTAINER_WEIGHTS_ROOT]["readOnly"] is True
    assert "--load-format=runai_streamer" in vllm["args"] and SOURCE not in vllm["args"]
    assert SOURCE in vllm["command"][2] and nc.MODEL_PATH_FILE in vllm["command"][2]  # the fallback


@pytest.mark.servers
def test_the_serving_command_falls_back_to_s3_without_the_picker_file(tmp_path: Path) -> None:
    command, args = nc.serving_command([SOURCE, "--load-format=runai_streamer"])
    fake_bin = tmp_path / "vllm"
    fake_bin.write_text('#!/bin/sh\necho "$@"\n')
    fake_bin.chmod(0o755)
    out = subprocess.run(command + args, capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    assert out.stdout.split() == ["serve", SOURCE, "--load-format=runai_streamer"]


def test_placeholders_hold_whole_nodes_at_the_lowest_priority() -> None:
    dep = nc.placeholder_spec(pool="l40s", namespace="inference", warm_nodes=2, instance_type="g6e.xlarge", gpus=1)
    kubernetes_validate.validate(dep, K8S, strict=True)
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2 and pod["priorityClassName"] == nc.PLACEHOLDER_PRIORITY_CLASS
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert pod["containers"][0]["resources"]["requests"][placement.GPU_RESOURCE] == "1"


def test_nfd_runs_only_its_master_and_allows_the_label_namespace() -> None:
    values = nc.nfd_values()
    assert values["worker"]["enable"] is False and values["master"]["enable"] is True
    assert nc.LABEL_NAMESPACE in values["master"]["extraLabelNs"]
    assert nc.label_key("llama").split("/")[0] == nc.LABEL_NAMESPACE


def test_the_karpenter_user_data_turns_on_soci_parallel_pull_on_the_raid() -> None:
    text = soci.user_data()
    msg = email.message_from_string(text)
    assert msg.is_multipart() and msg.get_content_type() == "multipart/mixed"
    (part,) = [p for p in msg.walk() if not p.is_multipart()]
    assert part.get_content_type() == "application/node.eks.aws"
    cfg = yaml.safe_load(part.get_payload())
    assert (cfg["apiVersion"], cfg["kind"]) == ("node.eks.aws/v1alpha1", "NodeConfig")
    assert cfg["spec"]["featureGates"] == {"FastImagePull": True}
    storage = cfg["spec"]["instance"]["localStorage"]
    assert storage["strategy"] == "RAID0" and "SOCI" not in storage.get("disabledMounts", [])
    assert soci.user_data() == text  # byte-identical: no drift between runs
    spec = {"role": "node", "amiSelectorTerms": [{"alias": versions.KARPENTER_AMI_ALIAS}],
            "subnetSelectorTerms": [{"tags": {"a": "b"}}], "securityGroupSelectorTerms": [{"tags": {"a": "b"}}],
            "instanceStorePolicy": "RAID0", "userData": text}
    EC2_NODE_CLASS.validate({"apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
                             "metadata": {"name": "l40s"}, "spec": spec})




def test_the_component_registers_valid_objects_and_the_deployment_waits_for_the_daemonsets() -> None:
    cache, resources = node_cache_component()
    objects = {r.urn: r for r in resources if r.typ.startswith("kubernetes:")}
    for r in objects.values():
        obj = dict(r.inputs)
        api, kind = r.typ.split(":")[1], r.typ.split(":")[2]
        group, version = api.split("/")
        obj.setdefault("apiVersion", version if group == "core" else f"{group}.k8s.io/{version}"
                       if group in ("rbac", "scheduling") else f"{group}/{version}")
        obj.setdefault("kind", kind)
        kubernetes_validate.validate(obj, K8S, strict=True)
    daemonsets = [r for r in resources if r.typ == "kubernetes:apps/v1:DaemonSet"]
    assert sorted(d.inputs["metadata"]["name"] for d in daemonsets) == ["llama-weights-h100", "llama-weights-l40s"]
    (serving,) = [r for r in resources if r.name == "llama-deployment"]
    assert {d.urn for d in daemonsets} <= set(serving.dependencies)
    for d in daemonsets:
        pod = d.inputs["spec"]["template"]
        serving_image = serving.inputs["spec"]["template"]["spec"]["containers"][0]["image"]
        assert {c["image"] for c in _containers(pod) if c["name"] != "s5cmd"} == {serving_image}
        # The DaemonSet waits on its ServiceAccount, Role and scripts.
        sa = [r for r in resources if r.typ == "kubernetes:core/v1:ServiceAccount"]
        assert {x.urn for x in sa} <= set(d.dependencies)
        assert int(d.inputs["metadata"]["annotations"]["pulumi.com/timeoutSeconds"]) > decide.deadline_seconds(15 * 2**30)
    spares = [r for r in resources if r.typ == "kubernetes:apps/v1:Deployment" and r.name.endswith("warm-spare")]
    assert [s.inputs["spec"]["replicas"] for s in spares] == [1]
    assert cache.label_key == nc.label_key("llama")
    assert "warmstart:index:ModelNodeCache" in {r.typ for r in resources}
