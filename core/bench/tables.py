"""The summary's tables for people: which columns, in which order, and how many fit.

Rules:
- Columns are listed most important first: what identifies a row (backend, mode, size),
  then the same-run ratios, then absolute figures, then the rest.
- A column with no value in any row is left out (a run without ``--fenced`` has no
  fenced/unfenced column).
- By default a table fits the output width (the terminal's, else ``COLUMNS``, else 120):
  columns are dropped from the end of the list until it fits, and a note under the table
  names them. Numbers never wrap; only names (backends, references) do.
- ``wide`` shows every column at its full width; JSON and CSV carry every value anyway.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runstore.bench.matrix import NO_CACHE
from runstore.bench.summarize import Summary

#: The width a name column is counted at when fitting; longer names wrap inside it.
NAME_WIDTH = 24


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _digits(digits: int) -> Callable[[Any], str]:
    return lambda value: _fmt(value, digits)


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value / 2**20:.2f}"


def _cache(value: Any) -> str:
    return "-" if value in (None, NO_CACHE) else str(value)


@dataclass(frozen=True)
class Column:
    """One column: its header (``\\n`` splits it over two lines), the summary key it shows
    and how a value is written."""

    header: str
    key: str
    fmt: Callable[[Any], str] = _fmt
    #: Identifies the row: never dropped to fit the width.
    keep: bool = False
    #: A name that may wrap (counted at `NAME_WIDTH` when fitting); numbers never wrap.
    name: bool = False
    #: Words, aligned left (numbers align right).
    text: bool = False

    @property
    def label(self) -> str:
        """The header on one line (Markdown, notes)."""
        return self.header.replace("/\n", "/").replace("\n", " ")


#: The checkpoint table: the row's identity, the ratios, then absolute figures.
CHECKPOINT_COLUMNS: tuple[Column, ...] = (
    Column("backend", "backend", str, keep=True, name=True, text=True),
    Column("mode", "mode", str, keep=True, text=True),
    Column("turns", "updates", keep=True),
    Column("B", "payload_bytes", keep=True),
    Column("freq", "snapshot_frequency", keep=True),
    Column("cache", "cache", _cache, keep=True, text=True),
    Column("turns/s\nvs peer", "peer_turns_per_s"),
    Column("vs\nceiling", "ceiling_turns_per_s"),
    Column("delta/full\nwrite", "delta_full_write"),
    Column("delta/full\nbytes", "delta_full_bytes", _digits(3)),
    Column("fenced/\nunfenced", "fence_turns_ratio", _digits(3)),
    Column("cache\nspeedup", "cache_write_speedup"),
    Column("turns/s", "turns_per_s", _digits(1)),
    Column("p99 ms", "turn_p99_ms"),
    Column("cold ms", "cold_read_ms"),
    Column("db MiB", "db_bytes_closed", _mib),
    Column("p50 ms", "turn_p50_ms"),
    Column("last10%\nms", "window_last_ms"),
    Column("warm ms", "warm_read_ms"),
    Column("get_tuple\nms", "head_get_tuple_ms"),
    Column("parent\nms", "parent_read_ms"),
    Column("hist ms", "history_ms"),
    Column("hist x\nbase", "history_speedup", _digits(1)),
    Column("logical\nMiB", "logical_bytes", _mib),
    Column("n", "repetitions"),
)

#: The events / streams / runs / threads table.
MEASUREMENT_COLUMNS: tuple[Column, ...] = (
    Column("bench", "bench", str, keep=True, text=True),
    Column("backend", "backend", str, keep=True, name=True, text=True),
    Column("op", "op", str, keep=True, text=True),
    Column("variant", "variant", keep=True, text=True),
    Column("ratio", "ratio"),
    Column("vs", "reference_label", name=True, text=True),
    Column("metric", "metric", text=True),
    Column("large/\nsmall", "size_ratio"),
    Column("rate/s", "rate_per_s", _digits(0)),
    Column("p50 ms", "p50_ms", _digits(3)),
    Column("p99 ms", "p99_ms", _digits(3)),
    Column("n", "repetitions"),
)

#: The load table (p95 and the rest are in ``--json``/``--csv``).
LOAD_COLUMNS: tuple[Column, ...] = (
    Column("stack", "stack", str, keep=True, name=True, text=True),
    Column("mode", "mode", str, keep=True, text=True),
    Column("threads", "concurrency", keep=True),
    Column("procs", "processes", keep=True),
    Column("x stock", "peer_turns_per_s"),
    Column("p99/\nstock", "peer_p99"),
    Column("x 1\nproc", "process_speedup"),
    Column("fenced/\nunfenced", "fence_turns_ratio", _digits(3)),
    Column("digest", "digest_ok", lambda v: "ok" if v else "INCOMPLETE", text=True),
    Column("errors", "errors_total", _digits(0)),
    Column("turns/s", "turns_per_s", _digits(1)),
    Column("p50 ms", "turn_p50_ms", _digits(0)),
    Column("p99 ms", "turn_p99_ms", _digits(0)),
    Column("events/s", "events_per_s", _digits(0)),
    Column("stream\np99", "delivery_p99_ms", _digits(0)),
    Column("pool\nwait ms", "pool_wait_ms", _digits(0)),
    Column("CPU\nms/turn", "cpu_ms_per_turn", _digits(1)),
    Column("server\nCPU", "server_cpu_ms_per_turn", _digits(1)),
    Column("RSS\nMiB", "peak_rss_bytes", lambda v: "-" if v is None else f"{v / 2**20:.0f}"),
    Column("n", "repetitions"),
)


#: The migrate table: per source size, runstore against the naive loop, then memory.
MIGRATE_COLUMNS: tuple[Column, ...] = (
    Column("threads", "threads", keep=True),
    Column("turns", "turns", keep=True),
    Column("checkpoints", "source_checkpoints", _digits(0)),
    Column("x naive", "x_naive", _digits(1)),
    Column("runstore\nckpt/s", "runstore_per_s", _digits(0)),
    Column("naive\nckpt/s", "naive_per_s", _digits(0)),
    Column("RSS MiB\nrunstore", "runstore_rss_bytes", lambda v: "-" if v is None else f"{v / 2**20:.1f}"),
    Column("RSS x\nsmallest", "rss_vs_smallest", _digits(3)),
    Column("RSS MiB\nnaive", "naive_rss_bytes", lambda v: "-" if v is None else f"{v / 2**20:.1f}"),
    Column("resume\nmissing", "resume_missing", _digits(0)),
    Column("resume\nduplicated", "resume_duplicated", _digits(0)),
    Column("resume\nmismatched", "resume_mismatched", _digits(0)),
    Column("n", "runstore_n"),
)


def tables(summary: Summary) -> list[tuple[str, list[dict[str, Any]], tuple[Column, ...]]]:
    """(title, entries, columns) of each non-empty table of ``summary``."""
    return [
        (title, entries, columns)
        for title, entries, columns in (
            ("checkpoint", summary.checkpoint, CHECKPOINT_COLUMNS),
            ("events / streams / runs", summary.measurements, MEASUREMENT_COLUMNS),
            ("load", summary.load, LOAD_COLUMNS),
            ("migrate", summary.migrate, MIGRATE_COLUMNS),
        )
        if entries
    ]


@dataclass
class Fitted:
    """A table ready to print: the columns shown, their cells, and what was left out."""

    columns: list[Column]
    rows: list[list[str]]
    left_out: list[Column]

    @property
    def width(self) -> int:
        """Its width in a table without outer edges (two spaces of padding per column, one
        rule between two columns)."""
        return _table_width([_column_width(c, self.rows, i) for i, c in enumerate(self.columns)])


def _table_width(widths: Sequence[int]) -> int:
    return sum(widths) + 3 * len(widths) - 1


def _column_width(column: Column, rows: Sequence[Sequence[str]], index: int, *, whole: bool = False) -> int:
    cells = max((len(r[index]) for r in rows), default=0)
    if column.name and not whole:
        cells = min(cells, NAME_WIDTH)
    return max(cells, *(len(line) for line in column.header.split("\n")))


def fit(entries: Sequence[dict[str, Any]], columns: Sequence[Column], width: int | None, *, wide: bool = False) -> Fitted:
    """The columns of ``entries`` to show: every column when ``wide``; else the non-empty
    ones, dropped from the least important until the table is at most ``width`` wide."""
    shown = list(columns)
    if not wide:
        shown = [c for c in shown if any(c.fmt(e.get(c.key)) != "-" for e in entries)]
    table = Fitted(shown, [[c.fmt(e.get(c.key)) for c in shown] for e in entries], [])
    if wide or width is None:
        return table
    while table.width > width:
        drop = next((i for i in range(len(table.columns) - 1, -1, -1) if not table.columns[i].keep), None)
        if drop is None:
            break  # only identifying columns left: names wrap to fit
        table.left_out.insert(0, table.columns.pop(drop))
        for row in table.rows:
            del row[drop]
    return table


def full_width(table: Fitted) -> int:
    """The width ``table`` needs with every name whole."""
    return _table_width([_column_width(c, table.rows, i, whole=True) for i, c in enumerate(table.columns)])


def to_markdown(summary: Summary, *, wide: bool = False) -> str:
    """The summary tables as GitHub-flavoured Markdown (for docs and PR comments): the
    non-empty columns, or every column when ``wide``."""
    parts: list[str] = []
    for _title, entries, columns in tables(summary):
        table = fit(entries, columns, None, wide=wide)
        lines = ["| " + " | ".join(c.label for c in table.columns) + " |", "|" + "---|" * len(table.columns)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in table.rows]
        parts.append("\n".join(lines))
    for warning in summary.warnings:
        parts.append(f"warning: {warning}")
    return "\n\n".join(parts) + "\n"
