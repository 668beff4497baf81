"""A worker's output to its client's socket: written by the worker itself, through a
descriptor of its own, waiting while the client does not read (backpressure)."""

from __future__ import annotations

import os
import select
from collections.abc import Callable


def write_all(fd: int, data: bytes, gone: Callable[[], bool]) -> None:
    """Write ``data`` to the socket ``fd`` (non-blocking), waiting while it takes no more;
    `ConnectionError` when ``gone()`` says the client went away meanwhile."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            _wait_writable(fd, 1.0)
            if gone():
                raise ConnectionError("the client went away") from None


def _wait_writable(fd: int, timeout: float) -> None:
    """Until the socket ``fd`` takes more output (or ``timeout`` seconds pass); poll, not
    select: a server with hundreds of sessions has descriptors past select's 1024."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT | select.POLLERR | select.POLLHUP)
    poller.poll(timeout * 1000)


__all__ = ["write_all"]
