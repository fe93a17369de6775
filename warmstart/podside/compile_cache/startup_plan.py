"""vLLM's startup plans on the node, kept apart per memory setting (a folder per setting's digest).

Part of compile_cache.py, whose docstring has the commands, the environment and the object
layout; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

from .node import NodeLock, remove_path
from .outcome import describe_error
from .settings import CacheError, Settings


STARTUP_PLAN_DIR = "vllm/startup_plan"
#: Characters of WARMSTART_STARTUP_PLAN_FINGERPRINT (a sha256 hex) naming a setting's plan folder;
#: the serving pod mounts that folder (warmstart/manifests/compile_cache.py, startup_plan_mount).
FOLDER_CHARS = 16


def plan_folder(fingerprint: str) -> str:
    """The node folder (relative to the cache dir) of the plans measured under one setting:
    `vllm/startup_plan/<first 16 hex of its fingerprint>`, or `.../unknown` for a fingerprint
    that is not hex (never a path of its own choosing)."""
    name = fingerprint[:FOLDER_CHARS].lower()
    ok = len(name) == FOLDER_CHARS and all(c in "0123456789abcdef" for c in name)
    return f"{STARTUP_PLAN_DIR}/{name if ok else 'unknown'}"


def guard_startup_plans(settings: Settings) -> str | None:
    """Give this pod's memory settings their own plan folder on the node, under the node lock.
    vLLM applies a plan whose own fingerprint matches, and that fingerprint leaves out
    --gpu-memory-utilization (vllm/v1/worker/startup_plan.py): plans of two settings in one
    folder would size the KV cache for the other's. So the vLLM container mounts
    `<cache dir>/vllm/startup_plan/<fingerprint>` (a subPath of the node's cache volume) as its
    $VLLM_CACHE_ROOT/startup_plan, and never sees another setting's plans, even those a pod of
    the old setting saves after a pod of the new one started on the node. This creates the
    folder (owned by the pod's user: the kubelet would make it root's), and removes what an older
    layout left directly under vllm/startup_plan (plans of any setting) and its record. Returns a
    note for the log line, or None; never raises.

    The node is where any pod of the node may plant a file: a link or a non-folder where a folder
    goes is removed, never followed (podside_common.read_regular's caution)."""
    base = settings.cache_dir / STARTUP_PLAN_DIR
    folder = settings.cache_dir / plan_folder(settings.startup_plan_fingerprint)
    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        with NodeLock(settings.state_dir, settings.lock_timeout_s):
            remove_path(settings.state_dir / "startup-plan.json")  # the record of the one-folder layout
            dropped = False
            for path in (base.parent, base, folder):
                if path.is_symlink() or (path.exists() and not path.is_dir()):
                    remove_path(path)
            if base.is_dir():
                for entry in base.iterdir():
                    if entry.is_symlink() or not entry.is_dir():
                        remove_path(entry)
                        dropped = True
            folder.mkdir(parents=True, exist_ok=True)
            return "startup plans of an older layout (any memory setting) removed from the node" if dropped else None
    except (OSError, CacheError) as exc:
        return f"startup plans not checked: {describe_error(exc)}"
