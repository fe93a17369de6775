"""PodScript alone, from its own arguments under Pulumi mocks: one ConfigMap that carries the
pod-side script byte for byte, in the namespace it is given."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate

from components.pod_scripts import PodScript
from warmstart import mocks
from warmstart.manifests import nvme_check
from warmstart.podside import nvme_check as script


def test_a_pod_script_is_one_configmap_carrying_the_script_as_shipped():
    resources = mocks.run(lambda: PodScript("m-nvme-check", "ml", nvme_check.CONFIGMAP_NAME, nvme_check.SCRIPT_KEY),
                          region="us-east-1", stack="alone")
    (cm,) = [r.inputs for r in resources if r.typ == "kubernetes:core/v1:ConfigMap"]
    assert (cm["metadata"]["name"], cm["metadata"]["namespace"]) == (nvme_check.CONFIGMAP_NAME, "ml")
    assert cm["data"] == {nvme_check.SCRIPT_KEY: Path(script.__file__).read_text()}
    kubernetes_validate.validate(cm, "1.33", strict=True)
    assert {r.typ for r in resources} == {"warmstart:serving:PodScript", "kubernetes:core/v1:ConfigMap"}


# ---- a script and the podside modules it imports, shipped as one folder ---------------------

import subprocess  # noqa: E402 - the section's own imports
import sys  # noqa: E402

import pytest  # noqa: E402

from warmstart.manifests import pod_scripts  # noqa: E402

PODSIDE = Path(script.__file__).parent
#: Every file of warmstart/podside that a pod runs: the ones with a command line.
ENTRY_POINTS = sorted(p.name for p in PODSIDE.glob("*.py") if 'if __name__ == "__main__":' in p.read_text())


def _import_from_folder_alone(folder: Path, key: str) -> subprocess.CompletedProcess[str]:
    """Import `key` the way `python3 <folder>/<key>` resolves its imports: the folder first on
    sys.path, the working directory elsewhere, so nothing of the repository can stand in."""
    probe = f"import sys; sys.path.insert(0, {str(folder)!r}); import {key.removesuffix('.py')} as m; print(m.__file__)"
    return subprocess.run([sys.executable, "-c", probe], cwd=folder.parent, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.servers  # starts an interpreter
@pytest.mark.parametrize("key", ENTRY_POINTS)
def test_each_script_runs_from_its_configmap_folder_alone(tmp_path: Path, key: str):
    data = pod_scripts.config_map_spec("cm", "ns", key)["data"]
    folder = tmp_path / "opt"
    folder.mkdir()
    for name, text in data.items():
        (folder / name).write_text(text)
    proc = _import_from_folder_alone(folder, key)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).parent == folder


@pytest.mark.servers  # starts an interpreter
def test_a_folder_without_a_module_the_script_imports_fails_to_import(tmp_path: Path):
    files = pod_scripts.script_files("compile_cache.py")
    assert len(files) > 1, files
    folder = tmp_path / "opt"
    folder.mkdir()
    for name in files[:-1]:
        (folder / name).write_text(pod_scripts.script_source(name))
    proc = _import_from_folder_alone(folder, "compile_cache.py")
    assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, proc.stderr


def test_every_shipped_configmap_fits_the_limit():
    for key in ENTRY_POINTS:
        data = pod_scripts.config_map_spec("cm", "ns", key)["data"]
        assert sum(len(k.encode()) + len(v.encode()) for k, v in data.items()) <= pod_scripts.MAX_CONFIG_MAP_BYTES


def test_the_digest_changes_with_every_file_a_script_ships(monkeypatch):
    key = "compile_cache.py"
    files, before = pod_scripts.script_files(key), pod_scripts.script_digest(key)
    real = pod_scripts.script_source
    for name in files:
        monkeypatch.setattr(pod_scripts, "script_source", lambda k, n=name: real(k) + ("#\n" if k == n else ""))
        assert pod_scripts.script_digest(key) != before, name
    monkeypatch.undo()
    assert pod_scripts.script_digest(key) == before


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
