"""The conformance suite every pgr store adapter passes (modelled on fsspec's abstract tests).

An adapter's test file subclasses :class:`StoreConformance` and supplies two fixtures::

    from pgr_core.testing.conformance import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def make_store(self, tmp_path):
            def build(facts):            # facts: list[pgr_core.Fact], possibly empty
                return MyStore(...)      # holding exactly these facts, through the adapter's own writes
            return build

        @pytest.fixture
        def failing_store(self):
            return MyStore(<a backend that fails on search>)

Tests that need a capability the store does not declare (``Store.capabilities``) skip with a reason
naming it; the suite never needs a test deleted. Facts are told apart by their text (an adapter may
assign its own ids), so the corpus texts are unique.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime

import pytest

from ..errors import StoreError
from ..policy import PGR
from ..store import Store
from ..types import Fact, Hit, Scope, SearchParams
from . import ScriptedLLM

__all__ = ["CORPUS_SCOPES", "StoreConformance", "conformance_corpus"]

ALICE = Scope(user_id="alice")
BOB = Scope(user_id="bob")
ALICE_AGENT = Scope(user_id="alice", agent_id="planner")
ALICE_RUN = Scope(user_id="alice", agent_id="planner", run_id="run-7")
CORPUS_SCOPES = (ALICE, BOB, ALICE_AGENT, ALICE_RUN)

_ALICE_TURNS = [
    "I twisted my knee skiing in February and the physio says no running until July",
    "Tuesday and Thursday evenings I have a bookkeeping class at the college",
    "I sold my car in January so I take the number 9 bus everywhere",
    "Rent went up by a hundred pounds a month, money is tight",
    "My coworker Sam plays five-a-side football on Sunday afternoons",
    "I cannot stand waking up early at the weekend",
]
_BOB_TURNS = [
    "Bob's knee is perfect and he runs marathons every spring",
    "Bob drives a red van to work every morning",
    "Bob's savings are large after selling his flat",
]


def conformance_corpus() -> list[Fact]:
    """The facts every adapter is tested on: two users, an agent and a run scope, dates, two sessions
    of ordered turns, and unicode. Texts are unique, so tests identify facts by text."""
    facts = [
        Fact(
            id=f"a{i}",
            text=text,
            scope=ALICE,
            type="turn",
            date=datetime(2025, 1 + i // 3, 5 + i),
            session_id=f"alice-s{i // 3}",
            position=i % 3,
        )
        for i, text in enumerate(_ALICE_TURNS)
    ]
    facts += [
        Fact(
            id=f"b{i}",
            text=text,
            scope=BOB,
            type="turn",
            date=datetime(2025, 2, 1 + i),
            session_id="bob-s0",
            position=i,
        )
        for i, text in enumerate(_BOB_TURNS)
    ]
    facts += [
        Fact(
            id="ag0",
            text="The planner agent noted that Alice prefers train travel over flying",
            scope=ALICE_AGENT,
            date=datetime(2025, 3, 1),
        ),
        Fact(
            id="run0",
            text="In run 7 Alice asked for a vegetarian dinner recipe without nuts",
            scope=ALICE_RUN,
            date=datetime(2025, 3, 2),
        ),
        Fact(
            id="uni",
            text="Alice a écrit : 膝の怪我 — le genou 🦵 guérit lentement",
            scope=ALICE,
            date=datetime(2025, 3, 3),
        ),
    ]
    return facts


def _texts(hits: Sequence[Hit]) -> list[str]:
    return [h.fact.text for h in hits if h.neighbour_of is None]


def _owner_of(text: str) -> Scope:
    return next(f.scope for f in conformance_corpus() if f.text == text)


class StoreConformance:
    """Plain test class: subclass it and provide ``make_store`` and ``failing_store`` fixtures."""

    # ------------------------------------------------------------------ fixtures to supply

    @pytest.fixture
    def make_store(self) -> Callable[[list[Fact]], Store]:
        raise NotImplementedError("supply a make_store fixture: facts -> a populated Store")

    @pytest.fixture
    def failing_store(self) -> Store:
        raise NotImplementedError("supply a failing_store fixture: a Store whose backend fails on search")

    @pytest.fixture
    def store(self, make_store: Callable[[list[Fact]], Store]) -> Store:
        return make_store(conformance_corpus())

    def _needs(self, store: Store, capability: str) -> None:
        if not getattr(store.capabilities, capability):
            pytest.skip(f"{type(store).__name__} declares no {capability!r} capability")

    @staticmethod
    def _search(store: Store, probes: list[str], scope: Scope, **params: object) -> list[list[Hit]]:
        return store._checked_search(probes, scope, SearchParams(**params))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ the tests

    def test_one_hit_list_per_probe_in_probe_order(self, store: Store) -> None:
        probes = ["selling the car and taking the bus", "knee injury and the physio", "bookkeeping class evenings"]
        hits = self._search(store, probes, ALICE, top_k=1, min_score=0.0)
        assert len(hits) == 3
        assert _texts(hits[0]) == [_ALICE_TURNS[2]]
        assert _texts(hits[1]) == [_ALICE_TURNS[0]]
        assert _texts(hits[2]) == [_ALICE_TURNS[1]]

    def test_top_k_is_honoured_and_hits_are_ranked(self, store: Store) -> None:
        for k in (1, 3, 5):
            hits = self._search(store, ["money, rent and savings"], ALICE, top_k=k, min_score=0.0)[0]
            direct = [h for h in hits if h.neighbour_of is None]
            assert len(direct) == k
            scores = [h.score for h in direct]
            assert scores == sorted(scores, reverse=True)

    def test_min_score_is_honoured(self, store: Store) -> None:
        self._needs(store, "cosine_scores")
        loose = self._search(store, ["knee injury"], ALICE, top_k=8, min_score=0.0)[0]
        cut = sorted(h.score for h in loose)[len(loose) // 2]
        strict = self._search(store, ["knee injury"], ALICE, top_k=8, min_score=cut)[0]
        assert strict and all(h.score >= cut - 1e-6 for h in strict) and len(strict) < len(loose)

    def test_a_probe_with_no_hits_gives_an_empty_list(self, store: Store) -> None:
        self._needs(store, "cosine_scores")
        hits = self._search(store, ["knee injury", "xqzv wplk"], ALICE, top_k=3, min_score=0.99)
        assert hits == [[], []]

    @pytest.mark.parametrize("scope", CORPUS_SCOPES, ids=lambda s: "-".join(s.as_dict().values()))
    def test_other_scopes_never_come_back(self, store: Store, scope: Scope) -> None:
        probes = ["knee", "car, van and bus", "money and savings", "travel", "dinner recipe", "genou 膝"]
        for hits in self._search(store, probes, scope, top_k=20, min_score=0.0):
            for text in _texts(hits):
                assert scope.allows(_owner_of(text)), f"{text!r} leaked into {scope}"

    def test_narrower_scopes_see_less(self, store: Store) -> None:
        seen = {
            s: {t for hits in self._search(store, ["Alice"], s, top_k=20, min_score=0.0) for t in _texts(hits)}
            for s in (ALICE, ALICE_AGENT, ALICE_RUN)
        }
        assert seen[ALICE_RUN] <= seen[ALICE_AGENT] <= seen[ALICE]
        assert seen[ALICE_RUN] == {"In run 7 Alice asked for a vegetarian dinner recipe without nuts"}

    def test_pgr_never_returns_another_users_fact(self, store: Store) -> None:
        llm = ScriptedLLM(
            handler=lambda messages, schema: (
                '{"intent": "plan"}'
                if schema and "intent" in schema.get("properties", {})
                else '{"nodes": [{"id": "n", "action": "Bob marathon red van savings flat"}]}'
                if schema and "nodes" in schema.get("properties", {})
                else '{"summary": "s"}'
            )
        )
        for pgr in (PGR(store, strategy="facet"), PGR(store, llm=llm, strategy="tot", max_rounds=2)):
            result = pgr.retrieve("Should I start running again?", scope=ALICE)
            assert result.facts and not result.degraded
            assert all(ALICE.allows(_owner_of(f.text)) for f in result.facts)

    def test_ids_are_stable_across_calls(self, store: Store) -> None:
        first = self._search(store, ["knee", "bus"], ALICE, top_k=3, min_score=0.0)
        again = self._search(store, ["knee", "bus"], ALICE, top_k=3, min_score=0.0)
        assert [[h.fact.id for h in lst] for lst in first] == [[h.fact.id for h in lst] for lst in again]
        ids = {h.fact.text: h.fact.id for lst in first for h in lst}
        assert all(isinstance(i, str) and i for i in ids.values())

    def test_dates_survive(self, store: Store) -> None:
        self._needs(store, "dates")
        expected = {f.text: f.date for f in conformance_corpus()}
        hits = self._search(store, ["knee", "bus", "money"], ALICE, top_k=2, min_score=0.0)
        for hit in (h for lst in hits for h in lst):
            assert hit.fact.date is not None
            assert hit.fact.date.replace(tzinfo=None) == expected[hit.fact.text]

    def test_unicode_and_very_long_probes(self, store: Store) -> None:
        hits = self._search(store, ["膝の怪我 le genou 🦵", "knee " * 3000], ALICE, top_k=1, min_score=0.0)
        assert _texts(hits[0]) == ["Alice a écrit : 膝の怪我 — le genou 🦵 guérit lentement"]
        assert len(_texts(hits[1])) == 1

    def test_an_empty_store_is_fine(self, make_store: Callable[[list[Fact]], Store]) -> None:
        empty = make_store([])
        assert self._search(empty, ["anything at all"], ALICE, top_k=5, min_score=0.0) == [[]]
        result = PGR(empty, strategy="facet").retrieve("Should I join a league?", scope=ALICE)
        assert result.facts == [] and not result.degraded

    def test_async_gives_what_sync_gives(self, store: Store) -> None:
        params = SearchParams(top_k=3, min_score=0.0)
        sync = store._checked_search(["knee", "bus"], ALICE, params)
        async_ = asyncio.run(store._achecked_search(["knee", "bus"], ALICE, params))
        assert [[(h.fact.id, round(h.score, 4)) for h in lst] for lst in sync] == [
            [(h.fact.id, round(h.score, 4)) for h in lst] for lst in async_
        ]

    def test_backend_failure_is_a_store_error_with_its_cause(self, failing_store: Store) -> None:
        with pytest.raises(StoreError) as info:
            failing_store._checked_search(["knee"], ALICE, SearchParams())
        assert info.value.__cause__ is not None
        result = PGR(failing_store, strategy="facet").retrieve("knee?", scope=ALICE)
        assert result.degraded and result.trace.stop_reason == "store_error"

    def test_window_brings_same_session_neighbours(self, store: Store) -> None:
        self._needs(store, "window")
        hits = self._search(store, ["sold my car, number 9 bus"], ALICE, top_k=1, min_score=0.0, window=1)[0]
        # the bus turn is the last of session alice-s0: only the turn before it is a neighbour
        assert [h.fact.text for h in hits] == [_ALICE_TURNS[2], _ALICE_TURNS[1]]
        assert hits[1].neighbour_of == hits[0].fact.id
