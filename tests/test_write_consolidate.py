"""Consolidation: merges only within the date window, provenance unioned, frequencies summed, merged ids
recorded, and no fact lost or duplicated when the LLM fails or the process dies at any point of a swap."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pgr_core import HashingEmbedder, InMemoryStore, LLMTimeoutError, Scope
from pgr_core.cli.main import main
from pgr_core.errors import ConfigurationError
from pgr_core.testing import ScriptedLLM
from pgr_core.types import Fact
from pgr_core.write import Consolidator, Ingestor, Journal, Ledger, Session, Turn
from pgr_core.write.consolidate import FAULT_POINTS

U1, U2 = Scope(user_id="u1"), Scope(user_id="u2")


def _fact(fid: str, text: str, day: str, sessions: list[str], *, freq: int = 1, scope: Scope = U1, **kw: Any) -> Fact:
    meta = {"frequency": freq, "sessions": sessions, "entities": kw.pop("entities", []), "source": "extracted"}
    return Fact(id=fid, text=text, scope=scope, date=datetime.fromisoformat(day), metadata=meta, **kw)


FACTS = [
    _fact("p1", "The user is allergic to peanuts.", "2025-03-01", ["s1"], type="Identity", entities=["peanuts"]),
    _fact(
        "p2",
        "The user is severely allergic to peanuts.",
        "2025-03-05",
        ["s2"],
        freq=2,
        type="Identity",
        entities=["peanuts", "epipen"],
    ),
    # as alike, but its latest date is 29 days after p1's: outside the 7-day window
    _fact("p3", "The user is allergic to peanuts and tree nuts.", "2025-03-30", ["s5"], type="Identity"),
    _fact("t1", "The user plays tennis on Sundays.", "2025-03-02", ["s1"], type="Activity"),
    _fact("t2", "The user plays tennis every Sunday.", "2025-03-08", ["s3"], type="Activity"),
    _fact("m1", "The user moved to Leeds in March.", "2025-03-03", ["s1"], type="Event"),
    Fact(
        id="turn1",
        text="user: I am allergic to peanuts.",
        scope=U1,
        type="turn",
        date=datetime(2025, 3, 1),
        session_id="u1:s1",
        position=0,
    ),
    _fact("other", "The user is allergic to peanuts.", "2025-03-02", ["s9"], scope=U2, type="Identity"),
]
ORIGINAL_U1 = {f.id for f in FACTS if f.scope == U1}


def _store() -> InMemoryStore:
    store = InMemoryStore(embedder=HashingEmbedder())
    store.add_facts(FACTS)
    return store


def merge_llm() -> ScriptedLLM:
    def handler(messages: Any, schema: Any) -> dict[str, str]:
        prompt = messages[0]["content"]
        if "peanuts" in prompt:
            return {"text": "The user is severely allergic to peanuts and carries an epipen.", "type": "Identity"}
        return {"text": "The user plays tennis every Sunday.", "type": "activity"}

    return ScriptedLLM(handler=handler)


def _by_id(store: InMemoryStore, scope: Scope = U1) -> dict[str, Fact]:
    return {f.id: f for f in store.facts if f.scope == scope}


def test_only_facts_within_the_date_window_are_merged_with_provenance_unioned() -> None:
    store, llm = _store(), merge_llm()
    report = Consolidator(store, llm, threshold=0.7).consolidate(U1)
    assert report.clusters == 2 and report.merged == 2 and report.llm_calls == 2 and len(llm.calls) == 2
    facts = _by_id(store)
    merged = [f for f in facts.values() if f.metadata.get("source") == "merged"]
    peanut = next(f for f in merged if "peanuts" in f.text)
    assert peanut.metadata["merged_from"] == ["p1", "p2"]
    assert peanut.metadata["sessions"] == ["s1", "s2"]  # provenance unioned
    assert peanut.metadata["frequency"] == 3  # 1 + 2
    assert peanut.metadata["entities"] == ["peanuts", "epipen"]
    assert peanut.date == datetime(2025, 3, 1) and peanut.updated_at == datetime(2025, 3, 5)
    tennis = next(f for f in merged if "tennis" in f.text)
    assert tennis.type == "Activity" and tennis.metadata["merged_from"] == ["t1", "t2"]
    # p3 is as alike but a month later; the raw turn and the other user's fact are never touched
    assert {"p3", "m1", "turn1"} <= set(facts) and not {"p1", "p2", "t1", "t2"} & set(facts)
    assert _by_id(store, U2).keys() == {"other"}
    assert report.facts_before == 7 and report.facts_after == 5


def test_a_wider_window_lets_the_later_fact_join() -> None:
    store = _store()
    report = Consolidator(store, None, threshold=0.7, window_days=30).consolidate(U1)
    peanut = next(f for f in _by_id(store).values() if "p1" in f.metadata.get("merged_from", []))
    assert peanut.metadata["merged_from"] == ["p1", "p2", "p3"] and report.merged == 2


def test_without_an_llm_the_most_repeated_wording_is_kept() -> None:
    store = _store()
    Consolidator(store, None, threshold=0.7).consolidate(U1)
    peanut = next(f for f in _by_id(store).values() if "p1" in f.metadata.get("merged_from", []))
    assert peanut.text == "The user is severely allergic to peanuts."  # p2 was said twice


def test_a_failed_llm_merge_leaves_its_cluster_as_it_was() -> None:
    store = _store()
    llm = ScriptedLLM([LLMTimeoutError("slow"), "not json"], handler=None)
    report = Consolidator(store, llm, threshold=0.7).consolidate(U1)
    assert report.merged == 0 and len(report.failed) == 2
    assert set(_by_id(store)) == ORIGINAL_U1


def _covered(store: InMemoryStore) -> list[str]:
    """Every original id, once per fact that stands for it (itself, or a merged fact naming it)."""
    out: list[str] = []
    for fact in _by_id(store).values():
        out += fact.metadata.get("merged_from") or [fact.id]
    return out


def _dies_at(point: str) -> Callable[[str], None]:
    def fault(at: str) -> None:
        if at == point:
            raise SystemExit(f"process killed at {at}")

    return fault


@pytest.mark.parametrize("point", FAULT_POINTS)
@pytest.mark.parametrize("restart", ["same-process", "from-disk"])
def test_nothing_is_lost_or_duplicated_when_the_process_dies_mid_swap(tmp_path: Path, point: str, restart: str) -> None:
    path, journal = tmp_path / "m.pgr", tmp_path / "m.pgr.journal.jsonl"
    store = _store()
    store.save(path)
    consolidator = Consolidator(
        store,
        merge_llm(),
        threshold=0.7,
        journal=Journal(journal),
        checkpoint=lambda: store.save(path),
        fault=_dies_at(point),
    )
    with pytest.raises(SystemExit):
        consolidator.consolidate(U1)
    if restart == "from-disk":
        store = InMemoryStore.load(path, embedder=HashingEmbedder())  # what survived on disk
    reopened = Consolidator(
        store, merge_llm(), threshold=0.7, journal=Journal(journal), checkpoint=lambda: store.save(path)
    )
    assert reopened.recovered == (0 if point == "committed" else 1)
    covered = _covered(store)
    assert sorted(covered) == sorted(ORIGINAL_U1), f"lost or duplicated: {sorted(covered)}"
    assert Journal(journal).pending() == []
    # and the run can finish: every cluster merged once, nothing lost
    reopened.consolidate(U1)
    final = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert sorted(_covered(final)) == sorted(ORIGINAL_U1)
    assert len(_by_id(final)) == 5 and _by_id(final, U2).keys() == {"other"}


def test_a_torn_journal_line_is_ignored(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    journal.write_text('{"op": "intent", "swap": "x", "merged": {"id"', encoding="utf-8")  # cut mid-write
    store = _store()
    assert Consolidator(store, None, journal=Journal(journal)).recovered == 0
    assert set(_by_id(store)) == ORIGINAL_U1


def test_a_store_that_cannot_delete_is_refused_with_what_it_lacks() -> None:
    class AddOnly:
        facts: tuple[Fact, ...] = ()

        def add_facts(self, facts: Any) -> list[str]:
            return [f.id for f in facts]

    with pytest.raises(ConfigurationError, match=r"delete\(ids\)"):
        Consolidator(AddOnly())


def test_a_pgr_store_is_taken_at_what_it_declares() -> None:
    class Undeclared(InMemoryStore):  # has delete and facts_for, declares neither
        capabilities = replace(InMemoryStore.capabilities, deletes=False, lists=False)

    with pytest.raises(ConfigurationError, match=r"lacks delete\(ids\) \(capabilities\.deletes\)"):
        Consolidator(Undeclared(embedder=HashingEmbedder()))

    class ReadOnly(InMemoryStore):
        capabilities = replace(InMemoryStore.capabilities, writable=False)

    with pytest.raises(ConfigurationError, match=r"capabilities\.writable"):
        Ingestor(ReadOnly(embedder=HashingEmbedder()))


def test_ingestion_consolidates_once_enough_new_facts_came_in() -> None:
    store = InMemoryStore(embedder=HashingEmbedder())

    def handler(messages: Any, schema: Any) -> dict[str, Any]:
        prompt = messages[0]["content"]
        if "tidy a long-term memory" in prompt:
            return {"text": "The user plays tennis every Sunday.", "type": "Activity"}
        day = re.search(r"held on (\S+)\.", prompt).group(1)  # type: ignore[union-attr]
        return {"facts": [{"text": f"The user plays tennis every Sunday, said on {day[-2:]}.", "type": "Activity"}]}

    sessions = [Session(f"s{i}", f"2025-03-0{i + 1}", [Turn("user", "tennis again on Sunday")]) for i in range(5)]
    ledger = Ledger()
    ingestor = Ingestor(
        store,
        llm=ScriptedLLM(handler=handler),
        ledger=ledger,
        consolidate_every=3,
        related_k=0,
        consolidator=Consolidator(store, ScriptedLLM(handler=handler), threshold=0.6),
    )
    report = ingestor.ingest(sessions, scope=U1)
    assert report.consolidations == 1 and report.merged == 1  # after the third session's fact
    merged = [f for f in store.facts if f.metadata.get("source") == "merged"]
    assert len(merged) == 1 and merged[0].metadata["merged_from"] == ["u1:s0:f0", "u1:s1:f0", "u1:s2:f0"]
    assert ledger.pending(U1) == 2 and len(store) == 3  # s3 and s4 came after


def test_pgr_consolidate_merges_a_store_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGR_LLM_BASE_URL", raising=False)
    path = tmp_path / "m.pgr"
    _store().save(path)
    args = ["consolidate", "--store", str(path), "--embedder", "hashing", "--no-llm", "--threshold", "0.7"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr()[0])
    users = {u["scope"]: u for u in out["users"]}
    assert users["u1"]["merged"] == 2 and users["u1"]["facts_after"] == 5 and users["u2"]["merged"] == 0
    assert len(InMemoryStore.load(path, embedder=HashingEmbedder())) == 6
