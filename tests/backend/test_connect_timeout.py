"""A backend that accepts a connection but never answers (a hung host, a half-open network)
fails a connection within the cache's connect timeout instead of holding the session for
minutes (no database: a socket that listens and says nothing)."""

from __future__ import annotations

import socket

import pytest

from cache.backend import reflect
from cache.backend.reflect import connect_backend
from sql_ext.errors import BackendUnavailableError


def test_a_silent_backend_fails_the_connection_within_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reflect, "CONNECT_SECONDS", 1)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (the backlog), never answers
        port = silent.getsockname()[1]
        with pytest.raises(BackendUnavailableError, match="timeout"):
            connect_backend(f"host=127.0.0.1 port={port} user=x dbname=x")
