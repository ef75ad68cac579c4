"""The prompts, one file each, read from package data and filled with ``str.format``."""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["prompt", "render"]

NAMES = (
    "answer",
    "augment",
    "cues",
    "cues_example",
    "judge_pair",
    "judge_recall",
    "prospect_cot",
    "prospect_tot",
    "repair",
    "revise",
    "summary",
    "write_aggregate",
    "write_answer",
    "write_choose",
    "write_critique",
    "write_edit",
    "write_extract",
    "write_judge",
    "write_merge",
)


@cache
def prompt(name: str) -> str:
    """The raw template ``name`` (see ``NAMES``)."""
    if name not in NAMES:
        raise KeyError(f"no prompt named {name!r}; known: {', '.join(NAMES)}")
    return resources.files(__package__).joinpath(f"{name}.md").read_text(encoding="utf-8")


def render(name: str, **values: object) -> str:
    return prompt(name).format(**values).strip()
