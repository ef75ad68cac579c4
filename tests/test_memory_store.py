"""The embedded default store: K, τ, scope, window, files, bad input."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from conftest import U1, U2, make_store

from pgr_core import (
    ConfigurationError,
    Fact,
    HashingEmbedder,
    InMemoryStore,
    InvalidArgumentError,
    Scope,
    ScopeError,
    SearchParams,
)


def test_k_and_floor_are_honoured(store: InMemoryStore) -> None:
    loose = store.search_batch(["knee physio running"], scope=U1, params=SearchParams(top_k=3, min_score=0.0))[0]
    assert len(loose) == 3 and [h.rank for h in loose] == [0, 1, 2]
    assert [h.score for h in loose] == sorted((h.score for h in loose), reverse=True)
    strict = store.search_batch(["knee physio running"], scope=U1, params=SearchParams(top_k=3, min_score=0.4))[0]
    assert [h.fact.id for h in strict] == ["s1:1"] and strict[0].score >= 0.4


def test_one_list_per_probe_in_probe_order(store: InMemoryStore) -> None:
    probes = ["car bus", "money rent", "no overlap zzz qqq"]
    hits = store.search_batch(probes, scope=U1, params=SearchParams(top_k=1, min_score=0.3))
    assert [h[0].fact.id if h else None for h in hits] == ["s1:3", "s2:0", None]


def test_scopes_never_mix(store: InMemoryStore) -> None:
    for scope, prefix in ((U1, "s"), (U2, "other:")):
        hits = store.search_batch(["knee", "football"], scope=scope, params=SearchParams(top_k=8, min_score=0.0))
        assert all(h.fact.id.startswith(prefix) and h.fact.scope == scope for lst in hits for h in lst)
    nobody = store.search_batch(["knee"], scope=Scope(user_id="u3"), params=SearchParams())
    assert nobody == [[]]


def test_agent_and_run_scopes_narrow_the_search() -> None:
    store = InMemoryStore(embedder=HashingEmbedder())
    store.add("likes tea", scope=Scope(user_id="u", agent_id="a1"), id="a1")
    store.add("likes tea too", scope=Scope(user_id="u", agent_id="a2", run_id="r"), id="a2")
    params = SearchParams(top_k=5, min_score=0.0)
    assert {h.fact.id for h in store.search_batch(["tea"], scope=Scope(user_id="u"), params=params)[0]} == {"a1", "a2"}
    assert [h.fact.id for h in store.search_batch(["tea"], scope=Scope(agent_id="a1"), params=params)[0]] == ["a1"]
    assert [h.fact.id for h in store.search_batch(["tea"], scope=Scope(run_id="r"), params=params)[0]] == ["a2"]


def test_window_brings_same_session_neighbours_only(store: InMemoryStore) -> None:
    hits = store.search_batch(["car bus"], scope=U1, params=SearchParams(top_k=1, min_score=0.3, window=1))[0]
    # s1:3 is the last turn of s1: only s1:2 before it; s2:0 is another session
    assert [(h.fact.id, h.neighbour_of) for h in hits] == [("s1:3", None), ("s1:2", "s1:3")]
    wide = store.search_batch(["car bus"], scope=U1, params=SearchParams(top_k=1, min_score=0.3, window=2))[0]
    assert [h.fact.id for h in wide] == ["s1:3", "s1:2", "s1:1"]


def test_ids_are_stable_and_updates_replace(store: InMemoryStore) -> None:
    first = store.search_batch(["knee"], scope=U1, params=SearchParams(top_k=2, min_score=0.0))[0]
    again = store.search_batch(["knee"], scope=U1, params=SearchParams(top_k=2, min_score=0.0))[0]
    assert [h.fact.id for h in first] == [h.fact.id for h in again]
    n = len(store)
    store.add("I hurt my ankle, not my knee", scope=U1, id="s1:0", session_id="s1", position=0)
    assert len(store) == n and store.get("s1:0", scope=U1).text.startswith("I hurt my ankle")  # type: ignore[union-attr]


def test_save_and_load_round_trip(store: InMemoryStore, tmp_path: Path) -> None:
    path = store.save(tmp_path / "m.pgr")
    loaded = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert len(loaded) == len(store)
    assert loaded.get("s1:2", scope=U1) == store.get("s1:2", scope=U1) is not None
    params = SearchParams(top_k=3, min_score=0.0, window=1)
    a = store.search_batch(["knee", "bus"], scope=U1, params=params)
    b = loaded.search_batch(["knee", "bus"], scope=U1, params=params)
    assert [[(h.fact.id, round(h.score, 5)) for h in lst] for lst in a] == [
        [(h.fact.id, round(h.score, 5)) for h in lst] for lst in b
    ]


def test_loading_with_another_embedder_or_a_bad_file_is_refused(store: InMemoryStore, tmp_path: Path) -> None:
    path = store.save(tmp_path / "m.pgr")
    with pytest.raises(ConfigurationError, match="embedded with hashing-256"):
        InMemoryStore.load(path, embedder=HashingEmbedder(dim=64))
    (tmp_path / "junk.pgr").write_text("not a zip")
    with pytest.raises(ConfigurationError, match="not a pgr store file"):
        InMemoryStore.load(tmp_path / "junk.pgr", embedder=HashingEmbedder())
    with pytest.raises(ConfigurationError, match="no store file"):
        InMemoryStore.load(tmp_path / "missing.pgr", embedder=HashingEmbedder())


def test_bad_facts_are_refused_and_nothing_is_stored(store: InMemoryStore) -> None:
    n = len(store)
    with pytest.raises(InvalidArgumentError, match="text must be a non-empty string"):
        store.add_facts([Fact(id="a", text="fine", scope=U1), Fact(id="b", text="  ", scope=U1)])
    with pytest.raises(InvalidArgumentError, match="both session_id and position"):
        store.add("x", scope=U1, session_id="s9")
    with pytest.raises(InvalidArgumentError, match="shape"):
        store.add_facts([Fact(id="c", text="c", scope=U1)], vectors=np.zeros((1, 3), np.float32))
    assert len(store) == n and store.get("a", scope=U1) is None


def test_delete_removes_and_keeps_the_rest_searchable(store: InMemoryStore) -> None:
    assert store.delete(["s1:3", "missing"], scope=U1) == 1
    hits = store.search_batch(["car bus"], scope=U1, params=SearchParams(top_k=8, min_score=0.0, window=1))[0]
    assert "s1:3" not in {h.fact.id for h in hits}
    assert store.get("s1:2", scope=U1) is not None


def test_unicode_and_very_long_probes(store: InMemoryStore) -> None:
    store.add("Ich habe mein Knie verletzt — 膝を痛めた 🦵", scope=U1, id="u")
    hits = store.search_batch(["膝を痛めた 🦵", "knee " * 5000], scope=U1, params=SearchParams(top_k=1, min_score=0.0))
    assert hits[0][0].fact.id == "u" and len(hits[1]) == 1


def test_empty_store_and_bad_probes() -> None:
    empty = InMemoryStore(embedder=HashingEmbedder())
    assert empty.search_batch(["anything"], scope=U1, params=SearchParams()) == [[]]
    with pytest.raises(InvalidArgumentError, match="not one string"):
        empty.search_batch("knee", scope=U1, params=SearchParams())
    with pytest.raises(InvalidArgumentError, match="non-empty string"):
        empty.search_batch(["ok", ""], scope=U1, params=SearchParams())


def test_async_search_gives_what_sync_gives(store: InMemoryStore) -> None:
    params = SearchParams(top_k=3, min_score=0.0)
    sync = store.search_batch(["knee", "bus"], scope=U1, params=params)
    async_ = asyncio.run(store.asearch_batch(["knee", "bus"], scope=U1, params=params))
    assert [[h.fact.id for h in lst] for lst in sync] == [[h.fact.id for h in lst] for lst in async_]


def test_hashing_embedder_is_deterministic_and_unit_length() -> None:
    a = HashingEmbedder().embed(["same text", "other"])
    b = HashingEmbedder().embed(["same text", "other"])
    assert np.array_equal(a, b) and np.allclose(np.linalg.norm(a, axis=1), 1.0)


def test_make_store_holds_both_users() -> None:
    store = make_store()
    assert len(store) == 16 and sum(f.scope == U2 for f in store.facts) == 8


def test_stored_dates_are_read_leniently() -> None:
    from datetime import UTC, date, datetime

    from pgr_core._dates import read_date

    assert read_date("2025-03-01T10:00:00Z") == datetime(2025, 3, 1, 10, tzinfo=UTC)
    assert read_date(date(2025, 3, 1)) == datetime(2025, 3, 1)
    assert read_date(0) == datetime(1970, 1, 1, tzinfo=UTC)
    assert [read_date(v) for v in (None, "", "last Tuesday", True, 1e30)] == [None] * 5


# ---------------------------------------------------------------- owners, blocks and snapshots


def test_scope_keyword_limits_get_delete_and_vectors_for(store: InMemoryStore) -> None:
    assert store.get("s1:0", scope=U1) is not None and store.get("s1:0", scope=U2) is None
    assert store.get("s1:0", scope={"user_id": "u1"}) == store.get("s1:0", scope=U1)
    assert store.vectors_for(["s1:0", "s1:1"], scope=U1).shape == (2, 256)
    with pytest.raises(KeyError, match="'s1:0' in this store for this scope"):
        store.vectors_for(["other:0", "s1:0"], scope=U2)
    assert store.delete(["s1:0", "other:0"], scope=U2) == 1  # only U2's fact goes
    assert store.get("s1:0", scope=U1) is not None and store.get("other:0", scope=U2) is None
    assert {f.id for f in store.facts_for(U2)} == {f"other:{i}" for i in range(1, 8)}
    assert [f.id for f in store.facts_for(U1)] == [f.id for f in store.facts if f.scope == U1]


def test_get_delete_and_vectors_for_require_a_scope(store: InMemoryStore) -> None:
    n = len(store)
    for call in (
        lambda: store.get("s1:0"),  # type: ignore[call-arg]
        lambda: store.delete(["s1:0"]),  # type: ignore[call-arg]
        lambda: store.vectors_for(["s1:0"]),  # type: ignore[call-arg]
    ):
        with pytest.raises(TypeError):
            call()
    for call in (
        lambda: store.get("s1:0", scope=None),  # type: ignore[arg-type]
        lambda: store.delete(["s1:0"], scope=None),  # type: ignore[arg-type]
        lambda: store.vectors_for(["s1:0"], scope=None),  # type: ignore[arg-type]
    ):
        with pytest.raises(ScopeError):
            call()
    assert len(store) == n and store.get("s1:0", scope=U1) is not None


def test_facts_for_a_wide_scope_gathers_every_owner_it_allows() -> None:
    store = InMemoryStore(embedder=HashingEmbedder())
    store.add("tea", scope=Scope(user_id="u", agent_id="a1"), id="1")
    store.add("coffee", scope=Scope(user_id="u", agent_id="a2", run_id="r"), id="2")
    store.add("juice", scope=Scope(user_id="v", agent_id="a1"), id="3")
    assert [f.id for f in store.facts_for(Scope(user_id="u"))] == ["1", "2"]
    assert [f.id for f in store.facts_for(Scope(agent_id="a1"))] == ["1", "3"]
    assert [f.id for f in store.facts_for(Scope(user_id="u", run_id="r"))] == ["2"]
    assert store.facts_for(Scope(user_id="nobody")) == []


def test_one_at_a_time_appends_keep_every_fact_and_vector() -> None:
    store = InMemoryStore(embedder=HashingEmbedder())
    texts = [f"note {i} about topic {i % 7}" for i in range(300)]
    for i, text in enumerate(texts):  # past several capacity doublings
        store.add(text, scope=U1 if i % 3 else U2, id=f"n{i}", session_id="s", position=i)
    assert len(store) == 300
    for owner in (U1, U2):  # each owner's rows, read with its own scope
        mine = [i for i in range(300) if (U1 if i % 3 else U2) == owner]
        rows = store.vectors_for([f"n{i}" for i in mine], scope=owner)
        assert np.allclose(rows, HashingEmbedder().embed([texts[i] for i in mine]))
    hits = store.search_batch(["note 151 about topic 4"], scope=U1, params=SearchParams(top_k=1, window=3))[0]
    # neighbours are the same owner's turns only: n150 and n153 (U2's) are left out
    assert hits[0].fact.id == "n151" and {h.fact.id for h in hits[1:]} == {"n148", "n149", "n152", "n154"}


def test_a_snapshot_is_untouched_by_later_appends_replacements_and_deletions() -> None:
    store = make_store()
    view = store._blocks[U1].view()
    rows = view.vectors[: view.n].copy()
    facts = list(view.facts[: view.n])
    for i in range(40):  # growth
        store.add(f"more {i}", scope=U1, id=f"m{i}")
    store.add("replaced text", scope=U1, id="s1:1", session_id="s1", position=1)  # replacement
    store.delete(["s1:2"], scope=U1)
    assert np.array_equal(view.vectors[: view.n], rows) and view.facts[: view.n] == facts
    assert store.get("s1:1", scope=U1).text == "replaced text"  # type: ignore[union-attr]


def test_emptying_an_owner_removes_it_and_its_id_may_be_taken() -> None:
    store = make_store()
    assert store.delete([f"other:{i}" for i in range(8)], scope=U1) == 0  # not U1's
    assert store.delete([f"other:{i}" for i in range(8)], scope=U2) == 8
    assert store.search_batch(["knee"], scope=U2, params=SearchParams(min_score=0.0)) == [[]]
    assert U2 not in store._blocks and len(store) == 8
    store.add("now U1's", scope=U1, id="other:0")  # no other owner holds it any more
    assert store.get("other:0", scope=U1) is not None


def _brute_force(store: InMemoryStore, probe: str, scope: Scope, k: int) -> list[tuple[str, float]]:
    facts = [f for f in store.facts if scope.allows(f.scope)]
    if not facts:
        return []
    scores = store.vectors_for([f.id for f in facts], scope=scope) @ store.embedder.embed([probe])[0]
    order = np.argsort(-scores, kind="stable")[:k]
    return [(facts[i].id, round(float(scores[i]), 5)) for i in order]


def test_search_ranks_as_a_brute_force_scan_over_the_facts_its_scope_allows() -> None:
    rng = np.random.default_rng(3)
    words = "knee bus car money football physio rent classes coffee tea run swim".split()
    owners = [
        Scope(user_id=u, agent_id=a, run_id=r)
        for u in ("u1", "u2", "u3")
        for a in (None, "a1", "a2")
        for r in (None, "r1")
    ]
    store = InMemoryStore(embedder=HashingEmbedder())
    owner_of: dict[str, Scope] = {}
    for i in range(400):
        text = " ".join(rng.choice(words, size=4)) + f" item{i}"
        owner_of[f"f{i}"] = owners[int(rng.integers(len(owners)))]
        store.add(text, scope=owner_of[f"f{i}"], id=f"f{i}")
    doomed = [f"f{i}" for i in range(0, 400, 9)]
    for owner in owners:  # each owner deletes its own
        store.delete([i for i in doomed if owner_of[i] == owner], scope=owner)
    assert not any(store.get(i, scope=owner_of[i]) for i in doomed)
    for i in range(1, 400, 13):  # replacements by the same owner
        old = store.get(f"f{i}", scope=owner_of[f"f{i}"])
        if old is not None:
            store.add(old.text + " again", scope=old.scope, id=old.id)
    queries = [
        Scope(user_id="u1"),
        Scope(agent_id="a1"),
        Scope(run_id="r1"),
        Scope(user_id="u2", agent_id="a2"),
        Scope(user_id="u3", agent_id="a1", run_id="r1"),
        Scope(user_id="zz"),
    ]
    params = SearchParams(top_k=12, min_score=0.0)  # the hashing embedder's scores are never negative
    for scope in queries:
        for probe in ("knee bus", "coffee tea swim", "rent"):
            got = [(h.fact.id, round(h.score, 5)) for h in store.search_batch([probe], scope=scope, params=params)[0]]
            want = _brute_force(store, probe, scope, 12)
            every = dict(_brute_force(store, probe, scope, len(store)))
            assert [s for _, s in got] == [s for _, s in want]  # the same top scores (ties may swap ids)
            assert all(every.get(i) == s for i, s in got) and len({i for i, _ in got}) == len(got)


def test_searches_during_writes_see_whole_facts_only() -> None:
    import threading

    embedder = HashingEmbedder()
    store = InMemoryStore(embedder=embedder, embedding_cache=0)
    store.add_facts([Fact(id=f"f{i}", text=f"fact {i} knee bus", scope=U1) for i in range(50)])
    stop, problems = threading.Event(), []

    def write() -> None:
        for k in range(300):
            store.add(f"fresh {k} knee", scope=U1, id=f"n{k}")
            store.add(f"rewritten {k} bus knee", scope=U1, id=f"f{k % 50}")  # replaces a published row
            if k % 10 == 9:
                store.delete([f"n{k - 5}"], scope=U1)
        stop.set()

    def search() -> None:
        probe = embedder.embed(["knee bus"])[0]
        while not stop.is_set():
            for hit in store.search_batch(["knee bus"], scope=U1, params=SearchParams(top_k=20, min_score=0.0))[0]:
                expected = float(embedder.embed([hit.fact.text])[0] @ probe)  # the score of *this* fact's text
                if abs(expected - hit.score) > 1e-5 or hit.fact.scope != U1:
                    problems.append((hit.fact.id, hit.fact.text, hit.score, expected))

    threads = [threading.Thread(target=write)] + [threading.Thread(target=search) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []
    assert len(store) == 50 + 300 - 30


def test_text_with_unicode_line_separators_survives_save_and_load(tmp_path: Path) -> None:
    store = InMemoryStore(embedder=HashingEmbedder())
    store.add("first line\u2028second\x85third\u2029fourth", scope=U1, id="sep", metadata={"k": "a\u2028b"})
    loaded = InMemoryStore.load(store.save(tmp_path / "sep.pgr"), embedder=HashingEmbedder())
    assert loaded.get("sep", scope=U1) == store.get("sep", scope=U1) is not None


def test_saving_onto_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="is a directory"):
        make_store().save(tmp_path)


def test_an_empty_store_saves_and_loads(tmp_path: Path) -> None:
    loaded = InMemoryStore.load(
        InMemoryStore(embedder=HashingEmbedder()).save(tmp_path / "e.pgr"), embedder=HashingEmbedder()
    )
    assert len(loaded) == 0 and loaded.facts == []
