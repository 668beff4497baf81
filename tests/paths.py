"""Where the tests find the repository's files, wherever a test module lies under tests/."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CLIENTS = TESTS / "clients"  # the Java clients the server's tests compile and run
