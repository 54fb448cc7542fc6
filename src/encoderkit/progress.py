"""Progress for long jobs: a live bar (count, rate, ETA) on a terminal, periodic log lines elsewhere."""
from __future__ import annotations

import logging
import sys
import time
from types import TracebackType

log = logging.getLogger("encoderkit")


class Progress:
    def __init__(self, total: int | None, description: str, unit: str = "items", *, enabled: bool = True,
                 log_every_s: float = 10.0) -> None:
        self.total = total
        self.description = description
        self.unit = unit
        self.enabled = enabled
        self.done = 0
        self._skipped = 0
        self.log_every_s = log_every_s
        self._start = 0.0
        self._last_log = 0.0
        self._bar = None
        self._task = None

    def __enter__(self) -> "Progress":
        self._start = self._last_log = time.perf_counter()
        if self.enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)

            self._bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=Console(stderr=True), transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=self.total, rate="")
        return self

    def skip(self, n: int) -> None:
        """Units already done before this run (a resumed job): counted in the total, not in the rate."""
        self.done += n
        self._skipped += n
        if self._bar is not None:
            self._bar.update(self._task, advance=n)

    @property
    def rate(self) -> float:
        elapsed = time.perf_counter() - self._start
        return (self.done - self._skipped) / elapsed if elapsed > 0 else 0.0

    def advance(self, n: int = 1, status: str = "") -> None:
        """Count ``n`` more units; ``status`` (e.g. "loss 2.31, 8,000 tok/s") is shown beside the rate."""
        self.done += n
        rate = f"{self.rate:,.1f} {self.unit}/s" + (f", {status}" if status else "")
        if self._bar is not None:
            self._bar.update(self._task, advance=n, rate=rate)
        elif self.enabled and time.perf_counter() - self._last_log >= self.log_every_s:
            self._last_log = time.perf_counter()
            eta = ""
            if self.total and self.rate > 0:
                eta = f", ETA {(self.total - self.done) / self.rate:,.0f} s"
            total = f"/{self.total:,}" if self.total else ""
            print(f"{self.description}: {self.done:,}{total} {self.unit} ({rate}{eta})", file=sys.stderr, flush=True)

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
        if self.enabled and exc_type is None:
            elapsed = time.perf_counter() - self._start
            print(f"{self.description}: {self.done:,} {self.unit} in {elapsed:,.1f} s ({self.rate:,.1f} {self.unit}/s)",
                  file=sys.stderr, flush=True)
