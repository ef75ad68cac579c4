"""EdgeStore: the persistent embedded store on Qdrant's engine (qdrant-edge-py)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("qdrant_edge", reason="EdgeStore needs qdrant-edge-py: pip install 'pgr[local]'")

from pgr_core import (
    ConfigurationError,
    EdgeStore,
    Fact,
    HashingEmbedder,
    InMemoryStore,
    InvalidArgumentError,
    Scope,
    ScopeError,
    SearchParams,
    StoreError,
)
from pgr_core.stores._filelock import StoreLockedError

ROOT = Path(__file__).resolve().parents[1]
ALICE = Scope(user_id="alice")
BOB = Scope(user_id="bob")
ALICE_AGENT = Scope(user_id="alice", agent_id="planner")


def _open(path: Path, **kw: object) -> EdgeStore:
    kw.setdefault("embedder", HashingEmbedder())
    return EdgeStore.open(path, **kw)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path):
    s = _open(tmp_path / "mem")
    yield s
    s.close()


def _turns(scope: Scope, session: str, texts: list[str], prefix: str) -> list[Fact]:
    return [
        Fact(
            id=f"{prefix}{i}",
            text=t,
            scope=scope,
            type="turn",
            date=datetime(2025, 3, 1 + i, 18, 30),
            session_id=session,
            position=i,
            metadata={"speaker": "user" if i % 2 == 0 else "assistant", "n": i, "tags": ["x", i]},
        )
        for i, t in enumerate(texts)
    ]


def _search(store: EdgeStore, probe: str, scope: Scope, **params: object):
    return store._checked_search([probe], scope, SearchParams(**params))[0]  # type: ignore[arg-type]


# ---------------------------------------------------------------------- round trip


def test_facts_survive_close_and_reopen_with_dates_metadata_and_turn_order(tmp_path: Path) -> None:
    facts = _turns(ALICE, "s1", ["I hurt my knee skiing", "physio says rest", "no running until July"], "a")
    with _open(tmp_path / "mem") as store:
        assert store.add_facts(facts) == ["a0", "a1", "a2"]
        one = store.add("Bob drives a red van", scope=BOB, date="2025-02-01T08:00:00", id="b0")
    assert one == "b0"
    with _open(tmp_path / "mem", create=False) as again:
        assert len(again) == 4
        assert again.facts_for(ALICE) == facts
        bob = again.get("b0", scope=BOB)
        assert bob is not None and bob.date == datetime(2025, 2, 1, 8, 0) and bob.text == "Bob drives a red van"
        assert again.scopes() == [ALICE, BOB]
        hits = _search(again, "knee skiing", ALICE, top_k=1, min_score=0.0)
        assert [h.fact for h in hits] == [facts[0]]
    meta = (tmp_path / "mem" / "meta.json").read_text()
    assert '"pgr-edge/1"' in meta and '"hashing-256"' in meta


def test_an_upsert_of_the_same_owner_and_id_replaces_the_fact(store: EdgeStore) -> None:
    store.add("first version", scope=ALICE, id="f")
    store.add("second version", scope=ALICE, id="f")
    assert len(store) == 1
    assert store.get("f", scope=ALICE).text == "second version"  # type: ignore[union-attr]


def test_the_same_fact_id_from_two_owners_is_two_facts(store: EdgeStore) -> None:
    store.add("alice's note", scope=ALICE, id="n1")
    store.add("bob's note", scope=BOB, id="n1")
    assert len(store) == 2
    assert store.get("n1", scope=ALICE).text == "alice's note"  # type: ignore[union-attr]
    assert store.get("n1", scope=BOB).text == "bob's note"  # type: ignore[union-attr]
    assert [f.text for f in store.facts_for(BOB)] == ["bob's note"]
    assert store.vectors_for(["n1"], scope=ALICE) @ store.vectors_for(["n1"], scope=BOB).T < 0.99


def test_an_id_held_by_two_owners_within_a_wide_scope_needs_the_owners_scope(store: EdgeStore) -> None:
    store.add("the user's own", scope=ALICE, id="dup")
    store.add("the agent's", scope=ALICE_AGENT, id="dup")
    store.add("only the agent's", scope=ALICE_AGENT, id="solo")
    assert store.get("dup", scope=ALICE).text == "the user's own"  # type: ignore[union-attr]  # owner's own wins
    assert store.get("dup", scope=ALICE_AGENT).text == "the agent's"  # type: ignore[union-attr]
    assert store.get("solo", scope=ALICE).text == "only the agent's"  # type: ignore[union-attr]
    store.delete(["dup"], scope=ALICE_AGENT)
    assert store.get("dup", scope=ALICE).text == "the user's own"  # type: ignore[union-attr]
    store.add("another agent's", scope=Scope(user_id="alice", agent_id="coach"), id="solo")
    with pytest.raises(InvalidArgumentError, match="owners"):
        store.get("solo", scope=ALICE)


# ---------------------------------------------------------------------- scope on every call


def test_get_vectors_and_delete_need_a_scope_and_never_cross_it(store: EdgeStore) -> None:
    store.add("alice's secret", scope=ALICE, id="s")
    for call in (
        lambda: store.get("s", scope=None),  # type: ignore[arg-type]
        lambda: store.delete(["s"], scope=None),  # type: ignore[arg-type]
        lambda: store.facts_for(None),  # type: ignore[arg-type]
        lambda: store.vectors_for(["s"], scope=None),  # type: ignore[arg-type]
    ):
        with pytest.raises(ScopeError):
            call()
    with pytest.raises(TypeError):
        store.get("s")  # type: ignore[call-arg]
    assert store.get("s", scope=BOB) is None
    with pytest.raises(KeyError):
        store.vectors_for(["s"], scope=BOB)
    assert store.facts_for(BOB) == []
    assert store.delete(["s"], scope=BOB) == 0
    assert store.get("s", scope=ALICE) is not None
    assert store.delete(["s"], scope=ALICE) == 1
    assert store.get("s", scope=ALICE) is None and len(store) == 0


def test_search_never_returns_another_owners_fact(store: EdgeStore) -> None:
    store.add("knee injury while skiing", scope=ALICE)
    store.add("knee injury while skiing, said bob", scope=BOB)
    hits = _search(store, "knee injury skiing", ALICE, top_k=10, min_score=0.0)
    assert [h.fact.scope for h in hits] == [ALICE]


def test_listeners_hear_of_writes_and_deletions_with_the_owners(store: EdgeStore) -> None:
    heard: list[frozenset[Scope]] = []
    store.add_listener(heard.append)
    store.add("a fact", scope=ALICE, id="x")
    store.add_facts([Fact(id="y", text="another", scope=BOB)])
    store.delete(["x"], scope=ALICE)
    assert heard == [frozenset({ALICE}), frozenset({BOB}), frozenset({ALICE})]


# ---------------------------------------------------------------------- window


def test_window_brings_neighbours_of_the_same_owner_and_session_only(store: EdgeStore) -> None:
    texts = ["we talked about the weather", "I sold my car and take the bus", "the bus is always late"]
    store.add_facts(_turns(ALICE, "s", texts, "a"))
    # Bob has a session with the same id and the same positions: none of it may come in
    store.add_facts(_turns(BOB, "s", ["bob weather", "bob car", "bob late bus"], "b"))
    hits = _search(store, "sold my car take the bus", ALICE, top_k=1, min_score=0.0, window=1)
    assert [(h.fact.id, h.neighbour_of, h.score, h.rank) for h in hits] == [
        ("a1", None, hits[0].score, 0),
        ("a0", "a1", 0.0, 0),
        ("a2", "a1", 0.0, 0),
    ]
    assert all(h.fact.scope == ALICE for h in hits)


def test_window_stops_at_the_session_edge_and_spans_the_whole_batch(store: EdgeStore) -> None:
    store.add_facts(_turns(ALICE, "s1", ["one apple", "two bananas", "three cherries"], "x"))
    store.add_facts(_turns(ALICE, "s2", ["four dates", "five elderberries"], "y"))
    lists = store._checked_search(
        ["three cherries", "four dates"], ALICE, SearchParams(top_k=1, min_score=0.0, window=2)
    )
    assert [h.fact.id for h in lists[0]] == ["x2", "x1", "x0"]
    assert [h.fact.id for h in lists[1]] == ["y0", "y1"]


# ---------------------------------------------------------------------- refusals


def test_a_bad_fact_is_refused_and_the_store_is_unchanged(store: EdgeStore) -> None:
    store.add("already there", scope=ALICE, id="old")
    good = Fact(id="g", text="fine", scope=ALICE)
    for bad in (
        Fact(id="b", text="x", scope=ALICE, session_id="s", position="3"),  # type: ignore[arg-type]
        Fact(id="b", text="x", scope=ALICE, metadata={"when": datetime(2025, 1, 1)}),
        Fact(id="b", text="lone \ud800 surrogate", scope=ALICE),
        Fact(id="b", text="   ", scope=ALICE),
    ):
        with pytest.raises(InvalidArgumentError):
            store.add_facts([good, bad])
    with pytest.raises(InvalidArgumentError, match="aware"):
        store.add_facts(
            [
                good,
                Fact(id="n", text="naive", scope=ALICE, date=datetime(2025, 1, 1)),
                Fact(id="z", text="aware", scope=ALICE, date=datetime(2025, 1, 1, tzinfo=UTC)),
            ]
        )
    assert [f.id for f in store.facts_for(ALICE)] == ["old"]


def test_dates_keep_one_kind_across_reopen(tmp_path: Path) -> None:
    with _open(tmp_path / "m") as store:
        store.add("aware", scope=ALICE, date="2025-01-01T10:00:00+02:00")
    with _open(tmp_path / "m") as store:
        with pytest.raises(InvalidArgumentError, match="aware"):
            store.add("naive", scope=ALICE, date="2025-01-02")
        assert store.facts_for(ALICE)[0].date == datetime.fromisoformat("2025-01-01T10:00:00+02:00")


def test_nan_infinite_and_zero_vectors_are_refused(store: EdgeStore) -> None:
    facts = [Fact(id="a", text="a", scope=ALICE), Fact(id="b", text="b", scope=ALICE)]
    for value in (np.nan, np.inf):
        vectors = np.ones((2, 256), dtype=np.float32)
        vectors[1, 3] = value
        with pytest.raises(InvalidArgumentError, match="NaN or infinite"):
            store.add_facts(facts, vectors=vectors)
    with pytest.raises(InvalidArgumentError, match="zeros"):
        store.add_facts(facts, vectors=np.vstack([np.ones(256), np.zeros(256)]))
    with pytest.raises(InvalidArgumentError, match="shape"):
        store.add_facts(facts, vectors=np.ones((2, 8)))
    assert len(store) == 0


def test_reopening_with_another_embedder_names_both(tmp_path: Path) -> None:
    _open(tmp_path / "m").close()
    with pytest.raises(ConfigurationError) as info:
        _open(tmp_path / "m", embedder=HashingEmbedder(dim=128))
    assert "hashing-256" in str(info.value) and "hashing-128" in str(info.value)
    _open(tmp_path / "m").close()  # the refusal released the lock


def test_a_file_or_a_foreign_directory_is_refused_with_what_to_do(tmp_path: Path) -> None:
    a_file = tmp_path / "memory.pgr"
    a_file.write_text("not a directory")
    with pytest.raises(ConfigurationError, match="is a file"):
        _open(a_file)
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"\xff")
    with pytest.raises(ConfigurationError, match="not an EdgeStore") as info:
        _open(foreign)
    assert str(foreign) in str(info.value)
    with pytest.raises(ConfigurationError, match="create=True"):
        _open(tmp_path / "missing", create=False)
    assert not (tmp_path / "missing").exists()


def test_a_closed_store_refuses_every_call(tmp_path: Path) -> None:
    store = _open(tmp_path / "m")
    store.add("x", scope=ALICE)
    store.close()
    store.close()  # idempotent
    assert store.closed
    for call in (
        lambda: len(store),
        lambda: store.add("y", scope=ALICE),
        lambda: store.facts_for(ALICE),
        lambda: store._checked_search(["x"], ALICE, SearchParams()),
    ):
        with pytest.raises(ConfigurationError, match="store is closed"):
            call()


def test_a_second_open_in_the_same_process_is_refused_until_close(tmp_path: Path) -> None:
    store = _open(tmp_path / "m")
    with pytest.raises(ConfigurationError, match="already open in this process"):
        _open(tmp_path / "m")
    store.close()
    _open(tmp_path / "m").close()


def test_a_store_dropped_without_close_is_closed_by_the_collector(tmp_path: Path) -> None:
    import gc

    store = _open(tmp_path / "m")
    store.add("kept", scope=ALICE)
    del store
    gc.collect()
    with _open(tmp_path / "m", lock_timeout_s=0) as again:
        assert [f.text for f in again.facts_for(ALICE)] == ["kept"]


def test_a_backend_failure_is_a_store_error_with_the_engines_cause(store: EdgeStore) -> None:
    store.add("x", scope=ALICE)
    store._res.shard.close()  # the engine fails under the store
    with pytest.raises(StoreError) as info:
        store._checked_search(["x"], ALICE, SearchParams())
    assert info.value.__cause__ is not None
    with pytest.raises(StoreError):
        store.add("y", scope=ALICE)


def test_without_the_engine_pgr_imports_and_edgestore_names_the_extra(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "qdrant_edge", None)  # an import of it now fails
    with pytest.raises(ConfigurationError, match=r"pip install 'pgr\[local\]'"):
        EdgeStore(tmp_path / "m", embedder=HashingEmbedder())
    out = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['qdrant_edge'] = None; import pgr_core; print('ok')"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    assert out.stdout.strip() == "ok"


# ---------------------------------------------------------------------- one process owns it


def _try_open(path: str, timeout_s: float, queue) -> None:  # runs in a spawned process
    try:
        with EdgeStore.open(path, embedder=HashingEmbedder(), lock_timeout_s=timeout_s) as store:
            queue.put(("opened", len(store), os.getpid()))
    except StoreLockedError as exc:
        queue.put(("locked", exc.holder.get("pid"), str(exc)))
    except Exception as exc:  # reported, so the test fails with the reason
        queue.put(("error", type(exc).__name__, str(exc)))


def test_a_second_process_waits_then_is_told_the_holders_pid_and_opens_after_release(tmp_path: Path) -> None:
    path = tmp_path / "m"
    store = _open(path)
    store.add("held", scope=ALICE)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_try_open, args=(str(path), 0.5, queue))
    child.start()
    outcome, pid, message = queue.get(timeout=120)
    child.join(60)
    assert outcome == "locked", message
    assert pid == os.getpid() and str(os.getpid()) in message
    assert "QdrantStore" in message  # says how several processes share one memory
    store.close()
    child = ctx.Process(target=_try_open, args=(str(path), 30.0, queue))
    child.start()
    outcome, count, _ = queue.get(timeout=120)
    child.join(60)
    assert (outcome, count) == ("opened", 1)


def test_kill_9_after_add_facts_returned_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "m"
    script = textwrap.dedent(
        f"""
        import sys
        from pgr_core import EdgeStore, Fact, HashingEmbedder, Scope
        store = EdgeStore.open({str(path)!r}, embedder=HashingEmbedder())
        alice = Scope(user_id="alice")
        store.add_facts([Fact(id=f"f{{i}}", text=f"durable fact number {{i}}", scope=alice) for i in range(300)])
        print("written", flush=True)
        n = 0
        while True:  # keep writing: the kill may land in the middle of a write
            store.add_facts([Fact(id=f"more{{n}}-{{i}}", text=f"more {{n}} {{i}}", scope=alice) for i in range(50)])
            n += 1
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "written"
        os.kill(writer.pid, signal.SIGKILL)
    finally:
        writer.wait(60)
    assert writer.returncode == -signal.SIGKILL
    with _open(path, lock_timeout_s=10) as store:  # the kernel dropped the dead writer's lock
        kept = {f.id: f.text for f in store.facts_for(ALICE)}
    assert all(kept.get(f"f{i}") == f"durable fact number {i}" for i in range(300))
    assert len(kept) >= 300


# ---------------------------------------------------------------------- optimize


def test_a_bulk_write_runs_optimize_and_a_small_one_does_not(store: EdgeStore, monkeypatch) -> None:
    facts = [Fact(id=f"f{i}", text=f"fact {i} about topic {i % 7}", scope=ALICE) for i in range(40)]
    calls: list[bool] = []
    real = store.optimize
    monkeypatch.setattr(store, "optimize", lambda: calls.append(real()) or calls[-1])
    store.auto_optimize_at = 20
    store.add_facts(facts[:19])  # below the bulk threshold
    assert calls == []
    store.add_facts(facts[19:])  # 21 facts: a bulk write
    assert calls == [False]  # a shard this small needs no index: the engine leaves it as it is
    assert len(store) == 40 and store.stats()["points"] == 40
    assert _search(store, "fact 3 about topic 3", ALICE, top_k=1, min_score=0.0)[0].fact.id == "f3"


# ---------------------------------------------------------------------- hybrid


def _keyword_corpus(embedder: HashingEmbedder) -> tuple[list[Fact], np.ndarray, str]:
    """Twenty distractors whose vectors lie close to the probe's, and one fact that holds the probe's
    rare word but whose vector is nearly orthogonal to it: dense search ranks it last."""
    probe = "zephyrine"
    q = embedder.embed([probe])[0]
    rng = np.random.default_rng(7)
    rows = []
    for _ in range(20):
        v = q + 0.4 * rng.standard_normal(q.shape).astype(np.float32) / np.sqrt(q.size)
        rows.append(v / np.linalg.norm(v))
    far = rng.standard_normal(q.shape).astype(np.float32)
    far -= (far @ q) * q
    far = far / np.linalg.norm(far) + 0.05 * q
    rows.append(far / np.linalg.norm(far))
    facts = [Fact(id=f"d{i}", text=f"note {i} about the garden and the weather", scope=ALICE) for i in range(20)]
    facts.append(Fact(id="cat", text="My cat is called Zephyrine", scope=ALICE))
    return facts, np.asarray(rows, dtype=np.float32), probe


def test_hybrid_finds_an_exact_keyword_match_that_dense_ranks_low(tmp_path: Path) -> None:
    embedder = HashingEmbedder()
    facts, vectors, probe = _keyword_corpus(embedder)
    with (
        _open(tmp_path / "dense", embedder=embedder) as dense,
        _open(tmp_path / "hy", embedder=embedder, hybrid=True) as hy,
    ):
        dense.add_facts(facts, vectors=vectors)
        hy.add_facts(facts, vectors=vectors)
        assert "cat" not in [h.fact.id for h in _search(dense, probe, ALICE, top_k=3, min_score=0.0)]
        hits = _search(hy, probe, ALICE, top_k=3, min_score=0.3)  # τ filters the dense side only
        # BM25's best and dense's best tie under RRF (1/61 each): the keyword match is in, at the top two
        assert "cat" in [h.fact.id for h in hits[:2]]
        assert all(0 < h.score < 0.1 for h in hits)  # RRF scores, not cosines
        assert hy.capabilities.cosine_scores is False and dense.capabilities.cosine_scores is True
        assert type(hy).capabilities.cosine_scores is True  # the class default is untouched
        assert _search(hy, probe, BOB, top_k=3, min_score=0.0) == []
    with _open(tmp_path / "hy") as again:  # hybrid is kept in meta.json
        assert again.hybrid and _search(again, probe, ALICE, top_k=1, min_score=0.0)[0].fact.id == "cat"
    with pytest.raises(ConfigurationError, match="hybrid"):
        _open(tmp_path / "dense", hybrid=True)


# ---------------------------------------------------------------------- import


def test_import_pgr_keeps_every_fact_and_vector_and_ranks_alike(tmp_path: Path) -> None:
    old = InMemoryStore(embedder=HashingEmbedder())
    facts = _turns(ALICE, "s1", ["knee injury skiing", "physio twice a week", "bus pass renewed"], "a")
    facts += _turns(BOB, "s9", ["bob's red van", "bob runs marathons"], "b")
    facts.append(Fact(id="ag", text="planner notes: prefers trains", scope=ALICE_AGENT, date=datetime(2025, 4, 1)))
    old.add_facts(facts)
    pgr_file = old.save(tmp_path / "old.pgr")
    store = EdgeStore.import_pgr(pgr_file, tmp_path / "new", embedder=HashingEmbedder())
    try:
        assert len(store) == len(facts)
        assert store.facts_for(BOB) == [f for f in facts if f.scope == BOB]
        assert sorted(f.id for f in store.facts_for(ALICE)) == sorted(f.id for f in facts if ALICE.allows(f.scope))
        ids = [f.id for f in facts if f.scope == ALICE]
        np.testing.assert_allclose(store.vectors_for(ids, scope=ALICE), old.vectors_for(ids, scope=ALICE), atol=1e-6)
        for probe in ("knee skiing", "trains", "physio week"):
            want = old.search_batch([probe], scope=ALICE, params=SearchParams(top_k=3, min_score=0.0))[0]
            got = _search(store, probe, ALICE, top_k=3, min_score=0.0)
            np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5)
            # the same ranking; facts that tie on score may come in either order
            assert sorted((round(h.score, 4), h.fact.id) for h in got) == sorted(
                (round(h.score, 4), h.fact.id) for h in want
            )
    finally:
        store.close()
    with pytest.raises(ConfigurationError, match="already holds an EdgeStore"):
        EdgeStore.import_pgr(pgr_file, tmp_path / "new", embedder=HashingEmbedder())


def test_user_ids_lists_each_owning_user_once_from_the_tenant_index(tmp_path: Path) -> None:
    with _open(tmp_path / "s") as store:
        assert store.user_ids() == []
        store.add_facts(_turns(ALICE, "s1", ["knee", "bus"], "a") + _turns(BOB, "s2", ["van"], "b"))
        store.add_facts([Fact(id="ag", text="planner notes", scope=ALICE_AGENT)])
        store.add_facts([Fact(id="bot", text="agent-wide note", scope=Scope(agent_id="planner"))])
        assert store.user_ids() == sorted({s.user_id for s in store.scopes() if s.user_id}) == ["alice", "bob"]
