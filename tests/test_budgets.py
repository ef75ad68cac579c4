"""Budgets: caps on LLM calls, tokens and time, per call and per PGR instance, and the usage block.

No assertion here is on elapsed time: deadlines are shown to cut a call short by the order of events
(the call is still blocked when pgr returns), never by measuring seconds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import openai  # noqa: F401 - imported up front: the deadline tests below should not pay for the import
import pytest
from conftest import U1, ScriptedProspector, make_store
from loopback_llm import LoopbackLLM, Reply, Request, ok

from pgr_core import PGR, Budget, Completion, InMemoryStore, InvalidArgumentError, OpenAICompatible, PGRConfig
from pgr_core.models.llm import LLM
from pgr_core.models.llm import Usage as CallUsage
from pgr_core.testing import ScriptedLLM

QUERY = "Should I join a soccer league this summer?"
STEPS = ["knee physio running", "car bus", "money rent", "football Sam", "early weekends", "evening classes"]


def replies(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
    """A model whose rounds keep finding something new (so only a cap ends them early)."""
    required = (schema or {}).get("required", [])
    prompt = "\n".join(m.get("content", "") for m in messages)
    if "intent" in required:
        return {"intent": "decide whether to join a soccer league this summer"}
    if "nodes" in required or "steps" in required:  # one new step a round: the next after those listed
        step = STEPS[prompt.count("\n- id ") % len(STEPS)]
        key = "nodes" if "nodes" in required else "steps"
        return {key: [{"id": "a", "parent": None, "action": step, "dimension": "health"}]}
    if "summary" in required:
        return {"summary": "The knee injury matters most."}
    return "Wait until your knee heals."


@pytest.fixture
def store() -> InMemoryStore:
    return make_store()


def query_hits(store: InMemoryStore) -> set[str]:
    return set(PGR(store).query_only(QUERY, scope=U1).ids)


def pgr_with(store: InMemoryStore, llm: LLM, **options: Any) -> PGR:
    return PGR(store, llm=llm, strategy="tot", min_score=0.1, delta=0, **options)  # δ = 0: rounds never dry up


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_llm_calls": -1}, "max_llm_calls"),
        ({"max_llm_calls": 2.5}, "max_llm_calls"),
        ({"max_llm_calls": True}, "max_llm_calls"),
        ({"max_tokens": -10}, "max_tokens"),
        ({"max_tokens": "1000"}, "max_tokens"),
        ({"deadline_s": 0}, "deadline_s"),
        ({"deadline_s": -1.0}, "deadline_s"),
        ({"deadline_s": float("nan")}, "deadline_s"),
        ({"deadline_s": float("inf")}, "deadline_s"),
        ({"deadline_s": "5s"}, "deadline_s"),
    ],
)
def test_bad_budget_values_raise_invalid_argument_naming_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"Budget.{named}"):
        Budget(**fields)


def test_budget_arguments_are_checked_before_anything_runs(store: InMemoryStore) -> None:
    llm = ScriptedLLM(handler=replies)
    with pytest.raises(InvalidArgumentError, match="unknown budget key"):
        pgr_with(store, llm).retrieve(QUERY, scope=U1, budget={"max_calls": 1})
    with pytest.raises(InvalidArgumentError, match="must be a Budget"):
        pgr_with(store, llm).retrieve(QUERY, scope=U1, budget=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="must be a Budget"):
        PGR(store, budget="cheap")
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        PGR(store, budget={"max_tokens": -1})
    assert llm.calls == []


def test_a_call_budget_only_tightens_the_instance_budget() -> None:
    instance = Budget(max_llm_calls=3, deadline_s=10)
    assert instance.tightened(Budget(max_llm_calls=10)) == Budget(max_llm_calls=3, deadline_s=10)
    assert instance.tightened(Budget(max_llm_calls=1, max_tokens=500)) == Budget(1, 500, 10)
    assert instance.tightened(None) is instance
    assert Budget().unlimited and not instance.unlimited
    assert PGRConfig(budget={"max_llm_calls": 2}).budget == Budget(max_llm_calls=2)


# ---------------------------------------------------------------- caps on calls and tokens


def test_no_budget_runs_to_its_own_stop(store: InMemoryStore) -> None:
    llm = ScriptedLLM(handler=replies)
    result = pgr_with(store, llm, max_rounds=2).retrieve(QUERY, scope=U1)
    assert result.trace.stop_reason == "max_rounds" and result.trace.budget_hit is None
    assert result.trace.budget is None and len(llm.calls) == 5  # augment, initial, 2 revisions, summary


def test_zero_llm_calls_gives_the_query_hits_and_names_the_cap(store: InMemoryStore) -> None:
    llm = ScriptedLLM(handler=replies)
    result = pgr_with(store, llm).retrieve(QUERY, scope=U1, budget=Budget(max_llm_calls=0))
    trace = result.trace
    assert llm.calls == [] and trace.usage.llm_calls == 0
    assert set(result.ids) == query_hits(store)
    assert trace.stop_reason == "budget_llm_calls" and trace.budget_hit == "budget_llm_calls"
    assert trace.budget_phase == "augment" and trace.budget == {"max_llm_calls": 0}
    assert not result.degraded and not trace.errors and result.summary  # a budget stop is no failure


@pytest.mark.parametrize("cap", [1, 2, 3])
def test_llm_call_cap_is_never_exceeded(store: InMemoryStore, cap: int) -> None:
    llm = ScriptedLLM(handler=replies)
    result = pgr_with(store, llm, max_rounds=5).retrieve(QUERY, scope=U1, budget=Budget(max_llm_calls=cap))
    assert len(llm.calls) == result.trace.usage.llm_calls == cap
    assert result.trace.stop_reason == "budget_llm_calls"
    assert query_hits(store) <= set(result.ids)
    if cap >= 2:  # the Phase-1 step was probed: its facts are kept
        assert {"s1:0", "s1:1"} <= set(result.ids)


def test_repairs_and_failed_calls_count_toward_the_cap(store: InMemoryStore) -> None:
    llm = ScriptedLLM([{"intent": "x"}, "not json", {"nodes": [{"id": "a", "action": "knee physio running"}]}])
    llm.handler = replies
    result = pgr_with(store, llm).retrieve(QUERY, scope=U1, budget=Budget(max_llm_calls=3))
    assert result.trace.repairs == 1 and len(llm.calls) == 3
    assert result.trace.stop_reason == "budget_llm_calls" and result.trace.budget_phase == "personalized"


def test_token_cap_holds_and_names_the_cap(store: InMemoryStore) -> None:
    unlimited = pgr_with(store, ScriptedLLM(handler=replies), max_rounds=3).retrieve(QUERY, scope=U1)
    per_call = unlimited.trace.usage_by_phase
    cap = per_call["augment"].total_tokens + per_call["initial"].total_tokens + 400 + 200  # room for two calls
    llm = ScriptedLLM(handler=replies)
    result = pgr_with(store, llm, max_rounds=3).retrieve(QUERY, scope=U1, budget=Budget(max_tokens=cap))
    assert result.trace.usage.total_tokens <= cap
    assert len(llm.calls) == 2 and result.trace.stop_reason == "budget_tokens"
    assert result.trace.budget_hit == "budget_tokens" and query_hits(store) <= set(result.ids)


def test_a_call_that_would_not_fit_is_not_started(store: InMemoryStore) -> None:
    # the augment call may take 160 completion tokens on top of its prompt: a cap of 100 refuses it
    llm = ScriptedLLM(handler=replies)
    result = pgr_with(store, llm).retrieve(QUERY, scope=U1, budget=Budget(max_tokens=100))
    assert llm.calls == [] and result.trace.budget_hit == "budget_tokens"
    assert set(result.ids) == query_hits(store)


def test_the_instance_budget_applies_to_every_call_and_a_call_cannot_loosen_it(store: InMemoryStore) -> None:
    llm = ScriptedLLM(handler=replies)
    pgr = pgr_with(store, llm, max_rounds=5, budget=Budget(max_llm_calls=2))
    first = pgr.retrieve(QUERY, scope=U1)
    second = pgr.retrieve(QUERY, scope=U1, budget=Budget(max_llm_calls=50))
    tighter = pgr.retrieve(QUERY, scope=U1, budget={"max_llm_calls": 1})
    assert [r.trace.usage.llm_calls for r in (first, second, tighter)] == [2, 2, 1]
    assert second.trace.budget == {"max_llm_calls": 2} and tighter.trace.budget == {"max_llm_calls": 1}


def test_async_obeys_the_same_caps(store: InMemoryStore) -> None:
    llm = ScriptedLLM(handler=replies)
    result = asyncio.run(pgr_with(store, llm).aretrieve(QUERY, scope=U1, budget=Budget(max_llm_calls=2)))
    sync = pgr_with(store, ScriptedLLM(handler=replies)).retrieve(QUERY, scope=U1, budget=Budget(max_llm_calls=2))
    assert len(llm.calls) == 2 and result.trace.stop_reason == "budget_llm_calls"
    assert result.ids == sync.ids


# ---------------------------------------------------------------- answer() keeps room for its answer


def test_answer_reserves_its_call(store: InMemoryStore) -> None:
    llm = ScriptedLLM(handler=replies)
    answer = pgr_with(store, llm).answer(QUERY, scope=U1, budget=Budget(max_llm_calls=2))
    assert answer.text == "Wait until your knee heals." and not answer.degraded
    assert len(llm.calls) == 2 and llm.calls[-1].schema is None  # one for retrieval, one for the answer
    assert answer.retrieval.trace.budget_hit == "budget_llm_calls"


def test_answer_without_room_is_empty_and_says_why(store: InMemoryStore) -> None:
    llm = ScriptedLLM(handler=replies)
    answer = pgr_with(store, llm).answer(QUERY, scope=U1, budget=Budget(max_llm_calls=0))
    assert llm.calls == [] and answer.text == "" and answer.degraded
    assert answer.error and answer.error.startswith("budget_llm_calls")
    assert {f.id for f in answer.facts} == query_hits(store)


# ---------------------------------------------------------------- the deadline


class BlockedLLM(LLM):
    """Answers only once released; takes no timeout, so pgr can only abandon it."""

    def __init__(self) -> None:
        self.started, self.release, self.finished = threading.Event(), threading.Event(), threading.Event()

    def complete(self, messages: Any, *, schema: Any = None, max_tokens: int = 512, temperature: float = 0.0):  # type: ignore[override]
        self.started.set()
        self.release.wait(30)
        self.finished.set()
        return Completion('{"intent": "late"}', CallUsage(10, 5))


def test_the_deadline_abandons_a_blocked_call(store: InMemoryStore) -> None:
    llm = BlockedLLM()
    try:
        result = PGR(store, llm=llm, strategy="tot").retrieve(QUERY, scope=U1, budget=Budget(deadline_s=0.5))
        returned_while_blocked = llm.started.is_set() and not llm.finished.is_set()
    finally:
        llm.release.set()
    assert returned_while_blocked
    trace = result.trace
    assert trace.stop_reason == "deadline" and trace.budget_hit == "deadline" and trace.budget_phase == "augment"
    assert not result.degraded and set(result.ids) == query_hits(store)
    assert trace.usage.llm_calls == 1  # the abandoned call is billed


def test_the_deadline_abandons_a_blocked_await(store: InMemoryStore) -> None:
    llm = BlockedLLM()

    async def main() -> tuple[Any, bool]:
        result = await PGR(store, llm=llm, strategy="tot").aretrieve(QUERY, scope=U1, budget=Budget(deadline_s=0.5))
        blocked = llm.started.is_set() and not llm.finished.is_set()
        llm.release.set()  # before asyncio.run waits for its worker threads
        return result, blocked

    result, returned_while_blocked = asyncio.run(main())
    assert returned_while_blocked
    assert result.trace.stop_reason == "deadline" and set(result.ids) == query_hits(store)


@pytest.fixture
def gated_server() -> Iterator[tuple[LoopbackLLM, threading.Event]]:
    gate = threading.Event()

    def held(request: Request) -> Reply:
        gate.wait(10)
        return ok('{"intent": "late"}')

    srv = LoopbackLLM().start()
    srv.default = held
    try:
        yield srv, gate
    finally:
        gate.set()
        srv.stop()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_deadline_is_the_http_clients_timeout(
    store: InMemoryStore, gated_server: tuple[LoopbackLLM, threading.Event], mode: str
) -> None:
    srv, gate = gated_server
    llm = OpenAICompatible(base_url=srv.base_url, model="m", timeout=30, max_retries=0)
    pgr = PGR(store, llm=llm, strategy="tot")
    budget = Budget(deadline_s=1.0)
    if mode == "sync":
        result = pgr.retrieve(QUERY, scope=U1, budget=budget)
    else:
        result = asyncio.run(pgr.aretrieve(QUERY, scope=U1, budget=budget))
    assert not gate.is_set() and srv.count == 1  # pgr returned while the server still held the request
    assert result.trace.stop_reason == "deadline" and not result.degraded
    assert set(result.ids) == query_hits(store)


def test_the_deadline_also_ends_llm_free_rounds(store: InMemoryStore) -> None:
    class SlowStore(type(store)):  # type: ignore[misc]
        def search_batch(self, probes, *, scope, params):  # type: ignore[override]
            time.sleep(0.1)  # longer than the deadline, so the deadline has passed once Phase 1 is done
            return super().search_batch(probes, scope=scope, params=params)

    slow = SlowStore(embedder=store.embedder)
    slow.add_facts(store.facts)
    prospector = ScriptedProspector([["knee physio running"], ["car bus"], ["money rent"]])
    result = PGR(slow, strategy=prospector, delta=0, min_score=0.1).retrieve(
        QUERY, scope=U1, budget=Budget(deadline_s=0.05)
    )
    assert result.trace.stop_reason == "deadline" and result.trace.budget_phase == "personalized"
    assert [r.phase for r in result.trace.rounds] == ["initial"] and prospector.calls == 1


# ---------------------------------------------------------------- usage per phase


def test_usage_reports_calls_tokens_and_time_per_phase(store: InMemoryStore) -> None:
    llm = ScriptedLLM(handler=replies)
    answer = pgr_with(store, llm, max_rounds=1).answer(QUERY, scope=U1)
    trace = answer.retrieval.trace
    by_phase = trace.usage_by_phase
    assert set(by_phase) == {"augment", "initial", "personalized", "summary", "answer"}
    assert sum(u.llm_calls for u in by_phase.values()) == trace.usage.llm_calls == len(llm.calls) == 5
    assert sum(u.store_calls for u in by_phase.values()) == trace.usage.store_calls == trace.store_calls == 3
    assert sum(u.total_tokens for u in by_phase.values()) == trace.usage.total_tokens > 0
    expected = sum(CallUsage.estimate(c.messages, "").prompt_tokens for c in llm.calls)
    assert trace.usage.prompt_tokens == expected  # ScriptedLLM counts characters / 4
    assert all(u.seconds >= 0 and u.store_seconds >= 0 for u in by_phase.values())
    assert answer.retrieval.usage is trace.usage
    block = trace.to_dict()
    assert block["usage"]["total_tokens"] == trace.usage.total_tokens
    assert block["usage_by_phase"]["initial"]["store_calls"] == 1
    assert set(block["seconds_by_phase"]) >= {"augment", "initial", "personalized", "summary", "answer"}


def test_readme_budget_example_runs(store: InMemoryStore, capsys: pytest.CaptureFixture[str]) -> None:
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "concepts.md").read_text(encoding="utf-8")
    section = doc[doc.index("### Budgets and failures") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None
    llm = ScriptedLLM(handler=replies)
    exec(code.group(1), {"store": store, "llm": llm})
    # augment lookup, Phase 1, one Phase-2 round that adds fewer than δ facts; four LLM calls fit the caps
    assert capsys.readouterr().out.split() == ["delta_below_threshold", "None", "4", "3"]
    assert len(llm.calls) == 4
