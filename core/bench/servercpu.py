"""CPU time of the local database servers (PostgreSQL, Redis), read from ``/proc``.

`runstore bench load` records the servers' CPU per turn next to the workers' own
(``cpu_ms_per_turn``): on one machine the servers share the cores with the workers,
so their share bounds what more worker processes can add. Every process named
``postgres`` or ``redis-server`` on this machine counts, so the figure is the stack's
own only when nothing else uses those servers (measure on a quiet machine).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Row field prefix -> the process name (``comm``) of that server's processes.
SERVERS = {"postgres": "postgres", "redis": "redis-server"}

_PROC = Path("/proc")


def server_cpu_seconds() -> dict[str, float] | None:
    """User + system CPU seconds each local server's processes used so far, or ``None``
    where there is no ``/proc``. A PostgreSQL backend that exited still counts: the
    postmaster's counters of reaped children hold its time."""
    if not _PROC.is_dir():
        return None
    tick = float(os.sysconf("SC_CLK_TCK"))
    totals = dict.fromkeys(SERVERS, 0.0)
    names = {comm: key for key, comm in SERVERS.items()}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited meanwhile, or not ours to read
            continue
        # "pid (comm) state ...": comm may hold spaces, so split at the last ")".
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        key = names.get(comm)
        if key is None:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        # utime, stime, cutime, cstime are fields 14-17 of the line, 12-15 after "state".
        totals[key] += sum(int(v) for v in fields[11:15]) / tick
    return totals


def per_turn_ms(
    before: dict[str, float] | None, after: dict[str, float] | None, turns: int
) -> dict[str, float | None]:
    """``<server>_cpu_ms_per_turn`` row fields from two `server_cpu_seconds` readings, and
    ``server_cpu_ms_per_turn``, their sum."""
    if before is None or after is None or turns == 0:
        return {f"{key}_cpu_ms_per_turn": None for key in (*SERVERS, "server")}
    out = {
        f"{key}_cpu_ms_per_turn": max(after[key] - before[key], 0.0) / turns * 1000.0
        for key in SERVERS
    }
    out["server_cpu_ms_per_turn"] = sum(out.values())
    return dict(out)
