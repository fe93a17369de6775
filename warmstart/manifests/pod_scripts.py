"""The pod-side scripts (warmstart/podside/*.py) and the ConfigMaps that carry them (pure).

The scripts need only the Python standard library (and boto3), so they run in the model's own
vLLM image: no extra image to pull, build or pin. A script may import sibling modules of
warmstart/podside (the code the scripts share, the parts of a long one): its ConfigMap carries
them as further keys, which a pod that mounts the ConfigMap sees as files of one folder
(https://kubernetes.io/docs/concepts/configuration/configmap/#using-configmaps-as-files-from-a-pod),
and `python3 <folder>/<script>.py` puts that folder first on sys.path
(https://docs.python.org/3/library/sys.html#sys.path), so the imports resolve there. A key
cannot hold "/", so the modules are flat files of the one folder.
"""

from __future__ import annotations

import ast
import hashlib
from importlib import resources
from typing import Any

#: A ConfigMap holds at most 1 MiB of data
#: (https://kubernetes.io/docs/concepts/configuration/configmap/#motivation).
MAX_CONFIG_MAP_BYTES = 1 << 20


def script_source(key: str) -> str:
    """The text of warmstart/podside/<key>."""
    return resources.files("warmstart.podside").joinpath(key).read_text()


def _sibling_imports(source: str) -> set[str]:
    """The keys of the podside modules `source` imports: its relative imports (`from . import x`,
    `from .x import y`), which each script mirrors with a flat import for the ConfigMap's folder."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            found.update(f"{name}.py" for name in names)
    return found


def script_files(key: str) -> tuple[str, ...]:
    """`key` first, then the podside modules it imports at any depth, sorted: the files its
    ConfigMap carries."""
    seen, todo = {key}, [key]
    while todo:
        for dep in _sibling_imports(script_source(todo.pop())) - seen:
            seen.add(dep)
            todo.append(dep)
    return (key, *sorted(seen - {key}))


def script_digest(key: str) -> str:
    """Short digest of a script and the modules it imports, for a pod annotation that rolls pods
    onto a new version of any of them. A script that imports none keeps the digest of its text."""
    files = script_files(key)
    if len(files) == 1:
        return hashlib.sha256(script_source(key).encode()).hexdigest()[:16]
    h = hashlib.sha256()
    for name in files:
        h.update(f"{name}\0{hashlib.sha256(script_source(name).encode()).hexdigest()}\n".encode())
    return h.hexdigest()[:16]


def config_map_spec(name: str, namespace: Any, script_key: str) -> dict[str, Any]:
    """The ConfigMap `name` holding one script under the key `script_key`, and the podside
    modules it imports under theirs."""
    data = {key: script_source(key) for key in script_files(script_key)}
    size = sum(len(k.encode()) + len(v.encode()) for k, v in data.items())
    if size > MAX_CONFIG_MAP_BYTES:  # a programming error, caught by the renders' tests
        raise ValueError(f"ConfigMap {name}: {script_key} and its modules are {size} bytes, over the "
                         f"{MAX_CONFIG_MAP_BYTES} bytes a ConfigMap holds; split the script's ConfigMap")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "warmstart",
                                "app.kubernetes.io/managed-by": "pulumi"}},
        "data": data,
    }
