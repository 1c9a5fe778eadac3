"""The replication layer: connections, preflight checks, publications and slots over psycopg2.

No Airflow import here: the hook, the CLI and the tests all call these functions directly.
"""

from airflow_provider_postgres_cdc.replication.connection import connect, connect_replication
from airflow_provider_postgres_cdc.replication.preflight import PreflightReport, check_prerequisites
from airflow_provider_postgres_cdc.replication.publications import (
    PublicationInfo,
    PublishedTable,
    TableSpec,
    alter_publication,
    create_publication,
    describe_publications,
    drop_publication,
    publish_tables,
)
from airflow_provider_postgres_cdc.replication.slots import (
    CreatedSlot,
    SlotInfo,
    advance_slot,
    create_slot,
    create_slot_with_snapshot,
    describe_slot,
    drop_slot,
    hold_drain_lock,
    list_slots,
    slot_lag_bytes,
)

__all__ = [
    "CreatedSlot",
    "PreflightReport",
    "PublicationInfo",
    "PublishedTable",
    "SlotInfo",
    "TableSpec",
    "advance_slot",
    "alter_publication",
    "check_prerequisites",
    "connect",
    "connect_replication",
    "create_publication",
    "create_slot",
    "create_slot_with_snapshot",
    "describe_publications",
    "describe_slot",
    "drop_publication",
    "drop_slot",
    "hold_drain_lock",
    "list_slots",
    "publish_tables",
    "slot_lag_bytes",
]
