"""Import paths of the flat 0.1 layout that moved into ``formats``, ``values`` and ``engine``.

DAGs and scripts written against 0.1 import ``airflow_provider_pglogical.drain`` and the like; a
finder on ``sys.meta_path`` answers those names with the module's new home, the same module object,
and a ``DeprecationWarning`` naming the new path. Nothing inside the package uses the old names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

_PACKAGE = "airflow_provider_pglogical"
_NEW_HOMES = {
    "catalog_facts": "engine.catalog_facts",
    "drain": "engine.drain",
    "lake": "formats.lake",
    "lake_catalog": "engine.lake_catalog",
    "lsn": "formats.lsn",
    "manifest": "formats.manifest",
    "overflow": "values.overflow",
    "pgtypes": "formats.pgtypes",
    "raw_text": "values.raw_text",
    "retention": "engine.retention",
    "schema_changes": "formats.schema_changes",
    "sequencing": "engine.sequencing",
    "slot_health": "engine.health",
    "snapshot": "engine.snapshot",
    "staging": "engine.staging",
    "types": "values.arrow_types",
    "verify": "engine.verify",
}
MOVED = {f"{_PACKAGE}.{old}": f"{_PACKAGE}.{new}" for old, new in _NEW_HOMES.items()}
"""Old dotted module name -> the name it has now."""


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module name to the module at its new home."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        new_name = MOVED[module.__name__]
        warnings.warn(
            f"{module.__name__} moved to {new_name} in airflow-provider-pglogical 0.2; import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        # The import system returns whatever sys.modules holds after exec_module: the real module.
        sys.modules[module.__name__] = importlib.import_module(new_name)


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
