"""A one-line progress bar on stderr (no dependency), redrawn at most ten times a second."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, label: str, total: int | None, *, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.stream = stream or sys.stderr
        self.done = 0
        self.note = ""
        self._last = 0.0
        self._drawn = False

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        self.note = note or self.note
        now = time.monotonic()
        if self.enabled and (now - self._last >= 0.1 or self.done == self.total):
            self._last = now
            self._draw()

    def _draw(self) -> None:
        if self.total:
            filled = int(24 * self.done / self.total)
            bar = f"[{'#' * filled}{'.' * (24 - filled)}] {self.done}/{self.total}"
        else:
            bar = f"{self.done}"
        self.stream.write(f"\r{self.label} {bar} {self.note}".ljust(79))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
