"""The package's exceptions: one class per failure a user must act on, the fix in its message."""

from __future__ import annotations

# The procedures the errors send users to are DAGs the package builds (``dag_factories``): a user
# deploys them with one line in a DAG file, and the default DAG ids below are what they trigger.
FACTORIES = "airflow_provider_postgres_cdc.dag_factories"
INITIAL_SNAPSHOT_DAG = "postgres_cdc_initial_snapshot"
RECOVERY_DAG = "postgres_cdc_recover_slot"
BACKFILL_DAG = "postgres_cdc_backfill_tables"
RECOVERY = f"the {RECOVERY_DAG} DAG ({FACTORIES}.recover_slot_dag() in a DAG file)"
"""Recreates a lost or dropped slot and reloads every table."""
BACKFILL = f"the {BACKFILL_DAG} DAG ({FACTORIES}.backfill_tables_dag() in a DAG file)"
"""Re-snapshots some tables of a running pipeline."""
INITIAL_SNAPSHOT = f"the {INITIAL_SNAPSHOT_DAG} DAG ({FACTORIES}.initial_snapshot_dag() in a DAG file)"
"""Creates a pipeline's slot and loads every table."""


class PostgresCdcError(Exception):
    """Base of every error this package raises on purpose."""


class PrerequisiteError(PostgresCdcError):
    """The server or role is not set up for logical replication (see ``check_prerequisites``)."""


class WalLevelError(PrerequisiteError):
    """``wal_level`` is not ``logical``."""


class ReplicationCapacityError(PrerequisiteError):
    """No free replication slot or WAL sender is left."""


class PrivilegeError(PrerequisiteError):
    """The role lacks LOGIN, REPLICATION or a table privilege."""


class ServerVersionError(PrerequisiteError):
    """The server is older than the oldest version this package supports."""


class ServerFeatureError(ServerVersionError):
    """A requested feature needs a newer PostgreSQL major than the server's (``replication/features.py``)."""


class FailoverNotReadyError(PrerequisiteError):
    """A standby lacks what failover slots need, or the pipeline's slot is not sync-ready on it."""


class StandbyPromotedError(PostgresCdcError):
    """The standby a drain was reading was promoted to primary while the drain ran."""


class PublicationNotFoundError(PostgresCdcError):
    """A publication named by the user does not exist in the database."""


class PublicationEmptyError(PostgresCdcError):
    """A publication exists but publishes no table."""


class ColumnListConflictError(PostgresCdcError):
    """A table is published with different column lists in the publications one slot reads."""


class PublicationAllTablesError(PostgresCdcError):
    """A table cannot be added to a ``FOR ALL TABLES`` publication: it is in there already."""


class ReplicaIdentityFilterError(PostgresCdcError):
    """A row filter or column list would make the table's UPDATEs and DELETEs fail on the source."""


class SlotNotFoundError(PostgresCdcError):
    """A replication slot named by the user does not exist."""


class SlotExistsError(PostgresCdcError):
    """A slot that was to be created exists already."""


class SlotActiveError(PostgresCdcError):
    """A slot is in use by another connection (another drain, or a subscriber)."""


class SlotLostError(PostgresCdcError):
    """A slot was invalidated (``wal_status = lost``): the WAL it needed is gone."""


class SlotAdvanceError(PostgresCdcError):
    """A slot could not be advanced to the requested position."""


class SlotShortOfBatchError(SlotAdvanceError):
    """The slot would end short of the batch's end: the server's WAL ends before it."""


class NameEncodingError(PostgresCdcError):
    """A published name is not valid UTF-8 (possible only in a SQL_ASCII database)."""


class StagingAccessError(PostgresCdcError):
    """The staging object store refused access: its bucket does not exist or the credentials are wrong."""


class StagingNotWritableError(PostgresCdcError):
    """The staging location cannot be written (permissions, read-only, disk full, missing bucket, ...)."""


class ConnectionLostError(PostgresCdcError):
    """The connection to PostgreSQL broke mid-read (server restart, terminated backend, network)."""


class LakeConfigError(PostgresCdcError, ValueError):
    """The lake (Iceberg catalog) configuration is incomplete or malformed."""


class PartitionSpecError(PostgresCdcError, ValueError):
    """A ``partition_by`` option names an unknown transform, an unpublished column or one it cannot take."""


class DeletesOptionError(PostgresCdcError, ValueError):
    """A ``deletes`` option is malformed, asks soft deletes of a keyless table, or would switch a
    table's mode in a batch (only a re-snapshot may)."""


class HistoryOptionError(PostgresCdcError, ValueError):
    """A ``history`` option is malformed, asks history of a keyless table, or would switch a table's
    mode in a batch (only a re-snapshot may)."""


class ColumnTransformsError(PostgresCdcError, ValueError):
    """A ``column_transforms`` option is malformed, names what is not published, drops a key, lacks its
    hash key, or differs from what a lake table's rows were staged under (only a re-snapshot may)."""


class LakeNameError(PostgresCdcError):
    """A published table has no lake name its lake can hold (too long, or shared with another table)."""


class LakeCatalogError(PostgresCdcError):
    """The lake's Iceberg catalog cannot be opened or read from Python (pyiceberg)."""


class LakeStorageError(PostgresCdcError):
    """The lake's object store refused the warehouse: no such bucket, or the credentials are wrong."""


class ManifestFormatError(PostgresCdcError, ValueError):
    """A manifest's JSON does not follow format version 1 (missing key, wrong kind or version)."""


class BatchNotAppliedError(PostgresCdcError):
    """Not every lake table holds the batch yet; the slot must not move."""


class ManifestSlotMismatchError(PostgresCdcError):
    """The manifest given to an ack belongs to another slot."""


class SlotNotAcknowledgedError(PostgresCdcError):
    """The slot has no confirmed position (a physical slot): lag, acks and retention need a logical one."""


class ReservedColumnNameError(PostgresCdcError):
    """A source column name ends with the reserved overflow suffix."""


class TransportError(PostgresCdcError):
    """The server ended or garbled a replication stream."""


class UnrepresentableValueError(PostgresCdcError):
    """A value has no exact representation in its column's Arrow type (e.g. ``'infinity'::date``)."""

    def __init__(self, type_name: str, lake_type: str, values: list[str]) -> None:
        self.type_name = type_name
        self.values = values
        shown = ", ".join(repr(v) for v in values[:5])
        super().__init__(
            f"{len(values)} value(s) of type {type_name} cannot be held by "
            f"{lake_type} without loss: {shown}. Store them via "
            "text_to_arrow_with_overflow, or change the column (e.g. to text) in the source."
        )


class UnsupportedBinaryTypeError(PostgresCdcError):
    """A value arrived in binary format (pgoutput ``binary``) for a type we only read as text."""


class ApplyError(PostgresCdcError):
    """A failure the user must act on; the job prints the message and exits with status 2."""


class SchemaConflictError(ApplyError):
    """A column's type changed in a way the lake table cannot hold."""


class ResnapshotNeededError(SchemaConflictError):
    """A schema change whose effect on existing rows the stream cannot show: re-snapshot the table."""


class ConcurrentWriteError(ApplyError):
    """Another writer committed the table first: redo the table from its new state."""


class CatalogError(ApplyError):
    """The Iceberg catalog cannot be reached or is not configured in this Spark session."""


class IcebergRuntimeError(PostgresCdcError):
    """The Spark job has no Iceberg runtime, or one built for another Spark or Scala version."""


class SparkConnectError(PostgresCdcError):
    """The Spark Connect server of a pipeline cannot run its jobs: unreachable, a refused token, an
    Iceberg runtime it lacks, or a staging location it cannot read."""


class MaintenanceError(PostgresCdcError):
    """The maintenance job was called wrongly (a bad argument); nothing was changed."""


class JobSpecError(Exception):
    """The spec asks for something this job cannot do (exit status 2)."""


class WalRetentionError(PostgresCdcError):
    """A slot's WAL is at risk: ``wal_status = unreserved``, or ``safe_wal_size`` is under the floor."""


class SnapshotLostError(PostgresCdcError):
    """The exported snapshot can no longer be imported: the connection holding it was lost."""


class RowTooLargeError(PostgresCdcError):
    """A single row is larger than ``max_memory_bytes`` lets one copy worker hold."""


class TableDroppedError(PostgresCdcError):
    """A published table was dropped while the snapshot was being copied."""


class RowSecurityError(PrivilegeError):
    """A published table has row-level security and the role may not bypass it."""


class TableNotPublishedError(PostgresCdcError):
    """A table named for a snapshot is not in the publications the slot reads."""


class SparkEngineUnsupportedError(PostgresCdcError):
    """The Spark copy engine cannot copy this source (socket host, arrays, SQL_ASCII): use the local one."""


class PgOutputDecodeError(PostgresCdcError):
    """A pgoutput message could not be decoded: truncated, unknown, or inconsistent with the stream.

    :param message_type: the message's type character (``"I"``, ``"R"``...), or ``"?"`` when the
        buffer is empty.
    :param offset: byte offset within the message where decoding failed.
    :param lsn: the message's LSN when the caller knows it.
    """

    def __init__(self, reason: str, *, message_type: str, offset: int, lsn: int | None = None) -> None:
        self.reason = reason
        self.message_type = message_type
        self.offset = offset
        self.lsn = lsn
        where = f" at LSN {lsn}" if lsn is not None else ""
        super().__init__(
            f"cannot decode pgoutput message {message_type!r}{where}, byte {offset}: {reason}. Nothing of "
            "the batch was staged and the slot did not move; print the messages there with `pgcdc "
            "peek --slot-name <slot>` and report them with the server version"
        )


class SequencingError(PostgresCdcError):
    """The message stream does not nest as pgoutput sends it (a change outside any transaction,
    a commit of a transaction never begun, two-phase messages the drain did not ask for)."""


class SlotPluginError(PostgresCdcError):
    """A slot is physical or decodes with another output plugin than pgoutput."""


class ConnectionExtrasError(PostgresCdcError):
    """A ``postgres`` connection's extras hold a key that is not a libpq keyword, or ask for IAM auth."""
