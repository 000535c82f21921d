"""`runstore bench`: the benchmark harness (checkpoint savers, event stores, stream bridges).

Every case runs in a fresh child process (`runstore.bench.worker`); rows go to a
versioned JSONL file (`runstore.bench.common.SCHEMA_VERSION`) that
``runstore bench summarize`` turns into medians and ratios. See docs/benchmarks.md.
"""

from runstore.bench.common import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION"]
