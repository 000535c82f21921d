"""The store kind: every namespace and item moves with its times and TTL state, so `get`,
`search` and `list_namespaces` answer as on the source; conflicts, resume after SIGKILL,
archives and a backend without the kind. Real sqlite files and the PostgreSQL server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from langgraph.store.base import PutOp

from runstore.clock import ManualClock, to_micros
from runstore.errors import KindNotServedError, MigrationConflictError
from runstore.migrate.archive import ArchiveSource
from runstore.migrate.endpoints import open_endpoint
from runstore.migrate.engine import MigrateOptions, migrate
from runstore.migrate.sources import LiveSource
from runstore.migrate.transfer import run_export, run_import, run_migrate
from runstore.urls import BackendURL

from .test_resume import kill_part_way

NAMESPACES = [("users",), ("users", "alice"), ("users", "alice", "memories"), ("users", "bob", "memories", "deep")]


def url(tmp_path: Path, name: str) -> str:
    return BackendURL.for_file("sqlite", tmp_path / name).render()


def options(tmp_path: Path, **changes: Any) -> MigrateOptions:
    return MigrateOptions(**{"kinds": ("store",), "ledger": tmp_path / "ledger.jsonl", **changes})


async def populate(store: Any) -> None:
    """Items at several depths with nested values, some with a TTL, one already expired."""
    # Ten minutes back: under the system clock too, the half-minute items have expired
    # and the hour-long ones have not (a store reopened later reads the system clock).
    clock = ManualClock(datetime.now(UTC) - timedelta(minutes=10))
    store.clock = clock
    for depth, namespace in enumerate(NAMESPACES):
        for n in range(5):
            value = {"n": n, "depth": depth, "profile": {"name": f"user{n}", "tags": ["a", "b"][: n % 3],
                     "nested": {"score": n * 1.5, "ok": n % 2 == 0}}, "text": f"item {n} of {namespace[-1]}"}  # fmt: skip
            await store.aput(namespace, f"k{n}", value, ttl=(60.0 if n % 2 else None))
            clock.advance(1)
    await store.aput(("users", "alice"), "gone", {"n": 99}, ttl=0.5)
    await store.aput(("only-expired",), "gone", {"n": 98}, ttl=0.5)
    clock.advance(60)  # the two half-minute items expired, not swept


async def view(store: Any) -> Any:
    """What the store answers: namespaces, gets, filtered searches page by page, the records."""
    from runstore.migrate.stores import StoreSide

    out: dict[str, Any] = {"namespaces": await store.alist_namespaces(limit=100),
                           "depth2": await store.alist_namespaces(max_depth=2)}  # fmt: skip
    for namespace in NAMESPACES:
        out[str(namespace) + " get"] = [
            None if (item := await store.aget(namespace, f"k{n}", refresh_ttl=False)) is None else item.dict()
            for n in range(5)
        ]  # fmt: skip
        for offset in (0, 2, 4):
            found = await store.asearch(namespace, filter={"profile.nested.ok": True}, limit=2, offset=offset,
                                        refresh_ttl=False)  # fmt: skip
            out[f"{namespace} search {offset}"] = [(i.namespace, i.key, i.value, i.created_at, i.updated_at) for i in found]
        out[f"{namespace} records"] = [page async for page in StoreSide(store).pages(namespace)]
    out["ordered"] = [(i.namespace, i.key) for i in await store.asearch(("users",), limit=50, refresh_ttl=False)]
    return out


async def test_sqlite_to_postgres_to_memory_and_back_answers_the_same(tmp_path: Path, postgres_url: str) -> None:
    a, back = url(tmp_path, "a.db"), url(tmp_path, "back.db")
    async with open_endpoint(a, ["store"]) as src:
        await populate(src.store)
        original = await view(src.store)
        assert ("only-expired",) not in original["namespaces"]
        async with open_endpoint(postgres_url, ["store"]) as pg:
            pg.store.clock = src.store.clock
            report = await migrate(LiveSource(src), pg, options(tmp_path, ledger=None))
            assert report.verified and report.mismatches == {"store": []} and not report.notes
            # 20 live items in 4 namespaces; the expired ones are not copied.
            assert (report.counts["store"].threads, report.counts["store"].copied) == (4, 20)
            assert await view(pg.store) == original
            async with open_endpoint("memory://", ["store"]) as memory:
                memory.store.clock = src.store.clock
                assert not any((await migrate(LiveSource(pg), memory, options(tmp_path, ledger=None))).mismatches.values())
                assert await view(memory.store) == original
                async with open_endpoint(back, ["store"]) as b:
                    b.store.clock = src.store.clock
                    report = await migrate(LiveSource(memory), b, options(tmp_path, ledger=None))
                    assert not any(report.mismatches.values())
                    assert await view(b.store) == original
                    # TTL behaviour is the destination's own again: a read refreshes, the clock expires.
                    clock = src.store.clock
                    before = (await b.store.aexport_items(("users", "alice"), limit=10))[1]
                    assert before["key"] == "k1" and before["ttl_minutes"] == 60.0
                    clock.advance(30)
                    await b.store.aget(("users", "alice"), "k1")  # refresh_on_read (the default)
                    after = (await b.store.aexport_items(("users", "alice"), limit=10))[1]
                    assert after["expires_at"] == to_micros(clock()) + 60 * 60_000_000
                    clock.advance(60 * 60 + 1)
                    assert await b.store.aget(("users", "alice"), "k1") is None
                    assert await b.store.aget(("users", "alice"), "k0") is not None  # no TTL


async def test_conflicts_fail_skip_overwrite_and_a_catch_up_writes_updates(tmp_path: Path) -> None:
    a, b = url(tmp_path, "a.db"), url(tmp_path, "b.db")
    async with open_endpoint(a, ["store"]) as src, open_endpoint(b, ["store"]) as dst:
        await src.store.aput(("ns", "one"), "x", {"v": 1})
        await src.store.aput(("ns", "two"), "y", {"v": 2})
        await dst.store.aput(("ns", "one"), "x", {"v": "other"})
        with pytest.raises(MigrationConflictError, match="ns/one"):
            await migrate(LiveSource(src), dst, options(tmp_path))
        assert await dst.store.aget(("ns", "two"), "y") is None  # refused before writing

        report = await migrate(LiveSource(src), dst, options(tmp_path, on_conflict="skip"))
        assert report.counts["store"].conflicts == ["ns/one"] and report.mismatches == {"store": []}
        assert (await dst.store.aget(("ns", "one"), "x")).value == {"v": "other"}
        assert (await dst.store.aget(("ns", "two"), "y")).value == {"v": 2}

        report = await migrate(LiveSource(src), dst, options(tmp_path, on_conflict="overwrite"))
        assert report.counts["store"].conflicts == ["ns/one"]
        held = await dst.store.aget(("ns", "one"), "x")
        source = await src.store.aget(("ns", "one"), "x")
        assert (held.value, held.created_at, held.updated_at) == ({"v": 1}, source.created_at, source.updated_at)

        # The source moves on: a catch-up pass writes the newer copy (no conflict) and new items.
        await src.store.aput(("ns", "two"), "y", {"v": 3})
        await src.store.aput(("ns", "three"), "z", {"v": 4})
        dry = await migrate(LiveSource(src), dst, options(tmp_path, dry_run=True))
        assert (dry.counts["store"].copied, dry.counts["store"].present, dry.counts["store"].conflicts) == (2, 1, [])
        assert await dst.store.aget(("ns", "three"), "z") is None
        report = await migrate(LiveSource(src), dst, options(tmp_path))
        assert (report.counts["store"].copied, report.counts["store"].conflicts, report.mismatches) == (2, [], {"store": []})
        assert (await dst.store.aget(("ns", "two"), "y")).value == {"v": 3}


async def test_sigkill_mid_store_copy_then_rerun_gives_exactly_one_copy(tmp_path: Path) -> None:
    source, destination = url(tmp_path, "a.db"), url(tmp_path, "b.db")
    async with open_endpoint(source, ["store"]) as side:
        for n in range(300):
            await side.store.abatch([PutOp(("tenant", f"t{n:03d}"), f"k{i}", {"i": i}, None, 90.0) for i in range(3)])
    ledger = tmp_path / "ledger.jsonl"
    command = [sys.executable, "-m", "runstore.cli", "migrate", source, destination, "--kinds", "store",
               "--ledger", str(ledger), "--json"]  # fmt: skip
    returncode, stderr = kill_part_way(command, ledger, tmp_path, '"done": "store"')
    assert returncode == -signal.SIGKILL, f"the child ended on its own first: {stderr}"
    done_before = ledger.read_text().count('"done": "store"')
    assert 3 <= done_before < 300

    report = await run_migrate(source, destination, MigrateOptions(kinds=(), ledger=ledger), ["store"])
    assert report.pass_kind == "resume" and report.verified and report.mismatches == {"store": []}
    assert report.counts["store"].threads <= 300 - done_before
    again = await run_migrate(source, destination, MigrateOptions(kinds=(), ledger=ledger), ["store"])
    assert (again.pass_kind, again.counts["store"].copied, again.counts["store"].present) == ("catch-up", 0, 900)
    async with open_endpoint(source, ["store"]) as a, open_endpoint(destination, ["store"]) as b:
        for n in (0, 150, 299):
            assert await b.store.aexport_items(("tenant", f"t{n:03d}")) == await a.store.aexport_items(("tenant", f"t{n:03d}"))


async def test_export_import_round_trip_with_verify_and_old_archives(tmp_path: Path) -> None:
    a, b = url(tmp_path, "a.db"), url(tmp_path, "b.db")
    async with open_endpoint(a, ["store"]) as side:
        await populate(side.store)
        original = await view(side.store)
    archive = tmp_path / "store.jsonl.gz"
    counts = await run_export(a, archive, ["store"])
    assert (counts["store_items"], counts["threads"]["store"]) == (20, 4)
    assert ArchiveSource(archive).header["version"] == 2
    report = await run_import(archive.resolve(), b, MigrateOptions(kinds=()), None)
    assert report.verified and report.mismatches == {"store": []}
    async with open_endpoint(b, ["store"]) as side:
        assert await view(side.store) == original
    # An archive without the store kind stays version 1 and imports as before.
    older = tmp_path / "saver.jsonl.gz"
    await run_export(a, older, ["saver"])
    assert ArchiveSource(older).header["version"] == 1
    assert not any((await run_import(older.resolve(), url(tmp_path, "c.db"), MigrateOptions(kinds=()), None)).mismatches.values())


async def test_a_backend_without_the_store_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KindNotServedError, match="no store backend serves redis://"):
        await run_migrate(url(tmp_path, "a.db"), "redis://127.0.0.1:6379/0", MigrateOptions(kinds=()), ["store"])
    with pytest.raises(KindNotServedError, match="no store backend serves jsonl://"):
        await run_migrate(url(tmp_path, "a.db"), f"jsonl:///{tmp_path}/b.db", MigrateOptions(kinds=()), ["store"])


async def test_a_store_without_bulk_import_goes_through_the_public_api(tmp_path: Path) -> None:
    from langgraph.store.memory import InMemoryStore

    from runstore.migrate.endpoints import Endpoint

    stock = InMemoryStore()
    await stock.aput(("a",), "k", {"v": 1})
    await stock.aput(("a", "b"), "k", {"v": 2})
    async with open_endpoint(url(tmp_path, "b.db"), ["store"]) as dst:
        report = await migrate(LiveSource(Endpoint("stock", store=stock)), dst, options(tmp_path))
        assert report.counts["store"].copied == 2 and report.mismatches == {"store": []}
        assert any("without expiry" in note for note in report.notes)
        held = await dst.store.aget(("a", "b"), "k")
        assert held.created_at == (await stock.aget(("a", "b"), "k")).created_at
        back = InMemoryStore()
        report = await migrate(LiveSource(dst), Endpoint("back", store=back), options(tmp_path, ledger=None))
        assert report.mismatches == {"store": []} and any("copy's time" in note for note in report.notes)
        assert (await back.aget(("a",), "k")).value == {"v": 1}


def test_cli_rows_and_json_for_the_store_kind(tmp_path: Path) -> None:
    from runstore.cli.main import main

    a, b = url(tmp_path, "a.db"), url(tmp_path, "b.db")

    async def write() -> None:
        async with open_endpoint(a, ["store"]) as side:
            await populate(side.store)

    asyncio.run(write())
    runner = CliRunner()
    result = runner.invoke(main, ["migrate", a, b, "--kinds", "store", "--dry-run"])
    assert result.exit_code == 0, result.output
    # The table's width is the console's (fixed when it was made): cells may wrap.
    assert "namespaces" in result.output and "items" in result.output and "dry run" in result.output
    result = runner.invoke(main, ["migrate", a, b, "--kinds", "store", "--dry-run", "--json"])
    counted = json.loads(result.output)["counts"]["store"]
    assert (counted["threads"], counted["copied"]) == (4, 20), counted
    result = runner.invoke(main, ["migrate", a, b, "--kinds", "saver,store", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["counts"]["store"]["copied"], data["mismatches"]["store"], data["ok"]) == (20, [], True)
    archive = tmp_path / "x.jsonl.gz"
    assert runner.invoke(main, ["export", a, "-o", str(archive), "--kinds", "store", "--json"]).exit_code == 0
    result = runner.invoke(main, ["import", str(archive), b, "--json"])
    data = json.loads(result.output)
    assert (data["counts"]["store"]["copied"], data["counts"]["store"]["present"], data["ok"]) == (0, 20, True)


def _letters(texts: list[str]) -> list[list[float]]:
    return [[float(text.count(c)) for c in "abcdefgh"] for text in texts]


@contextlib.asynccontextmanager
async def _indexed(kind: str, target: str, index: Any) -> AsyncIterator[Any]:
    from runstore.plugins.memory.store import MemoryStore
    from runstore.plugins.postgres.store import PostgresStore
    from runstore.plugins.sqlite.store import SqliteStore

    if kind == "memory":
        yield MemoryStore(index=index)
        return
    opener = SqliteStore if kind == "sqlite" else PostgresStore
    async with opener.from_conn_string(target, index=index) as store:
        await store.setup()
        yield store


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_the_destination_embeds_with_its_own_index(tmp_path: Path, postgres_url: str, kind: str) -> None:
    from runstore.migrate.endpoints import Endpoint
    from runstore.plugins.memory.store import MemoryStore

    index: Any = {"dims": 8, "embed": _letters, "fields": ["text"]}
    texts = {"k1": "aaa bbb", "k2": "ccc", "k3": "abcabc", "k4": "hhh"}
    reference = MemoryStore(index=index)
    target = url(tmp_path, "b.db") if kind == "sqlite" else postgres_url
    async with open_endpoint(url(tmp_path, "a.db"), ["store"]) as src, _indexed(kind, target, index) as store:
        for key, text in texts.items():
            await src.store.aput(("docs",), key, {"text": text})
            await reference.aput(("docs",), key, {"text": text})
        report = await migrate(LiveSource(src), Endpoint(kind, store=store), options(tmp_path))
        assert report.mismatches == {"store": []}
        for query in ("aab", "cc", "h"):
            mine = [(i.key, i.score) for i in await store.asearch(("docs",), query=query, limit=4)]
            theirs = [(i.key, i.score) for i in await reference.asearch(("docs",), query=query, limit=4)]
            assert [k for k, _ in mine] == [k for k, _ in theirs]
            assert [score for _, score in mine] == pytest.approx([score for _, score in theirs], abs=1e-5)


def letters_index() -> dict[str, Any]:
    """The index config ``--store-index tests.migrate.test_store:letters_index`` names."""
    return {"dims": 8, "embed": _letters, "fields": ["text"]}


def test_cli_store_index_embeds_what_it_copies(tmp_path: Path) -> None:
    """``--store-index MODULE:FUNCTION`` opens the destination store with the index config the
    function returns, so copied items rank in semantic search there; a name that does not
    import is refused by name, nothing written."""
    from runstore.cli.main import main
    from runstore.errors import PluginError
    from runstore.plugins.sqlite.store import SqliteStore

    a, b = url(tmp_path, "a.db"), url(tmp_path, "b.db")

    async def write() -> None:
        async with open_endpoint(a, ["store"]) as side:
            for key, text in {"k1": "aaa bbb", "k2": "ccc", "k3": "hhh"}.items():
                await side.store.aput(("docs",), key, {"text": text})

    asyncio.run(write())
    runner = CliRunner()
    result = runner.invoke(main, ["migrate", a, b, "--kinds", "store", "--store-index", "tests.migrate.no_such:thing"])
    assert isinstance(result.exception, PluginError), result.output
    assert "--store-index" in str(result.exception) and "tests.migrate.no_such" in str(result.exception)
    assert not (tmp_path / "b.db").exists()
    ref = f"{__name__}:letters_index"
    result = runner.invoke(main, ["migrate", a, b, "--kinds", "store", "--store-index", ref, "--json"])
    assert result.exit_code == 0, result.output

    async def search() -> list[str]:
        async with SqliteStore.from_conn_string(b, index=letters_index()) as store:
            return [item.key for item in await store.asearch(("docs",), query="cc", limit=3)]

    assert asyncio.run(search())[0] == "k2"
