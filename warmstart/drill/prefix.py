"""The prefix-cache hit rate the engines report under the drill's traffic, from the platform's
metrics, beside the routing bench's figure (docs/drill.md, "Routing").

Where it comes from: the model's own ScaledObject, which `up` rendered with the endpoint KEDA
queries (`serverAddress`) and, on the managed path, `awsRegion` for SigV4
(warmstart/manifests/autoscaling.py `scaled_object`). On that path the managed collector scrapes
every engine's `/metrics` every 30 s into the Amazon Managed Service for Prometheus workspace,
whose query API the drill calls from the laptop over HTTPS, signed with the user's own AWS
credentials for the `aps` service (action `aps:QueryMetrics`;
https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-onboard-query-APIs.html; the query
path `/workspaces/<id>/api/v1/query` and service `aps` as in
https://docs.aws.amazon.com/prometheus/latest/userguide/AMP-compatible-APIs.html). A Prometheus of the user's own (`monitoring.prometheusUrl`) is
an address inside the cluster, which the laptop cannot reach: the line is skipped, saying why and
giving the query to run there. A model without autoscaling has no ScaledObject: skipped too.

The figure: vLLM's counters `vllm:prefix_cache_hits_total` over `vllm:prefix_cache_queries_total`
(prompt tokens found in the prefix cache over prompt tokens looked up; vLLM 0.33.0
`vllm/v1/metrics/loggers.py`, counters `vllm:prefix_cache_hits` and `vllm:prefix_cache_queries`,
labelled `model_name`), summed over the model's engines with `increase()` over the load's window
widened by one scrape interval on each side, evaluated one scrape interval after the load ended,
so the scrapes just before and just after the load are in it. `increase()` extrapolates each
series to the window's edges, by the same factor for hits and queries of one engine (the same
scrape times), so the ratio is not skewed by it.

Reported, not judged: see `line`.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from ..decisions import autoscaling as scaling
from . import measure

HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
KEDA_SCALEDOBJECTS = "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects/{name}"
# The routing bench's figure for the policy warmstart renders (prefix_hash, the load bound of
# maxExcessRequests 4): 83 % of prompt tokens hit, against a target of 80 % and random routing's
# ~25 % (docs/routing.md "Why shares are uneven"; bench/routing.py prints it per run).
ROUTING_BENCH_HIT_RATE = 0.83
ROUTING_BENCH_TARGET = 0.80
QUERY_TIMEOUT_S = 30


@dataclass(frozen=True)
class Endpoint:
    """The Prometheus query endpoint the model's autoscaling reads."""

    url: str
    region: str | None
    """SigV4's region (the managed workspace); None for a Prometheus of the user's own."""


def endpoint(get: Callable[[str], Any], namespace: str, model: str) -> Endpoint | str:
    """The model's ScaledObject's Prometheus trigger, or why there is none (a sentence).
    `get(path)` answers the object, or None when the API says 404."""
    so = get(KEDA_SCALEDOBJECTS.format(ns=namespace, name=model))
    if so is None:
        return (f"no ScaledObject {namespace}/{model}: a model without autoscaling has no metrics endpoint "
                "wired, and nothing scrapes its engines")
    for t in (so.get("spec") or {}).get("triggers") or []:
        meta = t.get("metadata") or {}
        if t.get("type") == "prometheus" and meta.get("serverAddress"):
            return Endpoint(str(meta["serverAddress"]).rstrip("/"), meta.get("awsRegion") or None)
    return f"the ScaledObject {namespace}/{model} has no prometheus trigger"


def window(started: float, ended: float, scrape_s: float) -> tuple[int, float]:
    """(range in whole seconds, evaluation time): the load widened by one scrape on each side."""
    return math.ceil(ended - started + 2 * scrape_s), ended + scrape_s


def queries(model: str, namespace: str, range_s: int) -> tuple[str, str]:
    """(the hit rate, the prompt tokens looked up): PromQL over the model's engines."""
    sel = scaling._selector(model, namespace)  # the autoscaling triggers' own selector (DNS labels only)
    hits, looked = (f"sum(increase({HITS}{sel}[{range_s}s]))", f"sum(increase({QUERIES}{sel}[{range_s}s]))")
    return f"{hits} / {looked}", looked


class QueryError(RuntimeError):
    pass


def query(ep: Endpoint, promql: str, at: float, *, credentials: Any = None, timeout: float = QUERY_TIMEOUT_S
          ) -> float | None:
    """One instant query (`GET <url>/api/v1/query?query=&time=`), SigV4-signed for `aps` when the
    endpoint is the managed workspace. None: an empty result (no series in the window)."""
    # Spaces as %20, every reserved character escaped: SigV4's canonical query string is the
    # RFC 3986 encoding, and botocore signs the query as it is written.
    url = f"{ep.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"},
                                                           quote_via=urllib.parse.quote, safe="")
    headers: dict[str, str] = {"Accept": "application/json"}
    if ep.region is not None:
        try:
            import botocore.session
            from botocore.auth import SigV4Auth
            from botocore.awsrequest import AWSRequest
        except ImportError as err:  # pragma: no cover - botocore comes with boto3, a dependency
            raise QueryError(f"signing the query needs botocore ({err})") from None
        creds = credentials or botocore.session.get_session().get_credentials()
        if creds is None:
            raise QueryError("no AWS credentials to sign the query with (the ones `warmstart up` used)")
        req = AWSRequest(method="GET", url=url, headers=headers)
        SigV4Auth(creds, "aps", ep.region).add_auth(req)
        headers = dict(req.headers.items())
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:  # noqa: S310
            doc = json.loads(r.read())
    except urllib.error.HTTPError as err:
        body = err.read()[:300].decode("utf-8", "replace")
        hint = " (the drill needs aps:QueryMetrics on the workspace)" if err.code == 403 else ""
        raise QueryError(f"HTTP {err.code} {body}{hint}") from None
    except (OSError, ValueError) as err:
        raise QueryError(str(err)) from None
    if doc.get("status") != "success":
        raise QueryError(f"{doc.get('errorType')}: {doc.get('error')}")
    result = (doc.get("data") or {}).get("result") or []
    if not result:
        return None
    return float(result[0]["value"][1])


def line(ep: Endpoint | str, model: str, namespace: str, load: dict[str, Any] | None, scrape_s: float,
         *, credentials: Any = None) -> measure.Line:
    """The report's routing line. Reported, not judged: the bench measured one workload on a fixed
    fleet of seven warm replicas; under the drill the fleet grows (a new replica starts with an
    empty cache and takes a slice of the hash ring, so its first requests of every prefix miss),
    the window may hold other clients' traffic on the same engines, and the share of prompt
    tokens in the shared prefixes is the drill's flags'. A tolerance around the bench's figure
    would judge those, not the router; the figure beside it says whether routing is near what it
    was measured to give."""
    bench = (f"routing bench: {ROUTING_BENCH_HIT_RATE:.0%} with warmstart's prefix_hash and load bound "
             f"(target >= {ROUTING_BENCH_TARGET:.0%}, random ~25 %; docs/routing.md)")

    def skipped(why: str) -> measure.Line:
        return measure.Line("prefix-cache hit rate", "routing", None, ROUTING_BENCH_HIT_RATE, None,
                            "reported, not judged", detail=f"skipped: {why}; {bench}", judged=False)

    if isinstance(ep, str):
        return skipped(ep)
    if load is None or not load.get("started") or not load.get("ended"):
        return skipped("the load left no start and end to take the window from")
    range_s, at = window(float(load["started"]), float(load["ended"]), scrape_s)
    rate_q, tokens_q = queries(model, namespace, range_s)
    if ep.region is None:
        return skipped(f"the metrics are in a Prometheus of your own at {ep.url} (monitoring.prometheusUrl), "
                       f"which is not reachable from here; run there, at time {at:.0f}: {rate_q}")
    # The scrape after the load must have landed: wait for the evaluation time (bounded by it;
    # a run with a settle wait is long past it).
    time.sleep(max(0.0, min(at - time.time(), scrape_s)) + 1.0)
    try:
        rate = query(ep, rate_q, at, credentials=credentials)
        tokens = query(ep, tokens_q, at, credentials=credentials)
    except QueryError as err:
        return skipped(f"querying {ep.url}: {err}")
    if rate is None or tokens is None or not math.isfinite(rate) or not tokens:
        return skipped(f"no prefix-cache samples of {model} in the {range_s} s window (not scraped yet, or "
                       "the engines run without prefix caching)")
    return measure.Line("prefix-cache hit rate", "routing", round(rate, 4), ROUTING_BENCH_HIT_RATE, None,
                        "reported, not judged",
                        detail=f"{tokens:.0f} prompt tokens looked up over {range_s} s ({ep.url}); {bench}",
                        judged=False)
