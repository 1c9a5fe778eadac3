"""``-m "not integration"`` selects exactly the unit tests, so the fast loop never needs a server.

tests/integration/conftest.py marks every test under its directory. Two fresh collections, one
per directory, each with the other side's ``-m``, must select nothing: no unit test is marked
``integration``, and none under tests/integration escapes the mark. (Each directory is collected
once, so the check costs one collection of the suite.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collected(*selections: tuple[str, str]) -> list[list[str]]:
    """For each (directory, ``-m`` expression), the node ids ``pytest --collect-only`` selects from
    the repository root; the collections run side by side."""
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    runs = [
        subprocess.Popen([*command, "-m", expression, directory], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for directory, expression in selections
    ]  # fmt: skip
    selected = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=300)
        # Exit 5: every test was deselected, which is what each selection here must do.
        assert run.returncode in (0, 5), stdout[-3000:] + stderr[-3000:]
        assert "deselected" in stdout, stdout[-3000:]  # it did collect tests, then deselected them
        selected.append(sorted(line for line in stdout.splitlines() if "::" in line))
    return selected


def test_integration_marks_exactly_the_tests_under_tests_integration() -> None:
    marked_units, unmarked_integration = collected(
        ("tests/unit", "integration"), ("tests/integration", "not integration")
    )
    assert marked_units == []
    assert unmarked_integration == []
