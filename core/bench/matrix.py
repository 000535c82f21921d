"""Planning `runstore bench checkpoint`: the case matrix, the payload cap and run order.

A *cell* is one (backend, updates, payload, repetition): it runs one ``full`` case
and one ``delta`` case per (snapshot frequency, history cache). The cases of a cell
are paired: they replay the same seeded turns, so they must materialize the same
messages, and ``summarize`` divides one by the other. The cap and the digest check
act on whole cells, so a pair is never half run or half failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: Serialized size of one LangChain message beyond its content (type, id, empty
#: kwargs and metadata). Measured: 500 turns of 128-byte messages wrote 243 MB
#: to the stock sqlite saver in full mode, which this constant reproduces.
MESSAGE_OVERHEAD_BYTES = 350

#: Default cap on the estimated full-mode payload of one cell (1 GiB).
DEFAULT_PAYLOAD_CAP_BYTES = 1 << 30

PEER_PREFIX = "langgraph:"
PEERS = ("langgraph:memory", "langgraph:sqlite", "langgraph:postgres")
NO_CACHE = "none"


def estimate_full_payload_bytes(updates: int, payload_bytes: int) -> int:
    """Estimate the bytes a full-mode run of ``updates`` turns writes in total.

    Each turn adds a human and an AI message and writes the whole list twice
    (after the input and after the node), so turn ``i`` stores about ``4 i``
    messages: the sum is ``2 n (n + 1)`` messages of ``payload + overhead`` bytes.
    """
    return 2 * updates * (updates + 1) * (payload_bytes + MESSAGE_OVERHEAD_BYTES)


@dataclass(frozen=True)
class CheckpointCase:
    """One child-process run: one backend, one mode, one workload size."""

    case_id: str
    cell_id: str
    backend: str
    mode: str
    snapshot_frequency: int | None
    cache: str
    updates: int
    payload_bytes: int
    seed: int
    repetition: int
    order_in_cell: int
    estimated_full_bytes: int
    skipped: bool = False
    skip_reason: str | None = None

    @property
    def is_peer(self) -> bool:
        """Whether the backend is a stock LangGraph saver rather than a runstore URL."""
        return self.backend.startswith(PEER_PREFIX)

    def params(self) -> dict[str, Any]:
        """The case's fields, as they appear in a JSONL row."""
        data = asdict(self)
        data["peer"] = self.is_peer
        return data


@dataclass
class CheckpointPlan:
    """The planned cases in run order, plus warnings about skipped cells."""

    cases: list[CheckpointCase] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def runnable(self) -> list[CheckpointCase]:
        """Cases that will actually run."""
        return [c for c in self.cases if not c.skipped]

    @property
    def skipped(self) -> list[CheckpointCase]:
        """Cases skipped by the cap."""
        return [c for c in self.cases if c.skipped]


def cell_modes(
    snapshot_frequencies: Sequence[int], caches: Sequence[str]
) -> list[tuple[str, int | None, str]]:
    """The (mode, snapshot frequency, cache) variants of one cell, ``full`` first."""
    variants: list[tuple[str, int | None, str]] = [("full", None, NO_CACHE)]
    for freq in snapshot_frequencies:
        for cache in caches:
            variants.append(("delta", freq, cache))
    return variants


def plan_checkpoint(
    *,
    backends: Sequence[str],
    updates: Sequence[int],
    payload_bytes: Sequence[int],
    snapshot_frequencies: Sequence[int],
    repetitions: int,
    seed: int,
    caches: Sequence[str] = (NO_CACHE,),
    payload_cap_bytes: int = DEFAULT_PAYLOAD_CAP_BYTES,
    allow_large_cases: bool = False,
) -> CheckpointPlan:
    """Expand the matrix into cases in run order.

    Repetitions are the outer loop, so repetitions of one cell are spread over the
    run; within a cell the mode order alternates between repetitions (even: full
    first, odd: delta first) so warm-up and drift do not always favour one mode.
    """
    if repetitions < 1:
        raise ValueError("repetitions must be >= 1")
    if any(f < 1 for f in snapshot_frequencies):
        raise ValueError("snapshot frequencies must be >= 1")
    if any(u < 1 for u in updates):
        raise ValueError("updates must be >= 1")
    if any(p < 0 for p in payload_bytes):
        raise ValueError("payload bytes must be >= 0")
    if not snapshot_frequencies:
        raise ValueError("give at least one snapshot frequency")
    plan = CheckpointPlan()
    variants = cell_modes(snapshot_frequencies, caches or (NO_CACHE,))
    warned: set[tuple[int, int]] = set()
    for rep in range(repetitions):
        for backend in backends:
            for n in updates:
                for size in payload_bytes:
                    estimate = estimate_full_payload_bytes(n, size)
                    too_large = estimate > payload_cap_bytes and not allow_large_cases
                    reason = None
                    if too_large:
                        reason = (
                            f"estimated full-mode payload {estimate / 2**20:.0f} MiB exceeds the "
                            f"cap of {payload_cap_bytes / 2**20:.0f} MiB "
                            "(use --allow-large-cases or raise --payload-cap-mib)"
                        )
                        if (n, size) not in warned:
                            warned.add((n, size))
                            plan.warnings.append(
                                f"skipping {n} updates x {size} B (every backend, both modes): "
                                + reason
                            )
                    cell_id = f"{backend}|u{n}|p{size}|s{seed}|r{rep}"
                    ordered = variants if rep % 2 == 0 else list(reversed(variants))
                    for position, (mode, freq, cache) in enumerate(ordered):
                        tag = "full" if mode == "full" else f"delta-f{freq}-c{cache}"
                        plan.cases.append(
                            CheckpointCase(
                                case_id=f"{cell_id}|{tag}",
                                cell_id=cell_id,
                                backend=backend,
                                mode=mode,
                                snapshot_frequency=freq,
                                cache=cache,
                                updates=n,
                                payload_bytes=size,
                                seed=seed,
                                repetition=rep,
                                order_in_cell=position,
                                estimated_full_bytes=estimate,
                                skipped=too_large,
                                skip_reason=reason,
                            )
                        )
    return plan


def check_cell_digests(rows: list[dict[str, Any]]) -> list[str]:
    """Fail every row of a cell whose successful rows disagree on the message digest.

    ``rows`` are result rows (mutated in place: ``status`` becomes
    ``digest_mismatch``). Returns one message per failing cell.
    """
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_cell.setdefault(row["cell_id"], []).append(row)
    failures: list[str] = []
    for cell_id, cell_rows in by_cell.items():
        ok = [r for r in cell_rows if r.get("status") == "ok"]
        digests = {r.get("digest") for r in ok}
        if len(digests) <= 1:
            continue
        detail = ", ".join(
            f"{r['mode']}"
            + (f"(f={r['snapshot_frequency']},cache={r['cache']})" if r["mode"] == "delta" else "")
            + f"={str(r.get('digest'))[:12]}"
            for r in ok
        )
        failures.append(f"{cell_id}: paired modes materialized different messages: {detail}")
        for r in ok:
            r["status"] = "digest_mismatch"
            r["error"] = "paired cases materialized different messages"
    return failures
