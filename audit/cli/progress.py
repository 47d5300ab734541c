"""A progress bar for long audits: records, tokens/s and ETA (and shards done, when the run is
cut into shards), on stderr, only on a terminal.

It stays hidden for the first seconds, so a quick run prints nothing extra, and it is never
drawn when stderr is not a terminal (CI logs, pipes, `--format json` consumers).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from audit.base.inert import terminal
from audit.base.storage import AnyPath

# A run shorter than this never shows a bar.
SHOW_AFTER_SECONDS = 2.0


class AuditProgress:
    """The engine's progress callback (records, output tokens, bytes read) drawn as a bar."""

    def __init__(self, console: Console, label: str, total_bytes: int, *, show_after: float = SHOW_AFTER_SECONDS):
        self.console = console
        self.label = terminal(label, 60)  # a partition name is a file name: anything but markup
        self.total_bytes = max(1, total_bytes)
        self.show_after = show_after
        self.started = time.perf_counter()
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._shards = ""  # "12/40 shards" when the run is cut into shards (--engine ray)

    def shards(self, done: int, total: int) -> None:
        """How many of the run's shards are done (an executor that runs shards calls it)."""
        self._shards = f"{done}/{total} shards"
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, shards=self._shards)

    def __call__(self, records: int, output_tokens: int, read_bytes: int) -> None:
        elapsed = time.perf_counter() - self.started
        if self._progress is None:
            if elapsed < self.show_after:
                return
            self._progress = Progress(
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                TextColumn("{task.fields[shards]}"),
                TextColumn("{task.fields[records]:,} records"),
                TextColumn("{task.fields[rate]} tokens/s"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                self.label, total=self.total_bytes, records=0, rate="-", shards=self._shards
            )
        rate = output_tokens / elapsed if elapsed > 0 else 0.0
        assert self._task is not None  # added with the progress bar, above
        self._progress.update(
            self._task, completed=read_bytes, records=records, rate=f"{rate / 1e6:.1f}M" if rate >= 1e6 else f"{rate:,.0f}"
        )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


@contextmanager
def audit_progress(console: Console, label: str, data_file: AnyPath, *, enabled: bool = True) -> Iterator[AuditProgress | None]:
    """A progress callback for one file, or None when stderr is not a terminal."""
    if not enabled or not console.is_terminal:
        yield None
        return
    bar = AuditProgress(console, label, data_file.stat().st_size if data_file.exists() else 0)
    try:
        yield bar
    finally:
        bar.close()
