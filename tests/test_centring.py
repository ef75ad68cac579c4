"""Scores centred on the user's memory (pgr_core.policy.centring): a fact typical of everything the user says
loses w x its mean cosine to the scope's facts, so a specific fact can outrank it; the mean is the
scope's own, rebuilt after a write, and a store that cannot give it leaves the call uncentred."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from pgr_core import PGR, Fact, InMemoryStore, Scope
from pgr_core.errors import InvalidArgumentError
from pgr_core.policy.centring import MemoryCentre, centred
from pgr_core.stores.contract import Store
from pgr_core.types import Capabilities, Hit, SearchParams

ALICE, BOB = Scope(user_id="alice"), Scope(user_id="bob")
TYPICAL = (0.8, 0.6, 0.0)  # cosine 0.8 to the query: close, and like every other fact of the user
SPECIFIC = (0.6, 0.0, 0.8)  # cosine 0.6 to the query: further, and unlike the rest


def _fact(fact_id: str, text: str, scope: Scope = ALICE) -> Fact:
    return Fact(id=fact_id, text=text, scope=scope)


class Hand:
    """Each text's vector given by hand (unit length after normalising); the query is the x axis."""

    name = "hand"
    dim = 3

    def __init__(self, vectors: dict[str, Sequence[float]]) -> None:
        self.vectors = vectors
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        rows = np.asarray([self.vectors.get(t, (1.0, 0.0, 0.0)) for t in texts], dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _store(extra: dict[str, Sequence[float]] | None = None) -> tuple[InMemoryStore, Hand]:
    vectors: dict[str, Sequence[float]] = {f"typical {i}": TYPICAL for i in range(4)}
    vectors["knee operation"] = SPECIFIC
    vectors.update(extra or {})
    embedder = Hand(vectors)
    store = InMemoryStore(embedder=embedder)
    store.add_facts([Fact(id=f"a{i}", text=f"typical {i}", scope=ALICE) for i in range(4)])
    store.add_facts([Fact(id="knee", text="knee operation", scope=ALICE)])
    return store, embedder


def test_centred_cuts_by_hand() -> None:
    f = {i: Fact(id=i, text=i, scope=ALICE, session_id="s", position=p) for i, p in (("a", 1), ("b", 5), ("c", 9))}
    hits = [
        Hit(f["a"], 0.70, 0),
        Hit(f["b"], 0.50, 1),
        Hit(f["c"], 0.25, 2),  # below τ = 0.3: out, whatever its typicality
        Hit(Fact(id="b+1", text="b+1", scope=ALICE, session_id="s", position=6), 0.0, 1, neighbour_of="b"),
    ]
    typical = {"a": 0.60, "b": 0.20, "c": 0.0}
    got = [(h.fact.id, h.rank, round(h.score, 3), h.neighbour_of) for h in centred(hits, typical, 1.0, 2, 0.3)]
    # a: 0.70 - 0.60 = 0.10; b: 0.50 - 0.20 = 0.30 -> b first, its neighbour right behind it at its rank
    assert got == [("b", 0, 0.3, None), ("b+1", 0, 0.0, "b"), ("a", 1, 0.1, None)]
    # a quarter of the weight: a 0.55, b 0.45
    assert [h.fact.id for h in centred(hits, typical, 0.25, 1, 0.3)] == ["a"]


def test_a_specific_fact_outranks_the_typical_ones_only_when_centred() -> None:
    store, _ = _store()
    plain = PGR(store).query_only("what should I plan", scope=ALICE, top_k=5)
    assert plain.ids[-1] == "knee"  # by cosine it comes last of five
    result = PGR(store).retrieve("what should I plan", scope=ALICE)  # no LLM: the query's own list, centred
    assert result.top(1)[0].id == "knee"
    assert result.trace.centring == 1.0 and result.trace.centring_off is None
    # mean = (4 x typical + specific) / 5; typicality: typical 0.896, specific 0.584 (by hand)
    assert result.top(1)[0].score == pytest.approx(0.6 - 0.584, abs=1e-4)
    off = PGR(store, centring=None).retrieve("what should I plan", scope=ALICE)
    assert off.ids == plain.ids and off.trace.centring is None


def test_the_mean_is_the_callers_own_scope() -> None:
    # bob's memory is all about knees: were it mixed into alice's mean, her knee fact would look typical
    store, _ = _store({f"bob knee {i}": SPECIFIC for i in range(20)})
    before = PGR(store).retrieve("what should I plan", scope=ALICE)
    store.add_facts([Fact(id=f"b{i}", text=f"bob knee {i}", scope=BOB) for i in range(20)])
    after = PGR(store).retrieve("what should I plan", scope=ALICE)
    assert after.ids == before.ids
    assert [f.score for f in after.facts] == pytest.approx([f.score for f in before.facts])
    assert all(f.fact.scope == ALICE for f in after.facts)
    bob = PGR(store).retrieve("what should I plan", scope=BOB)
    assert {f.fact.scope for f in bob.facts} == {BOB}


def test_a_write_rebuilds_the_scopes_mean() -> None:
    store, embedder = _store({f"more knee {i}": SPECIFIC for i in range(20)})
    centre = MemoryCentre(store, embedder)
    first = centre.typicality(ALICE, [_fact("knee", "knee operation")])["knee"]
    assert first == pytest.approx(0.584, abs=1e-4)
    assert centre.typicality(ALICE, [_fact("knee", "knee operation")])["knee"] == pytest.approx(first)  # cached
    store.add_facts([Fact(id=f"k{i}", text=f"more knee {i}", scope=ALICE) for i in range(20)])
    # now 21 of 25 facts point the knee's way: it is alice's typical fact
    rebuilt = centre.typicality(ALICE, [_fact("knee", "knee operation")])["knee"]
    assert rebuilt == pytest.approx((4 * 0.48 + 21 * 1.0) / 25, abs=1e-4)  # typical . specific = 0.48
    assert rebuilt > first


class SearchOnly(Store):
    """A store that can search and nothing else: no facts_for, no vectors_for, no embedder."""

    capabilities = Capabilities(scoped=True)

    def __init__(self, inner: InMemoryStore) -> None:
        self.inner = inner

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        return self.inner.search_batch(probes, scope=scope, params=params)


class Listed(SearchOnly):
    """Lists a scope's facts but keeps no vectors to give: the mean is embedded."""

    capabilities = Capabilities(scoped=True, lists=True)

    def __init__(self, inner: InMemoryStore) -> None:
        super().__init__(inner)
        self.embedder = inner.embedder

    def facts_for(self, scope: Scope) -> list[Fact]:
        return self.inner.facts_for(scope)


def test_a_store_that_cannot_give_the_mean_runs_uncentred_and_says_why() -> None:
    store, _ = _store()
    result = PGR(SearchOnly(store)).retrieve("what should I plan", scope=ALICE)
    assert result.trace.centring is None
    assert "facts_for" in (result.trace.centring_off or "")
    assert not result.degraded
    assert result.ids == PGR(store).query_only("what should I plan", scope=ALICE, top_k=20).ids


def test_a_store_without_vectors_is_centred_through_its_embedder() -> None:
    store, _ = _store()
    listed = PGR(Listed(store)).retrieve("what should I plan", scope=ALICE)
    native = PGR(store).retrieve("what should I plan", scope=ALICE)
    assert listed.trace.centring == 1.0
    assert listed.ids == native.ids
    assert [f.score for f in listed.facts] == pytest.approx([f.score for f in native.facts], abs=1e-5)


def test_async_gives_the_same_centred_list() -> None:
    store, _ = _store()
    pgr = PGR(store)
    sync = pgr.retrieve("what should I plan", scope=ALICE)
    got = asyncio.run(pgr.aretrieve("what should I plan", scope=ALICE))
    assert got.ids == sync.ids and got.trace.centring == 1.0


def test_the_floor_reads_the_stores_cosine() -> None:
    # τ = 0.7 keeps only the typical facts (0.8); the knee's 0.6 stays out however it would rank centred
    store, _ = _store()
    pgr = PGR(store, query_top_k=20)
    cfg = pgr.config
    hits = store.search_batch(["what should I plan"], scope=ALICE, params=SearchParams(top_k=20, min_score=0.0))[0]
    typical = pgr.centre.typicality(ALICE, [h.fact for h in hits])  # type: ignore[union-attr]
    kept = centred(hits, typical, cfg.centring or 0.0, 5, 0.7)
    assert {h.fact.id for h in kept} == {"a0", "a1", "a2", "a3"}


@pytest.mark.parametrize("bad", [-0.1, 6, "1", True])
def test_bad_centring_weights_are_refused(bad: object) -> None:
    store, _ = _store()
    with pytest.raises(InvalidArgumentError, match="centring"):
        PGR(store, centring=bad)
    with pytest.raises(InvalidArgumentError, match="centring_depth"):
        PGR(store, centring_depth=0)


def test_a_scope_the_store_lists_nothing_for_makes_nothing_typical() -> None:
    store, embedder = _store()
    centre = MemoryCentre(store, embedder)
    nobody = Scope(user_id="nobody")
    assert centre.typicality(nobody, [_fact("a0", "typical 0", nobody)]) == {"a0": 0.0}
    assert centre.typicality(ALICE, []) == {}
