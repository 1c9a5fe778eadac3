"""Hostile source names in a catalog that restricts names: SeaweedFS's Iceberg REST catalog.

SeaweedFS (like AWS S3 Tables) takes only lowercase a-z, 0-9 and _ in namespace and table names.
Under the lake's "portable" rule pyiceberg creates every namespace, table and changelog of the
names the drain and quoting tests use, and the catalog's own listing reads back to the source
names; under "preserve" the same catalog refuses them, which is why the rule exists.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyiceberg.exceptions import BadRequestError

from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog
from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.formats.names import refusal
from airflow_provider_postgres_cdc.testing import S3Server

# (schema, table) of tests/integration/drain/test_names.py and
# tests/integration/replication/test_identifier_quoting.py, and names that differ only in case.
SOURCES = [
    ("My Schema", "v1.2 sales%"),
    ("public", "plain"),
    ("s'; DROP TABLE victims; --", 'x"; DROP TABLE victims; --'),
    ("public", "UPPER"),
    ("Sales", "orders"),
    ("sales", "orders"),
    ("public", "Prix €"),
    ("öffentlich", "_leading"),
    ("public", "2024_sales"),
    ("aws", "t__pgl_changelog"),
]
ROWS = pa.table({"id": pa.array([1, 2], pa.int64()), "v": pa.array(["a", "b"])})


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with S3Server(buckets=["staging"], iceberg_rest=True, table_buckets=["lake"]) as server:
        yield server


def test_portable_names_are_created_and_read_back(s3: S3Server) -> None:
    properties = s3.rest_catalog_properties("lake")
    lake = LakeConfig(properties=properties, namespace_prefix="cdc_", names="portable")
    lake.check_names(SOURCES)  # the pre-staging check passes them all
    catalog = open_catalog(lake)
    for schema, table in SOURCES:
        namespace, name = lake.identifier(schema, table)
        catalog.create_namespace_if_not_exists(namespace)
        catalog.create_table((namespace, name), ROWS.schema).append(ROWS)
        catalog.create_table(lake.changelog_identifier(schema, table), ROWS.schema)

    listed = [ident for (namespace,) in catalog.list_namespaces() for ident in catalog.list_tables(namespace)]
    assert len(listed) == 2 * len(SOURCES)  # "Sales" and "sales" kept apart, each changelog its own
    sources = {lake.source_of(namespace, name) for namespace, name in listed}
    assert sources == {*SOURCES, None}  # None: the changelogs
    for schema, table in SOURCES:
        read = catalog.load_table(lake.identifier(schema, table)).scan().to_arrow()
        assert read.sort_by("id").equals(ROWS), (schema, table)


def test_the_catalog_refuses_the_same_names_preserved(s3: S3Server) -> None:
    lake = LakeConfig(properties=s3.rest_catalog_properties("lake"))
    catalog = open_catalog(lake)
    refused, predicted = [], []
    for schema, table in SOURCES:
        namespace, name = lake.identifier(schema, table)
        if refusal(namespace, namespace=True) or refusal(name, namespace=False):
            predicted.append((schema, table))
        try:
            catalog.create_namespace_if_not_exists(namespace)
            catalog.create_table((namespace, name), ROWS.schema)
        except BadRequestError:
            refused.append((schema, table))
    assert refused == predicted  # what the portable rule avoids is what this catalog refuses
    assert len(refused) >= 6 and ("public", "plain") not in refused
