"""How the split peek sizes its calls: where it stops, and that it never asks past ``max_messages``."""

from __future__ import annotations

from airflow_provider_postgres_cdc.formats.lsn import Lsn
from airflow_provider_postgres_cdc.replication.peek_calls import (
    LATER_CALLS,
    MAX_CALLS,
    PeekCalls,
    worth_splitting,
)

START, END = Lsn(1_000_000), Lsn(2_000_000)


def test_a_call_that_returns_less_than_it_asked_for_ends_the_read() -> None:
    calls = PeekCalls(START, END, None, first=100)
    assert calls.first_limit() == 100
    assert calls.next_limit(returned=40, asked=100, reached=Lsn(1_100_000)) is None
    assert (calls.calls, calls.messages) == (1, 40)


def test_the_bound_ends_the_read_even_when_the_count_was_reached() -> None:
    calls = PeekCalls(START, END, None, first=100)
    assert calls.next_limit(returned=100, asked=100, reached=END) is None


def test_later_calls_share_the_estimated_rest_equally() -> None:
    calls = PeekCalls(START, END, None, first=100)
    # 100 messages in the first tenth of the window: about 900 left, in LATER_CALLS calls.
    limit = calls.next_limit(returned=100, asked=100, reached=Lsn(1_100_000))
    assert limit == 900 // LATER_CALLS + 1
    assert calls.next_limit(returned=limit, asked=limit, reached=Lsn(1_400_000)) == limit


def test_later_calls_never_ask_for_less_than_the_first() -> None:
    calls = PeekCalls(START, END, None, first=100)
    assert calls.next_limit(returned=100, asked=100, reached=Lsn(1_900_000)) == 100
    # No WAL progress to estimate from (a first call of only control messages): keep the first size.
    calls = PeekCalls(START, END, None, first=100)
    assert calls.next_limit(returned=100, asked=100, reached=START) == 100


def test_max_messages_caps_every_call_and_ends_the_read() -> None:
    calls = PeekCalls(START, END, 250, first=100)
    assert calls.first_limit() == 100
    assert calls.next_limit(returned=103, asked=100, reached=Lsn(1_010_000)) == 147
    assert calls.next_limit(returned=150, asked=147, reached=Lsn(1_030_000)) is None
    assert calls.messages == 253
    assert PeekCalls(START, END, 30, first=100).first_limit() == 30


def test_the_last_allowed_call_reads_to_the_bound() -> None:
    calls = PeekCalls(START, END, None, first=10)
    reached = START
    limits = []
    limit: int | None = calls.first_limit()
    while limit:
        limits.append(limit)
        reached = Lsn(reached + 1)  # a dense window: the estimate keeps the calls small
        limit = calls.next_limit(returned=limit, asked=limit, reached=reached)
    assert len(limits) == MAX_CALLS - 1
    assert limit == 0  # no limit: the next call is the last
    capped = PeekCalls(START, END, 10_000, first=10)
    for _ in range(MAX_CALLS - 2):
        capped.next_limit(returned=10, asked=10, reached=START)
    assert capped.next_limit(returned=10, asked=10, reached=START) == 10_000 - 10 * (MAX_CALLS - 1)


def test_huge_estimates_stay_within_sql_int() -> None:
    calls = PeekCalls(START, Lsn(2**62), None, first=1_000_000)
    assert calls.next_limit(returned=1_000_000, asked=1_000_000, reached=Lsn(START + 10)) == 2**31 - 1


def test_a_backlog_longer_than_the_window_is_read_in_one_call() -> None:
    assert worth_splitting(Lsn(900), Lsn(1000), Lsn(2000))
    assert not worth_splitting(Lsn(0), Lsn(1000), Lsn(1500))  # every call would re-read 1000 bytes
    assert not worth_splitting(Lsn(1000), Lsn(1000), Lsn(1000))  # nothing to read
