"""``python -m runstore.cli``: the ``runstore`` command."""

from runstore.cli.main import run

if __name__ == "__main__":
    run()
