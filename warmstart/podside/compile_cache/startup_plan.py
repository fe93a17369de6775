"""vLLM's startup plans on the node, dropped when the memory settings they were measured for change.

Part of compile_cache.py, whose docstring has the commands, the environment and the object
layout; shipped with it as files of one ConfigMap folder (warmstart/manifests/pod_scripts.py).
"""

from __future__ import annotations

from .node import NodeLock, remove_path, write_json_atomic
from .outcome import describe_error
from .settings import CacheError, Settings
from ..common.shared import parse_json, read_regular

STARTUP_PLAN_DIR = "vllm/startup_plan"
#: Largest record read: it holds one fingerprint, under 100 bytes.
_MAX_RECORD_BYTES = 4 << 10
#: Deepest nesting read from it (a flat object); deeper is refused before Python's recursion limit.
_MAX_JSON_DEPTH = 32


def guard_startup_plans(settings: Settings) -> str | None:
    """Drop the node's startup plans when this pod's WARMSTART_STARTUP_PLAN_FINGERPRINT differs
    from the one recorded by the last pod of the model on the node, under the node lock. vLLM
    applies a plan whose own fingerprint matches, and that fingerprint leaves out
    --gpu-memory-utilization (vllm/v1/worker/startup_plan.py): a plan kept across such a change
    would size the KV cache for the old setting. A dropped plan costs one profiling run. Returns
    a note for the log line, or None; never raises.

    The record is on the node, where any pod of the node may plant a file: it is read without
    following a link or blocking (a FIFO would hold the restore, a link could vouch for plans of
    other settings), a regular file of at most 4 KiB, JSON nested at most 32 deep
    (podside_common.read_regular, parse_json); anything else records nothing, so the plans go."""
    record = settings.state_dir / "startup-plan.json"
    try:
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        with NodeLock(settings.state_dir, settings.lock_timeout_s):
            raw = read_regular(record, _MAX_RECORD_BYTES)
            doc, _why = parse_json(raw, _MAX_JSON_DEPTH) if isinstance(raw, bytes) else (None, raw)
            recorded = doc.get("fingerprint") if isinstance(doc, dict) else None
            if recorded == settings.startup_plan_fingerprint:
                return None
            plans = settings.cache_dir / STARTUP_PLAN_DIR
            held = plans.is_dir() and not plans.is_symlink() and any(plans.iterdir())
            remove_path(plans)
            write_json_atomic(record, {"fingerprint": settings.startup_plan_fingerprint})
            return "startup plans of other memory settings removed from the node" if held else None
    except (OSError, CacheError) as exc:
        return f"startup plans not checked: {describe_error(exc)}"
