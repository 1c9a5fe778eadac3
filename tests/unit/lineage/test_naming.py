"""Lake table names as OpenLineage's Spark integration gives them, on the cases of its own tests.

The expected pairs are copied from the OpenLineage repository's Java tests
(``client/java/src/test/.../utils/filesystem/FilesystemDatasetUtilsTestFor{S3,Local,GCS,HDFS}.java``
and ``integration/spark/spark3/src/test/.../catalog/IcebergHandlerTest.java``); the hostile-name
cases were measured with Spark 3.5.9's ``Identifier.of(...).toString()``, and every location case
gave the same pair from the released ``openlineage-java`` 1.54.0's ``FilesystemDatasetUtils`` applied
to Hadoop 3.3.4's ``new Path(location).toUri()`` (jshell on those jars and pyspark's).
"""

from __future__ import annotations

import pytest

from airflow_provider_postgres_cdc.formats.lake import LakeConfig
from airflow_provider_postgres_cdc.lineage.naming import (
    DatasetName,
    catalog_symlink,
    lake_dataset_name,
    location_and_name,
    location_name,
    spark_identifier,
)


@pytest.mark.parametrize(
    ("location", "namespace", "name"),
    [
        # FilesystemDatasetUtilsTestForS3.testFromLocation / WithDifferentProtocol
        ("s3://bucket", "s3://bucket", "/"),
        ("s3://bucket/warehouse", "s3://bucket", "warehouse"),
        ("s3://bucket/warehouse/location", "s3://bucket", "warehouse/location"),
        ("s3://bucket/warehouse/location/", "s3://bucket", "warehouse/location"),
        ("s3a://bucket/warehouse/location/", "s3://bucket", "warehouse/location"),
        ("s3n://bucket/warehouse/location/", "s3://bucket", "warehouse/location"),
        # ...TestForGCS
        ("gs://bucket", "gs://bucket", "/"),
        ("gs://bucket/warehouse/location/", "gs://bucket", "warehouse/location"),
        # ...TestForLocal.testFromLocation / UnixPath
        ("", "file", "/"),
        ("/", "file", "/"),
        ("file:/warehouse/location", "file", "/warehouse/location"),
        ("file:/warehouse/location/", "file", "/warehouse/location"),
        ("file:///warehouse/location", "file", "/warehouse/location"),
        ("/warehouse", "file", "/warehouse"),
        ("warehouse/location", "file", "warehouse/location"),
        # ...TestForHDFS.testFromLocation
        ("hdfs://namenode:8020", "hdfs://namenode:8020", "/"),
        ("hdfs://namenode:8020/warehouse", "hdfs://namenode:8020", "/warehouse"),
        ("hdfs://namenode:8020/warehouse/location/", "hdfs://namenode:8020", "/warehouse/location"),
        # Hadoop's Path first: slash runs and dot segments go, and `%` is no escape
        ("hdfs://nn:8020/a///b/", "hdfs://nn:8020", "/a/b"),
        ("file:/a/./b/../c", "file", "/a/c"),
        ("s3a://bucket//lake/Sales%2EEU/v1.2 orders%ü", "s3://bucket", "lake/Sales%2EEU/v1.2 orders%ü"),
        ("/tmp/wh/Sales%2EEU/v1.2 orders%ü", "file", "/tmp/wh/Sales%2EEU/v1.2 orders%ü"),
        # abfs/wasb are written with their TLS scheme
        ("abfs://c@acct.dfs.core.windows.net/t", "abfss://c@acct.dfs.core.windows.net", "t"),
        ("wasb://c@acct.blob.core.windows.net/t/", "wasbs://c@acct.blob.core.windows.net", "t"),
    ],
)
def test_a_location_is_named_as_spark_names_it(location: str, namespace: str, name: str) -> None:
    assert location_name(location) == DatasetName(namespace, name)


@pytest.mark.parametrize(
    ("location", "table", "namespace", "name"),
    [
        # FilesystemDatasetUtilsTestFor{S3,Local,HDFS}.testFromLocationAndName(WithDifferentProtocol)
        ("s3://bucket/warehouse", "default.table", "s3://bucket/warehouse", "default.table"),
        ("s3://bucket/warehouse", "", "s3://bucket/warehouse", "/"),
        (
            "s3a://bucket/warehouse/location",
            "default.table",
            "s3://bucket/warehouse/location",
            "default.table",
        ),
        (
            "s3n://bucket/warehouse/location",
            "default.table",
            "s3://bucket/warehouse/location",
            "default.table",
        ),
        ("", "default.table", "file", "default.table"),
        ("/", "default.table", "file", "default.table"),
        ("/warehouse", "default.table", "file:/warehouse", "default.table"),
        ("file:/warehouse/location/", "default.table", "file:/warehouse/location", "default.table"),
        ("file:///warehouse/location", "default.table", "file:/warehouse/location", "default.table"),
        (
            "hdfs://namenode:8020/warehouse",
            "default.table",
            "hdfs://namenode:8020/warehouse",
            "default.table",
        ),
        ("hdfs://namenode:8020/warehouse", "", "hdfs://namenode:8020/warehouse", "/"),
        # java.net.URI quotes the path of the namespace (space and `%`), not the non-ASCII letter
        ("s3a://b/my wh%x/ü", "t", "s3://b/my%20wh%25x/ü", "t"),
        ("hdfs://nn:8020/my wh%x/ü", "t", "hdfs://nn:8020/my%20wh%25x/ü", "t"),
    ],
)
def test_a_name_within_a_warehouse(location: str, table: str, namespace: str, name: str) -> None:
    assert location_and_name(location, table) == DatasetName(namespace, name)


@pytest.mark.parametrize(
    ("namespace", "table", "identifier"),
    [
        ("database", "table", "database.table"),
        ("Sales%2EEU", "v1.2 orders%ü", "`Sales%2EEU`.`v1.2 orders%ü`"),
        ("a-b", "123", "`a-b`.`123`"),
        ("x`y", "1a", "`x``y`.1a"),
        ("Ab_9", "_", "Ab_9._"),
    ],
)
def test_spark_quotes_identifier_parts_that_need_it(namespace: str, table: str, identifier: str) -> None:
    assert spark_identifier(namespace, table) == identifier


def lake(**properties: str) -> LakeConfig:
    return LakeConfig("lake", properties)


OWN = DatasetName("iceberg://lake", "database.table")  # the Asset converter's name, always last


@pytest.mark.parametrize(
    ("properties", "location", "dataset", "spark_symlink"),
    [
        # IcebergHandlerTest.testGetDatasetIdentifierForHadoop (both rows)
        (
            {"type": "hadoop", "warehouse": "hdfs://namenode:8020/tmp/warehouse"},
            "hdfs://namenode:8020/tmp/warehouse/database/table",
            DatasetName("hdfs://namenode:8020", "/tmp/warehouse/database/table"),
            DatasetName("hdfs://namenode:8020/tmp/warehouse", "database.table"),
        ),
        (
            {"type": "hadoop", "warehouse": "/tmp/warehouse"},
            "file:/tmp/warehouse/database/table",
            DatasetName("file", "/tmp/warehouse/database/table"),
            DatasetName("file:/tmp/warehouse", "database.table"),
        ),
        # ...ForHive
        (
            {"type": "hive", "uri": "thrift://metastore-host:10001", "warehouse": "/tmp/warehouse"},
            "file:/tmp/warehouse/database/table",
            DatasetName("file", "/tmp/warehouse/database/table"),
            DatasetName("hive://metastore-host:10001", "database.table"),
        ),
        # ...ForRestCatalog
        (
            {"type": "rest", "uri": "http://rest-host:8080", "warehouse": "s3a://warehouse-bucket/warehouse"},
            "s3a://warehouse-bucket/warehouse/database/table",
            DatasetName("s3://warehouse-bucket", "warehouse/database/table"),
            DatasetName("http://rest-host:8080", "database.table"),
        ),
        # ...MissingSparkCatalogTable: no table yet, so <warehouse>/<namespace>/<table>
        (
            {"type": "hadoop", "warehouse": "file:/tmp/iceberg"},
            None,
            DatasetName("file", "/tmp/iceberg/database/table"),
            DatasetName("file:/tmp/iceberg", "database.table"),
        ),
        # ...ForGlue: Spark's ARN comes from its own environment, so no Spark symlink here
        (
            {"catalog-impl": "org.apache.iceberg.aws.glue.GlueCatalog", "warehouse": "/tmp/warehouse"},
            "file:/tmp/warehouse/database/table",
            DatasetName("file", "/tmp/warehouse/database/table"),
            None,
        ),
        # a RESTCatalog implementation and Nessie take the catalog URI as configured
        (
            {"catalog-impl": "org.apache.iceberg.rest.RESTCatalog", "uri": "http://127.0.0.1:8181/"},
            "s3://tables/database/table",
            DatasetName("s3://tables", "database/table"),
            DatasetName("http://127.0.0.1:8181/", "database.table"),
        ),
        (
            {"type": "nessie", "uri": "http://nessie:19120/api/v2", "warehouse": "s3://b/w"},
            None,
            DatasetName("s3://b", "w/database/table"),
            DatasetName("http://nessie:19120/api/v2", "database.table"),
        ),
        # a JDBC catalog's uri has no authority: Spark's default (Hive) handler names nothing
        (
            {"type": "jdbc", "uri": "jdbc:postgresql://db:5432/iceberg", "warehouse": "s3a://bucket/lake/"},
            None,
            DatasetName("s3://bucket", "lake/database/table"),
            None,
        ),
    ],
)
def test_lake_tables_are_named_by_location_with_the_catalogs_symlink(
    properties: dict[str, str], location: str | None, dataset: DatasetName, spark_symlink: DatasetName | None
) -> None:
    named = lake_dataset_name(lake(**properties), "database", "table", location)
    assert named is not None
    assert DatasetName(named.namespace, named.name) == dataset
    assert named.symlinks == ((spark_symlink, OWN) if spark_symlink else (OWN,))


def test_a_table_without_location_in_a_catalog_without_warehouse_has_no_name() -> None:
    """IcebergHandlerTest.testGetDatasetIdentifierForRestWithoutLocation: Spark names nothing either."""
    rest = lake(type="rest", uri="http://rest-host:8080")
    assert lake_dataset_name(rest, "database", "table", None) is None
    assert lake_dataset_name(rest, "database", "table", "s3://b/database/table") is not None


def test_hostile_names_are_one_table_everywhere() -> None:
    rest = lake(type="rest", uri="http://127.0.0.1:8181", warehouse="s3://tables/")
    named = lake_dataset_name(rest, "Sales%2EEU", "v1.2 orders%ü", None)
    assert named is not None
    assert (named.namespace, named.name) == ("s3://tables", "Sales%2EEU/v1.2 orders%ü")
    assert named.symlinks == (
        DatasetName("http://127.0.0.1:8181", "`Sales%2EEU`.`v1.2 orders%ü`"),
        DatasetName("iceberg://lake", "Sales%2EEU.v1.2 orders%ü"),
    )


def test_a_catalog_uri_loses_its_credentials_and_nothing_else() -> None:
    secret = {"type": "rest", "uri": "https://client:s3cret@catalog.example:8443/api/catalog?x=1"}
    assert catalog_symlink(secret, "ns", "t") == DatasetName(
        "https://catalog.example:8443/api/catalog?x=1", "ns.t"
    )
    hive = {"type": "hive", "uri": "thrift://user:pw@metastore:9083"}
    assert catalog_symlink(hive, "ns", "t") == DatasetName("hive://metastore:9083", "ns.t")
    verbatim = {"type": "REST", "uri": "HTTP://Catalog:8181/?"}
    assert catalog_symlink(verbatim, "ns", "t") == DatasetName("HTTP://Catalog:8181/?", "ns.t")


def test_a_hive_catalog_without_a_metastore_uri_gets_no_spark_symlink() -> None:
    """Spark would read the metastore URI from its own session's configuration, unknown here."""
    assert catalog_symlink({"type": "hive", "warehouse": "/w"}, "ns", "t") is None
    assert catalog_symlink({"type": "glue", "warehouse": "s3://b/w"}, "ns", "t") is None
