"""Argument types for the command line: each refuses what the option cannot mean, in one line."""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

__all__ = ["OneLineParser", "nonnegative_float", "nonnegative_int", "positive_int", "unit_float"]


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``pgr: error: ...``, and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"pgr: error: {self.prog}: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def _number(text: str, kind: type) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def nonnegative_float(text: str) -> float:
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return float(value)


def unit_float(text: str) -> float:
    value = _number(text, float)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1")
    return float(value)


def nonnegative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 0")
    return int(value)


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 1")
    return int(value)
