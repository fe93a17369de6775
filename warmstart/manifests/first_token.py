"""The first-token sidecar of the serving pod: the wiring around warmstart/podside/first_token.py.

A native sidecar (restartPolicy Always) that waits for vLLM's /health, times one max_tokens=1
completion and uploads the pod's cold-start record to the compile-cache bucket under
`<model>/coldstart/`, where the serving role may already write (`cachekey.cache_key_prefix`).
Pure: it returns dicts; the serving component adds them to the pod.
"""

from __future__ import annotations

from typing import Any

from ..decisions import cachekey
from ..plan.records import ServingPlan
from . import node_cache, pod_scripts
from .serving import ANNOTATION_DOMAIN, IMAGE_PULL_POLICY, PodExtras, container_security_context

CONFIGMAP_NAME = "warmstart-first-token"
SCRIPT_KEY = "first_token.pyz"
SCRIPT_VOLUME = "warmstart-first-token"
SCRIPT_MOUNT = "/opt/warmstart-first-token"
CONTAINER = "first-token"
# The emptyDir the init containers share their outcome files in (podside/first_token.py's file
# contract); the compile-cache wiring mounts its state volume at the same path.
STATE_MOUNT = "/run/warmstart"
SCRIPT_ANNOTATION = f"{ANNOTATION_DOMAIN}/first-token-sha256"
# Env the vLLM container needs so the report can read its loader and its log (vLLM prints an
# ASCII logo otherwise, and the Run:ai streamer's timing line is dropped without a stderr handler:
# https://github.com/run-ai/runai-model-streamer/blob/master/docs/src/env-vars.md).
VLLM_REPORT_ENV = ({"name": "RUNAI_STREAMER_LOG_TO_STDERR", "value": "1"},
                   {"name": "VLLM_DISABLE_LOG_LOGO", "value": "1"})


def record_prefix(model: str) -> str:
    """Key prefix of a model's cold-start records in the compile-cache bucket."""
    return f"{cachekey.cache_key_prefix(model)}coldstart/"


def first_token_container(m: ServingPlan, bucket: Any, region: str, state_volume: str | None = None,
                          weights_choice: bool = False) -> dict[str, Any]:
    """The sidecar container. `bucket`: the compile-cache bucket's name (a string or a Pulumi
    Input; None: the probe runs and logs, no record is kept). `state_volume`: the pod's shared
    state emptyDir (the compile-cache wiring's `compile-cache-state`), mounted read-only.
    `weights_choice`: the pod has the node cache's picker, whose choice file (its own volume,
    `node_cache.compile_cache_choice_wiring`) is mounted read-only, so the record's
    `flags.node_cache` says hit or miss."""
    values: dict[str, Any] = {
        "WARMSTART_HEALTH_URL": f"http://127.0.0.1:{m.serving_port}/health",
        "WARMSTART_COMPLETIONS_URL": f"http://127.0.0.1:{m.serving_port}/v1/completions",
        "WARMSTART_SERVED_MODEL": m.name,
        "WARMSTART_MODEL": m.name,
        "WARMSTART_INSTANCE_TYPE": m.instance.instance_type,
        # The first start of a large model may take its whole start-up budget to get healthy.
        "WARMSTART_HEALTH_TIMEOUT_S": str(m.startup_budget_seconds * 2),
        "WARMSTART_REQUEST_TIMEOUT_S": "60",
        "WARMSTART_CACHE_BUCKET": "" if bucket is None else bucket,
        "WARMSTART_RECORD_PREFIX": record_prefix(m.name),
        "WARMSTART_STATE_DIR": STATE_MOUNT,
        "AWS_REGION": region,
        "AWS_DEFAULT_REGION": region,
    }
    choice_env, choice_mount = node_cache.compile_cache_choice_wiring()
    # Empty: no picker in this pod, nothing to read (the record says no node cache).
    values[choice_env["name"]] = choice_env["value"] if weights_choice else ""
    env = [{"name": k, "value": v} for k, v in sorted(values.items())]
    env += [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}}
            for n, f in (("NODE_NAME", "spec.nodeName"), ("POD_NAME", "metadata.name"),
                         ("POD_NAMESPACE", "metadata.namespace"))]
    mounts = [{"name": SCRIPT_VOLUME, "mountPath": SCRIPT_MOUNT, "readOnly": True}]
    if state_volume:
        mounts.append({"name": state_volume, "mountPath": STATE_MOUNT, "readOnly": True})
    if weights_choice:
        mounts.append(choice_mount)
    return {
        "name": CONTAINER,
        "image": m.image,
        "command": ["python3", f"{SCRIPT_MOUNT}/{SCRIPT_KEY}"],
        "env": env,
        "volumeMounts": mounts,
        "restartPolicy": "Always",
        "imagePullPolicy": IMAGE_PULL_POLICY,
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
        "securityContext": container_security_context(),
    }


def first_token_extras(m: ServingPlan, bucket: Any, region: str, config_map: str = CONFIGMAP_NAME,
                       state_volume: str | None = None, weights_choice: bool = False) -> PodExtras:
    """The sidecar, its script volume, the two vLLM env vars and the script-digest annotation.
    `weights_choice`: merge `node_cache.serving_extras` too (it defines the choice volume)."""
    return PodExtras(
        init_containers=(first_token_container(m, bucket, region, state_volume, weights_choice),),
        volumes=({"name": SCRIPT_VOLUME, "configMap": {"name": config_map}},),
        env=VLLM_REPORT_ENV,
        pod_annotations={SCRIPT_ANNOTATION: pod_scripts.script_digest(SCRIPT_KEY)},
    )
