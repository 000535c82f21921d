"""``python -m runstore``: the ``runstore`` command."""

from .cli import run

if __name__ == "__main__":
    run()
