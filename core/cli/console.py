"""Terminal output shared by the ``runstore`` commands (`runstore.cli` and the commands it
attaches: bench, retention), so none of them imports another for it."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.text import Text

# Tables stay readable when piped: rich would otherwise wrap them to 80 columns. Markup
# and emoji codes are off: every string is printed as it is (an install hint such as
# 'runstore[postgres]', a test id such as test_x[memory], a path with :memory:);
# styled parts are `Text` objects built with `styled`.
console = Console(width=None if sys.stdout.isatty() else 160, markup=False, emoji=False)
err_console = Console(stderr=True, markup=False, emoji=False)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Literal text with styled pieces: ``styled(("FAILED", "red"), " ", nodeid)``."""
    return Text.assemble(*parts)


def emit_json(data: Any) -> None:
    """Print ``data`` as indented, key-sorted JSON on stdout."""
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
