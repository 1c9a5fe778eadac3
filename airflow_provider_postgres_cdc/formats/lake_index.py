"""The pipeline's index of its lake tables, defined once for the Spark job and the Airflow side.

A lake catalog is often shared: other teams' tables, other pipelines' tables. Finding a slot's
tables by listing every namespace and loading every table to read its ``pgl.slot`` property makes
each cut, ack, report and maintenance run cost as much as the whole catalog. Instead the apply job
records every table it writes for a slot in one small Iceberg table of that slot, the index, and
every reader loads the index and then only the tables it names (docs/LAKE.md, "How the pipeline
finds its tables"). The ``pgl.slot`` property stays the owner's mark: the index narrows the
search, the property confirms each table.

Standard library only, like ``lake.py``: the Spark job ships this module.
"""

from __future__ import annotations

from collections.abc import Iterable

from airflow_provider_postgres_cdc.formats.lake import LakeConfig

# The source-schema name whose lake namespace holds every slot's index: ``<namespace_prefix>pgl_pipelines``.
# A source schema of that name would share the namespace; its tables ``slot_<slot>_tables`` are reserved.
INDEX_SCHEMA = "pgl_pipelines"
# Slot names may begin or end with "_"; the strictest REST catalogs want a table name to begin and end
# with a letter or digit.
INDEX_TABLE = "slot_{slot}_tables"
# One row per table registered: its lake namespace and table name, as the catalog stores them.
NAMESPACE_COLUMN = "namespace"
NAME_COLUMN = "name"
COLUMNS = (NAMESPACE_COLUMN, NAME_COLUMN)


def index_identifier(config: LakeConfig, slot: str) -> tuple[str, str]:
    """(namespace, table) of ``slot``'s index: ``<namespace_prefix>pgl_pipelines.slot_<slot>_tables``,
    written by the lake's name rule like any lake name.

    PostgreSQL slot names are lowercase letters, digits and underscores, so whatever the slot the
    table name is one the strictest REST catalogs take (S3 Tables, SeaweedFS: ``a-z``, ``0-9`` and
    ``_``, beginning and ending with a letter or digit), under either name rule; so is the
    namespace, given a namespace prefix they take.
    """
    return config.identifier(INDEX_SCHEMA, INDEX_TABLE.format(slot=slot))


def index_namespace(config: LakeConfig) -> str:
    """The namespace of every slot's index. Asking whether it exists is how the pipeline checks that
    a catalog answers: a question whose cost does not grow with the catalog, unlike a listing."""
    return config.namespace(INDEX_SCHEMA)


def index_comment(slot: str) -> str:
    """The index table's comment, for whoever comes across it in a shared catalog."""
    return f"lake tables of the postgres-cdc pipeline of replication slot {slot} (docs/LAKE.md)"


def indexed_tables(entries: Iterable[tuple[str | None, str | None]]) -> list[tuple[str, str]]:
    """The distinct (namespace, table) the index's rows name, sorted.

    A table is registered again when two jobs race to register it; a table dropped and re-created
    (a re-snapshot after a manual drop) keeps its entry. Either way it is one table here.
    """
    return sorted({(namespace, name) for namespace, name in entries if namespace and name})


def unregistered(
    identifiers: Iterable[tuple[str, str]], indexed: Iterable[tuple[str, str]]
) -> list[tuple[str, str]]:
    """``identifiers`` the index does not name yet, each once, in their order: what a job appends."""
    known = set(indexed)
    return [identifier for identifier in dict.fromkeys(identifiers) if identifier not in known]
