"""The README's quickstart, run as written (issue 53): in a fresh directory, with the
project's virtualenv linked in as `.venv`, each ``sh`` block runs as one bash script (the one
marked ``sh server`` starts in the background, as the second terminal the page describes, and
is stopped with Ctrl-C's SIGINT at the end), the ``python`` block runs with the virtualenv's
Python, and each ``text`` block's lines must appear in the output of the block before it
(durations masked: "0.1s old" stands for any age). The server listens where
``MTCACHE_LISTEN`` says (a free port: the suite may run beside a server on 6432); the Python
block's URL is pointed there. The manual's bookstore commands (the cache DDL and clause
pages) run too, on the suite's bookstore; every other command a page shows is checked against
the CLI's parser (`test_every_command_the_docs_show_parses`): a server listening beyond
loopback with TLS, a remote backend."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cache.store.served import served_at
from cache.tools.cli.wiring import build_parser, parse_arguments
from tests.conftest import reachable_tempdir
from tests.serving import Log

ROOT = Path(__file__).parents[1]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```$", re.M | re.S)
DURATION = re.compile(r"\d+(?:\.\d+)?s\b")
README_SERVER = "127.0.0.1:6432"  # where the page's Python connects (`mtcache serve`'s default)
SETTLE = 60.0  # seconds a block that changes the backend may take to show in the cache


def quickstart() -> list[tuple[str, str]]:
    """The quickstart's fenced blocks, in order: (info string, body)."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Quickstart")
    end = text.index("\n## ", start + 1)
    return [(m.group(1).strip(), m.group(2)) for m in FENCE.finditer(text[start:end])]


def masked(line: str) -> str:
    return DURATION.sub("Ns", line.rstrip())


def shown_in(expected: str, output: str) -> list[str]:
    """The expected lines missing from the output."""
    lines = {masked(line) for line in output.splitlines()}
    return [line for line in expected.splitlines() if line.strip() and masked(line) not in lines]


@pytest.mark.backend
def test_the_quickstart_runs_as_written() -> None:
    home = reachable_tempdir("mtcache-readme-")
    (home / ".venv").symlink_to(Path(sys.executable).parents[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("MTCACHE_")}
    env["MTCACHE_LISTEN"] = "127.0.0.1:0"
    env.pop("VIRTUAL_ENV", None)
    blocks = quickstart()
    assert [info for info, _ in blocks].count("sh server") == 1
    assert "python" in [info for info, _ in blocks]
    server: subprocess.Popen[str] | None = None
    log: Log | None = None
    previous: tuple[str, str] | None = None  # (block, its output)

    def run(info: str, body: str) -> subprocess.CompletedProcess[str]:
        if info == "python":
            address = served_at(home / ".mtcache" / "cache.duckdb")
            assert address is not None, "the python block needs the server"
            argv = [
                str(home / ".venv" / "bin" / "python"),
                "-c",
                body.replace(README_SERVER, address.address),
            ]
        else:
            argv = ["bash", "-c", f"set -euo pipefail\n. .venv/bin/activate\n{body}"]
        return subprocess.run(
            argv, cwd=home, env=env, text=True, capture_output=True, timeout=300, check=False
        )

    try:
        for info, body in blocks:
            if info == "sh server":
                command = f". .venv/bin/activate && exec {body.strip()}"
                server = subprocess.Popen(
                    ["bash", "-c", command],
                    cwd=home,
                    env=env,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                assert server.stderr is not None
                log = Log(server.stderr)
                log.wait_for("listening on")
                previous = None
            elif info == "text":
                assert previous is not None, f"output shown for no command: {body}"
                block, output = previous
                missing = shown_in(body, output)
                deadline = time.monotonic() + SETTLE
                while missing and time.monotonic() < deadline:
                    # (an update reaches the cache from the stream within a moment)
                    time.sleep(0.5)
                    done = run(*block)  # type: ignore[arg-type]
                    assert done.returncode == 0, done.stderr
                    missing = shown_in(body, done.stdout + done.stderr)
                assert missing == [], f"{block[1]!r} printed {output!r}"
            else:
                assert info in ("sh", "python"), info
                done = run(info, body)
                assert done.returncode == 0, f"{body!r}: {done.stderr}"
                previous = ((info, body), done.stdout + done.stderr)  # type: ignore[assignment]
        status = run("sh", "mtcache status")  # (the page's closing words)
        assert status.returncode == 0 and "products_cache" in status.stdout, status.stderr
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)  # Ctrl-C
            code = server.wait(60)
            if log is not None:
                log.close()
            assert server.stderr is not None
            server.stderr.close()
            assert code == 0, "".join(log.lines if log is not None else [])
        stopped = run("sh", "mtcache stop")
        assert stopped.returncode == 0, stopped.stderr


# -- the manual's commands, against the CLI's parser -----------------------------------------------

START = re.compile(r"^\s*(?:\$ )?mtcache ")


def shown_commands() -> list[tuple[str, str]]:
    """(page, command) for each `mtcache ...` command of a code block or indented example (a
    quoted argument may go on over the next lines)."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        blocks = [m.group(2) for m in FENCE.finditer(text)]
        blocks += re.findall(r"(?:^(?: {4}|\t).*\n)+", text, re.M)
        for block in blocks:
            lines = block.splitlines()
            for i, line in enumerate(lines):
                if not START.match(line):
                    continue
                command = START.sub("mtcache ", line, count=1).split("  #", 1)[0]
                for more in [*lines[i + 1 : i + 12], None]:
                    try:
                        shlex.split(command)
                        break
                    except ValueError:
                        if more is None:
                            raise AssertionError(f"{page}: unfinished {command!r}") from None
                        command += "\n" + more
                found.append((str(page.relative_to(ROOT)), command.rstrip("\\ ")))
    return found


@pytest.mark.parametrize("page, command", shown_commands())
def test_every_command_the_docs_show_parses(page: str, command: str) -> None:
    """A command a page shows still exists with the options it uses (a renamed option or
    command fails here, not in a reader's terminal)."""
    words = shlex.split(command.replace("\\\n", " "), comments=True)[1:]
    words = [w for w in words if w not in ("...",)]
    parser = build_parser()
    parser.exit_on_error = False
    try:
        parse_arguments(parser, words)
    except SystemExit as exc:
        raise AssertionError(f"{page}: {command!r} is refused by the CLI's parser") from exc


# -- the manual's bookstore commands, run -----------------------------------------------------

MANUAL = ("docs/cache-ddl.md", "docs/clause.md")  # in this order: the clause page explains a
# query over the views the DDL page caches
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def manual_sessions() -> list[tuple[str, str, list[str]]]:
    """(page, command, the output the page shows) for each `$ mtcache ...` of the pages."""
    found = []
    for name in MANUAL:
        lines = (ROOT / name).read_text().splitlines()
        at = 0
        while at < len(lines):
            line = lines[at]
            if not line.startswith("    $ mtcache "):
                at += 1
                continue
            command = line[len("    $ ") :]
            at += 1
            while True:  # (a quoted argument may go on over the next lines)
                try:
                    shlex.split(command)
                    break
                except ValueError:
                    command += "\n" + lines[at].strip()
                    at += 1
            shown = []
            while at < len(lines) and lines[at].startswith("    ") and "$ " not in lines[at][:6]:
                shown.append(lines[at][4:])
                at += 1
            found.append((name, command, shown))
    return found


@pytest.mark.backend
def test_the_manuals_bookstore_commands_run_as_shown(
    bookstore_dsn: str, mtcache_bin: str, clean_env: dict[str, str]
) -> None:
    """The cache DDL and clause pages' commands, run in order on the bookstore: each exits as
    the page shows (an error line shown: exit 1 and that line), and the first line of what it
    prints is the page's (numbers masked: ages, costs and times vary). The JSON document the
    page shows pretty-printed is compared as JSON."""
    home = reachable_tempdir("mtcache-manual-")
    env = dict(clean_env, MTCACHE_BACKEND=bookstore_dsn, MTCACHE_CACHE=str(home / "cache.duckdb"))
    sessions = manual_sessions()
    assert len(sessions) >= 8
    for page, command, shown in sessions:
        done = subprocess.run(
            [mtcache_bin, *shlex.split(command)[1:]],
            cwd=ROOT,
            env=env,
            text=True,
            capture_output=True,
            timeout=300,
            check=False,
        )
        said = (done.stdout or done.stderr).replace(
            str(home / "cache.duckdb"), ".mtcache/cache.duckdb"
        )
        if shown and shown[0].startswith("mtcache: "):
            assert done.returncode == 1, f"{page}: {command!r} did not fail: {said}"
            assert done.stderr.strip() == shown[0], f"{page}: {command!r}"
            continue
        assert done.returncode == 0, f"{page}: {command!r}: {done.stderr}"
        if not shown:
            continue
        if shown[0].startswith("{"):
            assert json.loads(said) == json.loads("".join(shown)), f"{page}: {command!r}"
            continue
        first = said.splitlines()[0]
        assert NUMBER.sub("N", first) == NUMBER.sub("N", shown[0]), f"{page}: {command!r}"
