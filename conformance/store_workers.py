"""Worker processes for the store's cross-process test (spawned, so importable by name).

Every worker opens the store by URL in its own process and runs its share of a plan in
rounds that all workers start together (a barrier): its writes, then, once every worker
has written, what it reads back. The parent checks what each saw.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from .processes import errors_travel, with_backend

Namespace = tuple[str, ...]
Slot = tuple[Namespace, str]
#: ``("put", namespace, key, value)`` or ``("delete", namespace, key, None)``.
StoreOp = tuple[str, Namespace, str, Any]

#: The TTL phase's clock start, and the seconds after it at which each step happens.
TTL_EPOCH = datetime(2003, 3, 3, tzinfo=UTC)
TTL_READ_AT, TTL_SWEEP_AT, TTL_CHECK_AT = 50, 61, 55
#: The TTL phase's items: ttl in minutes, as LangGraph counts it (None: never expires).
TTL_ITEMS: dict[str, float | None] = {"short1": 1, "short2": 1, "refreshed": 1, "kept": None}


async def read_all(store: Any, root: Namespace, slots: list[Slot]) -> dict[str, Any]:
    """Everything a reader can see under ``root``: a get per slot, a search, a listing."""
    gets = {}
    for ns, key in slots:
        item = await store.aget(ns, key, refresh_ttl=False)
        gets[(ns, key)] = None if item is None else item.value
    found = await store.asearch(root, limit=1000, refresh_ttl=False)
    listed = await store.alist_namespaces(prefix=root, limit=1000)
    return {
        "gets": gets,
        "search": {(tuple(i.namespace), i.key): i.value for i in found},
        "namespaces": [tuple(ns) for ns in listed],
    }


async def _ttl_phase(store: Any, ns: Namespace, role: str, barrier: Any) -> dict[str, Any]:
    """The writer puts TTL items and reads them (one refreshing), the sweeper sweeps later on
    its clock, then the writer reads again on a clock where nothing it put has expired yet."""
    from runstore.clock import ManualClock

    out: dict[str, Any] = {}
    clock = ManualClock(TTL_EPOCH)
    store.clock = clock
    barrier.wait(timeout=120)
    if role == "writer":
        for key, ttl in TTL_ITEMS.items():
            await store.aput(ns, key, {"key": key}, ttl=ttl)
        clock.set(TTL_EPOCH + timedelta(seconds=TTL_READ_AT))
        for key in TTL_ITEMS:
            await store.aget(ns, key, refresh_ttl=key == "refreshed")
    barrier.wait(timeout=120)
    if role == "sweeper":
        clock.set(TTL_EPOCH + timedelta(seconds=TTL_SWEEP_AT))
        out["swept"] = await store.asweep_expired()
    barrier.wait(timeout=120)
    if role == "writer":
        clock.set(TTL_EPOCH + timedelta(seconds=TTL_CHECK_AT))
        out["seen"] = await read_all(store, ns, [(ns, key) for key in TTL_ITEMS])
    return out


@errors_travel
def store_worker(
    url: str,
    plugins: list[str],
    root: Namespace,
    rounds: list[list[StoreOp]],
    own: Namespace,
    slots: list[Slot],
    ttl: tuple[str, Namespace] | None,
    barrier: Any,
) -> dict[str, Any]:
    """Open the store at ``url`` in this process and run ``rounds`` (module docstring).

    Returns ``{"own": [...], "read": [...], "ttl": {...}}``: per round, what a search of
    this worker's own namespace ``own`` (written by no other worker) found right after
    its writes, and what `read_all` found once every worker had written; then what the
    TTL phase saw: ``ttl`` is this worker's role (``"writer"``, ``"sweeper"`` or
    ``"idle"``) and the namespace of the phase's items (``None``: no TTL phase).
    """

    async def body(store: Any) -> dict[str, Any]:
        try:
            return await _run(store)
        except BaseException:
            # The other workers stop at their next barrier instead of waiting it out.
            barrier.abort()
            raise

    async def _run(store: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"own": [], "read": [], "ttl": {}}
        for ops in rounds:
            barrier.wait(timeout=120)
            for action, ns, key, value in ops:
                if action == "put":
                    await store.aput(ns, key, value)
                else:
                    await store.adelete(ns, key)
            # Searched while the other workers may still be writing elsewhere.
            found = await store.asearch(own, limit=1000, refresh_ttl=False)
            out["own"].append({i.key: i.value for i in found})
            barrier.wait(timeout=120)
            out["read"].append(await read_all(store, root, slots))
        if ttl is not None:
            role, ns = ttl
            out["ttl"] = await _ttl_phase(store, ns, role, barrier)
        return out

    return with_backend("store", url, plugins, body)
