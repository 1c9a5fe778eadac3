"""The Iceberg lake's vocabulary, defined once for the Airflow side and the Spark job (docs/LAKE.md).

Standard library only, like ``manifest.py`` and ``lsn.py``: the Spark job ships these modules
(``spark.job_py_files``), so the Airflow side (pyiceberg) and the job (Spark) name tables,
namespaces, tags and snapshot-summary keys by the same rules and read a table's pipeline state
from its snapshot history the same way.

A table's pipeline state lives in the summary of the Iceberg snapshots the pipeline commits,
written atomically with the data: ``pgl.applied-end-lsn`` (every change of the source below it is
in the table), ``pgl.base-lsn`` (the consistent point of the snapshot the table was last loaded
from: staged changes below it are in that load already), and the batch that made the commit.
Maintenance commits (compaction, expiry) carry no such keys and inherit their parent's state.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from airflow_provider_postgres_cdc.errors import LakeConfigError
from airflow_provider_postgres_cdc.formats.layout import encode_name_part
from airflow_provider_postgres_cdc.formats.lsn import Lsn

SPARK_CATALOG_CLASS = "org.apache.iceberg.spark.SparkCatalog"
SPARK_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"

# Snapshot summary keys written by every pipeline commit (data tables and changelogs).
SLOT = "pgl.slot"
KIND = "pgl.kind"
BATCH_ID = "pgl.batch-id"
START_LSN = "pgl.start-lsn"
END_LSN = "pgl.end-lsn"
BASE_LSN = "pgl.base-lsn"
APPLIED_END_LSN = "pgl.applied-end-lsn"
# The source columns (name, type OID, typmod) of the relation version the commit applied last
# (schema_changes.encode_columns): the next batch's schema changes are classified against it.
SOURCE_COLUMNS = "pgl.source-columns"
# What a commit applied, for Asset events, metrics and the Postgres CDC view: the batch's changes by
# kind (batches only: a load's rows are Iceberg's added-records), when the job began the table's
# step (epoch ms; the snapshot's own timestamp ends it) and the commit time of the batch's newest
# transaction.
INSERTED = "pgl.inserted"
UPDATED = "pgl.updated"
DELETED = "pgl.deleted"
TRUNCATED = "pgl.truncated"
STARTED_MS = "pgl.started-ms"
NEWEST_COMMIT_TIME = "pgl.newest-commit-time"
CHANGE_KEYS = {"I": INSERTED, "U": UPDATED, "D": DELETED, "T": TRUNCATED}
"""Staged operation code (FORMATS.md ``_pgl_op``) -> the summary key counting it."""
# Table property naming the slot whose pipeline owns the table (the tables a cut is taken over).
OWNER_PROPERTY = "pgl.slot"
CHANGELOG_SUFFIX = "__pgl_changelog"
TAG_PREFIX = "pgl_"

# Row-level write mode of the lake tables the apply job creates (docs/LAKE.md).
WriteMode = Literal["merge-on-read", "copy-on-write"]
WRITE_MODES: tuple[WriteMode, ...] = get_args(WriteMode)
# Steps of the maintenance job, each of which may be skipped.
MaintenanceStep = Literal["rewrite", "tags", "expire", "orphans"]
MAINTENANCE_STEPS: tuple[MaintenanceStep, ...] = get_args(MaintenanceStep)
# The keys of a lake's settings (a postgres_cdc_lake connection's extras, a lake JSON file).
LAKE_SETTINGS = ("catalog", "properties", "namespace_prefix")


@dataclass(frozen=True, slots=True)
class LakeConfig:
    """An Iceberg catalog as Spark names it, plus where the pipeline's tables go in it.

    ``properties`` are the catalog's Spark properties without the ``spark.sql.catalog.<name>.``
    prefix (``type``, ``uri``, ``warehouse``, ``jdbc.user``, ``io-impl``, ...), the same keys
    Iceberg's own documentation lists; pyiceberg reads the same catalog from them. A source
    table ``schema.table`` becomes ``<catalog>.<namespace_prefix><schema>.<table>``.
    """

    catalog: str = "lake"
    properties: Mapping[str, str] = field(default_factory=dict)
    namespace_prefix: str = ""

    def __post_init__(self) -> None:
        if not self.catalog or not self.catalog.replace("_", "").isalnum():
            raise LakeConfigError(
                f"catalog name {self.catalog!r} must be letters, digits and underscores (Spark's "
                "spark.sql.catalog.<name> key), e.g. 'lake'"
            )

    @property
    def catalog_type(self) -> str:
        return str(self.properties.get("type", "")).lower()

    def spark_conf(self) -> dict[str, str]:
        """The Spark properties that register the catalog (``--conf`` of spark-submit).

        The catalog's table cache is off: a job reads a table's state fresh, since another job
        (a re-snapshot load, a retry) may have committed since. A JDBC catalog keeps Iceberg's
        V1 schema, the one pyiceberg's SQL catalog shares.
        """
        prefix = f"spark.sql.catalog.{self.catalog}"
        conf = {
            "spark.sql.extensions": SPARK_EXTENSIONS,
            prefix: SPARK_CATALOG_CLASS,
            f"{prefix}.cache-enabled": "false",
        }
        if self.catalog_type == "jdbc":
            conf[f"{prefix}.jdbc.schema-version"] = "V1"
        properties = dict(self.properties)
        # pyiceberg's name of the region is s3.region; Iceberg's S3FileIO reads client.region.
        if "s3.region" in properties:
            properties.setdefault("client.region", properties["s3.region"])
        conf.update({f"{prefix}.{key}": str(value) for key, value in properties.items()})
        return conf

    def namespace(self, schema: str) -> str:
        """The Iceberg namespace of a source schema: one level, ``.`` and ``%`` percent-encoded.

        Catalogs store a multi-level namespace joined by dots, so a dot inside one level would
        read back as two levels; the encoding is the staging directory rule (FORMATS.md).
        """
        return encode_name_part(self.namespace_prefix + schema)

    def identifier(self, schema: str, table: str) -> tuple[str, str]:
        """(namespace, table name) of a source table's lake table."""
        return self.namespace(schema), table

    def changelog_identifier(self, schema: str, table: str) -> tuple[str, str]:
        """(namespace, table name) of a source table's changelog table."""
        return self.namespace(schema), table + CHANGELOG_SUFFIX

    def to_json(self) -> str:
        return json.dumps(
            {
                "catalog": self.catalog,
                "properties": dict(self.properties),
                "namespace_prefix": self.namespace_prefix,
            }
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> LakeConfig:
        """From ``{"catalog", "properties", "namespace_prefix"}`` (a connection's extras, a JSON file)."""
        unknown = set(data) - set(LAKE_SETTINGS)
        if unknown:
            raise LakeConfigError(
                f"unknown lake setting(s) {sorted(unknown)}: expected 'catalog', 'properties' "
                "(the catalog's Spark properties) and 'namespace_prefix'"
            )
        properties = data.get("properties") or {}
        if not isinstance(properties, Mapping):
            raise LakeConfigError("lake 'properties' must be an object of catalog properties")
        return cls(
            catalog=str(data.get("catalog") or "lake"),
            properties={str(k): str(v) for k, v in properties.items()},
            namespace_prefix=str(data.get("namespace_prefix") or ""),
        )

    @classmethod
    def from_json(cls, text: str) -> LakeConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LakeConfigError(f"lake configuration is not valid JSON: {exc}") from exc
        if not isinstance(data, Mapping):
            raise LakeConfigError("lake configuration must be a JSON object")
        return cls.from_mapping(data)


# Iceberg's Spark runtime artifacts: one per Spark line and Scala version (docs/LAKE.md, "Versions").
ICEBERG_RUNTIME_ARTIFACT = "iceberg-spark-runtime-{spark}_{scala}"
_RUNTIME_IN_PATH = re.compile(r"iceberg-spark-runtime-(\d+\.\d+)_(\d+\.\d+)")


def iceberg_runtime_problem(
    spark_version: str, scala_version: str, runtime_location: str | None
) -> str | None:
    """What is wrong with the Iceberg runtime a Spark job found, or None when nothing is.

    ``runtime_location`` is where the JVM loaded Iceberg's ``SparkCatalog`` from (None: not found).
    A runtime is built for one Spark line (``3.5``) and Scala version (``2.12``); its jar is named
    so, whether it came from ``--jars`` or ``--packages``. A location of another name is trusted.
    """
    line = ".".join(spark_version.split(".")[:2])
    scala = ".".join(scala_version.split(".")[:2])
    wanted = ICEBERG_RUNTIME_ARTIFACT.format(spark=line, scala=scala)
    if runtime_location is None:
        return (
            f"Iceberg's Spark runtime is not on the job's classpath: pass "
            f"packages='org.apache.iceberg:{wanted}:<version>' (or its jar in jars) to the operator, "
            "or configure it in the cluster's spark-defaults.conf"
        )
    found = _RUNTIME_IN_PATH.search(runtime_location)
    if found is not None and (found[1], found[2]) != (line, scala):
        return (
            f"the job runs Spark {spark_version} (Scala {scala_version}) with Iceberg's runtime for Spark "
            f"{found[1]} (Scala {found[2]}) from {runtime_location}: pass "
            f"packages='org.apache.iceberg:{wanted}:<version>' instead"
        )
    return None


def tag_name(end_lsn: Lsn) -> str:
    """The tag of the consistent cut at a batch's end LSN: ``pgl_<LSN as 16 hex digits>``."""
    return f"{TAG_PREFIX}{int(end_lsn):016X}"


def tag_lsn(name: str) -> Lsn | None:
    """The LSN of a cut tag, or None for any other tag."""
    digits = name[len(TAG_PREFIX) :] if name.startswith(TAG_PREFIX) else ""
    if len(digits) != 16:
        return None
    try:
        return Lsn(int(digits, 16))
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class TableState:
    """What the pipeline has put into one lake table, read from its newest pipeline snapshot."""

    snapshot_id: int
    slot: str
    kind: str
    batch_id: str
    base_lsn: Lsn
    applied_end_lsn: Lsn
    source_columns: str | None = None


def commit_summary(
    *, slot: str, kind: str, batch_id: str, start_lsn: Lsn, end_lsn: Lsn, base_lsn: Lsn, applied_end_lsn: Lsn
) -> dict[str, str]:
    """The summary properties one pipeline commit writes (LSNs as PostgreSQL text)."""
    return {
        SLOT: slot,
        KIND: kind,
        BATCH_ID: batch_id,
        START_LSN: str(start_lsn),
        END_LSN: str(end_lsn),
        BASE_LSN: str(base_lsn),
        APPLIED_END_LSN: str(applied_end_lsn),
    }


def applied_summary(
    counts: Mapping[str, int] | None, started_ms: int, newest_commit_time: str | None
) -> dict[str, str]:
    """The summary properties saying what a commit applied: ``counts`` by staged operation code
    (``None`` for a snapshot load, whose rows Iceberg's own ``added-records`` counts)."""
    summary = {} if counts is None else {key: str(int(counts.get(op, 0))) for op, key in CHANGE_KEYS.items()}
    summary[STARTED_MS] = str(int(started_ms))
    if newest_commit_time:
        summary[NEWEST_COMMIT_TIME] = newest_commit_time
    return summary


def summary_int(summary: Mapping[str, str], key: str) -> int | None:
    """An integer summary property, None when absent or not a number (older commits lack the new keys)."""
    try:
        return int(summary[key])
    except (KeyError, ValueError):
        return None


def is_pipeline_commit(summary: Mapping[str, str]) -> bool:
    return APPLIED_END_LSN in summary


def state_of(history: Iterable[tuple[int, Mapping[str, str]]]) -> TableState | None:
    """The table's state from its branch history, newest snapshot first: the newest pipeline commit."""
    for snapshot_id, summary in history:
        if is_pipeline_commit(summary):
            return TableState(
                snapshot_id=snapshot_id,
                slot=summary.get(SLOT, ""),
                kind=summary.get(KIND, ""),
                batch_id=summary.get(BATCH_ID, ""),
                base_lsn=Lsn.parse(summary.get(BASE_LSN, "0/0")),
                applied_end_lsn=Lsn.parse(summary[APPLIED_END_LSN]),
                source_columns=summary.get(SOURCE_COLUMNS),
            )
    return None


def snapshot_at(history: Iterable[tuple[int, Mapping[str, str]]], lsn: Lsn) -> int | None:
    """The newest snapshot (history newest first) holding the table exactly as of source ``lsn``.

    A snapshot's applied end is its own or, for a maintenance commit, that of its nearest pipeline
    ancestor; it never decreases along the history, and every change below a batch's end is
    applied by that batch or an earlier one, so the newest snapshot whose applied end is at or
    below ``lsn`` is the table at ``lsn``. None when the table had no pipeline commit by then.
    """
    pending: list[int] = []  # newer maintenance snapshots, waiting for their pipeline ancestor
    for snapshot_id, summary in history:
        pending.append(snapshot_id)
        if is_pipeline_commit(summary):
            if Lsn.parse(summary[APPLIED_END_LSN]) <= lsn:
                return pending[0]
            pending.clear()
    return None


def batch_committed(history: Iterable[tuple[int, Mapping[str, str]]], slot: str, batch_id: str) -> bool:
    """Whether a commit of this slot's batch is in the history (the changelog's exactly-once check)."""
    return any(summary.get(SLOT) == slot and summary.get(BATCH_ID) == batch_id for _, summary in history)


def local_lake(root: str, catalog: str = "lake") -> LakeConfig:
    """A lake needing no server: Iceberg's JDBC catalog in ``<root>/catalog.db`` (SQLite), data in
    ``<root>/warehouse``; what the demo and the tests use (Spark needs the sqlite-jdbc jar)."""
    return LakeConfig(
        catalog=catalog,
        properties={
            "type": "jdbc",
            "uri": f"jdbc:sqlite:{root}/catalog.db",
            "warehouse": f"{root}/warehouse",
        },
    )
