"""Tenant integrity where stores are shared: the embedding cache tells no caller what another asked,
records whose owner is a list (or any non-string) are dropped and counted while the search goes on,
and dates read from a framework's store (naive next to aware) never fail a dated query.

Runs in the default suite: the mem0 adapter is driven through a mem0-like memory (the adapter imports
no mem0), the Qdrant ones live in tests/adapters/test_adapter_qdrant.py.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from conftest import U1, U2, ScriptedProspector, make_store
from pgr_adapters.mem0._records import fact_from_item, owner_of, parse_when
from pgr_adapters.mem0.store import Mem0Store

from pgr_core import PGR, HashingEmbedder, Scope, SearchParams
from pgr_core._dates import as_utc, read_date, read_stored_date
from pgr_core.models.caches import CachedEmbedder, counting_embeddings
from pgr_core.testing import ScriptedLLM

QUERY = "Should I join a soccer league this summer?"
ALICE, BOB = Scope(user_id="alice"), Scope(user_id="bob")
ROUNDS_SCRIPT = [["knee physio running", "evening classes weeknights"], ["car bus ride"], ["money rent tight"]]


def _usage(result: Any) -> dict[str, Any]:
    """The counts of a call's usage (its times left out: they vary run to run)."""
    return {k: v for k, v in result.trace.usage.to_dict().items() if "seconds" not in k}


# ====================================================================== the embedding cache


def test_a_cache_hit_is_never_reported_across_scopes() -> None:
    store = make_store()

    def pgr(over: Any = store) -> PGR:  # a fresh script per call: every call probes the same texts
        return PGR(over, strategy=ScriptedProspector(ROUNDS_SCRIPT), delta=0, min_score=0.1)

    u2_alone = pgr(make_store()).retrieve(QUERY, scope=U2)  # U2's call on a cache nobody else filled
    u1 = pgr().retrieve(QUERY, scope=U1)
    u2 = pgr().retrieve(QUERY, scope=U2)  # the very texts U1 has just asked
    assert u1.facts and u2.facts and all(f.fact.scope == U2 for f in u2.facts)
    assert u2.trace.usage.embed_cache_hits == u2_alone.trace.usage.embed_cache_hits
    assert _usage(u2) == _usage(u2_alone)  # hits, texts, calls: nothing says U1 asked first
    again = pgr().retrieve(QUERY, scope=U1)
    assert again.trace.usage.embed_calls == 0 and again.trace.usage.embed_cache_hits > 0  # its own entries


def test_the_cache_serves_each_scope_only_what_that_scope_filled() -> None:
    inner = HashingEmbedder()
    cached = CachedEmbedder(inner)
    with counting_embeddings() as alice:
        alice.scope = ALICE
        cached.embed(["my knee hurts"])
        cached.embed(["my knee hurts"])
    with counting_embeddings() as bob:
        bob.scope = BOB
        vector = cached.embed(["my knee hurts"])
    assert (alice.calls, alice.texts, alice.hits) == (1, 1, 1)
    assert (bob.calls, bob.texts, bob.hits) == (1, 1, 0)  # embedded afresh, not served alice's entry
    assert (vector == inner.embed(["my knee hurts"])).all()  # the same vector all the same


def test_concurrent_scopes_asking_one_text_each_see_only_their_own_hits() -> None:
    store = make_store()

    async def ask(scope: Scope) -> Any:
        pgr = PGR(store, strategy=ScriptedProspector(ROUNDS_SCRIPT), delta=0, min_score=0.1)
        return await pgr.aretrieve(QUERY, scope=scope)

    async def both() -> list[Any]:
        return list(await asyncio.gather(ask(U1), ask(U2)))

    first = asyncio.run(both())
    assert _usage(first[0]) == _usage(first[1])  # neither was served the other's embeddings


# ====================================================================== a mem0-like memory


class Mem0Like:
    """A duck-typed mem0 2.x ``Memory`` over a list of records: ``search`` filters owners the way
    Qdrant's keyword match does (a list matches by any element) and scores by shared words."""

    def __init__(self, records: Sequence[Mapping[str, Any]]) -> None:
        self.records = [dict(r) for r in records]

    def search(
        self,
        query: str,
        *,
        top_k: int = 20,
        filters: Mapping[str, Any] | None = None,
        threshold: float = 0.1,
        rerank: bool = False,
    ) -> dict[str, Any]:
        words = set(re.findall(r"\w+", query.lower()))

        def matches(record: Mapping[str, Any]) -> bool:
            for key, wanted in (filters or {}).items():
                value = record.get(key)
                if value != wanted and not (isinstance(value, list) and wanted in value):
                    return False
            return True

        scored = []
        for record in filter(matches, self.records):
            theirs = set(re.findall(r"\w+", record["memory"].lower()))
            score = len(words & theirs) / max(len(words | theirs), 1)
            if score >= (threshold or 0.0):
                scored.append({**record, "score": score})
        return {"results": sorted(scored, key=lambda r: -r["score"])[:top_k]}

    def add(self, messages: Any, **kwargs: Any) -> dict[str, Any]:
        raise AssertionError("the read path never writes")


def _record(i: int, owner: Any, text: str, created_at: str | None = None, key: str = "user_id") -> dict[str, Any]:
    return {"id": f"m{i}", "memory": text, key: owner, "created_at": created_at, "metadata": {"type": "turn"}}


def test_a_list_owner_record_is_dropped_and_counted_and_the_rest_returned() -> None:
    memory = Mem0Like(
        [
            _record(0, ["alice", "bob"], "knee physio soccer league summer"),  # the best match, both owners
            _record(1, "alice", "my knee hurts after soccer"),
            _record(2, "bob", "bob plays in a soccer league"),
            _record(3, 7, "soccer league numbers"),  # a number: nobody's
            _record(4, "alice", "soccer shoes for the summer", key="user_id") | {"run_id": ["r1", "r2"]},
        ]
    )
    store = Mem0Store(memory, strategy="feedback", min_score=0.0)
    for scope, mine in ((ALICE, {"m1"}), (BOB, {"m2"})):
        result = store.pgr.retrieve(QUERY, scope=scope)
        assert not result.degraded and result.trace.stop_reason != "store_error"
        assert {f.fact.id for f in result.facts} == mine
    assert store.out_of_scope_dropped > 0
    before = store.out_of_scope_dropped
    hits = store._checked_search(["knee physio soccer league summer"], ALICE, SearchParams(top_k=5, min_score=0.0))
    assert [h.fact.id for h in hits[0]] == ["m1"]  # m2 and m3 filtered out by mem0, m0 and m4 by pgr:
    assert store.out_of_scope_dropped == before + 2  # the list owner and the list run_id, counted
    # the drop-in search answers too, as mem0 would, without the ambiguous record
    answer = store.search(QUERY, filters={"user_id": "alice"}, top_k=5, threshold=0.0)
    assert [r["id"] for r in answer["results"]] == ["m1"]


def test_owner_ids_are_read_only_as_plain_strings() -> None:
    assert owner_of({"user_id": "alice", "run_id": ""}) == ALICE  # a blank id names nothing
    assert owner_of({"user_id": ["alice", "bob"]}) is None
    assert owner_of({"user_id": "alice", "agent_id": {"id": "x"}}) is None
    assert owner_of({"user_id": 42}) is None
    assert fact_from_item({"id": "m", "memory": "t", "user_id": ["alice"]}) is None


# ====================================================================== dates read from a framework's store


def test_a_naive_stored_date_is_read_as_utc_and_an_aware_one_keeps_its_offset() -> None:
    paris = timezone(timedelta(hours=2))
    assert read_stored_date("2025-03-01T10:00:00") == datetime(2025, 3, 1, 10, tzinfo=UTC)
    assert read_stored_date("2025-03-01T10:00:00+02:00").utcoffset() == timedelta(hours=2)
    assert read_stored_date(datetime(2025, 3, 1, tzinfo=paris)) == datetime(2025, 3, 1, tzinfo=paris)
    assert [read_stored_date(v) for v in (None, "", "last Tuesday", True)] == [None] * 4
    assert as_utc(datetime(2025, 1, 1)) == datetime(2025, 1, 1, tzinfo=UTC)
    assert read_date("2025-03-01T10:00:00") == datetime(2025, 3, 1, 10)  # the lenient reader itself is unchanged
    assert parse_when("2025-01-07T00:00:00") == datetime(2025, 1, 7, tzinfo=UTC)


def _dated_llm() -> ScriptedLLM:
    """An intent, one round of steps, a summary: enough for every prompt that shows a fact's age."""
    rounds = iter([["knee physio"], ["soccer league"], []] * 4)

    def handler(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        props = (schema or {}).get("properties", {})
        if "intent" in props:
            return {"intent": "decide whether to play soccer in a summer league"}
        if "steps" in props:
            return {"steps": [{"action": t, "dimension": "health"} for t in next(rounds)]}
        return {"summary": "the knee and the league"}

    return ScriptedLLM(handler=handler)


MIXED = [
    _record(0, "alice", "my knee hurts after soccer", "2025-03-01T09:30:00"),  # naive, as an app passed it
    _record(1, "alice", "the physio said no soccer league until July", "2025-03-02T09:30:00-08:00"),  # mem0's own
    _record(2, "alice", "knee physio twice a week", "2025-03-03T10:00:00Z"),
    _record(3, "alice", "soccer league summer schedule", None),
]


@pytest.mark.parametrize(
    "date",
    ["2025-05-01", datetime(2025, 5, 1), datetime(2025, 5, 1, tzinfo=UTC), "2025-05-01T12:00:00+09:00"],
    ids=["naive-text", "naive", "aware-utc", "aware-tokyo"],
)
@pytest.mark.parametrize("strategy", ["feedback", "cot"])
def test_mixed_naive_and_aware_mem0_dates_answer_either_kind_of_query_date(date: Any, strategy: str) -> None:
    store = Mem0Store(Mem0Like(MIXED), llm=_dated_llm() if strategy == "cot" else None)
    pgr = PGR(store, llm=store.llm, strategy=strategy, min_score=0.0, delta=1)
    result = pgr.retrieve(QUERY, scope=ALICE, date=date)
    assert not result.degraded and not result.trace.errors
    assert {f.fact.id for f in result.facts} == {"m0", "m1", "m2", "m3"}
    dates = {f.fact.id: f.fact.date for f in result.facts}
    assert dates["m0"] == datetime(2025, 3, 1, 9, 30, tzinfo=UTC) and dates["m3"] is None
    assert all(d is None or d.utcoffset() is not None for d in dates.values())  # every one aware
    assert result.trace.date is not None and result.trace.date.startswith("2025-05-01")


def test_the_embedded_store_still_refuses_a_query_date_of_the_other_kind() -> None:
    # the rule "naive means UTC" is for dates read from a framework's store, never for pgr's own store
    from pgr_core.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="timezone-aware"):
        PGR(make_store(), strategy="feedback").retrieve(QUERY, scope=U1, date=datetime(2025, 5, 1, tzinfo=UTC))
