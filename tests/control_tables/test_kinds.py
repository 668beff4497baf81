"""The region and guard kinds (`control_tables.kinds`): their values are the text the cache has
always written, and what is decided by kind is on the members."""

from __future__ import annotations

import json

import duckdb

from control_tables.kinds import GuardKind, RegionKind
from control_tables.regions import Region
from optimizer.plan import Guard


def test_the_values_are_the_text_written_before() -> None:
    assert {k.name: k.value for k in RegionKind} == {
        "PRESENCE": "presence",
        "CONSISTENCY": "consistency",
        "COMPLETENESS": "completeness",
        "VIEW": "view",
    }
    assert {k.name: k.value for k in GuardKind} == {
        "FULL": "full",
        "PRESENCE": "presence",
        "COMPLETENESS": "completeness",
    }


def test_a_member_is_its_text() -> None:
    for kind in [*RegionKind, *GuardKind]:
        assert kind == kind.value and hash(kind) == hash(kind.value)
        assert str(kind) == f"{kind}" == kind.value and type(str(kind)) is str
        assert f"{kind:<14}|" == f"{kind.value:<14}|"
    assert RegionKind("view") is RegionKind.VIEW and GuardKind("full") is GuardKind.FULL
    assert Region("v", "presence", ("id",), (1,), "c") in {  # (a kind read back as text)
        Region("v", RegionKind.PRESENCE, ("id",), (1,), "c")
    }


def test_each_guard_kind_checks_its_region_kind() -> None:
    assert {g: g.region for g in GuardKind} == {
        GuardKind.FULL: RegionKind.VIEW,
        GuardKind.PRESENCE: RegionKind.PRESENCE,
        GuardKind.COMPLETENESS: RegionKind.COMPLETENESS,
    }
    assert [g for g in GuardKind if g.probes] == [GuardKind.PRESENCE, GuardKind.COMPLETENESS]
    assert [r for r in RegionKind if not r.keyed] == [RegionKind.VIEW]


def test_maxac_cleans_strongest_first() -> None:
    """Completeness, then view-level and group consistency, then presence (§3.4.1)."""
    assert RegionKind.strongest_first() == (
        RegionKind.COMPLETENESS,
        RegionKind.VIEW,
        RegionKind.CONSISTENCY,
        RegionKind.PRESENCE,
    )
    assert {k.value: k.strength for k in RegionKind} == {
        "presence": 0,
        "consistency": 1,
        "view": 2,
        "completeness": 3,
    }


def test_kinds_go_through_json_as_plain_strings() -> None:
    text = json.dumps({RegionKind.VIEW: [GuardKind.FULL, RegionKind.COMPLETENESS]})
    assert text == '{"view": ["full", "completeness"]}'
    assert json.loads(text) == {"view": ["full", "completeness"]}
    assert json.loads(text) == {RegionKind.VIEW: [GuardKind.FULL, RegionKind.COMPLETENESS]}


def test_kinds_go_through_duckdb_as_text() -> None:
    con = duckdb.connect()
    row = con.execute("SELECT ?, typeof(?)", [RegionKind.PRESENCE, GuardKind.FULL]).fetchone()
    assert row == ("presence", "VARCHAR")
    assert row is not None and RegionKind(row[0]) is RegionKind.PRESENCE
    con.close()


def test_a_guards_document_and_a_regions_text_are_unchanged() -> None:
    guard = Guard("v", GuardKind.PRESENCE, 10.0, probe=("id",), control="pct")
    document = guard.to_json()
    assert [type(k) for k in document] == [str] * 4  # EXPLAIN's text prints it as a dict
    assert str(document) == (
        "{'currency_bound_seconds': 10.0, 'view': 'v', "
        "'presence': {'columns': ['id'], 'in': 'pct'}, 'consistency': 'one snapshot'}"
    )
    assert Guard("v", GuardKind.FULL, 1.0).to_json() == {
        "currency_bound_seconds": 1.0,
        "view": "v",
        "consistency": "one snapshot",
    }
    assert str(Region("v", RegionKind.COMPLETENESS, ("city",), ("Madison",), "c")) == (
        "v completeness(city='Madison')"
    )
    assert str(Region("v", RegionKind.VIEW)) == "v(all rows)"
