"""pgoutput logical replication decoding: bytes in, typed messages and Arrow change tables out.

No Airflow and no I/O here. Import from the modules; this package module imports none of them, so
reading one Begin message (:mod:`.decoder`, :mod:`.messages`, :mod:`.wire`: standard library
only) does not load numpy and pyarrow, which the Airflow faces must not pay for at DAG parse time.

* :mod:`.columnar`: :class:`~.columnar.BatchDecoder`, the drain's decoder (many messages at once);
* :mod:`.arrow`: what it returns (:class:`~.arrow.DecodedBatch`, :class:`~.arrow.TableChanges`);
* :mod:`.decoder`: :class:`~.decoder.PgOutputDecoder`, one message at a time (control messages,
  precise errors, ``pgcdc peek``), with the message classes of :mod:`.messages` and the byte
  layouts of :mod:`.wire`.
"""
