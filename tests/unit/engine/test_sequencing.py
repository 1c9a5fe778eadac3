"""The sequencer against a captured protocol-2 session (streamed blocks, a subtransaction abort,
a whole-transaction abort, plain transactions, a Type message): whatever the chunking and
however small the memory budget, releasing committed transactions as plain protocol-1 pieces
and decoding those gives exactly what decoding the whole session at once gives."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_postgres_cdc.engine.sequencing import MemoryBudget, Piece, Sequencer
from airflow_provider_postgres_cdc.errors import SequencingError
from airflow_provider_postgres_cdc.pgoutput.columnar import BatchDecoder
from airflow_provider_postgres_cdc.replication.raw_messages import RawMessages

from ..conftest import Capture


def _chunks(capture: Capture, size: int) -> list[RawMessages]:
    pairs = list(zip(capture.lsns, capture.messages, strict=True))
    return [RawMessages.from_messages(pairs[i : i + size]) for i in range(0, len(pairs), size)]


def _decode_pieces(pieces: list[Piece]) -> dict[str, pa.Table]:
    """Decode pieces the way the drain does, carrying ``_pgl_seq`` into continuing pieces."""
    decoder = BatchDecoder(1)
    tables: dict[str, list[pa.Table]] = {}
    next_seq = 0
    for piece in pieces:
        raw = piece.raw
        first_seq = next_seq if piece.continues else 0
        prepared = decoder.prepare(raw.buffer, raw.offsets, raw.lengths, raw.lsns, first_seq=first_seq)
        next_seq = first_seq + prepared.last_changes
        for table in prepared.build().tables:
            tables.setdefault(table.relation.name, []).append(table.to_table())
    return {name: pa.concat_tables(parts) for name, parts in tables.items()}


@pytest.mark.parametrize("chunk", [1, 7, 250, 100_000])
@pytest.mark.parametrize("memory", [8 << 10, 512 << 20])
def test_pieces_decode_like_the_whole_session(
    captures: dict[str, Capture], tmp_path: Path, chunk: int, memory: int
) -> None:
    capture = captures["stream"]
    whole = BatchDecoder(capture.protocol_version).decode(capture.messages, capture.lsns)
    expected = {t.relation.name: t.to_table() for t in whole.tables}
    sequencer = Sequencer(MemoryBudget(memory), str(tmp_path))
    pieces = [piece for raw in _chunks(capture, chunk) for piece in sequencer.feed(raw)]
    sequencer.finish()
    staged = _decode_pieces(pieces)
    assert staged.keys() == expected.keys()
    for name, table in expected.items():
        assert staged[name].equals(table), name
    assert sequencer.commits == len(whole.transactions)
    assert sequencer.last_end == whole.end_lsn
    held_across_chunks = chunk < len(capture.messages)
    assert (sequencer.spilled_bytes > 0) == (memory < 1 << 20 and held_across_chunks)
    assert (len(pieces) > sequencer.commits) == (memory < 1 << 20)  # small budgets split transactions
    assert not list(tmp_path.iterdir())


def test_a_change_outside_any_transaction_is_refused(captures: dict[str, Capture]) -> None:
    capture = captures["proto1"]
    data = next(i for i, m in enumerate(capture.messages) if m[:1] == b"I")
    raw = RawMessages.from_messages([(capture.lsns[data], capture.messages[data])])
    with pytest.raises(SequencingError, match="outside any transaction"):
        list(Sequencer(MemoryBudget()).feed(raw))


def test_the_read_must_end_on_a_commit(captures: dict[str, Capture]) -> None:
    capture = captures["proto1"]
    begin = capture.messages.index(next(m for m in capture.messages if m[:1] == b"B"))
    sequencer = Sequencer(MemoryBudget())
    list(sequencer.feed(RawMessages.from_messages([(capture.lsns[begin], capture.messages[begin])])))
    with pytest.raises(SequencingError, match="inside a transaction"):
        sequencer.finish()
