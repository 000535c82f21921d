"""The client script the Agent Server tests run against every server, and how its
answers are normalized so two servers' transcripts compare equal.

`before_restart` and `after_restart` drive one server with ``langgraph_sdk`` and append
``(step, answer)`` pairs to a transcript; ids (threads, runs, checkpoints, messages),
timestamps and channel-version suffixes are replaced by placeholders numbered in order
of appearance, so only what a client can see as behaviour is compared.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

from langgraph_sdk import get_client

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?")
#: Channel versions: the Agent Server's adapter draws a random fraction after the counter.
VERSION = re.compile(r"(\d{32})\.\d+(\.\d+)?")
#: What a state or history entry is compared on (the rest is bookkeeping of one server).
METADATA_KEYS = ("source", "step", "thread_id", "parents")


@dataclass
class Transcript:
    """The normalized answers of one server, in order."""

    items: list[tuple[str, Any]] = field(default_factory=list)
    threads: dict[str, str] = field(default_factory=dict)
    _ids: dict[str, str] = field(default_factory=dict)

    def add(self, step: str, answer: Any) -> None:
        self.items.append((step, self.normalize(answer)))

    def normalize(self, answer: Any) -> Any:
        text = json.dumps(answer, sort_keys=True, default=str)
        text = UUID.sub(lambda m: self._ids.setdefault(m.group(0), f"<id{len(self._ids)}>"), text)
        text = TIMESTAMP.sub("<ts>", text)
        text = VERSION.sub(r"\1", text)
        return json.loads(text)


def _messages(values: Any) -> list[tuple[str, str]]:
    return [(m.get("type"), m.get("content")) for m in (values or {}).get("messages", [])]


def _state(state: Any) -> dict[str, Any]:
    """What a client reads in a thread state: values, next, tasks, interrupts, metadata, links."""
    metadata = state.get("metadata") or {}
    return {
        "messages": _messages(state.get("values")),
        "next": state.get("next"),
        "tasks": [(t.get("name"), [i.get("value") for i in t.get("interrupts", [])]) for t in state.get("tasks", [])],
        "metadata": {k: metadata.get(k) for k in METADATA_KEYS},
        "checkpoint_id": (state.get("checkpoint") or {}).get("checkpoint_id"),
        "parent": (state.get("parent_checkpoint") or {}).get("checkpoint_id"),
    }


async def _history(client: Any, thread_id: str, **kwargs: Any) -> list[dict[str, Any]]:
    return [_state(s) for s in await client.threads.get_history(thread_id, limit=100, **kwargs)]


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def before_restart(url: str, out: Transcript) -> None:
    """Runs (wait, stream), state, history, fork, interrupt/resume, rollback, copy, delete,
    search, then the store API."""
    client = get_client(url=url)
    tag = {"suite": "agent-server"}
    a = (await client.threads.create(metadata=tag))["thread_id"]
    out.threads["a"] = a
    out.add("wait", _messages(await client.runs.wait(a, "agent", input=user("hi"))))
    events = []
    async for part in client.runs.stream(a, "agent", input=user("again"), stream_mode=["values", "updates"]):
        if part.event in ("values", "updates"):
            events.append((part.event, _messages(part.data) if part.event == "values" else
                           {k: _messages(v) for k, v in (part.data or {}).items()}))
    out.add("stream", events)
    out.add("state", _state(await client.threads.get_state(a)))
    history = await client.threads.get_history(a, limit=100)
    out.add("history", [_state(s) for s in history])
    out.add("history filtered by thread_id", await _history(client, a, metadata={"thread_id": a}))
    # Fork: a new run from the first run's final checkpoint (before "again").
    fork_from = next(s for s in history if len(s["values"].get("messages", [])) == 2)
    forked = await client.runs.wait(a, "agent", input=user("fork"), checkpoint_id=fork_from["checkpoint"]["checkpoint_id"])
    out.add("fork", _messages(forked))
    out.add("history after fork", await _history(client, a))
    out.add("state at fork point", _state(await client.threads.get_state(a, checkpoint_id=fork_from["checkpoint"]["checkpoint_id"])))

    b = (await client.threads.create(metadata=tag))["thread_id"]
    out.threads["b"] = b
    out.add("interrupt", _messages(await client.runs.wait(b, "agent", input=user("ask name"))))
    out.add("interrupted state", _state(await client.threads.get_state(b)))
    out.add("resume", _messages(await client.runs.wait(b, "agent", command={"resume": "42"})))
    out.add("resumed history", await _history(client, b))

    c = (await client.threads.create(metadata=tag))["thread_id"]
    out.threads["c"] = c
    await client.runs.wait(c, "agent", input=user("first"))
    slow = await client.runs.create(c, "agent", input=user("slow one"))
    await _until_running(client, c, slow["run_id"])
    fast = await client.runs.create(c, "agent", input=user("fast"), multitask_strategy="rollback")
    await client.runs.join(c, fast["run_id"])
    out.add("rollback state", _state(await client.threads.get_state(c)))
    out.add("rollback history", await _history(client, c))

    copy = (await client.threads.copy(a))["thread_id"]
    out.threads["copy"] = copy
    out.add("copy state", _state(await client.threads.get_state(copy)))
    out.add("copy history", await _history(client, copy))
    out.add("copy history filtered by its thread_id", await _history(client, copy, metadata={"thread_id": copy}))
    out.add("copy run", _messages(await client.runs.wait(copy, "agent", input=user("on the copy"))))
    out.add("source after copy run", _state(await client.threads.get_state(a)))

    doomed = (await client.threads.copy(b))["thread_id"]
    await client.threads.delete(doomed)
    out.add("deleted", await _status(client.threads.get_state(doomed)))
    found = await client.threads.search(metadata=tag, limit=100)
    out.add("search", sorted(out.normalize(t["thread_id"]) for t in found))
    out.add("search values", sorted(out.normalize(t["thread_id"]) for t in
                                    await client.threads.search(values={"messages": []}, limit=100)))
    await store_steps(client, out)


def _item(item: Any) -> Any:
    return None if item is None else {k: item.get(k) for k in ("namespace", "key", "value")}


async def store_steps(client: Any, out: Transcript) -> None:
    """The server's store API (``/store``): put, get, search, namespaces, delete."""
    for key, value in (("a", {"text": "likes tea", "n": 1}), ("b", {"text": "likes maps", "n": 2})):
        await client.store.put_item(["users", "u1"], key, value)
    await client.store.put_item(["users", "u2"], "a", {"text": "other", "n": 3})
    out.add("store get", _item(await client.store.get_item(["users", "u1"], "a")))
    found = await client.store.search_items(["users"], filter={"n": 2})
    out.add("store search", sorted((tuple(i["namespace"]), i["key"]) for i in found["items"]))
    spaces = await client.store.list_namespaces(prefix=["users"])
    out.add("store namespaces", sorted(tuple(n) for n in spaces["namespaces"]))
    await client.store.delete_item(["users", "u1"], "a")
    out.add("store deleted", _item(await client.store.get_item(["users", "u1"], "a")))


async def after_restart(url: str, out: Transcript) -> None:
    """What survived the restart, and a run continuing a thread from before it."""
    client = get_client(url=url)
    a, copy = out.threads["a"], out.threads["copy"]
    out.add("state after restart", _state(await client.threads.get_state(a)))
    out.add("history after restart", await _history(client, a))
    out.add("copy history after restart", await _history(client, copy))
    out.add("run after restart", _messages(await client.runs.wait(a, "agent", input=user("back"))))
    out.add("interrupted thread after restart", _state(await client.threads.get_state(out.threads["b"])))


async def _until_running(client: Any, thread_id: str, run_id: str) -> None:
    for _ in range(200):
        if (await client.runs.get(thread_id, run_id))["status"] == "running":
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never started")


async def _status(call: Any) -> str:
    try:
        await call
    except Exception as exc:  # the SDK's HTTP error carries the status code
        return str(getattr(getattr(exc, "response", None), "status_code", type(exc).__name__))
    return "found"
