"""Worker processes for the cross-process event store race (spawned, so importable by name)."""

from __future__ import annotations

from typing import Any

from .processes import errors_travel, with_backend


@errors_travel
def race_worker(
    url: str, plugins: list[str], thread_id: str, index: int, rounds: int, barrier: Any
) -> dict[str, Any]:
    """Open the store at ``url`` in this process and race put_if_absent + put_batch.

    Returns ``{"claims": [[(record, created)], ...per round], "batches": [[seq, ...], ...]}``
    with records reduced to their contract fields.
    """
    from .events_model import core

    async def body(store: Any) -> dict[str, Any]:
        claims: list[list[tuple[dict[str, Any], bool]]] = []
        batches: list[list[int]] = []
        barrier.wait(timeout=120)
        for k in range(rounds):
            record, created = await store.put_if_absent(
                thread_id=thread_id, run_id=f"run-{k}", event_type="run.end",
                category="lifecycle", content={"by": index}, user_id=None,
            )
            claims.append([(core(record), created)])
            records = await store.put_batch(
                [
                    {"thread_id": thread_id, "run_id": f"w{index}", "event_type": "tool.result",
                     "category": "trace", "content": {"k": k, "j": j}}
                    for j in range(2)
                ],
                user_id=None,
            )
            batches.append([r["seq"] for r in records])
        return {"claims": claims, "batches": batches}

    return with_backend("events", url, plugins, body)
