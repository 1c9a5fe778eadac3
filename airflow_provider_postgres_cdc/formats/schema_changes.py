"""Which source schema changes the lake can follow from the stream alone, and which need a re-snapshot.

Standard library only: the Spark apply job ships this module (``spark.job_py_files``), and the
drain writes the facts it reads into the manifest (docs/FORMATS.md, docs/LAKE.md "Schema changes").

pgoutput sends a table's live, non-generated, published columns in ``attnum`` order, in a Relation
message before the first change after any ALTER. Between two consecutive relation versions the
stream shows only the column lists; what the ALTER did to the rows already in the table it never
shows. So every step between versions is classified, and anything the lists cannot explain is a
re-snapshot, never a guess:

* same columns and types: nothing to do;
* a column's type widened in a way that keeps every value (:func:`is_widening`): widen the lake column;
* columns only removed, the rest in order: a drop (the lake keeps the column, it stops being written);
* columns only appended at the end: an add. Rows that existed before it hold the column's *missing
  value* (``pg_attribute.attmissingval``, kept by PostgreSQL 11+ for a non-volatile default, a
  constant or a stable expression such as ``now()``, without rewriting the table), or NULL when
  the column has no default at all. A column with a default but no missing value got its values
  from a volatile default or a table rewrite: unknowable here.
* anything else (a name replaced in place: a rename; columns removed and added in one step; a
  reorder; a type change that is not a widening): a re-snapshot.

The catalog facts are read by the drain after the batch's window, so later than the ALTER; the rule
stays safe because everything that could happen since only makes it stricter: a later rewrite
clears ``atthasmissing`` (default without missing value: re-snapshot), a later drop removes the
column (not in the catalog: re-snapshot), a later ``SET DEFAULT`` leaves the missing value alone.
"""

from __future__ import annotations

import itertools
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_postgres_cdc.errors import BACKFILL, BACKFILL_DAG
from airflow_provider_postgres_cdc.formats.pgtypes import numeric_precision_scale, pg_type_text

# PostgreSQL type OIDs of the widening promotions.
_INT2, _INT4, _INT8 = 21, 23, 20
_FLOAT4, _FLOAT8 = 700, 701
_NUMERIC, _VARCHAR, _TEXT = 1700, 1043, 25
_INTEGER_RANK = {_INT2: 2, _INT4: 4, _INT8: 8}


@dataclass(frozen=True, slots=True)
class SourceColumn:
    """One column of a relation version as pgoutput announces it: name, type OID, typmod."""

    name: str
    type_oid: int
    typmod: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type_oid": self.type_oid, "typmod": self.typmod}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SourceColumn:
        return cls(str(data["name"]), int(data["type_oid"]), int(data["typmod"]))


@dataclass(frozen=True, slots=True)
class RelationVersion:
    """One relation version of a table in a batch: its columns and the staged files it wrote."""

    columns: tuple[SourceColumn, ...]
    files: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"columns": [c.to_dict() for c in self.columns], "files": list(self.files)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RelationVersion:
        return cls(
            tuple(SourceColumn.from_dict(c) for c in data["columns"]), tuple(str(f) for f in data["files"])
        )


@dataclass(frozen=True, slots=True)
class ColumnFacts:
    """What the catalog said about a column when the batch was drained.

    ``missing`` is the text of the missing value (None: SQL NULL or no missing value);
    ``has_default`` counts a column default, an identity and a domain default alike.
    """

    has_missing: bool
    has_default: bool
    missing: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"has_missing": self.has_missing, "has_default": self.has_default, "missing": self.missing}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ColumnFacts:
        missing = data.get("missing")
        return cls(
            bool(data["has_missing"]), bool(data["has_default"]), None if missing is None else str(missing)
        )


@dataclass(frozen=True, slots=True)
class CatalogFacts:
    """The catalog facts of one table's current columns, and the staged file holding the missing
    values typed like the changes (one row; None when no column has one)."""

    columns: Mapping[str, ColumnFacts]
    missing_values_file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "columns": {name: facts.to_dict() for name, facts in self.columns.items()},
            "missing_values_file": self.missing_values_file,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CatalogFacts:
        columns = {str(name): ColumnFacts.from_dict(facts) for name, facts in data["columns"].items()}
        return cls(columns, data.get("missing_values_file"))


@dataclass(frozen=True, slots=True)
class Step:
    """How one relation version follows the previous one; ``problem`` set means a re-snapshot."""

    added: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    widened: tuple[str, ...] = ()
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Fill:
    """Rows that existed before relation version ``version`` (the lake's rows at batch start and
    the batch's rows staged under earlier versions) get ``column``'s missing value, or NULL."""

    column: str
    version: int
    missing: bool


@dataclass(frozen=True, slots=True)
class Plan:
    """What a batch's relation versions ask of the lake table, or why only a re-snapshot can tell."""

    fills: tuple[Fill, ...] = ()
    widened: tuple[str, ...] = ()
    problem: str | None = None
    steps: tuple[Step, ...] = field(default=(), compare=False)


def is_widening(before: SourceColumn, after: SourceColumn) -> bool:
    """Whether every value of ``before``'s type is the same value in ``after``'s (no rewrite changes it).

    int2 → int4 → int8, float4 → float8, numeric(p,s) → numeric(q,s) with q > p, varchar(n) →
    varchar(m) with m > n or unbounded, varchar → text.
    """
    old, new = before.type_oid, after.type_oid
    if old in _INTEGER_RANK and new in _INTEGER_RANK:
        return _INTEGER_RANK[new] > _INTEGER_RANK[old]
    if (old, new) == (_FLOAT4, _FLOAT8) or (old, new) == (_VARCHAR, _TEXT):
        return True
    if old == new == _VARCHAR:
        return after.typmod < 0 or 0 <= before.typmod < after.typmod
    if old == new == _NUMERIC:
        was, now = numeric_precision_scale(before.typmod), numeric_precision_scale(after.typmod)
        return was is not None and now is not None and was[1] == now[1] and now[0] > was[0]
    return False


def _type_text(column: SourceColumn) -> str:
    return pg_type_text(column.type_oid, column.typmod)


def classify(before: Sequence[SourceColumn], after: Sequence[SourceColumn]) -> Step:
    """Classify the step from relation version ``before`` to ``after`` (see the module docstring)."""
    old = {c.name: c for c in before}
    new = {c.name: c for c in after}
    kept_before = [c.name for c in before if c.name in new]
    kept_after = [c.name for c in after if c.name in old]
    dropped = tuple(c.name for c in before if c.name not in new)
    added = tuple(c.name for c in after if c.name not in old)
    if kept_before != kept_after:
        return Step(problem=f"columns reordered ({kept_before} became {kept_after})")
    if [c.name for c in after[: len(kept_after)]] != kept_after:
        return Step(problem=f"columns {list(added)} appeared before existing ones (not appended)")
    if dropped and added:
        return Step(
            problem=f"columns {list(dropped)} gone and {list(added)} new in one step (a RENAME COLUMN "
            "looks the same in the stream)"
        )
    widened = []
    for name in kept_after:
        was, now = old[name], new[name]
        if (was.type_oid, was.typmod) == (now.type_oid, now.typmod):
            continue
        if not is_widening(was, now):
            return Step(
                problem=f"column {name!r} changed from {_type_text(was)} to {_type_text(now)}, "
                "which is not a widening (the table was rewritten with values the stream never showed)"
            )
        widened.append(name)
    return Step(added=added, dropped=dropped, widened=tuple(widened))


def _fill_for(name: str, version: int, facts: CatalogFacts | None) -> Fill | str:
    """The fill of an added column from the catalog facts, or the reason it is unknowable."""
    column = None if facts is None else facts.columns.get(name)
    if column is None:
        return f"column {name!r} was added but is not in the catalog any more (dropped or renamed since)"
    if column.has_missing:
        return Fill(name, version, missing=column.missing is not None)
    if not column.has_default:
        return Fill(name, version, missing=False)
    return (
        f"column {name!r} was added with a default PostgreSQL keeps no missing value for (a volatile "
        "default such as clock_timestamp() or a sequence, an identity, or a table rewrite since): the "
        "values of the rows that existed before are not in the stream"
    )


def plan(
    previous: Sequence[SourceColumn] | None,
    versions: Sequence[Sequence[SourceColumn]],
    facts: CatalogFacts | None,
) -> Plan:
    """Classify ``previous`` (the last version the lake applied; None if unknown) and the batch's
    live ``versions`` in order.

    Only the last addition of a column name uses the catalog facts (they describe the column as it
    is now); its fill covers every row before it, so an earlier addition of the same name, dropped
    since, needs none of its own.
    """
    chain: list[Sequence[SourceColumn]] = ([previous] if previous is not None else []) + list(versions)
    offset = 1 if previous is not None else 0
    steps = tuple(classify(a, b) for a, b in itertools.pairwise(chain))
    for step in steps:
        if step.problem is not None:
            return Plan(problem=step.problem, steps=steps)
    retyped = _readded_with_another_type(chain)
    if retyped is not None:
        return Plan(problem=retyped, steps=steps)
    last_added: dict[str, int] = {}
    for index, step in enumerate(steps):
        for name in step.added:
            last_added[name] = index + 1 - offset  # the version index the column first appears in
    fills = []
    for name, version in last_added.items():
        fill = _fill_for(name, version, facts)
        if isinstance(fill, str):
            return Plan(problem=fill, steps=steps)
        fills.append(fill)
    widened = tuple(dict.fromkeys(name for step in steps for name in step.widened))
    return Plan(fills=tuple(fills), widened=widened, steps=steps)


def _readded_with_another_type(chain: Sequence[Sequence[SourceColumn]]) -> str | None:
    """A column dropped and added again under its name with a type the first one cannot widen to.

    The lake keeps a dropped column (with its values), so the re-added one would have to change
    that column's type in place, which Iceberg cannot do; a re-snapshot retypes it.
    """
    seen: dict[str, SourceColumn] = {}
    for version in chain:
        for now in version:
            was = seen.get(now.name)
            retyped = was is not None and (was.type_oid, was.typmod) != (now.type_oid, now.typmod)
            if was is not None and retyped and not is_widening(was, now):
                return (
                    f"column {now.name!r} was dropped and added again as {_type_text(now)} "
                    f"(it was {_type_text(was)}), and a lake column cannot change to that type"
                )
            seen[now.name] = now
    return None


def encode_columns(columns: Sequence[SourceColumn]) -> str:
    """Compact JSON of a column list (the lake's ``pgl.source-columns`` snapshot summary value)."""
    return json.dumps(
        [[c.name, c.type_oid, c.typmod] for c in columns], ensure_ascii=False, separators=(",", ":")
    )


def decode_columns(text: str) -> tuple[SourceColumn, ...]:
    return tuple(SourceColumn(str(n), int(o), int(m)) for n, o, m in json.loads(text))


def backfill_command(slot: str, staging: str | None, table: str) -> str:
    """The command that re-snapshots ``table`` (``schema.table``) of the pipeline of ``slot``.

    The job knows the slot and the staging root; the publication and connection ids are the CDC
    DAG's own (the backfill DAG takes the same conf keys).
    """
    conf: dict[str, Any] = {"slot_name": slot}
    if staging:
        conf["staging"] = staging
    conf["tables"] = [table]
    text = json.dumps(conf, ensure_ascii=False)
    return (
        f"airflow dags trigger {BACKFILL_DAG} --conf {shlex.quote(text)} (add the publication and "
        f"connection ids of the CDC DAG's conf; {BACKFILL})"
    )
