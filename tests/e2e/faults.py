"""Real faults for the end-to-end tests: a database refusing connections, answers lost."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psycopg

from tests.conftest import POSTGRES_ADMIN_DSN


@contextmanager
def database_refusing(database_url: str) -> Iterator[None]:
    """PostgreSQL refuses every connection to this test's database and drops the open ones.

    ALLOW_CONNECTIONS false is PostgreSQL's own refusal (a FATAL at connect, as during a
    restart), and it touches only this test's database: other tests sharing the server go on.
    A TCP proxy would need the stack re-pointed at it and would fake only a network drop.
    """
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (name,),
        )
        try:
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


class AnswerDroppingProxy:
    """A TCP proxy in front of a server that loses the answers on its first ``drop`` connections:
    it passes the request on, waits until the answer begins (the server has done the work),
    then closes the client's connection without a byte of it. Later connections pass through."""

    def __init__(self, upstream_port: int, drop: int = 1) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.to_drop = drop
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.upstream)
            drop = self.dropped < self.to_drop
            self.dropped += drop
            threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
            answer = _lose_answer if drop else _pump
            threading.Thread(target=answer, args=(upstream, client), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _lose_answer(upstream: socket.socket, client: socket.socket) -> None:
    with suppress(OSError):
        upstream.recv(65536)  # the answer's first bytes: the request was handled
    for end in (client, upstream):
        with suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)  # wakes the request pump blocked on this socket
        end.close()
