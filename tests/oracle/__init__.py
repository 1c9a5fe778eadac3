"""The test oracle: a plain, per-object route from pgoutput bytes to change tables.

The package decodes with :class:`~airflow_provider_postgres_cdc.pgoutput.columnar.BatchDecoder`,
which never makes a Python object per row or value. The tests and ``benchmarks/decode.py``
compare it with this slower route, built on the package's per-message decoder:
:mod:`.assembly` assembles decoded messages into committed transactions and :mod:`.tables` turns
them into the same typed tables.
"""
