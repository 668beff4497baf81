"""The operator's configuration (no database): a TOML file of the command line's options, the
environment's MTCACHE_<KEY>, and their precedence (a flag, the environment, the file, the
default); what the file cannot hold refused in one line with its line number."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cache.config import connection_setting
from cache.tools.cli.wiring import build_parser, configure
from sql_ext.errors import ProgrammingError

FILE = """\
# an operator's file
backend = "postgresql://app@db.example/shop"
threads = 2

[serve]
listen = "0.0.0.0:6432"
pool_size = 20
statement_timeout = 2000   # ms, as PostgreSQL's statement_timeout
currency_bound = "10min"
"""


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MTCACHE_"):
            monkeypatch.delenv(name)


def _parsed(argv: list[str]) -> dict[str, object]:
    parser = build_parser()
    configure(parser, argv)
    return vars(parser.parse_args(argv))


def test_the_file_gives_defaults_the_environment_and_flags_override(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "mtcache.toml"
    config.write_text(FILE)
    args = _parsed(["--config", str(config), "serve"])
    assert args["backend"] == "postgresql://app@db.example/shop" and args["threads"] == 2
    assert (args["listen"], args["pool_size"]) == ("0.0.0.0:6432", 20)
    assert (args["statement_timeout"], args["currency_bound"]) == ("2000", "10min")
    monkeypatch.setenv("MTCACHE_POOL_SIZE", "5")
    monkeypatch.setenv("MTCACHE_THREADS", "3")
    args = _parsed(["--config", str(config), "serve"])
    assert (args["pool_size"], args["threads"]) == (5, 3)  # the environment over the file
    args = _parsed(["--config", str(config), "--threads", "4", "serve", "--pool-size", "7"])
    assert (args["pool_size"], args["threads"]) == (7, 4)  # a flag over both
    monkeypatch.setenv("MTCACHE_CONFIG", str(config))  # the file named by the environment
    assert _parsed(["serve"])["listen"] == "0.0.0.0:6432"
    assert _parsed(["status"])["backend"] == "postgresql://app@db.example/shop"


@pytest.mark.parametrize(
    "text, says",
    [
        ("threds = 2\n", "line 1: threds: no such option"),
        ('backend = "x"\n\n[serve]\npool_sise = 2\n', "line 4: [serve] pool_sise: mtcache serve"),
        ("[serv]\nlisten = 1\n", "line 1: [serv] is no command"),
        ('threads = "many"\n', "line 1: threads must be a number, not 'many'"),
        ("[refresh]\nengine = 'fast'\n", "line 2: [refresh] engine must be one of auto"),
        ("backend = [1, 2]\n", "line 1: backend must be text or a number"),
        ("threads = \n", "not TOML"),
    ],
)
def test_what_the_file_cannot_hold_is_refused_with_its_line(
    tmp_path: Path, text: str, says: str
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(text)
    with pytest.raises(ProgrammingError, match=r".*") as refused:
        _parsed(["--config", str(config), "status"])
    assert says in str(refused.value) and str(config) in str(refused.value)


def test_the_command_line_says_it_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[serve]\npool_size = 'lots'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTCACHE_")}
    done = subprocess.run(
        [sys.executable, "-m", "cache.tools.cli", "--config", str(config), "serve"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"{config} line 2: [serve] pool_size must be a number" in done.stderr


def test_connect_reads_the_same_file_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "mtcache.toml"
    config.write_text(FILE + "\n")
    assert connection_setting("backend", None) is None  # nothing configured
    monkeypatch.setenv("MTCACHE_CONFIG", str(config))
    assert connection_setting("backend", None) == "postgresql://app@db.example/shop"
    monkeypatch.setenv("MTCACHE_BACKEND", "postgresql://env@h/db")
    assert connection_setting("backend", None) == "postgresql://env@h/db"
    assert connection_setting("backend", "given") == "given"
    config.write_text("cache = 5\n")
    with pytest.raises(ProgrammingError, match="line 1: cache must be text"):
        connection_setting("cache", None)
