"""The ``partition_by`` option: a lake table's Iceberg partition spec, per source table.

``{"public.orders": ["days(placed_at)", "bucket(16, customer_id)"]}`` gives ``public.orders``
that spec when its lake table is created, and moves an existing table to it (Iceberg evolves a
spec in metadata: files written before keep theirs). A table the option does not name keeps the
spec it has; an empty list makes a table unpartitioned. The spec is written in Iceberg's Spark
SQL transforms, and the one a table was given is recorded in its ``pgl.partition-by`` property.

Standard library only: the Airflow side checks the option before the job is submitted, and the
Spark job (which receives this module) applies it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from airflow_provider_postgres_cdc.errors import PartitionSpecError
from airflow_provider_postgres_cdc.formats.manifest import Manifest, is_sibling
from airflow_provider_postgres_cdc.formats.rendered import rendered_mapping

PARTITION_PROPERTY = "pgl.partition-by"
"""The lake table property holding the spec the table was given (canonical JSON list)."""

# Spark SQL's transform names (and Iceberg's aliases and its own ``Transform`` names) -> the canonical one.
TEMPORAL = {
    "year": "years", "years": "years",
    "month": "months", "months": "months",
    "day": "days", "days": "days", "date": "days",
    "hour": "hours", "hours": "hours", "date_hour": "hours",
}  # fmt: skip
_SIZED = ("bucket", "truncate")
KNOWN = ("identity", "years", "months", "days", "hours", "bucket(N, col)", "truncate(W, col)")

# Staged Arrow types (``formats/manifest.py``'s ``arrow_type``) each transform takes, by prefix;
# Iceberg's rules: no bucket of floating point or boolean, truncate of numbers, text and bytes.
_INTEGERS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")
_TEXT = ("string", "large_string", "binary", "large_binary", "fixed_size_binary")
_TAKES: dict[str, tuple[str, ...]] = {
    "years": ("date32", "timestamp["),
    "months": ("date32", "timestamp["),
    "days": ("date32", "timestamp["),
    "hours": ("timestamp[",),
    "bucket": (*_INTEGERS, "decimal", "date32", "time64", "timestamp[", *_TEXT),
    "truncate": (*_INTEGERS, "decimal", *_TEXT),
}
_NESTED = ("list<", "large_list<", "struct<", "map<", "fixed_size_list<")

_CALL = re.compile(r"^\s*([A-Za-z_]+)\s*\((.*)\)\s*$", re.DOTALL)
_BARE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")


@dataclass(frozen=True)
class PartitionField:
    """One field of a spec: a transform of a source column (``width``: bucket count or truncate width)."""

    transform: str  # identity, years, months, days, hours, bucket, truncate
    column: str
    width: int | None = None

    def __str__(self) -> str:
        return self._text(
            self.column if _BARE.match(self.column) else '"' + self.column.replace('"', '""') + '"'
        )

    def spark_sql(self) -> str:
        """The field as Spark SQL's ``PARTITIONED BY`` and ``ADD PARTITION FIELD`` take it."""
        return self._text("`" + self.column.replace("`", "``") + "`")

    def _text(self, name: str) -> str:
        """The field with its column written as ``name`` (quoted as the reader of the text needs)."""
        if self.transform == "identity":
            return name
        if self.width is not None:
            return f"{self.transform}({self.width}, {name})"
        return f"{self.transform}({name})"


PartitionSpecs = dict[str, tuple[PartitionField, ...]]


def _column(text: str, field: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        inner = text[1:-1]
        if '"' not in inner.replace('""', ""):
            return inner.replace('""', '"')
    elif _BARE.match(text):
        return text
    raise PartitionSpecError(
        f"partition field {field!r}: {text!r} is not a column name; write a name as is, or in double "
        "quotes (doubling a quote inside) when it holds anything but letters, digits, _ and $"
    )


def parse_field(text: str) -> PartitionField:
    """One ``partition_by`` entry: ``col``, ``days(col)``, ``bucket(16, col)``, ``truncate(4, col)``..."""
    if not isinstance(text, str) or not text.strip():
        raise PartitionSpecError(f"a partition field is a text such as 'days(placed_at)', not {text!r}")
    call = _CALL.match(text)
    if call is None or (text.strip().startswith('"')):
        return PartitionField("identity", _column(text, text))
    name, inner = call.group(1).lower(), call.group(2)
    if name == "identity":
        return PartitionField("identity", _column(inner, text))
    if name in TEMPORAL:
        return PartitionField(TEMPORAL[name], _column(inner, text))
    if name in _SIZED:
        width, sep, rest = inner.partition(",")
        if not sep or not width.strip().isdigit() or int(width) < 1:
            raise PartitionSpecError(
                f"partition field {text!r}: {name} takes a positive whole number and a column, "
                f"as in '{name}(16, id)'"
            )
        return PartitionField(name, _column(rest, text), int(width))
    raise PartitionSpecError(
        f"partition field {text!r}: {name!r} is not an Iceberg partition transform; "
        f"use one of {', '.join(KNOWN)}"
    )


def parse_partition_by(option: Mapping[str, Sequence[str]] | str | None) -> PartitionSpecs:
    """The ``partition_by`` option (a mapping, or its JSON text as a template renders it) parsed.

    Raises :class:`PartitionSpecError` naming the entry at fault: an unknown transform, a bad
    width, a table name that is not ``schema.table``, a column named twice.
    """
    given = rendered_mapping(
        option,
        lambda bad: PartitionSpecError(
            'partition_by maps "schema.table" names to lists of partition fields, as in '
            f'{{"public.orders": ["days(placed_at)"]}} (a dict, or its JSON text); not {bad!r}'
        ),
    )
    specs: PartitionSpecs = {}
    for table, entries in (given or {}).items():
        if not isinstance(table, str) or "." not in table:
            raise PartitionSpecError(f"partition_by: {table!r} is not a schema.table name")
        if isinstance(entries, str) or not isinstance(entries, Sequence):
            raise PartitionSpecError(
                f"partition_by[{table!r}] is a list of partition fields such as ['days(placed_at)'], "
                f"not {entries!r}"
            )
        fields = tuple(parse_field(entry) for entry in entries)
        if len(set(fields)) != len(fields):
            raise PartitionSpecError(f"partition_by[{table!r}] names one field twice: {list(entries)}")
        specs[table] = fields
    return specs


def check_manifest(manifest: Manifest, specs: Mapping[str, Sequence[PartitionField]]) -> None:
    """Refuse a spec of a manifest's table naming a column it does not publish, or one whose staged
    type (which decides the lake column's) the transform cannot take. A table the manifest does
    not hold is not checked: batches hold only the tables they changed."""
    for spec in manifest.tables:
        if spec.qualified in specs:
            staged = {c.name: c.arrow_type for c in spec.columns if not is_sibling(c.name)}
            _check_columns(spec.qualified, specs[spec.qualified], staged)


def _check_columns(table: str, fields: Sequence[PartitionField], arrow_types: Mapping[str, str]) -> None:
    for field in fields:
        staged = arrow_types.get(field.column)
        if staged is None:
            raise PartitionSpecError(
                f"partition_by[{table!r}]: {str(field)!r} names column {field.column!r}, which the table "
                f"does not publish (published: {', '.join(sorted(arrow_types))}); nothing was applied"
            )
        if field.transform == "identity":
            ok = not staged.startswith(_NESTED)
        else:
            ok = staged.startswith(_TAKES[field.transform])
        if not ok:
            raise PartitionSpecError(
                f"partition_by[{table!r}]: {str(field)!r} cannot partition column {field.column!r}, staged "
                f"as {staged}: {_advice(field.transform)}; nothing was applied"
            )


def _advice(transform: str) -> str:
    if transform == "identity":
        return "arrays and composite values cannot be partition sources"
    if transform == "hours":
        return "hours takes timestamp columns"
    if transform in ("years", "months", "days"):
        return f"{transform} takes date and timestamp columns"
    if transform == "bucket":
        return "bucket takes integers, numerics, dates, times, timestamps, text and bytes, not floats"
    return "truncate takes integers, numerics, text and bytes"


def spec_text(fields: Sequence[PartitionField]) -> str:
    """The value recorded in :data:`PARTITION_PROPERTY`: the fields' canonical texts as JSON."""
    return json.dumps([str(field) for field in fields])


def option_text(specs: Mapping[str, Sequence[PartitionField]]) -> str:
    """``specs`` as the JSON text :func:`parse_partition_by` reads back (how the job receives it)."""
    return json.dumps({table: [str(field) for field in fields] for table, fields in specs.items()})
