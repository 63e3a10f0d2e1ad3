"""The argparse types the commands share: a value refused at the command line, with what was expected."""
from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """argparse type of the commands' batch sizes and counts: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def cosine_threshold(text: str) -> float:
    """argparse type of --threshold: a cosine similarity, a finite number in [-1, 1] (NaN would call every
    pair different)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not -1.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a cosine similarity in [-1, 1], got {text!r}")
    return value
