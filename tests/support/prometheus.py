"""A stand-in for an Amazon Managed Service for Prometheus workspace, on 127.0.0.1: it scrapes
targets' real `/metrics` every `interval_s` (as the managed collector does, with the labels the
rendered scrape configuration attaches: `namespace`, `pod`), keeps every sample, and answers
instant queries at `/workspaces/<id>/api/v1/query` (GET, `query` and `time`), each request's
SigV4 signature checked for the `aps` service the way AWS documents it
(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_sigv-create-signed-request.html:
the query string decoded, re-encoded with RFC 3986's unreserved characters and sorted; the
signing key from the secret, date, region and service). An unsigned or badly signed query is
answered 403 and counted in `refused`.

PromQL: only what the drill sends, `sum(increase(NAME{l="v",...}[Ns]))`, alone or one divided by
another; anything else is answered 400 `bad_data`. `increase` is Prometheus's extrapolatedRate
(https://github.com/prometheus/prometheus/blob/main/promql/functions.go): the samples in
(t - range, t], counter resets added back, extrapolated to the range's edges when the first and
last samples are within 1.1 average intervals of them (else half an interval), never below the
counter's zero; a series with fewer than two samples is dropped; an empty sum is an empty result.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(?P<k>[A-Za-z_][A-Za-z0-9_]*)="(?P<v>(?:[^"\\]|\\.)*)"')
_AGG = r'sum\(increase\((?P<name{i}>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{{(?P<sel{i}>[^}}]*)\}})?\[(?P<range{i}>\d+)s\]\)\)'
_QUERY = re.compile(r"^\s*" + _AGG.format(i=1) + r"(?:\s*/\s*" + _AGG.format(i=2) + r")?\s*$")


def _labels(text: str | None) -> dict[str, str]:
    return {m["k"]: m["v"] for m in _LABEL.finditer(text or "")}


def increase(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """Prometheus's extrapolatedRate(isCounter, not isRate) over the samples in (start, end]."""
    pts = [(t, v) for t, v in samples if start < t <= end]
    if len(pts) < 2:
        return None
    result = pts[-1][1] - pts[0][1]
    prev = pts[0][1]
    for _, v in pts[1:]:
        if v < prev:
            result += prev  # a counter reset
        prev = v
    to_start, to_end = pts[0][0] - start, end - pts[-1][0]
    sampled = pts[-1][0] - pts[0][0]
    avg = sampled / (len(pts) - 1)
    threshold = avg * 1.1
    if to_start >= threshold:
        to_start = avg / 2
    if result > 0 and pts[0][1] >= 0:
        to_start = min(to_start, sampled * (pts[0][1] / result))
    if to_end >= threshold:
        to_end = avg / 2
    return result * (sampled + to_start + to_end) / sampled


def _uri(s: str) -> str:
    return urllib.parse.quote(s, safe="-_.~")


class StandInPrometheus:
    def __init__(self, targets: Callable[[], dict[str, str]], namespace: str, *, interval_s: float,
                 region: str, access_key: str, secret_key: str, workspace: str = "ws-standin") -> None:
        self.targets, self.namespace, self.interval_s = targets, namespace, interval_s
        self.region, self.access_key, self.secret_key, self.workspace = region, access_key, secret_key, workspace
        self.series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
        self.lock = threading.Lock()
        self.stop_ev = threading.Event()
        self.queries: list[tuple[str, float]] = []
        self.refused: list[str] = []
        self.scrapes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                code, body = owner._answer(self)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/workspaces/{workspace}"

    # -- scraping

    def scrape_once(self) -> None:
        now = time.time()
        for pod, url in sorted(self.targets().items()):
            try:
                with urllib.request.urlopen(url + "/metrics", timeout=5) as r:  # noqa: S310
                    text = r.read().decode()
            except OSError:
                continue  # a target down: no sample this round
            with self.lock:
                for line in text.splitlines():
                    m = _SAMPLE.match(line)
                    if not m:
                        continue
                    labels = {**_labels(m["labels"]), "namespace": self.namespace, "pod": pod, "job": "vllm"}
                    key = (m["name"], tuple(sorted(labels.items())))
                    self.series.setdefault(key, []).append((now, float(m["value"])))
        self.scrapes += 1

    def _loop(self) -> None:
        while not self.stop_ev.wait(self.interval_s):
            self.scrape_once()

    def __enter__(self) -> "StandInPrometheus":
        self.scrape_once()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_ev.set()
        self.thread.join(timeout=30)
        self.server.shutdown()
        self.server.server_close()

    # -- the query API

    def _signed(self, h: BaseHTTPRequestHandler) -> bool:
        auth = h.headers.get("Authorization") or ""
        m = re.match(r"AWS4-HMAC-SHA256 Credential=(?P<ak>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<svc>[^/]+)/"
                     r"aws4_request, SignedHeaders=(?P<sh>[^,]+), Signature=(?P<sig>[0-9a-f]{64})$", auth)
        amz_date = h.headers.get("X-Amz-Date") or ""
        if not m or m["ak"] != self.access_key or m["svc"] != "aps" or m["region"] != self.region \
                or not amz_date.startswith(m["date"]):
            return False
        signed = m["sh"].split(";")
        if "host" not in signed or "x-amz-date" not in signed:
            return False
        path, _, raw_query = h.path.partition("?")
        pairs = sorted((_uri(urllib.parse.unquote(k)), _uri(urllib.parse.unquote(v)))
                       for k, _, v in (p.partition("=") for p in raw_query.split("&") if p))
        canonical = "\n".join([
            "GET", path, "&".join(f"{k}={v}" for k, v in pairs),
            "".join(f"{k}:{' '.join((h.headers.get(k) or '').split())}\n" for k in signed),
            m["sh"], hashlib.sha256(b"").hexdigest()])
        scope = f"{m['date']}/{self.region}/aps/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        key = ("AWS4" + self.secret_key).encode()
        for part in (m["date"], self.region, "aps", "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        return hmac.compare_digest(hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), m["sig"])

    def _answer(self, h: BaseHTTPRequestHandler) -> tuple[int, dict[str, Any]]:
        path, _, raw = h.path.partition("?")
        if path != f"/workspaces/{self.workspace}/api/v1/query":
            return 404, {"status": "error", "errorType": "not_found", "error": path}
        if not self._signed(h):
            self.refused.append(h.headers.get("Authorization") or "(unsigned)")
            return 403, {"message": "The request signature we calculated does not match the signature you provided."}
        q = urllib.parse.parse_qs(raw)
        promql, at = q.get("query", [""])[0], float(q.get("time", [time.time()])[0])
        self.queries.append((promql, at))
        m = _QUERY.match(promql)
        if not m:
            return 400, {"status": "error", "errorType": "bad_data", "error": f"the stand-in cannot evaluate {promql!r}"}
        parts = [self._sum(m[f"name{i}"], _labels(m[f"sel{i}"]), int(m[f"range{i}"]), at)
                 for i in (1, 2) if m[f"name{i}"]]
        if any(p is None for p in parts):
            value = None
        elif len(parts) == 1:
            value = parts[0]
        else:
            a, b = parts
            value = a / b if b else (math.nan if a == 0 else math.copysign(math.inf, a))
        result = [] if value is None else [{"metric": {}, "value": [at, _fmt(value)]}]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}

    def _sum(self, name: str, match: dict[str, str], range_s: int, at: float) -> float | None:
        with self.lock:
            chosen = [list(s) for (n, labels), s in self.series.items()
                      if n == name and all(dict(labels).get(k) == v for k, v in match.items())]
        values = [v for v in (increase(s, at - range_s, at) for s in chosen) if v is not None]
        return sum(values) if values else None


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)
