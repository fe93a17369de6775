"""Invariants over every rendered vLLM Deployment of every stack in stacks/."""

from __future__ import annotations

import json
import math

import kubernetes_validate
import pytest

from tests.support.keda import validate_keda
from warmstart.decisions import placement, tuning
from warmstart.decisions.instances import GIB

# Karpenter and Auto Mode objects are validated against their CRDs in tests/cluster/test_cluster.py;
# KEDA's right here.
CRD_GROUPS = ("karpenter.sh/", "karpenter.k8s.aws/", "eks.amazonaws.com/", "keda.sh/")


def _vllm_deployments(rendered):
    deps = [d for d in rendered.kind("Deployment")
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "vllm"]
    assert len(deps) == len(rendered.stack_plan.models) > 0
    return deps


def _vllm_container(dep):
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    return c


def _flag(args, name):
    values = [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    assert len(values) <= 1, f"{name} given twice"
    return values[0] if values else None


def _quantity_bytes(q: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix, mult in units.items():
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * mult
    return int(q)


def test_gpu_request_equals_tensor_parallel(rendered):
    for dep in _vllm_deployments(rendered):
        c = _vllm_container(dep)
        tp = int(_flag(c["args"], "--tensor-parallel-size"))
        assert c["resources"]["requests"][placement.GPU_RESOURCE] == str(tp)
        assert c["resources"]["limits"][placement.GPU_RESOURCE] == str(tp)


def test_loader_is_tuned_from_weights_and_chunk(rendered):
    for dep in _vllm_deployments(rendered):
        c = _vllm_container(dep)
        env = {e["name"]: e.get("value") for e in c["env"]}
        ann = dep["metadata"]["annotations"]
        weights = int(ann["warmstart.io/weights-bytes"])
        chunk = int(env["RUNAI_STREAMER_CHUNK_BYTESIZE"])
        assert chunk == int(ann["warmstart.io/chunk-bytes"])
        extra = json.loads(_flag(c["args"], "--model-loader-extra-config"))
        assert extra["concurrency"] == math.ceil(weights / chunk)
        tp = int(_flag(c["args"], "--tensor-parallel-size"))
        assert extra["distributed"] is (tp > 1)
        assert "--load-format=runai_streamer" in c["args"]
        m = next(m for m in rendered.stack_plan.models if m.name == dep["metadata"]["name"])
        if m.staged:
            # The model path is the node cache's choice (a local directory or the S3 URI, which
            # is also the fallback when the choice file is missing).
            assert c["command"][:2] == ["sh", "-c"] and "exec vllm serve" in c["command"][2]
            assert m.source in c["command"][2]
        else:
            assert c["args"][0] == m.source.rstrip("/") and c["args"][0].startswith("s3://")
            assert c["command"] == ["vllm", "serve"]
        # The stall cut and its retry are the model's loader tuning, all three (a cut with no
        # retry window fails the whole load: tests/serving/test_streamer_stall.py).
        stall = tuning.streamer_s3_env(m.loader.request_timeout_ms, m.loader.low_speed_limit_bytes_per_second,
                                       m.loader.retry_window_seconds)
        assert {k: env.get(k) for k in stall} == stall
        assert int(env["RUNAI_STREAMER_S3_REQUEST_TIMEOUT_MS"]) >= 1000
        assert int(env["RUNAI_STREAMER_S3_LOW_SPEED_LIMIT"]) > 0
        assert int(env["RUNAI_STREAMER_S3_TIMEOUT"]) > 0
        assert env["AWS_REGION"] == rendered.stack_plan.config.region


def test_compile_cache_on_the_modes_nvme_path(rendered):
    mode = rendered.stack_plan.cluster_mode
    for dep in _vllm_deployments(rendered):
        c = _vllm_container(dep)
        env = {e["name"]: e.get("value") for e in c["env"]}
        eager = "--enforce-eager" in c["args"]
        volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        if eager:
            assert "compile-cache" not in volumes
            continue
        host = volumes["compile-cache"]["hostPath"]
        assert host["type"] == "DirectoryOrCreate"
        assert host["path"].startswith(placement.compile_cache_host_path(mode) + "/")
        # The whole volume (no subPath: the per-setting startup-plan folder is a subPath mount of its own).
        (mount,) = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "compile-cache" and "subPath" not in m]
        assert env["XDG_CACHE_HOME"] == mount
        assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(mount + "/")
        assert env["TRITON_CACHE_DIR"].startswith(mount + "/")


def test_probes_never_kill_a_loading_pod(rendered):
    for dep in _vllm_deployments(rendered):
        c = _vllm_container(dep)
        weights = int(dep["metadata"]["annotations"]["warmstart.io/weights-bytes"])
        startup = c["startupProbe"]
        window = startup["periodSeconds"] * startup["failureThreshold"]
        assert window >= tuning.startup_budget_seconds(weights)
        for probe in ("startupProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["path"] == "/health"
        # Readiness is /health, or for standby engines the check that also fails while asleep
        # (it asks /health first); neither kills a pod.
        ready = c["readinessProbe"]
        assert ready.get("httpGet", {}).get("path") == "/health" or "/health" in ready["exec"]["command"][2]
        # A Deployment is not "stuck" before its pods could possibly have started.
        assert dep["spec"]["progressDeadlineSeconds"] > window


def test_shm_is_memory_backed_and_sized_for_tp(rendered):
    for dep in _vllm_deployments(rendered):
        c = _vllm_container(dep)
        tp = int(_flag(c["args"], "--tensor-parallel-size"))
        vols = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
        shm_mounts = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        assert len(shm_mounts) == 1
        shm = vols[shm_mounts[0]["name"]]["emptyDir"]
        assert shm["medium"] == "Memory"
        size = _quantity_bytes(shm["sizeLimit"])
        assert size >= (2 * GIB if tp == 1 else 8 * GIB)
        assert size <= _quantity_bytes(c["resources"]["limits"]["memory"])


def test_gpu_pods_tolerate_the_taint_and_land_on_their_instance_type(rendered):
    by_name = {m.name: m for m in rendered.stack_plan.models}
    for dep in _vllm_deployments(rendered):
        pod = dep["spec"]["template"]["spec"]
        assert {"key": placement.GPU_TAINT_KEY, "operator": "Exists", "effect": placement.GPU_TAINT_EFFECT} in pod["tolerations"]
        m = by_name[dep["metadata"]["name"]]
        assert pod["nodeSelector"][placement.INSTANCE_TYPE_LABEL] == m.instance.instance_type
        tp = int(_flag(_vllm_container(dep)["args"], "--tensor-parallel-size"))
        assert m.instance.gpu_count >= tp


def test_each_model_has_its_serving_objects(rendered):
    for m in rendered.stack_plan.models:
        for kind in ("ServiceAccount", "Deployment", "Service", "PodDisruptionBudget"):
            names = [o["metadata"]["name"] for o in rendered.kind(kind)]
            assert m.name in names, (kind, m.name)
        (dep,) = [d for d in rendered.kind("Deployment") if d["metadata"]["name"] == m.name]
        assert dep["spec"]["template"]["spec"]["serviceAccountName"] == m.name
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == m.name
        assert labels.items() >= dep["spec"]["selector"]["matchLabels"].items()


def test_every_builtin_object_validates_strictly(rendered):
    version = rendered.stack_plan.config.kubernetes_version
    validated = 0
    for obj in rendered.kubernetes_objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
            validated += 1
        except kubernetes_validate.SchemaNotFoundError:
            assert obj["apiVersion"].startswith(CRD_GROUPS), obj["apiVersion"]
            if obj["apiVersion"].startswith("keda.sh/"):
                validate_keda(obj)
    assert validated >= 4 * len(rendered.stack_plan.models)


def test_broken_deployment_is_caught_by_the_schema(rendered):
    dep = json.loads(json.dumps(_vllm_deployments(rendered)[0]))
    dep["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(dep, rendered.stack_plan.config.kubernetes_version, strict=True)
