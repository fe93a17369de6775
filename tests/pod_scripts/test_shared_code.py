"""The pod-side scripts share their S3 client builder, outcome-line emitter and SIGTERM exit
deadline through podside/common/shared.py (issue 31 point 5): a script that grows its own copy again fails
here, by what the copy does, whatever it is named.

- an S3 client builder: importing botocore's session or Config, or boto3 itself or its session,
  or calling `create_client` / `<session>.client("s3", ...)`; any module but common/shared.py, since
  the deadlines and retries a pod needs are the builder's;
- SIGTERM's backstop: writing to file descriptor 1 with os.write, or one function that both
  sleeps and calls os._exit;
- an outcome-line emitter: `sys.stdout.write`, or printing a `json.dumps(...)` line (one without
  `indent`), in every file of a ConfigMap that carries common/shared.py. A single-file script
  (its artifact carries no shared module) keeps its one print.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from warmstart.manifests import pod_scripts
from warmstart.podside.common import shared as podside_common

PODSIDE = Path(podside_common.__file__).parents[1]
SHARED = "common/shared.py"
#: Every module of warmstart/podside, by its path there.
MODULES = sorted(str(p.relative_to(PODSIDE)) for p in PODSIDE.rglob("*.py")
                 if p.name != "__init__.py" and "__pycache__" not in p.parts and str(p.relative_to(PODSIDE)) != SHARED)
#: Every module of an artifact that carries the shared module (by its path in warmstart/podside).
WITH_SHARED = sorted({p.removeprefix(f"{pod_scripts.PACKAGE}/") for key in pod_scripts.ENTRIES
                      if f"{pod_scripts.PACKAGE}/{SHARED}" in (files := pod_scripts.script_files(key))
                      for p in files if p.startswith(f"{pod_scripts.PACKAGE}/") and p.endswith(".py")}
                     - {SHARED, "__init__.py", "common/__init__.py"})


def _dotted(node: ast.AST) -> str:
    """`a.b.c` for a Name/Attribute chain, else ""."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


_CLIENT_MODULES = ("botocore.session", "botocore.config", "boto3", "boto3.session")


def client_builders(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name in _CLIENT_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module in _CLIENT_MODULES or (node.module == "botocore"
                                                  and {a.name for a in node.names} & {"session", "config"}):
                found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "create_client" or (
                    node.func.attr == "client" and node.args and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value == "s3"):
                found.append(f"{_dotted(node.func) or node.func.attr}(...)")
    return found


def exit_deadlines(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _dotted(node.func) == "os.write" and node.args and (
                (isinstance(node.args[0], ast.Constant) and node.args[0].value == 1)
                or "stdout" in _dotted(getattr(node.args[0], "func", node.args[0]))):
            found.append("os.write(1, ...)")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            calls = {_dotted(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
            if {"time.sleep", "os._exit"} <= calls:
                found.append(f"{node.name}: time.sleep, then os._exit")
    return found


def _json_line_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and _dotted(node.func) == "json.dumps" \
        and not any(k.arg == "indent" for k in node.keywords)


def emitters(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        if name == "sys.stdout.write":
            found.append("sys.stdout.write(...)")
        elif name == "print" and any(_json_line_call(n) for a in node.args for n in ast.walk(a)):
            found.append("print(json.dumps(...))")
    return found


def _source(name: str) -> str:
    return (PODSIDE / name).read_text()


@pytest.mark.parametrize("name", MODULES)
def test_no_script_builds_its_own_s3_client(name: str) -> None:
    assert client_builders(_source(name)) == [], f"{name}: use podside_common.make_s3_client"


@pytest.mark.parametrize("name", MODULES)
def test_no_script_has_its_own_sigterm_exit_deadline(name: str) -> None:
    assert exit_deadlines(_source(name)) == [], f"{name}: use podside_common.exit_at_deadline"


@pytest.mark.parametrize("name", WITH_SHARED)
def test_no_script_that_ships_the_shared_module_writes_its_own_outcome_lines(name: str) -> None:
    assert emitters(_source(name)) == [], f"{name}: use podside_common.emit_line"


def test_the_scripts_that_had_copies_ship_the_shared_module() -> None:
    """The guard above covers them (and cannot pass vacuously on an empty list)."""
    assert {"compile_cache/outcome.py", "first_token.py", "weights_import/settings.py", "weights_stage/main.py",
            "weights_select.py", "bench_loader.py"} <= set(WITH_SHARED)


def test_the_shared_module_is_the_one_place_that_has_each() -> None:
    shared = _source(SHARED)
    assert client_builders(shared) and exit_deadlines(shared) and emitters(shared)


@pytest.mark.parametrize("copy", [
    # the copies this replaced, as they were written
    "import botocore.session\nfrom botocore.config import Config\n"
    "c = botocore.session.get_session().create_client('s3', config=Config(connect_timeout=5))",
    "import boto3\nc = boto3.session.Session().client('s3', region_name=r)",
    "def f():\n    from botocore import config\n",
])
def test_a_client_builder_copy_is_found(copy: str) -> None:
    assert client_builders(copy)


@pytest.mark.parametrize("copy", [
    "def _exit_by_deadline(s):\n    time.sleep(s)\n    try:\n        os.write(1, b'x')\n    finally:\n"
    "        os._exit(0)\n",
    "def backstop(s):\n    time.sleep(s)\n    os._exit(143)\n",
    "os.write(sys.stdout.fileno(), line)",
])
def test_an_exit_deadline_copy_is_found(copy: str) -> None:
    assert exit_deadlines(copy)


@pytest.mark.parametrize("copy", [
    "def _emit(o):\n    sys.stdout.write(o.line() + '\\n')\n    sys.stdout.flush()\n",
    "def emit(r):\n    print(json.dumps({'event': E, **r}, sort_keys=True, separators=(',', ':')), flush=True)\n",
])
def test_an_emitter_copy_is_found(copy: str) -> None:
    assert emitters(copy)


def test_a_json_document_printed_for_a_person_is_not_an_outcome_line() -> None:
    """compile_cache's `key` command prints its factors indented: a document, not a log line."""
    assert emitters("print(json.dumps(doc, indent=1, sort_keys=True))") == []
