"""Two owners inside one caller's scope may hold the same fact id: two facts, never one (issue 35, item 1).

A user's two agents each write a fact ``"dup"`` into an EdgeStore (ids are unique per owner there).
A search scoped to the user must return both, with centring on, through PGR with and without an LLM,
over the plain store and over Anticipating (cues of each fact found and fetched from its own owner).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("qdrant_edge")

from pgr_core import PGR, Anticipating, EdgeStore, Fact, HashingEmbedder, Scope, SearchParams
from pgr_core.testing import ScriptedLLM

USER = Scope(user_id="u1")
PLANNER = Scope(user_id="u1", agent_id="planner")
COACH = Scope(user_id="u1", agent_id="coach")
SURGERY = Fact(id="dup", text="my knee surgery was in March", scope=PLANNER)
RUNNING = Fact(id="dup", text="my knee hurts when I run", scope=COACH)
FILLER = [Fact(id=f"o{i}", text=f"other fact {i} about cooking pasta", scope=USER) for i in range(20)]


def _fill(store: EdgeStore | Anticipating) -> None:
    store.add_facts([SURGERY])
    store.add_facts([RUNNING])
    store.add_facts(FILLER)


def _both(facts: list[Fact]) -> bool:
    return {(f.id, f.scope, f.text) for f in facts} >= {
        (SURGERY.id, PLANNER, SURGERY.text),
        (RUNNING.id, COACH, RUNNING.text),
    }


@pytest.fixture
def edge(tmp_path: Path):
    store = EdgeStore.open(tmp_path / "mem", embedder=HashingEmbedder())
    _fill(store)
    yield store
    store.close()


@pytest.mark.parametrize("strategy", ["feedback", "none"])
def test_pgr_without_an_llm_returns_both_facts_and_keeps_centring(edge: EdgeStore, strategy: str) -> None:
    result = PGR(edge, strategy=strategy).retrieve("knee", scope=USER)
    assert _both([f.fact for f in result.facts])
    assert result.trace.centring_off is None and result.trace.centring
    keys = [f.key for f in result.facts]
    assert len(keys) == len(set(keys)) and "dup@u1/planner/" in keys and "dup@u1/coach/" in keys


def test_pgr_with_an_llm_shows_the_model_both_facts(edge: EdgeStore) -> None:
    llm = ScriptedLLM([{"intent": "the user's knee"}, {"steps": ["see a physio about the knee"]}, {"steps": []}])
    llm.handler = lambda messages, schema: {"summary": "two knee facts"}
    result = PGR(edge, llm=llm, strategy="cot").retrieve("knee", scope=USER)
    assert not result.trace.degraded, result.trace.errors
    assert _both([f.fact for f in result.facts]) and result.trace.centring_off is None
    shown = "\n".join(m["content"] for call in llm.calls for m in call.messages)
    assert SURGERY.text in shown and RUNNING.text in shown


def test_anticipating_finds_each_fact_by_its_own_cues_from_its_own_owner(tmp_path: Path) -> None:
    store = Anticipating(EdgeStore.open(tmp_path / "mem", embedder=HashingEmbedder()))
    try:
        _fill(store)
        store.put_cues({"dup": ["joining a soccer league this summer"]}, [SURGERY])
        store.put_cues({"dup": ["buying trail shoes"]}, [RUNNING])
        params = SearchParams(top_k=3, min_score=0.0)
        (soccer,) = store.search_batch(["joining a soccer league this summer"], scope=USER, params=params)
        assert (soccer[0].fact.scope, soccer[0].fact.text, soccer[0].cue) == (
            PLANNER,
            SURGERY.text,
            "joining a soccer league this summer",
        )
        (shoes,) = store.search_batch(["buying trail shoes"], scope=USER, params=params)
        assert (shoes[0].fact.scope, shoes[0].fact.text) == (COACH, RUNNING.text)
        result = PGR(store).retrieve("knee", scope=USER)
        assert _both([f.fact for f in result.facts]) and not result.trace.degraded
        assert store.cues_of(["dup"], scope=PLANNER) == {"dup": ("joining a soccer league this summer",)}
    finally:
        store.close()
