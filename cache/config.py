"""An operator's configuration, read the same way by the command line and `cache.connect`.

A TOML file (``mtcache --config FILE``, or ``MTCACHE_CONFIG``) holds any option the command
line takes. The command's long options are its keys (``backend``, ``cache``, ``threads``),
and a command's own options sit in a table named after the command (``[serve]``:
``listen``, ``pool_size``, ``statement_timeout``, ...). The environment holds the same
options as ``MTCACHE_<KEY>`` (``MTCACHE_POOL_SIZE``).

Precedence, highest first: a flag on the command line, the environment, the file, the
default. A key the file cannot hold is refused with its line (`Unknown`, checked by the
command line, which knows the options).
"""

from __future__ import annotations

import os
import re
import tomllib
import typing as t
from dataclasses import dataclass, field
from pathlib import Path

from sql_ext.errors import ProgrammingError

CONFIG_VARIABLE = "MTCACHE_CONFIG"  # the file, when no --config names one


def variable(key: str) -> str:
    """The environment variable of an option (``pool_size``: ``MTCACHE_POOL_SIZE``)."""
    return "MTCACHE_" + key.upper()


@dataclass(frozen=True)
class ConfigFile:
    """A configuration file read: its top-level keys, and its tables by name."""

    path: Path
    text: str
    values: dict[str, t.Any] = field(default_factory=dict)
    tables: dict[str, dict[str, t.Any]] = field(default_factory=dict)

    def line_of(self, key: str, table: str | None = None) -> int:
        """The line that sets ``key`` (in ``[table]``), for messages (1 when not found)."""
        current = None
        for number, line in enumerate(self.text.splitlines(), 1):
            header = re.match(r"\s*\[\s*([^\]\s]+)\s*\]", line)
            if header:
                current = header.group(1).strip("\"'")
            elif current == table and re.match(rf"\s*[\"']?{re.escape(key)}[\"']?\s*=", line):
                return number
        return 1

    def where(self, key: str, table: str | None = None) -> str:
        """``FILE line N: [table] key`` for messages."""
        return f"{self.path} line {self.line_of(key, table)}: {f'[{table}] ' if table else ''}{key}"


def read_config(path: str | Path) -> ConfigFile:
    """The file at ``path``, or a one-line `ProgrammingError` saying what is wrong with it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProgrammingError(f"cannot read the configuration file {path}: {exc}") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProgrammingError(f"{path}: not TOML: {exc}") from None
    values = {k: v for k, v in document.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in document.items() if isinstance(v, dict)}
    return ConfigFile(path, text, values, tables)


def configured_file(given: str | None = None) -> ConfigFile | None:
    """The configuration in force: the file ``given`` (``--config``), else the environment's
    ``MTCACHE_CONFIG``, else none."""
    path = given or os.environ.get(CONFIG_VARIABLE)
    return read_config(path) if path else None


def connection_setting(key: str, given: t.Any) -> t.Any:
    """A `cache.connect` argument by the same precedence as the command line's options: the
    argument, else ``MTCACHE_<KEY>``, else the configuration file's top-level ``key``."""
    if given is not None:
        return given
    if os.environ.get(variable(key)):
        return os.environ[variable(key)]
    config = configured_file()
    if config is None:
        return None
    value = config.values.get(key)
    if value is not None and not isinstance(value, str):
        raise ProgrammingError(f"{config.where(key)} must be text, not {value!r}")
    return value


__all__ = [
    "CONFIG_VARIABLE",
    "ConfigFile",
    "configured_file",
    "connection_setting",
    "read_config",
    "variable",
]
