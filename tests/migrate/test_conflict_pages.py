"""``--on-conflict skip|overwrite`` decide a whole event feed or store namespace before
writing any of it: both are copied page by page, and a conflict that first shows on a
later page must not leave the earlier pages copied (skip) nor delete them after they
were written (overwrite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runstore.migrate.endpoints import open_endpoint
from runstore.migrate.engine import MigrateOptions, migrate
from runstore.migrate.sources import EVENT_PAGE, LiveSource
from runstore.urls import BackendURL

#: Longer than one page, the destination differing only past the first.
LENGTH, DIFFERS_AT = EVENT_PAGE + 100, EVENT_PAGE + 50


def _event(seq: int, content: str) -> dict[str, Any]:
    return {"thread_id": "t", "run_id": "r", "event_type": "x", "category": "trace", "content": content,
            "metadata": {}, "seq": seq, "created_at": "2026-12-05T01:02:03+00:00", "user_id": None}  # fmt: skip


def _url(tmp_path: Path, name: str) -> str:
    return BackendURL.for_file("sqlite", tmp_path / name).render()


@pytest.mark.parametrize("on_conflict", ["skip", "overwrite"])
async def test_an_event_feed_differing_past_its_first_page(on_conflict: str, tmp_path: Path) -> None:
    source_feed = [_event(seq, f"e{seq}") for seq in range(1, LENGTH + 1)]
    held_feed = [_event(seq, "theirs" if seq == DIFFERS_AT else f"e{seq}") for seq in range(1, DIFFERS_AT + 1)]
    async with open_endpoint(_url(tmp_path, "a.db"), ["events"]) as src, \
            open_endpoint(_url(tmp_path, "b.db"), ["events"]) as dst:  # fmt: skip
        await src.events.aimport_events(source_feed)
        await dst.events.aimport_events(held_feed)
        options = MigrateOptions(kinds=("events",), on_conflict=on_conflict, ledger=tmp_path / "ledger.jsonl")
        report = await migrate(LiveSource(src), dst, options)
        assert report.counts["events"].conflicts == ["t"]
        got = [(e["seq"], e["content"]) for e in await dst.events.aexport_events("t", limit=2 * LENGTH)]
        wanted = source_feed if on_conflict == "overwrite" else held_feed
        assert got == [(e["seq"], e["content"]) for e in wanted]


@pytest.mark.parametrize("on_conflict", ["skip", "overwrite"])
async def test_a_store_namespace_differing_past_its_first_page(on_conflict: str, tmp_path: Path) -> None:
    keys = [f"k{n:04}" for n in range(LENGTH)]
    async with open_endpoint(_url(tmp_path, "a.db"), ["store"]) as src, \
            open_endpoint(_url(tmp_path, "b.db"), ["store"]) as dst:  # fmt: skip
        for key in keys:
            await src.store.aput(("ns",), key, {"v": key})
        await dst.store.aput(("ns",), keys[DIFFERS_AT], {"v": "theirs"})
        options = MigrateOptions(kinds=("store",), on_conflict=on_conflict, ledger=tmp_path / "ledger.jsonl")
        report = await migrate(LiveSource(src), dst, options)
        assert report.counts["store"].conflicts == ["ns"]
        held = {item.key: item.value for item in await dst.store.asearch(("ns",), limit=2 * LENGTH)}
        if on_conflict == "skip":
            assert held == {keys[DIFFERS_AT]: {"v": "theirs"}}, "a skipped namespace is left as it was"
        else:
            assert held == {key: {"v": key} for key in keys}
