"""PodScript alone, from its own arguments under Pulumi mocks: one ConfigMap that carries the
pod-side script's built artifact byte for byte, in the namespace it is given; and the artifacts
themselves (warmstart/manifests/pod_scripts.py): deterministic, self-sufficient, within the limit."""

from __future__ import annotations

import ast
import base64
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import kubernetes_validate
import pytest

from components.pod_scripts import PodScript
from tests.support.pod_scripts import artifact
from warmstart import mocks
from warmstart.manifests import nvme_check, pod_scripts

PODSIDE = Path(pod_scripts.__file__).parents[1] / "podside"
ROOT = PODSIDE.parents[1]


def test_a_pod_script_is_one_configmap_carrying_the_artifact_as_built():
    resources = mocks.run(lambda: PodScript("m-nvme-check", "ml", nvme_check.CONFIGMAP_NAME, nvme_check.SCRIPT_KEY),
                          region="us-east-1", stack="alone")
    (cm,) = [r.inputs for r in resources if r.typ == "kubernetes:core/v1:ConfigMap"]
    assert (cm["metadata"]["name"], cm["metadata"]["namespace"]) == (nvme_check.CONFIGMAP_NAME, "ml")
    assert "data" not in cm and list(cm["binaryData"]) == [nvme_check.SCRIPT_KEY]
    assert base64.b64decode(cm["binaryData"][nvme_check.SCRIPT_KEY]) == artifact(nvme_check.SCRIPT_KEY).read_bytes()
    kubernetes_validate.validate(cm, "1.33", strict=True)
    assert {r.typ for r in resources} == {"warmstart:serving:PodScript", "kubernetes:core/v1:ConfigMap"}


# ---- the artifacts -------------------------------------------------------------------------

KEYS = sorted(pod_scripts.ENTRIES)


def _names(blob: bytes) -> list[str]:
    return zipfile.ZipFile(io.BytesIO(blob)).namelist()


@pytest.mark.parametrize("key", KEYS)
def test_an_artifact_is_a_sorted_zip_with_a_root_main_and_fixed_stamps(key):
    blob = pod_scripts.build(key).blob
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        infos = zf.infolist()
        assert [i.filename for i in infos] == sorted(i.filename for i in infos)
        assert "__main__.py" in zf.namelist()
        assert {(i.date_time, i.compress_type, i.external_attr >> 16) for i in infos} == {
            ((1980, 1, 1, 0, 0, 0), zipfile.ZIP_STORED, 0o100644)}
        for path, sha in pod_scripts.build(key).files:
            import hashlib
            assert hashlib.sha256(zf.read(path)).hexdigest() == sha, path
    assert pod_scripts.script_files(key) == tuple(sorted(_names(blob)))


@pytest.mark.servers  # starts an interpreter
def test_an_artifact_is_the_same_bytes_in_another_process():
    """What the render ships must not depend on the process or machine that built it (set order,
    time, hash seed): a fresh interpreter builds every artifact to the same digests."""
    probe = ("from warmstart.manifests import pod_scripts as p; "
             "print(' '.join(p.build(k).digest for k in sorted(p.ENTRIES)))")
    env = os.environ | {"PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [pod_scripts.build(k).digest for k in KEYS]


def _relative_targets(path: str, source: str) -> set[str]:
    """The zip paths (module or package __init__) that the relative imports of `path` name."""
    found = set()
    package = path.split("/")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1]
            mod = base + (node.module.split(".") if node.module else [])
            found.add("/".join(mod))
    return found


@pytest.mark.parametrize("key", KEYS)
def test_an_artifact_carries_every_module_its_code_imports(key):
    with zipfile.ZipFile(io.BytesIO(pod_scripts.build(key).blob)) as zf:
        names = set(zf.namelist())
        for path in sorted(n for n in names if n.startswith(f"{pod_scripts.PACKAGE}/") and n.endswith(".py")):
            for target in _relative_targets(path, zf.read(path).decode()):
                assert f"{target}.py" in names or f"{target}/__init__.py" in names, (key, path, target)


def test_every_podside_entry_point_is_shipped():
    """A module or package of warmstart/podside that runs as a script has an artifact, except the
    wake bench, which runs over the exec API as `python3 -c <source>` (one self-contained file)."""
    runnable = {p.stem for p in PODSIDE.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()}
    runnable |= {p.parent.name for p in PODSIDE.glob("*/__main__.py")}
    assert runnable - {"wake_bench"} == {e.module for e in pod_scripts.ENTRIES.values()}


def test_every_shipped_configmap_fits_the_limit():
    for key in KEYS:
        spec = pod_scripts.config_map_spec("cm", "ns", key)
        size = sum(len(k) + len(v) for k, v in spec["binaryData"].items())
        size += sum(len(k) + len(v.encode()) for k, v in spec["metadata"]["annotations"].items())
        assert size <= pod_scripts.MAX_CONFIG_MAP_BYTES, (key, size)


def test_an_artifact_over_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(pod_scripts, "MAX_CONFIG_MAP_BYTES", 1000)
    with pytest.raises(ValueError, match="over the 1000 bytes a ConfigMap holds"):
        pod_scripts.config_map_spec("cm", "ns", "nvme_check.pyz")


def test_the_digest_changes_with_every_file_an_artifact_holds_and_only_its_own(monkeypatch):
    """A change to one module rolls the pods of the artifacts that carry it, and no other."""
    key = "compile_cache.pyz"
    digests = {k: pod_scripts.script_digest(k) for k in KEYS}
    real = pod_scripts._podside_files
    for path in [p for p in pod_scripts.script_files(key) if p.startswith(f"{pod_scripts.PACKAGE}/")]:
        def edited(part, path=path):
            return {p: b + (b"#\n" if p == path else b"") for p, b in real(part).items()}
        monkeypatch.setattr(pod_scripts, "_podside_files", edited)
        pod_scripts.build.cache_clear()
        for k in KEYS:
            carries = path in pod_scripts.script_files(k)
            assert (pod_scripts.script_digest(k) != digests[k]) == carries, (path, k)
    monkeypatch.undo()
    pod_scripts.build.cache_clear()
    assert {k: pod_scripts.script_digest(k) for k in KEYS} == digests


def test_the_front_queue_carries_h11_at_the_version_pyproject_pins():
    """The one pin (pyproject.toml) is what the artifact carries, and its file list says so."""
    import tomllib

    pins = [d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
            if d.split("==")[0].strip().lower() == "h11"]
    assert pins == [pod_scripts.build("front_queue.pyz").carries[0].lower()], pins
    spec = pod_scripts.config_map_spec("cm", "ns", "front_queue.pyz")
    assert spec["metadata"]["annotations"][pod_scripts.CARRIES_ANNOTATION] == pins[0]
    files = spec["metadata"]["annotations"][pod_scripts.FILES_ANNOTATION]
    assert "h11/__init__.py " in files and "/LICENSE" in files, files
    assert not any("h11" in p for k in KEYS if k != "front_queue.pyz" for p in pod_scripts.script_files(k))


#: The oldest Python of the images that run the scripts: the vLLM image's (vllm/vllm-openai, built
#: with PYTHON_VERSION=3.12 in its docker/Dockerfile) and the router's (SMG's image, Ubuntu 24.04's
#: python3, 3.12). An interpreter of that version without the project's packages, if this machine
#: has one; else the tests' own.
_PYENV = Path("/root/.pyenv/versions")
BARE_PYTHON = next((str(p / "bin" / "python3") for p in sorted(_PYENV.glob("3.12.*")) if (p / "bin/python3").is_file()),
                   sys.executable)


@pytest.mark.servers  # starts an interpreter
def test_the_front_queue_artifact_runs_where_h11_is_not_installed(tmp_path):
    """`-I -S`: no site-packages, no PYTHONPATH, no working directory on sys.path; h11 comes from
    the zip or not at all."""
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nsys.path.insert(0, sys.argv[1])\nimport h11\nprint(h11.__file__, h11.__version__)\n")
    zipped = artifact("front_queue.pyz")
    out = subprocess.run([BARE_PYTHON, "-I", "-S", str(probe), str(zipped)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{zipped}/h11/__init__.py "), out.stdout
    bare = subprocess.run([BARE_PYTHON, "-I", "-S", "-c", "import h11"], capture_output=True, text=True, timeout=60)
    assert bare.returncode != 0 and "No module named 'h11'" in bare.stderr, "this interpreter has h11 of its own"
    # and the artifact itself starts there: --help parses its arguments and exits 0
    ran = subprocess.run([BARE_PYTHON, "-I", "-S", str(zipped), "--help"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0 and "--port" in ran.stdout, ran.stderr


@pytest.mark.servers  # starts an interpreter
@pytest.mark.parametrize("key", KEYS)
def test_every_artifact_starts_on_the_images_python_with_the_standard_library_alone(tmp_path, key):
    """`--help` of each artifact on the images' Python version, `-I -S`: its modules import from
    the zip alone (boto3 and botocore are imported where a script talks to S3, not at import).
    The bench loader takes no arguments and refuses its empty environment with its own line."""
    ran = subprocess.run([BARE_PYTHON, "-I", "-S", str(artifact(key)), "--help"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={"WARMSTART_TERMINATION_LOG": str(tmp_path / "log"),
                                                     # the picker takes no --help and writes its choice:
                                                     # never into this machine's /run
                                                     "WARMSTART_WEIGHTS_OUT": str(tmp_path / "weights-out")})
    assert "Traceback" not in ran.stderr and ran.stdout, (key, ran.stdout, ran.stderr)
    assert ran.returncode == (1 if key == "bench_loader.pyz" else 0), (key, ran.stdout, ran.stderr)


# ---- the ConfigMaps' names: one naming function, which the model-name clash rule knows -------

from components.platform import POD_SCRIPTS  # noqa: E402
from warmstart.decisions import naming  # noqa: E402


from warmstart.manifests import routing as router_objects  # noqa: E402

# The router's front queue has no copy of a model's own: ModelRouter mounts the namespace's (its
# `frontQueueRetryAfterSeconds` says so).
NO_OWN_COPY = {router_objects.FRONT_QUEUE_CONFIGMAP}


@pytest.mark.parametrize("shared", [config_map for _, config_map, _ in POD_SCRIPTS if config_map not in NO_OWN_COPY])
def test_a_models_own_copy_of_every_shipped_script_is_a_name_derived_from_the_model(shared):
    """Each script a platform ships once per namespace is mounted from that shared ConfigMap, or
    (a model alone) from the model's own copy: a name the stack's model-name clash rule counts as
    the model's, so no second model can be named like it."""
    assert naming.script_config_map(shared, "llama", own=False) == shared
    own = naming.script_config_map(shared, "llama", own=True)
    assert own != shared and naming.derived_from(own, "llama") is not None, (
        f"{own} is not in warmstart/decisions/naming.py MODEL_NAME_SUFFIXES: add its suffix")
    assert naming.derived_from(shared, "llama") is None
