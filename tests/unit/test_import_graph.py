"""The layers of docs/ARCHITECTURE.md, checked on every import statement of the package.

Each module's imports (top-level, inside functions and under ``TYPE_CHECKING``) are read from its
source with ``ast``, so a late import cannot slip past. Layers are ranked; a module may import its
own layer and lower ranks, never a higher one. Third-party rules ride along: Airflow only in the
faces and the tools beside them, pyspark only in ``spark/``, and nothing but the standard library
in ``formats/`` and ``errors``, because the Spark job ships them as they are. Within a layer, no
modules import each other in a circle.
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import airflow_provider_postgres_cdc

PACKAGE = "airflow_provider_postgres_cdc"
ROOT = Path(airflow_provider_postgres_cdc.__file__).parent

# Layer of each top-level part of the package, lowest first.
RANKS = {
    "errors": 0, "formats": 0,
    "values": 1,
    "pgoutput": 2, "replication": 2,
    "engine": 3, "spark": 3,
    "hooks": 4, "triggers": 4, "sensors": 4, "operators": 4, "task_groups": 4, "dag_factories": 4,
    "get_provider_info": 4,
    "assets": 4, "lineage": 4, "metrics": 4, "plugins": 4,
    "cli": 5, "testing": 5, "demo": 5,
}  # fmt: skip
# Parts of the same rank that must not know each other: the decoder and the psycopg2 layer, the
# engine and the job.
APART = ({"pgoutput", "replication"}, {"engine", "spark"})
AIRFLOW_ALLOWED = {
    "hooks", "triggers", "sensors", "operators", "task_groups", "dag_factories", "get_provider_info",
    "assets", "lineage", "metrics", "plugins",
}  # fmt: skip
STDLIB_ONLY = {"errors", "formats"}


def part_of(module: str) -> str:
    """The top-level part of the package a dotted module name belongs to ("" for the package itself)."""
    rest = module.removeprefix(PACKAGE).lstrip(".")
    return rest.split(".")[0]


def module_name(path: Path, source_root: Path) -> str:
    relative = path.relative_to(source_root.parent).with_suffix("")
    parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
    return ".".join(parts)


def imports_of(path: Path, source_root: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute dotted name) of every import in a source file, relative ones resolved."""
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path, source_root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if base.startswith(PACKAGE) else base


def violations(source_root: Path) -> list[str]:
    found = []
    for path in sorted(source_root.rglob("*.py")):
        here = part_of(module_name(path, source_root))
        if here == "":  # the package's __init__: only its version
            continue
        for line, name in imports_of(path, source_root):
            where = f"{path.relative_to(source_root.parent)}:{line} imports {name}"
            top = name.split(".")[0]
            if top == PACKAGE:
                there = part_of(name)
                if there in RANKS and RANKS[there] > RANKS[here]:
                    found.append(f"{where}: upward ({here} is below {there})")
                elif there != here and any({here, there} <= pair for pair in APART):
                    found.append(f"{where}: {here} and {there} must not depend on each other")
            elif top == "airflow" and here not in AIRFLOW_ALLOWED:
                found.append(f"{where}: only the Airflow faces import Airflow")
            elif top in ("pyspark", "py4j") and here != "spark":
                found.append(f"{where}: only spark/ imports pyspark")
            elif here in STDLIB_ONLY and top not in sys.stdlib_module_names:
                found.append(f"{where}: {here} is shipped to the Spark job as is, standard library only")
    return found


def module_graph(source_root: Path) -> dict[str, set[str]]:
    """Each module of the package and the modules of the package it imports.

    An import names the deepest module it reaches (``from pkg.a import b`` is ``pkg.a.b`` when that
    is a module, else ``pkg.a``). Imports under ``TYPE_CHECKING`` count: they never run, but two
    modules that need each other's types cannot be read or changed apart either. The package
    ``__init__`` Python runs before a submodule is not an edge: a package naming its public API
    imports its submodules, which import their siblings, and that is no circle.
    """
    modules = {module_name(path, source_root) for path in source_root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(source_root.rglob("*.py")):
        here = module_name(path, source_root)
        graph[here] = set()
        for _, name in imports_of(path, source_root):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != here:
                graph[here].add(name)
    return graph


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Circles of imports as paths ``[a, b, ..., a]``: the shortest way back from each module on a
    circle that no circle found before passes through."""
    found: list[list[str]] = []
    seen: set[str] = set()
    for start in sorted(graph):
        if start in seen:
            continue
        back = _way_back(graph, start)
        if back is not None:
            found.append(back)
            seen.update(back)
    return found


def _way_back(graph: Mapping[str, set[str]], start: str) -> list[str] | None:
    """The shortest path of imports from ``start`` back to it, ``[start, ..., start]``, or None."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph.get(node, ())):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    return None


def test_every_part_of_the_package_has_a_layer() -> None:
    modules = {path.stem for path in ROOT.glob("*.py") if path.name != "__init__.py"}
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert (modules | packages) - set(RANKS) == set(), (
        "a new top-level part needs a layer (RANKS, docs/ARCHITECTURE.md)"
    )


def test_no_import_runs_up_a_layer() -> None:
    assert violations(ROOT) == []


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert [" -> ".join(circle) for circle in circles(module_graph(ROOT))] == []


@pytest.mark.parametrize(
    ("part", "statement", "complaint"),
    [
        ("formats/bad.py", "from airflow_provider_postgres_cdc.engine import drain", "upward"),
        ("pgoutput/bad.py", "import airflow_provider_postgres_cdc.replication", "must not depend"),
        ("engine/bad.py", "def f():\n    from airflow.sdk import BaseHook", "only the Airflow faces"),
        ("values/bad.py", "import pyspark.sql", "only spark/ imports pyspark"),
        ("formats/bad.py", "import pyarrow", "standard library only"),
        ("engine/snapshot/bad.py", "from ...hooks import postgres", "upward"),
    ],
)
def test_the_check_finds_each_kind_of_violation(
    tmp_path: Path, part: str, statement: str, complaint: str
) -> None:
    fake = tmp_path / PACKAGE
    (fake / part).parent.mkdir(parents=True)
    (fake / part).write_text(statement + "\n")
    (fake / "__init__.py").write_text("")
    (found,) = violations(fake)
    assert complaint in found


@pytest.mark.parametrize(
    ("files", "circle"),
    [
        ({"a.py": "from . import b", "b.py": "def f():\n    from .a import f"}, ["a", "b", "a"]),
        (
            {
                "a.py": "import airflow_provider_postgres_cdc.b",
                "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C",
                "c.py": "from airflow_provider_postgres_cdc.a import x",
            },
            ["a", "b", "c", "a"],
        ),
        ({"p/__init__.py": "from .x import X", "p/x.py": "from .y import Y", "p/y.py": ""}, None),
    ],
)
def test_the_circle_check_finds_circles_and_only_them(
    tmp_path: Path, files: dict[str, str], circle: list[str] | None
) -> None:
    fake = tmp_path / PACKAGE
    for name, text in {"__init__.py": "", **files}.items():
        (fake / name).parent.mkdir(parents=True, exist_ok=True)
        (fake / name).write_text(text + "\n")
    found = circles(module_graph(fake))
    assert found == ([[f"{PACKAGE}.{name}" for name in circle]] if circle else [])
