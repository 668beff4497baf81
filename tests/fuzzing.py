"""Inputs for the property-based fuzzing of tests/experiments/test_fuzz.py (hypothesis
strategies), and what the properties compare: a cache file's contents, PostgreSQL's answer.

The run's size scales with ``MTCACHE_FUZZ_SCALE`` (default 1: the short run of ``make test``;
``python -m experiments.fuzz`` runs the same properties many times longer).
"""

from __future__ import annotations

import datetime as dt
import decimal
import os
import typing as t

import duckdb
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

SCALE = float(os.environ.get("MTCACHE_FUZZ_SCALE", "1"))
# A long run explores new inputs each time (its seed is printed); the short run is seeded.
RANDOM = os.environ.get("MTCACHE_FUZZ_RANDOM") == "1"


def fuzz_settings(examples: int) -> settings:
    """``examples`` per property in the short run, scaled for long runs. The deadline only
    catches hangs (an example that takes minutes), it is not a speed test."""
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=dt.timedelta(seconds=120),
        derandomize=not RANDOM,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
        ],
        print_blob=True,
    )


# -- text that is SQL-like, or not at all ------------------------------------------------------

WORDS = [
    "SELECT",
    "FROM",
    "WHERE",
    "AND",
    "OR",
    "NOT",
    "IN",
    "BETWEEN",
    "LIKE",
    "IS",
    "NULL",
    "GROUP",
    "BY",
    "ORDER",
    "HAVING",
    "LIMIT",
    "OFFSET",
    "JOIN",
    "ON",
    "AS",
    "UNION",
    "ALL",
    "DISTINCT",
    "CASE",
    "WHEN",
    "THEN",
    "ELSE",
    "END",
    "EXISTS",
    "WITH",
    "CURRENCY",
    "BOUND",
    "MIN",
    "SEC",
    "MS",
    "HOUR",
    "DAY",
    "TIMEORDERED",
    "BEGIN",
    "CREATE",
    "CACHED",
    "VIEW",
    "CONTROL",
    "TABLE",
    "PRESENCE",
    "CONSISTENCY",
    "COMPLETENESS",
    "ROOT",
    "REFRESH",
    "EVERY",
    "DROP",
    "INSERT",
    "INTO",
    "VALUES",
    "UPDATE",
    "SET",
    "DELETE",
    "EXPLAIN",
    "RESET",
    "SHOW",
    "authors",
    "books",
    "reviews",
    "reviewers",
    "sales",
    "a",
    "b",
    "authorid",
    "name",
    "city",
    "isbn",
    "price",
    "rating",
    "count",
    "sum",
    "avg",
    "max",
    "*",
    ",",
    "(",
    ")",
    ";",
    ".",
    "=",
    "<>",
    "<",
    ">=",
    "+",
    "-",
    "/",
    "%",
    "%s",
    "%(k)s",
    "$1",
    "?",
    "::",
    "'x'",
    "''",
    "'it''s'",
    '"quoted id"',
    '"a""b"',
    "1",
    "0",
    "-1",
    "2.5",
    "1e400",
    "9223372036854775808",
    "--",
    "/*",
    "*/",
    "\\",
    "'",
    '"',
    "ünïcödé",
    "\t",
    "\n",
    "E'\\x'",
    "$$dollar$$",
    "NaN",
    "Infinity",
]

sql_soup = st.lists(st.sampled_from(WORDS), max_size=30).map(" ".join)
any_text = st.text(max_size=200)
statement_texts = st.one_of(sql_soup, any_text, st.tuples(sql_soup, any_text).map("".join))

# -- currency clauses ----------------------------------------------------------------------------

numbers = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(str),
    st.sampled_from(
        [
            "0",
            "1",
            "0.5",
            "1e3",
            "1e400",
            "-5",
            "1.5e-3",
            "999999999999999999999",
            ".5",
            "5.",
            "nan",
            "inf",
        ]
    ),
)
units = st.sampled_from(
    [
        "MS",
        "SEC",
        "SECOND",
        "SECONDS",
        "MIN",
        "MINUTES",
        "HOUR",
        "HOURS",
        "DAY",
        "DAYS",
        "FORTNIGHT",
        "min",
        "Sec",
        "",
    ]
)
aliases = st.sampled_from(["a", "b", "authors", "books", "x", '"a"', "A"])


@st.composite
def clauses(draw: st.DrawFn) -> str:
    specs = []
    for _ in range(draw(st.integers(1, 3))):
        spec = f"{draw(numbers)} {draw(units)}"
        if draw(st.booleans()):
            spec += " ON (" + ", ".join(draw(st.lists(aliases, min_size=0, max_size=3))) + ")"
        if draw(st.booleans()):
            spec += " BY " + draw(st.sampled_from(["a.city", "a.authorid", "b.isbn", "z.q", "1"]))
        specs.append(spec)
    return "CURRENCY BOUND " + ", ".join(specs)


# -- queries over the bookstore, with parameters ------------------------------------------------

Param = t.Any

# (from-clause, the aliases it binds, columns usable in predicates: (expression, kind))
FROMS = [
    (
        "authors a",
        ["a"],
        [
            ("a.authorid", "int"),
            ("a.name", "text"),
            ("a.city", "text"),
            ("a.gender", "char"),
            ("a.state", "char"),
        ],
    ),
    (
        "books b",
        ["b"],
        [
            ("b.authorid", "int"),
            ("b.isbn", "text"),
            ("b.price", "numeric"),
            ("b.type", "text"),
            ("b.title", "text"),
        ],
    ),
    (
        "authors a JOIN books b ON a.authorid = b.authorid",
        ["a", "b"],
        [("a.authorid", "int"), ("a.city", "text"), ("b.price", "numeric"), ("b.isbn", "text")],
    ),
    ("reviews r", ["r"], [("r.rating", "int"), ("r.isbn", "text"), ("r.reviewerid", "int")]),
    ("reviewers v", ["v"], [("v.reviewerid", "int"), ("v.city", "text"), ("v.gender", "char")]),
    ("sales s", ["s"], [("s.qty", "int"), ("s.sold_on", "date"), ("s.isbn", "text")]),
]

VALUES: dict[str, st.SearchStrategy[Param]] = {
    "int": st.one_of(st.integers(-3, 60), st.integers(-(2**70), 2**70)),
    "text": st.one_of(
        st.sampled_from(
            [
                "Madison",
                "Seattle",
                "Author 2",
                "isbn-00003",
                "paperback",
                "",
                "it's",
                "%",
                "%%",
                "100%",
            ]
        ),
        st.text(max_size=12),
    ),
    "char": st.sampled_from(["F", "M", "WI", "W", "F ", ""]),
    "numeric": st.one_of(
        st.decimals(min_value=-100, max_value=100, places=2, allow_nan=False),
        st.integers(0, 70),
        st.floats(0, 70, allow_nan=False),
    ),
    "date": st.dates(min_value=dt.date(2000, 1, 1), max_value=dt.date(2030, 12, 31)),
}
# a value of the wrong type now and then: the statement must fail as it fails in PostgreSQL
ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=4),
    st.integers(-(2**70), 2**70),
)


@st.composite
def queries(draw: st.DrawFn) -> tuple[str, list[Param], str]:
    """(a SELECT with %s placeholders, its parameters, a currency clause or "")."""
    source, bound, columns = draw(st.sampled_from(FROMS))
    params: list[Param] = []

    def value(kind: str) -> str:
        if draw(st.integers(0, 9)) == 0:
            params.append(draw(ODD_VALUES))
            return "%s"
        if draw(st.booleans()):
            params.append(draw(VALUES[kind]))
            return "%s"
        literal = draw(VALUES[kind])
        if kind in ("text", "char"):
            return "'" + str(literal).replace("'", "''").replace("%", "%%") + "'"
        if kind == "date":
            return f"DATE '{literal.isoformat()}'"
        return str(literal)

    predicates = []
    for _ in range(draw(st.integers(0, 3))):
        column, kind = draw(st.sampled_from(columns))
        form = draw(st.sampled_from(["=", "<", ">=", "<>", "in", "between", "null", "like"]))
        if form == "in":
            items = [value(kind) for _ in range(draw(st.integers(1, 4)))]
            predicates.append(f"{column} IN ({', '.join(items)})")
        elif form == "between":
            predicates.append(f"{column} BETWEEN {value(kind)} AND {value(kind)}")
        elif form == "null":
            predicates.append(f"{column} IS {draw(st.sampled_from(['', 'NOT ']))}NULL")
        elif form == "like" and kind in ("text", "char"):
            predicates.append(f"{column} LIKE {value('text')}")
        else:
            predicates.append(f"{column} {form if form != 'like' else '='} {value(kind)}")
    if draw(st.booleans()):
        outputs = draw(
            st.lists(st.sampled_from([c for c, _ in columns]), min_size=1, max_size=4, unique=True)
        )
        select = ", ".join(outputs)
        tail = " ORDER BY " + ", ".join(str(i + 1) for i in range(len(outputs)))
    else:
        group, _ = draw(st.sampled_from(columns))
        measure, _ = draw(st.sampled_from(columns))
        aggregate = draw(
            st.sampled_from(["count(*)", f"count({measure})", f"min({measure})", f"max({measure})"])
        )
        select = f"{group}, {aggregate}"
        tail = f" GROUP BY {group} ORDER BY 1, 2"
    if draw(st.booleans()):
        tail += f" LIMIT {draw(st.integers(0, 5))}"
    where = " WHERE " + " AND ".join(predicates) if predicates else ""
    sql = f"SELECT {select} FROM {source}{where}{tail}"
    clause = ""
    if draw(st.integers(0, 3)) > 0:
        bound_to = ", ".join(bound)
        by = columns[0][0]
        clause = draw(
            st.sampled_from(
                [
                    f"CURRENCY BOUND 10 MIN ON ({bound_to})",
                    f"CURRENCY BOUND 10 MIN ON ({bound_to})",
                    "CURRENCY BOUND 1 DAY",
                    "CURRENCY BOUND 0 SEC",
                    f"CURRENCY BOUND 1 HOUR ON ({bound_to}) BY {by}",
                ]
            )
        )
    return sql, params, clause


# -- cache DDL ------------------------------------------------------------------------------------

NAMES = st.one_of(
    st.sampled_from(
        [
            "ctl",
            "view1",
            '"we""ird"',
            '"has space"',
            '"ünï"',
            '"select"',
            "select",
            "authorcopy",
            "authorlist_pct",
            '""',
            "x" * 70,
            "1abc",
            "a.b",
            '"Mixed"',
            "mixed",
        ]
    ),
    st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True),
)
COLUMN_TYPES = st.sampled_from(
    ["INTEGER", "TEXT", "BIGINT", "NUMERIC(8,2)", "DATE", "BLOB", "NOSUCHTYPE", "CHAR(2)", ""]
)


@st.composite
def ddl_scripts(draw: st.DrawFn) -> str:
    statements = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["control", "view", "drop", "soup"]))
        if kind == "control":
            column = draw(st.sampled_from(["authorid", "city", "isbn", "nosuch", '"city"']))
            statements.append(f"CREATE CONTROL TABLE {draw(NAMES)} ({column} {draw(COLUMN_TYPES)})")
        elif kind == "view":
            table, columns = draw(
                st.sampled_from(
                    [
                        ("authors", ["authorid", "name", "city", "*"]),
                        ("books", ["isbn", "authorid", "price", "*"]),
                        ("reviews", ["reviewid", "isbn", "rating"]),
                        ("nosuch", ["x"]),
                    ]
                )
            )
            chosen = draw(st.lists(st.sampled_from(columns), min_size=1, max_size=3, unique=True))
            text = f"CREATE CACHED VIEW {draw(NAMES)} AS SELECT {', '.join(chosen)} FROM {table}"
            if draw(st.booleans()):
                text += f" PRESENCE ON ({draw(st.sampled_from(chosen))}) IN {draw(NAMES)}"
            if draw(st.booleans()):
                text += " " + draw(
                    st.sampled_from(
                        [
                            "CONSISTENCY ROOT",
                            "CONSISTENCY ON ALL",
                            "CONSISTENCY ON (city) IN citylist_csct",
                        ]
                    )
                )
            if draw(st.booleans()):
                text += f" REFRESH EVERY {draw(numbers)} {draw(units)}"
            statements.append(text)
        elif kind == "drop":
            what = draw(st.sampled_from(["CACHED VIEW", "CONTROL TABLE"]))
            exists = draw(st.sampled_from(["IF EXISTS ", ""]))
            statements.append(f"DROP {what} {exists}{draw(NAMES)}")
        else:
            statements.append(draw(sql_soup))
    return ";\n".join(statements)


# -- control-key values ----------------------------------------------------------------------------

key_values = st.one_of(
    st.integers(-5, 40),
    st.integers(-(2**80), 2**80),
    st.text(max_size=10),
    st.sampled_from(["2", " 3 ", "6.5", "1e3", "0x10", "Madison", "", "7.0"]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=True),
    st.booleans(),
    st.none(),
    st.binary(max_size=3),
    st.dates(),
    st.just(decimal.Decimal("4.00")),
)


# -- what the properties compare ---------------------------------------------------------------


def cache_contents(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[int, int | None]]:
    """Every table of a cache file: its row count and a hash of its rows (order-free). What
    reads teach is left out - the hit/miss counters, the bounds asked, the reads the backend
    answered, the intervals chosen from them: reads change them by design, and they are
    written now and then, whenever a minute has passed (`cache.store.gathered`)."""
    tables = con.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE NOT (schema_name = 'mtcache' "
        "AND table_name IN ('counters', 'bound_asks', 'remote_reads', 'auto_refresh')) "
        "ORDER BY ALL"
    ).fetchall()
    found: dict[str, tuple[int, int | None]] = {}
    for schema, table in tables:
        name = f'"{schema}"."{table}"'
        count, digest = con.execute(f"SELECT count(*), bit_xor(hash(t)) FROM {name} t").fetchone()  # type: ignore[misc]
        found[f"{schema}.{table}"] = (count, digest)
    return found
