"""``-m "not integration"`` selects exactly the unit tests, so the fast loop never needs a server.

tests/integration/conftest.py marks every test under its directory. Two fresh collections of the
whole suite, one per side of ``-m``, must each stay inside their own directory.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collected(*expressions: str) -> list[list[str]]:
    """For each ``-m`` expression, the node ids ``pytest --collect-only`` selects from the repository
    root; the collections run side by side (each imports pyspark and Airflow)."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    runs = [
        subprocess.Popen([*command, "-m", expression, "tests"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for expression in expressions
    ]  # fmt: skip
    selected = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stdout[-3000:] + stderr[-3000:]
        selected.append(sorted(line for line in stdout.splitlines() if "::" in line))
    return selected


def test_integration_marks_exactly_the_tests_under_tests_integration() -> None:
    unit, integration = collected("not integration", "integration")
    assert unit and integration
    assert [node for node in unit if not node.startswith("tests/unit/")] == []
    assert [node for node in integration if not node.startswith("tests/integration/")] == []
