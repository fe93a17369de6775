"""vLLM Deployments: eager mode, streamer concurrency, GPUs per pod, startup probe.

The streamer rules (concurrency = ceil(weights / chunk), RUNAI_STREAMER_CHUNK_BYTESIZE,
`distributed` loading incompatible with `--enforce-eager`) and the compile cache that
`--enforce-eager` never writes are from "Accelerate model loading on Amazon EKS",
https://docs.aws.amazon.com/eks/latest/userguide/ml-inference-fast-model-loading.html.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ..decisions import placement, tuning

# The domain of the annotations warmstart writes on the Deployment; imported so the key is
# spelled once.
from ..decisions.placement import ANNOTATION_DOMAIN
from .records import Resource, Violation, as_list, k8s

GPU_RESOURCE = placement.GPU_RESOURCE
ANNOTATION_WEIGHTS = f"{ANNOTATION_DOMAIN}/weights-bytes"
ANNOTATION_CHUNK = f"{ANNOTATION_DOMAIN}/chunk-bytes"
ANNOTATION_CONCURRENCY = f"{ANNOTATION_DOMAIN}/concurrency"
ANNOTATION_TP = f"{ANNOTATION_DOMAIN}/tensor-parallel-size"
COMPILE_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "VLLM_CACHE_ROOT")
CHUNK_ENV = "RUNAI_STREAMER_CHUNK_BYTESIZE"
# A standby pool's engine host (manifests/standby_pool.py HOST_NAME): its one container runs the
# supervisor, which starts each member's engine with that member's own `vllm serve` arguments (its
# loader config among them, checked here on the member's own Deployment), from a spec ConfigMap.
ENGINE_HOST_NAME = "warmstart-engine-host"


def vllm_container(dep: Resource) -> Mapping[str, Any] | None:
    """The vLLM server container of a Deployment (command `vllm ...` or a vLLM image)."""
    for c in as_list(dep.get("spec", "template", "spec", "containers")):
        if not isinstance(c, Mapping):
            continue
        cmd = [x for x in as_list(c.get("command")) if isinstance(x, str)]
        image = c.get("image") if isinstance(c.get("image"), str) else ""
        if (cmd and cmd[0].rsplit("/", 1)[-1] == "vllm") or "vllm" in image.rsplit("/", 1)[-1]:
            return c
    return None


def flag(args: Sequence[Any], *names: str) -> str | None:
    """The value of `--name=value` or `--name value` in an argument list (last wins)."""
    value = None
    args = [a for a in args if isinstance(a, str)]
    for i, a in enumerate(args):
        for n in names:
            if a.startswith(n + "="):
                value = a[len(n) + 1:]
            elif a == n and i + 1 < len(args):
                value = args[i + 1]
    return value


def _args(c: Mapping[str, Any]) -> list[str]:
    return [a for a in [*as_list(c.get("command")), *as_list(c.get("args"))] if isinstance(a, str)]


def _env(c: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in as_list(c.get("env")) if isinstance(e, Mapping) and "name" in e}


def _loader_config(c: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = flag(_args(c), "--model-loader-extra-config")
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _annotation(dep: Resource, key: str) -> Any:
    ann = dep.get("metadata", "annotations", default={})
    return ann.get(key) if isinstance(ann, Mapping) else None


def _int(v: Any) -> int | None:
    """An integer from an annotation, a quantity string or a number; the engine's wire format
    carries every number as a double, so 2.0 is 2."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        return int(v) if v.is_integer() else None
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return None


def vllm_deployments(resources: Sequence[Resource]) -> list[Resource]:
    return [d for d in k8s(resources, "Deployment", "apps") if vllm_container(d) is not None]


def uses_compile_cache(c: Mapping[str, Any]) -> bool:
    env = _env(c)
    mounts = [m.get("mountPath") for m in as_list(c.get("volumeMounts")) if isinstance(m, Mapping)]
    return any(k in env for k in COMPILE_CACHE_ENV) or placement.COMPILE_CACHE_MOUNT in mounts


def check_vllm_eager(resources: Sequence[Resource]) -> list[Violation]:
    """`--enforce-eager` never runs with distributed loading or a compile cache: eager breaks
    distributed loading (error, or a silent fallback to rank-0 loading plus an NCCL
    broadcast) and never writes the compile cache."""
    policy = "vllm-no-eager-with-distributed-or-cache"
    found = []
    for dep in vllm_deployments(resources):
        c = vllm_container(dep)
        assert c is not None
        if "--enforce-eager" not in _args(c):
            continue
        loader = _loader_config(c) or {}
        if loader.get("distributed") is True:
            found.append(Violation(policy, dep, f"{dep.label()} runs --enforce-eager with distributed loading "
                                   "(--model-loader-extra-config distributed=true); eager breaks it; fix: drop "
                                   "--enforce-eager (warmstart: eager: false) or run at tensorParallelSize 1"))
        if uses_compile_cache(c):
            found.append(Violation(policy, dep, f"{dep.label()} runs --enforce-eager with a compile cache mounted; "
                                   "eager never writes it; fix: drop one (warmstart: eager: false or "
                                   "compileCache: false)"))
    return found


def check_vllm_loader_concurrency(resources: Sequence[Resource]) -> list[Violation]:
    """Streamer concurrency = ceil(weights / chunk) from the sizes the Deployment declares
    (annotations), and the chunk in effect (RUNAI_STREAMER_CHUNK_BYTESIZE) is the declared one."""
    policy = "vllm-loader-concurrency"
    found = []
    for dep in vllm_deployments(resources):
        c = vllm_container(dep)
        assert c is not None
        if dep.get("spec", "template", "metadata", "labels", "app.kubernetes.io/name") == ENGINE_HOST_NAME:
            continue
        weights, chunk, declared = (_int(_annotation(dep, k)) for k in (ANNOTATION_WEIGHTS, ANNOTATION_CHUNK,
                                                                        ANNOTATION_CONCURRENCY))
        if None in (weights, chunk, declared) or weights <= 0 or chunk <= 0:
            found.append(Violation(policy, dep, f"{dep.label()} does not declare positive integer annotations "
                                   f"{ANNOTATION_WEIGHTS}, {ANNOTATION_CHUNK} and {ANNOTATION_CONCURRENCY}; fix: "
                                   "deploy it through warmstart, which writes them"))
            continue
        expected = tuning.loader_concurrency(weights, max(chunk, tuning.MIN_S3_CHUNK_BYTES))
        if declared != expected:
            found.append(Violation(policy, dep, f"{dep.label()} declares concurrency {declared} for {weights} bytes "
                                   f"in {chunk}-byte chunks; the rule ceil(weights/chunk) gives {expected}; fix: "
                                   f"concurrency {expected}"))
        loader = _loader_config(c)
        if loader is None:
            found.append(Violation(policy, dep, f"{dep.label()} has no parseable --model-loader-extra-config, so the "
                                   "streamer runs with its default concurrency; fix: pass "
                                   f'--model-loader-extra-config={{"concurrency": {expected}, ...}}'))
        elif loader.get("concurrency") != declared:
            found.append(Violation(policy, dep, f"{dep.label()} streams with concurrency "
                                   f"{loader.get('concurrency')!r} but declares {declared}; fix: make them agree "
                                   f"({expected})"))
        env_chunk = _int(_env(c).get(CHUNK_ENV))
        if env_chunk != chunk:
            found.append(Violation(policy, dep, f"{dep.label()} declares {chunk}-byte chunks but "
                                   f"{CHUNK_ENV}={_env(c).get(CHUNK_ENV)!r}, so the concurrency is computed for "
                                   f"another chunk size; fix: set {CHUNK_ENV}={chunk}"))
    return found


def check_vllm_gpu_equals_tp(resources: Sequence[Resource]) -> list[Violation]:
    """The pod requests exactly tensor-parallel-size (x pipeline-parallel-size) GPUs: fewer and
    vLLM cannot start its ranks, more and GPUs sit idle and block other replicas."""
    policy = "vllm-gpu-request-equals-tp"
    found = []
    for dep in vllm_deployments(resources):
        c = vllm_container(dep)
        assert c is not None
        args = _args(c)
        tp = _int(flag(args, "--tensor-parallel-size", "-tp") or 1)
        pp = _int(flag(args, "--pipeline-parallel-size", "-pp") or 1)
        res = c.get("resources") if isinstance(c.get("resources"), Mapping) else {}
        req = _int((res.get("requests") or {}).get(GPU_RESOURCE)) if isinstance(res.get("requests"), Mapping) else None
        lim = _int((res.get("limits") or {}).get(GPU_RESOURCE)) if isinstance(res.get("limits"), Mapping) else None
        gpus = lim if lim is not None else req
        if tp is None or pp is None:
            found.append(Violation(policy, dep, f"{dep.label()}: --tensor-parallel-size / --pipeline-parallel-size "
                                   "is not an integer"))
            continue
        want = tp * pp
        if req is not None and lim is not None and req != lim:
            found.append(Violation(policy, dep, f"{dep.label()} requests {req} but limits {lim} {GPU_RESOURCE}; "
                                   "extended resources need requests == limits; fix: set both to "
                                   f"{want}"))
        if gpus != want:
            found.append(Violation(policy, dep, f"{dep.label()} gets {gpus if gpus is not None else 'no'} "
                                   f"{GPU_RESOURCE} but runs --tensor-parallel-size={tp}"
                                   f"{f' x --pipeline-parallel-size={pp}' if pp != 1 else ''}; fix: request "
                                   f"{want} GPU(s)"))
        ann_tp = _int(_annotation(dep, ANNOTATION_TP))
        if ann_tp is not None and ann_tp != tp:
            found.append(Violation(policy, dep, f"{dep.label()} declares {ANNOTATION_TP}={ann_tp} but runs "
                                   f"--tensor-parallel-size={tp}; fix: make them agree"))
    return found


def check_vllm_startup_probe(resources: Sequence[Resource]) -> list[Violation]:
    """A startup probe owns the loading phase, so liveness never kills a pod still streaming
    weights or compiling (vLLM binds its port only when ready)."""
    policy = "vllm-startup-probe"
    found = []
    for dep in vllm_deployments(resources):
        c = vllm_container(dep)
        assert c is not None
        probe = c.get("startupProbe")
        if not isinstance(probe, Mapping) or not any(k in probe for k in ("httpGet", "tcpSocket", "exec", "grpc")):
            found.append(Violation(policy, dep, f"{dep.label()} has no startup probe, so the liveness probe runs "
                                   "while weights stream and can kill a loading pod; fix: add a startupProbe on "
                                   "/health whose failureThreshold x periodSeconds covers the start-up budget"))
    return found
