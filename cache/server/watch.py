"""Whether the backend is reachable, watched for a server: probed at start and then every
PROBE_UP seconds (PROBE_DOWN while it is unreachable), each probe a connection of its own,
made within two seconds, that also refreshes what the backend reports to new sessions (a busy
pool is no outage). The server is ready
(``/readyz``) once the backend has been reached since it started; an outage after that keeps
it ready, since it still answers what its guards allow. Each outage and each recovery is
logged once, and the state is the ``mtcache_backend_up`` metric."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sql_ext.errors import BackendUnavailableError, first_line

log = logging.getLogger("mtcache.server")

PROBE_UP = 5.0  # seconds between probes while the backend is reachable
PROBE_DOWN = 1.0  # ... and while it is not


class BackendWatch:
    """See the module. ``probe`` raises `BackendUnavailableError` when the backend cannot be
    reached."""

    def __init__(self, probe: Callable[[], None]) -> None:
        self._probe = probe
        self.reached = False  # reached since the server started: ready
        self.up = False
        self._down_since: float | None = None  # `time.monotonic()` of the outage's first probe
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.check()  # (at once: the state is known before the first client)

    def check(self) -> bool:
        """Probe the backend now; whether it is reachable."""
        try:
            self._probe()
        except BackendUnavailableError as exc:
            self._unreachable(str(exc))
            return False
        except Exception as exc:  # (a bug: the watch goes on, and says so once per outage)
            if self._down_since is None:
                log.exception("probing the backend failed: %s", first_line(exc))
            self._unreachable(first_line(exc))
            return False
        was_up, down_since = self.up, self._down_since
        self.up = self.reached = True  # (before the log line: a reader may act on it)
        self._down_since = None
        if not was_up and down_since is not None:
            log.info(
                "the backend is reachable again after %.1f s: remote parts are answered again",
                time.monotonic() - down_since,
            )
        return True

    def _unreachable(self, why: str) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
            if self.reached:
                log.warning(
                    "%s: answering locally what the guards allow; statements that need the "
                    "backend fail with SQLSTATE 08006 until it is back",
                    why,
                )
            else:
                log.warning(
                    "%s at start: answering locally what the guards allow; statements that "
                    "need the backend fail with SQLSTATE 08006, and /readyz answers 503 until "
                    "the backend is reached",
                    why,
                )
        self.up = False

    def start(self) -> None:
        """Probe in a thread of its own until `stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="mtcache-watch")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(PROBE_UP if self.up else PROBE_DOWN):
            self.check()


__all__ = ["PROBE_DOWN", "PROBE_UP", "BackendWatch"]
