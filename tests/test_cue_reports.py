"""The cue write path says what it did: why a fact got no cue, per session, and which cues a fact holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("qdrant_edge")

from pgr_core import Anticipating, CueWriter, EdgeStore, Fact, HashingEmbedder, Scope
from pgr_core.cli.main import main
from pgr_core.errors import LLMConnectionError
from pgr_core.testing import ScriptedLLM

MAYA = Scope(user_id="maya")


def _fact(fid: str, text: str, session: str, position: int) -> Fact:
    return Fact(id=fid, text=text, scope=MAYA, session_id=session, position=position)


KNEE = _fact("f1", "Maya had knee surgery in March and may not run until September.", "s1", 0)
CAR = _fact("f2", "Maya sold her car last month and now bikes everywhere.", "s1", 1)
DOG = _fact("f3", "Maya adopted a greyhound called Pixel.", "s2", 0)
GOOD = ["should I join a soccer league this summer?", "signing up for a charity 10k"]
ECHO = ["knee surgery in March", "may not run until September"]  # restates its fact: refused


def _store(path: Path) -> Anticipating:
    return Anticipating(EdgeStore.open(path, embedder=HashingEmbedder()))


def test_a_build_names_each_session_whose_facts_got_no_cue_and_why(tmp_path: Path) -> None:
    reply = {"cues": [{"id": "F1", "cues": ECHO}, {"id": "F2", "cues": ["plan a road trip for us", "moving a sofa"]}]}
    llm = ScriptedLLM([reply, reply, LLMConnectionError("refused")])  # s1, its repair, then s2's call fails
    with _store(tmp_path / "mem") as store:
        store.add_facts([KNEE, CAR, DOG])
        report = store.build(CueWriter(llm), scope=MAYA).to_dict()
    assert (report["cued"], report["without_cues"]) == (1, 2)
    why = {(w["session"], tuple(w["facts"])): w["why"] for w in report["without"]}
    assert set(why) == {("s1", ("f1",)), ("s2", ("f3",))}
    assert "refused" in why[("s1", ("f1",))] and "restates the fact" in why[("s1", ("f1",))]
    assert "call failed" in why[("s2", ("f3",))] and "next build" in why[("s2", ("f3",))]


def test_pgr_cues_show_lists_a_facts_cues_and_says_which_have_none(tmp_path: Path, capsys) -> None:
    path = tmp_path / "mem"
    with _store(path) as store:
        store.add_facts([KNEE, CAR, DOG])
        store.put_cues({"f1": GOOD}, [KNEE])
    base = ["cues", "show", "--store", str(path), "--user", "maya", "--embedder", "hashing"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert f"cue: {GOOD[0]}" in out and "no cues" in out and "1 of 3 fact(s) cued" in out
    assert main([*base[:2], "f1", *base[2:], "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["facts"] == [{"id": "f1", "text": KNEE.text, "cues": GOOD}]
    assert main([*base[:2], "nope", *base[2:]]) == 2
    assert "no fact 'nope'" in capsys.readouterr().err


def test_an_extraction_that_stores_nothing_says_why() -> None:
    from pgr_core import InMemoryStore
    from pgr_core.write import Ingestor, Session, Turn

    said = [Session("s1", "2025-03-02", [Turn("user", "Had knee surgery last week")])]
    nothing = ScriptedLLM([{"facts": []}])
    empty = Ingestor(InMemoryStore(embedder=HashingEmbedder()), llm=nothing).ingest(said, scope=MAYA)
    assert empty.facts_added == 0 and empty.without_facts == [
        {"session": "maya/s1", "why": "the model extracted no fact from it"}
    ]
    refused = ScriptedLLM([{"facts": [{"text": "", "type": "Event"}]}])
    report = Ingestor(InMemoryStore(embedder=HashingEmbedder()), llm=refused).ingest(said, scope=MAYA)
    assert "every fact the model extracted was refused" in report.without_facts[0]["why"]
    assert "empty text" in report.without_facts[0]["why"]
