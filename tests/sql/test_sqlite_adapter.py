"""The aiosqlite adapter: the private surface it relies on is there, and its absence is loud."""

from __future__ import annotations

import sqlite3
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from runstore.errors import UnsupportedDriverError
from runstore.options import BackendOptions
from runstore.plugins.sqlite import adapter
from runstore.plugins.sqlite.adapter import WorkerConnection, WriterAndReader, check_surface
from runstore.plugins.sqlite.engine import shared_engine
from runstore.urls import BackendURL

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def _pinned() -> Requirement:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (pin,) = [Requirement(d) for d in deps if Requirement(d).name == "aiosqlite"]
    return pin


def test_the_pin_is_the_adapters_range_and_has_an_upper_bound() -> None:
    pin = _pinned()
    assert str(pin.specifier) == str(Requirement("aiosqlite" + adapter.SUPPORTED_AIOSQLITE).specifier), (
        "pyproject.toml pins aiosqlite to the range runstore.plugins.sqlite.adapter supports"
    )
    assert any(spec.operator == "<" for spec in pin.specifier), "the aiosqlite pin has an upper bound"
    from importlib.metadata import version

    assert Version(version("aiosqlite")) in pin.specifier


async def test_the_installed_aiosqlite_has_the_private_surface(tmp_path: Path) -> None:
    """Fails with UnsupportedDriverError's message when aiosqlite moves _execute or _conn."""
    import aiosqlite

    async with aiosqlite.connect(tmp_path / "a.db") as aconn:
        raw = check_surface(aconn)
        assert isinstance(raw, sqlite3.Connection)


async def test_a_worker_connection_runs_whole_functions_on_its_thread(tmp_path: Path) -> None:
    async with BackendOptions.scope() as options:
        engine = await shared_engine(BackendURL.for_file("sqlite", tmp_path / "w.db"), options)
        conn = await WorkerConnection.checkout(engine)
        seen: list[Any] = []

        def work(raw: sqlite3.Connection, a: int, *, b: int) -> int:
            seen.append((threading.current_thread() is threading.main_thread(), type(raw)))
            raw.execute("CREATE TABLE t (x INTEGER)")
            raw.executemany("INSERT INTO t VALUES (?)", [(a,), (b,)])
            return int(raw.execute("SELECT sum(x) FROM t").fetchone()[0])

        assert await conn.run(work, 2, b=3) == 5
        assert seen == [(False, sqlite3.Connection)], "runs in the worker thread on sqlite3"

        def boom(raw: sqlite3.Connection) -> None:
            raise KeyError("inside")

        with pytest.raises(KeyError, match="inside"):
            await conn.run(boom)
        assert engine.pool.checkedout() == 1, "held out of the pool until closed"
        await conn.close()
        await conn.close()
        assert conn.closed and engine.pool.checkedout() == 0
        with pytest.raises(RuntimeError, match="closed"):
            await conn.run(work, 1, b=1)


class _NoExecute:
    _conn = sqlite3.connect(":memory:")


class _SyncExecute:
    _conn = sqlite3.connect(":memory:")

    def _execute(self, fn: Any, *args: Any) -> Any:
        return fn(*args)


class _NoKeywordsExecute:
    _conn = sqlite3.connect(":memory:")

    async def _execute(self, fn: Any, *args: Any) -> Any:
        return fn(*args)


class _NoConn:
    async def _execute(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


class _WrongConn(_NoConn):
    _conn = object()


@pytest.mark.parametrize(
    ("fake", "problem"),
    [
        (_NoExecute, "_execute is missing"),
        (_SyncExecute, "no longer a coroutine"),
        (_NoKeywordsExecute, "changed its signature"),
        (_NoConn, "_conn is missing"),
        (_WrongConn, "not a sqlite3.Connection"),
    ],
)
def test_a_changed_private_surface_is_a_clear_error(fake: type, problem: str) -> None:
    with pytest.raises(UnsupportedDriverError, match=problem) as info:
        check_surface(fake())
    message = str(info.value)
    assert "aiosqlite" in message and adapter.SUPPORTED_AIOSQLITE in message, (
        "the error names the supported aiosqlite range to install"
    )


async def test_writer_and_reader_commit_or_roll_back_whole_functions(tmp_path: Path) -> None:
    async with BackendOptions.scope() as options:
        engine = await shared_engine(BackendURL.for_file("sqlite", tmp_path / "p.db"), options)
        pair = WriterAndReader(engine, "this test store is closed")
        await pair.start()

        def insert(raw: sqlite3.Connection, *values: int) -> None:
            raw.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
            for value in values:
                if value < 0:
                    raise ValueError("negative")
                raw.execute("INSERT INTO t VALUES (?)", (value,))

        def rows(raw: sqlite3.Connection) -> list[int]:
            return [r[0] for r in raw.execute("SELECT x FROM t ORDER BY x")]

        await pair.write(insert, 1, 2)
        with pytest.raises(ValueError, match="negative"):
            await pair.write(insert, 3, -1)
        assert await pair.read(rows) == [1, 2], "a write that raised left nothing behind"
        await pair.close()
        with pytest.raises(RuntimeError, match="this test store is closed"):
            await pair.read(rows)
