#!/usr/bin/env python3
"""Pick where a serving pod loads its weights from: the node's staged copy, or S3.

Runs as an init container of the serving pod, before vLLM, in the model's own image (standard
library only). It never fails the pod: whatever happens, it writes a model path (the S3 URI
when in doubt) and exits 0, so the worst case is the start the pod would have had without a
node cache.

    python3 /opt/warmstart/weights_select.py

Environment:

    WARMSTART_WEIGHTS_SOURCE   the model's s3:// URI (the fallback). Required.
    WARMSTART_WEIGHTS_DIGEST   the digest of the version this pod serves. Required.
    WARMSTART_WEIGHTS_ROOT     the model's node weights directory as mounted here. Default /weights.
    WARMSTART_WEIGHTS_PATH     the path vLLM sees the staged copy under (default <root>/<digest>):
                               the serving container mounts the same node directory at the same place.
    WARMSTART_WEIGHTS_OUT      directory (an emptyDir shared with vLLM and the compile-cache init
                               container) for `model-path` and `choice.json`. Default /run/warmstart-weights.
    WARMSTART_LOADING_HOLD_S   when streaming from S3, ask this node's staging copier to pause this
                               long (it competes for the same network). 0: do not. Default 0.
    POD_UID                    this pod's uid, names the pause request.

`choice.json` is the compile-cache key's `weights` factor (compile_cache.py reads it through
WARMSTART_WEIGHTS_CHOICE_FILE); it always agrees with `model-path`, and a missing file means the
S3 URI to both vLLM (`manifests/node_cache.serving_command`) and the key.

The pod runs as a non-root UID: it only reads `<root>`, except `<root>/.loading/<uid>.json`
when WARMSTART_LOADING_HOLD_S > 0 (the pod's `weights-owner` init container hands `<root>` to
that UID first, kubelet having created it as root).

A staged copy is used only when `<root>/<digest>/.warmstart-complete.json` names this digest
and source and every file it lists is there with its recorded size: a partial copy never has
the marker (the copier writes it last, then renames the directory into place).

Log line, one per run, on stdout:

    {"event":"warmstart.weights","choice":"local"|"s3","path":"/weights/<digest>"|"s3://...","reason":"...",
     "digest":"<digest>","bytes":123,"files":4,"seconds":0.001}
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping

EVENT = "warmstart.weights"
MARKER = ".warmstart-complete.json"
MARKER_FORMAT = "warmstart-weights-stage/1"
LOADING_DIR = ".loading"
MODEL_PATH_FILE = "model-path"
CHOICE_FILE = "choice.json"


def check_local(root: Path, digest: str, source: str) -> tuple[str | None, dict[str, Any]]:
    """None when `<root>/<digest>` is a complete copy of `source` at `digest`, else why not."""
    final = root / digest
    facts: dict[str, Any] = {}
    if not final.is_dir():
        if (root / f"{digest}.partial").exists():
            return "staging in progress on this node (partial copy, not used)", facts
        return "not staged on this node", facts
    try:
        marker = json.loads((final / MARKER).read_text())
    except FileNotFoundError:
        return "incomplete: no completion marker", facts
    except (OSError, ValueError) as exc:
        return f"unreadable completion marker: {exc}", facts
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        return "completion marker is not one this version wrote", facts
    if marker.get("digest") != digest or marker.get("source") != source:
        return (f"wrong digest: the copy is {marker.get('source')}@{marker.get('digest')}, "
                f"this pod serves {source}@{digest}"), facts
    files = marker.get("files")
    if not isinstance(files, list) or not files:
        return "completion marker lists no files", facts
    total = 0
    for entry in files:
        name, size = str(entry.get("key", "")), entry.get("size")
        path = final / name
        if not name or ".." in Path(name).parts or name.startswith("/"):
            return f"unsafe file name in marker: {name!r}", facts
        try:
            actual = path.stat().st_size
        except OSError:
            return f"missing file: {name}", facts
        if actual != size:
            return f"wrong size: {name} is {actual} bytes, the source listed {size}", facts
        total += actual
    if not any(str(f.get("key", "")).endswith(".safetensors") for f in files):
        return "no safetensors files in the copy", facts
    facts.update(bytes=total, files=len(files))
    return None, facts


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def request_pause(root: Path, pod_uid: str, hold_s: float) -> None:
    """Ask the node's staging copier to stay off the network while this pod streams
    (see weights_stage.py: it checks these files before and during a copy)."""
    if hold_s <= 0 or not pod_uid:
        return
    d = root / LOADING_DIR
    d.mkdir(parents=True, exist_ok=True)
    _write_atomic(d / f"{pod_uid}.json", json.dumps({"until": time.time() + hold_s, "pod": pod_uid}))


def select(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Decide, write the outputs, and return the log record. Never raises."""
    env = os.environ if env is None else env
    start = time.monotonic()
    source = env.get("WARMSTART_WEIGHTS_SOURCE", "").strip()
    digest = env.get("WARMSTART_WEIGHTS_DIGEST", "").strip()
    root = Path(env.get("WARMSTART_WEIGHTS_ROOT", "").strip() or "/weights")
    local_path = env.get("WARMSTART_WEIGHTS_PATH", "").strip() or str(root / digest)
    out = Path(env.get("WARMSTART_WEIGHTS_OUT", "").strip() or "/run/warmstart-weights")
    record: dict[str, Any] = {"event": EVENT, "choice": "s3", "path": source, "reason": None, "digest": digest}
    try:
        if not source or not digest:
            record["reason"] = "WARMSTART_WEIGHTS_SOURCE and WARMSTART_WEIGHTS_DIGEST must be set"
        else:
            why, facts = check_local(root, digest, source)
            record.update(facts)
            if why is None:
                record.update(choice="local", path=local_path, reason="complete copy of this digest on the node")
            else:
                record["reason"] = why
                try:
                    request_pause(root, env.get("POD_UID", ""), float(env.get("WARMSTART_LOADING_HOLD_S", "0") or 0))
                except (OSError, ValueError) as exc:
                    record["reason"] += f" (pause request not written: {exc})"
    except Exception as exc:  # noqa: BLE001 - never fail the pod: fall back to S3
        record.update(choice="s3", path=source, reason=f"error: {type(exc).__name__}: {exc}")
    _write_outputs(out, record, source)
    record["seconds"] = round(time.monotonic() - start, 6)
    return record


def _write_outputs(out: Path, record: dict[str, Any], source: str) -> None:
    """`model-path` (what vLLM loads) and `choice.json` (the compile-cache key's `weights`
    factor) must agree, and a missing file means S3 to both readers: so a local choice whose
    model path cannot be written becomes `s3`, and a model path whose choice file cannot be
    written is removed again (vLLM then streams the URI, as the key says)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        _write_atomic(out / MODEL_PATH_FILE, record["path"])
    except OSError as exc:
        if record["choice"] == "local":
            record.update(choice="s3", path=source)
        record["reason"] = f"{record['reason']} (model path not written, vLLM streams the URI: {exc})"
    try:
        _write_atomic(out / CHOICE_FILE, json.dumps({k: record.get(k) for k in ("choice", "path", "digest", "reason")},
                                                    sort_keys=True))
    except OSError as exc:
        record["reason"] = f"{record['reason']} (choice not written: {exc})"
        if record["choice"] == "local":
            try:
                (out / MODEL_PATH_FILE).unlink(missing_ok=True)
                record.update(choice="s3", path=source)
            except OSError:
                pass


def main() -> int:
    record = select()
    print(json.dumps(record, sort_keys=True, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
