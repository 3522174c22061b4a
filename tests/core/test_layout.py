"""The package's shape holds: files stay small, no folder's files import each other in a loop
(imports inside functions and under TYPE_CHECKING count: they hide a cycle, they do not remove it),
and the old
`THUNDERSYNC_` environment prefix lives only in its deprecation shim."""

from __future__ import annotations

import ast
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "thundersync"
MAX_LINES = 360  # the style guide's ~350
CYCLE_FREE = ("learner", "driver", "worker", "cluster", "sandbox", "sandbox/envs", "bench", "bus")


def _package_files() -> dict[str, Path]:
    """Dotted module name -> file, links followed, fixtures and migrations left out."""
    mods: dict[str, Path] = {}
    for d, _, files in os.walk(PKG, followlinks=True):
        rel = Path(d).relative_to(REPO)
        if "fixtures" in rel.parts or "migrations" in rel.parts:
            continue
        for f in files:
            if f.endswith(".py"):
                name = ".".join((*rel.parts, f[:-3])).removesuffix(".__init__")
                mods[name] = Path(d) / f
    return mods


def _imports(path: Path, module: str) -> set[str]:
    """Every module (or module attribute) an import statement of the file names."""
    out: set[str] = set()
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return out


def _cycles_in(folder: str, mods: dict[str, Path]) -> list[list[str]]:
    prefix = "thundersync." + folder.replace("/", ".")
    local = {m for m in mods if m.rpartition(".")[0] == prefix and not m.endswith("__init__")}
    graph = {m: _imports(mods[m], m) & local - {m} for m in local}
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
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
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return comps


def test_no_package_file_is_long() -> None:
    long = {
        str(p.relative_to(REPO)): n
        for p in _package_files().values()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these along their seams (over {MAX_LINES} lines): {long}"


def test_no_import_cycle_inside_a_folder() -> None:
    mods = _package_files()
    found = {f: c for f in CYCLE_FREE if (c := _cycles_in(f, mods))}
    assert not found, found


def test_cycle_finder_sees_a_cycle(tmp_path: Path) -> None:
    """The detector itself can fail: two files importing each other inside functions."""
    (tmp_path / "a.py").write_text("def f():\n    from thundersync.x import b\n")
    (tmp_path / "b.py").write_text("from thundersync.x.a import f\n")
    mods = {"thundersync.x.a": tmp_path / "a.py", "thundersync.x.b": tmp_path / "b.py"}
    assert _cycles_in("x", mods) == [["thundersync.x.a", "thundersync.x.b"]]


def test_old_env_prefix_only_in_the_shim() -> None:
    hits = [
        str(p.relative_to(REPO))
        for p in _package_files().values()
        if "THUNDERSYNC_" in p.read_text() and p.name != "env_compat.py"
    ]
    scripts = [
        str(p.relative_to(REPO))
        for p in (*REPO.glob("scripts/**/*.sh"), *REPO.glob("deploy/**/*"), REPO / "Makefile")
        if p.is_file() and "THUNDERSYNC_" in p.read_text(errors="replace")
    ]
    assert not hits + scripts, hits + scripts
