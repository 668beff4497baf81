"""The `mtcache` command line. Environment variables are read here and nowhere else.

    mtcache [--backend DSN] [--cache FILE] COMMAND ...

Errors print one line to stderr and exit 1 (2 for usage errors, from argparse).

A module a command family: `query` (parse, explain, query), `admin` (init, ddl, admit, evict,
refresh), `status`, `serve` and `backend` (demo, heartbeat, stop); `access` is how they reach
the cache file; `wiring` holds the arguments, the settings and `main` (pyproject.toml's
``mtcache`` script, and ``python -m cache.tools.cli``).
"""

from cache.tools.cli.wiring import main

__all__ = ["main"]
