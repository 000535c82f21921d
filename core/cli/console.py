"""Terminal output shared by the ``runstore`` commands (`runstore.cli` and the commands it
attaches: bench, retention), so none of them imports another for it."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from rich.progress import Progress, ProgressColumn

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


def live_display(stream: Any = None) -> bool:
    """Whether progress bars and spinners may redraw their line: only on an interactive
    terminal (``stream``, default stderr), never into a pipe, a file or a dumb terminal,
    whatever ``FORCE_COLOR`` says (a log keeps plain lines)."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty()) and os.environ.get("TERM", "") != "dumb"


def progress_bar(*columns: str | ProgressColumn, console: Console | None = None, off: bool = False) -> Progress:
    """A rich `Progress` on ``console`` (default `err_console`) that draws only on an
    interactive terminal (`live_display`); elsewhere it prints nothing, so what the command
    prints itself (``progress.console.print``) is all a log holds."""
    from rich.progress import Progress

    console = err_console if console is None else console
    return Progress(*columns, console=console, transient=False, disable=off or not live_display(console.file))


@contextlib.contextmanager
def status(text: str, console: Console | None = None) -> Iterator[None]:
    """A spinner with ``text`` while the block runs, on an interactive terminal only."""
    console = err_console if console is None else console
    if not live_display(console.file):
        yield
        return
    with console.status(text):
        yield


def styled(*parts: str | tuple[str, str]) -> Text:
    """Literal text with styled pieces: ``styled(("FAILED", "red"), " ", nodeid)``."""
    return Text.assemble(*parts)


def emit_json(data: Any) -> None:
    """Print ``data`` as indented, key-sorted JSON on stdout."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
