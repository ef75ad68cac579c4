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
    assert len(store) == n and store.get("s1:0").text.startswith("I hurt my ankle")  # type: ignore[union-attr]


def test_save_and_load_round_trip(store: InMemoryStore, tmp_path: Path) -> None:
    path = store.save(tmp_path / "m.pgr")
    loaded = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert len(loaded) == len(store)
    assert loaded.get("s1:2") == store.get("s1:2")
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
    with pytest.raises(InvalidArgumentError, match="empty text"):
        store.add_facts([Fact(id="a", text="fine", scope=U1), Fact(id="b", text="  ", scope=U1)])
    with pytest.raises(InvalidArgumentError, match="both session_id and position"):
        store.add("x", scope=U1, session_id="s9")
    with pytest.raises(InvalidArgumentError, match="shape"):
        store.add_facts([Fact(id="c", text="c", scope=U1)], vectors=np.zeros((1, 3), np.float32))
    assert len(store) == n and store.get("a") is None


def test_delete_removes_and_keeps_the_rest_searchable(store: InMemoryStore) -> None:
    assert store.delete(["s1:3", "missing"]) == 1
    hits = store.search_batch(["car bus"], scope=U1, params=SearchParams(top_k=8, min_score=0.0, window=1))[0]
    assert "s1:3" not in {h.fact.id for h in hits}
    assert store.get("s1:2") is not None


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
