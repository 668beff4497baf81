"""The JSON documents tools rely on - `mtcache parse`, `explain`, `query` and `status --json`, and
a result's provenance - validate against their schemas in docs/schemas (docs/json-outputs.md),
printed by the real command line against a real backend."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import jsonschema
import pytest
from referencing import Registry, Resource

import cache
from cache.tools import bookstore
from tests.conftest import cli_home
from tests.paths import ROOT

SCHEMAS = ROOT / "docs" / "schemas"


def _registry() -> Registry[Any]:
    resources = []
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        document = json.loads(path.read_text())
        resources.append((document["$id"], Resource.from_contents(document)))
    return Registry().with_resources(resources)


def validate(document: Any, name: str) -> None:
    """Raise if ``document`` is not a valid ``name`` document (docs/schemas/NAME.schema.json)."""
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(
        schema, registry=_registry(), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    validator.validate(document)


def test_the_schemas_are_json_schemas() -> None:
    names = sorted(p.name for p in SCHEMAS.glob("*.schema.json"))
    assert names == [
        "advise.schema.json",
        "clone.schema.json",
        "explain.schema.json",
        "parse.schema.json",
        "provenance.schema.json",
        "query.schema.json",
        "status.schema.json",
    ]
    for name in names:
        jsonschema.Draft202012Validator.check_schema(json.loads((SCHEMAS / name).read_text()))


def test_a_schema_refuses_what_it_does_not_describe() -> None:
    """The schemas are strict: a missing key, an unknown one, a wrong type each fail."""
    good = {"kind": "query", "sql": "SELECT 1", "clauses": []}
    validate(good, "parse")
    for bad in (
        {"kind": "query", "sql": "SELECT 1"},
        {**good, "extra": 1},
        {**good, "clauses": [{"block": "0", "specs": []}]},
    ):
        with pytest.raises(jsonschema.ValidationError):
            validate(bad, "parse")


PARSED = [
    "SELECT o.id FROM orders o JOIN lines l ON o.id = l.oid CURRENCY BOUND 90 SEC ON (o, l) "
    "BY o.id",
    "SELECT 1",
    "SELECT a FROM t WHERE a IN (SELECT b FROM u CURRENCY BOUND 1 MIN) CURRENCY BOUND 10 MIN",
    "CREATE CONTROL TABLE authorlist_pct (authorid INTEGER)",
    "CREATE CACHED VIEW authorcopy AS SELECT * FROM authors PRESENCE ON (authorid) IN "
    "authorlist_pct CONSISTENCY ON (city) IN citylist_csct COMPLETENESS ON (city) IN "
    "citylist_cpct REFRESH EVERY 5 MIN",
    "CREATE CACHED VIEW bookcopy AS SELECT isbn, authorid FROM books PRESENCE ON (authorid) IN "
    "authorcopy CONSISTENCY ROOT",
    "CREATE CACHED VIEW salescopy AS SELECT * FROM sales REFRESH CONTINUOUSLY",
    "DROP CACHED VIEW authorcopy",
    "DROP CONTROL TABLE authorlist_pct",
    "BEGIN TIMEORDERED",
    "EXPLAIN LAST STATEMENT",
    "SHOW CACHE STATUS",
    "SET mtcache.provenance = on",
    "SHOW mtcache.currency_bound",
    "REFRESH CACHED VIEW authorcopy KEY (1), (2)",
    "REFRESH CACHED VIEWS",
    "END TIMEORDERED",
    "SET CURRENCY BOUND 5 MIN",
    "RESET CURRENCY BOUND",
    "SHOW CURRENCY BOUND",
]


def test_parse_documents(
    mtcache_bin: str, clean_env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The first statement through the installed command; the others through its `main` in
    this process (the same code without a process start each: 1.7 s apiece)."""
    from cache.tools.cli import main

    kinds = set()
    for n, sql in enumerate(PARSED):
        if n == 0:
            result = subprocess.run(
                [mtcache_bin, "parse", "--json", sql],
                capture_output=True,
                text=True,
                env=clean_env,
                timeout=60,
                check=False,
            )
            assert result.returncode == 0, (sql, result.stderr)
            out = result.stdout
        else:
            assert main(["parse", "--json", sql]) == 0, (sql, capsys.readouterr().err)
            out = capsys.readouterr().out
        document = json.loads(out)
        validate(document, "parse")
        kinds.add((document["kind"], (document.get("ddl") or {}).get("statement")))
    assert kinds == {
        ("query", None),
        ("ddl", "create control table"),
        ("ddl", "create cached view"),
        ("ddl", "drop cached view"),
        ("ddl", "drop control table"),
        ("timeline", None),
        ("session", None),
        ("inspect", None),
        ("setting", None),
        ("refresh", None),
    }


def test_explain_query_status_and_provenance_documents(
    mtcache_bin: str, pg_cluster: object, clean_env: dict[str, str]
) -> None:
    from cache.backend.embedded_pg import EmbeddedPostgres

    assert isinstance(pg_cluster, EmbeddedPostgres)
    dsn = pg_cluster.create_database("json_documents")
    bookstore.load_into(dsn)
    home = cli_home(clean_env, dsn, "mtcache-json-")

    def document(*args: str) -> Any:
        result = subprocess.run(
            [mtcache_bin, *args],
            capture_output=True,
            text=True,
            env=clean_env,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, (args, result.stderr)
        return json.loads(result.stdout)

    script = home / "schema.sql"
    script.write_text(
        bookstore.CACHE_SCHEMA_FILE.read_text() + "\nCREATE CACHED VIEW salescopy "
        "AS SELECT * FROM sales REFRESH CONTINUOUSLY;\n"
        # (a derived view kept from the stream: salescopy holds its copy of sales)
        "CREATE CACHED VIEW sales_by_isbn AS SELECT s.isbn, count(*) AS n FROM sales s "
        "GROUP BY s.isbn REFRESH CONTINUOUSLY;\n"
        # (a view refreshed as the bounds asked of it pay, with an objective)
        "CREATE CACHED VIEW reviewers_auto AS SELECT * FROM reviewers REFRESH AUTO WITHIN 10 MIN "
        "WITH NO DATA;\n"
    )
    assert (
        subprocess.run(
            [mtcache_bin, "ddl", str(script)],
            env=clean_env,
            capture_output=True,
            timeout=120,
            check=False,
        ).returncode
        == 0
    )
    document("admit", "--json", "authorlist_pct", "4")
    document("refresh", "--json", "--view", "salescopy")
    local = (
        "SELECT a.name, b.title FROM authors a JOIN books b ON a.authorid = b.authorid "
        "WHERE a.authorid = 4 CURRENCY BOUND 10 MIN ON (a, b)"
    )
    remote = "SELECT count(*) FROM reviews r CURRENCY BOUND 10 MIN"
    aggregate = "SELECT count(*), sum(qty) FROM sales s CURRENCY BOUND 10 MIN"
    routes = set()
    for sql in (local, remote, aggregate):
        explained = document("explain", "--json", sql)
        validate(explained, "explain")
        routes |= {a["route"] for a in explained["accesses"]}
        answered = document("query", "--json", sql)
        validate(answered, "query")
        validate(answered["provenance"], "provenance")
    assert routes == {"guarded", "remote"}
    status = document("status", "--json")
    validate(status, "status")
    assert status["stream"] is not None and {v["name"] for v in status["views"]} >= {
        "authorcopy",
        "salescopy",
    }
    [derived] = [v for v in status["views"] if v["name"] == "sales_by_isbn"]
    assert derived["copies"]["views"] == ["salescopy"] and derived["copies"]["rows"] > 0
    [auto] = [v for v in status["views"] if v["name"] == "reviewers_auto"]
    assert auto["refresh_auto"]["within_seconds"] == 600.0
    # the bounds the queries above asked (the one-shot commands' process kept them in the file)
    [sales] = [v for v in status["views"] if v["name"] == "salescopy"]
    assert [a["bound_seconds"] for a in sales["bounds_asked"]] == [600.0]
    text = subprocess.run(
        [mtcache_bin, "status"],
        capture_output=True,
        text=True,
        env=clean_env,
        timeout=120,
        check=True,
    ).stdout
    assert (
        "reviewers_auto (reviewers, white, view-level, refresh auto, not now, within 10 min)"
        in text
    )
    assert f"    refresh auto: {auto['refresh_auto']['reason']}\n" in text
    assert "    bounds asked: 10 min " in text
    # a cursor's provenance, local and remote
    with cache.connect(dsn, home / "cache.duckdb", background=False, admit_on_miss=False) as conn:
        cur = conn.cursor()
        for sql in (local, remote):
            cur.execute(sql)
            validate(cur.provenance.to_json(), "provenance")
        assert {p["route"] for p in cur.provenance} == {"remote"}
    # what to cache: the count(*) of reviews went to the backend (no view holds all of them)
    advised = document("advise", "--json")
    validate(advised, "advise")
    [counted] = [a for a in advised["advice"] if "FROM reviews" in a["statement"]]
    assert counted["statement"] == "SELECT COUNT(*) FROM reviews AS r CURRENCY BOUND 10 MIN"
    assert counted["reason"].startswith("no view: ")
    # (a count reads no column: the view holds the key alone)
    assert counted["suggestion"] == (
        'CREATE CACHED VIEW "reviews_cache" AS SELECT "reviewid" FROM "reviews" REFRESH AUTO;'
    )
    applied = document("advise", "--json", "--apply")
    validate(applied, "advise")
    assert applied["applied"]["views"] == ["reviews_cache"]
    answered = document("query", "--json", remote)
    assert {p["route"] for p in answered["provenance"]} == {"local"}
    shutil.rmtree(home, ignore_errors=True)
