"""Nothing reaches another package's private members: a name with a leading underscore that a
package of this repository defines (a function, class, module-level name, attribute or method)
is used only inside that package (its directory), through ``self`` / ``cls`` or by its own
modules. Product code, tests and experiments reach what they need through public seams (the
engine's hooks, `cache.engine.engine`). Names this repository does not define (psycopg's,
SQLAlchemy's) are not judged here."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = ("cache", "optimizer", "control_tables", "heartbeat", "sql_ext", "experiments", "tests")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _files() -> list[Path]:
    found = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    assert found, "no sources found"
    return sorted(found)


def _package(path: Path) -> str:
    return str(path.parent.relative_to(ROOT))


def _definitions(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, assigned names and attributes
    (``self._x = ...``), and ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Attribute):
            names.add(node.target.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # "_x" in __slots__ or a setattr
    return {name for name in names if _private(name)}


def _reaches(tree: ast.Module) -> list[tuple[int, str]]:
    """Private names used on something other than ``self`` / ``cls``, and imported ones."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
                continue
            found.append((node.lineno, node.attr))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] in PACKAGES
        ):
            found.extend((node.lineno, alias.name) for alias in node.names if _private(alias.name))
    return found


def test_no_package_reaches_another_packages_private_members() -> None:
    trees = {path: ast.parse(path.read_text(), str(path)) for path in _files()}
    defined_in: defaultdict[str, set[str]] = defaultdict(set)
    for path, tree in trees.items():
        for name in _definitions(tree):
            defined_in[name].add(_package(path))
    violations = []
    for path, tree in trees.items():
        package = _package(path)
        for line, name in _reaches(tree):
            owners = defined_in.get(name)
            if owners and package not in owners:
                where = ", ".join(sorted(owners))
                violations.append(f"{path.relative_to(ROOT)}:{line}: {name} (private to {where})")
    assert not violations, "private members reached from outside their package:\n" + "\n".join(
        violations
    )


def test_the_check_sees_a_reach() -> None:
    """The rule itself: a private attribute of another object is a reach, self's is not."""
    tree = ast.parse("def f(conn):\n    self._a\n    conn._store\n")
    assert _reaches(tree) == [(3, "_store")]
