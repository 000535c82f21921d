"""`runstore bench summarize`: medians over paired repetitions, and the ratios that matter.

Rules:
- Only rows with status ``ok`` count; ``profiled`` rows are excluded (cProfile
  distorts timing) and a warning says how many.
- Checkpoint rows count only for repetitions whose pair succeeded: a delta row
  with the ``full`` row of the same cell, a ``full`` row with at least one delta
  row. Ratios ``delta/full`` divide medians taken over the same repetitions.
- ``runstore/peer`` compares a runstore backend with the stock saver of the same
  name (``sqlite://`` with ``langgraph:sqlite``) on the same workload.
- ``vs ceiling`` compares a runstore backend (either mode) with the stock
  ``InMemorySaver`` in full mode on the same workload: the no-I/O ceiling.
- Nothing is ever paired across input files: each file is one run on one machine.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runstore.bench.common import BenchFile, median
from runstore.bench.matrix import NO_CACHE

#: Checkpoint metrics reported as medians.
CHECKPOINT_METRICS = (
    "turns_per_s",
    "fence_turns_ratio",
    "write_total_s",
    "turn_p50_ms",
    "turn_p95_ms",
    "turn_p99_ms",
    "window_first_ms",
    "window_middle_ms",
    "window_last_ms",
    "write_saver_ms",
    "write_history_ms",
    "warm_read_ms",
    "head_get_tuple_ms",
    "cold_read_ms",
    "parent_read_ms",
    "replay_ms",
    "parent_replay_ms",
    "history_writes",
    "history_ms",
    "history_base_walk_ms",
    "history_speedup",
    "checkpoint_rows",
    "write_rows",
    "logical_bytes",
    "db_bytes_open",
    "wal_bytes_open",
    "db_bytes_closed",
    "wal_bytes_closed",
    "peak_rss_bytes",
)

#: (metric, ratio name) pairs computed as delta / full.
DELTA_FULL_RATIOS = (
    ("write_total_s", "delta_full_write"),
    ("logical_bytes", "delta_full_bytes"),
    ("db_bytes_closed", "delta_full_db"),
    ("cold_read_ms", "delta_full_cold_read"),
)
#: The stock saver whose full-mode turns/s is the no-I/O ceiling.
CEILING_BACKEND = "langgraph:memory"
#: (metric, ratio name) pairs computed as runstore / peer.
PEER_RATIOS = (
    ("turns_per_s", "peer_turns_per_s"),
    ("write_total_s", "peer_write"),
    ("db_bytes_closed", "peer_db"),
    ("cold_read_ms", "peer_cold_read"),
)


@dataclass
class Summary:
    """Summarized groups plus warnings, ready to render."""

    checkpoint: list[dict[str, Any]] = field(default_factory=list)
    measurements: list[dict[str, Any]] = field(default_factory=list)
    load: list[dict[str, Any]] = field(default_factory=list)
    migrate: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Everything as plain JSON-able data."""
        return {
            "checkpoint": self.checkpoint,
            "measurements": self.measurements,
            "load": self.load,
            "migrate": self.migrate,
            "warnings": self.warnings,
        }


def _variant_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (
        row.get("backend"),
        row.get("updates"),
        row.get("payload_bytes"),
        row.get("seed"),
        row.get("mode"),
        row.get("snapshot_frequency"),
        row.get("cache", NO_CACHE),
    )


def _usable(rows: Iterable[dict[str, Any]], summary: Summary, path: str) -> list[dict[str, Any]]:
    out = []
    profiled = 0
    for row in rows:
        if row.get("profiled"):
            profiled += 1
            continue
        out.append(row)
    if profiled:
        summary.warnings.append(
            f"{path}: excluded {profiled} profiled row(s) (cProfile distorts timing)"
        )
    return out


def _medians(rows: Sequence[dict[str, Any]], metrics: Sequence[str]) -> dict[str, Any]:
    return {m: median(r.get(m) for r in rows) for m in metrics}


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def summarize_checkpoint(files: Sequence[BenchFile], summary: Summary) -> None:
    """Fill ``summary.checkpoint`` with one entry per (file, variant)."""
    for file_index, bench_file in enumerate(files):
        rows = [r for r in bench_file.rows if r.get("bench") == "checkpoint"]
        rows = _usable(rows, summary, bench_file.path)
        failed = [r for r in rows if r.get("status") not in ("ok", "skipped")]
        if failed:
            summary.warnings.append(
                f"{bench_file.path}: {len(failed)} row(s) not ok ("
                + ", ".join(sorted({str(r.get("status")) for r in failed}))
                + "); their pairs are left out"
            )
        ok = [r for r in rows if r.get("status") == "ok"]
        by_cell: dict[str, list[dict[str, Any]]] = {}
        for row in ok:
            by_cell.setdefault(row["cell_id"], []).append(row)
        # Keep only rows whose pair succeeded.
        paired: list[dict[str, Any]] = []
        full_by_cell: dict[str, dict[str, Any]] = {}
        for cell_id, cell_rows in by_cell.items():
            full = [r for r in cell_rows if r.get("mode") == "full"]
            delta = [r for r in cell_rows if r.get("mode") == "delta"]
            if not full or not delta:
                continue
            full_by_cell[cell_id] = full[0]
            paired.extend(full[:1])
            paired.extend(delta)
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for row in paired:
            groups.setdefault(_variant_key(row), []).append(row)
        entries: dict[tuple[Any, ...], dict[str, Any]] = {}
        for key, group in groups.items():
            first = group[0]
            entry: dict[str, Any] = {
                "file": bench_file.path,
                "file_index": file_index,
                "backend": first.get("backend"),
                "backend_name": first.get("backend_name"),
                "peer": bool(first.get("peer")),
                "updates": first.get("updates"),
                "payload_bytes": first.get("payload_bytes"),
                "seed": first.get("seed"),
                "mode": first.get("mode"),
                "snapshot_frequency": first.get("snapshot_frequency"),
                "cache": first.get("cache", NO_CACHE),
                "repetitions": len(group),
            }
            entry.update(_medians(group, CHECKPOINT_METRICS))
            if first.get("mode") == "delta":
                # delta/full over exactly the repetitions where both succeeded
                fulls = [full_by_cell[r["cell_id"]] for r in group]
                for metric, name in DELTA_FULL_RATIOS:
                    entry[name] = _ratio(
                        median(r.get(metric) for r in group), median(r.get(metric) for r in fulls)
                    )
            entries[key] = entry
        # runstore / peer, runstore / ceiling, and cache / no cache, within this file only.
        for key, entry in entries.items():
            if not entry["peer"]:
                ceiling = entries.get((CEILING_BACKEND, *key[1:4], "full", None, NO_CACHE))
                if ceiling is not None:
                    entry["ceiling_turns_per_s"] = _ratio(
                        entry.get("turns_per_s"), ceiling.get("turns_per_s")
                    )
                for peer_key, peer in entries.items():
                    if (
                        peer["peer"]
                        and peer["backend_name"] == entry["backend_name"]
                        and peer_key[1:] == key[1:]
                    ):
                        for metric, name in PEER_RATIOS:
                            entry[name] = _ratio(entry.get(metric), peer.get(metric))
                        entry["peer_backend"] = peer["backend"]
            if entry["mode"] == "delta" and entry["cache"] != NO_CACHE:
                base = entries.get((*key[:6], NO_CACHE))
                if base is not None:
                    entry["cache_write_speedup"] = _ratio(
                        base.get("write_total_s"), entry.get("write_total_s")
                    )
                    entry["cache_write_ratio"] = _ratio(
                        entry.get("write_total_s"), base.get("write_total_s")
                    )
        summary.checkpoint.extend(
            sorted(
                entries.values(),
                key=lambda e: (
                    e["file_index"],
                    e["updates"],
                    e["payload_bytes"],
                    e["backend_name"] or "",
                    e["peer"],
                    e["backend"],
                    e["mode"] != "full",
                    e["snapshot_frequency"] or 0,
                    e["cache"] != NO_CACHE,
                ),
            )
        )


def summarize_measurements(files: Sequence[BenchFile], summary: Summary) -> None:
    """Fill ``summary.measurements`` for events, streams, runs, threads and store rows (with
    reference ratios)."""
    for file_index, bench_file in enumerate(files):
        rows = [
            r for r in bench_file.rows if r.get("bench") in ("events", "streams", "runs", "threads", "store")
        ]
        rows = [r for r in _usable(rows, summary, bench_file.path) if r.get("status") == "ok"]
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for row in rows:
            key = (
                row.get("bench"),
                row.get("case_backend"),
                row.get("backend"),
                row.get("op"),
                row.get("variant"),
            )
            groups.setdefault(key, []).append(row)
        entries: dict[tuple[Any, ...], dict[str, Any]] = {}
        for key, group in groups.items():
            metrics = sorted(
                {
                    k
                    for r in group
                    for k, v in r.items()
                    if k.endswith(("_ms", "_per_s", "_ratio")) and isinstance(v, int | float)
                }
            )
            first = group[0]
            entry = {
                "file": bench_file.path,
                "file_index": file_index,
                "bench": key[0],
                "case_backend": key[1],
                "backend": key[2],
                "op": key[3],
                "variant": key[4],
                "metric": first.get("metric"),
                "reference": first.get("reference"),
                "repetitions": len(group),
            }
            entry.update(_medians(group, metrics))
            entries[key] = entry
        for entry in entries.values():
            ref = entry.get("reference")
            metric = entry.get("metric")
            if not ref or not metric:
                continue
            ref_entry = entries.get(
                (
                    entry["bench"],
                    entry["case_backend"],
                    ref.get("backend"),
                    ref.get("op"),
                    ref.get("variant"),
                )
            )
            if ref_entry is not None:
                entry["ratio"] = _ratio(entry.get(metric), ref_entry.get(metric))
                entry["reference_label"] = f"{ref.get('backend')} {ref.get('op')}"
        summary.measurements.extend(entries.values())


#: Load metrics reported as medians over repetitions.
LOAD_METRICS = (
    "turns_per_s",
    "turn_p50_ms",
    "turn_p95_ms",
    "turn_p99_ms",
    "events_per_s",
    "stream_events_per_s",
    "delivery_p50_ms",
    "delivery_p99_ms",
    "errors_total",
    "errors_locked",
    "errors_pool",
    "errors_timeout",
    "errors_lost",
    "errors_other",
    "pool_wait_ms",
    "pool_wait_max_ms",
    "cpu_ms_per_turn",
    "postgres_cpu_ms_per_turn",
    "redis_cpu_ms_per_turn",
    "server_cpu_ms_per_turn",
    "peak_rss_bytes",
    "peak_rss_total_bytes",
)


def summarize_load(files: Sequence[BenchFile], summary: Summary) -> None:
    """Fill ``summary.load``: medians per (stack, fenced, mode, concurrency, processes, turns),
    the ratios against the stock peer at the same point (``peer_turns_per_s``: > 1 is
    faster, ``peer_p99``: < 1 is faster), turns/s against the same stack on one process,
    and a fenced stack (shown as ``<stack>+fenced``) against the same stack unfenced
    (``fence_turns_ratio``, ``fence_p99``)."""
    from runstore.bench.load_stacks import LOAD_PEERS

    for file_index, bench_file in enumerate(files):
        rows = [r for r in bench_file.rows if r.get("bench") == "load"]
        rows = _usable(rows, summary, bench_file.path)
        bad = [r for r in rows if r.get("status") != "ok"]
        if bad:
            summary.warnings.append(
                f"{bench_file.path}: {len(bad)} load row(s) not ok ("
                + ", ".join(sorted({str(r.get("status")) for r in bad}))
                + ") left out"
            )
        errored = [r for r in rows if r.get("status") == "ok" and r.get("errors_total")]
        for r in errored:
            summary.warnings.append(f"{bench_file.path}: {r.get('case_id')}: {r.get('error')}")
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for row in rows:
            if row.get("status") == "ok":
                key = (
                    row["stack"], bool(row.get("fenced")), row["mode"], row["concurrency"],
                    row["processes"], row["turns"],
                )  # fmt: skip
                groups.setdefault(key, []).append(row)
        entries: dict[tuple[Any, ...], dict[str, Any]] = {}
        for key, group in groups.items():
            entry: dict[str, Any] = {
                "file": bench_file.path,
                "file_index": file_index,
                "stack": f"{key[0]}+fenced" if key[1] else key[0],
                "fenced": key[1],
                "mode": key[2],
                "concurrency": key[3],
                "processes": key[4],
                "turns": key[5],
                "peer": bool(group[0].get("peer")),
                "repetitions": len(group),
                "digest_ok": all(r.get("digest_ok") for r in group),
            }
            entry.update(_medians(group, LOAD_METRICS))
            if key[1]:
                entry["fenced_stores"] = sorted({s for r in group for s in r.get("fenced_stores") or ()})
                entry["fence_stale_refused"] = all(r.get("fence_stale_refused") for r in group)
            entries[key] = entry
        for key, entry in entries.items():
            peer = entries.get((LOAD_PEERS.get(key[0]), False, *key[2:]))
            if peer is not None:
                entry["peer_stack"] = peer["stack"]
                entry["peer_turns_per_s"] = _ratio(entry.get("turns_per_s"), peer.get("turns_per_s"))
                entry["peer_p99"] = _ratio(entry.get("turn_p99_ms"), peer.get("turn_p99_ms"))
            unfenced = entries.get((key[0], False, *key[2:])) if key[1] else None
            if unfenced is not None:
                entry["fence_turns_ratio"] = _ratio(entry.get("turns_per_s"), unfenced.get("turns_per_s"))
                entry["fence_p99"] = _ratio(entry.get("turn_p99_ms"), unfenced.get("turn_p99_ms"))
            single = entries.get((*key[:4], 1, key[5]))
            if single is not None and key[4] != 1:
                entry["process_speedup"] = _ratio(entry.get("turns_per_s"), single.get("turns_per_s"))
        summary.load.extend(
            sorted(
                entries.values(),
                key=lambda e: (
                    e["file_index"], e["mode"], e["processes"], e["concurrency"],
                    e["peer"], e["stack"],
                ),
            )
        )  # fmt: skip


#: Migrate metrics reported as medians over repetitions.
MIGRATE_METRICS = ("checkpoints_per_s", "seconds", "checkpoints", "source_checkpoints", "peak_rss_bytes")


def summarize_migrate(files: Sequence[BenchFile], summary: Summary) -> None:
    """Fill ``summary.migrate``: one entry per source size (threads, turns) with the medians of
    the ``runstore`` and ``naive`` cases, ``x_naive`` (runstore / naive checkpoints/s) and
    ``rss_vs_smallest`` (runstore's peak RSS / its peak RSS at the file's smallest size),
    plus the ``resume`` case's counts (every repetition's, summed)."""
    for file_index, bench_file in enumerate(files):
        rows = [r for r in _usable([r for r in bench_file.rows if r.get("bench") == "migrate"], summary,
                                   bench_file.path) if r.get("status") != "skipped"]  # fmt: skip
        bad = [r for r in rows if r.get("status") != "ok"]
        if bad:
            summary.warnings.append(f"{bench_file.path}: {len(bad)} migrate row(s) not ok left out: "
                                    + ", ".join(str(r.get("case_id")) for r in bad))  # fmt: skip
        groups: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
        for row in rows:
            if row.get("status") == "ok":
                key = (row.get("threads"), row.get("turns"))
                groups.setdefault(key, {}).setdefault(str(row.get("method")), []).append(row)
        entries = []
        for (threads, turns), methods in sorted(groups.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0] or 0)):
            entry: dict[str, Any] = {"file": bench_file.path, "file_index": file_index, "threads": threads,
                                     "turns": turns}  # fmt: skip
            for method in ("runstore", "naive"):
                medians = _medians(methods.get(method, []), MIGRATE_METRICS)
                entry["source_checkpoints"] = entry.get("source_checkpoints") or medians.get("source_checkpoints")
                entry[f"{method}_per_s"] = medians.get("checkpoints_per_s")
                entry[f"{method}_rss_bytes"] = medians.get("peak_rss_bytes")
                entry[f"{method}_n"] = len(methods.get(method, []))
            entry["x_naive"] = _ratio(entry["runstore_per_s"], entry["naive_per_s"])
            resumed = methods.get("resume", [])
            if resumed:
                entry["resume_runs"] = len(resumed)
                for count in ("missing", "duplicated", "mismatched"):
                    entry[f"resume_{count}"] = sum(int(r.get(count) or 0) for r in resumed)
            entries.append(entry)
        for entry in entries:
            smallest = min((e for e in entries if e["turns"] == entry["turns"] and e.get("runstore_rss_bytes")),
                           key=lambda e: e["threads"], default=None)  # fmt: skip
            if smallest is not None and smallest is not entry:
                entry["rss_vs_smallest"] = _ratio(entry.get("runstore_rss_bytes"), smallest["runstore_rss_bytes"])
        summary.migrate.extend(entries)


def summarize(files: Sequence[BenchFile]) -> Summary:
    """Summarize every benchmark in ``files``."""
    summary = Summary()
    summarize_checkpoint(files, summary)
    summarize_measurements(files, summary)
    summarize_load(files, summary)
    summarize_migrate(files, summary)
    return summary


def to_csv(summary: Summary) -> str:
    """Both summaries as CSV (every key, one section per benchmark family)."""
    out = io.StringIO()
    for entries in (summary.checkpoint, summary.measurements, summary.load, summary.migrate):
        if not entries:
            continue
        keys: list[str] = []
        for e in entries:
            for k in e:
                if k not in keys:
                    keys.append(k)
        writer = csv.DictWriter(out, fieldnames=keys)
        writer.writeheader()
        for e in entries:
            writer.writerow({k: e.get(k) for k in keys})
        out.write("\n")
    return out.getvalue()


def plot(summary: Summary, path: str) -> list[str]:
    """Draw the summary's figures and return the files written.

    Checkpoint entries: storage and write time against turns (at ``path``). Load
    entries: turns/s and p99 against concurrency (at ``path``, or beside it as
    ``<name>-load.png`` when there is a checkpoint figure too).
    """
    written: list[str] = []
    if summary.checkpoint:
        _plot_checkpoint(summary, path)
        written.append(path)
    if summary.load:
        load_path = path
        if written:
            stem, dot, ext = path.rpartition(".")
            load_path = f"{stem}-load.{ext}" if dot else f"{path}-load"
        _plot_load(summary, load_path)
        written.append(load_path)
    return written


def _plot_load(summary: Summary, path: str) -> None:
    """turns/s and p99 turn latency against concurrency: colour per stack, style per mode
    and process count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    several_files = len({e["file"] for e in summary.load}) > 1
    stacks = sorted({e["stack"] for e in summary.load})
    variants = sorted({(e["mode"], e["processes"]) for e in summary.load})
    colours = plt.get_cmap("tab10")
    styles = ["-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1))]
    markers = ["o", "s", "^", "v", "D", "x"]
    fig, (ax_rate, ax_p99) = plt.subplots(1, 2, figsize=(14, 6))
    series: dict[tuple[Any, ...], list[tuple[int, float | None, float | None]]] = {}
    for e in summary.load:
        key = (e["file_index"], e["stack"], e["mode"], e["processes"])
        series.setdefault(key, []).append((e["concurrency"], e.get("turns_per_s"), e.get("turn_p99_ms")))
    for (file_index, stack, mode, procs), points in sorted(series.items(), key=lambda kv: str(kv[0])):
        variant = variants.index((mode, procs))
        label = f"{stack} {mode} x{procs}" + (f" [file {file_index}]" if several_files else "")
        style = {
            "color": colours(stacks.index(stack) % 10),
            "linestyle": styles[variant % len(styles)],
            "marker": markers[variant % len(markers)],
            "label": label,
        }
        points.sort()
        xs = [p[0] for p in points]
        ax_rate.plot(xs, [p[1] or 0 for p in points], **style)
        ax_p99.plot(xs, [p[2] or 0 for p in points], **style)
    from matplotlib.ticker import ScalarFormatter

    levels = sorted({e["concurrency"] for e in summary.load})
    for ax, ylabel in ((ax_rate, "turns/s (all threads)"), (ax_p99, "p99 turn latency ms")):
        ax.set_xlabel("concurrent threads")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
    handles, labels = ax_rate.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _plot_checkpoint(summary: Summary, path: str) -> None:
    """Draw storage and write time against turns: colour per backend, line style per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    several_files = len({e["file"] for e in summary.checkpoint}) > 1
    backends = sorted({(e["file_index"], e["backend"]) for e in summary.checkpoint})
    colours = plt.get_cmap("tab10")
    variants = sorted(
        {(e["mode"], e["snapshot_frequency"] or 0, e["cache"]) for e in summary.checkpoint}
    )
    styles = ["-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1))]
    markers = ["o", "s", "^", "v", "D", "x"]
    fig, (ax_bytes, ax_time) = plt.subplots(1, 2, figsize=(15, 6))
    series: dict[tuple[Any, ...], list[tuple[int, float | None, float | None]]] = {}
    for e in summary.checkpoint:
        key = (e["file_index"], e["backend"], e["mode"], e["snapshot_frequency"] or 0, e["cache"])
        storage = e.get("db_bytes_closed") or e.get("logical_bytes")
        series.setdefault(key, []).append((e["updates"], storage, e.get("write_total_s")))
    for key, points in sorted(series.items(), key=lambda kv: str(kv[0])):
        file_index, backend, mode, freq, cache = key
        variant = variants.index((mode, freq, cache))
        label = f"{backend} {mode}"
        if mode == "delta":
            label += f" f={freq}" + (f" cache={cache}" if cache != NO_CACHE else "")
        if several_files:
            label += f" [file {file_index}]"
        style = {
            "color": colours(backends.index((file_index, backend)) % 10),
            "linestyle": styles[variant % len(styles)],
            "marker": markers[variant % len(markers)],
            "label": label,
        }
        points.sort()
        xs = [p[0] for p in points]
        ax_bytes.plot(xs, [(p[1] or 0) / 2**20 for p in points], **style)
        ax_time.plot(xs, [p[2] or 0 for p in points], **style)
    ax_bytes.set_xlabel("turns")
    ax_bytes.set_ylabel("storage MiB (db size after close, else logical bytes)")
    ax_bytes.set_yscale("log")
    ax_time.set_xlabel("turns")
    ax_time.set_ylabel("write phase seconds")
    ax_time.set_yscale("log")
    handles, labels = ax_time.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
