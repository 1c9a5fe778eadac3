"""PostgreSQL values as Arrow: the type mapping, overflow siblings and SQL_ASCII text.

Shared by the pgoutput decoder and the snapshot's COPY reader; pyarrow and numpy, no I/O.
"""
