"""A faulty network between a cache server and its backend, for the chaos runs over the wire:
a TCP proxy (asyncio, in a thread of its own) that forwards bytes both ways and, when told,
delays them, drops every connection (closes it, as a peer that went away) or resets them
(an RST, as a network that broke). The server is given the proxy's address as its backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
import typing as t

_CHUNK = 65536


class FaultyNetwork:
    """Forwards 127.0.0.1:``port`` to ``target``; `delay`, `drop` and `reset` are faults."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._delay = 0.0
        self._delay_until = 0.0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="faulty-network")
        self._server: asyncio.base_events.Server | None = None
        self._thread.start()
        self._started.wait(10)
        assert self._server is not None, "the proxy did not start"
        self.port = int(self._server.sockets[0].getsockname()[1])

    # -- faults (from any thread) ----------------------------------------------------------

    def delay(self, seconds: float, for_seconds: float) -> None:
        """Every chunk waits ``seconds`` before it is forwarded, for ``for_seconds``."""
        self._delay, self._delay_until = seconds, time.monotonic() + for_seconds

    def drop(self) -> int:
        """Close every connection (FIN): how many there were."""
        return self._call(lambda: self._end(reset=False))

    def reset(self) -> int:
        """Reset every connection (RST): how many there were."""
        return self._call(lambda: self._end(reset=True))

    def close(self) -> None:
        """Stop forwarding: every connection and the listening socket closed, the loop too."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    # -- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self._started.set()
        loop = self._loop
        try:
            loop.run_forever()
        finally:  # (stopped by `close`): everything it holds closed, then the loop
            self._server.close()
            for writer in self._writers:
                writer.transport.abort()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

    def _call(self, what: t.Callable[[], int]) -> int:
        done: list[int] = []
        ready = threading.Event()

        def call() -> None:
            try:
                done.append(what())
            finally:
                ready.set()

        self._loop.call_soon_threadsafe(call)
        ready.wait(10)
        return done[0] if done else 0

    def _end(self, reset: bool) -> int:
        writers, self._writers = self._writers, set()
        for writer in writers:
            if reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:  # linger 0: the close sends RST
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                writer.transport.abort()
            else:
                writer.close()
        return len(writers) // 2

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )
        for end in (writer, up_writer):
            self._writers.discard(end)
            end.close()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(_CHUNK):
                if self._delay and time.monotonic() < self._delay_until:
                    await asyncio.sleep(self._delay)
                sink.write(data)
                await sink.drain()
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                sink.close()


__all__ = ["FaultyNetwork"]
