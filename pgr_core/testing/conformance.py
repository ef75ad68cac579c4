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
naming the flag and its method; the suite never needs a test deleted, and never looks for a method a
store did not declare. ``test_declared_capabilities_are_honest`` holds the declaration to the store:
each optional flag declared (``writable``, ``window``, ``lists``, ``vectors``, ``by_id``,
``deletes``) has its method, and it works on the corpus. Facts are told apart by their text (an
adapter may assign its own ids), so the corpus texts are unique.

:class:`AnticipatingConformance` runs the whole suite again through :class:`~pgr_core.Anticipating`
around the adapter's store, every fact given a cue, and adds the tests of the cue path (facts found
only through a cue come from the store by id, ``get_many``; their window from ``with_window``). It
needs a store that declares ``by_id`` (and skips, naming it, for one that does not)::

    class TestMyStoreAnticipating(AnticipatingConformance, TestMyStore):
        pass
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pytest

from pgr_core.anticipation.anticipating import Anticipating
from pgr_core.errors import StoreError
from pgr_core.models.embedders import Embedder, HashingEmbedder, unit_rows
from pgr_core.policy.pgr import PGR
from pgr_core.stores.contract import Store
from pgr_core.stores.memory import InMemoryStore
from pgr_core.testing import ScriptedLLM, planner_llm
from pgr_core.types import CAPABILITY_METHODS, Fact, Hit, Scope, SearchParams

__all__ = ["CORPUS_SCOPES", "AnticipatingConformance", "CuedStore", "StoreConformance", "conformance_corpus"]

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
        """Skip unless ``store`` declares ``capability`` (the reason names the flag and its method)."""
        if not getattr(store.capabilities, capability):
            method = CAPABILITY_METHODS.get(capability)
            pytest.skip(
                f"{type(store).__name__} declares no {capability!r} capability" + (f" ({method})" if method else "")
            )

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
        steps = ["Bob's knee and his spring marathons", "the red van he drives to work", "savings from selling a flat"]
        for pgr in (
            PGR(store, llm=planner_llm(steps), strategy="cot"),  # several probes, each aimed at bob's facts
            PGR(store, strategy="feedback"),  # its second probe holds alice's facts: still alice's scope only
            PGR(store, llm=llm, strategy="tot", max_rounds=2),
        ):
            result = pgr.retrieve("Should I start running again?", scope=ALICE)
            assert result.facts and not result.degraded
            assert all(ALICE.allows(_owner_of(f.text)) for f in result.facts)

    def test_pgr_is_centred_on_the_callers_own_memory_or_says_why(self, store: Store) -> None:
        query = "Should I start running again?"
        pgr = PGR(store, strategy="none")  # the query's own list, centred (pgr_core.policy.centring)
        result = pgr.retrieve(query, scope=ALICE)
        assert not result.degraded and all(ALICE.allows(_owner_of(f.text)) for f in result.facts)
        if result.trace.centring is None:  # a store that cannot give the mean runs uncentred, and says why
            assert result.trace.centring_off
            assert result.ids == pgr.query_only(query, scope=ALICE).ids
            return
        assert pgr.embedder is not None and pgr.centre is not None
        # the mean is over alice's own facts only (bob's, and nobody else's, never move it)
        own = [f.text for f in conformance_corpus() if ALICE.allows(f.scope)]
        mean = unit_rows(pgr.embedder.embed(own)).mean(axis=0)
        deep = store.search_batch([query], scope=ALICE, params=SearchParams(top_k=100, min_score=0.0))[0]
        deep = [h for h in deep if h.neighbour_of is None]
        vectors = unit_rows(pgr.embedder.embed([h.fact.text for h in deep]))
        expected = sorted((h.score - float(v @ mean) for h, v in zip(deep, vectors, strict=True)), reverse=True)
        got = [f.score for f in result.facts if f.via == "hit"]
        assert got == pytest.approx(expected[: len(got)], abs=2e-3)
        assert len(got) == min(20, len(deep))

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
        for pgr in (PGR(empty, strategy="feedback"), PGR(empty, llm=planner_llm(["knee", "bus", "rent"]))):
            result = pgr.retrieve("Should I join a league?", scope=ALICE)
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
        for pgr in (PGR(failing_store, strategy="feedback"), PGR(failing_store, llm=planner_llm(["knee", "bus"]))):
            result = pgr.retrieve("knee?", scope=ALICE)
            assert result.degraded and result.trace.stop_reason == "store_error"

    def test_window_brings_same_session_neighbours(self, store: Store) -> None:
        self._needs(store, "window")
        hits = self._search(store, ["sold my car, number 9 bus"], ALICE, top_k=1, min_score=0.0, window=1)[0]
        # the bus turn is the last of session alice-s0: only the turn before it is a neighbour
        assert [h.fact.text for h in hits] == [_ALICE_TURNS[2], _ALICE_TURNS[1]]
        assert hits[1].neighbour_of == hits[0].fact.id

    # ------------------------------------------------------------------ the declaration itself

    def test_declared_capabilities_are_honest(self, store: Store) -> None:
        """Each optional ability the store declares has its method, and it works on the corpus. One it
        does not declare is never asked of it: its method may be absent, and nothing is checked."""
        caps = store.capabilities
        ask: Any = store  # its optional methods, each called only where its flag is declared
        corpus = conformance_corpus()
        # the facts as the store holds them (an adapter may assign its own ids), read by search
        held = _found_by_text(store.store if isinstance(store, Anticipating) else store, corpus, first=False)
        alice = [f.text for f in corpus if ALICE.allows(f.scope)]
        alice_ids = [held[t].id for t in alice]
        bobs = held[_BOB_TURNS[0]]
        if caps.writable:
            assert callable(getattr(store, "add_facts", None)) or callable(getattr(store, "upsert_facts", None))
        if caps.lists:  # facts_for(scope): every fact the scope allows, and only those
            for scope in CORPUS_SCOPES:
                listed = ask.facts_for(scope)
                assert all(isinstance(f, Fact) and scope.allows(f.scope) for f in listed)
                assert sorted(f.text for f in listed) == sorted(f.text for f in corpus if scope.allows(f.scope))
        if caps.by_id:  # get_many and get: by id, within the scope
            got = ask.get_many([*alice_ids, bobs.id], scope=ALICE)
            assert {i: f.text for i, f in got.items()} == dict(zip(alice_ids, alice, strict=True))  # not Bob's
            one = ask.get(alice_ids[0], scope=ALICE)
            assert one is not None and (one.id, one.text) == (alice_ids[0], alice[0])
            assert ask.get(bobs.id, scope=ALICE) is None
        if caps.vectors:  # vectors_for: the stored unit vectors, one row per id, of the embedder's size
            rows = np.asarray(ask.vectors_for(alice_ids, scope=ALICE), dtype=np.float32)
            assert rows.ndim == 2 and rows.shape[0] == len(alice_ids)
            assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-3)
            embedder = getattr(store, "embedder", None)
            if embedder is not None:
                assert rows.shape[1] == embedder.dim
                assert np.all(np.sum(rows * unit_rows(embedder.embed(alice)), axis=1) > 0.99)
        if caps.window:  # with_window: the ±window same-session neighbours of given hits
            bus = held[_ALICE_TURNS[2]]
            near = ask.with_window([Hit(fact=bus, score=1.0, rank=0)], scope=ALICE, window=1)
            assert [(h.fact.text, h.neighbour_of) for h in near.get(bus.id, [])] == [(_ALICE_TURNS[1], bus.id)]
        if caps.deletes:  # delete(ids, scope=): last, as it changes the store
            gone = held[_ALICE_TURNS[5]]
            assert ask.delete([gone.id], scope=BOB) == 0  # not Bob's to delete
            assert ask.delete([gone.id], scope=ALICE) == 1
            assert gone.text not in _texts(self._search(store, [gone.text], ALICE, top_k=20, min_score=0.0)[0])
            if caps.by_id:
                assert ask.get_many([gone.id], scope=ALICE) == {}
            if caps.lists:
                assert gone.text not in {f.text for f in ask.facts_for(ALICE)}


# ---------------------------------------------------------------------- the suite through Anticipating

#: One cue shared by Alice's knee turn and Bob's marathon turn (a cross-tenant trap). The knee turn is
#: far from it by its own text: MiniLM ranks the bus turn first for it, so the knee turn is found only
#: through the cue (and is position 0 of session alice-s0, whose next turn is the bookkeeping class).
RACE_CUE = "should I sign up for the October 10k race"

#: corpus text -> its cues: each about its own fact only, and far from every probe of the suite, so the
#: suite's expectations hold through the cue index as they do without it.
CORPUS_CUES: dict[str, tuple[str, ...]] = {
    _ALICE_TURNS[0]: (RACE_CUE,),
    _ALICE_TURNS[1]: ("pick an evening for a weekly pub quiz",),
    _ALICE_TURNS[2]: ("plan a weekend road trip to the coast",),
    _ALICE_TURNS[3]: ("is it a good time to buy a new laptop",),
    _ALICE_TURNS[4]: ("find a team sport to play with colleagues",),
    _ALICE_TURNS[5]: ("book a 7am Saturday yoga class",),
    _BOB_TURNS[0]: (RACE_CUE,),
    _BOB_TURNS[1]: ("who can give me a lift to the airport",),
    _BOB_TURNS[2]: ("should I lend my brother money for a deposit",),
    "The planner agent noted that Alice prefers train travel over flying": ("book the trip to Edinburgh next month",),
    "In run 7 Alice asked for a vegetarian dinner recipe without nuts": ("what should I cook for the dinner party",),
    "Alice a écrit : 膝の怪我 — le genou 🦵 guérit lentement": ("comment organiser une randonnée en montagne",),
}


@dataclass
class CuedStore:
    """An adapter's store filled with the corpus, wrapped in :class:`Anticipating` with every fact cued.

    ``facts``: corpus text -> the fact as the adapter returns it (its own id, dates and owner)."""

    store: Anticipating
    facts: dict[str, Fact]

    @property
    def inner(self) -> Store:
        return self.store.store

    def fact(self, text: str) -> Fact:
        return self.facts[text]


def _found_by_text(store: Store, corpus: Sequence[Fact], *, first: bool) -> dict[str, Fact]:
    """corpus text -> the fact the store holds for it: a search for its exact text under its owner (asks
    nothing of the store but search), the fact among the first five (``first``: ranked first)."""
    by_owner: dict[Scope, list[Fact]] = {}
    for fact in corpus:
        by_owner.setdefault(fact.scope, []).append(fact)
    found: dict[str, Fact] = {}
    params = SearchParams(top_k=1 if first else 5, min_score=0.0)
    for owner, owned in by_owner.items():
        for fact, hits in zip(owned, store._checked_search([f.text for f in owned], owner, params), strict=True):
            same = [h.fact for h in hits if h.neighbour_of is None and h.fact.text == fact.text]
            where = "rank" if first else "find"
            assert same, f"{type(store).__name__} does not {where} {fact.text!r} for its own text: {_texts(hits)}"
            found[fact.text] = same[0]
    return found


class AnticipatingConformance(StoreConformance):
    """The conformance suite through :class:`Anticipating`, and the tests of its cue path.

    Put it first among the bases of an adapter's test class (``class TestXAnticipating(
    AnticipatingConformance, TestX): pass``): every suite test then searches ``Anticipating(store,
    cues=InMemoryStore(...))`` around the adapter's store (``make_store`` and ``failing_store`` are the
    adapter's own), each corpus fact given the cues of :data:`CORPUS_CUES` through ``put_cues``.

    Hooks: ``cue_embedder`` (the cue index's embedder: the module's ``embedder`` fixture where it has
    one, else the wrapped store's, else :class:`HashingEmbedder`), and :meth:`delete_behind_the_wrapper`
    (remove a fact from the adapter's store without the wrapper; default: the store's
    ``delete(ids, scope=)`` where it declares ``deletes``, else the test skips).

    Every test here needs the adapter's store to declare ``by_id`` (the cue path fetches the facts it
    found by id); for one that does not, they skip, naming it.
    """

    cue_weight = 0.9
    scoring = "auto"  # Anticipating's scoring rule under test: the default ("max": a subclass sets it)

    # ------------------------------------------------------------------ fixtures and hooks

    @pytest.fixture
    def cue_embedder(self, request: pytest.FixtureRequest) -> Embedder | None:
        try:
            return request.getfixturevalue("embedder")  # type: ignore[no-any-return]
        except pytest.FixtureLookupError:
            return None

    def anticipating(self, inner: Store, embedder: Embedder | None) -> Anticipating:
        """``inner`` wrapped, with an empty in-memory cue index."""
        own = getattr(inner, "embedder", None)
        chosen = embedder or (own if callable(getattr(own, "embed", None)) else None) or HashingEmbedder()
        return Anticipating(
            inner, cues=InMemoryStore(embedder=chosen), cue_weight=self.cue_weight, scoring=self.scoring
        )

    @pytest.fixture
    def cued_store(self, make_store: Callable[[list[Fact]], Store], cue_embedder: Embedder | None) -> CuedStore:
        corpus = conformance_corpus()
        inner = make_store(corpus)
        self._needs(inner, "by_id")  # facts found only through a cue are fetched by id
        wrapped = self.anticipating(inner, cue_embedder)
        facts = _found_by_text(wrapped.store, corpus, first=True)
        written = wrapped.put_cues({facts[t].id: list(c) for t, c in CORPUS_CUES.items()}, list(facts.values()))
        assert written == sum(len(c) for c in CORPUS_CUES.values())
        return CuedStore(wrapped, facts)

    @pytest.fixture
    def store(self, cued_store: CuedStore) -> Store:  # type: ignore[override]
        return cued_store.store

    def delete_behind_the_wrapper(self, inner: Store, fact: Fact) -> None:
        """Remove ``fact`` from ``inner`` itself, so the cue index still holds its cues. Override for a
        store that deletes another way; the default uses ``delete(ids, scope=)`` where the store declares
        ``deletes``, or skips."""
        self._needs(inner, "deletes")  # or override delete_behind_the_wrapper
        inner.delete([fact.id], scope=fact.scope)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ the suite's own stores, wrapped

    def test_an_empty_store_is_fine(  # type: ignore[override]
        self, make_store: Callable[[list[Fact]], Store], cue_embedder: Embedder | None
    ) -> None:
        super().test_an_empty_store_is_fine(lambda facts: self.anticipating(make_store(facts), cue_embedder))

    def test_backend_failure_is_a_store_error_with_its_cause(  # type: ignore[override]
        self, failing_store: Store, cue_embedder: Embedder | None
    ) -> None:
        super().test_backend_failure_is_a_store_error_with_its_cause(self.anticipating(failing_store, cue_embedder))

    # ------------------------------------------------------------------ the cue path

    def test_a_probe_equal_to_a_cue_finds_its_fact_through_the_cue(self, cued_store: CuedStore) -> None:
        knee = cued_store.fact(_ALICE_TURNS[0])
        alone = self._search(cued_store.inner, [RACE_CUE], ALICE, top_k=1, min_score=0.0)[0]
        assert _texts(alone) != [knee.text], "the probe should be far from the fact's own text"
        hits = self._search(cued_store.store, [RACE_CUE], ALICE, top_k=3, min_score=0.0)[0]
        top = hits[0]
        assert top.neighbour_of is None and top.cue == RACE_CUE
        assert top.fact.text == knee.text and top.fact == knee  # fetched by id: as the store's search gives it
        if cued_store.store.scoring == "max":
            assert top.score == pytest.approx(cued_store.store.cue_weight, abs=0.01)  # cue_weight x cosine 1
        assert [h.rank for h in hits if h.neighbour_of is None] == list(range(len(_texts(hits))))

    def test_a_cue_shared_by_two_users_finds_each_users_own_fact(self, cued_store: CuedStore) -> None:
        alice = self._search(cued_store.store, [RACE_CUE], ALICE, top_k=5, min_score=0.0)[0]
        assert _texts(alice)[0] == _ALICE_TURNS[0] and alice[0].cue == RACE_CUE
        assert all(ALICE.allows(h.fact.scope) for h in alice)
        assert not set(_BOB_TURNS) & {h.fact.text for h in alice}
        bob = self._search(cued_store.store, [RACE_CUE], BOB, top_k=5, min_score=0.0)[0]
        assert _texts(bob)[0] == _BOB_TURNS[0] and bob[0].cue == RACE_CUE
        assert bob[0].fact == cued_store.fact(_BOB_TURNS[0])
        assert all(h.fact.scope == BOB for h in bob)
        assert _ALICE_TURNS[0] not in {h.fact.text for h in bob}

    def test_a_cue_only_hit_brings_its_same_session_neighbours(self, cued_store: CuedStore) -> None:
        self._needs(cued_store.inner, "window")  # the cue-only hit's neighbours: the store's with_window
        alone = self._search(cued_store.inner, [RACE_CUE], ALICE, top_k=1, min_score=0.0, window=1)[0]
        assert _ALICE_TURNS[0] not in _texts(alone), "the knee turn should come through its cue only"
        hits = self._search(cued_store.store, [RACE_CUE], ALICE, top_k=1, min_score=0.0, window=1)[0]
        # the knee turn is the first of session alice-s0: only the turn after it is a neighbour
        assert [h.fact.text for h in hits] == [_ALICE_TURNS[0], _ALICE_TURNS[1]]
        assert hits[0].cue == RACE_CUE and hits[0].neighbour_of is None
        assert hits[1].neighbour_of == hits[0].fact.id and hits[1].rank == hits[0].rank
        assert hits[1].fact == cued_store.fact(_ALICE_TURNS[1])

    def test_deleting_a_fact_through_the_wrapper_deletes_its_cues(self, cued_store: CuedStore) -> None:
        self._needs(cued_store.inner, "deletes")
        wrapped = cued_store.store
        knee, marathon = cued_store.fact(_ALICE_TURNS[0]), cued_store.fact(_BOB_TURNS[0])
        assert wrapped.cues_of([knee.id], scope=knee.scope) == {knee.id: (RACE_CUE,)}
        assert wrapped.delete([knee.id], scope=knee.scope) == 1
        assert wrapped.cues_of([knee.id], scope=knee.scope) == {}
        hits = self._search(wrapped, [RACE_CUE], ALICE, top_k=5, min_score=0.0)[0]
        assert knee.text not in {h.fact.text for h in hits} and len(_texts(hits)) == 5
        # Bob's fact holds the same cue text, and keeps it
        assert wrapped.cues_of([marathon.id], scope=BOB) == {marathon.id: (RACE_CUE,)}

    def test_a_fact_deleted_behind_the_wrappers_back_is_never_served_from_its_cues(self, cued_store: CuedStore) -> None:
        wrapped = cued_store.store
        knee = cued_store.fact(_ALICE_TURNS[0])
        self.delete_behind_the_wrapper(cued_store.inner, knee)
        assert wrapped.cues_of([knee.id], scope=knee.scope) == {knee.id: (RACE_CUE,)}  # the index is stale
        for k in (1, 3):
            hits = self._search(wrapped, [RACE_CUE], ALICE, top_k=k, min_score=0.0)[0]
            assert knee.text not in {h.fact.text for h in hits}
            assert len(_texts(hits)) == k  # the places it left are filled
