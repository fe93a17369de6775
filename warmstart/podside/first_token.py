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
`warmstart.compile_cache` line); `key.json` is the compile-cache restore's key file. At most 32
files. The weights picker's verdict comes from its own volume: WARMSTART_WEIGHTS_CHOICE_FILE
(default /run/warmstart-weights/choice.json, weights_select.py), `choice` "local" is node cache
"hit", "s3" a "miss" (the record's flags.node_cache).

Under faults: state files are opened without following links or blocking, read up to 64 KiB,
and a document cut short or nested deeper than 32 levels is skipped, never fatal; the record is
trimmed to the 256 KiB that `--history` reads; the first-token probe has one deadline for the
whole exchange (a stream trickled byte by byte without a newline ends at it).

Environment:
    WARMSTART_HEALTH_URL         default http://127.0.0.1:8000/health
    WARMSTART_COMPLETIONS_URL    default http://127.0.0.1:8000/v1/completions
    WARMSTART_SERVED_MODEL       the served model name (vLLM --served-model-name). Required for the probe.
    WARMSTART_MODEL              warmstart's model name (record field). Default: WARMSTART_SERVED_MODEL.
    WARMSTART_HEALTH_TIMEOUT_S   default 7200; WARMSTART_REQUEST_TIMEOUT_S default 60
    WARMSTART_CACHE_BUCKET       where records go; empty: no upload (result "skipped")
    WARMSTART_RECORD_PREFIX      key prefix, e.g. "llama-8b/coldstart/"
    WARMSTART_STATE_DIR          default /run/warmstart
    WARMSTART_WEIGHTS_CHOICE_FILE  the weights picker's choice.json. Default /run/warmstart-weights/choice.json
    WARMSTART_NEW_NODE_UPTIME_S  a host up for less than this when the sidecar started is a new node. Default 1200.
    WARMSTART_INSTANCE_TYPE      record field
    POD_NAME, POD_NAMESPACE, NODE_NAME (downward API); AWS_* as boto reads them.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from .common.shared import emit_line, exit_at_deadline, json_line, make_s3_client, parse_json, read_regular

EVENT = "warmstart.first_token"
RECORD_EVENT = "warmstart.coldstart_record"
FORMAT = "warmstart-coldstart-record/1"
MAX_STATE_FILES = 32
MAX_STATE_BYTES = 64 * 1024
MAX_RESPONSE_BYTES = 256 * 1024
#: What `warmstart coldstart --history` reads of a record (warmstart.coldstart.history
#: MAX_RECORD_BYTES): a record is trimmed to fit, never uploaded to be skipped.
MAX_RECORD_BYTES = 256 * 1024
MAX_JSON_DEPTH = 32
DEFAULT_CHOICE_FILE = "/run/warmstart-weights/choice.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


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


class _Watchdog:
    """Closes a connection's socket at a deadline, so a read blocked on a trickle (one byte
    just before every per-read timeout, never a newline) ends there too: a deadline on the whole
    exchange, not on each read."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.conn, self.fired = conn, False
        self.sock: socket.socket | None = None
        """Taken at connect: http.client hands the socket to the response (conn.sock is None then)."""
        self.timer = threading.Timer(max(0.0, seconds), self._fire)
        self.timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        sock = self.sock or self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "_Watchdog":
        self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.cancel()
        self.conn.close()


def first_token(url: str, model: str, timeout_s: float) -> tuple[float, str]:
    """Seconds from sending a streaming max_tokens=1 completion to its first streamed token, and
    the token. Raises on an HTTP error, a stream without a token or the deadline, which bounds
    the whole exchange (connect, headers, every byte of the stream)."""
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 1, "stream": True,
                       "temperature": 0}).encode()
    parts = urllib.parse.urlsplit(url)
    start = time.monotonic()
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout_s)
    with _Watchdog(conn, timeout_s) as dog:
        try:
            conn.connect()
            dog.sock = conn.sock
            conn.request("POST", parts.path or "/", body=body,
                         headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
            resp = conn.getresponse()
            if resp.status >= 400:
                raise urllib.error.HTTPError(url, resp.status, resp.reason, resp.headers, None)
            read, buffer = 0, b""
            while True:
                chunk = resp.read1(65536)
                read += len(chunk)
                if not chunk or read > MAX_RESPONSE_BYTES:
                    raise ValueError("the stream ended without a token")
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    text = line.decode("utf-8", "replace").strip()
                    if not text.startswith("data:"):
                        continue
                    data = text[5:].strip()
                    if data == "[DONE]":
                        raise ValueError("the stream ended without a token")
                    try:
                        chunk_doc = json.loads(data)
                    except (ValueError, RecursionError):
                        continue
                    choices = chunk_doc.get("choices") if isinstance(chunk_doc, dict) else None
                    if isinstance(choices, list) and choices and isinstance(choices[0], dict) \
                            and choices[0].get("text") is not None:
                        return time.monotonic() - start, str(choices[0]["text"])
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if dog.fired or time.monotonic() - start >= timeout_s:
                raise TimeoutError(f"no token within {timeout_s:g} s") from None
            raise
    raise TimeoutError(f"no token within {timeout_s:g} s")  # pragma: no cover - the loop returns or raises


def host_uptime_s(path: str = "/proc/uptime") -> float | None:
    """The host's uptime: /proc/uptime is not namespaced, so a container sees the node's."""
    try:
        return float(Path(path).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_json_file(path: Path, limit: int = MAX_STATE_BYTES) -> Any | None:
    """A small JSON file's document, or None: opened without following a link or blocking (a
    FIFO), a regular file of at most `limit` bytes, valid JSON nested at most MAX_JSON_DEPTH
    deep (deeper is refused before Python's recursion limit). Never raises."""
    raw = read_regular(path, limit)
    if not isinstance(raw, bytes):
        return None
    doc, why = parse_json(raw, MAX_JSON_DEPTH)
    return None if why else doc


def read_state(state_dir: Path, choice_file: Path | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """({event name or file stem: object}, key file) from the shared state directory, plus the
    weights picker's `choice.json` (its own volume) as the `warmstart.weights` outcome."""
    outcomes: dict[str, Any] = {}
    key_file = None
    try:
        files = sorted(p for p in state_dir.glob("*.json"))[:MAX_STATE_FILES]
    except OSError:
        files = []
    for p in files:
        doc = read_json_file(p)
        if not isinstance(doc, dict):
            continue
        if p.name == "key.json":
            key_file = {"key": doc.get("key")}
        else:
            name = str(doc.get("event") or p.stem)[:64]
            if doc.get("phase"):
                name = f"{name}.{str(doc['phase'])[:32]}"
            outcomes[name] = doc
    choice = read_json_file(choice_file) if choice_file is not None else None
    if isinstance(choice, dict) and choice.get("choice") in ("local", "s3"):
        # The picker's verdict: "hit" when vLLM loads the node's copy (weights_select.py).
        outcomes["warmstart.weights"] = {**choice, "event": "warmstart.weights",
                                         "result": "hit" if choice["choice"] == "local" else "miss"}
    return outcomes, key_file


def fit_record(record: dict[str, Any], limit: int = MAX_RECORD_BYTES) -> bytes:
    """The record's JSON, at most `limit` bytes: when it is larger, the init containers'
    outcome documents are cut to their few summary fields, then dropped; the flags, phases and
    first-token result always stay."""
    body = json.dumps(record, sort_keys=True, indent=1).encode()
    if len(body) <= limit:
        return body
    keep = ("event", "phase", "result", "choice", "source", "seconds", "bytes", "key")
    trimmed = {name: {k: (v if not isinstance(v, str) else v[:200]) for k, v in doc.items()
                      if k in keep and isinstance(v, (str, int, float, bool, type(None)))}
               for name, doc in list(record.get("init", {}).items())[:MAX_STATE_FILES]
               if isinstance(doc, dict)}
    record = {**record, "init": trimmed, "trimmed": True}
    record["phases"] = {str(k)[:100]: v for k, v in list(record.get("phases", {}).items())[:64]}
    body = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    if len(body) <= limit:
        return body
    record = {**record, "init": {}, "compile_cache_key": str(record.get("compile_cache_key") or "")[:512] or None}
    body = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
    if len(body) <= limit:
        return body
    return json.dumps({k: record.get(k) for k in ("format", "pod", "namespace", "node", "model", "written_at",
                                                   "flags")} | {"trimmed": True}, default=str).encode()[:limit]


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
    body = fit_record(dict(record))
    out.update(key=key, bytes=len(body))
    try:
        if client is None:
            client = make_s3_client(region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
                                    connect_timeout_s=5, read_timeout_s=20, max_attempts=3)
        client.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
        out["result"] = "uploaded"
    except Exception as exc:  # noqa: BLE001 - any failure is one log line
        response = getattr(exc, "response", None)
        code = response.get("Error", {}).get("Code") if isinstance(response, dict) else None
        out["reason"] = (f"S3 {code}: {exc}" if code else f"{type(exc).__name__}: {exc}")[:600]
    out["seconds"] = round(time.monotonic() - start, 3)
    return out


class Terminated(BaseException):
    """SIGTERM while the sidecar waits or probes (a BaseException: no `except Exception` takes it)."""


#: Where the sidecar is, for SIGTERM: "probe" (waiting for /health, timing the first token: cut
#: short, the record is still built and uploaded), "record" (building and uploading: let finish,
#: its client has deadlines), "idle" (done: exit). `terminated` once SIGTERM came.
_STATE: dict[str, Any] = {"phase": "probe", "terminated": False}
#: After SIGTERM the sidecar is gone by this many seconds, with its record line, whatever the
#: upload is doing: inside the pod's 30 s terminationGracePeriodSeconds.
TERM_DEADLINE_S = 20.0


def _on_sigterm(*_: object) -> None:
    if _STATE["terminated"]:
        return
    _STATE["terminated"] = True
    exit_at_deadline(TERM_DEADLINE_S, _record_not_uploaded)
    if _STATE["phase"] != "record":
        raise Terminated()


def _record_not_uploaded() -> tuple[str, int]:
    """SIGTERM's backstop line (podside_common.exit_at_deadline): the record's outcome, and exit 0."""
    line = {"event": RECORD_EVENT, "result": "error", "key": None,
            "reason": f"terminated by SIGTERM; the record's upload did not finish within {TERM_DEADLINE_S:g} s, "
                      "so S3 may not hold it"}
    return json_line(line, sort_keys=True), 0


def run(env: Mapping[str, str] | None = None, client: Any = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole sidecar job once: (probe line, upload line). Never raises. SIGTERM during the
    probe (the pod deleted before it was ready or answered) ends the probe with result
    "terminated", and the record is still built and uploaded, so every pod leaves one."""
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
    except Terminated:
        probe.update(result="terminated", reason="SIGTERM (the pod is being deleted) "
                     + ("before vLLM was healthy" if probe["health_wait_s"] is None else "before the first token"))
    except urllib.error.HTTPError as exc:
        probe["reason"] = f"HTTP {exc.code} from the completion"
    except Exception as exc:  # noqa: BLE001
        probe["reason"] = f"{type(exc).__name__}: {exc}"[:600]
    _STATE["phase"] = "record"  # from here a SIGTERM lets the upload finish (TERM_DEADLINE_S at most)
    emit_line(probe)
    try:
        choice = env.get("WARMSTART_WEIGHTS_CHOICE_FILE", DEFAULT_CHOICE_FILE).strip()
        outcomes, key_file = read_state(Path(env.get("WARMSTART_STATE_DIR") or "/run/warmstart"),
                                        Path(choice) if choice else None)
        record = build_record(env, probe, outcomes, key_file, uptime)
        result = upload(env, record, client)
    except Exception as exc:  # noqa: BLE001
        result = {"event": RECORD_EVENT, "result": "error", "reason": f"{type(exc).__name__}: {exc}"[:600]}
    emit_line(result)
    _STATE["phase"] = "idle"
    return probe, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--once", action="store_true", help="return after the upload instead of idling (tests)")
    args = parser.parse_args(argv)
    # As PID 1 the process would ignore SIGTERM and hold up the pod's shutdown; and a plain exit
    # on it would lose the record of a pod deleted before it was ready.
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        run()
        if not args.once and not _STATE["terminated"]:
            while True:  # a native sidecar that exits is restarted and would probe again
                time.sleep(3600)
    except Terminated:  # while idle: the outcome lines were written
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
