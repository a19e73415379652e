"""The structure docs/architecture.md describes, kept true: imports, the store, one copy of each idea."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from joblane.queries import catalogue

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "joblane"

# The only modules that run SQL themselves: the store, and the schema's own tooling.
SQL_RUNNERS = {"joblane.store", "joblane.migrations", "joblane.schema_dump"}
# Methods that send SQL on a psycopg or asyncpg connection, cursor or pool.
SQL_CALLS = {"fetch", "fetchrow", "fetchval", "execute", "executemany", "copy", "copy_records_to_table",
             "copy_to_table", "copy_from_query", "cursor"}
# Not database connections: a Redis pipeline's execute.
NOT_SQL = {("joblane.outbox.sinks.redis", "execute")}


class Package:
    """The modules of a package folder and the imports between them, read from the source (AST)."""

    def __init__(self, root: Path):
        self.root = root
        self.modules = {self.module_name(p): p for p in sorted(root.rglob("*.py"))}

    def module_name(self, path: Path) -> str:
        parts = list(path.relative_to(self.root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    def where(self, name: str, line: int) -> str:
        return f"{self.modules[name].relative_to(self.root.parent)}:{line}"

    def resolve(self, importer: str, level: int, target: str | None) -> str:
        if level == 0:
            return target or ""
        base = importer.split(".")
        if self.modules[importer].name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([target] if target else []))

    def imports(self, name: str) -> list[tuple[str, list[str], int]]:
        """(module imported, names taken from it, line) for every import that runs, module-level or in a function.

        Imports under ``if TYPE_CHECKING:`` never run and are left out.
        """
        found: list[tuple[str, list[str], int]] = []

        def visit(node: ast.AST) -> None:
            if isinstance(node, ast.If) and _type_checking(node):
                for child in node.orelse:
                    visit(child)
                return
            if isinstance(node, ast.Import):
                found.extend((a.name, [], node.lineno) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                found.append((self.resolve(name, node.level, node.module), [a.name for a in node.names], node.lineno))
            for child in ast.iter_child_nodes(node):
                visit(child)

        visit(ast.parse(self.modules[name].read_text()))
        return found

    def edges(self, name: str) -> set[str]:
        """The package's modules that importing ``name`` imports (each package's __init__ on the way included)."""
        out: set[str] = set()
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        top = self.root.name
        for target, names, _ in self.imports(name):
            if target != top and not target.startswith(top + "."):
                continue
            for mod in [target] + [f"{target}.{n}" for n in names if f"{target}.{n}" in self.modules]:
                parts = mod.split(".")
                for i in range(1, len(parts) + 1):
                    prefix = ".".join(parts[:i])
                    if prefix in self.modules and prefix not in ancestors and prefix != name:
                        out.add(prefix)
        return out

    def cycles(self) -> list[list[str]]:
        """Strongly connected components of more than one module (Tarjan)."""
        graph = {m: self.edges(m) for m in self.modules}
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on_stack: set[str] = set()
        found: list[list[str]] = []

        def strong(v: str) -> None:
            index[v] = low[v] = len(index)
            stack.append(v)
            on_stack.add(v)
            for w in sorted(graph[v]):
                if w not in index:
                    strong(w)
                    low[v] = min(low[v], low[w])
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

        for m in sorted(graph):
            if m not in index:
                strong(m)
        return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


JOBLANE = Package(PACKAGE)
MODULES = JOBLANE.modules


def test_the_package_has_no_import_cycles():
    assert JOBLANE.cycles() == []


def test_the_cycle_finder_sees_function_level_and_package_imports(tmp_path):
    # the guard above is only as good as the walk: this cycle runs through a
    # package __init__ and a function-level import, beside a TYPE_CHECKING one
    pkg = tmp_path / "joblane"
    (pkg / "room").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "room" / "__init__.py").write_text("from .a import A\n")
    (pkg / "room" / "a.py").write_text("def f():\n    from ..b import B\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n"
                              "from .room import a\n")
    (pkg / "c.py").write_text("from .b import B\n")
    assert Package(pkg).cycles() == [["joblane.b", "joblane.room", "joblane.room.a"]]
    (pkg / "room" / "a.py").write_text("def f():\n    return 1\n")
    assert Package(pkg).cycles() == []


def test_no_module_imports_a_private_name_of_another():
    offenders = []
    for name in MODULES:
        for target, names, line in JOBLANE.imports(name):
            if not target.startswith("joblane") or target == name:
                continue
            for taken in names:
                if taken.startswith("_") and f"{target}.{taken}" not in MODULES:
                    offenders.append(f"{JOBLANE.where(name, line)} imports {taken} from {target}")
    assert offenders == []


def sql_calls(name: str) -> list[str]:
    tree = ast.parse(MODULES[name].read_text())
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SQL_CALLS
                and (name, node.func.attr) not in NOT_SQL
                and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "store")):  # the runners
            out.append(f"{JOBLANE.where(name, node.lineno)} .{node.func.attr}(...)")
    return out


def test_only_the_store_runs_sql():
    runners = [call for name in MODULES
               if name not in SQL_RUNNERS and not name.startswith("joblane.showcase")
               for call in sql_calls(name)]
    assert runners == []


def store_methods() -> dict[str, list[str]]:
    """Named query -> the Store methods that bind it."""
    tree = ast.parse(MODULES["joblane.store"].read_text())
    [store] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Store"]
    reached: dict[str, list[str]] = {}
    for method in store.body:
        if not isinstance(method, ast.FunctionDef) or method.name.startswith("_"):
            continue
        for node in ast.walk(method):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_s"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                reached.setdefault(node.args[0].value, []).append(method.name)
    return reached


def test_every_named_query_has_exactly_one_store_method():
    reached = store_methods()
    names = set(catalogue())
    assert sorted(names - set(reached)) == [], "named queries no Store method binds"
    assert sorted(set(reached) - names) == [], "Store methods naming no query"
    assert {q: m for q, m in reached.items() if len(m) != 1} == {}
    assert all(m == [q] for q, m in reached.items()), "a Store method is named after its query"


@pytest.mark.parametrize("room", ["joblane.rules", "joblane.types", "joblane.errors"])  # the leaves
def test_the_floor_imports_nothing_above_it(room):
    allowed = {"joblane.errors"}
    assert JOBLANE.edges(room) - allowed == set()


# The rooms of docs/architecture.md. The floor stands on nothing above it; the
# faces (command line, dashboard, integrations, showcase) stand on the library,
# which never reaches back up to them.
FLOOR = {"joblane.errors", "joblane.types", "joblane.rules", "joblane.queries", "joblane.store",
         "joblane.migrations", "joblane.lifecycle", "joblane.telemetry"}
FACES = ("joblane.cli", "joblane.web", "joblane.integrations", "joblane.showcase", "joblane.__main__")


def _in(name: str, rooms) -> bool:
    return any(name == r or name.startswith(r + ".") for r in rooms)


def test_the_floor_stands_on_the_floor_only():
    assert {m: sorted(JOBLANE.edges(m) - FLOOR) for m in FLOOR if JOBLANE.edges(m) - FLOOR} == {}


def test_the_library_never_imports_a_face():
    library = [m for m in MODULES if not _in(m, FACES) and m != "joblane.schema_dump"]
    assert {m: sorted(e for e in JOBLANE.edges(m) if _in(e, FACES)) for m in library
            if any(_in(e, FACES) for e in JOBLANE.edges(m))} == {}


def test_only_the_command_line_imports_the_showcase_and_the_dashboard_not_the_command_line():
    showcase_users = {m for m in MODULES if not _in(m, ["joblane.showcase"])
                      and any(_in(e, ["joblane.showcase"]) for e in JOBLANE.edges(m))}
    assert {m for m in showcase_users if not _in(m, ["joblane.cli"])} == set()
    assert {m for m in MODULES if _in(m, ["joblane.web"]) and any(_in(e, ["joblane.cli"]) for e in JOBLANE.edges(m))} == set()
