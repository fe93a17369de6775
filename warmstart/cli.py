"""The `warmstart` command."""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

from .errors import ConfigError, ConfigErrors
# Re-exported: callers and tests read them as cli.EXIT_*.
from .exit_codes import (  # noqa: F401
    EXIT_CHANGES,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_POLICY,
    EXIT_PREFLIGHT,
    EXIT_PREREQUISITES,
)


def project_dir() -> Path:
    """The Pulumi project: the nearest folder upwards holding Pulumi.yaml (else the cwd)."""
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / "Pulumi.yaml").is_file():
            return d
    return here


def _render(args: argparse.Namespace) -> int:
    from . import render

    root = project_dir()
    out = Path(args.out) if args.out else root / "build" / args.stack
    started = time.perf_counter()
    rendered = render.run_program(root / "stacks", args.stack)
    try:
        render.write(rendered, out)
    except render.OutputDirNotOurs as err:
        print(f"warmstart: {err}", file=sys.stderr)
        return EXIT_FAILED
    elapsed = time.perf_counter() - started
    # Relative to where the command ran when below it (`build/dev`), as the user would type it.
    shown = out.resolve().relative_to(Path.cwd().resolve()) if out.resolve().is_relative_to(Path.cwd().resolve()) else out
    print(render.table(rendered.stack_plan))
    print(f"\nrendered stack '{args.stack}' ({rendered.stack_plan.cluster_mode} mode): "
          f"{len(rendered.kubernetes_objects)} Kubernetes objects, {len(rendered.cloud_resources)} cloud "
          f"resources -> {shown} in {elapsed:.2f}s")
    return EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    from . import render

    _, stack_plan = render.load_plan(project_dir() / "stacks", args.stack)
    print(render.table(stack_plan))
    return EXIT_OK


def _config_reference(args: argparse.Namespace) -> int:
    from .reference import config_reference

    print(config_reference(), end="")
    return EXIT_OK


def _engine(args: argparse.Namespace) -> int:
    from . import automation

    if getattr(args, "env", None):
        from .automation import environment

        return environment.run_environment(environment.request_from_args(args, project_dir()))
    return automation.execute(automation.request_from_args(args, project_dir()))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="warmstart", description="vLLM on Amazon EKS with fast cold starts.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("render", help="render a stack offline (Pulumi mocks): Kubernetes YAML, cloud.json, plan.json")
    r.add_argument("--stack", default="dev", help="stack name, i.e. stacks/Pulumi.<stack>.yaml (default: dev)")
    r.add_argument("--out", help="output folder (default: build/<stack>)")
    r.set_defaults(func=_render)
    v = sub.add_parser("validate", help="validate a stack's config and print its plan")
    v.add_argument("--stack", default="dev")
    v.set_defaults(func=_validate)
    c = sub.add_parser("config-reference", help="print the stack config reference (Markdown)")
    c.set_defaults(func=_config_reference)
    from .automation import add_parsers
    from .automation.environment import add_env_arguments
    from .coldstart.command import add_parsers as add_coldstart_parsers

    add_parsers(sub, _engine)
    add_env_arguments(sub)  # `--env ENV` or `--stack NAME` on preview, up, refresh, destroy
    add_coldstart_parsers(sub, project_dir)
    from .drill.command import add_parser as add_drill_parser

    add_drill_parser(sub, project_dir)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ConfigErrors) as err:
        lines = [str(e) for e in err.errors] if isinstance(err, ConfigErrors) else [str(err)]
        print(f"warmstart: invalid stack config ({len(lines)} problem{'s' if len(lines) > 1 else ''}):",
              file=sys.stderr)
        for line in lines:
            print(f"  - {line}", file=sys.stderr)
        return EXIT_CONFIG


def entry() -> None:
    """The `warmstart` console script and `python -m warmstart.cli`: `main`, then exit."""
    code = main()
    # At exit the interpreter runs full collections over every object still alive (CPython 3.11
    # Python/pylifecycle.c `finalize_modules` and Python/pystate.c `interpreter_clear` call
    # `_PyGC_CollectNoFail`), and a command that loaded the Pulumi SDKs holds ~300k of them:
    # those passes were about a sixth of a `warmstart render` of dev (0.6 s), spent on memory the
    # exit hands back anyway. Frozen objects are left out of every collection
    # (https://docs.python.org/3/library/gc.html#gc.freeze); modules are still torn down, the
    # standard streams flushed and atexit handlers run; only an object in a reference cycle goes
    # unfinalised, which CPython never promised at exit
    # (https://docs.python.org/3/reference/datamodel.html#object.__del__).
    # Only here, at the process's end: a test or a program that calls `main` collects as before.
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
