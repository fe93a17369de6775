"""The pod-side scripts (warmstart/podside/) as one built artifact each, and their ConfigMaps (pure).

The scripts need only the Python standard library (and boto3), so they run in the model's own
vLLM image or the router's: no extra image to pull, build or pin. Each entry point ships as one
zip application (https://docs.python.org/3/library/zipapp.html): the `podside` package's modules
the entry runs, a root `__main__.py` that runs the entry as `python3 <entry>.py` would, and where
an entry needs one a pinned pure-Python distribution (the front queue's HTTP/1.1 implementation,
h11). `python3 <folder>/<entry>.pyz` puts the zip first on sys.path
(https://docs.python.org/3/library/sys_path_init.html), so the package's relative imports
resolve inside it, even under `-I`.

Why a zip and not the package's files placed in sub-folders with a volume's `items[].path`
(https://kubernetes.io/docs/concepts/configuration/configmap/#using-configmaps-as-files-from-a-pod):
the sub-folder layout needs one key per file plus a path for each, listed again in every pod's
volume (ten pod templates, each drifting from the package by hand), and the pod still has to be
told where the package root is. A zip is one key, one file to run, built from the same package
the tests import; what it holds is listed on the ConfigMap (the `artifact-files` annotation), so
a render's diff still names the module that changed.

The build is deterministic, so the same sources give the same bytes on every machine and a pod
rolls only when what it runs changed: entries sorted, each stamped 1980-01-01 00:00:00 (the zip
format's earliest time) with mode 0644, stored uncompressed (deflate's output depends on the zlib
build, zlib-ng or not, which would make two machines' renders differ).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
import io
import zipfile
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ..decisions.placement import ANNOTATION_DOMAIN

#: A ConfigMap holds at most 1 MiB of data
#: (https://kubernetes.io/docs/concepts/configuration/configmap/#motivation).
MAX_CONFIG_MAP_BYTES = 1 << 20

#: The zip's top-level package: warmstart/podside, under a name of its own so that the artifact
#: holds nothing of warmstart but the pod-side code.
PACKAGE = "podside"
ARTIFACT_SUFFIX = ".pyz"
FILES_ANNOTATION = f"{ANNOTATION_DOMAIN}/artifact-files"
DIGEST_ANNOTATION = f"{ANNOTATION_DOMAIN}/artifact-sha256"
CARRIES_ANNOTATION = f"{ANNOTATION_DOMAIN}/artifact-carries"
_EPOCH = (1980, 1, 1, 0, 0, 0)
_MODE = 0o100644 << 16  # a regular file, rw-r--r--, in the high bits of external_attr (Unix)


@dataclass(frozen=True)
class Entry:
    """One entry point: the podside module it runs (a package runs its `__main__`), the parts of
    warmstart/podside it carries (a module file, or a package folder with all its modules), and
    the pinned pure-Python distributions it carries (their version pinned in pyproject.toml)."""

    module: str
    parts: tuple[str, ...]
    carries: tuple[str, ...] = ()


#: Every artifact, by its key (`<entry>.pyz`). tests/pod_scripts/ checks that each carries every
#: module its code imports, and runs each one built.
ENTRIES: dict[str, Entry] = {
    "compile_cache.pyz": Entry("compile_cache", ("common", "compile_cache")),
    "weights_import.pyz": Entry("weights_import", ("common", "weights_import")),
    "weights_stage.pyz": Entry("weights_stage", ("common", "weights_stage")),
    # Pool mode (standby/pool_mode.py) reads the hosts through engine_host/pool.py's arbitration.
    "standby.pyz": Entry("standby", ("common", "standby", "engine_host")),
    "first_token.pyz": Entry("first_token", ("common", "first_token.py")),
    "bench_loader.pyz": Entry("bench_loader", ("common", "bench_loader.py")),
    "weights_select.pyz": Entry("weights_select", ("common", "weights_select.py")),
    "nvme_check.pyz": Entry("nvme_check", ("nvme_check.py",)),
    "metrics_proxy.pyz": Entry("metrics_proxy", ("metrics_proxy.py",)),
    # The router image's Python has no h11; the front queue carries its own (issue 39).
    "front_queue.pyz": Entry("front_queue", ("front_queue.py",), carries=("h11",)),
    # The pooled standby's engine-host supervisor (issue 38): a standby pool's hosts run it
    # (manifests/standby_pool.py, shipped per pool as `<pool>-engine-host-script`).
    "engine_host.pyz": Entry("engine_host", ("common", "engine_host")),
}


def _root_main(module: str) -> str:
    return (f'"""Built by warmstart/manifests/pod_scripts.py: runs {PACKAGE}.{module} as `python3 {module}.py` '
            'would."""\n\nimport runpy\n\n'
            f'runpy.run_module("{PACKAGE}.{module}", run_name="__main__", alter_sys=True)\n')


def _podside_files(part: str) -> dict[str, bytes]:
    """warmstart/podside's files of one part, by their path in the zip."""
    root = resources.files("warmstart.podside")
    if part.endswith(".py"):
        return {f"{PACKAGE}/{part}": root.joinpath(part).read_bytes()}
    folder = root.joinpath(part)
    return {f"{PACKAGE}/{part}/{f.name}": f.read_bytes() for f in folder.iterdir()
            if f.name.endswith(".py") and f.is_file()}


def _distribution_files(name: str) -> tuple[str, dict[str, bytes]]:
    """An installed distribution's `name==version` and its modules and license files, by their
    path in the zip (as installed: the package's folder, the license under its .dist-info)."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"a pod script carries {name}, which is not installed here; run "
                           "`pip install -e .` (pyproject.toml pins it)") from None
    out: dict[str, bytes] = {}
    for path in dist.files or ():
        parts = path.parts
        is_module = path.suffix == ".py" and "__pycache__" not in parts and not parts[0].endswith(".dist-info")
        is_license = parts[0].endswith(".dist-info") and path.name.upper().startswith(("LICENSE", "COPYING"))
        if is_module or is_license:
            out[path.as_posix()] = path.locate().read_bytes()  # type: ignore[union-attr]
    if not any(p.endswith(".py") for p in out):
        raise RuntimeError(f"the installed {name} lists no Python modules to carry")
    return f"{dist.metadata['Name']}=={dist.version}", out


@dataclass(frozen=True)
class Artifact:
    """One built zip application: its bytes, the files it holds (path, sha256) sorted, and the
    distributions it carries (`name==version`)."""

    key: str
    blob: bytes
    files: tuple[tuple[str, str], ...]
    carries: tuple[str, ...]

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.blob).hexdigest()


@functools.lru_cache(maxsize=None)
def build(key: str) -> Artifact:
    """The artifact `key` (`<entry>.pyz`), built once per process."""
    entry = ENTRIES[key]
    files: dict[str, bytes] = {"__main__.py": _root_main(entry.module).encode()}
    for part in ("__init__.py", *entry.parts):
        files.update(_podside_files(part))
    carries = []
    for name in entry.carries:
        pinned, dist_files = _distribution_files(name)
        carries.append(pinned)
        files.update(dist_files)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for path in sorted(files):
            info = zipfile.ZipInfo(path, date_time=_EPOCH)
            info.create_system = 3  # Unix, whatever machine renders
            info.external_attr = _MODE
            zf.writestr(info, files[path])
    listing = tuple((p, hashlib.sha256(files[p]).hexdigest()) for p in sorted(files))
    return Artifact(key, buf.getvalue(), listing, tuple(carries))


def script_files(key: str) -> tuple[str, ...]:
    """The paths the artifact `key` holds, sorted."""
    return tuple(p for p, _ in build(key).files)


def script_digest(key: str) -> str:
    """Short digest of the artifact `key`, for a pod annotation that rolls exactly the pods that
    run it onto a new version of anything it holds."""
    return build(key).digest[:16]


def files_annotation(artifact: Artifact) -> str:
    """One line per file the artifact holds: its path and the first 12 hex digits of its sha256."""
    return "".join(f"{path} {sha[:12]}\n" for path, sha in artifact.files)


def config_map_spec(name: str, namespace: Any, script_key: str) -> dict[str, Any]:
    """The ConfigMap `name` holding the artifact `script_key` as its one binaryData key, with
    what the artifact holds in its annotations."""
    artifact = build(script_key)
    encoded = base64.b64encode(artifact.blob).decode()
    annotations = {FILES_ANNOTATION: files_annotation(artifact), DIGEST_ANNOTATION: artifact.digest}
    if artifact.carries:
        annotations[CARRIES_ANNOTATION] = ", ".join(artifact.carries)
    size = len(script_key) + len(encoded) + sum(len(k) + len(v.encode()) for k, v in annotations.items())
    if size > MAX_CONFIG_MAP_BYTES:  # a programming error, caught by the renders' tests
        raise ValueError(f"ConfigMap {name}: {script_key} is {size} bytes encoded, over the "
                         f"{MAX_CONFIG_MAP_BYTES} bytes a ConfigMap holds; split the entry point")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "warmstart",
                                "app.kubernetes.io/managed-by": "pulumi"},
                     "annotations": annotations},
        "binaryData": {script_key: encoded},
    }
