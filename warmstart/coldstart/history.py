"""`warmstart coldstart --history`: p50 / p95 per phase over the phase records the serving pods
uploaded (warmstart/podside/first_token.py) to `s3://<compile-cache bucket>/<model>/coldstart/`,
split by new or warm node, compile-cache and node-weights-cache outcome; a standby engine's wake
(signal, wake, first token) is a split of its own. A cache only counts
when starts are split this way: a p50 over hits and misses together hides both.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any, Iterable, Mapping

MAX_RECORDS = 2000
MAX_RECORD_BYTES = 256 * 1024


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def split_key(record: Mapping[str, Any]) -> tuple[str, str, str]:
    """(node, compile cache, node weights cache) of one record, as words; a standby engine's wake
    (warmstart/podside/standby.py) is its own kind of start: (`standby wake`, its sleep level, -)."""
    f = record.get("flags") or {}
    if record.get("kind") == "wake":
        return "standby wake", f"sleep level {f.get('sleep_level', '?')}", "-"
    if record.get("kind") == "drill":  # warmstart drill's run: each path's request -> first inference
        return "drill", "every path", "-"
    node = "new node" if f.get("new_node") else "warm node" if f.get("new_node") is False else "node ?"
    restore, compiled = f.get("compile_restore"), f.get("compile_cache")
    compile_ = (f"compile {compiled}" if compiled else
                "compile hit" if restore in ("hit", "restored") else
                "compile miss" if restore == "miss" else "compile ?")
    node_cache = f.get("node_cache")
    return node, compile_, f"node cache {node_cache}" if node_cache else "no node cache"


def summarise(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], dict[str, dict[str, float]]]:
    """{split: {phase: {n, p50, p95}}} over each record's `phases` {name: seconds}."""
    groups: dict[tuple[str, str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        for phase, seconds in (r.get("phases") or {}).items():
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0:
                groups[split_key(r)][phase].append(float(seconds))
    return {k: {p: {"n": len(v), "p50": percentile(v, 50), "p95": percentile(v, 95)} for p, v in sorted(ph.items())}
            for k, ph in sorted(groups.items())}


def table(summary: Mapping[tuple[str, str, str], Mapping[str, Mapping[str, float]]]) -> str:
    if not summary:
        return "no cold-start records yet"
    lines = []
    for split, phases in summary.items():
        lines.append(" / ".join(split))
        width = max(len(p) for p in phases)
        for phase, s in phases.items():
            lines.append(f"  {phase.ljust(width)}  n={int(s['n']):<4d} p50 {s['p50']:8.1f} s  p95 {s['p95']:8.1f} s")
        lines.append("")
    return "\n".join(lines).rstrip()


def read_records(s3: Any, bucket: str, prefix: str, limit: int = MAX_RECORDS) -> list[dict[str, Any]]:
    """Every `<prefix>*.json` record (newest `limit`), with a boto3 S3 client."""
    keys: list[tuple[str, str]] = []
    token = None
    while True:
        kwargs = {"Bucket": bucket, "Prefix": prefix, **({"ContinuationToken": token} if token else {})}
        page = s3.list_objects_v2(**kwargs)
        for o in page.get("Contents", []):
            if o["Key"].endswith(".json") and o.get("Size", 0) <= MAX_RECORD_BYTES:
                keys.append((o["LastModified"].isoformat() if hasattr(o["LastModified"], "isoformat")
                             else str(o["LastModified"]), o["Key"]))
        token = page.get("NextContinuationToken")
        if not token:
            break
    records = []
    for _, key in sorted(keys)[-limit:]:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read(MAX_RECORD_BYTES + 1)
        if len(body) > MAX_RECORD_BYTES:
            continue
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):  # a nested document is skipped, not a crash
            continue
        if isinstance(doc, dict):
            records.append(doc)
    return records
