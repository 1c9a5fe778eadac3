"""The package's exceptions: one class per failure a user must act on, the fix in its message."""

from __future__ import annotations

# The example DAG that recreates a lost or dropped slot and reloads every table; the errors
# that mean "this pipeline must be recovered" point to it.
RECOVERY_DAG = "pglogical_recover_slot"


class PgLogicalError(Exception):
    """Base of every error this package raises on purpose."""


class PrerequisiteError(PgLogicalError):
    """The server or role is not set up for logical replication (see ``check_prerequisites``)."""


class WalLevelError(PrerequisiteError):
    """``wal_level`` is not ``logical``."""


class ReplicationCapacityError(PrerequisiteError):
    """No free replication slot or WAL sender is left."""


class PrivilegeError(PrerequisiteError):
    """The role lacks LOGIN, REPLICATION or a table privilege."""


class ServerVersionError(PrerequisiteError):
    """The server is older than the oldest version this package supports."""


class PublicationNotFoundError(PgLogicalError):
    """A publication named by the user does not exist in the database."""


class PublicationEmptyError(PgLogicalError):
    """A publication exists but publishes no table."""


class SlotNotFoundError(PgLogicalError):
    """A replication slot named by the user does not exist."""


class SlotExistsError(PgLogicalError):
    """A slot that was to be created exists already."""


class SlotActiveError(PgLogicalError):
    """A slot is in use by another connection (another drain, or a subscriber)."""


class SlotLostError(PgLogicalError):
    """A slot was invalidated (``wal_status = lost``): the WAL it needed is gone."""


class SlotAdvanceError(PgLogicalError):
    """A slot could not be advanced to the requested position."""


class NameEncodingError(PgLogicalError):
    """A published name is not valid UTF-8 (possible only in a SQL_ASCII database)."""


class StagingNotWritableError(PgLogicalError):
    """The staging location cannot be written (permissions, read-only, disk full, missing bucket, ...)."""


class ConnectionLostError(PgLogicalError):
    """The connection to PostgreSQL broke mid-read (server restart, terminated backend, network)."""
