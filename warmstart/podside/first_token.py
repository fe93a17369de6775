#!/usr/bin/env python3
"""Time the serving pod's first token and keep its cold-start record past the events' expiry.

A native sidecar of the serving pod (shipped in a ConfigMap, run with the vLLM image's own
interpreter: standard library and botocore only):

    python3 /opt/warmstart/first_token.py            # wait, probe, upload, then idle
    python3 /opt/warmstart/first_token.py --once     # return after the upload (tests)

1. waits for vLLM's /health (overall deadline WARMSTART_HEALTH_TIMEOUT_S);
2. sends one streaming completion with max_tokens=1 and times the first streamed chunk
   (deadline WARMSTART_REQUEST_TIMEOUT_S); logs one line
   {"event":"warmstart.first_token","result":"ok","ttft_s":0.18,"health_wait_s":178.1,...};
3. builds the pod's phase record from what the pod can see: its own environment, the host's
   uptime when this sidecar started (a node that booted minutes ago is a new node), and the JSON
   files the init containers leave in the shared state directory (the file contract below), and
   uploads it to s3://$WARMSTART_CACHE_BUCKET/$WARMSTART_RECORD_PREFIX<pod>.json; logs one line
   {"event":"warmstart.coldstart_record","result":"uploaded"|"skipped"|"error",...}.

Kubernetes Events expire after about an hour (kube-apiserver --event-ttl,
https://kubernetes.io/docs/reference/command-line-tools-reference/kube-apiserver/), so the record
is what `warmstart coldstart --history` summarises later. Nothing here can fail the pod: every
outcome is a log line and the exit status is 0; every network call has a deadline; memory is
bounded (response and state files are read up to fixed sizes).

File contract (WARMSTART_STATE_DIR, default /run/warmstart, an emptyDir the init containers
share): any `*.json` file there of at most 64 KiB holding one JSON object. An object with an
"event" key is an init container's outcome line (e.g. the compile-cache restore's
`warmstart.compile_cache` line, a weights-source choice `warmstart.weights` with "result":
"hit"|"miss" and "source"); `key.json` is the compile-cache restore's key file. At most 32 files.

Environment:
    WARMSTART_HEALTH_URL         default http://127.0.0.1:8000/health
    WARMSTART_COMPLETIONS_URL    default http://127.0.0.1:8000/v1/completions
    WARMSTART_SERVED_MODEL       the served model name (vLLM --served-model-name). Required for the probe.
    WARMSTART_MODEL              warmstart's model name (record field). Default: WARMSTART_SERVED_MODEL.
    WARMSTART_HEALTH_TIMEOUT_S   default 7200; WARMSTART_REQUEST_TIMEOUT_S default 60
    WARMSTART_CACHE_BUCKET       where records go; empty: no upload (result "skipped")
    WARMSTART_RECORD_PREFIX      key prefix, e.g. "llama-8b/coldstart/"
    WARMSTART_STATE_DIR          default /run/warmstart
    WARMSTART_NEW_NODE_UPTIME_S  a host up for less than this when the sidecar started is a new node. Default 1200.
    WARMSTART_INSTANCE_TYPE      record field
    POD_NAME, POD_NAMESPACE, NODE_NAME (downward API); AWS_* as boto reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

EVENT = "warmstart.first_token"
RECORD_EVENT = "warmstart.coldstart_record"
FORMAT = "warmstart-coldstart-record/1"
MAX_STATE_FILES = 32
MAX_STATE_BYTES = 64 * 1024
MAX_RESPONSE_BYTES = 256 * 1024
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _emit(record: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        value = float(env.get(name, "") or default)
    except ValueError:
        return default
    return value if value >= 0 else default


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never a proxy


def wait_for_health(url: str, timeout_s: float, max_interval_s: float = 5.0,
                    clock: Callable[[], float] = time.monotonic) -> bool:
    """Poll until `url` answers 200, backing off from 0.5 s to `max_interval_s`; False at the deadline."""
    deadline = clock() + timeout_s
    interval = 0.5
    while True:
        remaining = deadline - clock()
        try:
            with _OPENER.open(url, timeout=max(0.1, min(5.0, remaining))) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ValueError):
            pass
        remaining = deadline - clock()
        if remaining <= 0:
            return False
        time.sleep(min(interval, remaining))
        interval = min(interval * 2, max_interval_s)


def first_token(url: str, model: str, timeout_s: float) -> tuple[float, str]:
    """Seconds from sending a streaming max_tokens=1 completion to its first streamed token, and
    the token. Raises on an HTTP error, a stream without a token or the deadline."""
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 1, "stream": True,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    start = time.monotonic()
    deadline = start + timeout_s
    with _OPENER.open(req, timeout=timeout_s) as resp:
        read = 0
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no token within {timeout_s:g} s")
            line = resp.readline(65536)
            read += len(line)
            if not line or read > MAX_RESPONSE_BYTES:
                raise ValueError("the stream ended without a token")
            text = line.decode("utf-8", "replace").strip()
            if not text.startswith("data:"):
                continue
            data = text[5:].strip()
            if data == "[DONE]":
                raise ValueError("the stream ended without a token")
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("text") is not None):
                return time.monotonic() - start, str(choices[0]["text"])


def host_uptime_s(path: str = "/proc/uptime") -> float | None:
    """The host's uptime: /proc/uptime is not namespaced, so a container sees the node's."""
    try:
        return float(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_state(state_dir: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """({event name or file stem: object}, key file) from the shared state directory."""
    outcomes: dict[str, Any] = {}
    key_file = None
    try:
        files = sorted(p for p in state_dir.glob("*.json") if p.is_file())[:MAX_STATE_FILES]
    except OSError:
        return outcomes, None
    for p in files:
        try:
            with p.open("rb") as f:
                raw = f.read(MAX_STATE_BYTES + 1)
            if len(raw) > MAX_STATE_BYTES:
                continue
            doc = json.loads(raw)
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict):
            continue
        if p.name == "key.json":
            key_file = {"key": doc.get("key")}
        else:
            name = str(doc.get("event") or p.stem)
            if doc.get("phase"):
                name = f"{name}.{doc['phase']}"
            outcomes[name] = doc
    return outcomes, key_file


def build_record(env: Mapping[str, str], probe: Mapping[str, Any], outcomes: Mapping[str, Any],
                 key_file: Mapping[str, Any] | None, uptime_at_start_s: float | None) -> dict[str, Any]:
    """The pod's phase record (see `warmstart coldstart --history`)."""
    threshold = _number(env, "WARMSTART_NEW_NODE_UPTIME_S", 1200)
    restore = outcomes.get("warmstart.compile_cache.restore") or {}
    weights = outcomes.get("warmstart.weights") or {}
    phases: dict[str, float] = {}
    if probe.get("health_wait_s") is not None:
        phases["ready"] = probe["health_wait_s"]
    if probe.get("ttft_s") is not None:
        phases["first_token"] = probe["ttft_s"]
    for name, doc in outcomes.items():
        if isinstance(doc.get("seconds"), (int, float)):
            phases[f"init:{name}"] = float(doc["seconds"])
    return {
        "format": FORMAT,
        "pod": env.get("POD_NAME"), "namespace": env.get("POD_NAMESPACE"), "node": env.get("NODE_NAME"),
        "model": env.get("WARMSTART_MODEL") or env.get("WARMSTART_SERVED_MODEL"),
        "instance_type": env.get("WARMSTART_INSTANCE_TYPE"),
        "written_at": _now(),
        "node_uptime_at_start_s": uptime_at_start_s,
        "flags": {
            "new_node": None if uptime_at_start_s is None else uptime_at_start_s < threshold,
            "compile_restore": restore.get("result"),
            "compile_cache": None,
            "node_cache": weights.get("result"),
        },
        "compile_cache_key": (key_file or {}).get("key") or restore.get("key"),
        "first_token": dict(probe),
        "phases": phases,
        "init": dict(outcomes),
    }


def upload(env: Mapping[str, str], record: Mapping[str, Any], client: Any = None) -> dict[str, Any]:
    """Put the record; one outcome dict, never raises."""
    out: dict[str, Any] = {"event": RECORD_EVENT, "result": "error", "key": None, "bytes": None,
                           "seconds": None, "reason": None}
    start = time.monotonic()
    bucket = env.get("WARMSTART_CACHE_BUCKET", "").strip()
    pod = env.get("POD_NAME", "").strip()
    prefix = env.get("WARMSTART_RECORD_PREFIX", "").strip()
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    if not bucket:
        out.update(result="skipped", reason="WARMSTART_CACHE_BUCKET is empty")
        return out
    if not _NAME.match(pod) or not prefix or prefix.startswith("/"):
        out.update(result="skipped", reason="POD_NAME or WARMSTART_RECORD_PREFIX missing or invalid")
        return out
    key = f"{prefix}{pod}.json"
    body = json.dumps(record, sort_keys=True, indent=1).encode()
    out.update(key=key, bytes=len(body))
    try:
        if client is None:
            import botocore.session
            from botocore.config import Config

            region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None
            client = botocore.session.get_session().create_client(
                "s3", region_name=region,
                config=Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 3, "mode": "standard"}))
        client.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
        out["result"] = "uploaded"
    except Exception as exc:  # noqa: BLE001 - any failure is one log line
        response = getattr(exc, "response", None)
        code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
        out["reason"] = (f"S3 {code}: {exc}" if code else f"{type(exc).__name__}: {exc}")[:600]
    out["seconds"] = round(time.monotonic() - start, 3)
    return out


def run(env: Mapping[str, str] | None = None, client: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole sidecar job once: (probe line, upload line). Never raises."""
    env = dict(os.environ if env is None else env)
    uptime = host_uptime_s()
    started = time.monotonic()
    probe: dict[str, Any] = {"event": EVENT, "result": "error", "ttft_s": None, "health_wait_s": None,
                             "healthy_at": None, "at": None, "reason": None}
    try:
        health = env.get("WARMSTART_HEALTH_URL") or "http://127.0.0.1:8000/health"
        if not wait_for_health(health, _number(env, "WARMSTART_HEALTH_TIMEOUT_S", 7200)):
            probe.update(result="unhealthy", reason=f"{health} not 200 within the deadline")
        else:
            probe["health_wait_s"] = round(time.monotonic() - started, 3)
            probe["healthy_at"] = _now()
            model = env.get("WARMSTART_SERVED_MODEL") or env.get("WARMSTART_MODEL") or ""
            if not model:
                probe.update(result="skipped", reason="WARMSTART_SERVED_MODEL is not set")
            else:
                ttft, _token = first_token(env.get("WARMSTART_COMPLETIONS_URL") or "http://127.0.0.1:8000/v1/completions",
                                           model, _number(env, "WARMSTART_REQUEST_TIMEOUT_S", 60))
                probe.update(result="ok", ttft_s=round(ttft, 4), at=_now())
    except urllib.error.HTTPError as exc:
        probe["reason"] = f"HTTP {exc.code} from the completion"
    except Exception as exc:  # noqa: BLE001
        probe["reason"] = f"{type(exc).__name__}: {exc}"[:600]
    _emit(probe)
    try:
        outcomes, key_file = read_state(Path(env.get("WARMSTART_STATE_DIR") or "/run/warmstart"))
        record = build_record(env, probe, outcomes, key_file, uptime)
        result = upload(env, record, client)
    except Exception as exc:  # noqa: BLE001
        result = {"event": RECORD_EVENT, "result": "error", "reason": f"{type(exc).__name__}: {exc}"[:600]}
    _emit(result)
    return probe, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--once", action="store_true", help="return after the upload instead of idling (tests)")
    args = parser.parse_args(argv)
    # As PID 1 the process would ignore SIGTERM and hold up the pod's shutdown.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run()
    if not args.once:
        while True:  # a native sidecar that exits is restarted and would probe again
            time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
