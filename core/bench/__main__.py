"""``python -m runstore.bench``: the bench commands without the main CLI."""

from runstore.bench.cli import bench_group

if __name__ == "__main__":
    bench_group(prog_name="runstore bench")
