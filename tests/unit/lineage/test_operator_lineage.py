"""The operators' OpenLineage methods, called as the openlineage provider calls them, without a server.

Real operators, a real manifest and a real (empty, SQLite-backed) lake catalog; the events'
facets go through the OpenLineage client's own serializer and are validated against the JSON
schemas the package ships. What a real DAG run emits is tests/integration/e2e/test_openlineage.py.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow as pa
import pytest
from openlineage.client.serde import Serde

from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog
from airflow_provider_postgres_cdc.formats.lake import CHANGELOG_SUFFIX, local_lake
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import ColumnManifest, Manifest, TableManifest
from airflow_provider_postgres_cdc.formats.schema_changes import CatalogFacts
from airflow_provider_postgres_cdc.hooks.lake import connection_json
from airflow_provider_postgres_cdc.lineage import datasets
from airflow_provider_postgres_cdc.lineage.facets import schema_of
from airflow_provider_postgres_cdc.operators.ack import PostgresCdcAckOperator
from airflow_provider_postgres_cdc.operators.maintenance import PostgresCdcLakeMaintenanceOperator
from airflow_provider_postgres_cdc.operators.spark_apply import PostgresCdcSparkApplyOperator
from tests.pipeline_lake import create_owned_table
from tests.unit.test_layers import airflow_side_modules

HOSTILE = TableManifest(
    schema="Sales.EU", table="v1.2 orders%ü",
    columns=(ColumnManifest("id", "int4", 23, -1, "int32", key=True),
             ColumnManifest("qty €", "int4", 23, -1, "int32")),
    key_columns=("id",), replica_identity="d", rows=3, files=("x/part-0000.parquet",),
    row_filter="((id % 2) = 0)", column_list=("id", "qty €"),
    catalog=CatalogFacts({}),  # as a drained batch's tables carry (not hashable)
)  # fmt: skip
PLAIN = TableManifest(
    schema="Sales", table="EU.v1.2 orders%ü",
    columns=(ColumnManifest("id", "int8", 20, -1, "int64", key=True),),
    key_columns=("id",), replica_identity="f", rows=2, files=("y/part-0000.parquet",),
)  # fmt: skip


def write_manifest(directory: Path, tables: tuple[TableManifest, ...], kind: str = "batch") -> str:
    manifest = Manifest(kind, "shop_cdc", "shop", "batch-0000000000000100", Lsn(0x100), Lsn(0x2A0), tables)  # type: ignore[arg-type]
    path = directory / "_manifest.json"
    path.write_text(manifest.to_json())
    return str(path)


@pytest.fixture
def lake_conn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_SHOP_LAKE", connection_json(local_lake(str(tmp_path / "lake"))))
    (tmp_path / "lake").mkdir()
    return "shop_lake"


def names(found: list[Any]) -> list[tuple[str, str]]:
    return [(d.namespace, d.name) for d in found]


def assert_valid(facet: Any, name: str) -> dict[str, Any]:
    """The facet as the client serializes it validates against the schema shipped for it."""
    data: dict[str, Any] = Serde.to_dict(facet)
    assert data["_schemaURL"].endswith(f"/{name}.json#/$defs/{name}")
    _, own = schema_of(name)["$defs"][name]["allOf"]
    jsonschema.validate(data, own)
    return data


def test_apply_start_names_the_lake_tables_of_hostile_names_distinctly(
    lake_conn: str, tmp_path: Path
) -> None:
    """No table exists yet: each is named where Spark's OpenLineage integration would place it."""
    path = write_manifest(tmp_path, (HOSTILE, PLAIN))
    lineage = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=path, lake_conn_id=lake_conn
    ).get_openlineage_facets_on_start()
    assert lineage.inputs == []  # the source connection is rendered from the upstream task at COMPLETE
    warehouse = f"{tmp_path}/lake/warehouse"
    assert names(lineage.outputs) == [
        ("file", f"{warehouse}/Sales%2EEU/v1.2 orders%ü"),
        ("file", f"{warehouse}/Sales/EU.v1.2 orders%ü"),
        ("file", f"{warehouse}/Sales%2EEU/v1.2 orders%ü__pgl_changelog"),
        ("file", f"{warehouse}/Sales/EU.v1.2 orders%ü__pgl_changelog"),
    ]
    first = lineage.outputs[0]
    # A JDBC catalog has no Spark symlink (its jdbc: URI has no host); the catalog's own name remains.
    assert Serde.to_dict(first.facets["symlinks"])["identifiers"] == [
        {"namespace": "iceberg://lake", "name": "Sales%2EEU.v1.2 orders%ü", "type": "TABLE"}
    ]
    assert [(f.name, f.type) for f in first.facets["schema"].fields] == [("id", "int32"), ("qty €", "int32")]
    assert "columnLineage" not in first.facets and not first.outputFacets  # no statistics before the run
    batch = assert_valid(lineage.run_facets["postgresCdcBatch"], "PostgresCdcBatchRunFacet")
    assert (batch["startLsn"], batch["endLsn"], batch["cutTag"]) == ("0/100", "0/2A0", "pgl_00000000000002A0")
    assert batch["rows"] == 5


def test_source_tables_carry_schema_row_filter_column_list_and_identity_lineage() -> None:
    manifest = Manifest.from_json(Manifest("batch", "s", "shop", "b", Lsn(1), Lsn(2), (HOSTILE,)).to_json())
    source = datasets.input_dataset("postgres://db.example:5433", manifest, HOSTILE, ["pub"])
    assert (source.namespace, source.name) == ("postgres://db.example:5433", "shop.Sales.EU.v1.2 orders%ü")
    assert [(f.name, f.type) for f in source.facets["schema"].fields] == [("id", "int4"), ("qty €", "int4")]
    publication = assert_valid(source.facets["postgresCdcPublication"], "PostgresCdcPublicationDatasetFacet")
    assert publication["rowFilter"] == "((id % 2) = 0)" and publication["columnList"] == ["id", "qty €"]
    assert publication["replicaIdentity"] == "d" and publication["keyColumns"] == ["id"]
    fields = [("id", "int"), ("qty €", "int"), ("qty €__pgl_text", "string"), ("_pgl_seq", "long")]
    lineage = datasets.column_lineage(fields, source.namespace, source.name, ["id", "qty €"]).fields
    assert set(lineage) == {"id", "qty €", "qty €__pgl_text"}  # the changelog's own column has no source
    (origin,) = lineage["qty €__pgl_text"].inputFields
    assert (origin.name, origin.field, origin.transformations[0].subtype) == (
        source.name,
        "qty €",
        "TRANSFORMATION",
    )
    assert lineage["id"].inputFields[0].transformations[0].subtype == "IDENTITY"
    hashed = datasets.column_lineage(fields, source.namespace, source.name, ["id", "qty €"], {"qty €"}).fields
    (masked,) = hashed["qty €"].inputFields[0].transformations
    assert (masked.subtype, masked.masking) == (
        "TRANSFORMATION",
        True,
    ) and "HMAC-SHA256" in masked.description
    assert hashed["qty €"].transformationType is None and hashed["id"].transformationType == "IDENTITY"


def test_postgres_namespace_defaults_the_port() -> None:
    assert datasets.postgres_namespace({"host": "db", "port": 6432}) == "postgres://db:6432"
    assert datasets.postgres_namespace({"host": "db"}) == "postgres://db:5432"


def test_a_re_snapshot_and_an_empty_batch_carry_no_cut_tag(tmp_path: Path) -> None:
    snapshot = Manifest(
        "snapshot", "shop_cdc", "shop", "s", Lsn(5), Lsn(5), (HOSTILE,), snapshot_slot="tmp_1"
    )
    assert datasets.cut_tag(snapshot) is None
    assert datasets.cut_tag(Manifest("batch", "shop_cdc", "shop", "b", Lsn(5), Lsn(9), ())) is None
    initial = Manifest(
        "snapshot", "shop_cdc", "shop", "s", Lsn(5), Lsn(5), (HOSTILE,), snapshot_slot="shop_cdc"
    )
    assert datasets.cut_tag(initial) == "pgl_0000000000000005"


def test_ack_reads_the_batch_tables_and_writes_the_cut(lake_conn: str, tmp_path: Path) -> None:
    """An existing table is named by the location its Iceberg metadata holds, wherever that is."""
    lake = local_lake(str(tmp_path / "lake"))
    catalog = open_catalog(lake)
    namespace = lake.namespace("Sales.EU")
    catalog.create_namespace(namespace)
    elsewhere = tmp_path / "elsewhere" / "orders"
    columns = pa.schema([("id", pa.int64())])
    catalog.create_table((namespace, "v1.2 orders%ü"), columns, location=f"file://{elsewhere}/")
    path = write_manifest(tmp_path, (HOSTILE,))
    ack = PostgresCdcAckOperator(task_id="ack", slot_name="shop_cdc", manifest=path, lake_conn_id=lake_conn)
    lineage = ack.get_openlineage_facets_on_complete(None)
    assert names(lineage.inputs) == [("file", str(elsewhere))]
    assert names(lineage.inputs[0].facets["symlinks"].identifiers) == [
        ("iceberg://lake", "Sales%2EEU.v1.2 orders%ü")
    ]
    assert names(lineage.outputs) == [("postgres-cdc://lake", "shop_cdc")]
    assert lineage.run_facets["postgresCdcBatch"].endLsn == "0/2A0"


def test_maintenance_names_the_slots_tables_and_changelogs(lake_conn: str, tmp_path: Path) -> None:
    """Tables created with pyiceberg as the job creates them: owned by a slot (table property, index)."""
    lake = local_lake(str(tmp_path / "lake"))
    catalog = open_catalog(lake)
    namespace = lake.namespace("Sales.EU")
    catalog.create_namespace(namespace)
    columns = pa.schema([("id", pa.int64()), ("qty €", pa.int32())])
    create_owned_table(catalog, lake, "shop_cdc", (namespace, "v1.2 orders%ü"), columns)
    catalog.create_table((namespace, "v1.2 orders%ü" + CHANGELOG_SUFFIX), columns)
    create_owned_table(catalog, lake, "another_slot", (namespace, "other"), columns)
    maintain = PostgresCdcLakeMaintenanceOperator(
        task_id="maintain", slot_name="shop_cdc", lake_conn_id=lake_conn
    )
    lineage = maintain.get_openlineage_facets_on_complete(None)
    warehouse = f"{tmp_path}/lake/warehouse"
    expected = [
        ("file", f"{warehouse}/Sales%2EEU/v1.2 orders%ü"),
        ("file", f"{warehouse}/Sales%2EEU/v1.2 orders%ü__pgl_changelog"),
    ]
    assert names(lineage.inputs) == names(lineage.outputs) == expected
    assert names(lineage.outputs[1].facets["symlinks"].identifiers) == [
        ("iceberg://lake", "Sales%2EEU.v1.2 orders%ü__pgl_changelog")
    ]
    assert [(f.name, f.type) for f in lineage.outputs[0].facets["schema"].fields] == [
        ("id", "long"),
        ("qty €", "int"),
    ]


def test_a_failing_lineage_method_logs_and_returns_none(
    lake_conn: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    apply = PostgresCdcSparkApplyOperator(
        task_id="apply", manifest=str(tmp_path / "gone.json"), lake_conn_id=lake_conn
    )
    with caplog.at_level(logging.WARNING):
        assert apply.get_openlineage_facets_on_start() is None
    assert "OpenLineage: apply_lineage failed; the task goes on without lineage" in caplog.text


BLOCKED = """
import importlib, importlib.abc, json, sys
# The provider's own package and its metadata module stay importable: they only declare it (its entry
# point is installed here); the client and every module with OpenLineage code are gone.
DECLARATION = ("airflow.providers.openlineage", "airflow.providers.openlineage.get_provider_info")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        provider = name.startswith("airflow.providers.openlineage") and name not in DECLARATION
        if name.split(".")[0] == "openlineage" or provider:
            raise ImportError(f"blocked for this test: {name}")
        return None
sys.meta_path.insert(0, Block())
manifest, modules = sys.argv[1], sys.argv[2:]
for module in modules:
    importlib.import_module(module)
from airflow_provider_postgres_cdc.operators.ack import PostgresCdcAckOperator
from airflow_provider_postgres_cdc.operators.maintenance import PostgresCdcLakeMaintenanceOperator
from airflow_provider_postgres_cdc.operators.drain import PostgresCdcDrainOperator
from airflow_provider_postgres_cdc.operators.maintenance import PostgresCdcLakeMaintenanceOperator
from airflow_provider_postgres_cdc.operators.snapshot import PostgresCdcSnapshotOperator
from airflow_provider_postgres_cdc.operators.spark_apply import PostgresCdcSparkApplyOperator
operators = [
    PostgresCdcSnapshotOperator(task_id="snapshot", slot_name="s", publications="p", staging="/tmp/x"),
    PostgresCdcDrainOperator(task_id="drain", slot_name="s", publications="p", staging="/tmp/x"),
    PostgresCdcSparkApplyOperator(task_id="apply", manifest=manifest),
    PostgresCdcAckOperator(task_id="ack", slot_name="s", manifest=manifest),
    PostgresCdcLakeMaintenanceOperator(task_id="maintain", slot_name="s"),
]
results = [[op.get_openlineage_facets_on_start(), op.get_openlineage_facets_on_complete(None)]
           for op in operators]
print(json.dumps({"imported": len(modules), "results": results}))
"""


def test_without_the_openlineage_provider_everything_imports_and_lineage_is_none(tmp_path: Path) -> None:
    """The ``openlineage`` extra absent: every Airflow-side module imports, every method answers None."""
    spark_operators = [
        "airflow_provider_postgres_cdc.operators.spark_apply",
        "airflow_provider_postgres_cdc.operators.maintenance",
    ]
    modules = [*airflow_side_modules(), *spark_operators]
    path = write_manifest(tmp_path, (HOSTILE,))
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED, path, *modules], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"imported": len(modules), "results": [[None, None]] * 5}
    assert "airflow_provider_postgres_cdc.lineage.tasks" in modules
