"""`warmstart coldstart`, `warmstart wake-bench` and `warmstart bench-loader`: arguments and what
they run, for cli.py.

Both read the stack's plan (the same validation as `warmstart render`, so a bad config exits 2),
then the cluster with the user's kubeconfig. No client, no kubeconfig or an unreachable cluster
is one clear line and exit 4 (a missing prerequisite), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..exit_codes import EXIT_FAILED, EXIT_OK, EXIT_PREREQUISITES
from .reader import ReaderError


def add_parsers(sub: Any, project_dir: Callable[[], Path]) -> None:
    c = sub.add_parser("coldstart", help="per-phase cold-start report of a model's pods (predicted beside measured)")
    c.add_argument("--stack", default="dev")
    c.add_argument("--model", help="model name (default: the stack's only model)")
    c.add_argument("--pod", help="one pod (default: every pod of the model)")
    c.add_argument("--plot", help="write a timeline of the pods' phases (.png, .svg, .pdf or .html)")
    c.add_argument("--json", action="store_true", help="print the records as JSON instead of tables")
    c.add_argument("--history", action="store_true",
                   help="summarise the records the pods uploaded (p50/p95 per phase, split by cache and node)")
    c.add_argument("--kubeconfig")
    c.add_argument("--context")
    c.set_defaults(func=lambda a: coldstart(a, project_dir()))
    w = sub.add_parser("wake-bench", help="measure a standby engine's wake on its GPU node and record it in the "
                                          "cold-start history (sleep, wake, first token)")
    w.add_argument("--stack", default="dev")
    w.add_argument("--model", help="model name (default: the stack's only model)")
    w.add_argument("--pod", help="the pod to measure (default: a sleeping standby pod of the model)")
    w.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole measurement")
    w.add_argument("--no-record", action="store_true", help="print the record, do not upload it")
    w.add_argument("--pool", help="a standby pool: measure what its k sleeping engines keep on a spare engine "
                                  "host's GPUs (the residue per sleeper) instead of one model's wake")
    w.add_argument("--namespace", help="with --pool: the pool's namespace (default: the platform's)")
    w.add_argument("--kubeconfig")
    w.add_argument("--context")
    w.set_defaults(func=lambda a: wake_bench(a, project_dir()))
    b = sub.add_parser("bench-loader", help="measure the streamer from the model bucket on the model's GPU pool")
    b.add_argument("--stack", default="dev")
    b.add_argument("--model")
    b.add_argument("--max-gib", type=float, default=0.0, help="stream at most this much of the model (default: all)")
    b.add_argument("--timeout", type=float, default=3 * 3600, help="seconds to wait for the Job (default 3 h)")
    b.add_argument("--kubeconfig")
    b.add_argument("--context")
    b.set_defaults(func=lambda a: bench_loader(a, project_dir()))


def _fail(message: str, code: int) -> int:
    print(f"warmstart: {message}", file=sys.stderr)
    return code


def _plan(args: argparse.Namespace, root: Path) -> tuple[Any, Any]:
    from .. import render
    from ..errors import ConfigError

    _, stack_plan = render.load_plan(root / "stacks", args.stack)
    names = [m.name for m in stack_plan.models]
    if args.model is None and len(names) == 1:
        return stack_plan, stack_plan.models[0]
    for m in stack_plan.models:
        if m.name == args.model:
            return stack_plan, m
    raise ConfigError("--model", f"stack {args.stack!r} has models {', '.join(names)}",
                      "pass --model with one of them", args.model)


def model_facts(stack_plan: Any, m: Any) -> Any:
    from .report import ModelFacts

    # EKS Auto Mode GPU nodes pull with SOCI parallel pull; Karpenter nodes do not by default.
    return ModelFacts(name=m.name, weights_bytes=m.weights_bytes, instance=m.instance,
                      compile_cache=m.compile_cache, parallel_pull=stack_plan.cluster_mode == "auto")


def coldstart(args: argparse.Namespace, root: Path) -> int:
    stack_plan, m = _plan(args, root)
    if args.history:
        return _history(stack_plan, m, args)
    from . import reader, report
    from ..manifests.serving import selector
    from ..plan.platform import platform_fact

    namespace = platform_fact(stack_plan, "namespace")
    try:
        cluster = reader.connect(args.kubeconfig, args.context)
        names = [args.pod] if args.pod else [p["metadata"]["name"] for p in
                                             reader.model_pods(cluster, namespace, m.name, selector(m.name))]
        if not names:
            return _fail(f"no pods of model {m.name} in namespace {namespace}", EXIT_FAILED)
        starts = [reader.read_pod_start(cluster, namespace, n) for n in names]
    except ReaderError as err:
        return _fail(str(err), EXIT_PREREQUISITES)
    facts = model_facts(stack_plan, m)
    if args.json:
        print(json.dumps([report.report_json(s, facts) for s in starts], indent=1, sort_keys=True))
    else:
        print("\n\n".join(report.table(s, facts) for s in starts))
    if args.plot:
        from . import plot

        try:
            out = plot.draw(starts, Path(args.plot), f"{m.name}: cold-start phases")
        except RuntimeError as err:
            return _fail(str(err), EXIT_PREREQUISITES)
        print(f"\ntimeline -> {out}")
    return EXIT_OK


def _history(stack_plan: Any, m: Any, args: argparse.Namespace) -> int:
    from . import history
    from ..manifests.first_token import record_prefix
    from ..plan.platform import platform_fact

    bucket = platform_fact(stack_plan, "compile_cache_bucket")
    if bucket is None:
        return _fail(f"model {m.name}: the stack has no compile-cache bucket, where the records are kept", EXIT_FAILED)
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        s3 = boto3.client("s3", region_name=platform_fact(stack_plan, "region"),
                          config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3}))
        records = history.read_records(s3, bucket, record_prefix(m.name))
    except (BotoCoreError, ClientError) as err:
        return _fail(f"reading s3://{bucket}/{record_prefix(m.name)}: {err}", EXIT_PREREQUISITES)
    summary = history.summarise(records)
    if args.json:
        print(json.dumps([{"split": list(k), "phases": v} for k, v in summary.items()], indent=1))
    else:
        print(f"{len(records)} record(s) under s3://{bucket}/{record_prefix(m.name)}\n")
        print(history.table(summary))
    return EXIT_OK


def wake_record_key(model: str, record: dict[str, Any]) -> str:
    """Where a measured wake goes: beside the pods' cold-start records, which `--history` reads."""
    from ..manifests.first_token import record_prefix

    stamp = str(record.get("written_at") or "").replace(":", "").replace("+", "Z")[:32] or str(int(time.time()))
    pod = "".join(c for c in str(record.get("pod") or "pod") if c.isalnum() or c in "-.")[:253]
    return f"{record_prefix(model)}wake-{pod}-{stamp}.json"


def wake_bench_command(m: Any, timeout: float) -> list[str]:
    """What runs in the vLLM container: its own python3, the script's source inline (the pod needs
    no ConfigMap), the engine on the pod's loopback."""
    from ..podside import wake_bench as script

    level = m.standby.sleep_level if m.standby else 1
    return ["python3", "-c", Path(script.__file__).read_text(), "--model", m.name, "--level", str(level),
            "--weights-bytes", str(m.weights_bytes), "--timeout", str(timeout),
            "--predicted-host-bytes", str(m.standby.sleeping_host_bytes if m.standby else 0)]


def parse_wake_output(text: str) -> dict[str, Any] | None:
    """The script's record line, the last JSON line with its event."""
    return _last_event(text, "warmstart.wake")


def _last_event(text: str, event: str) -> dict[str, Any] | None:
    """The last JSON object line of `text` that names `event`."""
    for line in reversed(text.splitlines()):
        if line.startswith("{") and f'"{event}"' in line:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc
    return None


def _pick_sleeper(pods: list[dict[str, Any]]) -> str | None:
    """A Running, Ready pod the standby actuator has labelled asleep (`warmstart.io/engine`; a
    sleeping engine's pod stays Ready, docs/scale-out.md): a standby model's sleeper."""
    from ..manifests.serving import ENGINE_LABEL

    for p in sorted(pods, key=lambda p: p["metadata"]["name"]):
        status = p.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        asleep = (p["metadata"].get("labels") or {}).get(ENGINE_LABEL) == "asleep"
        if status.get("phase") == "Running" and ready and asleep:
            return p["metadata"]["name"]
    return None


def residue_command(timeout: float) -> list[str]:
    """What runs in an engine host's container: the same script, against the host's supervisor on
    the pod's loopback (warmstart/decisions/standby_pool.py SUPERVISOR_PORT)."""
    from ..decisions.standby_pool import SUPERVISOR_PORT
    from ..podside import wake_bench as script

    return ["python3", "-c", Path(script.__file__).read_text(), "--residue-of",
            f"http://127.0.0.1:{SUPERVISOR_PORT}", "--timeout", str(timeout)]


def parse_residue_output(text: str) -> dict[str, Any] | None:
    from ..podside.wake_bench import RESIDUE_EVENT

    return _last_event(text, RESIDUE_EVENT)


def _pick_spare_host(pods: list[dict[str, Any]]) -> str | None:
    """A Running, Ready engine host labelled `warmstart.io/engine=asleep`: a spare, every engine asleep
    (its readiness is every engine up; the pool actuator labels a host awake while one serves)."""
    return _pick_sleeper(pods)


def wake_bench_pool(args: argparse.Namespace, root: Path) -> int:
    """`wake-bench --pool`: the k-sleeper residue of one spare host, beside the plan's default."""
    from . import reader
    from .. import render
    from ..decisions.standby_pool import default_residue_bytes
    from ..plan.platform import platform_fact

    _, stack_plan = render.load_plan(root / "stacks", args.stack)
    namespace = args.namespace or platform_fact(stack_plan, "namespace")
    try:
        cluster = reader.connect(args.kubeconfig, args.context)
        pod = args.pod or _pick_spare_host(reader.model_pods(cluster, namespace, f"pool {args.pool}",
                                                             {"warmstart.io/standby-pool": args.pool}))
        if pod is None:
            return _fail(f"no spare engine host of pool {args.pool} in {namespace} (a Running, Ready pod labelled "
                         "warmstart.io/standby-pool and warmstart.io/engine=asleep); wait until the pool is at rest, "
                         "or pass --namespace", EXIT_FAILED)
        from kubernetes.stream import stream

        print(f"measuring the sleepers' GPU residue on {namespace}/{pod}", flush=True)
        try:
            text = stream(cluster.core.connect_get_namespaced_pod_exec, pod, namespace,
                          command=residue_command(args.timeout), stderr=True, stdin=False, stdout=True,
                          tty=False, _request_timeout=args.timeout + 60)
        except Exception as exc:  # the stream client raises its own types; one line, not a traceback
            raise reader.ReaderError(f"running the residue bench in {namespace}/{pod}: {exc}") from None
    except ReaderError as err:
        return _fail(str(err), EXIT_PREREQUISITES)
    record = parse_residue_output(text if isinstance(text, str) else str(text))
    if record is None or record.get("result") != "ok":
        return _fail(f"the residue bench failed: {(record or {}).get('reason') or text[-500:]}", EXIT_FAILED)
    print(residue_summary(record, default_residue_bytes(len(record["gpus"]))))
    if args.no_record:
        print(json.dumps(record, indent=1, sort_keys=True))
    return EXIT_OK


def residue_summary(record: dict[str, Any], default_bytes: int) -> str:
    gib = 2**30
    fullest = max(record["gpus"], key=lambda g: g["used_bytes"])
    per = record["residue_bytes_per_sleeper"]
    return (f"{record['sleepers']} sleepers ({', '.join(record['models'])}) keep {fullest['used_bytes'] / gib:.1f} GiB "
            f"of GPU {fullest['index']}'s {fullest['total_bytes'] / gib:.0f} GiB: {per / gib:.2f} GiB per sleeper per GPU, "
            f"{per / default_bytes:.2f}x the planning default {default_bytes / gib:.0f} GiB; set the pool's "
            f"sleepingResidueGiB to {math.ceil(per / gib * 10) / 10:.1f} to plan with the measured figure")


def wake_bench(args: argparse.Namespace, root: Path) -> int:
    if getattr(args, "pool", None):
        return wake_bench_pool(args, root)
    stack_plan, m = _plan(args, root)
    if m.standby is None:
        return _fail(f"model {m.name} has no standby engines, so it runs without vLLM's sleep mode; add "
                     "models[].standby to measure a wake", EXIT_FAILED)
    from . import reader
    from ..manifests.serving import selector
    from ..plan.platform import platform_fact

    namespace = platform_fact(stack_plan, "namespace")
    try:
        cluster = reader.connect(args.kubeconfig, args.context)
        pod = args.pod or _pick_sleeper(reader.model_pods(cluster, namespace, m.name, selector(m.name)))
        if pod is None:
            return _fail(f"no sleeping standby pod of {m.name} in {namespace} (a Running, Ready pod labelled "
                         "warmstart.io/engine=asleep); "
                         "pass --pod to measure one that is idle", EXIT_FAILED)
        from kubernetes.stream import stream

        print(f"measuring a wake of {namespace}/{pod} (sleep level {m.standby.sleep_level}, "
              f"{m.weights_bytes / 2**30:.1f} GiB)", flush=True)
        try:
            text = stream(cluster.core.connect_get_namespaced_pod_exec, pod, namespace, container="vllm",
                          command=wake_bench_command(m, args.timeout), stderr=True, stdin=False, stdout=True,
                          tty=False, _request_timeout=args.timeout + 60)
        except Exception as exc:  # the stream client raises its own types; one line, not a traceback
            raise reader.ReaderError(f"running the wake bench in {namespace}/{pod}: {exc}") from None
    except ReaderError as err:
        return _fail(str(err), EXIT_PREREQUISITES)
    record = parse_wake_output(text if isinstance(text, str) else str(text))
    if record is None or record.get("result") != "ok":
        return _fail(f"the wake bench failed: {(record or {}).get('reason') or text[-500:]}", EXIT_FAILED)
    record.setdefault("namespace", namespace)
    record["pod"] = record.get("pod") or pod
    ph = record["phases"]
    print(f"wake {ph['wake']:.2f} s ({record.get('wake_gib_per_s') or 0:.1f} GiB/s), first token "
          f"{ph['first_token']:.2f} s" + (f", sleep {ph['sleep']:.2f} s" if "sleep" in ph else ""))
    mem = record.get("host_memory") or {}
    if mem.get("peak_bytes"):
        # Measured on the user's own node, beside what the pod's memory limit was checked against.
        print(f"host memory asleep {(mem.get('asleep_bytes') or 0) / 2**30:.1f} GiB "
              f"({mem.get('asleep_per_weight') or 0:.2f}x the weights), container peak {mem['peak_bytes'] / 2**30:.1f} GiB"
              + (f", predicted {mem['predicted_bytes'] / 2**30:.1f} GiB ({mem['peak_per_prediction']:.2f}x)"
                 if mem.get("predicted_bytes") else ""))
    if args.no_record:
        print(json.dumps(record, indent=1, sort_keys=True))
        return EXIT_OK
    return _upload_wake(stack_plan, m, record)


def _upload_wake(stack_plan: Any, m: Any, record: dict[str, Any], s3: Any = None) -> int:
    from ..plan.platform import platform_fact

    bucket = platform_fact(stack_plan, "compile_cache_bucket")
    if bucket is None:
        return _fail(f"model {m.name}: the stack has no compile-cache bucket, where the records are kept "
                     "(--no-record prints it)", EXIT_FAILED)
    key = wake_record_key(m.name, record)
    try:
        if s3 is None:
            import boto3
            from botocore.config import Config

            s3 = boto3.client("s3", region_name=platform_fact(stack_plan, "region"),
                              config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3}))
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(record, sort_keys=True, indent=1).encode(),
                          ContentType="application/json")
        except (BotoCoreError, ClientError) as err:
            return _fail(f"writing s3://{bucket}/{key}: {err}", EXIT_PREREQUISITES)
    except ImportError as err:
        return _fail(f"boto3 is needed to record the wake ({err}); --no-record prints it", EXIT_PREREQUISITES)
    print(f"recorded s3://{bucket}/{key} (warmstart coldstart --history --model {m.name} reports it)")
    return EXIT_OK


def bench_loader(args: argparse.Namespace, root: Path) -> int:
    stack_plan, m = _plan(args, root)
    from . import reader
    from ..manifests import bench_loader as bl
    from ..manifests import pod_scripts
    from ..plan.platform import platform_fact

    namespace, region = platform_fact(stack_plan, "namespace"), platform_fact(stack_plan, "region")
    job = bl.bench_loader_job(m, namespace, region, max_bytes=int(args.max_gib * 2**30))
    cm = pod_scripts.config_map_spec(bl.CONFIGMAP_NAME, namespace, bl.SCRIPT_KEY)
    try:
        cluster = reader.connect(args.kubeconfig, args.context)
        from kubernetes import client

        batch = client.BatchV1Api(cluster.api_client)
        reader._optional(cluster.core.delete_namespaced_config_map, bl.CONFIGMAP_NAME, namespace)
        reader._call(cluster.core.create_namespaced_config_map, "creating the script ConfigMap", namespace, cm)
        reader._optional(batch.delete_namespaced_job, job["metadata"]["name"], namespace,
                         propagation_policy="Foreground")
        time.sleep(2)
        reader._call(batch.create_namespaced_job, "creating the bench Job", namespace, job)
        print(f"job {namespace}/{job['metadata']['name']} on {m.instance.instance_type}: waiting "
              f"(a new GPU node may take minutes)", flush=True)
        deadline = time.monotonic() + args.timeout
        line = None
        while time.monotonic() < deadline:
            status = reader._call(batch.read_namespaced_job_status, "reading the Job",
                                  job["metadata"]["name"], namespace).get("status") or {}
            if status.get("succeeded") or status.get("failed"):
                pods = reader._call(cluster.core.list_namespaced_pod, "listing the Job's pods", namespace,
                                    label_selector=f"job-name={job['metadata']['name']}")
                for p in pods.get("items") or []:
                    text = reader._optional(cluster.core.read_namespaced_pod_log, p["metadata"]["name"], namespace,
                                            limit_bytes=1 << 20) or ""
                    text = text if isinstance(text, str) else json.dumps(text)
                    line = next((json.loads(x) for x in reversed(text.splitlines())
                                 if x.startswith("{") and '"warmstart.bench_loader"' in x), None)
                break
            time.sleep(10)
    except ReaderError as err:
        return _fail(str(err), EXIT_PREREQUISITES)
    if line is None:
        return _fail("the bench Job gave no result line (timed out, or its pod failed: kubectl describe job "
                     f"-n {namespace} {job['metadata']['name']})", EXIT_FAILED)
    print(format_bench(line))
    return EXIT_OK if line.get("result") == "ok" else EXIT_FAILED


def format_bench(r: dict[str, Any]) -> str:
    def rate(k: str) -> str:
        v = (r.get(k) or {}).get("gib_per_s")
        return f"{v:.2f} GiB/s" if v else f"failed ({(r.get(k) or {}).get('error')})"

    lines = [f"{r.get('files')} file(s), {(r.get('bytes') or 0) / 2**30:.1f} GiB from {r.get('model_uri')}",
             f"  streamer defaults  {rate('defaults')}",
             f"  warmstart tuning   {rate('tuned')}",
             f"  parallel GET       {rate('ceiling')}  (ceiling)"]
    if r.get("network_gib_per_s"):
        lines.append(f"  network baseline   {r['network_gib_per_s']:.2f} GiB/s")
    for k, label in (("tuned_over_defaults_time", "tuned / defaults time"), ("tuned_over_ceiling", "tuned / ceiling"),
                     ("ceiling_over_network", "ceiling / network baseline")):
        if r.get(k) is not None:
            lines.append(f"  {label} = {r[k]:.2f}")
    lines.append(f"recommendation: {r.get('recommendation')}")
    return "\n".join(lines)
