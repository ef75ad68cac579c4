"""lab/gold_ranks.py: the rank of each gold item in a recorded list, and the summary of ranks."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

from gold_ranks import rank_of, summarise


def test_rank_of_a_fact_and_of_a_group() -> None:
    ids = ["a", "b", "c", "d"]
    assert rank_of("c", ids) == 3
    assert rank_of(["d", "b"], ids) == 2  # a group is found at its earliest member
    assert rank_of("z", ids) is None and rank_of(["y", "z"], ids) is None


def test_summary_counts_missing_items_as_zero_reciprocal_rank() -> None:
    row = summarise([1, 2, 4, None])
    assert row["gold"] == 4 and row["missed"] == 1
    assert (row["at_1"], row["at_3"], row["at_5"], row["at_20"]) == (0.25, 0.5, 0.75, 0.75)
    assert row["mrr"] == round((1 + 0.5 + 0.25) / 4, 3)
