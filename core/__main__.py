"""``python -m runstore``: the ``runstore`` command."""

from runstore.cli import run

if __name__ == "__main__":
    run()
