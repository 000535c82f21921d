"""Reference model and helpers for the run event store suite (`test_events`).

The model is a plain dict of threads to record lists; every expected answer is
computed here from first principles, never from a backend.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import strategies as st

from runstore.events.identity import ai_message_id, message_identity
from runstore.events.protocol import AI_MESSAGE_EVENT_TYPES, HIDDEN_CALLER_PREFIX

CORE_FIELDS = ("thread_id", "run_id", "event_type", "category", "content", "metadata", "seq", "created_at")


def fresh_id(prefix: str = "t") -> str:
    """A unique id, so examples never collide in a shared provisioned store."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def core(record: Mapping[str, Any]) -> dict[str, Any]:
    """The contract fields of a record (drops documented backend extras such as ``user_id``)."""
    missing = [k for k in CORE_FIELDS if k not in record]
    assert not missing, f"contract: a record carries every EventRecord field; missing {missing}"
    return {k: record[k] for k in CORE_FIELDS}


def utc_iso(value: str) -> str:
    """The normalized form a store must return for ``created_at`` (UTC ISO-8601)."""
    return datetime.fromisoformat(value).astimezone(UTC).isoformat()


# -- reference answers ------------------------------------------------------------------


def page(rows: list[dict[str, Any]], limit: int, before: int | None, after: int | None) -> list[dict[str, Any]]:
    """The paging contract, written as plainly as possible."""
    window = [r for r in rows if (before is None or r["seq"] < before) and (after is None or r["seq"] > after)]
    if limit <= 0:
        return []
    if after is not None:
        return window[:limit]
    return window[-limit:] if window else []


def visible_ai(record: Mapping[str, Any]) -> bool:
    caller = record["metadata"].get("caller")
    return (
        record["category"] == "message"
        and record["event_type"] in AI_MESSAGE_EVENT_TYPES
        and not (isinstance(caller, str) and caller.startswith(HIDDEN_CALLER_PREFIX))
    )


@dataclass
class ThreadModel:
    """One thread as the contract says it must look."""

    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["category"] == "message"]

    def run_events(self, run_id: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["run_id"] == run_id]

    def find_key(self, run_id: str, event_type: str) -> dict[str, Any] | None:
        for r in self.records:
            if r["run_id"] == run_id and r["event_type"] == event_type:
                return r
        return None

    def expect_next_seq(self, seq: int) -> None:
        top = max((r["seq"] for r in self.records), default=0)
        assert seq == top + 1, (
            f"contract: the next seq is the highest seq the thread holds + 1: gap-free 1, 2, 3... "
            f"without deletes, and after a delete the highest remaining + 1 (a thread deleted "
            f"entirely starts again at 1); got {seq}, the thread holds {top} at most"
        )

    def add(self, record: dict[str, Any]) -> None:
        self.expect_next_seq(record["seq"])
        self.records.append(record)

    def list_events(
        self, run_id: str, types: list[str] | None, task_id: str | None, limit: int, after: int | None
    ) -> list[dict[str, Any]]:
        rows = [
            r
            for r in self.run_events(run_id)
            if (types is None or r["event_type"] in types)
            and (task_id is None or r["metadata"].get("task_id") == task_id)
            and (after is None or r["seq"] > after)
        ]
        return rows[:limit]

    def last_visible(self, run_ids: set[str] | None) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            if (run_ids is None or r["run_id"] in run_ids) and visible_ai(r):
                out[r["run_id"]] = r["seq"]
        return out

    def message_seqs(self, identities: Iterable[str]) -> dict[str, int]:
        wanted = set(identities)
        out: dict[str, int] = {}
        for r in self.messages:
            ident = message_identity(r["content"])
            if ident in wanted and ident not in out:
                out[ident] = r["seq"]
        return out

    def latest_ai_runs(self, message_ids: Iterable[str]) -> dict[str, str]:
        wanted = set(message_ids)
        out: dict[str, str] = {}
        for r in self.messages:
            mid = ai_message_id(r["content"])
            if mid in wanted:
                out[mid] = r["run_id"]
        return out


# -- strategies -------------------------------------------------------------------------

EVENT_TYPES = ["llm.ai.response", "ai_message", "human_message", "tool.result", "run.end", "trace.step"]
CATEGORIES = ["message", "message", "trace", "lifecycle"]
MESSAGE_IDS = ["m1", "m2", "m3", "m%_1", "m\\x"]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=6), inner, max_size=3),
    ),
    max_leaves=8,
)


@st.composite
def message_contents(draw: st.DrawFn) -> Any:
    """Serialized messages (flat, ``data``-wrapped), plain strings and arbitrary JSON."""
    kind = draw(st.sampled_from(["ai", "ai_wrapped", "human", "tool", "text", "json"]))
    mid = draw(st.sampled_from(MESSAGE_IDS))
    if kind == "ai":
        return {"type": "ai", "id": mid, "content": draw(st.text(max_size=5, alphabet="abc \u2028"))}
    if kind == "ai_wrapped":
        return {"type": "ai", "data": {"type": "ai", "id": mid, "content": "x"}}
    if kind == "human":
        return {"type": "human", "id": mid + draw(st.sampled_from(["", "__user"])), "content": "hi"}
    if kind == "tool":
        return {"type": "tool", "id": mid, "tool_call_id": draw(st.sampled_from(["call_1", "call_2"]))}
    if kind == "text":
        return draw(st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=20))
    return draw(st.one_of(st.lists(json_values, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "type"]), json_values, max_size=3)))


metadatas = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "task_id": st.sampled_from(["task-a", "task-b"]),
            "caller": st.sampled_from(["lead", "middleware:guard", "subagent"]),
            "n": json_values,
        },
    ),
)

_OFFSETS = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
created_ats = st.one_of(
    st.none(),
    st.builds(
        lambda dt, tz: dt.replace(tzinfo=tz).isoformat(),
        st.datetimes(min_value=datetime(2000, 1, 2), max_value=datetime(2099, 12, 30)),
        st.sampled_from(_OFFSETS),
    ),
)


# -- shared by the test modules ---------------------------------------------------------

#: What a store raises for bad input.
BAD_INPUT = (ValueError, TypeError)
#: A valid event, less its thread_id.
GOOD = {"run_id": "run-1", "event_type": "llm.ai.response", "category": "message", "content": "ok"}


def check_owner(target: Any, record: Mapping[str, Any], owner: str | None) -> None:
    """On a backend declaring ``owner_filter``, ``record`` carries ``owner`` as its user_id."""
    if target.has("owner_filter"):
        assert record.get("user_id") == owner, (
            f"contract: owner_filter backends return the write's owner as user_id "
            f"(expected {owner!r}, got {record.get('user_id')!r})"
        )


def message_event(thread: str, run: str, content: Any, **extra: Any) -> dict[str, Any]:
    """An event for ``put``: an AI response message unless ``extra`` says otherwise."""
    return {
        "thread_id": thread,
        "run_id": run,
        "event_type": extra.pop("event_type", "llm.ai.response"),
        "category": extra.pop("category", "message"),
        "content": content,
        **extra,
    }


def ai_message_event(thread: str, run: str, mid: str, **extra: Any) -> dict[str, Any]:
    """An AI message event whose message id (and text) is ``mid``."""
    return message_event(thread, run, {"type": "ai", "id": mid, "content": mid}, **extra)
