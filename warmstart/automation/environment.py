"""`warmstart preview | up | refresh | destroy --env ENV`: an environment's stacks, in order.

An environment is a platform stack, `stacks/Pulumi.<env>.yaml`, and the model stacks that name
it, `stacks/Pulumi.<name>.yaml` with `warmstart:platform: <env>` (one model each). A model stack
reads the platform's outputs through a StackReference, so:

- `up`, `preview`, `refresh`: the platform first; then, only if it did not fail, its model
  stacks concurrently (at most `MAX_PARALLEL` at a time). One model stack failing does not stop
  the others. A `preview` of a platform that has no `PLATFORM_OUTPUT` output yet (never deployed)
  reports its model stacks as skipped: their StackReference would have nothing to read.
- `destroy`: the model stacks first, concurrently (one that is not in the backend has nothing to
  destroy and is skipped), then the platform, and only if every model stack is gone: a platform
  destroyed under a live model stack would leave its Kubernetes objects without a cluster to
  delete them from.

Each stack runs through the single-stack path, `commands.execute` (validation, prerequisites,
account, preflight, engine, exactly as `--stack NAME`), with its own `--summary` document, read
back into one summary table and, with `--summary FILE`, one JSON document. The exit code is the
worst stack's (`worst_exit_code`). Before anything runs, the environment is resolved (unknown
env, dangling `warmstart:platform`), every stack's config is validated (exit 2, no engine call)
and the prerequisites are checked once (exit 4, one message, no engine call).

Each model stack can still be run alone: `warmstart up --stack <name>`, `pulumi up -s <name>`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from ..config import PLATFORM_KEY, read_stack_file, stack_file
from ..plan import platform as platform_contract
from ..errors import ConfigError, ConfigErrors, Problems
from ..exit_codes import (
    EXIT_CHANGES,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_POLICY,
    EXIT_PREFLIGHT,
    EXIT_PREREQUISITES,
)
# Called through their modules, so a test that replaces `commands.execute`,
# `prerequisites.check_prerequisites` or `engine.open_stack` replaces what runs here.
from . import commands, engine, prerequisites
from .request import VALIDATED_OPERATIONS, PrerequisitesMissing, Request

ENV_OPERATIONS = ("preview", "up", "refresh", "destroy")
PLATFORM_OUTPUT = platform_contract.OUTPUT
"""The platform stack output whose presence says the platform is deployed: what its model
stacks' StackReference reads."""
MAX_PARALLEL = 4
"""Model stacks run at once: each is a Pulumi engine plus a Python program (hundreds of MiB),
and each talks to the same EKS API server and AWS account."""

PLATFORM, MODEL = "platform", "model"
SKIPPED = "skipped"
NOT_RUN = "not-run"
# Least to most severe. A failed engine run may have changed some resources and not others, so
# it outranks the results that stop before any change (prerequisites, config, policy,
# preflight); drift (`--expect-no-changes`) is a finding, not an error.
SEVERITY = (EXIT_OK, EXIT_CHANGES, EXIT_PREFLIGHT, EXIT_POLICY, EXIT_CONFIG, EXIT_PREREQUISITES, EXIT_FAILED)
# Results after which a platform's model stacks still run: drift in the platform does not stop
# the model stacks' drift check.
_PLATFORM_FINE = frozenset({EXIT_OK, EXIT_CHANGES})


# --------------------------------------------------------------------------------------
# Which stacks an environment has


def _shown(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _stack_names(stacks_dir: Path) -> list[str]:
    return sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in stacks_dir.glob("Pulumi.*.yaml"))


def platforms_of(stacks_dir: Path) -> dict[str, str | None]:
    """Every stack file's `warmstart:platform` (None for a platform stack), by stack name."""
    return {name: read_stack_file(stack_file(stacks_dir, name)).get(PLATFORM_KEY) for name in _stack_names(stacks_dir)}


def model_stacks(stacks_dir: Path, env: str) -> list[str]:
    """The model stacks of platform stack `env`: every `Pulumi.<name>.yaml` in `stacks_dir` whose
    `warmstart:platform` is `env`, sorted.

    ConfigError(s) when `env` has no platform stack file, when `env` is a model stack, and when
    any stack file names a platform that has no stack file or is itself a model stack (checked
    for every file, not only `env`'s, so that a misspelt platform cannot leave a model out of
    its environment without a word)."""
    found = platforms_of(stacks_dir)
    platform_names = sorted(n for n, p in found.items() if p is None)
    choices = ", ".join(platform_names) or "none"
    problems = Problems()
    if env not in found:
        problems.add("--env", f"no platform stack file {_shown(stack_file(stacks_dir, env))}",
                     f"pick one of the platform stacks: {choices}", value=env)
    elif found[env] is not None:
        problems.add("--env", f"{_shown(stack_file(stacks_dir, env))} is a model stack (it has "
                     f"{PLATFORM_KEY}: {found[env]}), not a platform",
                     f"run it alone with `--stack {env}`, or its environment with `--env {found[env]}`", value=env)
    for name, platform in sorted(found.items()):
        if platform is None:
            continue
        key = f"{_shown(stack_file(stacks_dir, name))}: {PLATFORM_KEY}"
        if platform not in found:
            problems.add(key, f"model stack '{name}' names platform stack '{platform}', but there is no "
                         f"{_shown(stack_file(stacks_dir, platform))}",
                         f"set it to one of the platform stacks ({choices}), or create "
                         f"{_shown(stack_file(stacks_dir, platform))}", value=platform)
        elif found[platform] is not None:
            problems.add(key, f"model stack '{name}' names '{platform}', which is itself a model stack "
                         f"({PLATFORM_KEY}: {found[platform]})",
                         f"set it to the platform stack '{found[platform]}'", value=platform)
    problems.raise_if_any()
    return sorted(n for n, p in found.items() if p == env)


# --------------------------------------------------------------------------------------
# What each stack ended with


@dataclass(frozen=True)
class StackResult:
    """One stack's row of the environment summary."""

    stack: str
    role: str
    """platform | model"""
    operation: str
    result: str
    """A single-stack result (succeeded, failed, changes-found, ...), or skipped | not-run."""
    exit_code: int
    message: str = ""
    counts: dict[str, int] | None = None
    seconds: float = 0.0
    summary: dict[str, Any] | None = None
    """The stack's own `--summary` document, when it ran."""

    def doc(self) -> dict[str, Any]:
        return {"stack": self.stack, "role": self.role, "operation": self.operation, "result": self.result,
                "exitCode": self.exit_code, "message": self.message, "counts": self.counts,
                "durationSeconds": round(self.seconds, 3), "summary": self.summary}


def worst_exit_code(results: list[StackResult]) -> int:
    """The most severe exit code among the stacks' (SEVERITY); EXIT_OK for none."""
    return max((r.exit_code for r in results), key=SEVERITY.index, default=EXIT_OK)


def _changes(counts: dict[str, int] | None) -> str:
    if counts is None:
        return ""
    parts = [f"{n} {k}" for k, n in counts.items() if k != "same" and n]
    return ", ".join(parts) or "no changes"


def _first_line(message: str, width: int = 100) -> str:
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    line = lines[0].removeprefix("warmstart: ") if lines else ""
    return line if len(line) <= width else line[:width - 3] + "..."


def table(results: list[StackResult]) -> str:
    """The summary table: one row per stack, in the order they were run."""
    head = ("STACK", "ROLE", "OPERATION", "RESULT", "CHANGES", "DURATION", "ERROR")
    rows = [(r.stack, r.role, r.operation, r.result, _changes(r.counts),
             f"{r.seconds:.1f}s" if r.summary is not None else "",
             _first_line(r.message) if r.exit_code != EXIT_OK or r.result == SKIPPED else "")
            for r in results]
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (head, *rows))


# --------------------------------------------------------------------------------------
# Output of stacks running at once: every line labelled with its stack


_label = threading.local()


class _Labelled(io.TextIOBase):
    """Writes whole lines to `target`, each prefixed with `[stack] ` of the thread writing it,
    so the live output of stacks running at once stays readable."""

    def __init__(self, target: TextIO, lock: threading.Lock) -> None:
        self._target = target
        self._lock = lock
        self._pending: dict[int, str] = {}

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        name = getattr(_label, "stack", None)
        if name is None:
            with self._lock:
                self._target.write(s)
            return len(s)
        key = threading.get_ident()
        *lines, rest = (self._pending.pop(key, "") + s).split("\n")
        if rest:
            self._pending[key] = rest
        if lines:
            with self._lock:
                self._target.write("".join(f"[{name}] {ln}\n" for ln in lines))
        return len(s)

    def end_thread(self) -> None:
        rest = self._pending.pop(threading.get_ident(), "")
        if rest:
            self.write(rest + "\n")

    def flush(self) -> None:
        with self._lock:
            self._target.flush()


@contextlib.contextmanager
def _labelled_output() -> Iterator[tuple[_Labelled, _Labelled]]:
    lock = threading.Lock()
    saved = sys.stdout, sys.stderr
    out, err = _Labelled(saved[0], lock), _Labelled(saved[1], lock)
    sys.stdout, sys.stderr = out, err
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved


# --------------------------------------------------------------------------------------
# Running one stack, through the single-stack path


def _run_stack(request: Request, role: str) -> StackResult:
    """`commands.execute` for one stack, its outcome read back from its own summary document."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="warmstart-env-") as tmp:
        path = Path(tmp) / "summary.json"
        message = ""
        try:
            code = commands.execute(replace(request, summary_path=path))
        except (ConfigError, ConfigErrors) as err:
            # commands.execute wrote its summary and raised for cli.main to print; here the
            # other stacks go on, so it is printed with this stack's label.
            print(f"warmstart: invalid stack config: {err}", file=sys.stderr, flush=True)
            code, message = EXIT_CONFIG, str(err)
        except Exception as err:  # noqa: BLE001 - one stack's crash must not stop the others
            print(f"warmstart: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            return StackResult(request.stack, role, request.operation, "failed", EXIT_FAILED,
                               f"{type(err).__name__}: {err}", seconds=time.perf_counter() - started)
        doc = json.loads(path.read_text()) if path.is_file() else None
    seconds = time.perf_counter() - started
    if doc is None:
        return StackResult(request.stack, role, request.operation, "failed" if code else "succeeded", code,
                           message, seconds=seconds)
    return StackResult(request.stack, role, request.operation, doc["result"], code, doc["message"] or message,
                       doc["counts"], doc["durationSeconds"], doc)


def _skip(request: Request, role: str, why: str, result: str = SKIPPED, code: int = EXIT_OK) -> StackResult:
    return StackResult(request.stack, role, request.operation, result, code, why)


def _select(request: Request, cmd: Any) -> Any | None:
    """The stack, selected (never created); None when the backend does not have it."""
    from pulumi.automation.errors import StackNotFoundError

    try:
        return engine.open_stack(replace(request, operation="outputs"), cmd)
    except StackNotFoundError:
        return None


def platform_has_outputs(request: Request, cmd: Any) -> bool:
    """Whether the platform stack has the `PLATFORM_OUTPUT` output its model stacks read; False
    for a platform not in the backend or never deployed. Raises CommandError when the backend
    cannot say."""
    stack = _select(request, cmd)
    return stack is not None and PLATFORM_OUTPUT in (stack.outputs() or {})


def _qualified(env_stack: str, name: str) -> str:
    """A model stack's backend name: the platform's organisation and project, if it names them
    (`org/warmstart/dev` -> `org/warmstart/dev-llama`)."""
    head, sep, _ = env_stack.rpartition("/")
    return f"{head}{sep}{name}"


# --------------------------------------------------------------------------------------
# The environment


def _validate(request: Request, names: list[str]) -> None:
    """Every stack's config, validated by the path `commands.execute` validates it by, all
    problems at once, each naming its stack file.

    In the main thread, before any stack runs: a model stack's plan renders its platform under
    the Pulumi mocks (process-wide settings) once and caches the outputs
    (`render.platform_outputs`), so the model stacks' threads only read that cache."""
    from .. import render

    stacks_dir = request.project_dir / "stacks"
    problems = Problems()
    for name in names:
        shown = _shown(stack_file(stacks_dir, name))
        try:
            render.load_plan(stacks_dir, name)
        except ConfigErrors as err:
            problems.errors += [ConfigError(f"{shown}: {e.key}", e.rule, e.fix, e.value) for e in err.errors]
        except ConfigError as err:
            problems.errors.append(ConfigError(f"{shown}: {err.key}", err.rule, err.fix, err.value))
    problems.raise_if_any()


def run_environment(request: Request, max_parallel: int = MAX_PARALLEL) -> int:
    """Run `request.operation` on the environment whose platform stack is `request.stack`: the
    platform and its model stacks, in order (module docstring); print each stack's output
    labelled, then one summary table; write the `--summary` document; return the worst exit
    code. ConfigError(s) for an environment that cannot be resolved or a config that does not
    validate, before any engine call."""
    if request.operation not in ENV_OPERATIONS:
        raise ValueError(f"--env runs {', '.join(ENV_OPERATIONS)}, not {request.operation}")
    started = time.perf_counter()
    env = request.config_stack
    stacks_dir = request.project_dir / "stacks"
    op = request.operation
    platform = replace(request, summary_path=None)

    def write_summary(doc: dict[str, Any]) -> None:
        if request.summary_path:
            request.summary_path.parent.mkdir(parents=True, exist_ok=True)
            doc = {"environment": request.stack, "operation": op, **doc,
                   "durationSeconds": round(time.perf_counter() - started, 3)}
            request.summary_path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")

    try:
        models = [replace(platform, stack=_qualified(request.stack, n)) for n in model_stacks(stacks_dir, env)]
        if op in VALIDATED_OPERATIONS:
            _validate(request, [env, *(m.config_stack for m in models)])
    except (ConfigError, ConfigErrors) as err:
        write_summary({"result": "config-error", "exitCode": EXIT_CONFIG, "message": str(err), "stacks": []})
        raise  # cli.main prints it, exactly as for one stack

    def finish(results: list[StackResult]) -> int:
        code = worst_exit_code(results)
        print(table(results), flush=True)
        counts = {res: sum(r.result == res for r in results) for res in dict.fromkeys(r.result for r in results)}
        print(f"\nwarmstart: {op} of environment '{request.stack}': {len(results)} stack(s), "
              + ", ".join(f"{n} {res}" for res, n in counts.items())
              + f", in {time.perf_counter() - started:.1f}s; exit {code}", flush=True)
        worst = next((r.result for r in results if r.exit_code == code), "succeeded")
        write_summary({"result": worst, "exitCode": code, "message": "", "stacks": [r.doc() for r in results]})
        return code

    cmd, missing = prerequisites.check_prerequisites(platform)
    if missing:
        error = PrerequisitesMissing(op, request.stack, missing)
        print(str(error), file=sys.stderr, flush=True)
        why = f"not run: {len(missing)} prerequisite(s) missing (above)"
        order = [*models, platform] if op == "destroy" else [platform, *models]
        return finish([_skip(r, PLATFORM if r is platform else MODEL, why, NOT_RUN, EXIT_PREREQUISITES)
                       for r in order])

    # engine.open_stack serialises stack selection itself (engine._SELECTING).
    with _labelled_output() as streams:
        def in_thread(run: Callable[[], StackResult], stack: str) -> StackResult:
            _label.stack = stack
            try:
                return run()
            finally:
                for s in streams:
                    s.end_thread()
                _label.stack = None

        def run_models(run: Callable[[Request], StackResult]) -> list[StackResult]:
            if not models:
                return []
            with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(models))),
                                    thread_name_prefix="warmstart-model") as pool:
                futures = [pool.submit(in_thread, lambda m=m: run(m), m.stack) for m in models]
                return [f.result() for f in futures]

        if op == "destroy":
            def destroy_model(m: Request) -> StackResult:
                if _select(m, cmd) is None:
                    return _skip(m, MODEL, "not in the backend: nothing to destroy")
                return _run_stack(m, MODEL)
            results = run_models(destroy_model)
            left = [r.stack for r in results if r.result != SKIPPED and r.exit_code != EXIT_OK]
            if left:
                results.append(_skip(platform, PLATFORM, f"not destroyed: model stack(s) {', '.join(left)} "
                                     "were not destroyed, and the platform goes last"))
            elif _select(platform, cmd) is None:
                results.append(_skip(platform, PLATFORM, "not in the backend: nothing to destroy"))
            else:
                results.append(in_thread(lambda: _run_stack(platform, PLATFORM), platform.stack))
            return finish(results)

        first = in_thread(lambda: _run_stack(platform, PLATFORM), platform.stack)
        if first.exit_code not in _PLATFORM_FINE:
            return finish([first, *(_skip(m, MODEL, f"skipped: platform {request.stack} did not {op} "
                                                     f"({first.result})")
                                    for m in models)])
        if op == "preview" and models:
            from pulumi.automation.errors import CommandError

            try:
                ready = platform_has_outputs(platform, cmd)
            except CommandError as e:
                why = f"could not read platform {request.stack}'s outputs: {engine.last_error_line(e)}"
                return finish([first, *(_skip(m, MODEL, why, "failed", EXIT_FAILED) for m in models)])
            if not ready:
                return finish([first, *(_skip(m, MODEL, f"skipped: platform {request.stack} has no outputs "
                                              "yet (up it first)") for m in models)])
        return finish([first, *run_models(lambda m: _run_stack(m, MODEL))])


# --------------------------------------------------------------------------------------
# The command line


def add_env_arguments(sub: Any) -> None:
    """`--env ENV` beside `--stack NAME` (exactly one of them) on the ENV_OPERATIONS parsers
    that `commands.add_parsers` made."""
    for op in ENV_OPERATIONS:
        p: argparse.ArgumentParser = sub.choices[op]
        stack = next(a for a in p._actions if a.dest == "stack")
        stack.required = False
        group = p.add_mutually_exclusive_group(required=True)
        # The `--stack` action commands.add_parsers made, moved into the group, so that argparse
        # itself rejects neither and both.
        group._group_actions.append(stack)
        order = "its model stacks first (concurrently), the platform last" if op == "destroy" else \
            "the platform first, then its model stacks (concurrently)"
        group.add_argument("--env", metavar="ENV",
                           help=f"the environment: platform stack stacks/Pulumi.<ENV>.yaml and every model stack "
                                f"whose {PLATFORM_KEY} is ENV; {order}; one summary table, the worst exit code")


def request_from_args(args: argparse.Namespace, project_dir: Path) -> Request:
    """The Request of an `--env` invocation: the platform stack's, for `run_environment`."""
    return replace(commands.request_from_args(args, project_dir), stack=args.env)
