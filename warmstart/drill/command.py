"""`warmstart drill`: arguments and what they run, for cli.py.

A dry run by default (no cluster needed): the plan's changes, bounds and predictions. `--apply`
runs it with the user's kubeconfig; `--restore` undoes what earlier runs left.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

from ..errors import ConfigError, ConfigErrors
from ..exit_codes import EXIT_DRILL_FAILED, EXIT_FAILED, EXIT_OK, EXIT_PREREQUISITES


def add_parser(sub: Any, project_dir: Callable[[], Path]) -> None:
    d = sub.add_parser("drill", help="scale drill on a deployed stack: load through the router, every new replica's "
                                     "times and path beside the render's prediction (dry run unless --apply)")
    d.add_argument("--stack", default="dev")
    d.add_argument("--model", help="model name (default: the stack's only model)")
    d.add_argument("--apply", action="store_true", help="run it (default: print what it would change)")
    d.add_argument("--restore", action="store_true", help="undo what earlier runs left in the namespace, then exit")
    d.add_argument("--confirm-production", action="store_true", help="run on a stack marked `production: true`")
    d.add_argument("--rate", type=float, default=4.0, help="requests per second (default 4)")
    d.add_argument("--duration", type=int, default=600, help="seconds of load (default 600)")
    d.add_argument("--concurrency", type=int, default=32, help="requests in flight at most (default 32)")
    d.add_argument("--max-requests", type=int, default=0, help="requests in all (default: rate x duration)")
    d.add_argument("--max-tokens", type=int, default=32)
    d.add_argument("--prefix-groups", type=int, default=8, help="distinct shared prompt prefixes (default 8)")
    d.add_argument("--settle", type=int, default=900,
                   help="seconds to wait after the load for the replicas it started (default 900)")
    d.add_argument("--no-fallback", action="store_true", help="skip the cache-bypassed pod")
    d.add_argument("--lose-prepared-node", action="store_true",
                   help="also cordon a node holding the model's staged weights and evict its pods")
    d.add_argument("--plot", help="write the picture (.png/.svg)")
    d.add_argument("--record-dir", default="build/drill", help="where the run's record is written (default build/drill)")
    d.add_argument("--json", action="store_true")
    d.add_argument("--no-record", action="store_true",
                   help="do not file the record in the cold-start history (s3://<compile-cache bucket>/<model>/coldstart/)")
    d.add_argument("--kubeconfig")
    d.add_argument("--context")
    d.set_defaults(func=lambda a: drill(a, project_dir()))


def _fail(message: str, code: int) -> int:
    print(f"warmstart: {message}", file=sys.stderr)
    return code


def drill(args: argparse.Namespace, root: Path, call: Any = None) -> int:
    from .. import render
    from ..coldstart.command import _plan
    from ..plan.platform import platform_fact
    from . import plan as dp

    stack_plan, m = _plan(args, root)
    bounds = dp.Bounds(rate=args.rate, duration_s=args.duration, concurrency=args.concurrency,
                       max_requests=args.max_requests, max_tokens=args.max_tokens, prefix_groups=args.prefix_groups,
                       settle_s=args.settle)
    bad = dp.check_bounds(bounds)
    if bad:
        raise ConfigErrors([ConfigError(flag, rule, fix, value) for flag, rule, fix, value in bad])
    cluster = getattr(stack_plan, "cluster", None)
    pool = next((x for x in cluster.pools if x.name == m.pool), None) if cluster else None
    # A model stack has no pool plan of its own: its node-hour is the one `warmstart render` shows
    # for it (its platform pool's list price), with the same source.
    listed = None if cluster else render.model_stack_price(stack_plan, m)
    p = dp.plan(args.stack, m, platform_fact(stack_plan, "namespace"), pool.warm_nodes if pool else 0, bounds,
                fallback=not args.no_fallback, lose_node=args.lose_prepared_node, pool=pool, listed=listed)
    production = bool(getattr(stack_plan.config, "production", False))
    if production and (args.apply or args.restore) is False:
        print(f"note: stack {args.stack} is marked production (production: true); --apply also needs --confirm-production")
    if production and args.apply and not args.confirm_production:
        raise ConfigError("production", f"stack {args.stack!r} is marked production, and a drill adds load and "
                          "replicas to it", "run it on a staging stack, or pass --confirm-production", True)
    if not args.apply and not args.restore:
        print(dp.describe(p))
        print("\ndry run: nothing was changed; pass --apply to run it (docs/drill.md)")
        return EXIT_OK
    from . import restore, run

    try:
        if call is None:
            from ..coldstart import reader

            call = run.kube_call(reader.connect(args.kubeconfig, args.context).api_client)
        if args.restore:
            done = restore.restore(call, p.namespace, None)
            print("\n".join(done) if done else "nothing to restore")
            return EXIT_OK
        print(dp.describe(p), flush=True)
        out = run.execute(p, m, call)
    except (run.DrillError, RuntimeError) as err:
        return _fail(str(err), EXIT_PREREQUISITES if "kubeconfig" in str(err) or "client" in str(err) else EXIT_FAILED)
    except Exception as err:
        from ..coldstart.reader import ReaderError

        if isinstance(err, ReaderError):
            return _fail(str(err), EXIT_PREREQUISITES)
        raise
    if out.cancelled:
        return _fail(f"drill {p.run_id} cancelled; restored {len(out.restored)} change(s)", EXIT_FAILED)
    from . import report

    rec = report.record(p, out.lines, out.load)
    path = run.write_record(p, rec, Path(args.record_dir))
    if args.json:
        print(json.dumps(rec, indent=1, sort_keys=True))
    else:
        print("\n" + report.table(out.lines))
    print(f"\nrecord -> {path}")
    if not args.no_record:
        print(_file_record(stack_plan, m, p, rec))
    if args.plot:
        print(f"picture -> {report.draw(out.lines, Path(args.plot), f'{m.name}: drill {p.run_id}')}")
    passed = all(line.passed for line in out.lines)
    print(f"drill {p.run_id}: {'every line passed' if passed else 'a line FAILED'}")
    return EXIT_OK if passed else EXIT_DRILL_FAILED


def _file_record(stack_plan: Any, m: Any, p: Any, rec: dict[str, Any]) -> str:
    """The record beside the pods' cold-start records, which `warmstart coldstart --history`
    reports as a `drill` split; a failed upload is a line, not the drill's verdict."""
    from ..manifests.first_token import record_prefix
    from ..plan.platform import platform_fact

    bucket = platform_fact(stack_plan, "compile_cache_bucket")
    if bucket is None:
        return "not filed: the stack has no compile-cache bucket, where the records are kept"
    key = f"{record_prefix(m.name)}drill-{p.run_id}.json"
    try:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError as err:
        return f"not filed: boto3 is needed ({err})"
    try:
        s3 = boto3.client("s3", region_name=platform_fact(stack_plan, "region"),
                          config=Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 3}))
        s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(rec, sort_keys=True, indent=1).encode(),
                      ContentType="application/json")
    except (BotoCoreError, ClientError) as err:
        return f"not filed in s3://{bucket}/{key}: {err}"
    return f"filed s3://{bucket}/{key} (warmstart coldstart --history --model {m.name} reports it as `drill`)"
