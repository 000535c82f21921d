"""Message identity: the stable key that links a serialized message to its event row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_USER_SUFFIX = "__user"


def message_identity(message: Mapping[str, Any] | Any) -> str | None:
    """Return ``tool:{tool_call_id}``, ``message:{id}`` or ``None`` for a serialized message.

    A human message's id loses a trailing ``__user`` so the echo of a user's input and
    the input itself share one identity. Accepts a dict (LangChain's serialized form,
    with or without a ``data`` wrapper) or a message object.
    """
    if isinstance(message, Mapping):
        data = message.get("data") if isinstance(message.get("data"), Mapping) else message
        get = data.get
    else:
        def get(key: str, default: Any = None) -> Any:
            return getattr(message, key, default)

    tool_call_id = get("tool_call_id")
    if isinstance(tool_call_id, str) and tool_call_id:
        return f"tool:{tool_call_id}"
    msg_id = get("id")
    if not isinstance(msg_id, str) or not msg_id:
        return None
    msg_type = get("type")
    if msg_type in ("human", "HumanMessage") and msg_id.endswith(_USER_SUFFIX):
        msg_id = msg_id[: -len(_USER_SUFFIX)]
    return f"message:{msg_id}"
