"""docs/plugin-authors.md lists every capability of the vocabulary, with the kinds it applies to,
so the table a plugin author reads cannot drift from what the registry accepts."""

from __future__ import annotations

import re
from pathlib import Path

from runstore.capabilities import CAPABILITIES, CAPABILITY_KINDS, Kind

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugin-authors.md"


def capability_table(text: str) -> dict[str, frozenset[str]]:
    """``{capability: kinds}`` from the table under the ``## Capabilities`` heading (a kinds
    cell reading "every kind" stands for all of them)."""
    section = text.split("\n## Capabilities\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, frozenset[str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        name = re.fullmatch(r"`(\w+)`", cells[0]) if line.startswith("|") else None
        if name is not None:
            every = cells[1] == "every kind"
            rows[name[1]] = frozenset(map(str, Kind)) if every else frozenset(re.findall(r"`(\w+)`", cells[1]))
    return rows


def test_the_capability_table_lists_the_vocabulary_and_its_kinds() -> None:
    table = capability_table(DOC.read_text(encoding="utf-8"))
    missing = sorted(CAPABILITIES.keys() - table.keys())
    unknown = sorted(table.keys() - CAPABILITIES.keys())
    assert not missing and not unknown, (
        f"docs/plugin-authors.md capability table: missing {missing}, not in the vocabulary {unknown}"
    )
    wrong = {
        name: (sorted(kinds), sorted(CAPABILITY_KINDS[name]))
        for name, kinds in table.items()
        if kinds != {str(kind) for kind in CAPABILITY_KINDS[name]}
    }
    assert not wrong, f"kinds column (documented, actual): {wrong}"


def test_the_check_sees_a_missing_row() -> None:
    text = DOC.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `replay` |"))
    assert "replay" not in capability_table(text.replace(row + "\n", ""))
