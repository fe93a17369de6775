"""From what Kubernetes and the pod's logs say to one row per cold-start phase (pure).

Inputs are the API's own JSON (camelCase dicts, as `kubectl get -o json` or the client's
`sanitize_for_serialization` give them): the Pod, its Events, its NodeClaim (`karpenter.sh/v1`)
and Node, and each container's log read WITH timestamps (`kubectl logs --timestamps`,
`read_namespaced_pod_log(timestamps=True)`: an RFC 3339 time before every line). vLLM's own
prefix (`INFO MM-DD HH:MM:SS`) has no year, no sub-second part and local time
(https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/logger.py), so only the kubelet's
timestamp is used, and lines are matched on their message text.

A phase whose signal is absent is returned with `missing` saying which signal and why it may be
absent; nothing is guessed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterable, Mapping

GIB = 1024**3
_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4,
          "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}

# Event sources that nominate capacity: Karpenter, and EKS Auto Mode's managed Karpenter
# (https://karpenter.sh/docs/reference/events/ "Pod should schedule on: nodeclaim/<name>").
PROVISIONERS = {"karpenter": "karpenter", "eks-auto-mode/compute": "eks-auto-mode"}
SERVING_CONTAINER = "vllm"

# --------------------------------------------------------------------------------------------
# vLLM log messages, per version. Keys are phases; the messages are vLLM's own format strings
# (file:line in the v0.33.0 tree, under vllm/), matched anywhere in the line so the logger's
# prefix and the `[<tag>] ` a compile message may carry do not matter.

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B|B)"

VLLM_033: dict[str, re.Pattern[str]] = {
    # entrypoints/common/startup.py:18
    "banner": re.compile(r"vLLM server version (\S+), serving model (\S+)"),
    # v1/worker/gpu_model_runner.py:4979
    "load_start": re.compile(r"Starting to load model (\S+?)\.\.\."),
    # runai_model_streamer safetensors_streamer.py:237 (on stderr with RUNAI_STREAMER_LOG_TO_STDERR=1)
    "runai": re.compile(r"\[RunAI Streamer\] Overall time to stream " + _SIZE
                        + r" of all files(?: to (\S+?))?: " + _NUM + r"s, " + _SIZE + r"/s"),
    # model_loader/default_loader.py:507 (not emitted by the runai loader)
    "weights_default": re.compile(r"Loading weights took " + _NUM + r" seconds"),
    # v1/worker/gpu_model_runner.py:5089
    "model_total": re.compile(r"Model loading took " + _NUM + r" GiB memory and " + _NUM + r" seconds"),
    # compilation/backends.py:1126
    "compile_dir": re.compile(r"Using cache directory: (\S+) for vLLM's torch\.compile"),
    # compilation/backends.py:1188
    "dynamo": re.compile(r"Dynamo bytecode transform time: " + _NUM + r" s"),
    # compilation/backends.py:418 (miss) and :311 (hit)
    "compile_miss": re.compile(r"Compiling a graph for compile range (.+?) takes " + _NUM + r" s"),
    "compile_hit": re.compile(r"Directly load the compiled graph\(s\) for compile range (.+?) from the cache, took "
                              + _NUM + r" s"),
    # compilation/decorators.py:326 (AOT hit) and :340 (AOT artifact there but not loadable)
    "aot_hit": re.compile(r"Directly load AOT compilation from path (\S+)"),
    "aot_failed": re.compile(r"Compiling model again due to a load failure from (\S+), reason: (.*)$"),
    # v1/worker/startup_plan.py:154, :124, :189 (VLLM_ENABLE_STARTUP_PLAN=1): applied, refused, saved
    "plan_applied": re.compile(r"Applying persisted startup plan \(fingerprint ([0-9a-f]+)\)"),
    "plan_refused": re.compile(r"Startup plan not applied: (.*)$"),
    "plan_saved": re.compile(r"Saved startup plan to (\S+)"),
    # compilation/monitor.py:20; decorators.py:716 (non-AOT)
    "compile_total": re.compile(r"torch\.compile (?:and initial profiling/warmup run together )?took "
                                + _NUM + r" s in total"),
    # v1/worker/gpu_worker.py:773
    "kv_cache": re.compile(r"Available KV cache memory: " + _NUM + r" GiB"),
    # v1/worker/gpu_model_runner.py:6517
    "cuda_graphs": re.compile(r"Graph capturing finished in " + _NUM + r" secs, took " + _NUM + r" GiB"),
    # v1/engine/core.py:396-406
    "engine_init": re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _NUM
                              + r" s(?: \(compilation: " + _NUM + r" s\))?"),
    # entrypoints/launchers/api_server/entry.py:139
    "listen": re.compile(r"Starting vLLM server on (\S+)"),
    # uvicorn
    "startup_complete": re.compile(r"Application startup complete\."),
}
# vLLM 0.8-0.11 spell two messages differently.
VLLM_011 = VLLM_033 | {
    "banner": re.compile(r"vLLM API server version (\S+)"),
    "compile_total": re.compile(r"torch\.compile takes " + _NUM + r" s in total"),
    "listen": re.compile(r"Starting vLLM API server(?: \d+)? on (\S+)"),
}
REGEX_SETS: dict[str, dict[str, re.Pattern[str]]] = {"0.33": VLLM_033, "0.11": VLLM_011}
DEFAULT_REGEX_SET = "0.33"

_KUBELET_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d))\s?(.*)$")
# kubelet pkg/kubelet/images/image_manager.go: the durations are Go duration strings ("7.264s",
# "1m35.208s", "812ms"); older kubelets print neither the waiting time nor the size.
_GO_DURATION = r"((?:[0-9]+(?:\.[0-9]+)?(?:h|ms|us|µs|ns|m|s))+)"
_PULLED = re.compile(r'Successfully pulled image "([^"]+)" in ' + _GO_DURATION
                     + r'(?: \(' + _GO_DURATION + r' including waiting\))?(?:\. Image size: (\d+) bytes)?')
_PRESENT = re.compile(r'Container image "([^"]+)" already present on machine')
_NVME_VERDICT = re.compile(r"^warmstart nvme-check: (OK|WARNING|ERROR): (.*?)(?: \{.*\})?$")
_NOMINATED = re.compile(r"Pod should schedule on: nodeclaim/(\S+)")
_ASSIGNED = re.compile(r"Successfully assigned (\S+)/(\S+) to (\S+)")


def parse_time(value: str | None) -> datetime | None:
    """An RFC 3339 timestamp (nanoseconds allowed, truncated to microseconds) as an aware datetime."""
    if not value:
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)?$", value.strip())
    if not m:
        return None
    frac = (m.group(2) or "")[:7]
    tz = m.group(3) or "Z"
    return datetime.fromisoformat(m.group(1) + frac + ("+00:00" if tz == "Z" else tz))


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def go_duration_s(text: str) -> float:
    """Seconds in a Go duration string such as `1m35.208s`."""
    return sum(float(n) * _GO_UNITS[u] for n, u in re.findall(r"([0-9]+(?:\.[0-9]+)?)(h|ms|us|µs|ns|m|s)", text))


@dataclass
class LogLine:
    at: datetime
    text: str


def split_log(text: str) -> list[LogLine]:
    """Lines of a log read with timestamps; lines without a kubelet timestamp take the previous
    line's (a multi-line record), and lines before any timestamp are dropped."""
    out: list[LogLine] = []
    for raw in text.splitlines():
        m = _KUBELET_TS.match(raw)
        at = parse_time(m.group(1)) if m else None
        if at is not None:
            out.append(LogLine(at, m.group(2)))  # type: ignore[union-attr]
        elif out:
            out.append(LogLine(out[-1].at, raw))
    return out


def json_events(lines: Iterable[LogLine], event: str) -> list[tuple[datetime, dict]]:
    """The `{"event": <event>, ...}` JSON lines the warmstart pod-side scripts log."""
    found = []
    for line in lines:
        start = line.text.find("{")
        if start < 0 or event not in line.text:
            continue
        try:
            doc = json.loads(line.text[start:])
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("event") == event:
            found.append((line.at, doc))
    return found


# --------------------------------------------------------------------------------------------
# The result


@dataclass
class Phase:
    """One row of the report."""

    key: str
    label: str
    start: datetime | None = None
    end: datetime | None = None
    seconds: float | None = None
    detail: str = ""
    missing: str | None = None
    """Why there is no measurement (which signal is absent), when there is none."""
    skipped: bool = False
    """Not part of this start (an existing node launched nothing; an image already present)."""
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def measured(self) -> bool:
        return self.seconds is not None and self.missing is None

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "label": self.label,
                "start": self.start.isoformat() if self.start else None,
                "end": self.end.isoformat() if self.end else None,
                "seconds": None if self.seconds is None else round(self.seconds, 3),
                "detail": self.detail, "missing": self.missing, "skipped": self.skipped,
                "values": self.values}


@dataclass
class Flags:
    """How this start splits in the history: node new or warm, and each cache's outcome."""

    new_node: bool | None = None
    image_present: bool | None = None
    compile_cache: str | None = None
    """`hit` (vLLM loaded compiled graphs), `miss` (it compiled), None (unknown)."""
    compile_restore: str | None = None
    """The restore init container's result: restored | hit | miss | skipped | error."""
    compile_miss_cause: str | None = None
    """Set when the restore installed (or found) the cache and vLLM compiled anyway: why, from
    vLLM's own log lines. Such a start is a cache miss, not a slow compile."""
    startup_plan: str | None = None
    """vLLM's startup plan: applied | refused (free memory below its baseline) | saved (this
    boot profiled and recorded one) | None (off, or not logged)."""
    node_cache: str | None = None
    """The weights-source init container's result: hit (node NVMe copy) | miss (S3), None: none ran."""
    provisioner: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class PodStart:
    """Every phase of one pod's start."""

    pod: str
    namespace: str
    node: str | None
    created: datetime | None
    phases: list[Phase]
    flags: Flags
    vllm_version: str | None = None
    model_uri: str | None = None
    weights_bytes: int | None = None

    def phase(self, key: str) -> Phase:
        for p in self.phases:
            if p.key == key:
                return p
        raise KeyError(key)

    def to_json(self) -> dict[str, Any]:
        return {"format": "warmstart-coldstart-report/1", "pod": self.pod, "namespace": self.namespace,
                "node": self.node, "created": self.created.isoformat() if self.created else None,
                "vllm_version": self.vllm_version, "model_uri": self.model_uri, "weights_bytes": self.weights_bytes,
                "flags": self.flags.to_json(), "phases": [p.to_json() for p in self.phases]}


# --------------------------------------------------------------------------------------------
# Kubernetes objects


def _condition(obj: Mapping[str, Any] | None, kind: str) -> datetime | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and str(c.get("status")) == "True":
            return parse_time(c.get("lastTransitionTime"))
    return None


def _event_time(e: Mapping[str, Any]) -> datetime | None:
    # core/v1 Events carry firstTimestamp; events.k8s.io-style ones eventTime.
    return parse_time(e.get("eventTime")) or parse_time(e.get("firstTimestamp")) or \
        parse_time((e.get("metadata") or {}).get("creationTimestamp"))


def _event_source(e: Mapping[str, Any]) -> str:
    return (e.get("reportingComponent") or (e.get("source") or {}).get("component")
            or e.get("reportingController") or "")


def _sorted_events(events: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    stamped = [(t, e) for e in events if (t := _event_time(e)) is not None]
    return [e for _, e in sorted(stamped, key=lambda te: te[0])]


def _seconds(a: datetime | None, b: datetime | None) -> float | None:
    return None if a is None or b is None else (b - a).total_seconds()


def _container_status(pod: Mapping[str, Any], name: str, init: bool) -> Mapping[str, Any] | None:
    key = "initContainerStatuses" if init else "containerStatuses"
    for s in (pod.get("status") or {}).get(key) or []:
        if s.get("name") == name:
            return s
    return None


def _started_finished(status: Mapping[str, Any] | None) -> tuple[datetime | None, datetime | None]:
    """(started, finished) of a container's current run, or of its last run when it restarted."""
    if not status:
        return None, None
    for which in ("state", "lastState"):
        st = status.get(which) or {}
        if "terminated" in st:
            t = st["terminated"]
            return parse_time(t.get("startedAt")), parse_time(t.get("finishedAt"))
        if "running" in st and which == "state":
            return parse_time(st["running"].get("startedAt")), None
    return None, None


def _human_bytes(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 1024**2:.1f} MiB"


# --------------------------------------------------------------------------------------------
# The parser


def detect_version(lines: list[LogLine]) -> tuple[str | None, str]:
    """(vLLM version from the banner, the regex set to use)."""
    for name, rx in (("0.33", VLLM_033["banner"]), ("0.11", VLLM_011["banner"])):
        for line in lines:
            m = rx.search(line.text)
            if m:
                version = m.group(1)
                major_minor = ".".join(version.lstrip("v").split(".")[:2])
                try:
                    older = tuple(int(x) for x in major_minor.split(".")) <= (0, 11)
                except ValueError:
                    older = name == "0.11"
                return version, "0.11" if older else "0.33"
    return None, DEFAULT_REGEX_SET


def _first(lines: list[LogLine], rx: re.Pattern[str]) -> tuple[LogLine, re.Match[str]] | None:
    for line in lines:
        m = rx.search(line.text)
        if m:
            return line, m
    return None


def _all(lines: list[LogLine], rx: re.Pattern[str]) -> list[tuple[LogLine, re.Match[str]]]:
    return [(line, m) for line in lines if (m := rx.search(line.text))]


def parse_pod_start(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]],
                    nodeclaim: Mapping[str, Any] | None = None, node: Mapping[str, Any] | None = None,
                    logs: Mapping[str, str] | None = None, first_token: Mapping[str, Any] | None = None,
                    serving_container: str = SERVING_CONTAINER) -> PodStart:
    """Every phase of one pod's start from its objects and logs (see the module docstring).

    `logs`: container name -> log text with timestamps. `first_token`: the first-token record
    (the sidecar's `warmstart.first_token` line or the uploaded record), if any.
    """
    logs = logs or {}
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    created = parse_time(meta.get("creationTimestamp"))
    node_name = spec.get("nodeName")
    evs = _sorted_events(events)
    flags = Flags()
    phases: list[Phase] = []

    # --- capacity and node -------------------------------------------------------------------
    nominated = next(((e, m) for e in evs if e.get("reason") == "Nominated"
                      and (m := _NOMINATED.search(e.get("message") or ""))), None)
    node_created = parse_time((node or {}).get("metadata", {}).get("creationTimestamp"))
    if nominated is not None:
        flags.new_node = True
        flags.provisioner = PROVISIONERS.get(_event_source(nominated[0]), _event_source(nominated[0]) or None)
    elif node_created is not None and created is not None:
        flags.new_node = node_created > created
    elif nodeclaim is not None and created is not None:
        flags.new_node = (parse_time(nodeclaim.get("metadata", {}).get("creationTimestamp")) or created) > created

    cap = Phase("capacity", "capacity nominated")
    if nominated is not None:
        cap.start, cap.end = created, _event_time(nominated[0])
        cap.seconds = _seconds(cap.start, cap.end)
        cap.detail = f"nodeclaim/{nominated[1].group(1)} by {flags.provisioner}"
        cap.values = {"nodeclaim": nominated[1].group(1), "source": _event_source(nominated[0])}
    elif flags.new_node is False:
        cap.skipped, cap.detail = True, "existing node"
    else:
        cap.missing = "no Nominated event (events expire after ~1 h) and no node object to compare"
    phases.append(cap)

    nc_created = parse_time((nodeclaim or {}).get("metadata", {}).get("creationTimestamp"))
    launched, registered = _condition(nodeclaim, "Launched"), _condition(nodeclaim, "Registered")
    initialized = _condition(nodeclaim, "Initialized")
    # Initialized: Ready and every resource the NodeClaim asked for (nvidia.com/gpu) registered;
    # a GPU pod cannot bind earlier (https://karpenter.sh/docs/concepts/nodeclaims/).
    node_ready = initialized or _condition(nodeclaim, "Ready") or _condition(node, "Ready")
    steps = (("node_launched", "node launched", nc_created or (cap.end if cap.measured else None), launched,
              "NodeClaim Launched condition"),
             ("node_registered", "node registered", launched, registered, "NodeClaim Registered condition"),
             ("node_ready", "node ready (GPUs registered)", registered, node_ready,
              "NodeClaim Initialized / Node Ready condition"))
    for key, label, a, b, signal in steps:
        p = Phase(key, label)
        if flags.new_node is False:
            p.skipped, p.detail = True, "existing node"
        elif nodeclaim is None and key != "node_ready":
            p.missing = "no NodeClaim (deleted with its node, or not a Karpenter / Auto Mode node)"
        elif a is None or b is None:
            p.missing = f"no {signal}" + ("" if a is not None else " before it")
        else:
            p.start, p.end, p.seconds = a, b, _seconds(a, b)
            if key == "node_ready" and node is not None:
                labels = (node.get("metadata") or {}).get("labels") or {}
                itype = labels.get("node.kubernetes.io/instance-type")
                p.detail = f"{node_name} ({itype})" if itype else str(node_name)
        phases.append(p)

    # --- scheduling and image ----------------------------------------------------------------
    scheduled_at = _condition(pod, "PodScheduled")
    assigned = next((e for e in evs if e.get("reason") == "Scheduled"), None)
    sched = Phase("scheduled", "scheduled")
    sched_end = scheduled_at or (_event_time(assigned) if assigned else None)
    sched_start = node_ready if flags.new_node and node_ready and sched_end and node_ready <= sched_end else created
    if sched_end is None:
        sched.missing = "no PodScheduled condition or Scheduled event"
    else:
        sched.start, sched.end, sched.seconds = sched_start, sched_end, _seconds(sched_start, sched_end)
        sched.detail = f"on {node_name}" + (" after the node became ready" if sched_start is node_ready else "")
    phases.append(sched)

    images = {c.get("image") for c in spec.get("containers") or [] if c.get("name") == serving_container}
    image = next(iter(images), None)
    pull = Phase("image_pull", "image pull")
    pulling = next((e for e in evs if e.get("reason") == "Pulling" and image and image in (e.get("message") or "")), None)
    pulled = None
    for e in evs:
        msg = e.get("message") or ""
        if e.get("reason") == "Pulled" and image and f'"{image}"' in msg:
            pulled = e
            break
    if pulled is not None and (m := _PRESENT.search(pulled.get("message") or "")):
        flags.image_present = True
        pull.skipped, pull.detail = True, "already present on the node"
        pull.start = pull.end = _event_time(pulled)
        pull.seconds = 0.0
    elif pulled is not None and (m := _PULLED.search(pulled.get("message") or "")):
        flags.image_present = False
        secs = go_duration_s(m.group(2))
        waiting = go_duration_s(m.group(3)) if m.group(3) else None
        size = int(m.group(4)) if m.group(4) else None
        pull.end = _event_time(pulled)
        pull.start = _event_time(pulling) if pulling else (pull.end - timedelta(seconds=secs) if pull.end else None)
        pull.seconds = secs
        pull.values = {"image": image, "bytes": size, "waiting_s": waiting}
        pull.detail = (f"{size / 1e9:.2f} GB at {size / secs / 1e6:.0f} MB/s" if size and secs > 0
                       else "size not reported by this kubelet")
        if waiting is not None and waiting > secs + 0.5:
            pull.detail += f" ({waiting:.1f} s including waiting for other pulls)"
    else:
        pull.missing = f"no Pulled event for {image or 'the serving image'} (events expire after ~1 h)"
    phases.append(pull)

    # --- init containers ---------------------------------------------------------------------
    for c in spec.get("initContainers") or []:
        name = c.get("name", "")
        status = _container_status(pod, name, init=True)
        start, end = _started_finished(status)
        sidecar = c.get("restartPolicy") == "Always"
        p = Phase(f"init:{name}", f"init {name}" if not sidecar else f"sidecar {name}")
        lines = split_log(logs.get(name, ""))
        if sidecar:
            p.skipped, p.start = True, start
            p.detail = "native sidecar, runs beside vLLM" + ("" if start else "; not started")
            phases.append(p)
            continue
        if start is None or end is None:
            p.missing = f"no terminated state for init container {name}"
        else:
            p.start, p.end, p.seconds = start, end, _seconds(start, end)
        for _at, doc in json_events(lines, "warmstart.compile_cache"):
            if doc.get("phase") == "restore":
                flags.compile_restore = doc.get("result")
                p.values = {"result": doc.get("result"), "key": doc.get("key"), "bytes": doc.get("bytes"),
                            "reason": doc.get("reason")}
                if isinstance(doc.get("compile_dirs"), list):
                    p.values["compile_dirs"] = [str(d) for d in doc["compile_dirs"]]
                key = str(doc.get("key") or "")
                short = key if len(key) < 40 else key[:key.rfind("/") + 13] + "…"
                p.detail = f"compile cache {doc.get('result')}" + (f" {short}" if key else "")
                if doc.get("bytes"):
                    p.detail += f" ({_human_bytes(doc['bytes'])})"
        for _at, doc in json_events(lines, "warmstart.weights"):
            result = doc.get("result")
            flags.node_cache = result
            p.values = dict(doc)
            p.detail = f"weights from {doc.get('source') or '?'} (node cache {result})"
        for line in lines:
            # warmstart/podside/nvme_check.py: the verdict is the last "<level>: <reason> {json}" line.
            if (m := _NVME_VERDICT.match(line.text)) and "NVIDIA driver" not in m.group(2):
                p.values = {"level": m.group(1)}
                p.detail = f"{m.group(1)}: {m.group(2)}"
        phases.append(p)

    # --- vLLM --------------------------------------------------------------------------------
    vlines = split_log(logs.get(serving_container, ""))
    version, set_name = detect_version(vlines)
    rx = REGEX_SETS[set_name]
    main_status = _container_status(pod, serving_container, init=False)
    main_start, _ = _started_finished(main_status)
    banner = _first(vlines, rx["banner"])
    load = _first(vlines, rx["load_start"])
    model_uri = load[1].group(1) if load else None
    no_log = f"no {serving_container} log (read with timestamps)" if not vlines else None

    w = Phase("weights", "weights loaded")
    runai = _first(vlines, rx["runai"])
    default = _first(vlines, rx["weights_default"])
    weights_bytes = None
    if runai is not None:
        line, m = runai
        weights_bytes = _bytes(m.group(1), m.group(2))
        secs = float(m.group(4))
        w.end, w.seconds = line.at, secs
        w.start = line.at - timedelta(seconds=secs)
        w.values = {"bytes": weights_bytes, "gib_per_s": weights_bytes / GIB / secs if secs > 0 else None,
                    "device": m.group(3), "loader": "runai_streamer"}
        w.detail = f"{_human_bytes(weights_bytes)} at {w.values['gib_per_s']:.2f} GiB/s (Run:ai streamer)"
    elif default is not None:
        line, m = default
        w.end, w.seconds = line.at, float(m.group(1))
        w.start = line.at - timedelta(seconds=w.seconds)
        w.detail, w.values = "default loader (no size logged)", {"loader": "default"}
    else:
        w.missing = no_log or ("no loader timing line: the Run:ai streamer logs it only with "
                               "RUNAI_STREAMER_LOG_TO_STDERR=1 in the vllm container")
    total = _first(vlines, rx["model_total"])
    if total is not None:
        w.values["model_loading_s"] = float(total[1].group(2))
        w.values["gpu_memory_gib"] = float(total[1].group(1))
        if w.missing and not no_log:
            w.detail = f"model loading took {float(total[1].group(2)):.1f} s in total (weights not split out)"
    phases.append(w)

    comp = Phase("compile", "torch.compile")
    hits, misses = _all(vlines, rx["compile_hit"]), _all(vlines, rx["compile_miss"])
    aot_failed = _first(vlines, rx["aot_failed"])
    ctotal = _first(vlines, rx["compile_total"])
    if misses or aot_failed:
        flags.compile_cache = "miss"
    elif hits or _first(vlines, rx["aot_hit"]):
        flags.compile_cache = "hit"
    restore_values = next((p.values for p in phases if p.key.startswith("init:") and p.values.get("key")), {})
    if flags.compile_cache == "miss" and flags.compile_restore in ("hit", "restored"):
        flags.compile_miss_cause = recompile_cause(flags.compile_restore, aot_failed,
                                                   _first(vlines, rx["compile_dir"]), restore_values.get("compile_dirs"))
    if ctotal is not None:
        line, m = ctotal
        comp.end, comp.seconds = line.at, float(m.group(1))
        comp.start = line.at - timedelta(seconds=comp.seconds)
        comp.values = {"graphs_loaded": len(hits), "graphs_compiled": len(misses)}
        cache_dir = _first(vlines, rx["compile_dir"])
        if cache_dir:
            comp.values["cache_dir"] = cache_dir[1].group(1)
        comp.detail = ("cache hit" if flags.compile_cache == "hit" else
                       f"cache miss, compiled {len(misses)} graph(s)" if flags.compile_cache == "miss" else
                       "hit or miss not logged")
        if flags.compile_restore and flags.compile_restore not in ("hit", "restored") and flags.compile_cache == "miss":
            comp.detail += f"; restore said {flags.compile_restore}"
        if flags.compile_miss_cause:
            comp.detail = f"cache miss after the restore ({flags.compile_restore}): {flags.compile_miss_cause}"
            comp.values["miss_cause"] = flags.compile_miss_cause
    else:
        comp.missing = no_log or "no torch.compile total line (eager mode, or the engine did not get that far)"
    phases.append(comp)

    g = Phase("cuda_graphs", "CUDA graph capture")
    graphs = _first(vlines, rx["cuda_graphs"])
    if graphs is not None:
        line, m = graphs
        g.end, g.seconds = line.at, float(m.group(1))
        g.start = line.at - timedelta(seconds=g.seconds)
        g.detail = f"{float(m.group(2)):.2f} GiB"
    else:
        g.missing = no_log or "no graph-capture line (--enforce-eager captures none)"
    phases.append(g)

    eng = Phase("engine_init", "engine init")
    einit = _first(vlines, rx["engine_init"])
    if einit is not None:
        line, m = einit
        eng.end, eng.seconds = line.at, float(m.group(1))
        eng.start = line.at - timedelta(seconds=eng.seconds)
        if m.group(2):
            eng.values["compilation_s"] = float(m.group(2))
        eng.detail = ("profile, KV cache, warm-up" + (f" (includes {float(m.group(2)):.1f} s compile)"
                                                      if m.group(2) else ""))
        kv = _first(vlines, rx["kv_cache"])
        if kv:
            eng.values["kv_cache_gib"] = float(kv[1].group(1))
        if _first(vlines, rx["plan_applied"]):
            flags.startup_plan = "applied"
        elif _first(vlines, rx["plan_refused"]):
            flags.startup_plan = "refused"
        elif _first(vlines, rx["plan_saved"]):
            flags.startup_plan = "saved"
        if flags.startup_plan:
            eng.values["startup_plan"] = flags.startup_plan
            eng.detail += {"applied": "; startup plan applied (memory profiling skipped)",
                           "refused": "; startup plan refused (free memory below its baseline), profiled",
                           "saved": "; profiled, startup plan saved for the next start"}[flags.startup_plan]
    else:
        eng.missing = no_log or "no init-engine line"
    phases.append(eng)

    ready = Phase("ready", "ready")
    ready_at = _condition(pod, "Ready")
    if ready_at is None:
        ready.missing = "pod not Ready (yet)"
    else:
        ready.start = main_start or (banner[0].at if banner else None)
        ready.end = ready_at
        ready.seconds = _seconds(ready.start, ready.end)
        ready.detail = "container start -> Ready (startup probe on /health)"
        if ready.start is None:
            ready.missing = f"no start time of the {serving_container} container"
    phases.append(ready)

    ft = Phase("first_token", "first token")
    rec = first_token
    if rec is None:
        probe = json_events(split_log("\n".join(logs.values())), "warmstart.first_token")
        rec = probe[-1][1] if probe else None
    if rec and rec.get("ttft_s") is not None:
        ft.seconds = float(rec["ttft_s"])
        ft.end = parse_time(rec.get("at")) or (ready_at + timedelta(seconds=ft.seconds) if ready_at else None)
        ft.start = ft.end - timedelta(seconds=ft.seconds) if ft.end else None
        ft.detail = "one max_tokens=1 streaming completion after /health"
        if rec.get("healthy_at"):
            ft.values["healthy_at"] = rec["healthy_at"]
    elif rec:
        ft.missing = f"first-token probe {rec.get('result', 'failed')}: {rec.get('reason') or 'no time'}"
    else:
        ft.missing = "no warmstart.first_token line (the first-token sidecar is not wired, or has not run)"
    phases.append(ft)

    return PodStart(pod=meta.get("name", "?"), namespace=meta.get("namespace", "?"), node=node_name,
                    created=created, phases=phases, flags=flags, vllm_version=version, model_uri=model_uri,
                    weights_bytes=weights_bytes)


def _hash_dir(path: str) -> str | None:
    """`torch_compile_cache/<hash>` (or `.../torch_aot_compile/<hash>`) of a path vLLM logged."""
    m = re.search(r"(torch_compile_cache/(?:torch_aot_compile/)?[0-9a-f]{8,64})(?:/|$)", path)
    return m.group(1) if m else None


def recompile_cause(restore: str, aot_failed: tuple[LogLine, re.Match[str]] | None,
                    cache_dir: tuple[LogLine, re.Match[str]] | None, restored_dirs: list[str] | None) -> str:
    """Why vLLM compiled although the restore installed (or found) this key's cache, from vLLM's
    own lines: an AOT artifact it found and could not load (vllm/compilation/decorators.py logs
    the reason), a hash directory the restored cache lacks (one of vLLM's own hash factors
    differs from the key's, as `kv_cache_memory_bytes` did in https://github.com/vllm-project/vllm/issues/47356),
    or a directory it has but whose entries did not serve."""
    if aot_failed is not None:
        return (f"vLLM could not load the restored AOT artifact {aot_failed[1].group(1)}: "
                f"{aot_failed[1].group(2).strip()[:300]}")
    used = _hash_dir(cache_dir[1].group(1)) if cache_dir else None
    if used and restored_dirs is not None:
        if used not in restored_dirs:
            held = ", ".join(restored_dirs[:4]) or "none"
            return (f"vLLM hashed its config to {used}, which the {restore} cache does not hold ({held}): one of "
                    "vLLM's own hash factors (a vLLM env var, an argument the key leaves out, the code or "
                    "compiler build) differs from what the key covers")
        return (f"the {restore} cache holds vLLM's {used}, yet vLLM compiled: its entries did not serve "
                "(a partial publish, or a torch/Triton build the key does not tell apart)")
    return ("vLLM compiled although the restore succeeded and its log does not say why "
            "(VLLM_LOGGING_LEVEL=DEBUG logs 'torch.compile cache factors')")


def utc(dt: datetime) -> datetime:
    return dt.astimezone(timezone.utc)
