"""The layers of README "Architecture", checked on every import statement of the package.

Each module's imports (top-level and inside functions) are read from its source with ``ast``, so a
late import cannot slip past. Layers are ranked; a module may import its own layer and lower ranks,
never a higher one. Third-party rules ride along: Airflow only in the faces and the tools beside
them, pyspark only in ``spark/``, and nothing but the standard library in ``formats/`` and
``errors``, because the Spark job ships them as they are.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
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
    "get_provider_info": 4, "assets": 4, "lineage": 4, "metrics": 4, "plugins": 4,
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
        if here == "":  # the package's __init__: only installs the moved-module finder
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


def test_every_part_of_the_package_has_a_layer() -> None:
    modules = {path.stem for path in ROOT.glob("*.py") if path.name != "__init__.py"}
    packages = {path.parent.name for path in ROOT.glob("*/__init__.py")}
    assert (modules | packages) - set(RANKS) == set(), "a new top-level part needs a layer (RANKS, README)"


def test_no_import_runs_up_a_layer() -> None:
    assert violations(ROOT) == []


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
