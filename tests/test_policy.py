"""The retrieval loop: rounds, Δ and its stops, de-duplication, store calls, scope, dates, degradation."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime

import pytest
from conftest import U1, U2, ScriptedProspector, SpyStore, make_store

from pgr_core import (
    PGR,
    ConfigurationError,
    Fact,
    HashingEmbedder,
    Hygiene,
    InMemoryStore,
    InvalidArgumentError,
    LLMConnectionError,
    LLMTimeoutError,
    OpenAICompatible,
    Scope,
    ScopeError,
)
from pgr_core.testing import ScriptedLLM

QUERY = "Should I join a soccer league this summer?"

# ---------------------------------------------------------------- the loop and its stops


def test_delta_stop_when_a_round_adds_fewer_than_delta(spy: SpyStore) -> None:
    prospector = ScriptedProspector([["knee physio running", "car bus"], ["football Sam"], ["early weekends"]])
    result = PGR(spy, strategy=prospector, query_top_k=1, delta=3, min_score=0.2).retrieve(QUERY, scope=U1)
    rounds = result.trace.rounds
    # Phase 1 finds 4 facts; round 2 ("football Sam") adds two, fewer than δ = 3: stop there
    assert len(rounds[0].new_fact_ids) == 4
    assert [r.phase for r in rounds] == ["initial", "personalized"]
    assert rounds[1].new_fact_ids == ["s2:1", "s2:3"]
    assert result.trace.stop_reason == "delta_below_threshold"
    assert prospector.calls == 2  # the third scripted round was never asked for


def test_max_rounds_stop(spy: SpyStore) -> None:
    # every round brings new probes; δ = 0 never stops, so I_max does
    prospector = ScriptedProspector([["knee"], ["car bus"], ["money rent"], ["football Sam"], ["early weekends"]])
    result = PGR(spy, strategy=prospector, query_top_k=1, delta=0, max_rounds=2, min_score=0.2).retrieve(
        QUERY, scope=U1
    )
    assert result.trace.stop_reason == "max_rounds"
    assert [r.phase for r in result.trace.rounds] == ["initial", "personalized", "personalized"]


def test_no_new_probes_stops_the_loop(spy: SpyStore) -> None:
    prospector = ScriptedProspector([["knee physio running"], []])
    result = PGR(spy, strategy=prospector, query_top_k=1, delta=0, min_score=0.2).retrieve(QUERY, scope=U1)
    assert result.trace.stop_reason == "no_new_probes"
    assert len(spy.calls) == 1  # an empty round makes no store call


def test_one_store_call_per_round_with_every_probe(spy: SpyStore) -> None:
    prospector = ScriptedProspector([["knee physio running", "car bus", "money rent"], ["football Sam", "evening"]])
    result = PGR(spy, strategy=prospector, query_top_k=1, delta=1, min_score=0.2).retrieve(QUERY, scope=U1)
    assert len(spy.calls) == result.trace.store_calls == sum(1 for r in result.trace.rounds if r.probes)
    assert all(r.store_calls <= 1 for r in result.trace.rounds)
    assert spy.calls[0][0] == [QUERY, "knee physio running", "car bus", "money rent"]
    assert spy.calls[1][0] == ["football Sam", "evening"]


def test_facts_are_deduplicated_across_probes_and_rounds(spy: SpyStore) -> None:
    # "knee" and "knee physio" hit the same facts; round 2 repeats a round-1 probe's facts
    prospector = ScriptedProspector([["knee basketball", "physio running knee"], ["hurt knee March"]])
    result = PGR(spy, strategy=prospector, query_top_k=1, delta=1, min_score=0.1).retrieve(QUERY, scope=U1)
    assert len(result.ids) == len(set(result.ids))
    round1, round2 = result.trace.rounds[0], result.trace.rounds[1]
    assert "s1:0" in round1.new_fact_ids
    assert "s1:0" not in round2.new_fact_ids  # Δ excludes what R already holds
    knee = next(f for f in result.facts if f.id == "s1:0")
    assert knee.probes_hit >= 3  # the query's list and several steps found it; it is kept once


def test_scope_is_passed_on_every_store_call_and_nothing_leaks(spy: SpyStore) -> None:
    llm = ScriptedLLM(
        [
            {"intent": "decide about a soccer league"},
            {"nodes": [{"id": "a", "parent": None, "action": "knee physio running", "dimension": "health"}]},
            {"nodes": [{"id": "b", "parent": "a", "action": "car bus money rent", "dimension": "logistics"}]},
            {"nodes": []},
            {"summary": "knee and money matter"},
        ]
    )
    result = PGR(spy, llm=llm, strategy="tot", delta=1, min_score=0.1).retrieve(QUERY, scope=U1)
    assert len(spy.calls) >= 3
    assert all(scope == U1 for _, scope, _ in spy.calls)
    assert result.facts and all(f.fact.scope == U1 for f in result.facts)
    # the other user's copies of the very same texts never appear
    assert not [i for i in result.ids if i.startswith("other:")]


def test_scope_is_required() -> None:
    pgr = PGR(make_store())
    with pytest.raises(ScopeError, match="scope is required"):
        pgr.retrieve(QUERY, scope=None)  # type: ignore[arg-type]
    with pytest.raises(ScopeError, match="at least one"):
        pgr.retrieve(QUERY, scope=Scope())


def test_tot_keeps_parents_and_children(store: InMemoryStore) -> None:
    llm = ScriptedLLM(
        [
            {"intent": "join a soccer league"},
            {
                "nodes": [
                    {"id": "n1", "parent": None, "action": "see the physio about the knee", "dimension": "health"},
                    {"id": "n2", "parent": "n1", "action": "ask about running again", "dimension": "health"},
                    {"id": "n3", "parent": None, "action": "take the bus to the pitch", "dimension": "logistics"},
                ]
            },
            # Phase 2 attaches a child under a Phase-1 node by its (round-qualified) id
            {"nodes": [{"id": "x", "parent": "r1.1", "action": "money for rent and fees", "dimension": "finances"}]},
            {"nodes": []},
            {"summary": "s"},
        ]
    )
    result = PGR(store, llm=llm, strategy="tot", delta=1, min_score=0.1).retrieve(QUERY, scope=U1)
    steps = {s.id: s for s in result.trace.steps}
    assert steps["r1.2"].parent == "r1.1" and steps["r1.1"].children[0] == "r1.2"
    assert steps["r1.3"].parent is None
    assert steps["r2.1"].parent == "r1.1" and "r2.1" in steps["r1.1"].children


def test_cot_is_a_chain(store: InMemoryStore) -> None:
    llm = ScriptedLLM(
        [
            {"intent": "join"},
            {"steps": [{"action": "knee physio", "dimension": "health"}, {"action": "bus car"}, "money rent"]},
            {"steps": []},
            {"summary": "s"},
        ]
    )
    result = PGR(store, llm=llm, strategy="cot", min_score=0.1).retrieve(QUERY, scope=U1)
    chain = [s for s in result.trace.steps if s.round == 1]
    assert [s.text for s in chain] == ["knee physio", "bus car", "money rent"]  # plain strings accepted
    assert [s.parent for s in chain] == [None, chain[0].id, chain[1].id]


def test_usage_is_counted_per_phase(store: InMemoryStore) -> None:
    llm = ScriptedLLM([{"intent": "x"}, {"steps": ["knee physio"]}, {"steps": []}, {"summary": "s"}])
    result = PGR(store, llm=llm, strategy="cot", min_score=0.1, delta=1).retrieve(QUERY, scope=U1)
    usage = result.trace.usage
    assert usage.llm_calls == len(llm.calls) == 4
    assert set(result.trace.usage_by_phase) == {"augment", "initial", "personalized", "summary"}
    assert usage.prompt_tokens == sum(u.prompt_tokens for u in result.trace.usage_by_phase.values()) > 0
    assert set(result.trace.seconds_by_phase) >= {"augment", "initial", "personalized", "summary"}


# ---------------------------------------------------------------- dates


def test_dates_reach_the_prompts(store: InMemoryStore) -> None:
    llm = ScriptedLLM([{"intent": "x"}, {"steps": ["knee physio running"]}, {"steps": []}, {"summary": "s"}])
    PGR(store, llm=llm, strategy="cot", min_score=0.1, delta=1).retrieve(QUERY, scope=U1, date="2025-05-01")
    assert "2025-05-01" in llm.calls[1].prompt  # the query date in Phase 1
    revise = llm.calls[2].prompt
    # s1 facts are dated 2025-01-10, s2 facts 2025-02-10: ages relative to the query date
    assert 'noted="3 months before"' in revise or 'noted="2 months before"' in revise


def test_naive_and_aware_dates_do_not_mix(store: InMemoryStore) -> None:
    pgr = PGR(store, strategy="feedback")
    with pytest.raises(InvalidArgumentError, match="timezone-aware"):
        pgr.retrieve(QUERY, scope=U1, date=datetime(2025, 5, 1, tzinfo=UTC))


def test_bad_date_string_is_named() -> None:
    with pytest.raises(InvalidArgumentError, match="not an ISO date"):
        PGR(make_store()).retrieve(QUERY, scope=U1, date="May 1st")


def test_store_refuses_mixed_date_kinds_and_keeps_what_it_had(store: InMemoryStore) -> None:
    before = len(store)
    aware = Fact(id="new", text="aware fact", scope=U1, date=datetime(2025, 1, 1, tzinfo=UTC))
    with pytest.raises(InvalidArgumentError, match="one kind for all dates"):
        store.add_facts([Fact(id="ok", text="fine", scope=U1), aware])
    assert len(store) == before and store.get("ok", scope=U1) is None


# ---------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"top_k": 0}, "top_k"),
        ({"min_score": 1.5}, "min_score"),
        ({"min_score": -0.1}, "min_score"),
        ({"delta": -1}, "delta"),
        ({"max_rounds": 1.5}, "max_rounds"),
        ({"window": -1}, "window"),
        ({"strategy": "bfs"}, "unknown strategy"),
        ({"bogus": 1}, "unknown option"),
    ],
)
def test_bad_arguments_raise_one_named_error(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        PGR(make_store(), **kwargs)


def test_empty_query_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="query must be a non-empty string"):
        PGR(make_store()).retrieve("   ", scope=U1)


def test_llm_strategy_without_llm_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="needs an LLM"):
        PGR(make_store(), strategy="tot")
    with pytest.raises(ConfigurationError, match="needs an LLM"):
        PGR(make_store()).answer(QUERY, scope=U1)


# ---------------------------------------------------------------- degradation: never an exception


def _query_hits(store: InMemoryStore) -> list[str]:
    return PGR(store).query_only(QUERY, scope=U1).ids


def test_malformed_json_twice_degrades_after_one_repair(store: InMemoryStore) -> None:
    llm = ScriptedLLM([{"intent": "x"}, "this is not json", "{still not json"])
    result = PGR(store, llm=llm, strategy="tot").retrieve(QUERY, scope=U1)
    assert result.degraded and result.trace.stop_reason == "llm_error"
    assert result.trace.unusable_outputs == 2 and result.trace.repairs == 1
    assert "repair" not in llm.calls[1].prompt and "could not be used" in llm.calls[2].messages[-1]["content"]
    assert set(_query_hits(store)) <= set(result.ids)  # the query's own hits are still returned
    assert len(llm.calls) == 3  # no summary call once the LLM has failed


def test_one_repair_recovers_a_bad_reply(store: InMemoryStore) -> None:
    llm = ScriptedLLM(
        [
            {"intent": "x"},
            "```json\n{broken",
            {"nodes": [{"id": "a", "action": "knee physio"}]},
            {"nodes": []},
            {"summary": "s"},
        ]
    )
    result = PGR(store, llm=llm, strategy="tot", min_score=0.1).retrieve(QUERY, scope=U1)
    assert not result.degraded
    assert result.trace.repairs == 1 and result.trace.unusable_outputs == 1
    assert any(s.text == "knee physio" for s in result.trace.steps)


def test_truncated_tree_degrades(store: InMemoryStore) -> None:
    tree = {"nodes": [{"id": f"n{i}", "parent": None, "action": f"step number {i} about knees"} for i in range(6)]}
    llm = ScriptedLLM([{"intent": "x"}, tree, tree], truncate_at=None)
    llm.truncate_at = 60  # every reply is cut at 60 characters: JSON never closes
    result = PGR(store, llm=llm, strategy="tot").retrieve(QUERY, scope=U1)
    assert result.degraded and result.trace.stop_reason == "llm_error"
    assert "cut off" in llm.calls[2].messages[-1]["content"]
    assert set(_query_hits(store)) <= set(result.ids)


def test_empty_step_list_is_not_an_error(store: InMemoryStore) -> None:
    llm = ScriptedLLM([{"intent": "x"}, {"nodes": []}, {"nodes": []}, {"summary": "nothing new"}])
    result = PGR(store, llm=llm, strategy="tot").retrieve(QUERY, scope=U1)
    assert not result.degraded
    assert result.trace.stop_reason in ("no_new_probes", "delta_below_threshold")
    assert set(_query_hits(store)) <= set(result.ids)


def test_timeout_degrades(store: InMemoryStore) -> None:
    llm = ScriptedLLM([LLMTimeoutError("no answer within 1s")])
    result = PGR(store, llm=llm, strategy="tot").retrieve(QUERY, scope=U1)
    assert result.degraded and result.trace.stop_reason == "llm_error"
    assert "LLMTimeoutError" in result.trace.errors[0]
    assert len(llm.calls) == 1  # after a failure pgr stops asking
    assert set(_query_hits(store)) <= set(result.ids) and result.summary


def test_refused_connection_degrades(store: InMemoryStore) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    llm = OpenAICompatible(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout=2, max_retries=0)
    result = PGR(store, llm=llm, strategy="cot").retrieve(QUERY, scope=U1)
    assert result.degraded and "LLMConnectionError" in result.trace.errors[0]
    assert result.trace.usage.llm_calls == 1
    assert set(_query_hits(store)) <= set(result.ids)
    answer = PGR(store, llm=llm, strategy="cot").answer(QUERY, scope=U1)
    assert answer.degraded and answer.text == "" and answer.facts


def test_llm_failure_in_phase_two_keeps_phase_one_facts(store: InMemoryStore) -> None:
    llm = ScriptedLLM([{"intent": "x"}, {"steps": ["knee physio running", "car bus"]}, LLMConnectionError("down")])
    result = PGR(store, llm=llm, strategy="cot", min_score=0.1, delta=1).retrieve(QUERY, scope=U1)
    assert result.degraded and {"s1:1", "s1:3"} <= set(result.ids)


def test_store_failure_degrades() -> None:
    class Broken(InMemoryStore):
        def search_batch(self, probes, *, scope, params):  # type: ignore[override]
            raise RuntimeError("disk on fire")

    result = PGR(Broken(embedder=HashingEmbedder()), strategy="feedback").retrieve(QUERY, scope=U1)
    assert result.degraded and result.trace.stop_reason == "store_error"
    assert "disk on fire" in result.trace.errors[0] and result.facts == []


def test_a_store_that_leaks_another_scope_is_refused(store: InMemoryStore) -> None:
    class Leaky(InMemoryStore):
        def search_batch(self, probes, *, scope, params):  # type: ignore[override]
            return super().search_batch(probes, scope=U2, params=params)

    leaky = Leaky(embedder=store.embedder)
    leaky.add_facts(store.facts)
    result = PGR(leaky, strategy="feedback").retrieve(QUERY, scope=U1)
    assert result.degraded and "outside scope" in result.trace.errors[0]
    assert all(f.fact.scope == U1 for f in result.facts)


# ---------------------------------------------------------------- probe hygiene


def test_echoes_and_near_duplicates_are_dropped(spy: SpyStore) -> None:
    steps = [
        QUERY,
        "should i JOIN a soccer league this summer",
        "knee physio running",
        "knee physio running!",
        "running knee physio",
        "car bus",
    ]
    result = PGR(spy, strategy=ScriptedProspector([steps]), min_score=0.1).retrieve(QUERY, scope=U1)
    dropped = {(d.text, d.reason) for d in result.trace.rounds[0].dropped}
    assert (QUERY, "echo_of_query") in dropped
    assert ("should i JOIN a soccer league this summer", "echo_of_query") in dropped
    assert ("knee physio running!", "duplicate") in dropped
    assert ("running knee physio", "duplicate") in dropped  # same words, other order: cosine catches it
    assert spy.calls[0][0] == [QUERY, "knee physio running", "car bus"]
    assert result.trace.dropped_probes == 4


def test_long_probes_are_capped(spy: SpyStore) -> None:
    long_step = " ".join(f"word{i}" for i in range(100))
    PGR(spy, strategy=ScriptedProspector([[long_step]])).retrieve(QUERY, scope=U1)
    assert len(spy.calls[0][0][1].split()) == 32


def test_probes_repeated_from_an_earlier_round_are_dropped(spy: SpyStore) -> None:
    prospector = ScriptedProspector([["knee physio running"], ["knee physio running", "car bus"]])
    result = PGR(spy, strategy=prospector, query_top_k=1, delta=0, max_rounds=1, min_score=0.1).retrieve(
        QUERY, scope=U1
    )
    assert [(d.text, d.reason) for d in result.trace.rounds[1].dropped] == [("knee physio running", "duplicate")]
    assert spy.calls[1][0] == ["car bus"]


# ---------------------------------------------------------------- the temporal window and query-only


def test_query_only_window_brings_neighbours_within_the_budget(store: InMemoryStore) -> None:
    pgr = PGR(store)
    plain = pgr.query_only("physio running", scope=U1, top_k=3)
    windowed = pgr.query_only("physio running", scope=U1, top_k=3, window=1)
    assert len(plain.facts) == len(windowed.facts) == 3
    assert windowed.facts[0].id == "s1:1"
    assert {f.id for f in windowed.facts[1:]} == {"s1:0", "s1:2"}  # its session neighbours
    assert all(f.via == "neighbour" for f in windowed.facts[1:])


def test_window_neighbours_do_not_count_toward_delta(spy: SpyStore) -> None:
    prospector = ScriptedProspector([["car bus"], ["football Sam"]])
    result = PGR(spy, strategy=prospector, window=1, delta=2, min_score=0.3, query_top_k=1).retrieve(QUERY, scope=U1)
    # Phase 1: the query's top hit s2:0 brought s2:1 in as a neighbour; car bus found s1:3 (+ s1:2)
    assert result.trace.rounds[0].new_neighbour_ids == ["s2:1", "s1:2"]
    rnd = result.trace.rounds[1]
    # s2:1 is now hit directly (it counts toward Δ); its neighbour s2:2 comes in, and does not count
    assert rnd.new_fact_ids == ["s2:1"] and rnd.new_neighbour_ids == ["s2:2"]
    assert result.trace.stop_reason == "delta_below_threshold"


def test_query_only_is_one_store_call_with_k_20(spy: SpyStore) -> None:
    result = PGR(spy).query_only(QUERY, scope=U1)
    assert len(spy.calls) == 1 and spy.calls[0][2].top_k == 20
    assert result.trace.stop_reason == "query_only"
    # K = 20 exceeds u1's 8 facts: every one with a non-negative cosine comes back, best first
    scores = [f.score for f in result.facts]
    assert 5 <= len(scores) <= 8 and scores == sorted(scores, reverse=True) and min(scores) >= 0
    assert all(f.fact.scope == U1 for f in result.facts)


# ---------------------------------------------------------------- answer and async


def test_answer_uses_the_retrieved_facts(store: InMemoryStore) -> None:
    llm = ScriptedLLM(
        [
            {"intent": "x"},
            {"steps": ["knee physio running"]},
            {"steps": []},
            {"summary": "knee"},
            "Wait until your knee heals.",
        ]
    )
    answer = PGR(store, llm=llm, strategy="cot", min_score=0.1, delta=1).answer(QUERY, scope=U1)
    assert answer.text == "Wait until your knee heals." and not answer.degraded
    assert "the physio said no running" in llm.calls[-1].prompt
    assert answer.retrieval.trace.usage_by_phase["answer"].llm_calls == 1


def test_async_gives_what_sync_gives(store: InMemoryStore) -> None:
    def replies() -> list:
        return [{"intent": "x"}, {"nodes": [{"id": "a", "action": "knee physio"}]}, {"nodes": []}, {"summary": "s"}]

    sync = PGR(store, llm=ScriptedLLM(replies()), strategy="tot", min_score=0.1).retrieve(QUERY, scope=U1)
    pgr = PGR(store, llm=ScriptedLLM(replies()), strategy="tot", min_score=0.1)
    asynced = asyncio.run(pgr.aretrieve(QUERY, scope=U1))
    assert asynced.ids == sync.ids and asynced.summary == sync.summary
    assert [len(r.probes) for r in asynced.trace.rounds] == [len(r.probes) for r in sync.trace.rounds]
    plain = PGR(store)
    assert asyncio.run(plain.aquery_only(QUERY, scope=U1)).ids == plain.query_only(QUERY, scope=U1).ids


def test_probes_keep_the_querys_words(spy: SpyStore) -> None:
    steps = ["find a soccer league near the office", "ask Sam about Sunday football"]
    result = PGR(spy, strategy=ScriptedProspector([steps])).retrieve("Should I join a soccer league?", scope=U1)
    assert spy.calls[0][0][1:] == steps  # stripping the query's words lost and was deleted
    with pytest.raises(TypeError, match="strip_query_words"):
        Hygiene(strip_query_words=True)  # type: ignore[call-arg]
    assert not result.trace.rounds[0].dropped
