"""SQL-specific behaviour of the sqlite and PostgreSQL event stores (the suite covers the contract)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import runstore.events.sql as sql_events
from runstore.errors import InvalidEventError
from runstore.events.sql import SqlEventStore, identity_patterns

from .conftest import Opener


def ids() -> tuple[str, str]:
    return f"t-{uuid.uuid4().hex[:8]}", f"r-{uuid.uuid4().hex[:8]}"


class StatementCounter:
    """Counts statements the store sends to its driver (every read is one driver call)."""

    def __init__(self, store: SqlEventStore) -> None:
        self.statements: list[str] = []
        self._store = store
        self._real = store._driver.fetch

    async def _fetch(self, sql: str, params: Any) -> Any:
        self.statements.append(sql)
        return await self._real(sql, params)

    def __enter__(self) -> StatementCounter:
        self._store._driver.fetch = self._fetch  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self._store._driver.fetch


@pytest.fixture
def decode_counter(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every content string get_message_seqs decodes."""
    seen: list[Any] = []
    real = sql_events.loads

    def counting(data: Any) -> Any:
        seen.append(data)
        return real(data)

    monkeypatch.setattr(sql_events, "loads", counting)
    return seen


def ai(msg_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "ai", "id": msg_id, "content": "hi", **extra}


async def test_get_message_seqs_prefilters_in_sql(
    store: SqlEventStore, decode_counter: list[Any]
) -> None:
    thread, run = ids()
    await store.put_batch(
        [
            {
                "thread_id": thread,
                "run_id": run,
                "event_type": "llm.ai.response",
                "category": "message",
                "content": ai(f"m{i}"),
            }
            for i in range(300)
        ],
        user_id=None,
    )
    with StatementCounter(store) as counter:
        assert await store.get_message_seqs(thread, ["message:missing"], user_id=None) == {}
    assert decode_counter == [], "a missing identity must not decode any row"
    assert len(counter.statements) == 1, "one statement per get_message_seqs call"
    decode_counter.clear()
    assert await store.get_message_seqs(thread, ["message:m7", "message:m250"], user_id=None) == {
        "message:m7": 8,
        "message:m250": 251,
    }
    # Only candidates are decoded (m7 also prefixes m70..m79 etc.; far fewer than 300).
    assert 2 <= len(decode_counter) <= 20


async def test_like_wildcards_in_identities_are_escaped(
    store: SqlEventStore, decode_counter: list[Any]
) -> None:
    thread, run = ids()
    contents = [
        ai("a%c"),
        ai("abc"),
        ai("a_c"),
        ai("axc"),
        {"type": "tool", "tool_call_id": "x\\_y%", "content": ""},
        {"type": "tool", "tool_call_id": "xZyQ", "content": ""},
        ai('q"\\%'),
    ]
    await store.put_batch(
        [
            {
                "thread_id": thread,
                "run_id": run,
                "event_type": "m",
                "category": "message",
                "content": c,
            }
            for c in contents
        ],
        user_id=None,
    )
    decode_counter.clear()
    found = await store.get_message_seqs(
        thread, ["message:a%c", "message:a_c", "tool:x\\_y%", 'message:q"\\%'], user_id=None
    )
    assert found == {"message:a%c": 1, "message:a_c": 3, "tool:x\\_y%": 5, 'message:q"\\%': 7}
    # Escaped wildcards match literally: abc, axc and xZyQ are never even candidates.
    assert len(decode_counter) == 4
    assert identity_patterns("message:a%c") == ['%"id":"a\\%c%']


async def test_human_user_suffix_and_earliest_seq(store: SqlEventStore) -> None:
    thread, run = ids()
    await store.put(
        thread_id=thread,
        run_id=run,
        event_type="user",
        category="message",
        content={"type": "human", "id": "h1__user"},
        user_id=None,
    )
    await store.put(
        thread_id=thread,
        run_id=run,
        event_type="user",
        category="message",
        content={"type": "human", "id": "h1"},
        user_id=None,
    )
    assert await store.get_message_seqs(thread, ["message:h1"], user_id=None) == {"message:h1": 1}


async def test_put_batch_is_all_or_nothing_after_a_failure_mid_batch(store: SqlEventStore) -> None:
    thread, run = ids()
    # A trigger fails the third row inside the database, after two rows were inserted.
    async with store.engine.begin() as conn:
        if store.engine.dialect.name == "sqlite":
            await conn.exec_driver_sql(
                "CREATE TRIGGER boom BEFORE INSERT ON runstore_events WHEN NEW.content = 'boom' "
                "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
            )
        else:
            await conn.exec_driver_sql(
                "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF NEW.content = 'boom' THEN RAISE EXCEPTION 'injected failure'; END IF; "
                "RETURN NEW; END $$"
            )
            await conn.exec_driver_sql(
                "CREATE TRIGGER boom BEFORE INSERT ON runstore_events FOR EACH ROW EXECUTE FUNCTION boom()"
            )
    batch = [
        {"thread_id": thread, "run_id": run, "event_type": "e", "category": "message", "content": c}
        for c in ("one", "two", "boom", "four")
    ]
    with pytest.raises(Exception, match="injected failure"):
        await store.put_batch(batch, user_id=None)
    assert await store.count_messages(thread, user_id=None) == 0
    assert await store.list_events(thread, run, user_id=None) == []
    retried = await store.put_batch([e for e in batch if e["content"] != "boom"], user_id=None)
    assert [r["seq"] for r in retried] == [1, 2, 3]


async def test_invalid_batch_writes_nothing(store: SqlEventStore) -> None:
    thread, run = ids()
    with pytest.raises(InvalidEventError):
        await store.put_batch(
            [
                {"thread_id": thread, "run_id": run, "event_type": "e", "category": "message"},
                {
                    "thread_id": thread,
                    "run_id": run,
                    "event_type": "e",
                    "category": "message",
                    "content": {"x": float("nan")},
                },
            ],
            user_id=None,
        )
    assert await store.count_messages(thread, user_id=None) == 0


async def test_content_round_trip_and_trace_truncation(open_store: Opener) -> None:
    store = await open_store(run_events={"max_trace_content": 10})
    thread, run = ids()
    big = "é" * 6  # 12 bytes: cut on a character boundary at 10 bytes
    records = await store.put_batch(
        [
            {
                "thread_id": thread,
                "run_id": run,
                "event_type": "t",
                "category": "trace",
                "content": big,
            },
            {
                "thread_id": thread,
                "run_id": run,
                "event_type": "t",
                "category": "trace",
                "content": {"k": "vvvvvvvvvv"},
            },
            {
                "thread_id": thread,
                "run_id": run,
                "event_type": "m",
                "category": "message",
                "content": "[1, 2]",
            },
            {
                "thread_id": thread,
                "run_id": run,
                "event_type": "m",
                "category": "message",
                "content": ["x\u2028y", {"n": 1.5, "b": None}],
                "metadata": {"task_id": "k1"},
            },
        ],
        user_id=None,
    )
    stored = await store.list_events(thread, run, user_id=None)
    assert stored == records
    assert stored[0]["content"] == "é" * 5
    assert stored[0]["metadata"] == {"content_truncated": True, "original_byte_length": 12}
    assert (
        stored[1]["content"] == '{"k":"vvvv' and stored[1]["metadata"]["content_truncated"] is True
    )
    assert stored[2]["content"] == "[1, 2]", "a str that looks like JSON stays a str"
    assert stored[3]["content"] == ["x\u2028y", {"n": 1.5, "b": None}]
    assert await store.list_events(thread, run, task_id="k1", user_id=None) == [records[3]]


async def test_large_message_and_metacharacter_ids_round_trip(store: SqlEventStore) -> None:
    thread = "t'; DROP TABLE runstore_events; --%_\\"
    run = '../r"x'
    content = "x" * (10 * 1024 * 1024)
    record = await store.put(
        thread_id=thread,
        run_id=run,
        event_type="e",
        category="message",
        content=content,
        user_id=None,
    )
    page = await store.list_messages(thread, user_id=None)
    assert page == [record] and len(page[0]["content"]) == len(content)
    assert await store.delete_by_thread(thread, user_id=None) == 1


async def test_owner_filter_applies_to_every_method(store: SqlEventStore) -> None:
    thread, run = ids()
    for owner in ("alice", "bob"):
        await store.put(
            thread_id=thread,
            run_id=run,
            event_type="llm.ai.response",
            category="message",
            content=ai(f"m-{owner}"),
            user_id=owner,
        )
    assert [r["user_id"] for r in await store.list_messages(thread, user_id="alice")] == ["alice"]
    assert len(await store.list_messages(thread, user_id=None)) == 2
    assert await store.count_messages(thread, user_id="bob") == 1
    assert len(await store.list_events(thread, run, user_id="bob")) == 1
    assert len(await store.list_messages_by_run(thread, run, user_id="bob")) == 1
    assert await store.get_last_visible_ai_seq_by_run(thread, user_id="alice") == {run: 1}
    assert await store.get_message_seqs(thread, ["message:m-bob"], user_id="alice") == {}
    assert await store.find_latest_ai_message_run_ids(thread, ["m-bob"], user_id="alice") == {}
    # put_if_absent's existence check ignores the owner.
    record, created = await store.put_if_absent(
        thread_id=thread,
        run_id=run,
        event_type="llm.ai.response",
        category="message",
        user_id="carol",
    )
    assert not created and record["user_id"] == "alice"
    assert await store.delete_by_run(thread, run, user_id="carol") == 0
    assert await store.delete_by_thread(thread, user_id="alice") == 1
    assert await store.count_messages(thread, user_id=None) == 1


async def test_visible_ai_and_task_filters_run_in_sql(store: SqlEventStore) -> None:
    thread, run = ids()
    await store.put_batch(
        [
            {
                "thread_id": thread,
                "run_id": run,
                "event_type": "llm.ai.response",
                "category": "message",
                "content": ai("a"),
            },
            {
                "thread_id": thread,
                "run_id": run,
                "event_type": "llm.ai.response",
                "category": "message",
                "content": ai("b"),
                "metadata": {"caller": "middleware:title"},
            },
            {
                "thread_id": thread,
                "run_id": "r2",
                "event_type": "ai_message",
                "category": "message",
                "content": ai("c"),
                "metadata": {"caller": "agent"},
            },
            {
                "thread_id": thread,
                "run_id": "r3",
                "event_type": "llm.ai.response",
                "category": "trace",
                "content": ai("d"),
            },
        ],
        user_id=None,
    )
    assert await store.get_last_visible_ai_seq_by_run(thread, user_id=None) == {run: 1, "r2": 3}
    assert await store.get_last_visible_ai_seq_by_run(
        thread, run_ids=["r2", "r3"], user_id=None
    ) == {"r2": 3}
    assert await store.get_last_visible_ai_seq_by_run(thread, run_ids=[], user_id=None) == {}


async def test_sqlite_message_pages_use_the_message_index(sqlite_url: str) -> None:
    from runstore.options import BackendOptions
    from runstore.plugins.sqlite.events import SqliteEventStore
    from runstore.urls import BackendURL

    async with BackendOptions.scope() as options:
        store = await SqliteEventStore.open(BackendURL.parse(sqlite_url), options)
        async with store.engine.connect() as conn:
            for sql in (
                "SELECT seq FROM runstore_events WHERE thread_id = 'a' AND category = 'message' "
                "AND seq < 10 ORDER BY seq DESC LIMIT 50",
                "SELECT seq FROM runstore_events WHERE thread_id = 'a' AND category = 'message' "
                "AND seq > 10 ORDER BY seq LIMIT 50",
            ):
                plan = " ".join(
                    str(r[-1]) for r in await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)
                )
                assert "runstore_events_messages" in plan and "TEMP B-TREE" not in plan, plan


async def test_saver_and_event_store_share_one_engine(db_url: str) -> None:
    import runstore

    async with runstore.open(checkpointer=db_url, events=db_url, streams="memory://") as stores:
        saver = stores.checkpointer
        engine = getattr(saver, "engine", None) or getattr(
            getattr(saver, "saver", None), "engine", None
        )
        if engine is None:
            pytest.skip(f"{type(saver).__name__} does not expose its engine")
        assert engine is stores.events.engine  # type: ignore[attr-defined]
        thread, run = ids()
        record = await stores.events.put(
            thread_id=thread, run_id=run, event_type="e", category="message", user_id=None
        )
        assert record["seq"] == 1


async def test_concurrent_mixed_thread_batches_get_contiguous_blocks(store: SqlEventStore) -> None:
    import asyncio

    a, b = ids()

    def batch(first: str, second: str, i: int) -> list[dict[str, Any]]:
        return [
            {
                "thread_id": tid,
                "run_id": f"r{i}",
                "event_type": "e",
                "category": "message",
                "content": f"{i}",
            }
            for tid in (first, second, first)
        ]

    results = await asyncio.gather(
        *(
            store.put_batch(batch(a, b, i) if i % 2 else batch(b, a, i), user_id=None)
            for i in range(12)
        )
    )
    for records in results:
        for thread in (a, b):
            seqs = [r["seq"] for r in records if r["thread_id"] == thread]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (
                "contract: one contiguous block per thread"
            )
    for thread in (a, b):
        stored = [r["seq"] for r in await store.list_messages(thread, limit=1000, user_id=None)]
        assert stored == list(range(1, len(stored) + 1))


NASTY_IDS = ["t'; DROP TABLE runstore_events; --%_\\", "\\'", "a\\\\'b''", "x\ny\tz", "ünï€😀", "", "E'x'"]


@pytest.mark.postgres
@pytest.mark.parametrize("conforming", ["on", "off"])
async def test_thread_literals_read_back_as_the_thread_ids(postgres_url: str, conforming: str) -> None:
    """The lock message inlines thread ids as literals: each reads back as itself."""
    import asyncpg

    from runstore.plugins.postgres.events import text_literal
    from runstore.urls import BackendURL

    url = BackendURL.parse(postgres_url).without_query(*BackendURL.parse(postgres_url).query)
    conn = await asyncpg.connect(url.render(hide_password=False))
    try:
        await conn.execute(f"SET standard_conforming_strings = {conforming}")
        for value in NASTY_IDS:
            assert await conn.fetchval(f"SELECT {text_literal(value)}::text") == value
    finally:
        await conn.close()


@pytest.mark.postgres
@pytest.mark.parametrize("others", [0, 2], ids=["one-thread", "three-threads"])
async def test_a_write_waits_for_its_threads_advisory_lock(
    open_store: Opener, db_url: str, others: int
) -> None:
    """put_batch takes the lock of hashtext(thread_id), metacharacters and all: while
    another session holds it the write waits, and it lands once the lock is released."""
    import asyncio

    import asyncpg

    from runstore.plugins.postgres.events import PG_LOCK_NAMESPACE
    from runstore.urls import BackendURL

    if not db_url.startswith("postgres"):
        pytest.skip("PostgreSQL advisory locks")
    store = await open_store()
    thread = NASTY_IDS[0]
    parsed = BackendURL.parse(db_url)
    conn = await asyncpg.connect(
        parsed.without_query(*parsed.query).render(hide_password=False),
        server_settings={"search_path": parsed.option("schema") or "public"},
    )
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute(f"SELECT pg_advisory_xact_lock({PG_LOCK_NAMESPACE}, hashtext($1))", thread)
        threads = [*NASTY_IDS[1 : 1 + others], thread]
        events = [
            {"thread_id": t, "run_id": "r", "event_type": "e", "category": "message", "content": "x"}
            for t in threads
        ]
        write = asyncio.ensure_future(store.put_batch(events, user_id=None))
        await asyncio.sleep(0.3)
        assert not write.done(), "the write must wait for the thread's lock"
        await tx.rollback()
        records = await asyncio.wait_for(write, 10)
        assert [(r["thread_id"], r["seq"]) for r in records] == [(t, 1) for t in threads]
    finally:
        await conn.close()


async def _raw(db_url: str) -> Any:
    """A raw asyncpg session in the store's schema (PostgreSQL only)."""
    import asyncpg

    from runstore.urls import BackendURL

    parsed = BackendURL.parse(db_url)
    return await asyncpg.connect(
        parsed.without_query(*parsed.query).render(hide_password=False),
        server_settings={"search_path": parsed.option("schema") or "public"},
    )


def _events(thread: str, run: str, n: int) -> list[dict[str, Any]]:
    return [
        {"thread_id": thread, "run_id": run, "event_type": "e", "category": "message", "content": f"{run}-{i}"}
        for i in range(n)
    ]


@pytest.mark.postgres
async def test_concurrent_appends_share_one_transaction(open_store: Opener, db_url: str) -> None:
    """Appends queued while none runs go out as one transaction; each call still gets its
    own records, one contiguous block per thread, other owners' rows kept apart."""
    import asyncio

    if not db_url.startswith("postgres"):
        pytest.skip("the PostgreSQL driver groups appends")
    store = await open_store()
    driver: Any = store._driver
    transactions = 0
    real = driver._insert

    async def counting(calls: Any) -> Any:
        nonlocal transactions
        transactions += 1
        return await real(calls)

    driver._insert = counting
    a, b = ids()
    calls = [
        store.put_batch(_events(a if i % 2 else b, f"r{i}", 3), user_id=f"u{i % 3}") for i in range(12)
    ]
    results = await asyncio.gather(*calls)
    assert transactions == 1, "the twelve calls queued before the first batch started"
    for i, records in enumerate(results):
        assert [r["content"] for r in records] == [f"r{i}-{k}" for k in range(3)]
        seqs = [r["seq"] for r in records]
        assert seqs == list(range(seqs[0], seqs[0] + 3))
    for thread in (a, b):
        stored = await store.list_messages(thread, limit=100, user_id=None)
        assert [r["seq"] for r in stored] == list(range(1, 19))
        for i in range(12):
            mine = await store.list_events(thread, f"r{i}", user_id=f"u{i % 3}")
            assert len(mine) == (3 if (a if i % 2 else b) == thread else 0)


@pytest.mark.postgres
async def test_fenced_appends_share_one_transaction_and_a_stale_one_fails_alone(
    open_store: Opener, db_url: str
) -> None:
    """Fenced appends go out together like unfenced ones, each call's token checked in
    arrival order: a call whose token an earlier call of the same transaction overtook
    is refused alone (`StaleFenceError`), the others commit."""
    import asyncio

    from runstore.errors import StaleFenceError

    if not db_url.startswith("postgres"):
        pytest.skip("the PostgreSQL driver groups appends")
    store = await open_store()
    driver: Any = store._driver
    transactions = 0
    real = driver._insert

    async def counting(calls: Any) -> Any:
        nonlocal transactions
        transactions += 1
        return await real(calls)

    driver._insert = counting
    a, b = ids()
    await store.fence_thread(a, 2)
    results = await asyncio.gather(
        store.put_batch(_events(a, "r2", 2), user_id=None, fence=2),
        store.put_batch(_events(b, "plain", 2), user_id=None),
        store.put_batch(_events(a, "r3", 2), user_id=None, fence=3),
        store.put_batch(_events(a, "stale", 2), user_id=None, fence=2),
        return_exceptions=True,
    )
    assert isinstance(results[3], StaleFenceError), results[3]
    assert not any(isinstance(r, BaseException) for r in results[:3]), results
    assert transactions == 1 + 4, "one shared transaction, then each call on its own after the refusal"
    stored = await store.list_messages(a, limit=100, user_id=None)
    assert [r["content"] for r in stored] == ["r2-0", "r2-1", "r3-0", "r3-1"]
    assert [r["seq"] for r in stored] == [1, 2, 3, 4]
    transactions = 0
    await asyncio.gather(*(store.put_batch(_events(a, f"ok{i}", 1), user_id=None, fence=3) for i in range(5)))
    assert transactions == 1, "fenced appends queued together share one transaction"


@pytest.mark.postgres
async def test_grant_fences_join_the_appends_transaction_and_a_leases_appends_leave_the_fence_row(
    open_store: Opener, db_url: str
) -> None:
    """A grant's `fence_thread` is a call of the appends' group commit: grants and appends
    queued together share one transaction, a stale grant fails alone. An append carrying
    its thread's current token compares without rewriting the fence row."""
    import asyncio

    from runstore.errors import StaleFenceError

    if not db_url.startswith("postgres"):
        pytest.skip("the PostgreSQL driver groups appends")
    store = await open_store()
    driver: Any = store._driver
    transactions = 0
    real = driver._insert

    async def counting(calls: Any) -> Any:
        nonlocal transactions
        transactions += 1
        return await real(calls)

    driver._insert = counting
    a, b = ids()
    c = f"{a}-c"
    await store.fence_thread(c, 5)
    with pytest.raises(StaleFenceError):
        await store.fence_thread(c, 4)
    assert transactions == 0, "a grant alone is one autocommit statement, no transaction"
    results = await asyncio.gather(
        store.put_batch(_events(b, "plain", 1), user_id=None),
        store.fence_thread(a, 3),
        store.fence_thread(b, 2),
        store.put_batch(_events(a, "r3", 2), user_id=None, fence=3),
        return_exceptions=True,
    )
    assert not any(isinstance(r, BaseException) for r in results), results
    assert transactions == 1, "grants and appends queued together share one transaction"
    for thread, token in ((a, 3), (b, 2)):
        with pytest.raises(StaleFenceError) as refused:
            await store.put_batch(_events(thread, "stale", 1), user_id=None, fence=token - 1)
        assert refused.value.current == token, "the shared transaction raised each thread's fence"
    transactions = 0
    results = await asyncio.gather(
        store.put_batch(_events(b, "plain2", 1), user_id=None),
        store.fence_thread(a, 4),
        store.fence_thread(c, 4),
        return_exceptions=True,
    )
    assert isinstance(results[2], StaleFenceError) and results[2].current == 5, results
    assert not any(isinstance(r, BaseException) for r in results[:2]), results
    assert transactions == 1 + 3, "one shared transaction, then each call on its own after the refusal"
    with pytest.raises(StaleFenceError):
        await store.put_batch(_events(a, "stale", 1), user_id=None, fence=3)
    conn = await _raw(db_url)
    try:
        row = "SELECT fence, xmin::text FROM runstore_event_fences WHERE thread_id = $1"
        before = await conn.fetchrow(row, a)
        assert before["fence"] == 4
        for i in range(3):
            await store.put_batch(_events(a, f"r4-{i}", 1), user_id=None, fence=4)
        assert await conn.fetchrow(row, a) == before, "an append with the current token wrote the fence row"
        await store.put_batch(_events(a, "r5", 1), user_id=None, fence=5)
        assert (await conn.fetchrow(row, a))["fence"] == 5, "a newer token raises the fence"
    finally:
        await conn.close()
    stored = await store.list_messages(a, limit=100, user_id=None)
    assert [r["content"] for r in stored] == ["r3-0", "r3-1", "r4-0-0", "r4-1-0", "r4-2-0", "r5-0"]


@pytest.mark.postgres
async def test_an_append_the_database_refuses_fails_alone(open_store: Opener, db_url: str) -> None:
    """One call of a shared transaction refused by the server: the others commit, the
    refused one raises and wrote nothing."""
    import asyncio

    from runstore.errors import BackendRefusedError

    if not db_url.startswith("postgres"):
        pytest.skip("the PostgreSQL driver groups appends")
    store = await open_store()
    conn = await _raw(db_url)
    try:
        await conn.execute(
            "CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused'; END $$; "
            "CREATE TRIGGER refuse_bad BEFORE INSERT ON runstore_events "
            "FOR EACH ROW WHEN (NEW.run_id = 'bad') EXECUTE FUNCTION refuse_bad()"
        )
        thread, _ = ids()
        results = await asyncio.gather(
            store.put_batch(_events(thread, "ok1", 2), user_id=None),
            store.put_batch(_events(thread, "bad", 2), user_id=None),
            store.put_batch(_events(thread, "ok2", 2), user_id=None),
            return_exceptions=True,
        )
        assert isinstance(results[1], BackendRefusedError), results[1]
        stored = await store.list_messages(thread, limit=100, user_id=None)
        assert [r["content"] for r in stored] == ["ok1-0", "ok1-1", "ok2-0", "ok2-1"]
        assert [r["seq"] for r in stored] == [1, 2, 3, 4]
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_a_caller_cancelled_in_flight_returns_once_its_transaction_ended(
    open_store: Opener, db_url: str
) -> None:
    """Cancelled while its append waits inside the shared transaction, the caller returns
    only when that transaction has ended: then no session is left in it."""
    import asyncio

    from runstore.plugins.postgres.events import PG_LOCK_NAMESPACE

    if not db_url.startswith("postgres"):
        pytest.skip("the PostgreSQL driver groups appends")
    thread, _ = ids()
    # The store's sessions carry their own name: the check below must not see another
    # test's sessions on the same database (tests run in parallel).
    app = f"cancel-{thread}"[:63]
    store = await open_store(postgres={"application_name": app})
    conn = await _raw(db_url)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute(f"SELECT pg_advisory_xact_lock({PG_LOCK_NAMESPACE}, hashtext($1))", thread)
        call = asyncio.ensure_future(store.put_batch(_events(thread, "r", 2), user_id=None))
        await asyncio.sleep(0.3)  # its transaction waits for the lock
        call.cancel()
        await asyncio.sleep(0.3)
        assert not call.done(), "returned while its transaction was still open"
        in_transaction = "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND xact_start IS NOT NULL"
        assert await conn.fetch(in_transaction, app), "the check sees the store's waiting session"
        await tx.rollback()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(call, 10)
        busy = await conn.fetch(in_transaction, app)
        assert not busy, "a session is still inside the append's transaction"
        stored = await store.list_messages(thread, limit=100, user_id=None)
        assert [r["content"] for r in stored] == ["r-0", "r-1"], "taken into a transaction: committed whole"
    finally:
        await conn.close()
