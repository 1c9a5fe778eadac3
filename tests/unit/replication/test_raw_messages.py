"""The peek's binary COPY framing around pgoutput messages: rows are found from the message sizes when
each message holds one row, else without a per-row loop, also when message bytes look like row headers
and when a chunk ends anywhere."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from airflow_provider_postgres_cdc.errors import TransportError
from airflow_provider_postgres_cdc.replication.raw_messages import framed_rows, split_rows

_HEAD = struct.Struct("!hiQiIi")


def _row(lsn: int, xid: int, payload: bytes) -> bytes:
    return _HEAD.pack(3, 8, lsn, 4, xid, len(payload)) + payload


def _payload(rng: random.Random) -> bytes:
    """Bytes drawn from the header's own alphabet, sometimes a whole fake header inside."""
    size = rng.choice([0, 1, 5, 26, 40, 200])
    payload = bytes(rng.choice([0, 3, 4, 8, 255]) for _ in range(size))
    if size >= _HEAD.size and rng.random() < 0.3:
        payload = _row(5, 6, payload)[:size]
    return payload


@pytest.mark.parametrize("seed", range(400))
def test_rows_are_found_wherever_the_chunk_ends(seed: int) -> None:
    rng = random.Random(seed)
    rows = [(rng.getrandbits(40), rng.getrandbits(32), _payload(rng)) for _ in range(rng.randint(0, 30))]
    encoded = [_row(*row) for row in rows]
    stream = b"".join(encoded) + b"\xff\xff"
    cut = rng.randint(0, len(stream))
    data = stream[:cut]
    raw, rest, done = split_rows(data, 0)
    whole, position = 0, 0
    while whole < len(rows) and position + len(encoded[whole]) <= cut:
        position += len(encoded[whole])
        whole += 1
    assert done == (cut == len(stream))
    assert rest == (len(stream) if done else position)
    assert [raw.message(i) for i in range(len(raw))] == [payload for _, _, payload in rows[:whole]]
    assert raw.lsns.tolist() == [lsn for lsn, _, _ in rows[:whole]]
    assert raw.xids.tolist() == [xid for _, xid, _ in rows[:whole]]
    assert np.all(raw.offsets[1:] > raw.offsets[:-1])


def test_a_row_of_another_shape_is_refused() -> None:
    data = _row(1, 2, b"ok") + struct.pack("!h", 2) + bytes(30)
    with pytest.raises(TransportError, match="2 fields"):
        split_rows(data, 0)


_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)


@pytest.mark.parametrize("seed", range(50))
def test_rows_one_per_message_are_indexed_from_the_message_sizes(seed: int) -> None:
    """As the server sends them: the file header with the first row, the trailer alone."""
    rng = random.Random(seed)
    rows = [
        (rng.getrandbits(40), rng.getrandbits(32), _payload(rng) or b"x") for _ in range(rng.randint(1, 30))
    ]
    messages = [_row(*row) for row in rows] + [b"\xff\xff"]
    messages[0] = _HEADER + messages[0]
    sizes = np.array([len(m) for m in messages], dtype=np.int64)
    framed = framed_rows(b"".join(messages) + bytes(16), sizes, len(_HEADER))
    assert framed is not None
    raw, done = framed
    assert done
    assert [raw.message(i) for i in range(len(raw))] == [payload for _, _, payload in rows]
    assert raw.lsns.tolist() == [lsn for lsn, _, _ in rows]
    assert raw.xids.tolist() == [xid for _, xid, _ in rows]


def test_messages_that_are_not_one_row_each_are_left_to_the_byte_search() -> None:
    stream = _row(1, 2, b"first") + _row(3, 4, b"second")
    for cut in (10, 29, len(_row(1, 2, b"first")) + 3):
        sizes = np.array([cut, len(stream) - cut], dtype=np.int64)
        assert framed_rows(stream + bytes(16), sizes, 0) is None
    sizes = np.array([len(_row(1, 2, b"first")), len(_row(3, 4, b"second"))], dtype=np.int64)
    assert framed_rows(stream + bytes(16), sizes, 0) is not None
