"""vLLM's startup plan on a node: kept apart per memory setting (vLLM's own plan fingerprint leaves
--gpu-memory-utilization out), a folder per setting that the vLLM container mounts, and a key
factor, so S3 never hands a pod another setting's plan."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tests.podside.pods import BASE_ENV, leftovers
from warmstart.decisions import cachekey
from warmstart.podside.compile_cache import main as cc

PLAN = "vllm/startup_plan/startup_plan_0123456789abcdef.json"


def node_pod(cache_dir: Path, fingerprint: str) -> cc.Settings:
    # No bucket: pre-warm off, which must not switch the node-local guard off.
    return cc.Settings.from_env({**BASE_ENV, "WARMSTART_CACHE_DIR": str(cache_dir), "WARMSTART_CACHE_BUCKET": "",
                                 "WARMSTART_STARTUP_PLAN_FINGERPRINT": fingerprint})


def write_plan(cache_dir: Path) -> Path:
    plan = cache_dir / PLAN
    plan.parent.mkdir(parents=True, exist_ok=True)
    plan.write_text(json.dumps({"schema": 1, "kv_cache_memory_bytes": 1 << 34}))
    return plan


def _deployment(gpu_memory_utilization: float) -> dict:
    """prod's first model with the compile cache, rendered at a memory setting."""
    import tempfile

    from tests.support.stacks import load_stack_doc, render_doc

    doc = load_stack_doc("prod")
    doc["config"]["warmstart:models"][0]["gpuMemoryUtilization"] = gpu_memory_utilization
    rendered = render_doc(doc, Path(tempfile.mkdtemp()), f"prod-{int(gpu_memory_utilization * 100)}")
    name = doc["config"]["warmstart:models"][0]["name"]
    (dep,) = [o for o in rendered.kubernetes_objects if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    return dep


class NodeView:
    """A container's paths on the node, as the kubelet mounts them: each volumeMount of the
    compile-cache hostPath volume (with its subPath) onto `node`, the longest mountPath first."""

    def __init__(self, dep: dict, container: str, node: Path) -> None:
        spec = dep["spec"]["template"]["spec"]
        (c,) = [c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == container]
        (vol,) = [v for v in spec["volumes"] if v["name"] == "compile-cache"]
        assert vol["hostPath"]["type"] == "DirectoryOrCreate"
        self.env = {e["name"]: e.get("value") for e in c.get("env", [])}
        self.mounts = sorted(((m["mountPath"], node / m.get("subPath", "")) for m in c["volumeMounts"]
                              if m["name"] == "compile-cache"), key=lambda m: -len(m[0]))

    def host(self, path: str) -> Path:
        for mount, where in self.mounts:
            if path == mount or path.startswith(mount + "/"):
                return where / path[len(mount):].lstrip("/")
        raise AssertionError(f"{path} is not on the node's cache volume")


def _vllm_saves_plan(dep: dict, node: Path, kv_bytes: int) -> None:
    """What vLLM does after a profiled boot: write $VLLM_CACHE_ROOT/startup_plan/startup_plan_<fp>.json
    ($VLLM_CACHE_ROOT defaults to $XDG_CACHE_HOME/vllm), where the kubelet mounted it."""
    vllm = NodeView(dep, dep["spec"]["template"]["spec"]["containers"][0]["name"], node)
    plan = vllm.host(f"{vllm.env['XDG_CACHE_HOME']}/vllm/{PLAN.removeprefix('vllm/')}")
    plan.parent.mkdir(parents=True, exist_ok=True)  # the kubelet made the subPath folder exist
    plan.write_text(json.dumps({"schema": 1, "kv_cache_memory_bytes": kv_bytes}))


def _vllm_sees(dep: dict, node: Path) -> list[int]:
    vllm = NodeView(dep, dep["spec"]["template"]["spec"]["containers"][0]["name"], node)
    folder = vllm.host(f"{vllm.env['XDG_CACHE_HOME']}/vllm/startup_plan")
    return sorted(json.loads(p.read_text())["kv_cache_memory_bytes"] for p in folder.glob("*.json")) \
        if folder.is_dir() else []


def _restore(dep: dict, node: Path) -> cc.Outcome:
    """The compile-cache-restore init container's run, with its env and its cache dir on the node."""
    view = NodeView(dep, "compile-cache-restore", node)
    env = {**BASE_ENV, "WARMSTART_CACHE_BUCKET": "",
           "WARMSTART_STARTUP_PLAN_FINGERPRINT": view.env["WARMSTART_STARTUP_PLAN_FINGERPRINT"],
           "WARMSTART_CACHE_DIR": str(view.host(view.env["WARMSTART_CACHE_DIR"]))}
    return cc.restore(cc.Settings.from_env(env), emit=False)


def test_plans_are_kept_apart_per_memory_setting_on_the_node_layout_the_pods_mount(tmp_path: Path) -> None:
    """The rendered pods of two gpuMemoryUtilization settings on one node, their paths mapped
    onto the node as the kubelet mounts them: a pod of the old setting that saves its plan after
    a pod of the new one started never hands it to a later pod of the new setting, and each
    setting keeps its own plan for its next pod."""
    node = tmp_path / "node-a"
    old, new = _deployment(0.9), _deployment(0.8)
    _restore(old, node)  # an old pod starts and profiles...
    _restore(new, node)  # ...while a pod of the new setting starts on the node
    _vllm_saves_plan(old, node, kv_bytes=1 << 34)  # the old pod saves its plan late
    assert _vllm_sees(new, node) == [], "a new pod would apply the old setting's plan"
    _vllm_saves_plan(new, node, kv_bytes=1 << 33)
    _restore(new, node)
    assert _vllm_sees(new, node) == [1 << 33]
    _restore(old, node)
    assert _vllm_sees(old, node) == [1 << 34], "the old setting keeps its own plan"
    assert leftovers(node) == []


def test_plans_an_older_layout_left_for_any_setting_are_removed(tmp_path: Path) -> None:
    """Plans directly under vllm/startup_plan (the one-folder layout): they may be any setting's."""
    node = tmp_path / "node-a"
    plan = write_plan(node)
    note = cc.restore(node_pod(node, "ab" * 32), emit=False).reason
    assert not plan.exists() and "older layout" in note
    assert (node / "vllm/startup_plan" / ("ab" * 8)).is_dir()


def test_the_memory_settings_are_a_key_factor() -> None:
    def key(fp: str) -> str:
        s = cc.Settings.from_env({**BASE_ENV, "WARMSTART_STARTUP_PLAN_FINGERPRINT": fp})
        return cc.cache_key(s.prefix, cc.compute_factors(s))

    assert key("a") != key("b") and key("a") == key("a")


def test_the_fingerprint_follows_exactly_the_settings_vllm_leaves_out() -> None:
    fp = cachekey.startup_plan_fingerprint
    base = ["s3://m", "--gpu-memory-utilization=0.9", "--max-model-len=8192"]
    assert fp(base) != fp(["s3://m", "--gpu-memory-utilization=0.8", "--max-model-len=8192"])
    # In vLLM's own config hash, hence in the plan's fingerprint already: not needed here.
    assert fp(base) == fp(["s3://m", "--gpu-memory-utilization=0.9", "--max-model-len=4096"])
    assert fp(base) == fp(["s3://m", "--gpu-memory-utilization", "0.9", "--max-model-len=8192"])
    assert fp(base) != fp(base + ["--num-gpu-blocks-override=100"])


@pytest.mark.parametrize("what", ["link-folder", "file-folder", "link-base"])
def test_a_planted_link_or_file_where_a_plan_folder_goes_is_removed_not_followed(tmp_path: Path, what: str) -> None:
    """Any pod of the node may plant a link where this setting's folder goes (vLLM would then save
    and read plans elsewhere) or a file that blocks it."""
    node = tmp_path / "node-a"
    settings = node_pod(node, "cd" * 32)
    folder = node / "vllm/startup_plan" / ("cd" * 8)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("x")
    folder.parent.mkdir(parents=True)
    if what == "link-folder":
        folder.symlink_to(elsewhere)
    elif what == "file-folder":
        folder.write_text("x")
    else:
        folder.parent.rmdir()
        folder.parent.symlink_to(elsewhere)
    done = threading.Thread(target=cc.restore, args=(settings,), kwargs={"emit": False}, daemon=True)
    done.start()
    done.join(10)
    assert not done.is_alive(), "the restore is still blocked after 10 s"
    assert folder.is_dir() and not folder.is_symlink() and not folder.parent.is_symlink()
    assert (elsewhere / "keep").read_text() == "x", "nothing removed through the link"
