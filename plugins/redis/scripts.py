"""What the Redis stream bridge sends: its Lua scripts (publish, END, snapshot), sent by
SHA with their text only when the server lacks them, and `Call`, one call waiting for
the bridge's shared pipeline (`runstore.plugins.redis.streams`).

The scripts keep the entry layout the readers rely on: ids ``0-1, 0-2, ...`` and END as
the single field ``end``, never evicting data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

#: The error text `PUBLISH` answers for a stream that has ended.
ENDED = "RUNSTORE_ENDED"

# KEYS[1] stream; ARGV maxlen, ttl_ms, event, payload. One round trip, atomic.
_PUBLISH = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if last[1] and last[1][2][1] == 'end' then return redis.error_reply('RUNSTORE_ENDED') end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '=', ARGV[1], '0-*', 'e', ARGV[3], 'd', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return id
"""

# KEYS[1] stream; ARGV maxlen + 1, window_ms. Idempotent; END takes no data slot.
# Returns END's id, or 0 when the stream had ended already.
_PUBLISH_END = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if last[1] and last[1][2][1] == 'end' then return 0 end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '=', ARGV[1], '0-*', 'end', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return id
"""

# KEYS[1] stream; ARGV after_seq (exclusive), count. Bounds and entries from one instant.
_SNAPSHOT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local entries = redis.call('XRANGE', KEYS[1], '(0-' .. ARGV[1], '+', 'COUNT', ARGV[2])
return {first[1][1], last[1], entries}
"""


# The fencing rule (`runstore.fencing.is_stale`) in Lua, for the fenced scripts below:
# tokens are compared as decimal text (Lua numbers are doubles, exact only to 2**53).
# ``admit(fence_key, token, ttl_ms)`` returns the current fence when ``token`` is stale.
_ADMIT = """
local function admit(key, token, ttl)
  local current = redis.call('GET', key)
  if current and (#token < #current or (#token == #current and token < current)) then
    return current
  end
  redis.call('SET', key, token, 'PX', ttl)
  return false
end
"""
STALE = "RUNSTORE_STALE"

# KEYS[1] stream, KEYS[2] fence; ARGV maxlen, ttl_ms, event, payload, token.
_PUBLISH_FENCED = _ADMIT + """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local stale = admit(KEYS[2], ARGV[5], ARGV[2])
if stale then return redis.error_reply('RUNSTORE_STALE ' .. stale) end
if last[1] and last[1][2][1] == 'end' then return redis.error_reply('RUNSTORE_ENDED') end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '=', ARGV[1], '0-*', 'e', ARGV[3], 'd', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return id
"""

# KEYS[1] stream, KEYS[2] fence; ARGV maxlen + 1, window_ms, token, fence ttl_ms.
_PUBLISH_END_FENCED = _ADMIT + """
local stale = admit(KEYS[2], ARGV[3], ARGV[4])
if stale then return redis.error_reply('RUNSTORE_STALE ' .. stale) end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if last[1] and last[1][2][1] == 'end' then return 0 end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '=', ARGV[1], '0-*', 'end', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return id
"""

# KEYS[1] fence; ARGV token, ttl_ms.
_FENCE = _ADMIT + """
local stale = admit(KEYS[1], ARGV[1], ARGV[2])
if stale then return redis.error_reply('RUNSTORE_STALE ' .. stale) end
return 1
"""


class LuaScript:
    """A Lua script sent by SHA; its full text goes along only when the server lacks it."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    def by_sha(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The ``EVALSHA`` command running the script on ``keys`` and ``args``."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def by_text(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The ``EVAL`` command sending the script's text (the server lacked it)."""
        # EVAL also caches the script, so later EVALSHA calls find it again.
        return ("EVAL", self.text, len(keys), *keys, *args)


PUBLISH = LuaScript(_PUBLISH)
PUBLISH_END = LuaScript(_PUBLISH_END)
SNAPSHOT = LuaScript(_SNAPSHOT)
PUBLISH_FENCED = LuaScript(_PUBLISH_FENCED)
PUBLISH_END_FENCED = LuaScript(_PUBLISH_END_FENCED)
FENCE = LuaScript(_FENCE)


def no_script(reply: Any) -> bool:
    """Whether ``reply`` is the server's NOSCRIPT error (resend the script by its text)."""
    from redis.exceptions import NoScriptError

    return isinstance(reply, NoScriptError)


class Call:
    """One call waiting for the bridge's shared pipeline.

    ``script`` with ``args`` (its ARGV; ``key`` its first key, ``keys`` any others in the
    same hash slot), or a plain ``command`` on ``key``. ``fence`` is the (run id, token)
    of a fenced call, so a stale reply becomes `StaleFenceError`. ``publish`` is set (run id, event, payload) for an event publish, the only
    call that is not idempotent; ``end`` for END. Both are delivered to this process's
    followers of ``key`` from the reply, without waiting for the reader.
    """

    __slots__ = ("args", "command", "end", "fence", "key", "keys", "operation", "publish", "script")

    def __init__(
        self,
        operation: str,
        key: bytes,
        *,
        script: LuaScript | None = None,
        args: Sequence[Any] = (),
        command: tuple[Any, ...] = (),
        publish: tuple[str, str, bytes] | None = None,
        end: bool = False,
        fence: tuple[str, int] | None = None,
        keys: tuple[bytes, ...] = (),
    ) -> None:
        self.operation = operation
        self.key = key
        self.script = script
        self.args = args
        self.command = command
        self.publish = publish
        self.end = end
        self.keys = (key, *keys)  # a script's KEYS (all in ``key``'s hash slot)
        self.fence = fence  # (run id, token) of a fenced call

    def request(self, by_text: bool) -> tuple[Any, ...]:
        """The command to send (a script by its text once the server said it lacks it)."""
        if self.script is None:
            return self.command
        if by_text:
            return self.script.by_text(self.keys, self.args)
        return self.script.by_sha(self.keys, self.args)
