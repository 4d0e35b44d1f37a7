"""The package's shape: no import circles, light imports, small modules, few root modules.

The layer contract itself is checked by ``lint-imports`` (configured in pyproject.toml), which
``make test`` runs beside this suite.
"""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxrl")


def _modules() -> dict[str, str]:
    out = {}
    for d, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel.removesuffix(".__init__")] = path
    return out


def _edges(mods: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the jaxrl modules it imports, at any depth (lazy and TYPE_CHECKING included)."""
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        package = m.split(".") if path.endswith("__init__.py") else m.split(".")[:-1]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package[: len(package) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                parts = t.split(".")
                while parts and ".".join(parts) not in mods:
                    parts.pop()
                target = ".".join(parts)
                # a module importing its own package (``jaxrl``'s lazy names) is no circle
                if parts and target != m and not m.startswith(target + "."):
                    graph[m].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]


def test_no_import_circles():
    circles = _circles(_edges(_modules()))
    assert not circles, "modules that import each other (cut the edge): " + "; ".join(
        " <-> ".join(c) for c in circles
    )


def test_few_modules_at_the_root_and_none_over_400_lines():
    root = sorted(f for f in os.listdir(ROOT) if f.endswith(".py"))
    # 13: optim (train states, gradient steps) left networks when batch renormalization came.
    assert len(root) <= 13, f"{len(root)} modules directly in jaxrl/: {root}"
    long = {m: n for m, p in _modules().items() if (n := sum(1 for _ in open(p))) > 400}
    assert not long, f"split these modules by responsibility: {long}"


HEAVY = (
    "jaxrl.loops",
    "optuna",
    "ray",
    "onnx",
    "onnxruntime",
    "orbax",
    "tensorboardX",
    "matplotlib",
)


@pytest.mark.parametrize("module", ["jaxrl", "jaxrl.networks", "jaxrl.agents", "jaxrl.offline"])
def test_light_imports(module):
    code = (
        f"import sys, {module}; heavy = {HEAVY!r}; "
        "print(' '.join(h for h in heavy if any(m == h or m.startswith(h + '.') "
        "for m in sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert loaded == [], f"import {module} loaded {loaded}"


def test_public_names_load_on_first_use():
    code = (
        "import sys, jaxrl; assert 'jaxrl.loops' not in sys.modules; "
        "jaxrl.TrainConfig; assert 'jaxrl.loops' in sys.modules; "
        "from jaxrl import make_replay_buffer, ConfigError, Transition; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_no_private_names_cross_modules():
    # What a module shares with another is a public name of its package; an underscore name
    # imported elsewhere is an internal that a refactor of its home module would silently break.
    mods = _modules()
    crossing = []
    for m, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jaxrl"):
                crossing += [
                    f"{m} <- {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert not crossing, "make these public names of their package: " + "; ".join(crossing)


def test_the_api_reference_lists_every_module():
    docs = os.path.join(os.path.dirname(ROOT), "docs", "api")
    listed = set()
    for page in os.listdir(docs):
        with open(os.path.join(docs, page), encoding="utf-8") as f:
            listed |= {line[4:].strip() for line in f if line.startswith("::: ")}
    modules = {m for m in _modules() if not m.endswith("__main__")}
    assert modules <= listed, f"add to docs/api/: {sorted(modules - listed)}"
