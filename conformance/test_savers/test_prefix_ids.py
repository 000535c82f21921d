"""Which thread, namespace or run an id names. Ids that are prefixes of other ids
(``t1`` / ``t10``, ``child`` / ``child:1``, ``r1`` / ``r10``) and ids holding SQL
``LIKE`` wildcards (``t_``) name exactly one thread, namespace or run in every call that
takes them: get, list, delete, copy, prune, delete for runs and retention sweeps; a
non-str id names its ``str``; empty ids are refused.
Assertion messages name the contract that broke.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver

from runstore.checkpoint.policy import RetentionPolicy
from runstore.errors import InvalidSaverInputError

from ..savers_model import (
    as_metadata,
    config_for,
    make_checkpoint,
    new_checkpoint_id,
    new_thread_id,
)

__all__ = [
    "test_non_str_ids_name_their_str_and_empty_ids_are_refused",
    "test_prefix_ids_copy_copies_one_thread",
    "test_prefix_ids_delete_for_runs_takes_one_run",
    "test_prefix_ids_get_list_and_delete_name_one_thread_and_namespace",
    "test_prefix_ids_prune_takes_one_thread",
    "test_prefix_ids_sweep_takes_one_thread",
]

Saver = BaseCheckpointSaver[Any]
NAMESPACES = ("", "child", "child:1")
CONTRACT = "ids that are prefixes of other ids (or hold LIKE wildcards) name exactly one"


def _family() -> list[str]:
    base = new_thread_id()
    return [base, base + "0", base + "_", base + "x"]


async def _write(saver: Saver, thread: str, run: str = "r1", depth: int = 2) -> None:
    """``depth`` checkpoints with pending writes in each of `NAMESPACES`, by run ``run``."""
    for ns in NAMESPACES:
        parent = None
        for step in range(depth):
            cid = new_checkpoint_id()
            version = f"{step + 1:032}.0"
            await saver.aput(
                config_for(thread, parent, ns),
                make_checkpoint(cid, {"v": f"{thread}|{ns}|{step}"}, {"v": version}),
                as_metadata({"run_id": run, "step": step}), {"v": version},
            )
            await saver.aput_writes(config_for(thread, cid, ns), [("w", f"{thread}|{ns}|{step}")], "task", "")
            parent = cid


async def _snapshot(saver: Saver, thread: str) -> dict[str, list[tuple[str, Any, list[Any]]]]:
    out = {}
    for ns in NAMESPACES:
        out[ns] = [
            (t.config["configurable"]["checkpoint_id"], t.checkpoint["channel_values"].get("v"),
             sorted(repr(w) for w in t.pending_writes or []))
            async for t in saver.alist(config_for(thread, None, ns))
        ]
    return out


async def _unchanged(saver: Saver, before: dict[str, Any], what: str) -> None:
    for thread, was in before.items():
        now = await _snapshot(saver, thread)
        assert now == was, (
            f"contract: {CONTRACT} thread: {what} changed thread {thread!r}, which it does not name"
        )


def test_prefix_ids_get_list_and_delete_name_one_thread_and_namespace(saver_target: Any) -> None:
    """get_tuple and list of a thread or namespace see only it (``child`` is not
    ``child:1``); delete_thread of ``t`` and ``t_`` leaves ``t0`` and ``tx`` whole."""

    async def body(saver: Saver) -> None:
        family = _family()
        for thread in family:
            await _write(saver, thread)
        for thread in family:
            snap = await _snapshot(saver, thread)
            for ns, rows in snap.items():
                values = {v for _, v, _ in rows}
                assert values == {f"{thread}|{ns}|0", f"{thread}|{ns}|1"}, (
                    f"contract: {CONTRACT} thread and namespace: list({thread!r}, ns={ns!r}) gave {values}"
                )
                got = await saver.aget_tuple(config_for(thread, None, ns))
                assert got is not None and got.checkpoint["channel_values"]["v"] == f"{thread}|{ns}|1", (
                    f"contract: {CONTRACT} namespace: the latest of ({thread!r}, {ns!r}) is its own"
                )
        for doomed in (family[0], family[2]):
            keep = {t: await _snapshot(saver, t) for t in family if t not in (family[0], family[2])}
            await saver.adelete_thread(doomed)
            await _unchanged(saver, keep, f"delete_thread({doomed!r})")
            assert await saver.aget_tuple(config_for(doomed)) is None
        for thread in family:
            await saver.adelete_thread(thread)

    saver_target.run(body)


@pytest.mark.requires("copy_thread")
def test_prefix_ids_copy_copies_one_thread(saver_target: Any) -> None:
    """copy_thread(``t``, ``c``) copies ``t`` alone (not ``t0``, ``t_``, ``tx``) and
    changes no thread whose id ``c`` is a prefix of."""

    async def body(saver: Saver) -> None:
        family = _family()
        for thread in family:
            await _write(saver, thread)
        target = new_thread_id("copy")
        await _write(saver, target + "0")
        keep = {t: await _snapshot(saver, t) for t in [*family, target + "0"]}
        await saver.acopy_thread(family[0], target)
        await _unchanged(saver, keep, f"copy_thread({family[0]!r}, {target!r})")
        copied = await _snapshot(saver, target)
        assert copied == keep[family[0]], (
            f"contract: {CONTRACT} thread: copy_thread copies the named thread and nothing else"
        )
        for thread in [*family, target, target + "0"]:
            await saver.adelete_thread(thread)

    saver_target.run(body)


@pytest.mark.requires("prune")
def test_prefix_ids_prune_takes_one_thread(saver_target: Any) -> None:
    """prune([``t``]) (keep_latest) and prune([``t_``], delete) leave ``t0`` and ``tx`` whole."""

    async def body(saver: Saver) -> None:
        family = _family()
        for thread in family:
            await _write(saver, thread)
        keep = {t: await _snapshot(saver, t) for t in (family[1], family[3])}
        await saver.aprune([family[0]], strategy="keep_latest")
        await saver.aprune([family[2]], strategy="delete")
        await _unchanged(saver, keep, "prune")
        for thread in family:
            await saver.adelete_thread(thread)

    saver_target.run(body)


@pytest.mark.requires("delete_for_runs")
def test_prefix_ids_delete_for_runs_takes_one_run(saver_target: Any) -> None:
    """delete_for_runs([``r``]) leaves the checkpoints of runs ``r0``, ``r_`` and ``rx``."""

    async def body(saver: Saver) -> None:
        run = new_thread_id("run")
        family = _family()
        runs = [run, run + "0", run + "_", run + "x"]
        for thread, owner in zip(family, runs, strict=True):
            await _write(saver, thread, owner)
        keep = {t: await _snapshot(saver, t) for t in family[1:]}
        await saver.adelete_for_runs([run])
        await _unchanged(saver, keep, f"delete_for_runs([{run!r}])")
        for thread in family:
            await saver.adelete_thread(thread)

    saver_target.run(body)


@pytest.mark.requires("retention")
def test_prefix_ids_sweep_takes_one_thread(saver_target: Any) -> None:
    """A sweep (and a purge) restricted to ``t`` / ``t_`` examines and trims only them."""

    async def body(saver: Saver) -> None:
        family = _family()
        for thread in family:
            await _write(saver, thread, depth=3)
        keep = {t: await _snapshot(saver, t) for t in (family[1], family[3])}
        batch = await saver.asweep(  # type: ignore[attr-defined]
            RetentionPolicy(keep_last=1), limit=100, thread_ids=[family[0], family[2]]
        )
        examined = sorted(t.thread_id for t in batch.threads)
        assert examined == sorted([family[0], family[2]]), (
            f"contract: {CONTRACT} thread: a sweep of thread_ids examines those threads only; got {examined}"
        )
        await _unchanged(saver, keep, "asweep(thread_ids=...)")
        await saver.apurge_threads([family[0]])  # type: ignore[attr-defined]
        await _unchanged(saver, keep, "apurge_threads")
        for thread in family:
            await saver.adelete_thread(thread)

    saver_target.run(body)


@pytest.mark.requires("checked_ids")
def test_non_str_ids_name_their_str_and_empty_ids_are_refused(saver_target: Any) -> None:
    """An int thread id names the same thread as its ``str`` (put with one, read and list
    with the other); an empty ``thread_id``, a put_writes config without a checkpoint id and
    an empty ``task_id`` raise InvalidSaverInputError naming the field, writing nothing."""

    async def body(saver: Saver) -> None:
        number = int(new_thread_id("")[1:13], 16)
        cid = new_checkpoint_id()
        config: Any = {"configurable": {"thread_id": number, "checkpoint_ns": ""}}
        await saver.aput(config, make_checkpoint(cid, {}, {}), as_metadata({}), {})
        got = await saver.aget_tuple(config_for(str(number)))
        assert got is not None and got.checkpoint["id"] == cid, (
            "contract: a non-str id names the same thread as its str (1 and '1' are one thread)"
        )
        listed = [t async for t in saver.alist({"configurable": {"thread_id": number}})]
        assert [t.checkpoint["id"] for t in listed] == [cid], (
            "contract: a non-str id names the same thread as its str, in list too"
        )
        empty = new_thread_id()
        refusals: list[tuple[str, Any]] = [
            ("thread_id", saver.aput(config_for(""), make_checkpoint(new_checkpoint_id(), {}, {}), as_metadata({}), {})),
            ("checkpoint_id", saver.aput_writes(config_for(empty), [("a", 1)], "task", "")),
            ("task_id", saver.aput_writes(config_for(str(number), cid), [("a", 1)], "", "")),
        ]
        for field, call in refusals:
            with pytest.raises(InvalidSaverInputError) as raised:
                await call
            assert field in str(raised.value), (
                f"contract: an empty or missing {field} is refused naming it; got {raised.value!r}"
            )
        again = await saver.aget_tuple(config_for(str(number), cid))
        assert again is not None and not again.pending_writes, "contract: a refused write stores nothing"
        await saver.adelete_thread(str(number))

    saver_target.run(body)
