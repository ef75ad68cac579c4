"""The public surface: __all__ complete and sorted, typed, prompts present."""

from __future__ import annotations

import inspect
import string
from importlib import resources

import pgr_core
from pgr_core.models.prompts import NAMES, prompt


def test_all_is_sorted_and_complete() -> None:
    exported = pgr_core.__all__
    assert exported == sorted(exported)
    assert len(set(exported)) == len(exported)
    public = {
        name
        for name, value in vars(pgr_core).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name not in {"annotations"}
    }
    assert public == set(exported)
    for name in exported:
        assert getattr(pgr_core, name) is not None


def test_package_is_typed() -> None:
    assert resources.files("pgr_core").joinpath("py.typed").is_file()


def test_every_prompt_is_package_data_and_formats() -> None:
    for name in NAMES:
        text = prompt(name)
        assert len(text) > 100 or name == "repair"
        # placeholders only: {{ }} braces survive formatting as literal JSON braces
        fields = {f for _, f, _, _ in string.Formatter().parse(text) if f}
        assert text.format(**dict.fromkeys(fields, "X"))
