"""docs/rules.md stays honest: every test it names exists in the conformance suite, and
every conformance test is named there or listed below as checking no rule of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "conformance"
MAP = ROOT / "docs" / "rules.md"
NAMED = re.compile(r"`((?:test_[a-z_]+/)?test_[a-z0-9_]+\.py)::(test_[a-z0-9_]+)`")

#: Conformance tests that check no rule of their own, with the reason.
NOT_RULES: dict[str, str] = {}


def suite_tests() -> set[str]:
    """Every ``test_*`` function of the suite's modules, as ``path::name`` relative to it."""
    found: set[str] = set()
    for path in sorted(SUITE.glob("test_*.py")) + sorted(SUITE.glob("test_*/test_*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_"):
                found.add(f"{path.relative_to(SUITE).as_posix()}::{node.name}")
    return found


def mapped_tests() -> set[str]:
    return {f"{path}::{name}" for path, name in NAMED.findall(MAP.read_text())}


def test_every_test_the_map_names_exists() -> None:
    missing = sorted(mapped_tests() - suite_tests())
    assert not missing, f"docs/rules.md names tests the suite does not have: {missing}"


def test_every_conformance_test_is_in_the_map() -> None:
    unmapped = sorted(suite_tests() - mapped_tests() - set(NOT_RULES))
    assert not unmapped, (
        f"conformance tests in no row of docs/rules.md (name the rule each checks, or list it "
        f"in NOT_RULES with a reason): {unmapped}"
    )


def test_the_not_rules_list_names_real_tests() -> None:
    stale = sorted(set(NOT_RULES) - suite_tests())
    assert not stale, f"NOT_RULES names tests the suite does not have: {stale}"


def rule_rows() -> list[str]:
    """The body rows of every table whose header starts with ``| rule``."""
    rows: list[str] = []
    in_rules = False
    for line in MAP.read_text().splitlines():
        if not line.startswith("|"):
            in_rules = False
        elif line.startswith("| rule"):
            in_rules = True
        elif in_rules and not line.startswith("|---"):
            rows.append(line)
    return rows


def test_every_row_names_a_test_or_is_pending() -> None:
    rows = rule_rows()
    assert len(rows) > 50, "docs/rules.md lost its tables"
    empty = [row for row in rows if "::test_" not in row and "(pending)" not in row]
    assert not empty, f"rows of docs/rules.md with no test: {empty}"
