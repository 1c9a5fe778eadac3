"""0.1's flat import paths keep working: the same module objects, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from airflow_provider_pglogical.moved_modules import MOVED


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_is_the_module_at_its_new_home(old: str, new: str) -> None:
    # A fresh interpreter: here the old name may already sit in sys.modules from another test.
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"assert old is importlib.import_module({new!r}), old\n"
        f"assert any({new!r} in str(w.message) for w in caught if w.category is DeprecationWarning)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_an_unknown_old_name_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("airflow_provider_pglogical.no_such_module")
