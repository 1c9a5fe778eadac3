"""The per-message decoder stays light: the slot-health check, which DAG files import, uses it."""

from __future__ import annotations

import ast
from pathlib import Path

import airflow_provider_postgres_cdc.pgoutput as pgoutput

PACKAGE = pgoutput.__name__


def package_imports(path: Path) -> set[str]:
    """The package's own modules that ``path`` imports anywhere (``TYPE_CHECKING`` blocks too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            names.add(f"{PACKAGE}.{node.module}" if node.module else PACKAGE)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
            names.add(str(node.module))
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith(PACKAGE + ".")}
    return names


def test_reading_one_message_does_not_load_numpy_or_pyarrow() -> None:
    """Slot health decodes a peeked Begin message inside the sensor, which DAG files import."""
    light = ("decoder", "messages", "relations")
    for name in light:
        for imported in package_imports(Path(pgoutput.__file__).parent / f"{name}.py"):
            assert imported.rpartition(".")[2] in light, (name, imported)
    assert package_imports(Path(pgoutput.__file__)) == set()
