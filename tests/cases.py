"""Reader of the data-driven fixture files under tests/fixtures/.

A file is a sequence of cases:

    -- case: <name>
    <SQL, one or more lines>
    -- expect: <JSON on one line>          (or)
    -- error: <line>:<column> <text the message contains>
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


@dataclass(frozen=True)
class Case:
    name: str
    sql: str
    expect: Any = None
    error: tuple[int, int, str] | None = None


def load_cases(filename: str) -> list[Case]:
    cases: list[Case] = []
    name: str | None = None
    sql: list[str] = []
    for raw in (FIXTURES / filename).read_text().splitlines():
        line = raw.rstrip()
        if line.startswith("-- case:"):
            assert name is None, f"{filename}: case {name!r} has no expect or error line"
            name, sql = line.removeprefix("-- case:").strip(), []
        elif line.startswith("-- expect:"):
            assert name is not None, f"{filename}: expect before case"
            cases.append(Case(name, "\n".join(sql).strip(), expect=json.loads(line[10:])))
            name = None
        elif line.startswith("-- error:"):
            assert name is not None, f"{filename}: error before case"
            where, _, text = line.removeprefix("-- error:").strip().partition(" ")
            row, col = (int(x) for x in where.split(":"))
            cases.append(Case(name, "\n".join(sql).strip(), error=(row, col, text)))
            name = None
        elif name is not None and not line.startswith("--"):
            sql.append(raw)
    assert name is None, f"{filename}: case {name!r} has no expect or error line"
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), f"{filename}: duplicate case names"
    return cases


def ids(cases: list[Case]) -> list[str]:
    return [c.name for c in cases]
