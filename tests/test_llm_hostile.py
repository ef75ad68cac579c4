"""The LLM boundary against hostile replies: nothing a model or server sends crashes the caller,
outlives its deadline, fills memory, skews the token budget or floods the store.

Each fault kind is one test (or one parametrized case), through the public entry points: PGR.retrieve,
aretrieve, answer, aanswer, Ingestor.ingest, Consolidator.consolidate and the CLI, over the real
loopback HTTP server (tests/loopback_llm.py) or the scripted LLM behind FaultyLLM. Timings are bounds,
never tight: a 2 s deadline must end the call in under 10 s (before the fix: over 40 s).
"""

from __future__ import annotations

import asyncio
import json
import time
import tracemalloc
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import openai  # noqa: F401 - imported up front so no timing below includes the import
import pytest
from conftest import U1, make_store
from loopback_llm import LoopbackLLM, Reply, Request, ok, sane, sane_reply

from pgr_core import PGR, Budget, HashingEmbedder, InMemoryStore, OpenAICompatible, RetrievalResult, Scope
from pgr_core.cli.main import main
from pgr_core.errors import InvalidArgumentError, LLMOutputError, LLMTimeoutError
from pgr_core.models.llm import MAX_JSON_DEPTH, MAX_USAGE_TOKENS, Usage, parse_json, plausible_usage
from pgr_core.testing import ScriptedLLM
from pgr_core.testing.faults import HOSTILE_FAULTS, FaultyLLM
from pgr_core.types import Fact
from pgr_core.write import Consolidator, Ingestor, Session, Turn
from pgr_core.write.extract import MAX_FACTS_PER_SESSION, extract
from pgr_core.write.guideline import DEFAULT_GUIDELINE

QUERY = "Should I join a soccer league this summer?"
MESSAGES = [{"role": "user", "content": "Where did I park the car on Tuesday?"}]
DEEP = "[" * 1000 + "]" * 1000  # about 2 KB, a RecursionError in json.loads
HUGE_INT = "9" * 5000  # past Python's 4,300-digit limit: a ValueError in json.loads
BOUND_S = 10.0  # a call with a 2 s deadline (or timeout) ends well within this


@pytest.fixture
def store() -> Iterator[InMemoryStore]:
    store = make_store()
    before = [(f.id, f.text) for f in store.facts]
    yield store
    assert [(f.id, f.text) for f in store.facts] == before, "a hostile reply changed the store"


def client(srv: LoopbackLLM, **options: Any) -> OpenAICompatible:
    settings: dict[str, Any] = {"model": "m", "timeout": 30.0, "backoff": 0.0, "max_retries": 0}
    settings.update(options)
    return OpenAICompatible(base_url=srv.base_url, **settings)


def query_hits(store: InMemoryStore) -> set[str]:
    return set(PGR(store).query_only(QUERY, scope=U1, top_k=20).ids)


def run(pgr: PGR, mode: str, **kwargs: Any) -> RetrievalResult:
    if mode == "async":
        return asyncio.run(pgr.aretrieve(QUERY, scope=U1, **kwargs))
    return pgr.retrieve(QUERY, scope=U1, **kwargs)


def assert_unusable_then_degraded(result: RetrievalResult, store: InMemoryStore, fragment: str) -> None:
    """One repair retry, then pgr stops asking: degraded, the query's own hits, the reason named."""
    trace = result.trace
    assert result.degraded and trace.stop_reason == "llm_error"
    assert trace.unusable_outputs == 2 and trace.repairs == 1
    assert set(result.ids) == query_hits(store)
    assert "LLMOutputError" in trace.errors[0] and fragment in trace.errors[0], trace.errors


# ---------------------------------------------------------------- hostile JSON from the model (FaultyLLM)

UNUSABLE = {
    "deep_nesting": "levels deep",
    "huge_integer": "not usable JSON",
    "nan_constant": "not usable JSON",
    "null_field": "is null",
    "wrong_types": "should be",
    "oversized_reply": "characters, more than",
}
assert set(UNUSABLE) | {"huge_list"} == set(HOSTILE_FAULTS)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("fault", list(UNUSABLE))
def test_each_hostile_reply_is_unusable_output_and_retrieval_degrades(
    store: InMemoryStore, fault: str, mode: str
) -> None:
    llm = FaultyLLM(ScriptedLLM(handler=sane), fault)
    result = run(PGR(store, llm=llm, strategy="tot", min_score=0.1), mode)
    assert {kind for _, kind in llm.injected} == {fault}
    assert_unusable_then_degraded(result, store, UNUSABLE[fault])


def test_a_reply_with_100000_steps_is_read_only_up_to_the_step_cap(store: InMemoryStore) -> None:
    llm = FaultyLLM(ScriptedLLM(handler=sane), "huge_list")
    result = PGR(store, llm=llm, strategy="cot", min_score=0.1).retrieve(QUERY, scope=U1)
    assert not result.degraded and query_hits(store) <= set(result.ids)
    assert all(len(r.steps) <= 12 for r in result.trace.rounds)  # 2 x n_steps read of 100,000
    assert all(len(r.probes) <= 10 for r in result.trace.rounds)  # the request, q_A and at most 8 steps


def test_answer_after_hostile_retrieval_replies_still_answers(store: InMemoryStore) -> None:
    # the planning calls get 1,000-deep JSON; the answer call (plain text) is left alone
    llm = FaultyLLM(ScriptedLLM(handler=sane), "deep_nesting", calls={0, 1})
    answer = PGR(store, llm=llm, strategy="tot").answer(QUERY, scope=U1)
    assert answer.retrieval.degraded and answer.text == "Wait until your knee heals."
    assert "levels deep" in answer.retrieval.trace.errors[0]


# ---------------------------------------------------------------- hostile JSON over HTTP


def test_deeply_nested_content_over_http_degrades_sync_and_async(store: InMemoryStore, server: LoopbackLLM) -> None:
    server.default = ok('{"nodes": ' + DEEP + "}")
    pgr = PGR(store, llm=client(server), strategy="tot", min_score=0.1)
    assert_unusable_then_degraded(pgr.retrieve(QUERY, scope=U1), store, "levels deep")
    assert_unusable_then_degraded(asyncio.run(pgr.aretrieve(QUERY, scope=U1)), store, "levels deep")


def test_a_deeply_nested_envelope_is_unusable_output(store: InMemoryStore, server: LoopbackLLM) -> None:
    server.default = Reply(200, b'{"id": "x", "choices": ' + DEEP.encode() + b"}")
    result = PGR(store, llm=client(server), strategy="tot").retrieve(QUERY, scope=U1)
    assert result.degraded and "server's reply nests" in result.trace.errors[0]
    assert set(result.ids) == query_hits(store)


def test_a_huge_integer_in_the_envelope_is_unusable_output(server: LoopbackLLM) -> None:
    body = json.dumps(ok("{}").body).replace('"prompt_tokens": 11', f'"prompt_tokens": {HUGE_INT}')
    server.queue(Reply(200, body.encode()))
    with pytest.raises(LLMOutputError, match="not usable JSON"):
        client(server).complete(MESSAGES)


@pytest.mark.parametrize(
    "choices",
    [None, "none", [5], [{"message": "hi"}], [{"message": {"content": ["a", "list"]}}], [{"message": {"content": 7}}]],
    ids=["null-choices", "string-choices", "int-choice", "string-message", "list-content", "int-content"],
)
def test_a_wrong_typed_envelope_never_raises_past_llm_error(choices: Any, server: LoopbackLLM) -> None:
    body = {"id": "x", "model": "m", "choices": choices}
    server.default = Reply(200, body)
    llm = client(server)
    if choices is None:  # no choices at all reads as an empty reply, as before
        assert llm.complete(MESSAGES).text == ""
        return
    with pytest.raises(LLMOutputError, match="not a chat completion"):
        llm.complete(MESSAGES)


def test_a_non_json_200_body_is_unusable_output(store: InMemoryStore, server: LoopbackLLM) -> None:
    server.default = Reply(200, b"<html>502 Bad Gateway</html>")
    result = asyncio.run(PGR(store, llm=client(server), strategy="tot").aretrieve(QUERY, scope=U1))
    assert result.degraded and "not valid JSON" in result.trace.errors[0]


def test_the_cli_prints_a_degraded_result_for_a_hostile_server(
    server: LoopbackLLM, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.pgr"
    make_store(HashingEmbedder()).save(path)
    server.default = ok('{"intent": ' + HUGE_INT + "}")
    args = ["retrieve", QUERY, "--store", str(path), "--user", "u1", "--embedder", "hashing"]
    code = main([*args, "--base-url", server.base_url, "--model", "m", "--strategy", "tot", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trace"]["degraded"] is True and out["facts"]
    assert any("not usable JSON" in e for e in out["trace"]["errors"])


# ---------------------------------------------------------------- huge replies: cut off unread


def _spaces(total: int, chunk: int = 1 << 16) -> Any:
    def chunks() -> Iterator[bytes]:
        for _ in range(total // chunk):
            yield b" " * chunk

    return chunks


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "no-content-length"])
def test_a_49_mb_reply_is_cut_off_without_reading_it(
    store: InMemoryStore, server: LoopbackLLM, announced: bool
) -> None:
    size = 49 << 20
    server.default = Reply(200, stream=_spaces(size), length=size if announced else None)
    pgr = PGR(store, llm=client(server), strategy="tot")
    tracemalloc.start()
    try:
        result = pgr.retrieve(QUERY, scope=U1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20  # before: 720 MB; the cap is 1 MiB
    assert result.degraded and "cut off unread" in result.trace.errors[0]
    assert set(result.ids) == query_hits(store)
    assert all(sent < size for sent in server.sent)  # the client hung up long before the end


def test_answer_degrades_when_the_answer_reply_is_over_the_cap(store: InMemoryStore, server: LoopbackLLM) -> None:
    llm = client(server, max_reply_bytes=4096)
    answer_text = "knee " * 2000  # 10 KB of answer: over this client's 4 KiB cap

    def replies(request: Request) -> Reply:
        body = request.body or {}
        if body.get("response_format"):
            return sane_reply(request)
        return ok(answer_text)

    server.default = replies
    answer = PGR(store, llm=llm, strategy="tot").answer(QUERY, scope=U1)
    assert answer.degraded and answer.text == "" and "4,096 bytes" in (answer.error or "")
    assert not answer.retrieval.degraded


def test_max_reply_bytes_is_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="max_reply_bytes"):
        OpenAICompatible(base_url="http://127.0.0.1:9/v1", model="m", max_reply_bytes=0)


# ---------------------------------------------------------------- slow loris: the deadline holds


def _loris(headers: bool) -> Reply:
    return Reply(200, ok('{"intent": "x"}').body, trickle=0.5, trickle_headers=headers)


@pytest.mark.parametrize("headers", [False, True], ids=["body", "headers-and-body"])
def test_slow_loris_sync_retrieve_ends_at_the_deadline(
    store: InMemoryStore, server: LoopbackLLM, headers: bool
) -> None:
    server.default = _loris(headers)
    started = time.perf_counter()
    result = PGR(store, llm=client(server), strategy="tot").retrieve(QUERY, scope=U1, budget=Budget(deadline_s=2))
    assert time.perf_counter() - started < BOUND_S  # before: over 40 s
    assert result.trace.budget_hit == "deadline" and not result.degraded
    assert set(result.ids) == query_hits(store)


@pytest.mark.parametrize("headers", [False, True], ids=["body", "headers-and-body"])
def test_slow_loris_async_retrieve_ends_at_the_deadline(
    store: InMemoryStore, server: LoopbackLLM, headers: bool
) -> None:
    server.default = _loris(headers)
    started = time.perf_counter()
    pgr = PGR(store, llm=client(server), strategy="tot")
    result = asyncio.run(pgr.aretrieve(QUERY, scope=U1, budget=Budget(deadline_s=2)))
    assert time.perf_counter() - started < BOUND_S
    assert result.trace.budget_hit == "deadline" and set(result.ids) == query_hits(store)


def test_slow_loris_answer_ends_at_the_deadline(store: InMemoryStore, server: LoopbackLLM) -> None:
    server.default = _loris(False)
    started = time.perf_counter()
    answer = PGR(store, llm=client(server), strategy="tot").answer(QUERY, scope=U1, budget=Budget(deadline_s=2))
    assert time.perf_counter() - started < BOUND_S
    assert answer.degraded and answer.text == ""


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_slow_loris_without_a_deadline_is_bounded_by_the_client_timeout(server: LoopbackLLM, mode: str) -> None:
    server.default = _loris(True)
    llm = client(server, timeout=1.5)  # each attempt, whole: not reset by every trickled byte
    started = time.perf_counter()
    with pytest.raises(LLMTimeoutError, match=r"1\.5s"):
        if mode == "async":
            asyncio.run(llm.acomplete(MESSAGES))
        else:
            llm.complete(MESSAGES)
    assert time.perf_counter() - started < BOUND_S


# ---------------------------------------------------------------- usage counts: never believed blindly


@pytest.mark.parametrize(
    ("prompt", "completion"),
    [(-5, -5), (10**30, 10**30), ("12", 3.5), (True, None), (MAX_USAGE_TOKENS + 1, 1)],
    ids=["negative", "10^30", "string-and-fraction", "bool-and-null", "over-10^7"],
)
def test_implausible_usage_falls_back_to_the_estimate(server: LoopbackLLM, prompt: Any, completion: Any) -> None:
    body = ok('{"answer": "level 3"}').body
    body["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion}
    server.queue(Reply(200, body))
    usage = client(server).complete(MESSAGES).usage
    guess = Usage.estimate(MESSAGES, '{"answer": "level 3"}')
    assert usage.estimated is True
    assert 0 <= usage.prompt_tokens <= MAX_USAGE_TOKENS and 0 <= usage.completion_tokens <= MAX_USAGE_TOKENS
    assert usage.prompt_tokens == guess.prompt_tokens or usage.completion_tokens == guess.completion_tokens


def test_plausible_usage_is_believed_and_each_count_checked_apart() -> None:
    assert plausible_usage(40, 20, MESSAGES, "x" * 80, max_tokens=64) == Usage(40, 20)
    mixed = plausible_usage(40, -1, MESSAGES, "x" * 80)
    assert mixed == Usage(40, 20, estimated=True)
    assert plausible_usage(3 * 10**6, 0, MESSAGES, "").prompt_tokens == Usage.estimate(MESSAGES, "").prompt_tokens


@pytest.mark.parametrize("reported", [-5, 10**30], ids=["negative", "10^30"])
def test_reported_usage_cannot_defeat_or_exhaust_max_tokens(
    store: InMemoryStore, server: LoopbackLLM, reported: int
) -> None:
    def lying(request: Request) -> Reply:
        reply = sane_reply(request)
        reply.body["usage"] = {"prompt_tokens": reported, "completion_tokens": reported}
        return reply

    def silent(request: Request) -> Reply:
        reply = sane_reply(request)
        del reply.body["usage"]  # no usage: pgr counts its estimate
        return reply

    budget = Budget(max_tokens=4000)
    server.default = silent
    honest = PGR(store, llm=client(server), strategy="tot").retrieve(QUERY, scope=U1, budget=budget)
    server.default = lying
    result = PGR(store, llm=client(server), strategy="tot").retrieve(QUERY, scope=U1, budget=budget)
    assert result.trace.usage.llm_calls == honest.trace.usage.llm_calls  # -5 buys no extra calls, 10^30 stops none
    assert 0 < result.trace.usage.total_tokens <= 4000
    assert result.trace.usage.total_tokens == honest.trace.usage.total_tokens


# ---------------------------------------------------------------- extraction: bounded, shapes checked

U = Scope(user_id="u1")
SESSION = Session(
    "s1",
    "2025-03-02",
    [Turn("user", "I hurt my knee playing basketball last week"), Turn("user", "the physio said no running")],
)


def _many_facts(n: int) -> str:
    kind = DEFAULT_GUIDELINE.type_names[0]
    facts = [{"text": f"f{i}", "type": kind} for i in range(n)]
    return json.dumps({"facts": facts}, separators=(",", ":"))  # 100,000 of them: under MAX_REPLY_CHARS


def test_an_extraction_of_100000_facts_stores_the_cap_and_reports_the_cut() -> None:
    store = InMemoryStore(embedder=HashingEmbedder())
    report = Ingestor(store, llm=ScriptedLLM([_many_facts(100_000)])).ingest([SESSION], scope=U)
    assert report.ingested == 1 and report.raw_fallback == 0
    assert report.facts_added == MAX_FACTS_PER_SESSION == len(store.facts) == 50  # not 100,000
    assert report.facts_cut == 100_000 - 50 and report.to_dict()["facts_cut"] == 99_950


def test_the_fact_cap_is_configurable_on_the_ingestor_and_the_extractor() -> None:
    store = InMemoryStore(embedder=HashingEmbedder())
    ingestor = Ingestor(store, llm=ScriptedLLM([_many_facts(30)]))
    ingestor.max_facts = 10
    report = ingestor.ingest([SESSION], scope=U)
    assert report.facts_added == 10 and report.facts_cut == 20
    extraction = extract(ScriptedLLM([_many_facts(30)]), SESSION, DEFAULT_GUIDELINE, [], max_facts=25)
    assert len(extraction.facts) == 25 and extraction.cut == 5
    with pytest.raises(InvalidArgumentError, match="max_facts"):
        extract(ScriptedLLM([_many_facts(1)]), SESSION, DEFAULT_GUIDELINE, [], max_facts=0)


@pytest.mark.parametrize(
    "reply",
    [
        '{"facts": null}',
        '{"facts": "none"}',
        '{"facts": [null]}',
        '{"facts": [{"text": null, "type": "x"}]}',
        '{"facts": ' + DEEP + "}",
        '{"facts": [], "n": ' + HUGE_INT + "}",
    ],
    ids=["null-list", "string-list", "null-item", "null-text", "deep", "huge-integer"],
)
def test_a_hostile_extraction_reply_falls_back_to_raw_turns(reply: str) -> None:
    store = InMemoryStore(embedder=HashingEmbedder())
    report = Ingestor(store, llm=ScriptedLLM([reply, reply])).ingest([SESSION], scope=U)
    assert report.raw_fallback == 1 and report.failed == [] and report.facts_cut == 0
    assert {f.type for f in store.facts} == {"turn"} and len(store.facts) == 2  # the session's raw turns, whole


def test_extraction_over_http_with_a_deep_reply_falls_back_to_raw(server: LoopbackLLM) -> None:
    server.default = ok('{"facts": ' + DEEP + "}")
    store = InMemoryStore(embedder=HashingEmbedder())
    report = Ingestor(store, llm=client(server)).ingest([SESSION], scope=U)
    assert report.raw_fallback == 1 and server.count == 2 and len(store.facts) == 2


# ---------------------------------------------------------------- consolidation: a failed merge changes nothing


DAY = datetime(2025, 3, 1)


def _alike() -> InMemoryStore:
    store = InMemoryStore(embedder=HashingEmbedder())
    meta = {"frequency": 1, "sessions": ["s1"], "entities": [], "source": "extracted"}
    store.add_facts(
        [
            Fact(id="p1", text="The user is allergic to peanuts.", scope=U, type="Identity", date=DAY, metadata=meta),
            Fact(
                id="p2",
                text="The user is severely allergic to peanuts.",
                scope=U,
                type="Identity",
                date=DAY,
                metadata=meta,
            ),
        ]
    )
    return store


@pytest.mark.parametrize(
    "reply",
    ['{"text": ' + DEEP + "}", '{"text": ' + HUGE_INT + "}", '{"text": null}', '{"text": ["a"]}', '{"text": NaN}'],
    ids=["deep", "huge-integer", "null-text", "list-text", "nan"],
)
def test_a_hostile_merge_reply_leaves_the_cluster_as_it_was(reply: str) -> None:
    store = _alike()
    before = sorted((f.id, f.text) for f in store.facts)
    report = Consolidator(store, ScriptedLLM([reply]), threshold=0.7).consolidate(U)
    assert report.clusters == 1 and report.merged == 0 and len(report.failed) == 1
    assert sorted((f.id, f.text) for f in store.facts) == before


# ---------------------------------------------------------------- the bounded parser itself


def test_brackets_inside_strings_do_not_count_toward_the_depth() -> None:
    text = json.dumps({"answer": "[[[{{{" * 500 + '\\"]]]', "confidence": 1})
    assert parse_json(text)["confidence"] == 1
    nested = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert parse_json(nested) is not None
    with pytest.raises(LLMOutputError, match="65 levels deep"):
        parse_json("[" + nested + "]")


def test_pathological_quotes_and_escapes_are_refused_as_unusable_output() -> None:
    # (the depth scan is one pass over the text; how long it takes is benchmark matter, not asserted here)
    for text in ('"\\"' * 1_000_000, '"' * 3_000_001, "\\" * 3_000_000, "{" * 3_000_000):
        with pytest.raises(LLMOutputError):
            parse_json(text, {"type": "object"})


def test_required_keys_may_be_null_only_where_the_schema_says_so() -> None:
    schema = {
        "type": "object",
        "required": ["a", "b"],
        "properties": {"a": {"type": ["string", "null"]}, "b": {"type": "string"}, "c": {"type": "array"}},
    }
    assert parse_json('{"a": null, "b": "x", "c": null}', schema) == {"a": None, "b": "x", "c": None}
    with pytest.raises(LLMOutputError, match="b is null"):
        parse_json('{"a": "x", "b": null}', schema)
    with pytest.raises(LLMOutputError, match="a should be string or null"):
        parse_json('{"a": 1, "b": "x"}', schema)


@pytest.mark.parametrize("reported", [(-5, -5), (10**30, 10**30), ("many", None)])
def test_a_custom_llms_implausible_usage_is_replaced_by_the_estimate(reported: tuple[Any, Any]) -> None:
    """Not only OpenAICompatible: whatever LLM object pgr is given, its counts are checked the same way."""
    from pgr_core.models.llm import LLM, Completion

    class Boastful(LLM):
        name = "boastful"

        def __init__(self) -> None:
            self.inner = ScriptedLLM(handler=sane)

        def complete(self, messages: Any, *, schema: Any = None, max_tokens: int = 512, **kw: Any) -> Completion:
            reply = self.inner.complete(messages, schema=schema, max_tokens=max_tokens)
            return Completion(reply.text, Usage(*reported))  # type: ignore[arg-type]

    result = PGR(make_store(), llm=Boastful(), strategy="tot").retrieve(
        QUERY, scope=U1, budget=Budget(max_tokens=50_000)
    )
    usage = result.trace.usage
    assert 0 < usage.prompt_tokens < 50_000 and 0 <= usage.completion_tokens < 50_000
    assert usage.llm_calls >= 3 and not result.degraded
