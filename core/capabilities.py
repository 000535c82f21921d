"""The capability vocabulary backends declare and conformance tests require."""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    """The kinds of storage a plugin can provide."""

    SAVER = "saver"
    EVENTS = "events"
    STREAMS = "streams"
    RUNS = "runs"
    HISTORY_CACHE = "history_cache"
    STORE = "store"


#: Every capability a backend may declare, with what it promises. The conformance
#: suite checks the promise for each declared capability.
CAPABILITIES: dict[str, str] = {
    "durable": "data survives closing and reopening the backend",
    "cross_process": "several OS processes may share the backend and stay consistent",
    "owner_filter": "user_id filters every read and is stored on every write",
    "copy_thread": "saver implements acopy_thread/copy_thread with the whole parent chain",
    "prune": "saver implements aprune/prune and keeps delta reconstruction intact",
    "delete_for_runs": "saver implements adelete_for_runs/delete_for_runs",
    "delta_history": "saver overrides the delta-history walk natively",
    "sync_api": "saver implements the synchronous twins of its async methods",
    "thread_index": "saver keeps a per-thread record with its writes: get_thread/list_threads "
    "(filters, status, keyset cursors), and a deletion tombstone that refuses late writes",
    "retention": "saver applies a RetentionPolicy in claimed batches (asweep, "
    "aset_thread_retention, afinish_cleanup): keeps every resume and delta reconstruction "
    "intact, expires idle threads whole, dry runs change nothing",
    "fencing": "writes carrying a fencing token older than one the thread has seen are "
    "refused with StaleFenceError, atomically with the write (savers: put/put_writes with "
    "configurable.runstore_fence, delete_thread(fence=), afence_thread; event stores: "
    "put/put_batch/put_if_absent(fence=), fence_thread; stream bridges: publish/publish_end(fence=), "
    "fence_stream, per run)",
    "typed_filters": "saver's list() metadata filter follows runstore's rule (docs/savers.md): "
    "values compared as JSON types (a bool never matches a number, 1 matches 1.0), None also "
    "matches an absent key",
    "global_list_order": "saver's list() without a thread_id spans every thread in one order, "
    "(checkpoint_id, thread_id, checkpoint_ns) descending, with before and limit on that order",
    "checked_ids": "saver refuses ids, namespaces, task ids, channels and metadata no backend can "
    "store (a NUL, a lone surrogate, keys with no or colliding JSON text) with "
    "InvalidSaverInputError naming the field, writing nothing; metadata reads back in its JSON form",
    "replay": "stream bridge replays retained events to late subscribers",
    "store_clock": "store reads time from its `clock` attribute (a runstore.clock Clock): "
    "created_at kept across updates, updated_at set by each put",
    "store_ttl": "store expires items by TTLConfig and per-put ttl on its clock: refresh_on_read "
    "and refresh_ttl honoured, expired items never returned, asweep_expired() deletes them",
    "store_nested_filters": "store's search filter reaches nested keys, by dotted path ('a.b') "
    "and by a nested mapping matching as a subset",
    "store_numeric_filters": "store's $gt/$gte/$lt/$lte compare numbers as numbers and strings "
    "as strings (never a number's text), and never match another JSON type",
    "store_vector_search": "store takes index={'dims','embed','fields'}: search(query=) ranks "
    "by cosine similarity of the embedded fields, score in SearchItem.score, per-put index",
    "store_ordered_batch": "ops of one store batch apply in order: a get, search or listing "
    "sees the puts before it in the batch (LangGraph's stock stores read before they write)",
    "store_namespace_cleanup": "store's list_namespaces lists a namespace only while it holds a "
    "live item: reads and deletes never create one, deleting its last item removes it",
    "checked_store_input": "store refuses invalid namespaces, keys, values, filters, ttl and "
    "index fields with InvalidStoreInputError naming the problem, writing nothing",
    "cache_max_entries": "history cache holds at most checkpoint_cache.max_entries entries and evicts "
    "the least recently used first (a get is a use)",
    "bulk_import": "saver exports threads as stored rows and imports many threads in one transaction "
    "with their record's times (runstore.checkpoint.bulk.BulkSaver: aexport_thread_rows, "
    "aheld_thread_ids, aimport_thread_rows); event store lists its threads, reads a feed across owners and writes records "
    "back under their original seq, created_at and owner (runstore.events.bulk.BulkEventStore); run "
    "store lists its threads, exports a thread's runs as stored and imports them with their statuses, "
    "times and fencing counters (aexport_run_thread_ids, aexport_runs, aimport_runs); both "
    "insert-if-absent, one transaction per call: what runstore migrate/import need; store lists its namespaces, "
    "exports a namespace's live items with their times, TTL and expiry and imports them as they were "
    "(aexport_namespaces, aexport_items, aimport_items; runstore.store.bulk.BulkStore)",
}


_SAVER = frozenset({Kind.SAVER})
_STORE = frozenset({Kind.STORE})
#: The kinds each capability can be promised by (and tested on).
CAPABILITY_KINDS: dict[str, frozenset[Kind]] = {
    "durable": frozenset(Kind),
    "cross_process": frozenset(Kind),
    "owner_filter": frozenset({Kind.EVENTS}),
    "copy_thread": _SAVER,
    "prune": _SAVER,
    "delete_for_runs": _SAVER,
    "delta_history": _SAVER,
    "sync_api": frozenset({Kind.SAVER, Kind.STORE}),
    "thread_index": _SAVER,
    "retention": _SAVER,
    "fencing": frozenset({Kind.SAVER, Kind.EVENTS, Kind.STREAMS}),
    "typed_filters": _SAVER,
    "global_list_order": _SAVER,
    "checked_ids": _SAVER,
    "replay": frozenset({Kind.STREAMS}),
    "store_clock": _STORE,
    "store_ttl": _STORE,
    "store_nested_filters": _STORE,
    "store_numeric_filters": _STORE,
    "store_vector_search": _STORE,
    "store_ordered_batch": _STORE,
    "store_namespace_cleanup": _STORE,
    "checked_store_input": _STORE,
    "bulk_import": frozenset({Kind.SAVER, Kind.EVENTS, Kind.RUNS, Kind.STORE}),
    "cache_max_entries": frozenset({Kind.HISTORY_CACHE}),
}


def validate_capabilities(caps: object, *, where: str) -> frozenset[str]:
    """Return ``caps`` as a frozenset, rejecting names outside `CAPABILITIES`."""
    from runstore.errors import PluginError

    if isinstance(caps, str):
        raise PluginError(f"{where}: capabilities must be a collection of names, not a string")
    names = frozenset(caps)  # type: ignore[call-overload]
    unknown = sorted(names - CAPABILITIES.keys())
    if unknown:
        raise PluginError(
            f"{where}: unknown capabilities {unknown}; known: {', '.join(sorted(CAPABILITIES))}"
        )
    return names
