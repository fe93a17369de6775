"""The pod-side scripts (warmstart/podside/*.py) and the ConfigMaps that carry them (pure).

The scripts need only the Python standard library (and boto3), so they run in the model's own
vLLM image: no extra image to pull, build or pin.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any


def script_source(key: str) -> str:
    """The text of warmstart/podside/<key>."""
    return resources.files("warmstart.podside").joinpath(key).read_text()


def script_digest(key: str) -> str:
    """Short digest of a script, for a pod annotation that rolls pods onto a new version."""
    return hashlib.sha256(script_source(key).encode()).hexdigest()[:16]


def config_map_spec(name: str, namespace: Any, script_key: str) -> dict[str, Any]:
    """The ConfigMap `name` holding one script under the key `script_key`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "warmstart",
                                "app.kubernetes.io/managed-by": "pulumi"}},
        "data": {script_key: script_source(script_key)},
    }
