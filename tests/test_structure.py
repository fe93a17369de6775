"""The layout's rules: one direction of imports, no cycles, and no bare `components` package
installed where it could shadow a user's own."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.support.stacks import ROOT

# Packages of this repository, by the name they are imported under here.
PACKAGES = {"warmstart": ROOT / "warmstart", "components": ROOT / "components"}
# What the components may use of the core: pure decisions, config, planners and object builders.
CORE_FOR_COMPONENTS = ("warmstart.config", "warmstart.errors", "warmstart.versions", "warmstart.decisions",
                       "warmstart.manifests", "warmstart.plan", "warmstart.sdk_private")


def _modules() -> dict[str, Path]:
    found = {}
    for top, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((top, *parts))
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports (relative imports resolved, `from pkg import mod`
    counted as importing the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` imports the submodule; `from pkg import name` the package.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_point_one_way_main_to_components_to_core():
    graph = _graph()
    core_to_components = {m: sorted(t for t in ts if t.startswith("components"))
                          for m, ts in graph.items() if m.startswith("warmstart")}
    assert not any(core_to_components.values()), core_to_components
    for m, targets in graph.items():
        if m.startswith("components"):
            core = [t for t in targets if t.startswith("warmstart.")]
            assert all(t.startswith(CORE_FOR_COMPONENTS) for t in core), (m, core)
    main = _imports("__main__", ROOT / "__main__.py", set(graph))
    assert main == {"components"}


def test_pure_code_imports_no_pulumi():
    pure = ("warmstart.config", "warmstart.errors", "warmstart.decisions", "warmstart.manifests", "warmstart.plan",
            "warmstart.plan.platform",
            "warmstart.podside", "warmstart.policies")
    for name, path in _modules().items():
        if name.startswith(pure):
            imported = {a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import)
                        for a in n.names} | {n.module or "" for n in ast.walk(ast.parse(path.read_text()))
                                             if isinstance(n, ast.ImportFrom) and not n.level}
            top_level = {i.split(".")[0] for i in imported}
            assert not top_level & {"pulumi", "pulumi_aws", "pulumi_eks", "pulumi_kubernetes"}, name


@pytest.mark.servers
def test_no_bare_components_package_is_installed():
    """Outside this project, `components` is whatever the user's own program has; warmstart's
    components are `warmstart_components`."""
    probe = ("import importlib.util as u; print(u.find_spec('components') is None, "
             "u.find_spec('warmstart_components') is not None)")
    out = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


def test_every_core_package_is_packaged():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "warmstart").rglob("__init__.py")}
    assert folders | {"warmstart_components"} == set(setuptools["packages"])
    assert setuptools["package-dir"] == {"warmstart_components": "components"}


# --------------------------------------------------------------------------------------
# The tests' own layout



def _test_imports_of_test_modules(root: Path = ROOT) -> list[str]:
    """Each `importer -> test module` edge where a module of tests/ imports a `test_*.py` module or a
    `conftest.py` (at any depth, inside functions too): pytest loads a conftest itself, so what a
    test module needs from one belongs in tests/support/."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        importer = ".".join(path.relative_to(root).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = importer.split(".")[: -node.level]
                    base = ".".join([*package, *([base] if base else [])])
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                last = name.rpartition(".")[2]
                if name.startswith("tests.") and (last.startswith("test_") or last == "conftest") and (
                        root / (name.replace(".", "/") + ".py")).is_file():
                    found.append(f"{importer} imports {name}")
    return sorted(set(found))


def test_no_test_module_is_imported_by_another():
    """A test module is a set of tests, not a library: what two test modules share (helpers,
    constants, strategies) lives in tests/support/, and a fixture they share in a conftest.py."""
    edges = _test_imports_of_test_modules()
    assert not edges, ("move what these import into a module of tests/support/ (a fixture: into the "
                       "conftest.py above both):\n" + "\n".join(edges))


def test_the_test_import_check_finds_one(tmp_path):
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "test_x.py").write_text("X = 1\n")
    (tmp_path / "tests" / "a" / "test_y.py").write_text("def test_y():\n    from ..test_x import X\n")
    (tmp_path / "tests" / "conftest.py").write_text("X = 1\n")
    (tmp_path / "tests" / "test_z.py").write_text("import tests.test_x\nfrom tests.support import x\n")
    (tmp_path / "tests" / "a" / "test_w.py").write_text("from tests.conftest import X\n")
    assert _test_imports_of_test_modules(tmp_path) == ["tests.a.test_w imports tests.conftest",
                                                       "tests.a.test_y imports tests.test_x",
                                                       "tests.test_z imports tests.test_x"]


# --------------------------------------------------------------------------------------
# One feature, one name across the layers


LAYERS = ("warmstart/decisions", "warmstart/manifests", "warmstart/plan", "components")
SUFFIXES = ("s", "ing", "er")


def _stem(name: str) -> str:
    """A module name without its last inflection: at most one trailing -s, then at most one
    -ing or -er (`routers`, `routing`, `router` -> `rout`; `node_caches` -> `node_cache`)."""
    if name.endswith("s") and len(name) > 3:
        name = name[:-1]
    for suffix in SUFFIXES[1:]:
        if name.endswith(suffix) and len(name) - len(suffix) >= 3:
            return name[: -len(suffix)]
    return name


def _modules_by_layer(root: Path = ROOT) -> dict[str, set[str]]:
    return {layer: {p.stem for p in (root / layer).glob("*.py") if not p.stem.startswith("__")} for layer in LAYERS}


def _name_variants(layers: dict[str, set[str]]) -> list[str]:
    """Pairs of modules in different layers whose names differ but share a stem."""
    found = []
    entries = sorted((layer, name) for layer, names in layers.items() for name in names)
    for i, (la, a) in enumerate(entries):
        for lb, b in entries[i + 1:]:
            if la != lb and a != b and _stem(a) == _stem(b):
                found.append(f"{la}/{a}.py and {lb}/{b}.py")
    return found


def test_one_feature_has_one_name_across_the_layers():
    """Feature X is `warmstart/decisions/X.py`, `warmstart/manifests/X.py`, `warmstart/plan/X.py`
    and `components/X.py`: two modules of different layers whose names are near-variants of one
    another (the same after stripping one trailing -s, then one -ing or -er: `router` and
    `routing`, `node_caches` and `node_cache`) must be one name. Different words (`identity`
    and `iam`) are not variants. Rename the core module (decisions/manifests), not the
    component, whose module name is public."""
    assert _name_variants(_modules_by_layer()) == []


def test_the_naming_rule_finds_variants_and_only_variants():
    layers = {"warmstart/decisions": {"routing", "iam", "node_cache"}, "warmstart/manifests": {"router", "node_caches"},
              "warmstart/plan": {"model"}, "components": {"routing", "identity", "model_stack"}}
    assert _name_variants(layers) == ["components/routing.py and warmstart/manifests/router.py",
                                      "warmstart/decisions/node_cache.py and warmstart/manifests/node_caches.py",
                                      "warmstart/decisions/routing.py and warmstart/manifests/router.py"]
    assert _stem("serving") == _stem("server") != _stem("service")


def _component_modules(root: Path = ROOT) -> list[str]:
    """The modules of components/ that define a component (a pulumi.ComponentResource subclass)."""
    out = []
    for path in sorted((root / "components").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b) in ("pulumi.ComponentResource", "ComponentResource")
                                                      for b in node.bases):
                out.append(path.stem)
                break
    return out


def test_each_component_module_has_its_test_folder():
    """components/X.py's tests live in tests/X/ (a package), beside its other layers' X."""
    modules = _component_modules()
    assert {"network", "cluster", "storage", "identity", "serving", "routing", "monitoring", "autoscaling"} <= set(modules)
    missing = [f"tests/{m}/__init__.py" for m in modules if not (ROOT / "tests" / m / "__init__.py").is_file()]
    assert not missing, f"create these test folders for their components: {missing}"
