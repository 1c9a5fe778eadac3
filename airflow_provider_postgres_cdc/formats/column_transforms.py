"""The ``column_transforms`` option: columns hashed or dropped before anything of them is staged.

``{"public.customers": {"email": "hash", "ssn": "drop"}}``: ``hash`` stages a column as the
lowercase hex HMAC-SHA256 of its PostgreSQL text form under a secret key (the same value gives the
same hash in the snapshot and in every batch, so joins on a hashed key still match); ``drop``
stages nothing of it. A hashed column is a ``text`` column from the staging on. Which transforms a
lake table's rows were staged under (and the key's identifier, never the key) is recorded in its
:data:`TRANSFORMS_PROPERTY`, and only a re-snapshot of the table may change it.

Standard library only: the Airflow side checks the option, the drain and the snapshot copy apply
it, and the Spark job compares what a manifest records with what its table holds.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from airflow_provider_postgres_cdc.errors import BACKFILL, ColumnTransformsError
from airflow_provider_postgres_cdc.formats.rendered import rendered_mapping

Transform = Literal["hash", "drop"]
TRANSFORMS: tuple[Transform, ...] = ("hash", "drop")
TRANSFORMS_PROPERTY = "pgl.column-transforms"
"""The lake table property recording what its rows were staged under (absent: nothing)."""

ColumnTransforms = dict[str, dict[str, Transform]]
"""``schema.table`` -> column -> transform; only the tables and columns it names are transformed."""

_KEY_ID_MESSAGE = b"airflow-provider-postgres-cdc column_transforms key identifier"


def parse_column_transforms(option: str | Mapping[str, Mapping[str, str]] | None) -> ColumnTransforms:
    """The option as given (a mapping, or the mapping's JSON text as a template renders it), checked.

    ``None``, an empty text or an empty mapping transforms nothing.
    """
    given = rendered_mapping(option, lambda bad: ColumnTransformsError(_shape(bad)))
    parsed: ColumnTransforms = {}
    for table, columns in (given or {}).items():
        if not isinstance(table, str) or "." not in table:
            raise ColumnTransformsError(f"column_transforms: {table!r} is not a schema.table name")
        if not isinstance(columns, Mapping) or not columns:
            raise ColumnTransformsError(
                f"column_transforms[{table!r}] must map column names to 'hash' or 'drop', not {columns!r}"
            )
        for name, transform in columns.items():
            if not isinstance(name, str) or not name:
                raise ColumnTransformsError(f"column_transforms[{table!r}]: {name!r} is not a column name")
            if transform not in TRANSFORMS:
                raise ColumnTransformsError(
                    f"column_transforms[{table!r}][{name!r}] must be 'hash' or 'drop', not {transform!r}"
                )
        parsed[table] = dict(columns)  # type: ignore[arg-type]
    return parsed


def _shape(option: object) -> str:
    return (
        'column_transforms is {"schema.table": {"column": "hash" or "drop", ...}, ...}, or its JSON text, '
        f"not {option!r}"
    )


def named(columns: Mapping[str, str], transform: Transform) -> frozenset[str]:
    """The columns ``columns`` (column -> transform) gives ``transform``."""
    return frozenset(name for name, given in columns.items() if given == transform)


def hashes_anything(transforms: ColumnTransforms) -> bool:
    """Whether a hash key is needed."""
    return any(named(columns, "hash") for columns in transforms.values())


def check_copy_engine(transforms: ColumnTransforms, copy_engine: str) -> None:
    """Refuse hashing in a snapshot the Spark engine copies: it would stage the clear values (it
    writes what JDBC reads; dropping works, as the plan never selects a dropped column)."""
    if copy_engine == "spark" and hashes_anything(transforms):
        raise ColumnTransformsError(
            "column_transforms hashes columns in the local copy engine only: the Spark engine would stage "
            "their clear values. Run the snapshot with copy_engine='local'; nothing was staged"
        )


def key_id(key: bytes) -> str:
    """A short public identifier of a hash key (an HMAC of a fixed text): a lake table records it,
    so that a batch hashed under another key is refused rather than breaking joins silently."""
    return hmac.new(key, _KEY_ID_MESSAGE, hashlib.sha256).hexdigest()[:16]


def recorded_text(columns: Mapping[str, Transform] | None, key: str | None) -> str:
    """What a table's staged rows are transformed by, as its manifest and lake table record it
    (empty: nothing); ``key`` is the hash key's :func:`key_id`, kept only when a column is hashed."""
    if not columns:
        return ""
    hashed = bool(named(columns, "hash"))
    return json.dumps(
        {"columns": dict(sorted(columns.items())), "key_id": key if hashed else None}, sort_keys=True
    )


def hashed_columns(recorded: str) -> frozenset[str]:
    """The columns a :func:`recorded_text` hashes."""
    return named(_parsed(recorded)["columns"], "hash")


def check_published(transforms: ColumnTransforms, published: Iterable[tuple[str, Iterable[str]]]) -> None:
    """Refuse a table the publications do not publish or a column they do not publish of it
    (``published``: each table's ``schema.table`` and published column names)."""
    columns: dict[str, set[str]] = {}
    for table, names in published:  # a table several publications publish: any of them counts
        columns.setdefault(table, set()).update(names)
    for table, named in transforms.items():
        if table not in columns:
            raise ColumnTransformsError(
                f"column_transforms names {table}, which the publication(s) do not publish: correct the "
                "name (schema.table, as PostgreSQL spells it) or add the table to the publication; nothing "
                "was staged"
            )
        unknown = sorted(set(named) - columns[table])
        if unknown:
            raise ColumnTransformsError(
                f"column_transforms[{table!r}] names {', '.join(map(repr, unknown))}, which the "
                f"publication does not publish (published: {', '.join(sorted(columns[table]))}); nothing "
                "was staged"
            )


def check_keys(qualified: str, columns: Mapping[str, Transform], key_columns: Iterable[str]) -> None:
    """Refuse dropping a replica-identity column: updates and deletes find their lake row by it.
    (A hashed one is fine: the old key in a change is hashed the same way as the row's.)"""
    dropped = sorted(c for c in key_columns if columns.get(c) == "drop")
    if dropped:
        raise ColumnTransformsError(
            f"column_transforms[{qualified!r}] drops {', '.join(map(repr, dropped))}, part of the table's "
            "replica identity, by which updates and deletes find their row in the lake: hash it instead, "
            "or leave it out of the publication's column list and the identity; nothing was staged"
        )


def check_recorded(
    qualified: str, properties: Mapping[str, str], staged: str, columns: Iterable[str]
) -> None:
    """Refuse changes staged under other transforms than the lake table's rows (its properties).

    Every column the batch publishes (``columns``) or transforms must be transformed as the table's
    rows were, hashed ones under the same key. A column the batch does not name at all (dropped
    from the source, and from the option, since) is not compared, so dropping a transformed column
    from the source needs no re-snapshot; the table keeps its record, so a column of that name
    added back in clear is refused."""
    recorded = properties.get(TRANSFORMS_PROPERTY) or ""
    was, now = _parsed(recorded), _parsed(staged)
    compared = set(columns) | set(now["columns"])
    differs = any(was["columns"].get(name) != now["columns"].get(name) for name in compared)
    hashing = bool(named(now["columns"], "hash") & compared)
    if differs or (hashing and was["key_id"] != now["key_id"]):
        raise changed_error(qualified, recorded, staged)


def _parsed(recorded: str) -> dict[str, Any]:
    return json.loads(recorded) if recorded else {"columns": {}, "key_id": None}


def changed_error(qualified: str, recorded: str, staged: str) -> ColumnTransformsError:
    """A batch staged under other column transforms (or another hash key) than its table's rows."""
    conf = json.dumps({"tables": [qualified], "column_transforms": {qualified: "..."}})
    return ColumnTransformsError(
        f"{qualified} holds rows staged under column_transforms {recorded or 'none'}, but this batch was "
        f"staged under {staged or 'none'} (the option or the hash key changed). Re-snapshot the table "
        f"under the new option with {BACKFILL} (--conf '{conf}' with the pipeline's slot_name and "
        "staging, the option as the CDC DAG now has it), or restore the option and key it had. Nothing of "
        "this batch was applied to it"
    )
