"""The progress the bench commands show while cases run (`RichReporter`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runstore.bench.runner import Reporter


class RichReporter(Reporter):
    """A progress bar on stderr while cases run (on an interactive terminal; in a log, one
    plain line per case instead); warnings printed as they happen."""

    def __init__(self, quiet: bool = False) -> None:
        from runstore.cli.console import err_console

        self.console = err_console
        self.quiet = quiet
        self._progress: Any = None
        self._task: Any = None

    def start(self, total: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        from runstore.cli.console import progress_bar

        if self.quiet:
            return
        self._progress = progress_bar(
            TextColumn("{task.description}", style="bold", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[last]}", markup=False),
            console=self.console,
        )
        self._progress.start()
        self._task = self._progress.add_task("cases", total=total, last="")

    def case_started(self, label: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=label[:70])

    def case_finished(self, label: str, row: Mapping[str, Any]) -> None:
        if self._progress is None:
            return
        status = row.get("status")
        extra = ""
        if row.get("turns_per_s") is not None:
            extra = f"{row['turns_per_s']:.1f} turns/s"
        elif row.get("checkpoints_per_s") is not None:
            extra = f"{row['checkpoints_per_s']:.0f} checkpoints/s"
        self._progress.update(self._task, advance=1, last=f"{status} {extra}")
        if self._progress.disable:
            seconds = row.get("case_seconds")
            took = f" in {seconds:.1f}s" if isinstance(seconds, int | float) else ""
            self.console.print(f"{label}: {status} {extra}{took}", highlight=False, soft_wrap=True)

    def warn(self, message: str) -> None:
        from runstore.cli.console import styled
        from runstore.redaction import redact

        self.console.print(styled(("warning:", "yellow"), f" {redact(message)}"), highlight=False)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
