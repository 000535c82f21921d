"""Terminal output shared by the ``runstore`` commands (`runstore.cli` and the commands it
attaches: bench, retention), so none of them imports another for it."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click
from rich.console import Console
from rich.text import Text

#: The width of output that goes to a file or a pipe when COLUMNS does not say.
PIPED_WIDTH = 120


def output_width(stream: Any = None) -> int | None:
    """The width tables are fitted to: the terminal's, else ``COLUMNS``, else `PIPED_WIDTH`
    (``None``: rich asks the terminal itself)."""
    stream = sys.stdout if stream is None else stream
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if stream.isatty() else PIPED_WIDTH


# Markup and emoji codes are off: every string is printed as it is (an install hint such
# as 'runstore[postgres]', a test id such as test_x[memory], a path with :memory:);
# styled parts are `Text` objects built with `styled`.
console = Console(width=output_width(), markup=False, emoji=False)
err_console = Console(stderr=True, width=output_width(sys.stderr), markup=False, emoji=False)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Literal text with styled pieces: ``styled(("FAILED", "red"), " ", nodeid)``."""
    return Text.assemble(*parts)


def emit_json(data: Any) -> None:
    """Print ``data`` as indented, key-sorted JSON on stdout."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
