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

from airflow_provider_postgres_cdc.errors import LakeConfigError, LakeNameError
from airflow_provider_postgres_cdc.formats import names as portable
from airflow_provider_postgres_cdc.formats.layout import decode_name_part, encode_name_part
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
# Changelog commits: the commit LSN from which this commit logged its table's changes, up to its
# applied end (changes below it were logged before, or are in the table's snapshot; window.py).
LOGGED_FROM_LSN = "pgl.logged-from-lsn"
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
HISTORY_SUFFIX = "__pgl_history"  # a history table's (formats/history.py)
COMPANION_SUFFIXES = (CHANGELOG_SUFFIX, HISTORY_SUFFIX)
"""What a data table's name takes to name the tables beside it that keep its changes."""
TAG_PREFIX = "pgl_"

# How source schema and table names become lake names (docs/LAKE.md, "Names"): "preserve" keeps
# them (a namespace's ".", "%" and "/" percent-encoded), "portable" maps them to names every catalog
# takes (formats/names.py).
NameRule = Literal["preserve", "portable"]
NAME_RULES: tuple[NameRule, ...] = get_args(NameRule)
NAMES_CONF = "spark.postgres_cdc.lakeNames"
"""The Spark property that tells the jobs the lake's name rule (set by :meth:`LakeConfig.spark_conf`)."""
_UNQUOTED = re.compile(r"[a-z_][a-z0-9_$]*")

# Row-level write mode of the lake tables the apply job creates (docs/LAKE.md).
WriteMode = Literal["merge-on-read", "copy-on-write"]
WRITE_MODES: tuple[WriteMode, ...] = get_args(WriteMode)
# Steps of the maintenance job, each of which may be skipped.
MaintenanceStep = Literal["rewrite", "tags", "expire", "orphans"]
MAINTENANCE_STEPS: tuple[MaintenanceStep, ...] = get_args(MaintenanceStep)
# The keys of a lake's settings (a postgres_cdc_lake connection's extras, a lake JSON file).
LAKE_SETTINGS = ("catalog", "properties", "namespace_prefix", "names")


def companions_of(identifier: tuple[str, str]) -> list[tuple[str, str]]:
    """The (namespace, name) of the changelog and history tables beside the lake table ``identifier``."""
    namespace, name = identifier
    return [(namespace, name + suffix) for suffix in COMPANION_SUFFIXES]


@dataclass(frozen=True, slots=True)
class LakeConfig:
    """An Iceberg catalog as Spark names it, plus where the pipeline's tables go in it.

    ``properties`` are the catalog's Spark properties without the ``spark.sql.catalog.<name>.``
    prefix (``type``, ``uri``, ``warehouse``, ``jdbc.user``, ``io-impl``, ...), the same keys
    Iceberg's own documentation lists; pyiceberg reads the same catalog from them. A source
    table ``schema.table`` becomes ``<catalog>.<namespace_prefix><schema>.<table>``, its names
    written by the ``names`` rule: :meth:`identifier`, :meth:`changelog_identifier` and their
    inverse :meth:`source_of` are the only places where lake names are made or read.
    """

    catalog: str = "lake"
    properties: Mapping[str, str] = field(default_factory=dict)
    namespace_prefix: str = ""
    names: NameRule = "preserve"

    def __post_init__(self) -> None:
        if not self.catalog or not self.catalog.replace("_", "").isalnum():
            raise LakeConfigError(
                f"catalog name {self.catalog!r} must be letters, digits and underscores (Spark's "
                "spark.sql.catalog.<name> key), e.g. 'lake'"
            )
        if self.names not in NAME_RULES:
            raise LakeConfigError(f"lake 'names' must be one of {list(NAME_RULES)}, not {self.names!r}")
        if self.names == "portable" and not portable.is_portable_prefix(self.namespace_prefix):
            raise LakeConfigError(
                f"namespace_prefix {self.namespace_prefix!r} is not portable: with names 'portable' it is "
                "written as it is, so it must be a-z, 0-9 and _, starting with a letter or digit ('cdc_')"
            )

    @property
    def catalog_type(self) -> str:
        return str(self.properties.get("type", "")).lower()

    def spark_conf(self) -> dict[str, str]:
        """The Spark properties that register the catalog (``--conf`` of spark-submit).

        The catalog's table cache is off: a job reads a table's state fresh, since another job
        (a re-snapshot load, a retry) may have committed since. A JDBC catalog gets
        :func:`jdbc_defaults` unless its properties say otherwise. A name rule other than
        "preserve" travels as :data:`NAMES_CONF`, which the jobs read (``spark/job.py``).
        """
        prefix = f"spark.sql.catalog.{self.catalog}"
        conf = {
            "spark.sql.extensions": SPARK_EXTENSIONS,
            prefix: SPARK_CATALOG_CLASS,
            f"{prefix}.cache-enabled": "false",
        }
        if self.catalog_type == "jdbc":
            defaults = jdbc_defaults(str(self.properties.get("uri", "")))
            conf.update({f"{prefix}.{key}": value for key, value in defaults.items()})
        properties = dict(self.properties)
        # pyiceberg's name of the region is s3.region; Iceberg's S3FileIO reads client.region.
        if "s3.region" in properties:
            properties.setdefault("client.region", properties["s3.region"])
        conf.update({f"{prefix}.{key}": str(value) for key, value in properties.items()})
        if self.names != "preserve":
            conf[NAMES_CONF] = self.names
        return conf

    def namespace(self, schema: str) -> str:
        """The Iceberg namespace of a source schema: one level, whatever the schema holds.

        Catalogs store a multi-level namespace joined by dots, so a dot inside one level would
        read back as two levels: "preserve" percent-encodes ``.``, ``%`` and ``/`` of prefix and
        schema (the staging directory rule, FORMATS.md); "portable" writes the prefix as it is
        and the schema by the portable rule, which has no dots.
        """
        if self.names == "portable":
            return self.namespace_prefix + portable.portable_name(schema)
        return encode_name_part(self.namespace_prefix + schema)

    def table_name(self, table: str) -> str:
        """The lake name of a source table inside its namespace."""
        return portable.portable_name(table) if self.names == "portable" else table

    def identifier(self, schema: str, table: str) -> tuple[str, str]:
        """(namespace, table name) of a source table's lake table."""
        return self.namespace(schema), self.table_name(table)

    def changelog_identifier(self, schema: str, table: str) -> tuple[str, str]:
        """(namespace, table name) of a source table's changelog table."""
        return self.namespace(schema), self.table_name(table) + CHANGELOG_SUFFIX

    def history_identifier(self, schema: str, table: str) -> tuple[str, str]:
        """(namespace, table name) of a source table's history table (``formats/history.py``)."""
        return self.namespace(schema), self.table_name(table) + HISTORY_SUFFIX

    def companions(self, schema: str, table: str) -> dict[str, tuple[str, str]]:
        """A source table's lake tables by kind: the table, its changelog and its history table."""
        return {
            "table": self.identifier(schema, table),
            "changelog table": self.changelog_identifier(schema, table),
            "history table": self.history_identifier(schema, table),
        }

    def source_of(self, namespace: str, name: str) -> tuple[str, str] | None:
        """The source (schema, table) whose lake table is ``namespace.name`` (:meth:`identifier` inverted).

        None for a changelog or history table and for any name this lake's rule does not make (another
        prefix's namespace, a table someone else created).
        """
        prefixed = namespace if self.names == "portable" else decode_name_part(namespace)
        if name.endswith(COMPANION_SUFFIXES) or not prefixed.startswith(self.namespace_prefix):
            return None
        schema, table = prefixed[len(self.namespace_prefix) :], name
        if self.names == "portable":
            source_schema, source_table = portable.source_name(schema), portable.source_name(table)
            if source_schema is None or source_table is None:
                return None
            schema, table = source_schema, source_table
        if self.identifier(schema, table) != (namespace, name):
            return None  # not a name this rule makes (e.g. a namespace percent-encoded another way)
        return schema, table

    def check_names(self, tables: Iterable[tuple[str, str]]) -> None:
        """Refuse, naming the table, any source table whose lake names this lake cannot hold.

        Run before anything is staged (the drain, the snapshot) and by the apply job, without
        contacting the catalog. With "preserve", two source tables must not share a lake table
        (table ``t__pgl_changelog`` would be ``t``'s changelog); a catalog that refuses some names
        is not known here, so they fail at its CREATE. With "portable", every name must be one
        SeaweedFS and S3 Tables take (:func:`formats.names.refusal`: its length, and a prefix
        that makes a namespace start with ``aws``).
        """
        owners: dict[tuple[str, str], tuple[str, str]] = {}
        for schema, table in tables:
            companions = self.companions(schema, table)
            if self.names == "portable":  # injective, its companions apart: only the length can fail
                self._check_portable(schema, table, companions)
                continue
            for identifier in companions.values():
                owner = owners.setdefault(identifier, (schema, table))
                if owner != (schema, table):
                    raise LakeNameError(self._clash(owner, (schema, table), identifier))

    def _check_portable(self, schema: str, table: str, companions: Mapping[str, tuple[str, str]]) -> None:
        parts = [("namespace", companions["table"][0])]
        parts += [(kind, identifier[1]) for kind, identifier in companions.items()]
        for kind, name in parts:
            why = portable.refusal(name, namespace=kind == "namespace")
            if why is not None:
                shown = name if len(name) <= 80 else f"{name[:60]}…({len(name)} characters)"
                raise LakeNameError(
                    f"source table {_shown((schema, table))} would get the lake {kind} name {shown!r} "
                    f"under the lake's 'portable' name rule, and {why}. Rename the source "
                    f"{'schema' if kind == 'namespace' else 'table'} (ALTER … RENAME TO), leave the table "
                    "out of the publication, or change the lake connection's namespace_prefix . The slot "
                    "has not moved"
                )

    def _clash(self, first: tuple[str, str], second: tuple[str, str], identifier: tuple[str, str]) -> str:
        """Why two source tables cannot both be in a "preserve" lake."""
        which = {
            source: next(k for k, name in self.companions(*source).items() if name == identifier).split()[0]
            for source in (first, second)
        }
        return (
            f"source tables {_shown(first)} and {_shown(second)} would share the lake table "
            f"{'.'.join(identifier)} under the lake's 'preserve' name rule (the {which[first]} of the "
            f"first, the {which[second]} of the second): rename one of them, or set names 'portable' in "
            "the lake connection's extras, whose names never clash (on a lake that has tables already, "
            'read docs/LAKE.md "Names" first: some names change). The slot has not moved'
        )

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "catalog": self.catalog,
            "properties": dict(self.properties),
            "namespace_prefix": self.namespace_prefix,
        }
        if self.names != "preserve":
            data["names"] = self.names
        return json.dumps(data)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> LakeConfig:
        """From ``{"catalog", "properties", "namespace_prefix", "names"}`` (connection extras, JSON)."""
        unknown = set(data) - set(LAKE_SETTINGS)
        if unknown:
            raise LakeConfigError(
                f"unknown lake setting(s) {sorted(unknown)}: expected 'catalog', 'properties' "
                "(the catalog's Spark properties), 'namespace_prefix' and 'names' "
                f"({' or '.join(repr(rule) for rule in NAME_RULES)})"
            )
        properties = data.get("properties") or {}
        if not isinstance(properties, Mapping):
            raise LakeConfigError("lake 'properties' must be an object of catalog properties")
        return cls(
            catalog=str(data.get("catalog") or "lake"),
            properties={str(k): str(v) for k, v in properties.items()},
            namespace_prefix=str(data.get("namespace_prefix") or ""),
            names=data.get("names") or "preserve",
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


SQLITE_JDBC = "jdbc:sqlite:"
SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a writer of a SQLite catalog waits for another writer's lock before it fails."""
BUSY_TIMEOUT = "jdbc.busy_timeout"
INIT_CATALOG_TABLES = "jdbc.init-catalog-tables"


def jdbc_defaults(uri: str) -> dict[str, str]:
    """The properties a JDBC catalog at ``uri`` gets unless the lake sets them itself.

    Iceberg's V1 schema, the one pyiceberg's SQL catalog shares. SQLite lets one connection write
    at a time, and several write one lake at once (a re-snapshot load beside the apply, a test's
    session beside a spark-submit job), so a SQLite catalog also gets:

    * ``busy_timeout``: a writer waits for the other's lock instead of failing with
      ``SQLITE_BUSY`` (Iceberg hands ``jdbc.*`` properties to the driver, and sqlite-jdbc reads
      this one; pyiceberg's SQLAlchemy URL gets the same wait, ``engine/lake_catalog.py``);
    * ``init-catalog-tables=false``: when Iceberg's JDBC catalog opens with its tables already
      there, it leaves its "does the table exist" query open, and that query's read lock stays
      for as long as the catalog lives: no other connection to the file could commit, whatever
      the timeout. The Spark jobs create the tables beforehand with a catalog they close
      (``spark/sqlite_catalog.py``) and open theirs without that check.
    """
    defaults = {"jdbc.schema-version": "V1"}
    if uri.startswith(SQLITE_JDBC):
        defaults[BUSY_TIMEOUT] = str(SQLITE_BUSY_TIMEOUT_MS)
        defaults[INIT_CATALOG_TABLES] = "false"
    return defaults


# Iceberg's Spark runtime artifacts: one per Spark line and Scala version (docs/LAKE.md, "Versions").
ICEBERG_RUNTIME_ARTIFACT = "iceberg-spark-runtime-{spark}_{scala}"
# The oldest Iceberg runtime that takes a commit's summary keys from the session configuration
# (``spark.sql.iceberg.snapshot-property.<key>``): the only way a Spark Connect client can set them.
SESSION_PROPERTIES_SINCE = (1, 11)
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


def _shown(source: tuple[str, str]) -> str:
    """``schema.table`` as PostgreSQL would print it, each part quoted when it needs quotes."""
    return ".".join(
        part if _UNQUOTED.fullmatch(part) else '"' + part.replace('"', '""') + '"' for part in source
    )


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
