"""The saver contract for put_writes: first write wins per (task_id, idx), special slots
last write wins, pending_writes in writes_sort_key order.
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, RESUME, SCHEDULED

from ..savers_checks import (
    collect,
    norm_writes,
)
from ..savers_model import (
    PATHS,
    TASKS,
    WritesModel,
    config_for,
    make_checkpoint,
    named,
    new_checkpoint_id,
    new_thread_id,
)


def test_put_writes_idempotent_and_sorted(saver_target: Any) -> None:
    """put_writes: first write wins per (task_id, idx), special slots last-write-wins,
    pending_writes in writes_sort_key order."""
    # One call holds normal channels or special ones, never both: LangGraph writes a
    # task's results, an error, an interrupt or a resume in separate calls, and the stock
    # SQL savers decide first- or last-write-wins per call from that.
    normal = st.sampled_from(["messages", "other"])
    special = st.sampled_from([ERROR, INTERRUPT, RESUME, SCHEDULED])
    value = st.integers(0, 1000)
    batches = st.lists(
        st.tuples(
            st.sampled_from(TASKS),
            st.one_of(
                st.lists(st.tuples(normal, value), min_size=1, max_size=4),
                st.lists(st.tuples(special, value), min_size=1, max_size=2),
            ),
        ),
        min_size=1,
        max_size=8,
    )
    with saver_target.session() as session:

        # A task keeps one path (LangGraph derives it from the task), so each example
        # draws which path each task has.
        @given(calls=batches, paths=st.permutations(PATHS))
        # Known edges: a retried task (the first write of a slot wins), a special slot
        # written twice (the last wins), two tasks whose path order differs from id order.
        @example(calls=[("task-a", [("messages", 1), ("other", 2)]), ("task-a", [("messages", 3)]),
                        ("task-b", [(ERROR, 4)]), ("task-b", [(ERROR, 5)])],
                 paths=["", "~", "~__pregel_pull, n2", "~__pregel_pull, n1"])
        def check(calls: list[tuple[str, list[tuple[str, int]]]], paths: list[str]) -> None:
            async def body() -> None:
                saver = session.backend
                thread, cid = new_thread_id(), new_checkpoint_id()
                cfg = await saver.aput(config_for(thread), make_checkpoint(cid, {}, {}), {}, {})
                model = WritesModel()
                for task_id, writes in calls:
                    task_path = paths[TASKS.index(task_id)]
                    await saver.aput_writes(cfg, writes, task_id, task_path)
                    model.put(task_id, task_path, writes)
                got = await saver.aget_tuple(config_for(thread, cid))
                assert got is not None
                expected = model.ordered()
                actual = norm_writes(got.pending_writes)
                if sorted(map(repr, actual)) == sorted(map(repr, expected)):
                    assert actual == expected, (
                        named(f"{actual} != {expected} (contract: pending_writes in writes_sort_key "
                        "order: task_path, task_id, idx)")
                    )
                assert actual == expected, (
                    named(f"{actual} != {expected} (contract: put_writes is first-write-wins per "
                    "(task_id, idx) for normal channels, last-write-wins for special slots)")
                )
                listed = await collect(saver, config_for(thread))
                assert norm_writes(listed[0].pending_writes) == expected, (
                    "contract: list returns the same pending_writes as get_tuple"
                )

            session.run(body())

        check()
