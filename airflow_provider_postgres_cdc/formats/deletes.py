"""The ``deletes`` option: whether a lake table drops deleted rows (``"hard"``) or keeps them marked.

With ``"soft"`` a deleted row stays in the lake table with :data:`DELETED_AT` (the deleting
transaction's commit time) and :data:`DELETED_LSN` (its commit LSN) set; a row whose key is
inserted again has them cleared, and a TRUNCATE marks every row. The live rows, the source's, are
those where :data:`DELETED_LSN` is NULL. ``"soft"`` (or ``"hard"``) applies to every table;
``{"public.orders": "soft"}`` names tables, and a table it does not name keeps the mode it was
loaded with (new ones: hard). A table's mode is recorded in its :data:`DELETES_PROPERTY`, and only
a snapshot load of the table may change it (a batch cannot mark rows deleted before it).

Standard library only: the Airflow side checks the option before the job is submitted, the Spark
job applies it, and ``verify`` reads the lake the documented way.
"""

from __future__ import annotations

from typing import Literal

from airflow_provider_postgres_cdc.errors import DeletesOptionError
from airflow_provider_postgres_cdc.formats.table_modes import TableMode
from airflow_provider_postgres_cdc.formats.table_modes import option_text as option_text  # the job's text

DeleteMode = Literal["hard", "soft"]
MODES: tuple[DeleteMode, ...] = ("hard", "soft")
DELETES_PROPERTY = "pgl.deletes"
"""The lake table property recording a table's mode (absent: hard)."""
DELETED_AT = "_pgl_deleted_at"
DELETED_LSN = "_pgl_deleted_lsn"

DeletesOption = DeleteMode | dict[str, DeleteMode] | None


DELETES = TableMode[DeleteMode](
    "deletes", MODES, DELETES_PROPERTY, "soft",
    "a deleted row cannot be told from an equal one, and no row of the lake can be marked for it",
    DeletesOptionError,
)  # fmt: skip
parse_deletes = DELETES.parse
mode_for = DELETES.mode_for
recorded_mode = DELETES.recorded
check_manifest = DELETES.check_manifest
changed_mode_error = DELETES.changed_error
