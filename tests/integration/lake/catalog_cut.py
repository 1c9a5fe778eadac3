"""A REST catalog that goes down at the worst moment: when a job sends a table's commit.

``CatalogCut`` forwards a loopback port to a real Iceberg REST catalog (SeaweedFS's), reading the
requests it passes on. Once armed, the commit of the table it watches (``POST …/tables/<name>``)
is not forwarded: the proxy closes every connection and stops listening, so the client sees the
catalog vanish mid-request and every later request is refused, as when the catalog's host goes
down between a job's writes and its commit.
"""

from __future__ import annotations

import re
import socket
import threading
from urllib.parse import quote


class CatalogCut:
    """A loopback proxy in front of ``host:port`` that cuts the catalog off at ``table``'s commit."""

    def __init__(self, host: str, port: int, table: str) -> None:
        self.target = (host, port)
        self._commit = re.compile(rb"POST /\S*/tables/" + re.escape(quote(table).encode()) + rb" HTTP/")
        self.armed = threading.Event()
        self.cut = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="catalog-cut", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop forwarding (also what the cut does)."""
        self.cut.set()
        self._listener.close()
        with self._lock:
            for sock in self._open:
                sock.close()

    def _accept(self) -> None:
        while not self.cut.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed by the cut
                return
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._open += [client, upstream]
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._responses, args=(upstream, client), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        """Pass on whole requests (head and ``Content-Length`` body) until the armed commit."""
        pending = b""
        try:
            while True:
                while b"\r\n\r\n" not in pending:
                    pending += _receive(client)
                head, pending = pending.split(b"\r\n\r\n", 1)
                found = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                length = int(found[1]) if found else 0
                while len(pending) < length:
                    pending += _receive(client)
                body, pending = pending[:length], pending[length:]
                if self.armed.is_set() and self._commit.match(head):
                    self.close()
                    return
                upstream.sendall(head + b"\r\n\r\n" + body)
        except OSError:
            return

    @staticmethod
    def _responses(upstream: socket.socket, client: socket.socket) -> None:
        try:
            while data := upstream.recv(65536):
                client.sendall(data)
        except OSError:
            return
        finally:
            client.close()


def _receive(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    if not data:
        raise ConnectionResetError("closed")
    return data
