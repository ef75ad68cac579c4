"""Argument types for the command line: each refuses what the option cannot mean, in one line."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = ["OneLineParser", "nonnegative_float", "nonnegative_int", "positive_int", "unit_float"]


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``pgr: error: ...``, and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"pgr: error: {self.prog}: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def _bounded(kind: type, low: float, high: float | None, what: str) -> Callable[[str], Any]:
    """An argparse type: ``kind`` (int or float) read from the text, finite, within [low, high]."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r} must be {what}")
        return value

    return parse


nonnegative_float = _bounded(float, 0.0, None, ">= 0")
unit_float = _bounded(float, 0.0, 1.0, "between 0 and 1")
nonnegative_int = _bounded(int, 0, None, "an integer >= 0")
positive_int = _bounded(int, 1, None, "an integer >= 1")
