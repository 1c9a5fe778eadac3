"""pgoutput logical replication decoding: bytes in, typed messages, transactions and Arrow out.

No Airflow and no I/O here. The drain calls :class:`BatchDecoder`; ``pgcdc peek``, the tests
and streaming consumers use :class:`PgOutputDecoder` and :class:`TransactionAssembler`.
"""

from airflow_provider_postgres_cdc.errors import PgOutputDecodeError
from airflow_provider_postgres_cdc.pgoutput.arrow import (
    METADATA_FIELDS,
    TRANSACTION_SCHEMA,
    DecodedBatch,
    TableChanges,
    change_schema,
    transactions_to_tables,
)
from airflow_provider_postgres_cdc.pgoutput.assembly import (
    RowChange,
    Transaction,
    TransactionAssembler,
    assemble,
)
from airflow_provider_postgres_cdc.pgoutput.columnar import BatchDecoder, PreparedBatch
from airflow_provider_postgres_cdc.pgoutput.decoder import PgOutputDecoder
from airflow_provider_postgres_cdc.pgoutput.messages import (
    PG_EPOCH_US,
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    LogicalMessage,
    Message,
    MessageType,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    TupleData,
    TupleKind,
    Type,
    Update,
)
from airflow_provider_postgres_cdc.pgoutput.relations import RelationCache

__all__ = [
    "METADATA_FIELDS",
    "PG_EPOCH_US",
    "TRANSACTION_SCHEMA",
    "BatchDecoder",
    "Begin",
    "BeginPrepare",
    "Column",
    "Commit",
    "CommitPrepared",
    "DecodedBatch",
    "Delete",
    "Insert",
    "LogicalMessage",
    "Message",
    "MessageType",
    "Origin",
    "PgOutputDecodeError",
    "PgOutputDecoder",
    "Prepare",
    "PreparedBatch",
    "Relation",
    "RelationCache",
    "RollbackPrepared",
    "RowChange",
    "StreamAbort",
    "StreamCommit",
    "StreamPrepare",
    "StreamStart",
    "StreamStop",
    "TableChanges",
    "Transaction",
    "TransactionAssembler",
    "Truncate",
    "TupleData",
    "TupleKind",
    "Type",
    "Update",
    "assemble",
    "change_schema",
    "transactions_to_tables",
]
