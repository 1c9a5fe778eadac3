"""OpenLineage names of the lake's Iceberg tables, as OpenLineage's own Spark integration gives them.

A Spark job that reads a lake table with the OpenLineage Spark listener names it by its Iceberg
location and links the catalog's name for it as a ``symlinks`` identifier. Naming the tables the
same way here makes our lineage and theirs one graph: the apply's output is the downstream job's
input. The rules, from the OpenLineage repository (``OpenLineage/OpenLineage``):

* ``integration/spark/spark3/.../catalog/iceberg/IcebergHandler.java`` and ``BaseCatalogTypeHandler``:
  the dataset is the table's location (``table.location()``); a table that does not exist yet
  is named by ``defaultTableLocation``, ``<warehouse>/<namespace levels>/<table>``, and by
  nothing when the catalog has no ``warehouse`` either (``RestCatalogTypeHandler`` throws then).
* ``integration/spark/shared/.../util/PathUtils.java`` (``fromPath``) and
  ``client/java/.../utils/filesystem/``: the location goes through Hadoop's ``Path`` (slash runs
  and dot segments removed), then ``FilesystemDatasetUtils.fromLocation``:
  ``LocalFilesystemDatasetExtractor`` (no scheme or ``file``: namespace ``file``, name the absolute
  path), ``ObjectStorageDatasetExtractor`` (a scheme starting ``s3``, ``gs``, ``abfs`` or ``wasb``:
  namespace ``s3://<bucket>`` with ``s3a``/``s3n`` written ``s3``, ``abfs`` as ``abfss``, ``wasb``
  as ``wasbs``; name the key without leading or trailing slashes), and
  ``GenericFilesystemDatasetExtractor`` (namespace ``<scheme>://<authority>``, name the path).
  Trailing slashes never count; an empty path is ``/``.
* The symlink, type ``TABLE``, per catalog type (the handlers' ``getSymlinkIdentifiers``; first
  match in ``IcebergHandler``'s order): ``rest`` (or a ``…RESTCatalog`` implementation) and
  ``nessie``: namespace the catalog's ``uri`` as configured, name Spark's identifier
  (``Identifier.toString``: ``ns.table``, a part that is not ``[a-zA-Z0-9_]+`` or is all digits
  back-quoted); ``hadoop`` (and a ``…BigQueryMetastoreCatalog``): what
  ``FilesystemDatasetUtils.fromLocationAndName`` makes of the warehouse and that identifier
  (``file:/warehouse``, ``s3://bucket/warehouse``); ``hive``, and any other type (Spark's
  ``HiveCatalogTypeHandler`` is the default): namespace ``hive://<host:port of the uri>``.

Where this package parts from Spark, and why:

* A JDBC catalog's ``uri`` (``jdbc:postgresql://…``) has no authority, so Spark's default Hive
  handler fails on it and its integration names no dataset for such a table; a ``…GlueCatalog``
  symlink is an ARN Spark takes from its own environment (``AWS_DEFAULT_REGION``, the account), and
  ``type=glue`` also falls to the Hive handler without a metastore URI. Those tables get no Spark
  symlink here; they are still named by location.
* A userinfo part (``user:secret@``) of a catalog URI is dropped: lineage leaves the deployment and
  must not carry a secret (Spark's integration would keep it).
* Every table also carries this package's own catalog name for it as a second ``TABLE`` symlink:
  namespace ``iceberg://<catalog>``, name ``<namespace>.<table>``, the name the provider's Asset
  converter gives an ``iceberg://`` Asset (``formats/assets.py``), so a user's task declaring a lake
  table Asset as inlet joins the same node.
* Not reproduced: S3 Tables and Snowflake Horizon catalogs (Spark names them by their ARN and
  account instead of by location), Spark's dataset-name trimmers (a table named like a partition
  directory, ``2024-01-01`` or ``k=v``, loses that last part there) and user-configured namespace
  resolvers.

Standard library only: pure rules, tested on the Spark integration's own cases. They were also
checked against the released listener (``openlineage-spark_2.12`` 1.53.0 on Spark 3.5, Iceberg
1.10) reading tables of a Hadoop, a JDBC and SeaweedFS's REST catalog: the same names and symlinks,
and no dataset at all from Spark for the JDBC catalog's tables.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from airflow_provider_postgres_cdc.formats.assets import LakeTableRef, openlineage_dataset
from airflow_provider_postgres_cdc.formats.lake import LakeConfig

SYMLINK_TYPE = "TABLE"
# ObjectStorageDatasetExtractor's (scheme prefix, namespace scheme), in FilesystemDatasetUtils' order.
_OBJECT_STORES = (("s3", "s3"), ("gs", "gs"), ("abfs", "abfss"), ("wasb", "wasbs"))
_BARE_PART = re.compile(r"[a-zA-Z0-9_]+")
# What java.net.URI's multi-argument constructors leave unquoted in a path, besides alphanumerics.
_URI_PATH_SAFE = "_-!.~'()*;:@&=+$,/"


@dataclass(frozen=True, slots=True)
class DatasetName:
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class LakeDatasetName:
    """A lake table's dataset (its location) and the table names that link to it, Spark's first."""

    namespace: str
    name: str
    symlinks: tuple[DatasetName, ...]


@dataclass(frozen=True, slots=True)
class _Location:
    """A location as Hadoop's ``new Path(location).toUri()`` splits it."""

    scheme: str | None
    authority: str | None
    path: str


def _hadoop_path(location: str) -> _Location:
    """``org.apache.hadoop.fs.Path(String)``: a scheme before the first ``/``, an authority after
    ``//``, the rest a raw path (``%`` is no escape), with slash runs and dot segments removed."""
    colon, slash = location.find(":"), location.find("/")
    scheme, start = None, 0
    if colon != -1 and (slash == -1 or colon < slash):
        scheme, start = location[:colon], colon + 1
    authority = None
    if location.startswith("//", start) and len(location) - start > 2:
        end = location.find("/", start + 2)
        end = end if end > 0 else len(location)
        authority, start = location[start + 2 : end], end
    return _Location(scheme, authority or None, _normalized(location[start:]))


def _normalized(path: str) -> str:
    """``java.net.URI.normalize`` of a path: no empty or ``.`` segments, ``a/..`` pairs resolved."""
    segments: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == ".." and segments and segments[-1] != "..":
            segments.pop()
            continue
        segments.append(segment)
    joined = "/".join(segments)
    return "/" + joined if path.startswith("/") else joined


def _object_store(scheme: str | None) -> str | None:
    """The namespace scheme of an object store's location scheme (``s3a`` -> ``s3``), else None."""
    if scheme is None:
        return None
    return next((canonical for prefix, canonical in _OBJECT_STORES if scheme.startswith(prefix)), None)


def _java_uri(scheme: str, authority: str | None, path: str) -> str:
    """``new java.net.URI(scheme, authority, path, null, null).toString()``: illegal ASCII in the path
    percent-encoded (``%`` too), other characters kept."""
    quoted = "".join(
        ch if not ch.isascii() and ch.isprintable() and not ch.isspace() else quote(ch, safe=_URI_PATH_SAFE)
        for ch in path
    )
    return f"{scheme}:{'' if authority is None else '//' + authority}{quoted}"


def location_name(location: str) -> DatasetName:
    """The dataset of a location: ``PathUtils.fromPath(new Path(location))`` of the Spark integration."""
    where = _hadoop_path(location)
    if where.scheme in (None, "file"):
        return DatasetName("file", where.path.rstrip("/") or "/")
    store = _object_store(where.scheme)
    if store is not None:
        return DatasetName(f"{store}://{where.authority or ''}", where.path.strip("/") or "/")
    namespace = str(where.scheme) if where.authority is None else f"{where.scheme}://{where.authority}"
    return DatasetName(namespace, where.path.rstrip("/") or "/")


def location_and_name(location: str, name: str) -> DatasetName:
    """``FilesystemDatasetUtils.fromLocationAndName(new Path(location).toUri(), name)``: a table
    named within its warehouse (a Hadoop catalog's symlink)."""
    where = _hadoop_path(location)
    if where.scheme in (None, "file"):
        path = where.path.rstrip("/")
        return DatasetName(f"file:{path}" if path else "file", name.rstrip("/") or "/")
    store = _object_store(where.scheme)
    if store is not None:
        namespace = _java_uri(store, where.authority, where.path).rstrip("/")
        return DatasetName(namespace, name.strip("/") or "/")
    namespace = _java_uri(str(where.scheme), where.authority, where.path).rstrip("/").rstrip(":")
    return DatasetName(namespace, name.rstrip("/") or "/")


def spark_identifier(namespace: str, table: str) -> str:
    """Spark's ``Identifier.toString`` of ``namespace.table``: each part back-quoted unless it is
    ``[a-zA-Z0-9_]+`` and not all digits (back-quotes doubled), joined by dots."""

    def part(text: str) -> str:
        if _BARE_PART.fullmatch(text) and not text.isdigit():
            return text
        return "`" + text.replace("`", "``") + "`"

    return f"{part(namespace)}.{part(table)}"


def default_location(properties: Mapping[str, str], namespace: str, table: str) -> str | None:
    """``defaultTableLocation``: where Spark's integration places a table that does not exist yet,
    ``<warehouse>/<namespace>/<table>``; None without a ``warehouse``."""
    warehouse = properties.get("warehouse")
    if not warehouse:
        return None
    return f"{warehouse.rstrip('/')}/{namespace}/{table}"


def _without_userinfo(uri: str) -> str:
    """``uri`` as configured (Spark keeps it verbatim), less any ``user:secret@``."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


def catalog_symlink(properties: Mapping[str, str], namespace: str, table: str) -> DatasetName | None:
    """The symlink Spark's Iceberg handler gives a table of a catalog with these Spark properties
    (the module doc lists the handlers); None where it gives none this package can know."""
    kind = properties.get("type", "").lower()
    impl = properties.get("catalog-impl", "")
    uri = properties.get("uri", "")
    identifier = spark_identifier(namespace, table)
    uri_symlink = DatasetName(_without_userinfo(uri), identifier) if uri else None
    if kind == "nessie":
        return uri_symlink
    if impl.endswith("GlueCatalog"):
        return None
    if kind == "rest" or impl.endswith("RESTCatalog"):
        return uri_symlink
    if kind == "hadoop" or impl.endswith("BigQueryMetastoreCatalog"):
        warehouse = properties.get("warehouse")
        return location_and_name(warehouse, identifier) if warehouse else None
    authority = urlsplit(uri).netloc.rpartition("@")[2]
    return DatasetName(f"hive://{authority}", identifier) if authority else None


def lake_dataset_name(
    lake: LakeConfig, namespace: str, table: str, location: str | None
) -> LakeDatasetName | None:
    """A lake table's OpenLineage name: its ``location`` (from its Iceberg metadata; None when the
    table does not exist yet, which falls back to :func:`default_location`) with Spark's catalog
    symlink and this package's own; None when there is neither a location nor a warehouse."""
    where = location or default_location(lake.properties, namespace, table)
    if where is None:
        return None
    primary = location_name(where)
    spark = catalog_symlink(lake.properties, namespace, table)
    own = DatasetName(*openlineage_dataset(LakeTableRef(lake.catalog, namespace, table).uri))
    symlinks = (spark, own) if spark is not None else (own,)
    return LakeDatasetName(primary.namespace, primary.name, symlinks)
