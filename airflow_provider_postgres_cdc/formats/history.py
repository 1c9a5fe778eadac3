"""The ``history`` option: whether a keyed lake table keeps every version of its rows (SCD type 2).

With ``"scd2"`` a table ``<table>__pgl_history`` (``lake.HISTORY_SUFFIX``) stands beside the lake
table: one row per version of a source row, its published columns (after column transforms) and

* :data:`VALID_FROM_LSN` and :data:`VALID_FROM`: the commit LSN and time of the transaction that
  wrote the version. A row the loading snapshot found has the snapshot's consistent point minus
  one (it holds exactly the transactions whose commit LSN is below that point) and the time its
  slot was created (``Manifest.consistent_time``);
* :data:`VALID_TO_LSN` and :data:`VALID_TO`: those of the transaction that replaced or removed it,
  NULL while it is the current version; :data:`IS_CURRENT` says the same as a boolean;
* :data:`ENDED_BY`: ``"update"`` (a key change ends the old key's version with it), ``"delete"``
  or ``"truncate"``; NULL while current.

The source as of a consistent cut ``pgl_<E>`` (every transaction whose commit LSN is below E) is
``_pgl_valid_from_lsn < E AND (_pgl_valid_to_lsn IS NULL OR _pgl_valid_to_lsn >= E)``; as of a
time T, ``_pgl_valid_from <= T AND (_pgl_valid_to IS NULL OR _pgl_valid_to > T)``. Versions that
lived inside one transaction (a row updated twice by it) have equal ends and match neither.

``"scd2"`` (or ``"none"``) applies to every table; ``{"public.orders": "scd2"}`` names tables, and
a table it does not name keeps the mode it was loaded with (new ones: none). A table's mode is
recorded in its :data:`HISTORY_PROPERTY`; only a snapshot load of the table may switch it, and the
history then starts at that load (the changes before it stay in the changelog). Standard library
only: the Airflow side checks the option before the job is submitted, the Spark job applies it.
"""

from __future__ import annotations

from typing import Literal

from airflow_provider_postgres_cdc.errors import HistoryOptionError
from airflow_provider_postgres_cdc.formats.table_modes import TableMode
from airflow_provider_postgres_cdc.formats.table_modes import option_text as option_text  # the job's text

HistoryMode = Literal["none", "scd2"]
MODES: tuple[HistoryMode, ...] = ("none", "scd2")
HISTORY_PROPERTY = "pgl.history"
"""The lake table property recording a table's mode (absent: none)."""
VALID_FROM_LSN = "_pgl_valid_from_lsn"
VALID_TO_LSN = "_pgl_valid_to_lsn"
VALID_FROM = "_pgl_valid_from"
VALID_TO = "_pgl_valid_to"
IS_CURRENT = "_pgl_is_current"
ENDED_BY = "_pgl_ended_by"
VERSION_COLUMNS = (VALID_FROM_LSN, VALID_TO_LSN, VALID_FROM, VALID_TO, IS_CURRENT, ENDED_BY)
"""The columns a history table adds after the published ones, in this order."""
ENDINGS = {"U": "update", "D": "delete", "T": "truncate"}
"""Staged operation code (FORMATS.md ``_pgl_op``) -> the :data:`ENDED_BY` of the version it ends."""

HistoryOption = HistoryMode | dict[str, HistoryMode] | None


HISTORY = TableMode[HistoryMode](
    "history", MODES, HISTORY_PROPERTY, "scd2",
    "an update or delete cannot say which of several equal rows' versions it ends",
    HistoryOptionError,
)  # fmt: skip
