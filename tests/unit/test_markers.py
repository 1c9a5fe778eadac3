"""``-m "not integration"`` selects exactly the unit tests, so the fast loop never needs a server.

tests/integration/conftest.py marks every test under its directory. Two fresh collections of the
whole suite, one per side of ``-m``, must each stay inside their own directory.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collected(*args: str) -> list[str]:
    """Node ids that ``pytest --collect-only`` with ``args`` selects, run from the repository root."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return sorted(line for line in result.stdout.splitlines() if "::" in line)


def test_integration_marks_exactly_the_tests_under_tests_integration() -> None:
    unit = collected("-m", "not integration", "tests")
    integration = collected("-m", "integration", "tests")
    assert unit and integration
    assert [node for node in unit if not node.startswith("tests/unit/")] == []
    assert [node for node in integration if not node.startswith("tests/integration/")] == []
