"""The schema-change classifier: which relation-version steps the lake follows, which need a re-snapshot."""

from __future__ import annotations

import json
import shlex

import pytest

from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest, TableManifest
from airflow_provider_postgres_cdc.formats.schema_changes import (
    CatalogFacts,
    ColumnFacts,
    Fill,
    RelationVersion,
    SourceColumn,
    backfill_command,
    classify,
    decode_columns,
    encode_columns,
    is_widening,
    plan,
)

INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC, VARCHAR, TEXT, BPCHAR = 21, 23, 20, 700, 701, 1700, 1043, 25, 1042


def col(name: str, oid: int = INT4, typmod: int = -1) -> SourceColumn:
    return SourceColumn(name, oid, typmod)


def numeric(precision: int, scale: int) -> int:
    return ((precision << 16) | scale) + 4


ID, A, B = col("id"), col("a", TEXT), col("b")


@pytest.mark.parametrize(
    ("before", "after", "widens"),
    [
        ((INT2, -1), (INT4, -1), True),
        ((INT2, -1), (INT8, -1), True),
        ((INT4, -1), (INT8, -1), True),
        ((INT8, -1), (INT4, -1), False),
        ((FLOAT4, -1), (FLOAT8, -1), True),
        ((FLOAT8, -1), (FLOAT4, -1), False),
        ((NUMERIC, numeric(10, 2)), (NUMERIC, numeric(12, 2)), True),
        ((NUMERIC, numeric(10, 2)), (NUMERIC, numeric(12, 3)), False),  # scale change rewrites values
        ((NUMERIC, numeric(12, 2)), (NUMERIC, numeric(10, 2)), False),
        ((NUMERIC, numeric(10, 2)), (NUMERIC, -1), False),  # unconstrained: another lake type
        ((VARCHAR, 14), (VARCHAR, 24), True),
        ((VARCHAR, 24), (VARCHAR, 14), False),
        ((VARCHAR, 14), (VARCHAR, -1), True),
        ((VARCHAR, 14), (TEXT, -1), True),
        ((TEXT, -1), (VARCHAR, 14), False),
        ((BPCHAR, 14), (BPCHAR, 24), False),  # padding changes the text
        ((INT4, -1), (TEXT, -1), False),
        ((INT4, -1), (NUMERIC, numeric(20, 0)), False),
    ],
)
def test_widening_promotions(before: tuple[int, int], after: tuple[int, int], widens: bool) -> None:
    assert is_widening(col("c", *before), col("c", *after)) is widens


def test_same_columns_is_nothing() -> None:
    step = classify([ID, A], [ID, A])
    assert (step.added, step.dropped, step.widened, step.problem) == ((), (), (), None)


def test_appended_columns_are_an_add_and_removed_ones_a_drop() -> None:
    assert classify([ID, A], [ID, A, B]).added == ("b",)
    step = classify([ID, A, B], [ID, B])
    assert step.dropped == ("a",) and step.problem is None


def test_widened_type_is_a_widen_and_other_type_changes_a_problem() -> None:
    assert classify([ID, col("b", INT4)], [ID, col("b", INT8)]).widened == ("b",)
    step = classify([ID, col("b", INT4)], [ID, col("b", TEXT)])
    assert step.problem is not None and "'b'" in step.problem


@pytest.mark.parametrize(
    "after",
    [
        [ID, col("c", TEXT)],  # a rename of a: a name replaced in place
        [ID, B],  # a dropped, b added in one step
        [A, ID],  # reordered
        [ID, B, A],  # b inserted before an existing column (cannot be an ADD COLUMN)
    ],
)
def test_steps_the_stream_cannot_explain_are_problems(after: list[SourceColumn]) -> None:
    assert classify([ID, A], after).problem is not None


FACTS = CatalogFacts(
    {
        "id": ColumnFacts(False, False),
        "a": ColumnFacts(False, False),
        "k": ColumnFacts(True, True, "5"),  # ADD COLUMN k int DEFAULT 5
        "n": ColumnFacts(False, False),  # ADD COLUMN n int
        "v": ColumnFacts(False, True),  # ADD COLUMN v timestamptz DEFAULT now()
    }
)


def test_add_with_missing_value_fills_rows_before_its_version() -> None:
    result = plan([ID, A], [[ID, A], [ID, A, col("k")]], FACTS)
    assert result.problem is None and result.fills == (Fill("k", 1, missing=True),)
    # added between the lake's last version and this batch's first: only the lake's rows
    assert plan([ID, A], [[ID, A, col("k")]], FACTS).fills == (Fill("k", 0, missing=True),)


def test_add_without_default_fills_null() -> None:
    assert plan([ID, A], [[ID, A, col("n")]], FACTS).fills == (Fill("n", 0, missing=False),)


def test_add_with_default_but_no_missing_value_is_a_problem() -> None:
    result = plan([ID, A], [[ID, A], [ID, A, col("v")]], FACTS)
    assert result.problem is not None and "'v'" in result.problem and "volatile" in result.problem


def test_added_column_gone_from_the_catalog_is_a_problem() -> None:
    assert "not in the catalog" in str(plan([ID, A], [[ID, A, col("gone")]], FACTS).problem)


def test_only_the_last_add_of_a_name_uses_the_catalog() -> None:
    # k added, dropped and added again: the fill of the last one covers every earlier row
    versions = [[ID, A, col("k")], [ID, A], [ID, A, col("k")]]
    assert plan([ID, A], versions, FACTS).fills == (Fill("k", 2, missing=True),)


def test_a_name_readded_with_a_type_it_cannot_widen_to_is_a_problem() -> None:
    readded_as_text = [[ID, A, col("k")], [ID, A], [ID, A, col("k", TEXT)]]
    result = plan([ID, A], readded_as_text, FACTS)
    assert result.problem is not None and "dropped and added again" in result.problem
    readded_wider = [[ID, A, col("k")], [ID, A], [ID, A, col("k", INT8)]]
    assert plan([ID, A], readded_wider, FACTS).problem is None


def test_unknown_previous_version_classifies_only_within_the_batch() -> None:
    assert plan(None, [[ID, A, col("k")]], FACTS).fills == ()
    assert plan(None, [[ID, A], [ID, col("x")]], FACTS).problem is not None


def test_without_catalog_facts_an_add_is_a_problem() -> None:
    assert plan([ID], [[ID, A]], None).problem is not None


def test_columns_round_trip_through_the_summary_text() -> None:
    columns = (col("id"), col('naïve "q"', NUMERIC, numeric(12, 2)))
    assert decode_columns(encode_columns(columns)) == columns


def test_backfill_command_is_a_shell_command_with_valid_json() -> None:
    command = backfill_command("shop_cdc", "/data/stag'ing", "public.it's")
    words = shlex.split(command.split(" (add")[0])
    assert words[:5] == ["airflow", "dags", "trigger", "postgres_cdc_backfill_tables", "--conf"]
    assert json.loads(words[5]) == {
        "slot_name": "shop_cdc",
        "staging": "/data/stag'ing",
        "tables": ["public.it's"],
    }


def test_manifest_keeps_versions_and_facts_and_reads_old_entries() -> None:
    version = RelationVersion((ID, A), ("public.t/part-v000-0000.parquet",))
    entry = TableManifest(
        "public", "t", (), ("id",), "d", 1, version.files, versions=(version,), catalog=FACTS
    )
    manifest = Manifest("batch", "s", "db", "b", Lsn(0), Lsn(0), (entry,))
    again = Manifest.from_json(manifest.to_json()).tables[0]
    assert again.versions == (version,) and again.catalog == FACTS
    old = entry.to_dict()
    del old["versions"], old["catalog"]
    assert TableManifest.from_dict(old).versions == () and TableManifest.from_dict(old).catalog is None


def test_problems_name_types_as_postgresql_does() -> None:
    problem = classify([ID, col("n", NUMERIC, numeric(10, 2))], [ID, col("n", TEXT)]).problem
    assert problem is not None and "from numeric(10,2) to text" in problem
    readded = plan([ID, A], [[ID, A, col("k", VARCHAR, 44)], [ID, A], [ID, A, col("k", INT4)]], FACTS).problem
    assert readded is not None and "added again as int4 (it was varchar(40))" in readded
