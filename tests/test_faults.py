"""Every fault of pgr_core.testing.faults ends in its documented outcome (see the table in faults.py).

Each case runs with a fixed seed. Whatever fails: no exception reaches the caller, the result holds
the query's own hits wherever the store answered, the trace says what failed, and the store holds
exactly what it held before.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import U1, U2, ScriptedProspector, make_store
from loopback_llm import LoopbackLLM, Reply, error, sane

from pgr_core import PGR, Budget, InMemoryStore, OpenAICompatible, RetrievalResult, Scope
from pgr_core.testing import ScriptedLLM
from pgr_core.testing.faults import LLM_FAULTS, STORE_FAULTS, FaultyLLM, FaultyStore

QUERY = "Should I join a soccer league this summer?"
SEED = 20260506


def snapshot(store: InMemoryStore) -> tuple[list[tuple[Any, ...]], bytes]:
    return [(f.id, f.text, f.scope, f.date, f.session_id, f.position) for f in store.facts], store._vectors.tobytes()


def query_hits(store: InMemoryStore, scope: Scope = U1, top_k: int = 20) -> set[str]:
    return set(PGR(store).query_only(QUERY, scope=scope, top_k=top_k).ids)


def run(pgr: PGR, mode: str, scope: Scope = U1, **kwargs: Any) -> RetrievalResult:
    if mode == "async":
        return asyncio.run(pgr.aretrieve(QUERY, scope=scope, **kwargs))
    return pgr.retrieve(QUERY, scope=scope, **kwargs)


@pytest.fixture
def store() -> Iterator[InMemoryStore]:
    store = make_store()
    before = snapshot(store)
    yield store
    assert snapshot(store) == before, "a fault run changed the store"


# ---------------------------------------------------------------- the LLM side, one fault at a time

LLM_GIVES_UP = ("timeout", "rate_limited", "server_error", "connection_refused")
LLM_UNUSABLE = ("malformed_json", "truncated_json", "wrong_schema")


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("fault", LLM_FAULTS)
def test_each_llm_fault_ends_in_its_defined_outcome(store: InMemoryStore, fault: str, mode: str) -> None:
    inner = ScriptedLLM(handler=sane)  # records what reaches the model behind the faulty wrapper
    llm = FaultyLLM(inner, fault, seed=SEED)
    result = run(PGR(store, llm=llm, strategy="tot", min_score=0.1), mode)
    trace, baseline = result.trace, query_hits(store)
    assert all(f.fact.scope == U1 for f in result.facts)
    assert llm.injected and {kind for _, kind in llm.injected} == {fault}

    if fault in LLM_GIVES_UP:  # pgr stops asking after the first failure
        assert result.degraded and trace.stop_reason == "llm_error"
        assert trace.usage.llm_calls == 1 and set(result.ids) == baseline
        expected = {
            "timeout": "LLMTimeoutError",
            "rate_limited": "HTTP 429",
            "server_error": "HTTP 500",
            "connection_refused": "LLMConnectionError",
        }
        assert expected[fault] in trace.errors[0]
        assert result.summary  # the plain summary, from what was found
    elif fault in LLM_UNUSABLE:  # one repair retry, then pgr stops asking
        assert result.degraded and trace.stop_reason == "llm_error"
        assert trace.unusable_outputs == 2 and trace.repairs == 1 and trace.usage.llm_calls == 2
        assert set(result.ids) == baseline
        assert "LLMOutputError" in trace.errors[0]
    elif fault in ("empty_steps", "query_echo"):  # nothing but the query is probed; no failure
        assert not result.degraded and not trace.errors
        assert trace.stop_reason in ("no_new_probes", "delta_below_threshold")
        assert set(result.ids) == baseline
        assert [pr.source for r in trace.rounds for pr in r.probes] == ["query", "query"]  # augment + Phase 1
        if fault == "query_echo":
            reasons = {d.reason for r in trace.rounds for d in r.dropped}
            assert reasons == {"echo_of_query"} and trace.dropped_probes >= 3
    else:  # enormous_output: read, cut to size, and used
        assert fault == "enormous_output"
        assert not result.degraded and baseline <= set(result.ids)
        assert trace.intent is not None and len(trace.intent) <= 600
        assert len(result.summary) <= 2000
        assert all(len(s.text) <= 300 for s in trace.steps) and len(trace.rounds[1].steps) <= 12
        step_probes = [pr.text for r in trace.rounds for pr in r.probes if pr.source == "step"]
        assert step_probes and all(len(t) <= 400 and len(t.split()) <= 32 for t in step_probes)
        assert all(len(r.probes) <= 9 for r in trace.rounds)  # the query plus at most max_probes steps
        assert len(llm.calls) >= 3 and all(len(c.prompt) < 20_000 for c in llm.calls)  # no megabytes fed back


def test_truncated_replies_are_repaired_with_the_cut_named(store: InMemoryStore) -> None:
    inner = ScriptedLLM(handler=sane)
    result = PGR(store, llm=FaultyLLM(inner, "truncated_json"), strategy="cot").retrieve(QUERY, scope=U1)
    assert result.degraded and len(inner.calls) == 2
    assert "cut off at the length limit" in inner.calls[1].messages[-1]["content"]


def test_a_fault_in_phase_two_keeps_phase_one(store: InMemoryStore) -> None:
    # calls: 0 augment, 1 initial, 2 the first revision: time out there
    llm = FaultyLLM(ScriptedLLM(handler=sane), "timeout", calls={2}, seed=SEED)
    result = PGR(store, llm=llm, strategy="tot", min_score=0.1, delta=1).retrieve(QUERY, scope=U1)
    assert result.degraded and result.trace.stop_reason == "llm_error"
    assert {"s1:0", "s1:1"} <= set(result.ids)  # what "knee physio running" found in Phase 1
    assert query_hits(store) <= set(result.ids)


def test_a_slow_model_is_cut_at_the_deadline(store: InMemoryStore) -> None:
    llm = FaultyLLM(ScriptedLLM(handler=sane), "slow", delay=1.0)
    result = PGR(store, llm=llm, strategy="tot").retrieve(QUERY, scope=U1, budget=Budget(deadline_s=0.2))
    assert not result.degraded and result.trace.stop_reason == "deadline"
    assert result.trace.budget_hit == "deadline" and result.trace.budget_phase == "augment"
    assert set(result.ids) == query_hits(store)


# ---------------------------------------------------------------- the store side

SCHEDULES = {"every_call": None, "first_call": {0}, "after_first": set(range(1, 50))}
ERROR_WORDS = {
    "timeout": "TimeoutError",
    "error": "ConnectionError",
    "missing_lists": "partial batch",
    "wrong_length": "more than top_k",
}


def _scripted_pgr(store: FaultyStore) -> PGR:
    # Phase 1 probes the query (its top 3) and one step; Phase 2 probes one new step
    prospector = ScriptedProspector([["knee physio running"], ["car bus"]])
    return PGR(store, strategy=prospector, query_top_k=3, min_score=0.1, delta=1, max_rounds=1)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
@pytest.mark.parametrize("fault", STORE_FAULTS)
def test_each_store_fault_ends_in_its_defined_outcome(
    store: InMemoryStore, fault: str, schedule: str, mode: str
) -> None:
    faulty = FaultyStore(store, fault, calls=SCHEDULES[schedule], seed=SEED)
    result = run(_scripted_pgr(faulty), mode)
    trace, baseline = result.trace, query_hits(store, top_k=3)
    assert result.degraded and trace.stop_reason == "store_error"
    assert ERROR_WORDS[fault] in trace.errors[0]
    assert all(f.fact.scope == U1 for f in result.facts)
    if schedule == "every_call":  # the Phase-1 batch fails, and so does the query alone after it
        assert result.facts == [] and len(trace.errors) == 2
        assert [r.phase for r in trace.rounds] == ["initial", "query_only"]
    elif schedule == "first_call":  # the query alone, right after, is answered: the baseline's hits
        assert set(result.ids) == baseline
        assert [r.phase for r in trace.rounds] == ["initial", "query_only"]
    else:  # Phase 1 worked; the Phase-2 round is discarded whole
        clean = _scripted_pgr(FaultyStore(store, fault, calls=set())).retrieve(QUERY, scope=U1)
        phase1 = set(clean.trace.rounds[0].new_fact_ids) | set(clean.trace.rounds[0].new_neighbour_ids)
        assert baseline <= set(result.ids) and set(result.ids) == phase1
        assert trace.rounds[1].phase == "personalized" and not trace.rounds[1].new_fact_ids
    assert trace.usage.store_calls == trace.store_calls == faulty.schedule.count


@pytest.mark.parametrize("fault", STORE_FAULTS)
def test_a_failed_augmentation_lookup_still_gives_the_query_hits(store: InMemoryStore, fault: str) -> None:
    llm = ScriptedLLM(handler=sane)
    faulty = FaultyStore(store, fault, calls={0}, seed=SEED)  # call 0 is the augmentation lookup
    result = PGR(faulty, llm=llm, strategy="tot").retrieve(QUERY, scope=U1)
    assert result.degraded and result.trace.stop_reason == "store_error"
    assert set(result.ids) == query_hits(store)
    assert llm.calls == []  # after a failure pgr stops prospecting: no LLM call was made


# ---------------------------------------------------------------- a seeded mix of everything


def _mixed_run(store: InMemoryStore, mode: str) -> tuple[list[tuple[Any, ...]], FaultyLLM, FaultyStore]:
    llm = FaultyLLM(ScriptedLLM(handler=sane), LLM_FAULTS, rate=0.35, seed=SEED)
    faulty = FaultyStore(store, STORE_FAULTS, rate=0.2, seed=SEED)
    pgr = PGR(faulty, llm=llm, strategy="tot", min_score=0.1, delta=1)
    outcomes = []
    for i in range(80):
        scope = U1 if i % 2 == 0 else U2
        result = run(pgr, mode, scope=scope)  # never raises
        trace = result.trace
        assert all(f.fact.scope == scope for f in result.facts), "a fact crossed scopes"
        assert result.degraded == bool(trace.errors)
        assert query_hits(store, scope) <= set(result.ids) or trace.stop_reason == "store_error"
        assert trace.stop_reason is not None
        outcomes.append((trace.stop_reason, result.degraded, tuple(result.ids)))
    return outcomes, llm, faulty


def test_a_seeded_mix_of_every_fault_keeps_the_invariants_and_replays_exactly(store: InMemoryStore) -> None:
    outcomes, llm, faulty = _mixed_run(store, "sync")
    assert {kind for _, kind in llm.injected} == set(LLM_FAULTS)  # every kind was drawn
    assert {kind for _, kind in faulty.injected} == set(STORE_FAULTS)
    stops = {stop for stop, _, _ in outcomes}
    assert {"llm_error", "store_error"} <= stops and any(not degraded for _, degraded, _ in outcomes)
    # the same seed gives the same faults, the same outcomes, in both APIs
    again, _, _ = _mixed_run(store, "sync")
    assert again == outcomes
    asynced, _, _ = _mixed_run(store, "async")
    assert asynced == outcomes


# ---------------------------------------------------------------- the same faults over real HTTP


def _client(srv: LoopbackLLM, **options: Any) -> OpenAICompatible:
    settings: dict[str, Any] = {"model": "m", "timeout": 5.0, "backoff": 0.0, "max_retries": 2}
    settings.update(options)
    return OpenAICompatible(base_url=srv.base_url, **settings)


def test_http_429_with_retry_after_zero_is_retried_and_recovers(store: InMemoryStore, server: LoopbackLLM) -> None:
    server.queue(error(429, "slow down", {"Retry-After": "0"}))
    result = PGR(store, llm=_client(server), strategy="tot").retrieve(QUERY, scope=U1)
    assert not result.degraded
    assert server.count == result.trace.usage.llm_calls + 1  # one retry inside the client, one pgr call


def test_http_429_forever_degrades_after_the_clients_retries(store: InMemoryStore, server: LoopbackLLM) -> None:
    server.default = error(429, "slow down", {"Retry-After": "0"})
    result = PGR(store, llm=_client(server), strategy="tot").retrieve(QUERY, scope=U1)
    assert result.degraded and result.trace.stop_reason == "llm_error" and "HTTP 429" in result.trace.errors[0]
    assert server.count == 3 and set(result.ids) == query_hits(store)


def test_http_429_retry_after_beyond_the_deadline_gives_up_at_once(store: InMemoryStore, server: LoopbackLLM) -> None:
    server.default = error(429, "slow down", {"Retry-After": "30"})
    result = PGR(store, llm=_client(server), strategy="tot").retrieve(QUERY, scope=U1, budget=Budget(deadline_s=5))
    assert server.count == 1  # no 20-second wait (Retry-After capped at max_backoff), no second request
    assert result.degraded and "HTTP 429" in result.trace.errors[0]
    assert set(result.ids) == query_hits(store)


def test_http_500_forever_degrades(store: InMemoryStore, server: LoopbackLLM) -> None:
    server.default = error(500, "boom")
    llm = _client(server, structured="json_schema")  # no llama.cpp format fallback: 500 is an error here
    result = PGR(store, llm=llm, strategy="tot").retrieve(QUERY, scope=U1)
    assert result.degraded and "HTTP 500" in result.trace.errors[0] and server.count == 3
    assert set(result.ids) == query_hits(store)


def test_http_timeout_degrades(store: InMemoryStore, server: LoopbackLLM) -> None:
    server.default = Reply(200, {}, delay=1.5)
    result = PGR(store, llm=_client(server, timeout=0.2, max_retries=0), strategy="tot").retrieve(QUERY, scope=U1)
    assert result.degraded and "LLMTimeoutError" in result.trace.errors[0]
    assert set(result.ids) == query_hits(store)


def test_http_refused_connection_degrades(store: InMemoryStore) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    llm = OpenAICompatible(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=0)
    result = asyncio.run(PGR(store, llm=llm, strategy="tot").aretrieve(QUERY, scope=U1))
    assert result.degraded and "LLMConnectionError" in result.trace.errors[0]
    assert set(result.ids) == query_hits(store)


# ---------------------------------------------------------------- the harness itself


def test_the_harness_refuses_unknown_faults_and_rates() -> None:
    from pgr_core import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="unknown fault"):
        FaultyLLM(ScriptedLLM(), "gremlins")
    with pytest.raises(InvalidArgumentError, match="unknown fault"):
        FaultyStore(make_store(), "timeout_and_more")
    with pytest.raises(InvalidArgumentError, match="rate"):
        FaultyLLM(ScriptedLLM(), "timeout", rate=1.5)


def test_the_schedule_is_fixed_by_the_seed() -> None:
    def picks(seed: int) -> list[tuple[int, str]]:
        llm = FaultyLLM(ScriptedLLM(handler=lambda m, s: "{}"), LLM_FAULTS, rate=0.5, seed=seed)
        for _ in range(30):
            try:
                llm.complete([{"role": "user", "content": 'The user wrote:\n"x"'}], schema={"required": ["intent"]})
            except Exception:
                pass
        return llm.injected

    assert picks(1) == picks(1) and picks(1) != picks(2)
    assert 5 < len(picks(1)) < 25  # about half of 30 calls
