"""A byte pipe in Python on uvloop: every client connection relayed to one backend address as
bytes, nothing read or decided. bench_server's (d) runs it beside the server and pgbouncer as
the floor of any relay written in Python (the event loop's turns and the socket calls a relay
cannot avoid), so what the server's own work adds can be told from what Python costs.

    python -m experiments.byte_pipe BACKEND_PORT   (prints the port it listens on)
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import typing as t

import uvloop

READ = 64 * 1024  # bytes read from the backend at a time


class _Pipe(asyncio.Protocol):
    """One client's connection and its own backend connection (a non-blocking socket the
    loop watches), each side's bytes written to the other as they come."""

    def __init__(self, backend_port: int) -> None:
        self.backend_port = backend_port
        self.transport: asyncio.Transport | None = None
        self.backend: socket.socket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = t.cast(asyncio.Transport, transport)  # (uvloop's is not a subclass)
        backend = socket.create_connection(("127.0.0.1", self.backend_port))
        backend.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        backend.setblocking(False)
        self.backend = backend
        asyncio.get_running_loop().add_reader(backend.fileno(), self._backend_readable)

    def data_received(self, data: bytes) -> None:
        assert self.backend is not None
        self.backend.sendall(data)  # (a benchmark's small messages: the socket takes them)

    def _backend_readable(self) -> None:
        assert self.backend is not None and self.transport is not None
        try:
            data = os.read(self.backend.fileno(), READ)
        except BlockingIOError:
            return
        if data:
            self.transport.write(data)
        else:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.backend is not None:
            asyncio.get_running_loop().remove_reader(self.backend.fileno())
            self.backend.close()
            self.backend = None


async def _serve(backend_port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Pipe(backend_port), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m experiments.byte_pipe BACKEND_PORT", file=sys.stderr)
        return 1
    uvloop.run(_serve(int(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
