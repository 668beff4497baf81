"""The vocabulary random queries are made of: the TPC-H columns by type family and size, and
the literals, patterns and formats each family is drawn from."""

from __future__ import annotations

import re
import typing as t
from dataclasses import dataclass

from experiments.tpch import TABLES

Family = t.Literal["int", "numeric", "float", "text", "date", "timestamp", "interval", "bool"]
FAMILIES: tuple[Family, ...] = (
    "int",
    "numeric",
    "float",
    "text",
    "date",
    "timestamp",
    "interval",
    "bool",
)


@dataclass(frozen=True)
class Column:
    name: str
    family: Family
    sql_type: str  # as declared


def _columns(ddl: str) -> list[Column]:
    found = []
    for part in re.split(r",\s*(?![^()]*\))", ddl):
        words = part.split()
        if not words or words[0].upper() == "PRIMARY":
            continue
        declared = " ".join(words[1:]).replace("NOT NULL", "").replace("PRIMARY KEY", "").strip()
        lowered = declared.lower()
        family: Family = (
            "int"
            if lowered.startswith("integer")
            else "numeric"
            if lowered.startswith("numeric")
            else "date"
            if lowered.startswith("date")
            else "text"
        )
        found.append(Column(words[0], family, declared))
    return found


SCHEMA: dict[str, list[Column]] = {name: _columns(ddl) for name, ddl in TABLES.items()}
KEYS: dict[str, tuple[str, ...]] = {
    "region": ("r_regionkey",),
    "nation": ("n_nationkey",),
    "supplier": ("s_suppkey",),
    "customer": ("c_custkey",),
    "part": ("p_partkey",),
    "partsupp": ("ps_partkey", "ps_suppkey"),
    "orders": ("o_orderkey",),
    "lineitem": ("l_orderkey", "l_linenumber"),
}
# (child table, child columns, parent table, parent columns): the joins along keys
FOREIGN_KEYS: list[tuple[str, tuple[str, ...], str, tuple[str, ...]]] = [
    ("nation", ("n_regionkey",), "region", ("r_regionkey",)),
    ("supplier", ("s_nationkey",), "nation", ("n_nationkey",)),
    ("customer", ("c_nationkey",), "nation", ("n_nationkey",)),
    ("partsupp", ("ps_partkey",), "part", ("p_partkey",)),
    ("partsupp", ("ps_suppkey",), "supplier", ("s_suppkey",)),
    ("orders", ("o_custkey",), "customer", ("c_custkey",)),
    ("lineitem", ("l_orderkey",), "orders", ("o_orderkey",)),
    ("lineitem", ("l_partkey", "l_suppkey"), "partsupp", ("ps_partkey", "ps_suppkey")),
    ("lineitem", ("l_partkey",), "part", ("p_partkey",)),
    ("lineitem", ("l_suppkey",), "supplier", ("s_suppkey",)),
]
# rows at scale factor 0.01 (tables past a few thousand rows get a key range or a LIMIT)
SIZES = {
    "region": 5,
    "nation": 25,
    "supplier": 100,
    "customer": 1500,
    "part": 2000,
    "partsupp": 8000,
    "orders": 15000,
    "lineitem": 60175,
}
# a key range that keeps a big table's rows few: column, upper bound
NARROW = {
    "customer": ("c_custkey", 120),
    "part": ("p_partkey", 150),
    "partsupp": ("ps_partkey", 40),
    "orders": ("o_orderkey", 500),
    "lineitem": ("l_orderkey", 130),
}

TEXT_LITERALS = (
    "'A'",
    "'BRAZIL'",
    "'abc'",
    "''",
    "' '",
    "'a b '",
    "'ASIA'",
    "'1-URGENT'",
    "'Customer#000000001'",
    "'furiously'",
    "'O'",
    "'F'",
    "'MAIL'",
    "'x%y'",
    "'ÄÖü'",
    "'R'",
)
PATTERNS = (
    "'A%'",
    "'%ly%'",
    "'_A%'",
    "'%'",
    "''",
    "'%e'",
    "'B_AZ%'",
    "'%#%'",
    "'MED%'",
    "'% '",
    "'%1%'",
    "'Customer#00000001_'",
)
SIMILAR = ("'A%'", "'%(ly|ing)%'", "'[A-C]%'", "'%[0-9]'", "'(MED|SM)%'", "'_%'", "'%'")
# patterns for what a regular expression matched (regexp_replace, substring FROM): mostly
# ones whose match both engines end alike, a few that are not (alternation, a repetition
# meeting what follows), which stay at the backend with their reason
MATCH_REGEXES = (
    "'[0-9]+'",
    "'^[A-Z]+'",
    "'[aeiou]'",
    "'#0*'",
    "' +$'",
    "'[^ ]+'",
    "'([a-z]+) ([a-z]+)'",
    "'[A-Z][a-z]*'",
    "'^(.)'",
    "'[.,]'",
    "'(ly|ing)'",
    "'a*a'",
)
REPLACEMENTS = ("''", "'#'", "'<\\&>'", "'-'", "'X'")
# (table, integer column) a number series joins
SERIES_JOINS = (
    ("nation", "n_regionkey"),
    ("nation", "n_nationkey"),
    ("supplier", "s_nationkey"),
    ("customer", "c_nationkey"),
    ("part", "p_size"),
    ("lineitem", "l_linenumber"),
    ("region", "r_regionkey"),
)
REGEXES = ("'^A'", "'ly$'", "'[0-9]{3}'", "'^(AIR|MAIL)'", "' $'", "'a.c'", "'^$'")
DATES = (
    "DATE '1995-03-15'",
    "DATE '1994-01-01'",
    "DATE '1998-12-01'",
    "DATE '1992-02-29'",
    "'1996-07-04'::date",
    "date '1993-10-01'",
)
NUMERICS = (
    "1.5",
    "0.25",
    "100.00",
    "-3.125",
    "0.0",
    "2",
    "0.05",
    "1000",
    "1e3",
    "2.5e-1",
    "0.10",
    "-0.5",
)
TEXT_FUNCTIONS = ("upper", "lower", "initcap", "trim", "ltrim", "rtrim", "btrim", "reverse", "md5")
INTEGERS = ("0", "1", "2", "3", "7", "-3", "10", "25", "100", "-1")
INTERVALS = (
    "interval '1 day'",
    "interval '3 months'",
    "interval '1 year 2 days'",
    "interval '36 hours'",
    "interval '-7 days'",
    "interval '90 minutes'",
)
TO_CHAR_DATE = (
    "'YYYY-MM-DD'",
    "'Mon YYYY'",
    "'Day'",
    "'DD/MM/YY'",
    "'Month'",
    "'YYYY'",
    "'Q'",
    "'DDD'",
    "'HH24:MI:SS'",
    "'FMMonth DD'",
)
TO_CHAR_NUMBER = ("'999990.99'", "'FM9999.00'", "'0000'", "'9G999D9'")
