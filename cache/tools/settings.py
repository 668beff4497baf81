"""Where the tools' cache lives and which backend it fronts: read from the command line and the
environment by the CLI (the only place that reads the environment), passed to every tool."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Settings:
    """Where the cache lives and which backend it fronts (None = the embedded default)."""

    cache_path: Path
    backend: str | None
    memory_limit: str | None = None  # what the cache file's DuckDB may use (None: its default)
    threads: int | None = None
    cache_size_limit: str | None = None  # the budget of the cached data's bytes (None: none)
    server: str | None = None  # a cache server to go through instead of the file (--server)
    spark_master: str | None = None  # where refreshes on Spark run (None: local[*])

    @property
    def embedded_root(self) -> Path:
        # The embedded cluster lives beside the cache file: one cache directory, one backend.
        return self.cache_path.parent / "pg"

    def backend_dsn(self) -> str:
        if self.backend:
            return self.backend
        if self.server:  # (the embedded cluster is the server's machine's, not this one's)
            from sql_ext.errors import ProgrammingError

            raise ProgrammingError(
                f"this command needs the backend itself, and --server {self.server} names "
                "only the cache server: give --backend too"
            )
        from cache.backend.embedded_pg import EmbeddedPostgres  # (not for --help)

        return EmbeddedPostgres(self.embedded_root).ensure_running()
