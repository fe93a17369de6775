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

Under faults: the node directory may hold planted files. The marker is opened without following
a link or blocking (a FIFO), must be a regular file of at most 1 MiB and JSON nested at most 32
deep; the copy's directory and every file it lists must be real (no links) and inside the copy;
anything else is "not staged" and the pod streams from S3. A pause request is written through
the `.loading` directory's descriptor, never through a link.

A staged copy is used only when `<root>/<digest>/.warmstart-complete.json` names this digest
and source and every file it lists is there with its recorded size: a partial copy never has
the marker (the copier writes it last, then renames the directory into place).

Log line, one per run, on stdout:

    {"event":"warmstart.weights","choice":"local"|"s3","result":"hit"|"miss","source":"node-cache"|"s3",
     "path":"/weights/<digest>"|"s3://...","reason":"...","digest":"<digest>","bytes":123,"files":4,"seconds":0.001}
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from .common.shared import emit_line, parse_json as _parse_json, read_regular

EVENT = "warmstart.weights"
MARKER = ".warmstart-complete.json"
MARKER_FORMAT = "warmstart-weights-stage/1"
LOADING_DIR = ".loading"
MODEL_PATH_FILE = "model-path"
CHOICE_FILE = "choice.json"
# The node directory is writable by whatever can write it: bounds on what is read from it. A
# marker of a 1,000-file model is about 100 KB; json.loads takes up to ~30x a document's size,
# so 1 MiB stays far inside this container's 128 MiB limit.
MAX_MARKER_BYTES = 1 << 20
MAX_JSON_DEPTH = 32


def read_small(path: Path, limit: int) -> bytes | str:
    """A regular file's bytes (at most `limit`), else why not (a str). Opened without following
    a link and without blocking (a FIFO would hold the pod in Init), checked before reading."""
    return read_regular(path, limit)


def parse_json(raw: bytes) -> tuple[Any, str | None]:
    """(document, None), or (None, why) for what is not JSON, cut short, or nested deeper
    than MAX_JSON_DEPTH (refused before Python's recursion limit)."""
    return _parse_json(raw, MAX_JSON_DEPTH)


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _under(path: Path, root: Path) -> bool:
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real.startswith(base.rstrip("/") + "/")


def check_local(root: Path, digest: str, source: str) -> tuple[str | None, dict[str, Any]]:
    """None when `<root>/<digest>` is a complete copy of `source` at `digest`, else why not."""
    final = root / digest
    facts: dict[str, Any] = {}
    if not _real_dir(final):
        if os.path.islink(final):
            return "the copy's directory is a symbolic link (not used)", facts
        if os.path.lexists(root / f"{digest}.partial"):
            return "staging in progress on this node (partial copy, not used)", facts
        return "not staged on this node", facts
    raw = read_small(final / MARKER, MAX_MARKER_BYTES)
    if raw == "missing":
        return "incomplete: no completion marker", facts
    if isinstance(raw, str):
        return f"unreadable completion marker: {raw}", facts
    marker, why = parse_json(raw)
    if why:
        return f"unreadable completion marker: {why}", facts
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
        if not isinstance(entry, dict):
            return "completion marker is not one this version wrote (malformed file list)", facts
        name, size = str(entry.get("key", "")), entry.get("size")
        path = final / name
        if not name or ".." in Path(name).parts or name.startswith("/"):
            return f"unsafe file name in marker: {name!r}", facts
        try:
            st = os.lstat(path)
        except OSError:
            return f"missing file: {name}", facts
        if not stat.S_ISREG(st.st_mode) or not _under(path, final):
            return f"not a regular file inside the copy: {name}", facts
        actual = st.st_size
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
    if hold_s <= 0 or not pod_uid or "/" in pod_uid or pod_uid.startswith("."):
        return
    d = root / LOADING_DIR
    if os.path.islink(d):
        raise OSError(f"{d} is a symbolic link")
    d.mkdir(parents=True, exist_ok=True)
    # Through the directory's descriptor, opened without following a link: the request is
    # never written outside the node directory.
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        name, tmp = f"{pod_uid}.json", f".{pod_uid}.json.tmp"
        try:
            os.unlink(tmp, dir_fd=fd)
        except FileNotFoundError:
            pass
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
        try:
            os.write(out, json.dumps({"until": time.time() + hold_s, "pod": pod_uid}).encode())
        finally:
            os.close(out)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


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
    # The same verdict in the words the cold-start readers use (the `warmstart coldstart`
    # log parser and the first-token sidecar's record): node cache hit or miss.
    record["result"] = "hit" if record["choice"] == "local" else "miss"
    record["source"] = "node-cache" if record["choice"] == "local" else "s3"
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
        _write_atomic(out / CHOICE_FILE, json.dumps({k: record.get(k) for k in ("choice", "path", "digest", "reason")}
                                                    | {"result": "hit" if record["choice"] == "local" else "miss"},
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
    emit_line(record, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
