"""Pipeline tables made with pyiceberg, as the apply job makes them, for tests and benchmarks that
need a lake without running Spark; and a SeaweedFS REST catalog to hold them.

The job marks a table with the ``pgl.slot`` property and registers it in the slot's index
(``formats/lake_index.py``); readers find a table only through both, so a table made here gets both.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from unittest import mock

import pyarrow as pa

from airflow_provider_postgres_cdc.engine.lake_catalog import open_catalog
from airflow_provider_postgres_cdc.errors import LakeCatalogError
from airflow_provider_postgres_cdc.formats import lake_index
from airflow_provider_postgres_cdc.formats.lake import OWNER_PROPERTY, LakeConfig
from airflow_provider_postgres_cdc.testing.s3 import REGION, S3Server

INDEX_SCHEMA = pa.schema([(name, pa.string()) for name in lake_index.COLUMNS])


def register(catalog: Any, config: LakeConfig, slot: str, identifiers: Iterable[tuple[str, str]]) -> None:
    """Append index entries for ``identifiers`` (creating the slot's index first when it is new)."""
    index_identifier = lake_index.index_identifier(config, slot)
    catalog.create_namespace_if_not_exists(index_identifier[0])
    index = catalog.create_table_if_not_exists(
        index_identifier, INDEX_SCHEMA, properties={"comment": lake_index.index_comment(slot)}
    )
    rows = [dict(zip(lake_index.COLUMNS, identifier, strict=True)) for identifier in identifiers]
    index.append(pa.Table.from_pylist(rows, INDEX_SCHEMA))


def create_owned_table(
    catalog: Any, config: LakeConfig, slot: str, identifier: tuple[str, str], schema: Any
) -> Any:
    """A new table of ``slot``'s pipeline: owner property set, registered in the slot's index."""
    table = catalog.create_table(identifier, schema, properties={OWNER_PROPERTY: slot})
    register(catalog, config, slot, [identifier])
    return table


# SeaweedFS's Iceberg REST catalog serves S3 Tables buckets, each a catalog of its own; ``weed mini``
# creates those named in S3_TABLE_BUCKET at start (its -tableBucket flag's fallback), so the test
# kit's S3Server needs no flag for them.
TABLE_BUCKET = "lake"


@contextlib.contextmanager
def rest_catalog_server(table_buckets: Sequence[str] = (TABLE_BUCKET,)) -> Iterator[S3Server]:
    """SeaweedFS with its Iceberg REST catalog serving ``table_buckets``, once each answers."""
    with mock.patch.dict(os.environ, {"S3_TABLE_BUCKET": ",".join(table_buckets)}):
        server = S3Server(buckets=["staging"], iceberg_rest=True)
        server.start()
    try:
        deadline = time.monotonic() + 60
        for bucket in table_buckets:
            while True:
                try:
                    open_catalog(rest_lake(server, "probe", bucket=bucket))
                    break
                except LakeCatalogError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        yield server
    finally:
        server.stop()


def rest_lake(
    server: S3Server, catalog: str, namespace_prefix: str = "", bucket: str = TABLE_BUCKET
) -> LakeConfig:
    """A REST catalog (table bucket) of ``server`` as a lake, for Spark (S3FileIO, iceberg-aws-bundle)
    and pyiceberg."""
    keys = {"s3.access-key-id": server.access_key, "s3.secret-access-key": server.secret_key}
    return LakeConfig(
        catalog=catalog,
        properties={
            "type": "rest",
            "uri": server.iceberg_rest_url,
            "warehouse": f"s3://{bucket}/",
            "credential": f"{server.access_key}:{server.secret_key}",
            "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            "s3.endpoint": server.endpoint_url,
            "s3.path-style-access": "true",
            "client.region": REGION,
            "s3.region": REGION,
            **keys,
        },
        namespace_prefix=namespace_prefix,
    )
