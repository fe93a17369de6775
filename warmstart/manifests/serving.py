"""The tuned vLLM serving objects of one model as plain Kubernetes object dicts (pure).

ServiceAccount, Deployment, Service and PodDisruptionBudget from a ServingPlan; the VllmModel
component (components/serving.py) registers them, and the tests validate them against the
Kubernetes schemas.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..decisions import placement, standby, standby_pool, tuning
from ..plan.records import ServingPlan

HTTP_PORT = 8000
# vLLM serves /metrics on its serving port; scrapers get this metrics-only port of the pod's
# metrics proxy instead (warmstart/podside/metrics_proxy.py), so a scraper's admission never
# opens the OpenAI API to it.
METRICS_PORT = 8001
METRICS_PORT_NAME = "metrics"
# Pod volume of the node's compile-cache directory (other pod wiring mounts it by this name).
COMPILE_CACHE_VOLUME = "compile-cache"
IRSA_ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
ANNOTATION_DOMAIN = placement.ANNOTATION_DOMAIN
# The time a GPU node's launch adds to a rollout's wait (the decision is tuning.py's).
NODE_LAUNCH_SECONDS = tuning.NODE_LAUNCH_ALLOWANCE_SECONDS

# The one non-root identity of every warmstart container (vLLM, the pod-side scripts, the
# import Job). The vLLM image runs as root by default; since
# https://github.com/vllm-project/vllm/pull/40275 its Python, uv and site-packages are readable by
# any UID, and what breaks for a UID outside /etc/passwd is only HOME and getpass.getuser()
# (the image's own non-root entrypoint sets HOME and USER for exactly that:
# docker/entrypoints/vllm-nonroot-entrypoint.sh in that PR). `vllm_env` sets both, so any UID
# works; 10001 is above the range a node's own accounts use (the scanner's CKV_K8S_40 asks for
# >= 10000), and its own group, not group 0.
RUN_AS_UID = 10001
RUN_AS_GID = 10001
# Writable paths of a container whose root filesystem is read-only: HOME (vLLM, Hugging Face,
# Triton, FlashInfer and CUDA keep their caches under $HOME/.cache, $HOME/.triton, $HOME/.nv
# unless told otherwise) and /tmp (torch inductor's default, vLLM's ZMQ IPC sockets,
# Python's tempfile). No sizeLimit: they replace the container's writable layer, which had
# none either, and an eviction of a loading GPU pod costs a cold start.
HOME_VOLUME, HOME_MOUNT = "home", "/home/warmstart"
TMP_VOLUME, TMP_MOUNT = "tmp", "/tmp"
# Init container that hands the node's compile-cache directory to RUN_AS_UID (see
# `cache_owner_container`).
CACHE_OWNER_CONTAINER = "compile-cache-owner"
# Every container: the image is pulled once per node and reused. With a tag, a node that
# already has the image keeps it (a stack that pins `@sha256:` gets exactly what it pinned);
# `Always` would add a registry round trip to every cold start and fail pods when the
# registry is unreachable (docs/security.md, CKV_K8S_15).
IMAGE_PULL_POLICY = "IfNotPresent"


def container_security_context() -> dict[str, Any]:
    """What every warmstart container runs with: no capabilities, no privilege escalation, a
    read-only root filesystem, never root (the pod sets the UID)."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]}}


def pod_security_context() -> dict[str, Any]:
    """The pod's identity: RUN_AS_UID/GID; fsGroup makes the emptyDirs the pod's group's (it
    does not apply to hostPath volumes, hence `cache_owner_container`)."""
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_UID, "runAsGroup": RUN_AS_GID, "fsGroup": RUN_AS_GID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def cache_owner_container(m: ServingPlan) -> dict[str, Any]:
    """The first init container of a pod with the compile cache: kubelet creates the hostPath
    directory (`DirectoryOrCreate`) as root, mode 0755
    (https://kubernetes.io/docs/concepts/storage/volumes/#hostpath-volume-types), and fsGroup
    does not apply to hostPath, so the non-root containers could not write it. This one runs as
    root with only CAP_CHOWN (to chown what an older, root-run pod left there) and
    CAP_DAC_READ_SEARCH (to walk directories a 0700 mkdtemp made), in the model's own image (no
    extra pull), and hands the per-model directory to RUN_AS_UID. `-h`: symbolic links are
    changed themselves, never what they point to, so nothing outside the directory is touched."""
    return {
        "name": CACHE_OWNER_CONTAINER,
        "image": m.image,
        "imagePullPolicy": IMAGE_PULL_POLICY,
        "command": ["chown", "-R", "-h", f"{RUN_AS_UID}:{RUN_AS_GID}", placement.COMPILE_CACHE_MOUNT],
        "volumeMounts": [{"name": COMPILE_CACHE_VOLUME, "mountPath": placement.COMPILE_CACHE_MOUNT}],
        "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": False, "runAsUser": 0, "runAsGroup": 0,
                            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_READ_SEARCH"]}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def labels(model: str) -> dict[str, str]:
    """Recommended Kubernetes labels; the first two are the selector."""
    return {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": model,
        "app.kubernetes.io/component": "inference-server",
        "app.kubernetes.io/part-of": "warmstart",
        "app.kubernetes.io/managed-by": "pulumi",
    }


def selector(model: str) -> dict[str, str]:
    return {k: v for k, v in labels(model).items() if k in ("app.kubernetes.io/name", "app.kubernetes.io/instance")}


# Whether the pod's engine takes traffic: `awake` on every pod the template makes (a fresh pod is
# kept out by its readiness until loaded), `asleep` once the standby actuator takes it out of the
# routers before `POST /sleep`, until it has woken the engine again (warmstart/podside/standby.py
# ENGINE_LABEL, a test holds the two together). A sleeping engine stays Ready (readiness_probe), so
# this label is what keeps it out of the traffic: a model with standby always has a router
# (plan/model.py plan_standby). Only the routers' worker selector (`worker_selector`) reads it; the Deployment's,
# the Service's and the PDB's selectors and the NetworkPolicies leave it out, so a relabelled pod
# keeps its ReplicaSet, its disruption budget and its admitted peers (the actuator among them).
ENGINE_LABEL = f"{ANNOTATION_DOMAIN}/engine"
ENGINE_AWAKE = "awake"


# A pooled model's pods, and a pool's engine host while that model's engine on it is awake, carry
# `warmstart.io/serves: <model>` (decisions/standby_pool.py SERVES_LABEL; the pool actuator moves it
# on the hosts): its routers select that label instead of the model's own, so they discover both.
SERVES_LABEL = standby_pool.SERVES_LABEL


def pod_labels(model: str, pooled: bool = False) -> dict[str, str]:
    """The labels of the pods the model's Deployment makes."""
    return labels(model) | {ENGINE_LABEL: ENGINE_AWAKE} | ({SERVES_LABEL: model} if pooled else {})


def worker_selector(model: str, pooled: bool = False) -> dict[str, str]:
    """The pods a router sends to: the model's, with an awake engine; for a pooled model also an
    engine host whose engine of the model is awake (non-pooled models keep the selector they had,
    so their pods do not roll)."""
    if pooled:
        return {SERVES_LABEL: model, ENGINE_LABEL: ENGINE_AWAKE}
    return selector(model) | {ENGINE_LABEL: ENGINE_AWAKE}


def _quantity(n_bytes: int) -> str:
    mib = n_bytes // (1024 * 1024)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def vllm_args(m: ServingPlan) -> list[str]:
    """`vllm serve` arguments; the model URI first."""
    extra_config = {"concurrency": m.concurrency, "distributed": m.distributed}
    args = [
        m.source,
        "--load-format=runai_streamer",
        "--model-loader-extra-config=" + json.dumps(extra_config, sort_keys=True, separators=(",", ":")),
        f"--tensor-parallel-size={m.tensor_parallel_size}",
        f"--gpu-memory-utilization={m.gpu_memory_utilization}",
        f"--served-model-name={m.name}",
        "--host=0.0.0.0",
        f"--port={m.serving_port}",
    ]
    if m.max_model_len is not None:
        args.append(f"--max-model-len={m.max_model_len}")
    if m.eager:
        args.append("--enforce-eager")
    if m.standby is not None:
        args.append(standby.SLEEP_MODE_FLAG)
    args.extend(m.extra_args)
    return args


def vllm_env(m: ServingPlan, region: str) -> list[dict[str, str]]:
    env = {
        # One ~4 GiB request per shard
        # (https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html#model-loading-runai-model-streamer).
        "RUNAI_STREAMER_CHUNK_BYTESIZE": str(m.loader.chunk_bytes),
        # The streamer freezes boto3's resolved credentials and region for the CRT client
        # (https://github.com/run-ai/runai-model-streamer/blob/master/docs/src/env-vars.md):
        # the region must be explicit on EKS.
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
        # A UID outside the image's /etc/passwd: HOME and the user name come from here
        # (getpass.getuser() reads LOGNAME/USER first,
        # https://docs.python.org/3/library/getpass.html#getpass.getuser; torch calls it for
        # its cache paths). The root filesystem is read-only, so no bytecode is written.
        "HOME": HOME_MOUNT,
        "USER": "warmstart",
        "LOGNAME": "warmstart",
        "TMPDIR": TMP_MOUNT,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    # Cut dead connections and retry what the cut fails, since the pod is ready only when the
    # slowest chunk lands (the values and what a cut does: warmstart/decisions/tuning.py).
    env |= tuning.streamer_s3_env(m.loader.request_timeout_ms, m.loader.low_speed_limit_bytes_per_second,
                                  m.loader.retry_window_seconds)
    if m.standby is not None:
        # The sleep routes exist only in dev mode (vllm/entrypoints/launchers/api_server/routers.py
        # at v0.33.0); the NetworkPolicies keep every dev route away from clients
        # (manifests/standby.py).
        env[standby.DEV_MODE_ENV] = "1"
        # The sleeping weights pinned at their own size and freed on wake, not rounded up to a
        # power of two and kept in torch's host cache (decisions/standby.py, PINNED_HOST_ALLOC_CONF):
        # the memory limit the render checks holds them.
        env[standby.PINNED_HOST_ALLOC_ENV] = standby.PINNED_HOST_ALLOC_CONF
    if m.compile_cache:
        root = placement.COMPILE_CACHE_MOUNT
        env |= {
            # vLLM keeps its cache under $XDG_CACHE_HOME/vllm and redirects inductor/triton
            # under its own hash directory
            # (https://docs.vllm.ai/en/latest/design/torch_compile/#compilation-cache); the
            # two torch variables still point at the NVMe mount so any compile outside
            # vLLM's path lands there too.
            "XDG_CACHE_HOME": root,
            "TORCHINDUCTOR_CACHE_DIR": f"{root}/inductor",
            "TRITON_CACHE_DIR": f"{root}/triton",
        }
        env |= jit_cache_env(root)
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def readiness_probe() -> dict[str, Any]:
    """/health, for every model, one with standby engines too: a sleeping engine stays Ready (vLLM's
    /health answers 200 while it sleeps, vllm/entrypoints/serve/instrumentator/health.py at
    v0.33.0), and the routing label (ENGINE_LABEL) alone keeps it out of the traffic. A readiness
    that failed while asleep would make every sleeper an unavailable replica, so the Deployment
    would never complete: a rollout with maxUnavailable 0 could never retire its last old pod
    (kubernetes pkg/controller/deployment/rolling.go, reconcileOldReplicaSets), Pulumi's await
    waits for the new ReplicaSet's readyReplicas to reach its replicas
    (pulumi-kubernetes provider/pkg/await/deployment.go, checkReplicaSetStatus), and the
    PodDisruptionBudget would count every sleeper as a disruption already."""
    return {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": tuning.PROBE_PERIOD_SECONDS,
            "timeoutSeconds": 5, "failureThreshold": 3}


# Every JIT cache the pinned vLLM image (warmstart/versions.py) fills at start-up besides
# Inductor and Triton, as (env var, directory under the compile-cache mount). Left to their
# defaults they live under HOME, an emptyDir that starts empty on every pod; on the mount they
# are shared by the model's pods on the node and travel in the S3 cache. Each directory is in
# the pod-side publish allow-list (warmstart/podside/compile_cache_settings.py DEFAULT_CACHE_PATHS, a
# test holds the two together). Defaults and names read in the pinned packages' source (vLLM
# 0.33.0 requires flashinfer-python 0.7.2.post1, apache-tvm-ffi 0.1.11, tilelang 0.1.12):
JIT_CACHE_DIRS: tuple[tuple[str, str], ...] = (
    # FlashInfer keeps JIT-built ops, downloaded cubins and its autotune store under
    # $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/<arch> (default $HOME;
    # flashinfer/jit/env.py, https://github.com/flashinfer-ai/flashinfer/blob/main/flashinfer/jit/env.py).
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer"),
    # The CUDA driver's PTX JIT cache (default ~/.nv/ComputeCache; "CUDA Environment Variables",
    # https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-environment-variables).
    ("CUDA_CACHE_PATH", "nv/ComputeCache"),
    # DeepGEMM's JIT kernels. vLLM 0.33 already defaults it to $VLLM_CACHE_ROOT/deep_gemm when
    # unset (vllm/utils/deep_gemm.py); set here so the path does not hang on that default.
    ("DG_JIT_CACHE_DIR", "vllm/deep_gemm"),
    # TVM-FFI builds its torch DLPack extension and JIT modules into ~/.cache/tvm-ffi (it does
    # not read XDG_CACHE_HOME; tvm_ffi/cpp/extension.py, tvm_ffi/_optional_torch_c_dlpack.py,
    # https://github.com/apache/tvm-ffi).
    ("TVM_FFI_CACHE_DIR", "tvm-ffi"),
    # TileLang's kernel cache (default ~/.tilelang/cache; tilelang/env.py,
    # https://github.com/tile-ai/tilelang/blob/main/tilelang/env.py).
    ("TILELANG_CACHE_DIR", "tilelang/cache"),
    # Not set: VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR. vLLM's FlashInfer autotune results default to
    # $VLLM_CACHE_ROOT/flashinfer_autotune_cache/<flashinfer version>/<arch> (on the mount, and
    # published), or to FlashInfer's own store under the workspace above; an override would drop
    # the version and arch from the path (vllm/model_executor/warmup/flashinfer_autotune_cache.py).
)
# Largest CUDA JIT cache the driver keeps before it evicts the oldest entries (the guide above
# allows up to 4 GiB); 1 GiB keeps every tree together under the publisher's WARMSTART_MAX_BYTES.
CUDA_CACHE_MAX_BYTES = 1 << 30


def jit_cache_env(root: str) -> dict[str, str]:
    """The env that puts every JIT cache and vLLM's startup plan on the compile-cache mount."""
    env = {name: f"{root}/{rel}" for name, rel in JIT_CACHE_DIRS}
    env |= {
        "CUDA_CACHE_MAXSIZE": str(CUDA_CACHE_MAX_BYTES),
        # TileLang stages builds in $TILELANG_CACHE_DIR/tmp by default and os.replace()s them into
        # the cache (tilelang/cache/kernel_cache.py), so its scratch stays on the same
        # filesystem, beside the published cache rather than inside it.
        "TILELANG_TMP_DIR": f"{root}/tilelang/tmp",
        # The startup plan (vllm PR #47388, vllm/v1/worker/startup_plan.py in 0.33.0): after a
        # fully profiled boot each worker saves the KV-cache size it measured under
        # $VLLM_CACHE_ROOT/startup_plan/, keyed by the config hash, GPU name, total memory,
        # compute capability, torch/CUDA build and rank/world size; later boots with a matching
        # fingerprint and at least the recorded free memory skip memory profiling and the
        # CUDA-graph memory-estimation pass. Left out of vLLM's own compile hash
        # (envs.compile_factors), so turning it on invalidates no compile cache.
        "VLLM_ENABLE_STARTUP_PLAN": "1",
    }
    return env


@dataclass(frozen=True)
class PodExtras:
    """Containers, volumes and env another component adds to the serving pod
    (the compile-cache restore/publish wiring, for one)."""

    init_containers: tuple[dict, ...] = ()
    volumes: tuple[dict, ...] = ()
    env: tuple[dict, ...] = ()
    volume_mounts: tuple[dict, ...] = ()
    pod_annotations: dict[str, str] = field(default_factory=dict)
    affinity: dict[str, Any] | None = None
    """The pod's affinity (the node cache prefers the nodes that hold the weights)."""
    vllm_command: Callable[[list[str]], tuple[list[str], list[str]]] | None = None
    """(command, args) of the vLLM container from its `vllm serve` args (the node cache's
    reads the model path its picker chose); None: `vllm serve <args>`."""


def merge_extras(*extras: PodExtras) -> PodExtras:
    """Several components' pod wiring as one (init containers run in the given order)."""
    out = PodExtras()
    for e in extras:
        out = PodExtras(
            init_containers=out.init_containers + tuple(e.init_containers),
            volumes=out.volumes + tuple(e.volumes),
            env=out.env + tuple(e.env),
            volume_mounts=out.volume_mounts + tuple(e.volume_mounts),
            pod_annotations=out.pod_annotations | dict(e.pod_annotations),
            affinity=_one("affinity", out.affinity, e.affinity),
            vllm_command=_one("vllm_command", out.vllm_command, e.vllm_command),
        )
    return out


def _one(what: str, a: Any, b: Any) -> Any:
    """The one part that sets `what` (two would each undo the other)."""
    if a is not None and b is not None:
        raise ValueError(f"two pod extras both set the serving pod's {what}")
    return a if b is None else b


def _writes_cache(container: dict[str, Any]) -> bool:
    return any(v.get("name") == COMPILE_CACHE_VOLUME and not v.get("readOnly") for v in container.get("volumeMounts", []))


def deployment_spec(m: ServingPlan, namespace: Any, region: str, extras: PodExtras = PodExtras()) -> dict[str, Any]:
    """The Deployment object (apps/v1) for one model."""
    size = m.pod
    probe = {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": tuning.PROBE_PERIOD_SECONDS}
    volumes: list[dict] = [
        # NCCL and vLLM's all-reduce use /dev/shm between TP ranks; the container default is
        # 64 MiB.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(size.shm_bytes)}},
        {"name": HOME_VOLUME, "emptyDir": {}},
        {"name": TMP_VOLUME, "emptyDir": {}},
    ]
    mounts: list[dict] = [{"name": "dshm", "mountPath": "/dev/shm"},
                          {"name": HOME_VOLUME, "mountPath": HOME_MOUNT},
                          {"name": TMP_VOLUME, "mountPath": TMP_MOUNT}]
    init_containers: list[dict] = []
    if m.compile_cache:
        volumes.append({
            "name": COMPILE_CACHE_VOLUME,
            # A per-model directory on the node's NVMe, shared by that model's pods on the
            # node. The nvme-check init container makes sure this path is NVMe, not EBS.
            "hostPath": {"path": f"{m.compile_cache_host_path}/{m.name}", "type": "DirectoryOrCreate"},
        })
        mounts.append({"name": COMPILE_CACHE_VOLUME, "mountPath": placement.COMPILE_CACHE_MOUNT})
    init_containers.extend(extras.init_containers)
    if m.compile_cache:
        # Before the first container that writes the cache (the read-only NVMe check may go
        # first), else last, before vLLM.
        # Native sidecars (the first-token probe) start with the pod and run beside vLLM, so the
        # owner goes before them too.
        writes = [i for i, c in enumerate(init_containers) if _writes_cache(c) or c.get("restartPolicy") == "Always"]
        init_containers.insert(writes[0] if writes else len(init_containers), cache_owner_container(m))
    volumes.extend(extras.volumes)
    mounts.extend(extras.volume_mounts)
    gpu = str(m.tensor_parallel_size)
    # Explicit: older images start `python3 -m vllm.entrypoints.openai.api_server`.
    command, args = extras.vllm_command(vllm_args(m)) if extras.vllm_command else (["vllm", "serve"], vllm_args(m))
    container = {
        "name": "vllm",
        "image": m.image,
        "imagePullPolicy": IMAGE_PULL_POLICY,
        "command": command,
        # The image's WORKDIR is root's; vLLM probes relative paths in the working directory.
        "workingDir": HOME_MOUNT,
        "args": args,
        "env": vllm_env(m, region) + list(extras.env),
        "ports": [{"name": "http", "containerPort": m.serving_port, "protocol": "TCP"}],
        # No CPU limit: CFS quota throttles the API server, tokenizer and engine-core busy loop
        # of a latency-bound server (docs/security.md, CKV_K8S_11); the request reserves its cores.
        "resources": {
            "requests": {"cpu": f"{size.cpu_millis}m", "memory": _quantity(size.memory_bytes), placement.GPU_RESOURCE: gpu},
            "limits": {"memory": _quantity(size.memory_bytes), placement.GPU_RESOURCE: gpu},
        },
        # vLLM binds its port only after weights and compile are done
        # (https://github.com/vllm-project/vllm/blob/main/vllm/entrypoints/launcher.py), so
        # /health refuses connections while loading. The start-up probe owns that phase with
        # a budget derived from the weights size; liveness starts only after it succeeds, so
        # no probe kills a pod that is still loading.
        "startupProbe": probe | {"timeoutSeconds": 5,
                                 "failureThreshold": -(-m.startup_budget_seconds // tuning.PROBE_PERIOD_SECONDS)},
        "readinessProbe": readiness_probe(),
        "livenessProbe": probe | {"timeoutSeconds": 10, "failureThreshold": 6},
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
    }
    spec = {
        "replicas": m.replicas,
        "selector": {"matchLabels": selector(m.name)},
        # Keep the old pod serving until the new one has loaded.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "progressDeadlineSeconds": m.rollout_timeout_seconds,
        "revisionHistoryLimit": 3,
        "template": {
            "metadata": {"labels": pod_labels(m.name, m.pooled is not None), **({"annotations": extras.pod_annotations} if extras.pod_annotations else {})},
            "spec": {
                "serviceAccountName": m.name,
                # No pod calls the Kubernetes API. IRSA does not need this token: the EKS pod
                # identity webhook adds its own projected `aws-iam-token` volume
                # (https://github.com/aws/amazon-eks-pod-identity-webhook,
                # https://docs.aws.amazon.com/eks/latest/userguide/iam-roles-for-service-accounts.html).
                "automountServiceAccountToken": False,
                # The pool, when the model names one, and always the instance type it was tuned for.
                "nodeSelector": ({placement.NODEPOOL_LABEL: m.pool} if m.pool else {}) | {
                    placement.INSTANCE_TYPE_LABEL: m.instance.instance_type,
                },
                "tolerations": [{"key": placement.GPU_TAINT_KEY, "operator": "Exists", "effect": placement.GPU_TAINT_EFFECT}],
                "initContainers": init_containers,
                "containers": [container],
                "volumes": volumes,
                "terminationGracePeriodSeconds": 60,
                "securityContext": pod_security_context(),
                **({"priorityClassName": m.priority_class_name} if m.priority_class_name else {}),
            },
        },
    }
    if not spec["template"]["spec"]["initContainers"]:
        del spec["template"]["spec"]["initContainers"]
    if extras.affinity is not None:
        spec["template"]["spec"]["affinity"] = extras.affinity
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": m.name,
            "namespace": namespace,
            "labels": labels(m.name),
            "annotations": {
                # What the Deployment was tuned from, so policies can re-check the decisions.
                f"{ANNOTATION_DOMAIN}/weights-bytes": str(m.weights_bytes),
                f"{ANNOTATION_DOMAIN}/chunk-bytes": str(m.loader.chunk_bytes),
                f"{ANNOTATION_DOMAIN}/concurrency": str(m.concurrency),
                f"{ANNOTATION_DOMAIN}/tensor-parallel-size": str(m.tensor_parallel_size),
                # Let `pulumi up` wait as long as Kubernetes itself would.
                "pulumi.com/timeoutSeconds": str(spec["progressDeadlineSeconds"]),
            },
        },
        "spec": spec,
    }


def service_spec(m: ServingPlan, namespace: Any, router_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """The model's one endpoint: in front of its vLLM pods, or of its routers' pods when a router
    fronts the model (`router_selector`), so clients keep one URL either way."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": m.name, "namespace": namespace, "labels": labels(m.name)},
        "spec": {
            "type": "ClusterIP",
            "selector": dict(router_selector) if router_selector else selector(m.name),
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def pdb_spec(m: ServingPlan, namespace: Any) -> dict[str, Any]:
    # maxUnavailable rather than minAvailable: a single-replica model must not block node
    # drains forever.
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": m.name, "namespace": namespace, "labels": labels(m.name)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(m.name)}},
    }


def service_account_spec(m: ServingPlan, namespace: str, role_arn: Any = None) -> dict[str, Any]:
    """The model's ServiceAccount; `role_arn` (a string or a Pulumi Input) is the IRSA role."""
    meta: dict[str, Any] = {"name": m.name, "namespace": namespace, "labels": labels(m.name)}
    if role_arn is not None:
        meta["annotations"] = {IRSA_ROLE_ANNOTATION: role_arn}
    # The IRSA webhook mounts its own projected token; the pod never calls the Kubernetes API.
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta, "automountServiceAccountToken": False}
