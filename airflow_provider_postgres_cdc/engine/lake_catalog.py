"""The Iceberg lake read from Python with pyiceberg: no Spark, no JVM (the ack, verify, readers).

The catalog is the one Spark writes through, described by the same :class:`LakeConfig`; its Spark
properties are translated to pyiceberg's (a JDBC URI becomes a SQLAlchemy URL: pyiceberg's SQL
catalog shares the tables of Iceberg's JDBC catalog, schema V1, when both use the same catalog
name). REST, Hive and Glue catalogs take their properties as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlparse

import pyarrow as pa

from airflow_provider_postgres_cdc.engine.object_store import bucket_problem
from airflow_provider_postgres_cdc.errors import LakeCatalogError, LakeStorageError
from airflow_provider_postgres_cdc.formats import lake, lake_index
from airflow_provider_postgres_cdc.formats.lake import LakeConfig, TableState
from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.formats.manifest import Manifest

# Spark catalog `type` -> pyiceberg catalog type; JDBC needs its URI translated.
_PASS_THROUGH = {"rest": "rest", "hive": "hive", "glue": "glue", "nessie": "rest"}


def pyiceberg_properties(config: LakeConfig) -> dict[str, str]:
    """pyiceberg catalog properties equivalent to the lake's Spark catalog properties."""
    props = dict(config.properties)
    kind = config.catalog_type
    if kind in _PASS_THROUGH:
        props["type"] = _PASS_THROUGH[kind]
        if "client.region" in props:  # Iceberg's (Spark's) name of the region; pyiceberg's S3 reads s3.region
            props.setdefault("s3.region", props["client.region"])
        return props
    if kind != "jdbc":
        raise LakeCatalogError(
            f"catalog {config.catalog!r} has type {kind or '(none)'!r}, which pyiceberg cannot open; use a "
            "jdbc, rest, hive or glue catalog (a Hadoop catalog has no pyiceberg client)"
        )
    uri = props.pop("uri", "")
    jdbc = {**lake.jdbc_defaults(uri), **{k: v for k, v in props.items() if k.startswith("jdbc.")}}
    props = {k: v for k, v in props.items() if not k.startswith("jdbc.")}
    props["type"] = "sql"
    busy_ms = int(jdbc[lake.BUSY_TIMEOUT]) if lake.BUSY_TIMEOUT in jdbc else None
    props["uri"] = sqlalchemy_url(uri, jdbc.get("jdbc.user", ""), jdbc.get("jdbc.password", ""), busy_ms)
    warehouse = props.get("warehouse", "")
    if warehouse.startswith("/"):
        props["warehouse"] = f"file://{warehouse}"
    return props


def sqlalchemy_url(
    jdbc_uri: str, user: str = "", password: str = "", busy_timeout_ms: int | None = None
) -> str:
    """A JDBC catalog URI as SQLAlchemy's URL (``jdbc:sqlite:/p`` -> ``sqlite:////p``).

    A SQLite catalog's busy timeout (``jdbc.busy_timeout``, milliseconds) becomes Python sqlite3's
    ``timeout`` (seconds), which SQLAlchemy takes from the URL's query.
    """
    if jdbc_uri.startswith(lake.SQLITE_JDBC):
        url = f"sqlite:///{jdbc_uri[len(lake.SQLITE_JDBC) :]}"
        if busy_timeout_ms is not None:
            url += f"{'&' if '?' in url else '?'}timeout={busy_timeout_ms / 1000:g}"
        return url
    if jdbc_uri.startswith("jdbc:postgresql:"):
        parsed = urlparse(jdbc_uri[len("jdbc:") :])
        auth = ""
        if user:
            auth = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "") + "@"
        query = f"?{parsed.query}" if parsed.query else ""
        return f"postgresql+psycopg2://{auth}{parsed.netloc}{parsed.path}{query}"
    raise LakeCatalogError(
        f"JDBC catalog URI {jdbc_uri.split('?')[0]!r} is neither jdbc:sqlite: nor jdbc:postgresql:, the two "
        "this package can also open with pyiceberg"
    )


def open_catalog(config: LakeConfig) -> Any:
    """The pyiceberg catalog of the lake; a clear error when it cannot be reached.

    Whether the index namespace exists is the probe: one request whatever the catalog holds.
    """
    from pyiceberg.catalog import load_catalog

    try:
        catalog = load_catalog(config.catalog, **pyiceberg_properties(config))
        catalog.namespace_exists(lake_index.index_namespace(config))
    except LakeCatalogError:
        raise
    except Exception as exc:
        where = config.properties.get("uri", "(no uri)").split("?")[0]
        raise LakeCatalogError(
            f"cannot open Iceberg catalog {config.catalog!r} at {where} "
            f"with pyiceberg ({type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}): "
            "check that the catalog is up and the lake connection's URL, credentials and warehouse"
        ) from exc
    return catalog


def check_catalog(config: LakeConfig, source: str) -> None:
    """Raise :class:`LakeCatalogError`, naming ``source`` (the connection), unless the catalog answers.

    A catalog pyiceberg has no client for (a Hadoop catalog) is Spark's alone: nothing to check.
    """
    try:
        pyiceberg_properties(config)
    except LakeCatalogError:
        return
    try:
        open_catalog(config)
    except LakeCatalogError as exc:
        raise LakeCatalogError(f"{source}: {exc}") from None


def check_warehouse(config: LakeConfig, source: str) -> None:
    """Raise :class:`LakeStorageError`, naming the bucket and ``source``, unless an ``s3://`` warehouse's
    bucket exists and answers the lake's storage credentials (one HEAD request).

    The bucket is reached as the Spark jobs will write it: through pyiceberg's FileIO for the lake's
    properties (``s3.endpoint``, ``s3.access-key-id``, ...). A REST catalog's warehouse is the
    catalog's business (often a name, not a location; the catalog may vend credentials), and a
    catalog pyiceberg cannot open (Hadoop) keeps Spark's own settings: neither is checked here.
    """
    warehouse = str(config.properties.get("warehouse", ""))
    scheme, _, rest = warehouse.partition("://")
    if config.catalog_type == "rest" or scheme not in ("s3", "s3a") or not rest.split("/", 1)[0]:
        return
    try:
        properties = pyiceberg_properties(config)
    except LakeCatalogError:
        return
    from pyiceberg.io import load_file_io
    from pyiceberg.io.pyarrow import PyArrowFileIO

    io = load_file_io(properties, warehouse)
    bucket = rest.split("/", 1)[0]
    if not isinstance(io, PyArrowFileIO):
        return
    problem = bucket_problem(io.fs_by_scheme("s3", bucket), bucket)
    if problem is None:
        return
    endpoint = properties.get("s3.endpoint")
    where = f" at {endpoint}" if endpoint else ""
    detail = problem.detail.splitlines()[0][:300] if problem.detail else ""
    secret = properties.get("s3.secret-access-key")
    detail = detail.replace(secret, "***") if secret else detail
    fix = {
        "missing": f"bucket {bucket!r} of the lake's warehouse {warehouse} does not exist{where}: create "
        "it, or correct the warehouse (and s3.endpoint)",
        "refused": f"the object store{where} refused the lake's credentials for bucket {bucket!r} of its "
        f"warehouse {warehouse} ({detail}): correct s3.access-key-id and s3.secret-access-key in the lake "
        "connection's properties (or the credentials the workers' environment gives)",
        "unreachable": f"cannot reach bucket {bucket!r} of the lake's warehouse {warehouse}{where} "
        f"({detail}): check s3.endpoint and the network",
    }[problem.kind]
    raise LakeStorageError(f"{source}: {fix}. Nothing was submitted and the slot did not move.")


def load_table(catalog: Any, config: LakeConfig, schema: str, table: str) -> Any | None:
    """A source table's lake table, or None when it does not exist."""
    return _load(catalog, config.identifier(schema, table))


def _load(catalog: Any, identifier: tuple[str, str]) -> Any | None:
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError):
        return None


def lineage(table: Any, snapshot_id: int | None = None) -> list[Any]:
    """A branch's pyiceberg snapshots from ``snapshot_id`` (default: main's current), newest first."""
    snapshot = table.snapshot_by_id(snapshot_id) if snapshot_id is not None else table.current_snapshot()
    out = []
    while snapshot is not None:
        out.append(snapshot)
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return out


def summary_of(snapshot: Any) -> dict[str, str]:
    """A snapshot's summary properties (the pipeline's ``pgl.*`` keys and Iceberg's own)."""
    return dict(snapshot.summary.additional_properties) if snapshot.summary is not None else {}


def history(table: Any, snapshot_id: int | None = None) -> list[tuple[int, dict[str, str]]]:
    """A branch's snapshots from ``snapshot_id`` (default: main's current), newest first."""
    return [(snapshot.snapshot_id, summary_of(snapshot)) for snapshot in lineage(table, snapshot_id)]


def table_state(table: Any) -> TableState | None:
    return lake.state_of(history(table))


def unapplied_tables(config: LakeConfig, manifest: Manifest) -> list[str]:
    """Tables of ``manifest`` whose lake table does not hold the batch yet: empty means the ack may go.

    A table holds it once its applied end LSN reached the batch's end (by this batch, or by a
    later snapshot load). Tables with no staged file (nothing to apply) need nothing.
    """
    pending = [entry for entry in manifest.tables if entry.files]
    if not pending:
        return []
    catalog = open_catalog(config)
    missing = []
    for entry in pending:
        table = load_table(catalog, config, entry.schema, entry.table)
        state = table_state(table) if table is not None else None
        if state is None or state.applied_end_lsn < manifest.end_lsn:
            missing.append(entry.qualified)
    return missing


@dataclass(frozen=True, slots=True)
class Cut:
    """The lake at one source LSN: each pipeline table's snapshot there (its tag when tagged)."""

    lsn: Lsn
    tag: str
    snapshots: Mapping[tuple[str, str], int]  # (namespace, table) -> snapshot id


def owned_tables(catalog: Any, config: LakeConfig, slot: str) -> list[Any]:
    """The data tables of ``slot``'s pipeline, as the job's cut takes them: those its index names
    (``formats/lake_index.py``) that exist and carry the slot's table property.

    One small scan of the index, then a load of each table it names: the catalog is never listed,
    so its other tables cost nothing.
    """
    index = _load(catalog, lake_index.index_identifier(config, slot))
    if index is None:
        return []
    entries = index.scan(selected_fields=lake_index.COLUMNS).to_arrow()
    named = zip(
        entries[lake_index.NAMESPACE_COLUMN].to_pylist(),
        entries[lake_index.NAME_COLUMN].to_pylist(),
        strict=True,
    )
    tables = []
    for identifier in lake_index.indexed_tables(named):
        table = _load(catalog, identifier)
        if table is not None and table.properties.get(lake.OWNER_PROPERTY) == slot:
            tables.append(table)
    return tables


def latest_cut(config: LakeConfig, slot: str) -> Cut | None:
    """The newest batch tag present on every table of the pipeline: the lake's latest consistent cut."""
    tables = owned_tables(open_catalog(config), config, slot)
    common: set[str] | None = None
    for table in tables:
        tags = {name for name in table.metadata.refs if lake.tag_lsn(name) is not None}
        common = tags if common is None else common & tags
    if not common:
        return None
    tag = max(common, key=lambda name: lake.tag_lsn(name) or 0)
    return Cut(
        Lsn(lake.tag_lsn(tag) or 0),
        tag,
        {_identifier(t): t.metadata.refs[tag].snapshot_id for t in tables},
    )


def cut_at(config: LakeConfig, slot: str, lsn: Lsn) -> Cut:
    """The lake as of any source ``lsn`` at or after a batch end: from tags, or the history when the
    tag is gone. Tables with no pipeline commit by then are left out."""
    snapshots: dict[tuple[str, str], int] = {}
    tag = lake.tag_name(lsn)
    for table in owned_tables(open_catalog(config), config, slot):
        ref = table.metadata.refs.get(tag)
        snapshot_id = ref.snapshot_id if ref is not None else lake.snapshot_at(history(table), lsn)
        if snapshot_id is not None:
            snapshots[_identifier(table)] = snapshot_id
    return Cut(lsn, tag, snapshots)


def read_table(
    config: LakeConfig,
    schema: str,
    table: str,
    *,
    cut: Cut | None = None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """A source table's lake rows as Arrow, now or as of ``cut``, through pyiceberg."""
    catalog = open_catalog(config)
    loaded = load_table(catalog, config, schema, table)
    if loaded is None:
        raise LakeCatalogError(f"the lake has no table for {schema}.{table} (load its snapshot first)")
    snapshot_id = None
    if cut is not None:
        snapshot_id = cut.snapshots.get(config.identifier(schema, table))
        if snapshot_id is None:
            raise LakeCatalogError(f"{schema}.{table} had no pipeline commit by {cut.lsn}")
    scan = loaded.scan(snapshot_id=snapshot_id, selected_fields=tuple(columns) if columns else ("*",))
    return scan.to_arrow()


def _identifier(table: Any) -> tuple[str, str]:
    namespace, name = table.name()[-2:]
    return str(namespace), str(name)
