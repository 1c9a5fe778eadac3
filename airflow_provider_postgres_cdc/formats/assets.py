"""Airflow Asset URIs of the lake's tables and of a pipeline's consistent cut, defined once.

docs/OBSERVABILITY.md, "Assets", describes them for users.

Two schemes, registered by the provider (``get_provider_info``'s ``asset-uris``):

* ``iceberg://<catalog>/<namespace>/<table>``: one Iceberg table of the lake, named as its catalog
  names it (the lake namespace is the source schema behind the lake's namespace prefix). The
  catalog is the lake connection's Spark catalog name: within one Airflow deployment it names one
  lake, as it does in every Spark session that reads it.
* ``postgres-cdc://<catalog>/<slot>``: the consistent cuts of one pipeline, the tables the slot's
  pipeline owns in that lake, tagged at one source LSN.

Every part is percent-encoded on its own (UTF-8, nothing kept but unreserved characters), so any
name a catalog or PostgreSQL accepts (spaces, dots, ``%``, ``/``, non-ASCII) gives a valid ASCII URI,
distinct from every other name's. The same parts give the OpenLineage dataset the provider's Asset
converter names an Asset by (:func:`openlineage_dataset`, from the URI alone): namespace
``iceberg://<catalog>``, name ``<namespace>.<table>``; the lake namespace never holds a raw dot
(``LakeConfig.namespace`` encodes it), so the first dot separates the two. The pipeline's own
lineage names a lake table by its location instead, as OpenLineage's Spark integration does, and
links this name to it as a symlink (``lineage/naming.py``).

Standard library only (like the rest of ``formats/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import SplitResult, quote, unquote, urlsplit

TABLE_SCHEME = "iceberg"
CUT_SCHEME = "postgres-cdc"
SCHEMES = (TABLE_SCHEME, CUT_SCHEME)


def _part(name: str) -> str:
    """One URI part: every byte but RFC 3986's unreserved characters percent-encoded."""
    if not name:
        raise ValueError("an asset URI part cannot be empty")
    return quote(name, safe="")


@dataclass(frozen=True, slots=True)
class LakeTableRef:
    """One Iceberg table of a lake: catalog, namespace (as the catalog stores it) and table name."""

    catalog: str
    namespace: str
    table: str

    @property
    def uri(self) -> str:
        return f"{TABLE_SCHEME}://{_part(self.catalog)}/{_part(self.namespace)}/{_part(self.table)}"

    @property
    def display_name(self) -> str:
        """``catalog.namespace.table``, as Spark SQL names the table (for logs, not for parsing)."""
        return f"{self.catalog}.{self.namespace}.{self.table}"


@dataclass(frozen=True, slots=True)
class CutRef:
    """The consistent cuts of the pipeline of ``slot`` in the lake of ``catalog``."""

    catalog: str
    slot: str

    @property
    def uri(self) -> str:
        return f"{CUT_SCHEME}://{_part(self.catalog)}/{_part(self.slot)}"


def parse_asset_uri(uri: str) -> LakeTableRef | CutRef:
    """The reference a URI of either scheme names; ``ValueError`` saying what is wrong otherwise."""
    return _parse(urlsplit(uri))


def _parse(parts: SplitResult) -> LakeTableRef | CutRef:
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"not a postgres-cdc asset URI scheme: {parts.scheme!r} (expected one of {SCHEMES})")
    if parts.query or parts.fragment:
        raise ValueError(f"{scheme}:// asset URIs take no query or fragment: {parts.geturl()!r}")
    if not parts.netloc or "@" in parts.netloc:
        raise ValueError(f"{scheme}:// asset URIs name the lake's catalog as their host: {parts.geturl()!r}")
    segments = parts.path.split("/")[1:] if parts.path.startswith("/") else []
    expected = 2 if scheme == TABLE_SCHEME else 1
    if len(segments) != expected or not all(segments):
        shape = (
            "iceberg://<catalog>/<namespace>/<table>" if expected == 2 else "postgres-cdc://<catalog>/<slot>"
        )
        raise ValueError(f"asset URI {parts.geturl()!r} is not of the form {shape}")
    catalog, names = unquote(parts.netloc), [unquote(segment) for segment in segments]
    if scheme == TABLE_SCHEME:
        return LakeTableRef(catalog, names[0], names[1])
    return CutRef(catalog, names[0])


def normalize(parts: SplitResult) -> SplitResult:
    """The canonical form of a URI of either scheme (Airflow's URI handler for them).

    Each part is decoded and encoded again, so equivalent spellings (``%7E`` and ``~``, lower and
    upper-case escapes) are one Asset.
    """
    ref = _parse(parts)
    return urlsplit(ref.uri)


def openlineage_dataset(uri: str) -> tuple[str, str]:
    """The OpenLineage ``(namespace, name)`` of an asset URI (the module doc says why it is unambiguous)."""
    ref = parse_asset_uri(uri)
    if isinstance(ref, LakeTableRef):
        return f"{TABLE_SCHEME}://{_part(ref.catalog)}", f"{ref.namespace}.{ref.table}"
    return f"{CUT_SCHEME}://{_part(ref.catalog)}", ref.slot
