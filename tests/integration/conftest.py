"""Markers by place: every test under tests/integration/ needs a real server, so none can forget to say so.

``-m "not integration"`` then selects exactly tests/unit/ (tests/unit/test_markers.py checks it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by ``-m``
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``integration`` on each test here, ``spark`` if it uses the Spark session, ``airflow`` in airflow/."""
    for item in items:
        if not item.path.is_relative_to(HERE):
            continue
        item.add_marker(pytest.mark.integration)
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
        if item.path.is_relative_to(HERE / "airflow"):
            item.add_marker(pytest.mark.airflow)
