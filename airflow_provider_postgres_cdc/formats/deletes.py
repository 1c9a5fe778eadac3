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

import json
from collections.abc import Mapping
from typing import Literal

from airflow_provider_postgres_cdc.errors import BACKFILL, DeletesOptionError
from airflow_provider_postgres_cdc.formats.manifest import Manifest
from airflow_provider_postgres_cdc.formats.rendered import rendered_value

DeleteMode = Literal["hard", "soft"]
MODES: tuple[DeleteMode, ...] = ("hard", "soft")
DELETES_PROPERTY = "pgl.deletes"
"""The lake table property recording a table's mode (absent: hard)."""
DELETED_AT = "_pgl_deleted_at"
DELETED_LSN = "_pgl_deleted_lsn"

DeletesOption = DeleteMode | dict[str, DeleteMode] | None


def parse_deletes(option: str | Mapping[str, str] | None) -> DeletesOption:
    """The option as given (``"soft"``, a mapping, or the mapping's JSON text), checked.

    ``None`` or an empty text or mapping: no table is named, each keeps its mode.
    """
    if option is None or (isinstance(option, str) and not option.strip()):
        return None
    if isinstance(option, str) and option.strip() not in MODES:
        try:
            option = rendered_value(option)  # type: ignore[assignment]
        except ValueError:
            raise DeletesOptionError(_shape(option)) from None
    if isinstance(option, str):
        if option.strip() in MODES:
            return option.strip()  # type: ignore[return-value]
        raise DeletesOptionError(_shape(option))
    if not isinstance(option, Mapping):
        raise DeletesOptionError(_shape(option))
    modes: dict[str, DeleteMode] = {}
    for table, mode in option.items():
        if not isinstance(table, str) or "." not in table:
            raise DeletesOptionError(f"deletes: {table!r} is not a schema.table name")
        if mode not in MODES:
            raise DeletesOptionError(f"deletes[{table!r}] must be 'hard' or 'soft', not {mode!r}")
        modes[table] = mode
    return modes or None


def option_text(option: DeletesOption) -> str:
    """The option as the job's ``--deletes`` takes it (empty: no table named)."""
    return json.dumps(option) if isinstance(option, dict) else (option or "")


def _shape(option: object) -> str:
    return (
        'deletes is "soft" or "hard" for every table, or {"schema.table": "soft", ...} naming tables, '
        f"not {option!r}"
    )


def mode_for(option: DeletesOption, qualified: str) -> DeleteMode | None:
    """The mode the option asks of a table; None when it does not name it (it keeps its own)."""
    if isinstance(option, dict):
        return option.get(qualified)
    return option


def recorded_mode(properties: Mapping[str, str]) -> DeleteMode:
    """The mode a lake table was loaded with, from its properties."""
    return "soft" if properties.get(DELETES_PROPERTY) == "soft" else "hard"


def check_manifest(manifest: Manifest, option: DeletesOption) -> None:
    """Refuse soft deletes for a table whose changes carry no key: a delete then names a whole
    row, one of possibly several equal rows, and no row of the lake can be marked for it."""
    for spec in manifest.tables:
        if mode_for(option, spec.qualified) == "soft" and spec.counts_rows:
            identity = "FULL" if spec.replica_identity == "f" else "NOTHING or no primary key"
            raise DeletesOptionError(
                f"deletes='soft' for {spec.qualified}: its changes carry no key (REPLICA IDENTITY "
                f"{identity}), so a deleted row cannot be told from an equal one. Give it a primary key "
                "(or REPLICA IDENTITY USING INDEX) and re-snapshot it, or leave it out of the option; "
                "nothing was applied"
            )


def changed_mode_error(qualified: str, recorded: DeleteMode, wanted: DeleteMode) -> DeletesOptionError:
    """A batch asked for another mode than the table holds its rows in."""
    conf = json.dumps({"tables": [qualified], "deletes": {qualified: wanted}})
    return DeletesOptionError(
        f"{qualified} holds rows applied with deletes={recorded!r}; a batch cannot switch it to "
        f"{wanted!r}. Re-snapshot the table under the new option with {BACKFILL} (--conf '{conf}' "
        "with the pipeline's slot_name and staging), and give the CDC DAG the same option; or keep "
        "the option as it was. Nothing of this batch was applied to it"
    )
