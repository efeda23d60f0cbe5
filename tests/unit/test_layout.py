"""The layout holds: imports flow one way, facts are a leaf, files and functions stay readable.

Built from the source (ast), not from what happens to be imported, so a
lazy import inside a function counts like one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "facts", "tasks", "rollout", "bench", "remote", "sandbox")
ENTRY_FILES = ("deploy.py", "config.py")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_files() -> dict[str, Path]:
    files = {module_name(ROOT / name): ROOT / name for name in ENTRY_FILES}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            files[module_name(path)] = path
    return files


FILES = project_files()


def _resolve(name: str) -> str | None:
    """The project module ``name`` refers to (a package's names resolve to the package), else None."""
    while name:
        if name in FILES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> set[str]:
    path = FILES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports pkg.mod; `from pkg import name` imports pkg
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in FILES else base for alias in node.names]
        for name in names:
            target = _resolve(name)
            if target and target != module:
                found.add(target)
    return found


GRAPH = {module: imports_of(module) for module in FILES}

# every module of tasks/ but the settings (tasks.spec*) and the pipeline is one step
STEPS = {m for m in FILES if m.startswith("tasks.") and not m.startswith(("tasks.spec", "tasks.pipeline"))}


def layer(module: str) -> int:
    """Lower layers never import higher ones."""
    if module == "core.paths":
        return 0
    if module.startswith(("facts", "tasks.spec")) or module == "tasks":
        return 1  # tasks.spec_gate included: it only validates settings
    if module.startswith("core"):
        return 2
    if module in STEPS:
        return 3
    return 4  # entry points: deploy.py, config.py, tasks.pipeline, rollout, bench


def _cycle() -> list[str] | None:
    """One import cycle among the project's modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_the_graph_sees_known_imports():
    # positive control: the graph finds edges that exist, lazy ones included
    assert "tasks.spec" in GRAPH["deploy"]
    assert any(name.startswith("facts") for name in GRAPH["tasks.service"])
    assert {"tasks.service", "tasks.readiness", "tasks.multinode", "tasks.membership"} <= STEPS


def test_no_import_cycle():
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_the_cycle_finder_finds_a_cycle():
    GRAPH["core.paths"].add("deploy")  # deploy -> ... -> core.paths -> deploy
    try:
        assert _cycle() is not None
    finally:
        GRAPH["core.paths"].discard("deploy")


def test_facts_are_a_leaf():
    bad = {m: sorted(i for i in GRAPH[m] if not i.startswith("facts") and i != "core.paths")
           for m in GRAPH if m.startswith("facts")}
    assert {m: i for m, i in bad.items() if i} == {}


def test_steps_never_import_each_other():
    bad = {m: sorted(GRAPH[m] & STEPS) for m in STEPS}
    assert {m: i for m, i in bad.items() if i} == {}


def test_imports_flow_one_way():
    upward = [f"{m} -> {i}" for m in GRAPH if not m.startswith(("sandbox", "remote"))
              for i in GRAPH[m] if layer(i) > layer(m)]
    assert upward == []


def test_remote_scripts_stand_alone():
    # they are uploaded to the host and run there with the stdlib (or the venv) only
    assert {m: GRAPH[m] for m in GRAPH if m.startswith("remote") and GRAPH[m]} == {}


@pytest.mark.parametrize("module", sorted(m for m in FILES if not m.startswith("sandbox")))
def test_small_enough_to_read(module):
    path = FILES[module]
    source = path.read_text()
    assert source.count("\n") <= MAX_FILE_LINES, f"{path}: {source.count(chr(10))} lines"
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines" for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and (node.end_lineno or 0) - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == [], f"{path}: {long}"


def test_tests_are_small_enough_to_read():
    too_long = [f"{p.relative_to(ROOT)}: {p.read_text().count(chr(10))}" for p in (ROOT / "tests").rglob("*.py")
                if p.read_text().count("\n") > MAX_FILE_LINES]
    assert too_long == []
