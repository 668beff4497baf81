"""Where a served cache file's clients connect (no database): the note's address as a URL a
client can use as it is, its role and database named."""

from __future__ import annotations

import psycopg

from cache.store.served import ServedAt


def test_a_served_files_url_names_its_role_and_database() -> None:
    served = ServedAt("127.0.0.1", 6432, 1, "app", "shop")
    assert served.url == "postgresql://app@127.0.0.1:6432/shop"
    odd = ServedAt("::1", 6432, 1, "the app", "shop/2024")
    info = psycopg.conninfo.conninfo_to_dict(odd.url)
    assert (info["host"], info["port"], info["user"], info["dbname"]) == (
        "::1",
        "6432",
        "the app",
        "shop/2024",
    )
    assert ServedAt("127.0.0.1", 6432, 1).url == "postgresql://127.0.0.1:6432"
