"""The cost of prospection: one embedding call and one store call per round, the shared embedding
cache (results unchanged, counted per call), store change notifications, and Phase-1 reuse (same
scope and date only, bounded, cleared on change, safe under concurrency)."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import numpy as np
import pytest
from conftest import U1, U2, ScriptedProspector, SpyStore, make_store

from pgr_core import PGR, Fact, HashingEmbedder, InMemoryStore, Scope
from pgr_core.errors import ConfigurationError, InvalidArgumentError
from pgr_core.models.caches import CachedEmbedder, ProspectionCache, counting_embeddings
from pgr_core.observability.trace import Step
from pgr_core.testing import ScriptedLLM

QUERY = "Should I join a soccer league this summer?"
ROUNDS = [["knee physio running", "evening classes weeknights"], ["car bus ride"], ["money rent tight"]]


class CountingEmbedder(HashingEmbedder):
    """A hashing embedder that counts its calls and the texts it embedded (thread-safe)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.texts: list[str] = []
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            self.calls += 1
            self.texts.extend(texts)
        return super().embed(texts)


def counting_store() -> tuple[InMemoryStore, CountingEmbedder]:
    inner = CountingEmbedder()
    store = make_store(inner)
    inner.calls, inner.texts = 0, []  # writing the facts does not count
    return store, inner


def steps_llm() -> ScriptedLLM:
    """Answers each prompt at once: an intent, distinct steps per round, a summary."""
    rounds = iter(ROUNDS * 10)

    def handler(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        props = (schema or {}).get("properties", {})
        if "intent" in props:
            return {"intent": "decide whether to play football in a summer league"}
        if "steps" in props:
            return {"steps": [{"action": t, "dimension": "health"} for t in next(rounds)]}
        return {"summary": "found the knee and the schedule"}

    return ScriptedLLM(handler=handler)


# ------------------------------------------------------------------ batching: one embedding call per round


def test_each_round_makes_one_store_call_and_one_embedding_call() -> None:
    store, inner = counting_store()
    spy = SpyStore(store)
    pgr = PGR(spy, strategy=ScriptedProspector(ROUNDS), delta=0, min_score=0.1)
    result = pgr.retrieve(QUERY, scope=U1)
    rounds = [r for r in result.trace.rounds if r.probes]  # the fourth round had no step left to probe
    assert len(rounds) == 3 and result.trace.stop_reason == "no_new_probes"
    assert len(spy.calls) == 3 and all(r.store_calls == 1 for r in rounds)
    # hygiene embeds each round's new probes in one call; the store's embedding of the same probes
    # (and of the query, every round) is served from the cache they share
    assert inner.calls == 3
    assert sorted(inner.texts) == sorted({QUERY, *(t for r in ROUNDS for t in r)})
    usage = result.trace.usage
    assert (usage.embed_calls, usage.embed_texts) == (3, len(set(inner.texts)))
    assert usage.embed_cache_hits > 0
    assert {p: u.embed_calls for p, u in result.trace.usage_by_phase.items()} == {"initial": 1, "personalized": 2}


def test_without_the_cache_each_round_embeds_twice_and_results_do_not_change() -> None:
    store, inner = counting_store()
    cached = PGR(store, strategy=ScriptedProspector(ROUNDS), delta=0, min_score=0.1).retrieve(QUERY, scope=U1)
    inner.calls, inner.texts = 0, []
    plain = PGR(store, strategy=ScriptedProspector(ROUNDS), delta=0, min_score=0.1, embedding_cache=False)
    result = plain.retrieve(QUERY, scope=U1)
    assert inner.calls == 6  # hygiene's call and the store's call, three rounds
    assert result.trace.usage.embed_calls == 6 and result.trace.usage.embed_cache_hits == 0
    assert result.trace.usage.embed_texts == len(inner.texts) > cached.trace.usage.embed_texts
    assert result.ids == cached.ids and [f.score for f in result.facts] == [f.score for f in cached.facts]


def test_with_an_llm_the_query_is_embedded_once_per_call() -> None:
    store, inner = counting_store()
    llm = steps_llm()
    result = PGR(store, llm=llm, strategy="cot", delta=0, min_score=0.1, max_rounds=2).retrieve(QUERY, scope=U1)
    phases = [r.phase for r in result.trace.rounds]
    assert phases == ["augment", "initial", "personalized", "personalized"]
    # augment: the store embeds the query; every later round: hygiene embeds that round's new steps
    # (and q_A in Phase 1) once, the store reuses them
    assert inner.calls == 4 == result.trace.usage.embed_calls
    assert inner.texts.count(QUERY) == 1
    assert result.trace.usage_by_phase["augment"].embed_calls == 1


def test_a_second_call_reuses_the_vectors_of_its_own_scope_only() -> None:
    store, inner = counting_store()
    first = PGR(store, strategy=ScriptedProspector(ROUNDS), delta=0, min_score=0.1).retrieve(QUERY, scope=U1)
    calls = inner.calls
    again = PGR(store, strategy=ScriptedProspector(ROUNDS), delta=0, min_score=0.1).retrieve(QUERY, scope=U1)
    assert inner.calls == calls and again.trace.usage.embed_calls == 0  # the same scope reuses its vectors
    # another scope asking the same texts is served nothing U1's calls cached: it embeds afresh, and
    # its usage is what it would be had U1 never asked (no hit tells it U1 did)
    other = PGR(store, strategy=ScriptedProspector(ROUNDS), delta=0, min_score=0.1).retrieve(QUERY, scope=U2)
    assert inner.calls == 2 * calls
    assert other.trace.usage.to_dict() | {"store_seconds": 0} == first.trace.usage.to_dict() | {"store_seconds": 0}
    assert all(f.fact.scope == U2 for f in other.facts)


def test_concurrent_calls_each_count_their_own_embeddings() -> None:
    store, inner = counting_store()
    scopes = [Scope(user_id="u1", run_id=f"r{i}") for i in range(12)]
    for i, scope in enumerate(scopes):
        store.add(f"run {i} note about tango lessons number {i}", scope=scope)
    inner.calls, inner.texts = 0, []

    def prospector(i: int) -> ScriptedProspector:
        return ScriptedProspector([[f"tango lessons number {i}", f"dance shoes size {i}"], [f"studio {i} rent"]])

    async def run_all() -> list[Any]:
        pgrs = [PGR(store, strategy=prospector(i), delta=0, min_score=0.05) for i in range(len(scopes))]
        return await asyncio.gather(
            *(p.aretrieve(f"tango question {i}", scope=s) for i, (p, s) in enumerate(zip(pgrs, scopes, strict=True)))
        )

    results = asyncio.run(run_all())
    with ThreadPoolExecutor(6) as pool:
        results += list(
            pool.map(
                lambda i: PGR(store, strategy=prospector(i), delta=0, min_score=0.05).retrieve(
                    f"tango question {i} again", scope=scopes[i]
                ),
                range(len(scopes)),
            )
        )
    # every embedding reached the model on behalf of exactly one call, and was billed to it
    assert sum(r.trace.usage.embed_calls for r in results) == inner.calls
    assert sum(r.trace.usage.embed_texts for r in results) == len(inner.texts)
    for r in results:
        assert r.trace.usage.embed_calls == sum(u.embed_calls for u in r.trace.usage_by_phase.values())


# ------------------------------------------------------------------ the cache itself


def test_cached_embedder_returns_the_inner_vectors_and_stays_bounded() -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner, max_entries=3)
    texts = ["alpha", "beta", "gamma", "alpha", "delta"]
    assert np.array_equal(cached.embed(texts), HashingEmbedder().embed(texts))
    assert inner.calls == 1 and inner.texts == ["alpha", "beta", "gamma", "delta"]  # a repeat is embedded once
    assert len(cached) == 3  # alpha, the oldest, was pushed out
    cached.embed(["delta", "gamma"])
    assert inner.calls == 1
    cached.embed(["alpha"])
    assert inner.calls == 2 and (cached.hits, cached.misses) == (2, 5)
    assert cached.embed([]).shape == (0, inner.dim)
    assert CachedEmbedder.wrap(cached) is cached and CachedEmbedder.wrap(inner) is not cached
    with pytest.raises(InvalidArgumentError, match="max_entries"):
        CachedEmbedder(inner, max_entries=-1)


def test_a_call_can_switch_the_cache_off_and_counts_what_it_used() -> None:
    inner = CountingEmbedder()
    cached = CachedEmbedder(inner)
    cached.embed(["alpha"])
    with counting_embeddings(use_cache=False) as off:
        cached.embed(["alpha", "beta"])
    with counting_embeddings() as on:
        cached.embed(["alpha", "beta", "alpha"])
    assert (off.calls, off.texts, off.hits) == (1, 2, 0)
    assert (on.calls, on.texts, on.hits) == (1, 1, 2)  # beta was not cached while the cache was off
    assert inner.texts == ["alpha", "alpha", "beta", "beta"]


def test_minilm_has_one_cache_layer_and_the_store_shares_it() -> None:
    from pgr_core import MiniLMEmbedder

    minilm = MiniLMEmbedder(cache_size=10)  # the model itself is only loaded on the first embed
    assert isinstance(minilm, CachedEmbedder) and minilm.max_entries == 10
    store = InMemoryStore(embedder=minilm)
    assert store.embedder is minilm and PGR(store, strategy="feedback").embedder is minilm
    assert InMemoryStore(embedder=HashingEmbedder(), embedding_cache=0).embedder.__class__ is HashingEmbedder
    given = HashingEmbedder()
    store = InMemoryStore(embedder=given)
    assert PGR(store, strategy="feedback", embedder=given).embedder is store.embedder  # shared, not a second cache


def test_writing_facts_does_not_fill_the_probe_cache() -> None:
    store = InMemoryStore(embedder=HashingEmbedder())
    store.add_facts([Fact(id=str(i), text=f"fact {i}", scope=U1) for i in range(50)])
    assert isinstance(store.embedder, CachedEmbedder) and len(store.embedder) == 0


# ------------------------------------------------------------------ store change notifications


def test_the_store_tells_listeners_which_scopes_changed() -> None:
    store = make_store()
    heard: list[frozenset[Scope]] = []
    store.add_listener(heard.append)
    store.add("new fact", scope=U2, id="x")
    store.add("new wording", scope=U2, id="x")  # the owner replacing its own fact
    with pytest.raises(InvalidArgumentError, match="another owner"):
        store.add("re-owned fact", scope=U1, id="x")  # ids are unique per owner: refused, nothing said
    store.delete(["s1:0", "nope"], scope=U1)
    store.delete(["nope"], scope=U1)  # nothing removed, nothing said
    assert heard == [frozenset({U2}), frozenset({U2}), frozenset({U1})]
    store.remove_listener(heard.append)
    store.add("unheard", scope=U1)
    assert len(heard) == 3


def test_listeners_that_fail_or_die_never_break_a_write(caplog: pytest.LogCaptureFixture) -> None:
    store = make_store()

    def broken(scopes: frozenset[Scope]) -> None:
        raise RuntimeError("listener bug")

    class Owner:
        def __init__(self) -> None:
            self.heard = 0

        def hear(self, scopes: frozenset[Scope]) -> None:
            self.heard += 1

    owner = Owner()
    store.add_listener(broken)
    store.add_listener(owner.hear)  # a bound method is held weakly
    with caplog.at_level(logging.WARNING, logger="pgr"):
        store.add("one", scope=U1)
    assert owner.heard == 1  # the listener after the broken one still heard
    (record,) = [r for r in caplog.records if r.name == "pgr"]
    message = record.getMessage()
    assert "change listener of InMemoryStore raised" in message and "broken" in message
    assert message.rstrip().endswith("RuntimeError: listener bug")  # with its traceback
    del owner  # the logged traceback must not keep it alive
    gc.collect()
    store.add("two", scope=U1)
    assert len(store.__dict__["_pgr_listeners"]) == 1  # the dead one was dropped, the broken one kept
    assert store.get(store.add("three", scope=U1), scope=U1) is not None


# ------------------------------------------------------------------ the Phase-1 reuse cache, alone


def _steps() -> list[Step]:
    root = Step(id="r1.1", text="check the knee", children=["r1.2"])
    return [root, Step(id="r1.2", text="ask the physio", parent="r1.1")]


def test_reuse_cache_matches_by_cosine_within_one_scope_and_date() -> None:
    emb = HashingEmbedder()
    cache = ProspectionCache(threshold=0.95)
    a, b, c = emb.embed([QUERY, QUERY.lower().rstrip("?"), "What did I eat for dinner?"])
    version = cache.begin(U1)
    assert cache.put(U1, "2025-05-01", QUERY, a, "intent A", _steps(), version=version)
    hit = cache.lookup(U1, "2025-05-01", b)
    assert hit is not None and (hit.query, hit.intent) == (QUERY, "intent A") and hit.similarity >= 0.95
    assert [s.text for s in hit.steps] == ["check the knee", "ask the physio"] and hit.steps[1].parent == "r1.1"
    assert cache.lookup(U1, "2025-05-01", c) is None  # not near-identical
    assert cache.lookup(U2, "2025-05-01", a) is None  # another tenant never sees it
    assert cache.lookup(Scope(user_id="u1", run_id="r1"), "2025-05-01", a) is None  # nor a narrower scope
    assert cache.lookup(U1, "2025-06-01", a) is None  # another day: the steps may name dates


def test_reuse_cache_is_bounded_in_size_scopes_and_time() -> None:
    now = [0.0]
    cache = ProspectionCache(max_entries=2, max_scopes=2, ttl_s=60, clock=lambda: now[0])
    emb = HashingEmbedder()
    vecs = emb.embed(["one query", "two query", "three query"])
    for text, vec in zip(["one query", "two query", "three query"], vecs, strict=True):
        cache.put(U1, None, text, vec, text, _steps(), version=cache.begin(U1))
    assert cache.lookup(U1, None, vecs[0]) is None and cache.lookup(U1, None, vecs[2]) is not None
    now[0] = 61.0
    assert cache.lookup(U1, None, vecs[2]) is None and len(cache) == 0  # both expired, dropped on sight
    for user in ("a", "b", "c"):
        scope = Scope(user_id=user)
        cache.put(scope, None, "q", vecs[0], "i", _steps(), version=cache.begin(scope))
    assert cache.stats()["scopes"] == 2 and cache.lookup(Scope(user_id="a"), None, vecs[0]) is None
    with pytest.raises(InvalidArgumentError, match="threshold"):
        ProspectionCache(threshold=1.5)
    with pytest.raises(InvalidArgumentError, match="ttl_s"):
        ProspectionCache(ttl_s=0)


def test_a_change_clears_every_scope_that_can_see_it_and_refuses_stale_puts() -> None:
    cache = ProspectionCache()
    vec = HashingEmbedder().embed([QUERY])[0]
    narrow = Scope(user_id="u1", run_id="r1")
    for scope in (U1, narrow, U2):
        cache.put(scope, None, QUERY, vec, "i", _steps(), version=cache.begin(scope))
    started = cache.begin(U1)  # a prospection for u1 begins...
    assert cache.invalidate([Scope(user_id="u1", run_id="r2")]) == 1  # ...a fact of u1's run r2 changes
    assert cache.lookup(U1, None, vec) is None  # u1 sees run r2's facts: cleared
    assert cache.lookup(narrow, None, vec) is not None and cache.lookup(U2, None, vec) is not None
    assert not cache.put(U1, None, QUERY, vec, "stale", _steps(), version=started)  # began before the change
    assert cache.put(U1, None, QUERY, vec, "fresh", _steps(), version=cache.begin(U1))
    cache.clear()
    assert len(cache) == 0


def test_a_change_the_cache_cannot_match_drops_all_of_it_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    cache = ProspectionCache()
    vec = HashingEmbedder().embed([QUERY])[0]
    for scope in (U1, U2):
        cache.put(scope, None, QUERY, vec, "i", _steps(), version=cache.begin(scope))
    started = cache.begin(U2)
    store = make_store()
    store.add_listener(cache.invalidate)
    with caplog.at_level(logging.WARNING, logger="pgr"):
        store._notify(["u1"])  # an adapter that reports owners as bare ids: no cached scope can be matched
    assert len(cache) == 0  # both scopes dropped, not kept stale
    assert not cache.put(U2, None, QUERY, vec, "stale", _steps(), version=started)
    (record,) = [r for r in caplog.records if r.name == "pgr"]
    assert "reuse cache could not match a store change to its scopes (frozenset({'u1'}))" in record.getMessage()
    assert "AttributeError" in record.getMessage()


# ------------------------------------------------------------------ Phase-1 reuse in PGR


def reuse_pgr(store: Any, llm: ScriptedLLM, **options: Any) -> PGR:
    return PGR(store, llm=llm, strategy="cot", delta=100, min_score=0.1, phase1_reuse=True, **options)


def phases(llm: ScriptedLLM, start: int = 0) -> list[str]:
    out = []
    for call in llm.calls[start:]:
        props = (call.schema or {}).get("properties", {})
        out.append("augment" if "intent" in props else "steps" if "steps" in props else "summary")
    return out


def test_a_near_identical_query_reuses_phase1_and_probes_afresh() -> None:
    store = make_store()
    llm = steps_llm()
    pgr = reuse_pgr(store, llm)
    first = pgr.retrieve(QUERY, scope=U1, date="2025-05-01")
    assert phases(llm) == ["augment", "steps", "summary"] and first.trace.reused_phase1_from is None
    n = len(llm.calls)
    again = pgr.retrieve("should i join a soccer league this summer", scope=U1, date="2025-05-01")
    assert phases(llm, n) == ["summary"]  # no augmentation, no Phase-1 call
    assert again.trace.reused_phase1_from == QUERY and again.trace.reused_similarity >= 0.95
    assert again.trace.intent == first.trace.intent
    assert [s.text for s in again.trace.rounds[0].steps] == [s.text for s in first.trace.rounds[1].steps]
    assert [r.phase for r in again.trace.rounds] == ["initial"] and again.trace.rounds[0].store_calls == 1
    assert again.ids == first.ids and again.trace.usage.llm_calls == first.trace.usage.llm_calls - 2


def test_reuse_never_crosses_scopes_dates_or_a_change_in_the_scope() -> None:
    store = make_store()
    llm = steps_llm()
    pgr = reuse_pgr(store, llm)
    pgr.retrieve(QUERY, scope=U1, date="2025-05-01")
    assert pgr.retrieve(QUERY, scope=U2, date="2025-05-01").trace.reused_phase1_from is None
    assert pgr.retrieve(QUERY, scope=U1, date="2025-06-01").trace.reused_phase1_from is None
    assert pgr.retrieve("What did I sell last year?", scope=U1, date="2025-05-01").trace.reused_phase1_from is None
    assert pgr.retrieve(QUERY, scope=U1, date="2025-05-01").trace.reused_phase1_from == QUERY
    store.add("I joined a running club", scope=U2)  # another tenant's change leaves u1's entries alone
    assert pgr.retrieve(QUERY, scope=U1, date="2025-05-01").trace.reused_phase1_from == QUERY
    new_id = store.add("I signed up for a summer soccer league", scope=U1, date="2025-04-01")
    fresh = pgr.retrieve(QUERY, scope=U1, date="2025-05-01")
    assert fresh.trace.reused_phase1_from is None and new_id in fresh.ids
    assert pgr.retrieve(QUERY, scope=U1, date="2025-05-01").trace.reused_phase1_from == QUERY
    store.delete([new_id], scope=U1)
    assert pgr.retrieve(QUERY, scope=U1, date="2025-05-01").trace.reused_phase1_from is None


def test_a_listener_that_raises_beside_the_reuse_cache_does_not_keep_it_stale(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = make_store()
    llm = steps_llm()

    def broken(scopes: frozenset[Scope]) -> None:
        raise RuntimeError("listener bug")

    store.add_listener(broken)  # registered before PGR's own: it raises first on every write
    pgr = reuse_pgr(store, llm)
    pgr.retrieve(QUERY, scope=U1)
    assert pgr.phase1_cache is not None and len(pgr.phase1_cache) == 1
    with caplog.at_level(logging.WARNING, logger="pgr"):
        store.add("I joined a walking club", scope=U1)
    assert len(pgr.phase1_cache) == 0  # the write still cleared u1's entry
    (record,) = [r for r in caplog.records if r.name == "pgr"]
    assert record.getMessage().startswith(f"a change listener of InMemoryStore raised after a write: {broken!r}")
    assert pgr.retrieve(QUERY + " ", scope=U1).trace.reused_phase1_from is None  # asked afresh


def test_a_store_without_notifications_is_bounded_by_the_ttl() -> None:
    store = make_store()
    spy = SpyStore(store)  # writes go to the inner store; the spy never notifies
    llm = steps_llm()
    pgr = reuse_pgr(spy, llm, phase1_reuse_ttl_s=30)
    now = [0.0]
    assert pgr.phase1_cache is not None
    pgr.phase1_cache._clock = lambda: now[0]
    pgr.retrieve(QUERY, scope=U1)
    now[0] = 29.0
    assert pgr.retrieve(QUERY, scope=U1).trace.reused_phase1_from == QUERY
    now[0] = 31.0
    assert pgr.retrieve(QUERY, scope=U1).trace.reused_phase1_from is None


def test_failed_or_capped_phase1_is_not_kept_and_reuse_is_off_by_default() -> None:
    store = make_store()
    llm = ScriptedLLM(["not json", "still not json"], handler=steps_llm().handler)
    pgr = reuse_pgr(store, llm)
    assert pgr.retrieve(QUERY, scope=U1).degraded
    assert pgr.retrieve(QUERY, scope=U1).trace.reused_phase1_from is None  # nothing was kept
    capped = reuse_pgr(make_store(), steps_llm())
    assert capped.retrieve(QUERY, scope=U1, budget={"max_llm_calls": 1}).trace.budget_hit == "budget_llm_calls"
    assert capped.retrieve(QUERY, scope=U1).trace.reused_phase1_from is None
    assert PGR(store, llm=steps_llm(), strategy="cot").phase1_cache is None

    blind = SpyStore(store)
    blind.embedder = None
    with pytest.raises(ConfigurationError, match="embedder"):
        PGR(blind, strategy="feedback", phase1_reuse=True)


def test_reuse_under_concurrency_keeps_each_scope_to_itself() -> None:
    store = InMemoryStore(embedder=HashingEmbedder())
    users = [Scope(user_id=f"user{i}") for i in range(16)]
    for i, scope in enumerate(users):
        store.add(f"soccer league memory of member{i} marker{i}", scope=scope, date="2025-03-01")

    def handler(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        prompt = messages[-1]["content"]
        props = (schema or {}).get("properties", {})
        if "intent" in props:  # the intent carries the marker of the records it saw: personal context
            markers = sorted({w for w in prompt.replace('"', " ").split() if w.startswith("marker")})
            return {"intent": "join a soccer league, given " + " ".join(markers)}
        if "steps" in props:
            return {"steps": [{"action": "weekend soccer schedule"}, {"action": "league fees"}]}
        return {"summary": "s"}

    llm = ScriptedLLM(handler=handler)
    pgr = PGR(store, llm=llm, strategy="cot", phase1_reuse=True, augment_min_score=0.0, delta=100)
    query = "Should I join the soccer league?"

    async def wave() -> list[Any]:
        return await asyncio.gather(*(pgr.aretrieve(query, scope=s, date="2025-05-01") for s in users))

    first = asyncio.run(wave())
    with ThreadPoolExecutor(8) as pool:
        second = list(pool.map(lambda s: pgr.retrieve(query, scope=s, date="2025-05-01"), users))
    for i, (a, b) in enumerate(zip(first, second, strict=True)):
        assert a.trace.intent == f"join a soccer league, given marker{i}"
        assert b.trace.reused_phase1_from == query and b.trace.intent == a.trace.intent
        assert all(f.fact.scope == users[i] for f in b.facts)
    assert pgr.phase1_cache is not None and len(pgr.phase1_cache) == len(users)


def test_dropping_a_pgr_drops_its_listener() -> None:
    store = make_store()
    pgr = reuse_pgr(store, steps_llm())
    assert len(store.__dict__["_pgr_listeners"]) == 2  # the Phase-1 reuse cache and the centring means
    del pgr
    gc.collect()
    store.add("after", scope=U1, date=datetime(2025, 3, 1))
    assert store.__dict__["_pgr_listeners"] == []


def test_a_store_embedder_without_name_or_dim_still_serves_hygiene() -> None:
    class Bare:
        def embed(self, texts: Sequence[str]) -> np.ndarray:
            return HashingEmbedder().embed(texts)

    spy = SpyStore(make_store())
    spy.embedder = Bare()  # type: ignore[assignment]
    pgr = PGR(spy, strategy=ScriptedProspector([["knee physio", "knee physio!"]]), delta=100, min_score=0.1)
    result = pgr.retrieve(QUERY, scope=U1)
    assert [d.reason for d in result.trace.rounds[0].dropped] == ["duplicate"]
    # hygiene's call went through a cache of pgr's own, the inner store's through the store's
    assert result.trace.usage.embed_calls == 2 and not result.degraded
