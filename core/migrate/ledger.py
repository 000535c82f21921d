"""The progress ledger: what a migration finished, so the same command continues it.

One JSON-lines file per (source, destination) pair, beside the destination's sqlite
file or under ``.runstore/migrations/`` (``--ledger`` chooses another path). Lines:
``{"pass": n, "started_at": ...}`` when a pass starts, ``{"begin": kind, "thread": id}``
before a thread is written, ``{"done": kind, "thread": id, "seq": n}`` after, and
``{"pass": n, "finished_at": ..., "watermark": ...}`` when a pass ends. Each line is
flushed as written; a line cut by a kill is ignored on reading.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from runstore.urls import BackendURL


def default_path(source: str, destination: str) -> Path:
    """Where the ledger of ``source`` -> ``destination`` lives unless ``--ledger`` says."""
    key = hashlib.sha256(f"{source}\n{destination}".encode()).hexdigest()[:16]
    try:
        url = BackendURL.parse(destination)
    except Exception:  # an archive path or a URL form only the migrate wing knows
        url = None
    path = url.file_path() if url is not None and url.scheme == "sqlite" else None
    if path is not None and path.name != ":memory:":
        return path.with_name(f"{path.name}.migrate-{key}.jsonl")
    return Path(".runstore") / "migrations" / f"{key}.jsonl"


@dataclass
class Ledger:
    """The state a ledger file holds, and the open file new lines go to (``None``: dry run)."""

    path: Path | None
    passes: int = 0
    watermark: str | None = None
    #: Whether the last pass started was interrupted (so this one resumes it).
    resuming: bool = False
    done: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Per kind, every thread any pass of this migration began writing (kept across
    #: passes: a catch-up knows which destination threads are its own).
    written: dict[str, set[str]] = field(default_factory=dict)
    #: Per event thread, the highest seq copied by any pass (a catch-up reads above it).
    event_seqs: dict[str, int] = field(default_factory=dict)
    _file: IO[str] | None = None

    @classmethod
    def load(cls, path: Path | None) -> Ledger:
        """The ledger at ``path`` (an empty one if absent; ``None`` keeps nothing)."""
        ledger = cls(path)
        if path is None or not path.exists():
            return ledger
        open_pass = False
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # the last line, cut by a kill
                if "started_at" in entry:
                    ledger.passes, open_pass = int(entry["pass"]), True
                    if not ledger.resuming:
                        ledger.done = {}
                elif "finished_at" in entry:
                    ledger.watermark, open_pass = entry["watermark"], False
                    ledger.done = {}
                elif "begin" in entry:
                    ledger.written.setdefault(entry["begin"], set()).add(entry["thread"])
                elif "done" in entry:
                    ledger.done.setdefault(entry["done"], {})[entry["thread"]] = int(entry.get("seq", 0))
                    if entry["done"] == "events":
                        ledger.event_seqs[entry["thread"]] = int(entry.get("seq", 0))
                ledger.resuming = open_pass
        return ledger

    def _write(self, entry: dict[str, Any]) -> None:
        if self.path is None:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(entry, sort_keys=True) + "\n")
        self._file.flush()

    def start_pass(self, started_at: datetime) -> None:
        """Record a pass starting (a resumed pass keeps its number and what it finished)."""
        if not self.resuming:
            self.passes += 1
        self._write({"pass": self.passes, "started_at": started_at.isoformat()})

    def begin(self, kind: str, thread_id: str) -> None:
        """Record that ``thread_id`` of ``kind`` is about to be written."""
        self.written.setdefault(kind, set()).add(thread_id)
        self._write({"begin": kind, "thread": thread_id})

    def finish(self, kind: str, thread_id: str, seq: int = 0) -> None:
        """Record ``thread_id`` of ``kind`` copied (events: up to ``seq``)."""
        self.done.setdefault(kind, {})[thread_id] = seq
        if kind == "events":
            self.event_seqs[thread_id] = max(seq, self.event_seqs.get(thread_id, 0))
        self._write({"done": kind, "thread": thread_id, "seq": seq})

    def end_pass(self, finished_at: datetime, watermark: datetime) -> None:
        """Record the pass finished; the next one copies only what changed since ``watermark``."""
        self._write({"pass": self.passes, "finished_at": finished_at.isoformat(), "watermark": watermark.isoformat()})
        if self._file is not None:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None
