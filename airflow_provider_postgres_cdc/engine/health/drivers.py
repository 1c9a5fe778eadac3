"""Run an I/O-free query generator over a psycopg2 connection, blocking or under asyncio.

The protocol follows psycopg 3's ``generators``/``waiting`` split: the code that knows *what* to
ask (here, which SQL to run and what the rows mean) is a generator that does no I/O. It yields
``(sql, params)`` (a :data:`Query`), is sent the result rows (:data:`Rows`, empty for a statement
without a result), has a failed query's ``psycopg2.Error`` thrown back into it (so it may recover,
e.g. record why a peek failed), and returns its result. The drivers here own the *how*:
:func:`drive` on a blocking connection, :func:`drive_async` on an asynchronous one, whose waits go
to the event loop (:func:`wait_async`), so a trigger never blocks. Any generator of that shape
runs on either, which is what lets the sensor, the trigger, the hook and the CLI share one
measurement.

Both drivers expect an autocommit connection (asynchronous ones always are): a query that fails
then aborts nothing, and the generator may go on after it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Generator, Mapping, Sequence
from typing import Any, TypeVar

import psycopg2
import psycopg2.extensions

from airflow_provider_postgres_cdc.replication.connection import libpq_arguments

__all__ = ["Query", "Rows", "connect_async", "drive", "drive_async", "resolve_host_async", "wait_async"]

Query = tuple[str, Sequence[Any] | Mapping[str, Any] | None]
"""One step of a query generator: the SQL and its parameters, as ``cursor.execute`` takes them."""
Rows = list[tuple[Any, ...]]
"""What a query generator is sent back: every row of the step's result."""
ResultT = TypeVar("ResultT")


def drive(conn: Any, steps: Generator[Query, Rows, ResultT]) -> ResultT:
    """Run a query generator on a blocking connection and return what the generator returns."""
    try:
        query = next(steps)
        while True:
            try:
                with conn.cursor() as cursor:
                    cursor.execute(*query)
                    rows = list(cursor.fetchall()) if cursor.description else []
            except psycopg2.Error as exc:
                query = steps.throw(exc)
            else:
                query = steps.send(rows)
    except StopIteration as stop:
        result: ResultT = stop.value
        return result


async def drive_async(conn: Any, steps: Generator[Query, Rows, ResultT]) -> ResultT:
    """Run a query generator on an asynchronous connection (see :func:`connect_async`)."""
    try:
        query = next(steps)
        while True:
            cursor = conn.cursor()
            try:
                cursor.execute(*query)
                await wait_async(conn)
                rows = list(cursor.fetchall()) if cursor.description else []
            except psycopg2.Error as exc:
                query = steps.throw(exc)
            else:
                query = steps.send(rows)
            finally:
                cursor.close()
    except StopIteration as stop:
        result: ResultT = stop.value
        return result


async def wait_async(conn: Any) -> None:
    """Wait for an asynchronous psycopg2 connection to finish its current step, without blocking.

    ``poll()`` says whether libpq next needs the socket readable or writable; the event loop's
    reader/writer callbacks resolve a future when it is. The socket is read anew at each step
    because libpq may change it while connecting.
    """
    loop = asyncio.get_running_loop()
    while True:
        state = conn.poll()
        if state == psycopg2.extensions.POLL_OK:
            return
        fileno = conn.fileno()
        ready: asyncio.Future[None] = loop.create_future()

        def wake(future: asyncio.Future[None] = ready) -> None:
            if not future.done():
                future.set_result(None)

        if state == psycopg2.extensions.POLL_READ:
            loop.add_reader(fileno, wake)
            try:
                await ready
            finally:
                loop.remove_reader(fileno)
        elif state == psycopg2.extensions.POLL_WRITE:
            loop.add_writer(fileno, wake)
            try:
                await ready
            finally:
                loop.remove_writer(fileno)
        else:
            raise psycopg2.OperationalError(f"unexpected psycopg2 poll state {state}")


async def resolve_host_async(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the host name resolved through the event loop into ``hostaddr``.

    libpq resolves a host name inside ``PQconnectStart`` with a blocking ``getaddrinfo``; handing
    it the addresses keeps the connect non-blocking. Every address is kept (``host`` repeated to
    match, as libpq's multi-host syntax wants), so libpq still tries the next one when the first
    refuses, and ``host`` still names the server for TLS verification. Sockets, literal addresses
    and multi-host lists are passed through unchanged.
    """
    resolved = dict(params)
    host = str(params.get("host") or "")
    if not host or "hostaddr" in params or host.startswith("/") or "," in host:
        return resolved
    try:
        ipaddress.ip_address(host)
    except ValueError:
        address_infos = await asyncio.get_running_loop().getaddrinfo(
            host, params.get("port") or 5432, type=socket.SOCK_STREAM
        )
        addresses = list(dict.fromkeys(str(info[4][0]) for info in address_infos))
        resolved["host"] = ",".join([host] * len(addresses))
        resolved["hostaddr"] = ",".join(addresses)
    return resolved


async def connect_async(params: Mapping[str, Any], timeout: float) -> Any:
    """An asynchronous psycopg2 connection with the package's session settings and keepalives.

    libpq ignores ``connect_timeout`` in non-blocking mode, so the wait is bounded here, by
    ``asyncio.timeout``: Python 3.11's ``asyncio.wait_for`` can lose a cancellation that arrives as
    the connect completes, and a trigger cancelled by the triggerer then polled on forever.
    """
    dsn, kwargs = libpq_arguments(await resolve_host_async(params), {})
    conn = psycopg2.connect(dsn, async_=True, **kwargs)
    try:
        async with asyncio.timeout(timeout):
            await wait_async(conn)
    except BaseException:
        conn.close()
        raise
    return conn
