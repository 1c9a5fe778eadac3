"""The ack's catalog work in a shared catalog: a pipeline alone, and among 1,000 foreign tables.

    .venv/bin/python benchmarks/ack_catalog.py [--catalog rest|sqlite] [--tables 5] [--foreign 1000] \
        [--repeat 15]

The ack reads the lake twice before it moves the slot: ``unapplied_tables`` (every table the
batch's manifest names holds the batch) and ``cut_at`` (every table of the pipeline at the batch's
end, for the cut's Asset event), each opening the catalog itself. That pair is timed here, on two
catalogs holding the same pipeline: one with nothing else in it, one where other teams keep
``--foreign`` tables, spread over 50 namespaces plus the pipeline's own, a tenth of them marked
as other pipelines' (``pgl.slot``). Both catalogs are served by one SeaweedFS server, whose Iceberg
REST catalog serves each table bucket as a catalog of its own (``--catalog sqlite``: two Iceberg
JDBC catalogs in SQLite files). The timings alternate between the two, ``--repeat`` times each,
so drift hits both alike; the ratio of the medians is printed (target: at most 1.2x).

The pipeline's tables are made with pyiceberg as the apply job makes them (``tests/pipeline_lake.py``):
the owner property, an entry in the slot's index, a commit whose summary records the batch, and the
batch's cut tag.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from airflow_provider_postgres_cdc.engine.lake_catalog import cut_at, open_catalog, unapplied_tables
from airflow_provider_postgres_cdc.formats import lake
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, local_lake
from airflow_provider_postgres_cdc.formats.layout import change_batch_id
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import ColumnManifest, Manifest, TableManifest
from airflow_provider_postgres_cdc.testing import S3Server
from tests.pipeline_lake import create_owned_table

SLOT = "shop_cdc"
START, END = Lsn(0x1_0000_0000), Lsn(0x1_0000_1000)
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])
FOREIGN_NAMESPACES = 50
QUIET, BUSY = "quiet", "busy"


def build_pipeline(config: LakeConfig, tables: int) -> Manifest:
    """``tables`` pipeline tables holding the batch [START, END) and tagged at its end; its manifest."""
    catalog = open_catalog(config)
    catalog.create_namespace_if_not_exists(config.namespace("public"))
    batch_id = change_batch_id(START)
    summary = lake.commit_summary(
        slot=SLOT, kind="batch", batch_id=batch_id, start_lsn=START, end_lsn=END, base_lsn=Lsn(0),
        applied_end_lsn=END,
    )  # fmt: skip
    entries = []
    for i in range(tables):
        name = f"table_{i}"
        table = create_owned_table(catalog, config, SLOT, config.identifier("public", name), SCHEMA)
        table.append(pa.table({"id": [1, 2], "name": ["a", "b"]}, SCHEMA), snapshot_properties=summary)
        table.manage_snapshots().create_tag(table.current_snapshot().snapshot_id, lake.tag_name(END)).commit()
        entries.append(
            TableManifest(
                schema="public", table=name,
                columns=(ColumnManifest("id", "int8", 20, -1, "int64", key=True),
                         ColumnManifest("name", "text", 25, -1, "string")),
                key_columns=("id",), replica_identity="d", rows=1, files=(f"public.{name}/part-0.parquet",),
            )
        )  # fmt: skip
    return Manifest("batch", SLOT, "shop", batch_id, START, END, tuple(entries))


def add_foreign_tables(config: LakeConfig, count: int) -> None:
    """Other teams' tables: most in namespaces of their own, some beside the pipeline's; every tenth
    belongs to another pipeline (an owner property naming another slot)."""
    catalog = open_catalog(config)
    namespaces = [config.namespace(f"team_{n}") for n in range(FOREIGN_NAMESPACES)]
    namespaces.append(config.namespace("public"))
    for namespace in namespaces:
        catalog.create_namespace_if_not_exists(namespace)
    for i in range(count):
        properties = {lake.OWNER_PROPERTY: f"other_{i % 7}"} if i % 10 == 0 else {}
        catalog.create_table((namespaces[i % len(namespaces)], f"foreign_{i}"), SCHEMA, properties=properties)


def ack_reads(config: LakeConfig, manifest: Manifest) -> float:
    """Seconds for what the ack reads of the lake before it moves the slot."""
    started = time.perf_counter()
    missing = unapplied_tables(config, manifest)
    cut = cut_at(config, manifest.slot, manifest.end_lsn)
    seconds = time.perf_counter() - started
    assert missing == [] and len(cut.snapshots) == len(manifest.tables), (missing, cut)
    return seconds


@contextlib.contextmanager
def lakes(kind: str) -> Iterator[tuple[str, dict[str, LakeConfig]]]:
    """Two empty catalogs of ``kind`` (quiet, busy), and a description of them."""
    if kind == "rest":
        with S3Server(buckets=["staging"], table_buckets=[QUIET, BUSY]) as server:
            yield (
                "SeaweedFS Iceberg REST catalog (two table buckets of one server)",
                {name: LakeConfig(properties=server.rest_catalog_properties(name)) for name in (QUIET, BUSY)},
            )
        return
    with tempfile.TemporaryDirectory(prefix="ack-catalog-") as root:
        configs = {}
        for name in (QUIET, BUSY):
            (Path(root) / name / "warehouse").mkdir(parents=True)
            configs[name] = local_lake(str(Path(root) / name))
        yield "Iceberg JDBC catalogs in SQLite files", configs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--catalog", choices=("rest", "sqlite"), default="rest")
    parser.add_argument("--tables", type=int, default=5, help="tables of the pipeline")
    parser.add_argument("--foreign", type=int, default=1000, help="foreign tables in the busy catalog")
    parser.add_argument("--repeat", type=int, default=15, help="timings of each catalog")
    args = parser.parse_args()
    with lakes(args.catalog) as (description, configs):
        print(f"{description}; a pipeline of {args.tables} tables")
        manifests = {name: build_pipeline(config, args.tables) for name, config in configs.items()}
        started = time.perf_counter()
        add_foreign_tables(configs[BUSY], args.foreign)
        print(f"{args.foreign} foreign tables created in {time.perf_counter() - started:.1f} s")
        for name in (QUIET, BUSY):  # warm-up: imports, connection pools, first token
            ack_reads(configs[name], manifests[name])
        timings: dict[str, list[float]] = {QUIET: [], BUSY: []}
        for _ in range(args.repeat):
            for name in (QUIET, BUSY):
                timings[name].append(ack_reads(configs[name], manifests[name]))
    medians = {name: statistics.median(values) for name, values in timings.items()}
    for name, count in ((QUIET, 0), (BUSY, args.foreign)):
        values = timings[name]
        print(
            f"foreign tables {count:6d}: median {medians[name] * 1000:7.1f} ms "
            f"(min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f}, {len(values)} runs)"
        )
    print(f"ratio (with / without foreign tables): {medians[BUSY] / medians[QUIET]:.2f}x (target <= 1.2x)")


if __name__ == "__main__":
    main()
