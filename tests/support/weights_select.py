"""The serving pod's source picker run as the pod runs it, against node directories it writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.node_cache import SELECT
from warmstart.podside import weights_select


SOURCE = "s3://models/llama/v1"
DIGEST = "0123456789ab"
FILES = {"model.safetensors": b"w" * 4096, "config.json": b"{}", "tokenizer/tokenizer.json": b"t" * 10}


def write_copy(root: Path, name: str = DIGEST, *, digest: str = DIGEST, source: str = SOURCE,
               marker: bool = True, files: dict[str, bytes] = FILES) -> Path:
    d = root / name
    for rel, body in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(body)
    if marker:
        (d / weights_select.MARKER).write_text(json.dumps({
            "format": weights_select.MARKER_FORMAT, "digest": digest, "source": source,
            "files": [{"key": k, "size": len(b), "etag": "e"} for k, b in sorted(files.items())]}))
    return d


def pick(tmp_path: Path, **env: str) -> tuple[int, dict[str, Any], Path]:
    out = tmp_path / "run"
    full = {"PATH": os.environ["PATH"], "WARMSTART_WEIGHTS_SOURCE": SOURCE, "WARMSTART_WEIGHTS_DIGEST": DIGEST,
            "WARMSTART_WEIGHTS_ROOT": str(tmp_path / "weights"), "WARMSTART_WEIGHTS_PATH": f"/weights/{DIGEST}",
            "WARMSTART_WEIGHTS_OUT": str(out)} | env
    proc = subprocess.run([sys.executable, str(SELECT)], env=full, capture_output=True, text=True, timeout=30)
    (line,) = [json.loads(x) for x in proc.stdout.splitlines()]
    return proc.returncode, line, out
