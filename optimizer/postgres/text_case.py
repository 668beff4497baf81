"""PostgreSQL's initcap under the C ctype (asc_initcap, src/backend/utils/adt/formatting.c),
for the cache's own DuckDB function (`optimizer.postgres.allowlist.INITCAP_C`, registered by
cache/store/functions.py)."""

from __future__ import annotations


def initcap_c(text: str | None) -> str | None:
    """Each ASCII letter upper-cased after a character that is not an ASCII letter or digit,
    lower-cased after one that is; every other character kept, and no ASCII letter or digit
    itself (a non-ASCII character separates words, as its bytes do in PostgreSQL)."""
    if text is None:
        return None
    out = []
    after_alnum = False
    for char in text:
        if after_alnum:
            cased = char.lower() if "A" <= char <= "Z" else char
        else:
            cased = char.upper() if "a" <= char <= "z" else char
        out.append(cased)
        after_alnum = cased.isascii() and cased.isalnum()
    return "".join(out)
