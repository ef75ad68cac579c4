"""The README's Python example runs as written (the LLM swapped for a scripted one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pgr_core
from pgr_core import EdgeStore, HashingEmbedder, Scope
from pgr_core.testing import ScriptedLLM, planner_llm

README = Path(__file__).resolve().parent.parent / "README.md"


def _run_example(code: str, llm: ScriptedLLM, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Run a README block as written, with ``llm`` for OpenAICompatible and EdgeStore.open under
    ``tmp_path`` on the hashing embedder (fast, and independent of the MiniLM model)."""
    monkeypatch.setattr(pgr_core, "OpenAICompatible", lambda **kwargs: llm)

    class Edge:
        @staticmethod
        def open(path: str) -> EdgeStore:
            return EdgeStore.open(tmp_path / path, embedder=HashingEmbedder())

    monkeypatch.setattr(pgr_core, "EdgeStore", Edge)
    exec(compile(code, str(README), "exec"), {})


def test_readme_python_example(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # the first python block is the core example; the adapters' blocks are run by their own tests
    code = re.search(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert code, "README has no python example"
    llm = planner_llm(summary="The physio's advice matters: no sudden stops until July.")
    _run_example(code.group(1), llm, monkeypatch, tmp_path)
    with EdgeStore.open(tmp_path / "memory.edge", embedder=HashingEmbedder(), create=False) as again:
        assert [f.text for f in again.facts_for(Scope(user_id="u1"))] == ["My physio says no sudden stops until July"]
    out = capsys.readouterr().out
    assert "My physio says no sudden stops until July" in out
    assert "The physio's advice matters" in out
    assert len(llm.calls) >= 3 and all(call.schema for call in llm.calls)  # the default (cot) prospected


@pytest.mark.parametrize("adapter", ["mem0", "llamaindex", "qdrant"])
def test_adapter_examples_in_the_readme_are_the_ones_their_tests_run(adapter: str) -> None:
    """Each adapter's test file executes README_EXAMPLE; the README must show exactly that code."""
    import ast

    source = (README.parent / "tests" / "adapters" / f"test_adapter_{adapter}.py").read_text(encoding="utf-8")
    examples = [
        node.value.value
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and re.fullmatch(r"README_(\w+_)?EXAMPLE", t.id) for t in node.targets)
        and isinstance(node.value, ast.Constant)
    ]
    assert examples, f"tests/adapters/test_adapter_{adapter}.py runs no README example"
    shown = README.read_text(encoding="utf-8")
    assert examples[0].strip() in shown  # README_EXAMPLE: the quick start
    docs = shown + "".join(p.read_text(encoding="utf-8") for p in sorted((README.parent / "docs").glob("*.md")))
    for example in examples[1:]:  # any other block the docs show (README_LAYOUT_EXAMPLE: docs/stores.md)
        assert example.strip() in docs


def test_readme_anticipating_example(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The anticipatory-memory example runs as written: one extraction and one cue call at ingest,
    none at search, and the knee fact comes first through its cue."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## Anticipatory memory", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code, "the anticipatory-memory section has no python example"
    fact = "The user had knee surgery and may not run until September"
    llm = ScriptedLLM(
        [
            {"facts": [{"text": fact, "type": "Identity", "entities": [], "date": None, "updates": None}]},
            {"cues": [{"id": "F1", "cues": ["signing up for a 10k race in October", "planning a hiking weekend"]}]},
        ]
    )
    _run_example(code.group(1), llm, monkeypatch, tmp_path)
    out = capsys.readouterr().out
    assert "1 fact(s) cued in 1 call(s)" in out
    assert f"{fact} | found through: signing up for a 10k race in October" in out
    assert len(llm.calls) == 2  # extraction and cues; the search made none
    assert (tmp_path / "memory.edge" / "cues").is_dir()


def test_readme_installs_from_the_clone_never_from_pypi() -> None:
    """On PyPI the name ``pgr`` is an unrelated placeholder: every install line the README shows is of the
    clone (``pip install '.[extra]'``), and it says why."""
    text = README.read_text(encoding="utf-8")
    installs = re.findall(r"pip install [^`\n]*", text)
    from_pypi = [line for line in installs if re.search(r"pip install (-U )?'?pgr\b", line)]
    assert installs and from_pypi == ["pip install pgr"]  # the one line that warns against it
    assert "so `pip install pgr` does not get you this" in text
