"""vLLM's startup plans on the node, dropped when the memory settings they were measured for change.

Part of compile_cache.py, whose docstring has the commands, the environment and the object
layout; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

import json

if __package__:  # imported as warmstart.podside.* (the tests, the renderer)
    from .compile_cache_node import NodeLock, _remove, _write_json_atomic
    from .compile_cache_outcome import describe_error
    from .compile_cache_settings import CacheError, Settings
else:  # run as a file from the ConfigMap's folder, which is sys.path[0]: flat modules
    from compile_cache_node import NodeLock, _remove, _write_json_atomic
    from compile_cache_outcome import describe_error
    from compile_cache_settings import CacheError, Settings


STARTUP_PLAN_DIR = "vllm/startup_plan"


def guard_startup_plans(settings: Settings) -> str | None:
    """Drop the node's startup plans when this pod's WARMSTART_STARTUP_PLAN_FINGERPRINT differs
    from the one recorded by the last pod of the model on the node, under the node lock. vLLM
    applies a plan whose own fingerprint matches, and that fingerprint leaves out
    --gpu-memory-utilization (vllm/v1/worker/startup_plan.py): a plan kept across such a change
    would size the KV cache for the old setting. A dropped plan costs one profiling run. Returns
    a note for the log line, or None; never raises."""
    record = settings.state_dir / "startup-plan.json"
    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        with NodeLock(settings.state_dir, settings.lock_timeout_s):
            try:
                recorded = json.loads(record.read_text()).get("fingerprint")
            except (OSError, ValueError, AttributeError):
                recorded = None
            if recorded == settings.startup_plan_fingerprint:
                return None
            plans = settings.cache_dir / STARTUP_PLAN_DIR
            held = plans.is_dir() and not plans.is_symlink() and any(plans.iterdir())
            _remove(plans)
            _write_json_atomic(record, {"fingerprint": settings.startup_plan_fingerprint})
            return "startup plans of other memory settings removed from the node" if held else None
    except (OSError, CacheError) as exc:
        return f"startup plans not checked: {describe_error(exc)}"
