"""Drain one bounded micro-batch from a slot into staged Parquet, without moving the slot.

The batch starts at the slot's ``confirmed_flush_lsn`` and ends at a bound fixed when the
drain starts (the server's flushed WAL position, lowered by ``max_bytes``) or at the first
commit after ``max_messages``, whichever comes first; it always ends on a commit boundary.
Its end LSN is where the slot may be advanced once the batch is applied:

* the last transaction's end LSN when the message limit cut the read short;
* the bound otherwise, even when nothing was published in between (an idle or filtered
  database must not pin WAL forever): every transaction committing before the bound has been
  read, and one committing after it is still ahead of the slot.

Staging is ``<staging>/<slot>/batch-<start LSN hex16>/`` (tables, then ``_manifest.json``
last). The start LSN names the batch because the slot cannot have moved while the batch is
unapplied, so a retry of the same drain finds its own complete batch and reuses it; a
directory without a manifest is a half-written attempt and is deleted and redone. One drain
per slot at a time: the drain's connection holds a lock on the slot's name while it runs.

One job per module: ``settings`` (:class:`DrainSettings`, :class:`DrainResult`), ``run`` (the
drain itself, :func:`drain_batch`), ``pipeline`` (the read, decode and stage loop) and ``stager``
(the part files and the table manifests). The names below are the package's public ones.
"""

from __future__ import annotations

from airflow_provider_postgres_cdc.engine.choices import Transport
from airflow_provider_postgres_cdc.engine.drain.run import drain_batch
from airflow_provider_postgres_cdc.engine.drain.settings import DrainResult, DrainSettings

__all__ = ["DrainResult", "DrainSettings", "Transport", "drain_batch"]
