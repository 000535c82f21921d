"""The PostgreSQL run store when its server goes away: runstore errors, then recovery."""

from __future__ import annotations

import pytest

from runstore.errors import BackendUnavailableError
from runstore.options import BackendOptions
from runstore.urls import BackendURL

from .servers import PostgresServer

pytestmark = [pytest.mark.faults, pytest.mark.postgres]


async def test_a_stopped_server_is_unavailable_then_the_store_recovers(postgres_server: PostgresServer) -> None:
    from runstore.plugins.postgres.runs import PostgresRunStore

    options = BackendOptions()
    try:
        store = await PostgresRunStore.open(BackendURL.parse(postgres_server.url()), options)
        await store.create("t", run_id="a")
        postgres_server.stop()
        for call in (store.get("a"), store.create("t", run_id="b"), store.start("a", "w", 5)):
            with pytest.raises(BackendUnavailableError) as info:
                await call
            assert info.value.write_may_have_happened is False
            assert info.value.__cause__ is not None
        postgres_server.start()
        run = await store.start("a", "w", 5)
        assert run["status"] == "running" and run["fence"] == 1
        assert [r["run_id"] for r in await store.list_by_thread("t")] == ["a"], "nothing was written"
    finally:
        await options.aclose()
