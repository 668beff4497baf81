"""``mtcache doctor``: the backend checked against what the cache needs, each unmet
requirement named with the change to make (`cache.backend.requirements`)."""

from __future__ import annotations

import argparse

from cache.backend.reflect import connect_backend
from cache.backend.requirements import backend_requirements
from cache.tools.formatting import print_json
from cache.tools.settings import Settings
from sql_ext.nodes import plural


def cmd_doctor(settings: Settings, args: argparse.Namespace) -> int:
    """Exit 0 when every requirement is met, 1 when one is not (the report says which)."""
    with connect_backend(settings.backend_dsn(), autocommit=True) as conn:
        found = backend_requirements(conn)
    unmet = [r for r in found if not r.met]
    if args.json:
        print_json({"requirements": [r.to_json() for r in found], "unmet": len(unmet)})
        return 1 if unmet else 0
    for requirement in found:
        mark = "ok  " if requirement.met else "NEED"
        print(f"{mark} {requirement.name}: {requirement.found} (for {requirement.needed_for})")
        if not requirement.met:
            print(f"     change: {requirement.change}")
    print(
        "the backend has what the cache needs"
        if not unmet
        else f"{plural(len(unmet), 'requirement')} unmet: the features named above need them"
    )
    return 1 if unmet else 0
