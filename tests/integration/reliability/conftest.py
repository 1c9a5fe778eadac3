"""Fixtures of the reliability tests: a small file system a test can fill or make read-only.

Their Spark session is the shared ``spark`` of tests/integration/conftest.py.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def _remount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True, capture_output=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for one test (the tests run as root); skipped where mounting is refused."""
    path = tmp_path / "tmpfs"
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


@pytest.fixture
def remount() -> Callable[[Path, str], None]:
    """Remount a test's tmpfs with other options: ``remount(path, "size=256m")``, ``"ro"``."""
    return _remount
