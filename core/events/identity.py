"""Message identity: the stable key that links a serialized message to its event row."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

_USER_SUFFIX = "__user"
_HUMAN_TYPES = ("human", "HumanMessage", "HumanMessageChunk")
_AI_TYPES = ("ai", "AIMessage", "AIMessageChunk")


def _fields(message: Mapping[str, Any] | Any) -> tuple[Callable[..., Any], Any]:
    """A getter over the message's own fields, plus its type name.

    Understands the flat dict form, LangChain's ``{"type", "data": {...}}`` form,
    the ``dumpd`` constructor form (``{"lc": 1, "id": [..., "AIMessage"], "kwargs"}``)
    and message objects.
    """
    if isinstance(message, Mapping):
        if message.get("lc") is not None and isinstance(message.get("kwargs"), Mapping):
            kwargs = message["kwargs"]
            path = message.get("id")
            type_name = kwargs.get("type")
            if type_name is None and isinstance(path, list) and path:
                type_name = path[-1]
            return kwargs.get, type_name
        wrapped = message.get("data")
        data: Mapping[str, Any] = wrapped if isinstance(wrapped, Mapping) else message
        type_name = data.get("type", message.get("type"))
        return data.get, type_name

    def get(key: str, default: Any = None) -> Any:
        return getattr(message, key, default)

    return get, get("type")


def message_identity(message: Mapping[str, Any] | Any) -> str | None:
    """Return ``tool:{tool_call_id}``, ``message:{id}`` or ``None`` for a serialized message.

    A human message's id loses a trailing ``__user`` so the echo of a user's input and
    the input itself share one identity. Accepts a dict (LangChain's serialized form,
    with or without a ``data`` wrapper, or the ``dumpd`` form) or a message object.
    """
    if message is None or isinstance(message, str | bytes | list):
        return None
    get, msg_type = _fields(message)
    tool_call_id = get("tool_call_id")
    if isinstance(tool_call_id, str) and tool_call_id:
        return f"tool:{tool_call_id}"
    msg_id = get("id")
    if not isinstance(msg_id, str) or not msg_id:
        return None
    if msg_type in _HUMAN_TYPES and msg_id.endswith(_USER_SUFFIX):
        msg_id = msg_id[: -len(_USER_SUFFIX)]
    return f"message:{msg_id}"


def ai_message_id(content: Any) -> str | None:
    """The id of an AI message serialized as event content, or ``None`` if it is not one."""
    if not isinstance(content, Mapping):
        return None
    get, msg_type = _fields(content)
    if msg_type not in _AI_TYPES:
        return None
    msg_id = get("id")
    return msg_id if isinstance(msg_id, str) and msg_id else None
