"""Which PostgreSQL major brings which logical-replication feature: one table, one error for all.

The package supports PostgreSQL 15 to 18. Each feature newer than 15 is asked for by name; on an
older server the request fails here, before any slot or file exists, with a
``ServerFeatureError`` that names the feature, the major it needs and what to do instead.
"""

from __future__ import annotations

from typing import Any, Final

from airflow_provider_postgres_cdc.errors import RECOVERY, ServerFeatureError

MIN_SUPPORTED_MAJOR: Final = 15
MAX_TESTED_MAJOR: Final = 18

ROW_FILTERS = "publication row filters and column lists"
STANDBY_DECODING = "logical decoding on a standby"
PROTOCOL_4 = "pgoutput protocol 4 (streaming = parallel)"
FAILOVER_SLOTS = "failover slots"
GENERATED_COLUMNS = "published generated columns (publish_generated_columns)"
IDLE_SLOT_TIMEOUT = "idle_replication_slot_timeout"

# feature -> (first major with it, what to do on an older server)
FEATURES: Final[dict[str, tuple[int, str]]] = {
    ROW_FILTERS: (15, "publish whole tables, or upgrade the server"),
    STANDBY_DECODING: (16, "read the slot on the primary (point the connection at it), or upgrade"),
    PROTOCOL_4: (16, "use streaming on (protocol 2), which 15 supports, or upgrade"),
    FAILOVER_SLOTS: (
        17,
        "pass failover=False (a failover then loses the slot: the lake is re-snapshotted with "
        f"{RECOVERY}), or upgrade",
    ),
    GENERATED_COLUMNS: (18, "publish the generated column's expression as a plain column, or upgrade"),
    IDLE_SLOT_TIMEOUT: (18, "watch the slot's lag instead (SlotLagSensor), or upgrade"),
}


def server_major(conn: Any) -> int:
    """The major version of the server behind a psycopg2 connection (e.g. 170004 -> 17)."""
    return int(conn.server_version) // 10000


def supports(conn: Any, feature: str) -> bool:
    """Whether the connection's server has ``feature`` (a key of :data:`FEATURES`)."""
    return server_major(conn) >= FEATURES[feature][0]


def require(conn: Any, feature: str) -> None:
    """Raise ``ServerFeatureError`` unless the connection's server has ``feature``."""
    needed, instead = FEATURES[feature]
    major = server_major(conn)
    if major < needed:
        raise ServerFeatureError(
            f"{feature} need PostgreSQL {needed} or later; this server is PostgreSQL {major}: {instead} "
            f"(supported: PostgreSQL {MIN_SUPPORTED_MAJOR} to {MAX_TESTED_MAJOR}, docs/POSTGRES_VERSIONS.md)."
        )
