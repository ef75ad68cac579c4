"""200 retrievals in flight on one store and one LLM client.

- No errors, and no cross-talk: each result and trace mentions only its own user and query, even with
  writes and deletions landing on the store meanwhile (and nothing written is lost).
- Bounded connection use: ``OpenAICompatible`` keeps at most ``max_concurrency`` (default 16) requests,
  and so connections, in flight, checked on the loopback server's side.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from loopback_llm import LoopbackLLM, Reply, Request, ok

from pgr_core import PGR, Fact, HashingEmbedder, InMemoryStore, OpenAICompatible, RetrievalResult, Scope
from pgr_core.testing import ScriptedLLM

N_CALLS = 200
USER_RE = re.compile(r"zq\d{3}x")
QUERY_RE = re.compile(r"qq\d{3}y")


def user(i: int) -> Scope:
    return Scope(user_id=f"u{i:03d}")


def user_token(i: int) -> str:
    return f"zq{i:03d}x"


def query(j: int) -> str:
    """Two queries per user: call j belongs to user j // 2."""
    return f"Should {user_token(j // 2)} join the soccer league this summer (ref qq{j:03d}y)?"


def make_store() -> InMemoryStore:
    texts = [
        "{t} hurt a knee playing basketball in March",
        "{t} has evening classes on weeknights",
        "{t} sold the car and rides the bus",
        "{t} keeps the soccer league dues in a jar",
    ]
    facts = [
        Fact(id=f"u{i:03d}:{k}", text=text.format(t=user_token(i)), scope=user(i))
        for i in range(N_CALLS // 2)
        for k, text in enumerate(texts)
    ]
    store = InMemoryStore(embedder=HashingEmbedder())
    store.add_facts(facts)
    return store


def reply_for(prompt: str, required: Sequence[str]) -> Any:
    """A model that names the user and query it was asked about: a reply sent to the wrong caller shows."""
    who = sorted(set(USER_RE.findall(prompt)))
    ref = sorted(set(QUERY_RE.findall(prompt)))
    tag = " ".join(who + ref)
    if "intent" in required:
        return {"intent": f"decide whether to join the soccer league: {tag}"}
    for key in ("nodes", "steps"):  # a tree (ToT) or a chain (CoT)
        if key in required:
            if "revising a plan" in prompt:  # Phase 2: nothing more to add
                return {key: []}
            return {key: [{"id": "a", "parent": None, "action": f"{tag} knee physio", "dimension": "health"}]}
    if "summary" in required:
        return {"summary": f"briefing for {tag}"}
    return f"answer for {tag}"


def echo(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
    prompt = "\n".join(m.get("content", "") for m in messages)
    return reply_for(prompt, (schema or {}).get("required", []))


def assert_no_cross_talk(j: int, result: RetrievalResult) -> None:
    assert not result.degraded and not result.trace.errors, result.trace.errors
    assert result.trace.query == query(j) and result.trace.scope == user(j // 2).as_dict()
    everything = json.dumps(result.to_dict(), default=str)
    assert set(USER_RE.findall(everything)) == {user_token(j // 2)}
    assert set(QUERY_RE.findall(everything)) == {f"qq{j:03d}y"}
    assert result.facts and all(f.fact.scope == user(j // 2) for f in result.facts)


def test_200_aretrieve_in_flight_with_writes_meanwhile() -> None:
    store = make_store()
    users_before = [(f.id, f.text, f.scope) for f in store.facts]
    llm = ScriptedLLM(handler=echo)
    pgr = PGR(store, llm=llm, strategy="tot", min_score=0.1, delta=1)
    written = [
        Fact(id=f"w{k}", text=f"writer note {k} about the soccer league", scope=Scope(user_id=f"w{k % 7}"))
        for k in range(100)
    ]

    async def writer() -> None:
        for k in range(0, 100, 10):  # writes and deletions interleaved with the searches
            await asyncio.to_thread(store.add_facts, written[k : k + 10])
            if k % 20 == 10:
                for fact in written[k : k + 2]:  # w{k} and w{k + 1} have different owners: each deletes its own
                    await asyncio.to_thread(store.delete, [fact.id], scope=fact.scope)
            await asyncio.sleep(0)

    async def everything() -> list[Any]:
        return await asyncio.gather(writer(), *(pgr.aretrieve(query(j), scope=user(j // 2)) for j in range(N_CALLS)))

    _, *results = asyncio.run(everything())
    for j, result in enumerate(results):
        assert_no_cross_talk(j, result)
    deleted = {f"w{k + d}" for k in range(10, 100, 20) for d in (0, 1)}
    assert {f.id for f in store.facts if f.id.startswith("w")} == {f"w{k}" for k in range(100)} - deleted
    assert [(f.id, f.text, f.scope) for f in store.facts if not f.id.startswith("w")] == users_before
    assert len(llm.calls) >= 3 * N_CALLS


def test_threads_share_one_pgr_without_cross_talk() -> None:
    store = make_store()
    pgr = PGR(store, llm=ScriptedLLM(handler=echo), strategy="cot", min_score=0.1, delta=1)
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda j: pgr.retrieve(query(j), scope=user(j // 2)), range(N_CALLS)))
    for j, result in enumerate(results):
        assert_no_cross_talk(j, result)


# ---------------------------------------------------------------- bounded connection use over HTTP


@dataclass
class Load:
    """What the loopback server saw at once: requests being answered, connections open."""

    requests: int = 0
    peak_requests: int = 0
    connections: int = 0
    peak_connections: int = 0


@pytest.fixture
def server() -> Iterator[tuple[LoopbackLLM, Load]]:
    load, lock = Load(), threading.Lock()

    def answer(request: Request) -> Reply:
        with lock:
            load.requests += 1
            load.peak_requests = max(load.peak_requests, load.requests)
        try:
            body = request.body or {}
            schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}
            prompt = "\n".join(m.get("content", "") for m in body.get("messages", []))
            time.sleep(0.005)  # long enough for requests to pile up if nothing bounded them
            reply = reply_for(prompt, schema.get("required", []))
            return ok(reply if isinstance(reply, str) else json.dumps(reply))
        finally:
            with lock:
                load.requests -= 1

    srv = LoopbackLLM().start()
    srv.default = answer
    http = srv._server
    assert http is not None
    process, shutdown = http.process_request, http.shutdown_request

    def counted_process(request: Any, address: Any) -> None:  # one call per accepted connection
        with lock:
            load.connections += 1
            load.peak_connections = max(load.peak_connections, load.connections)
        process(request, address)

    def counted_shutdown(request: Any) -> None:  # when that connection is closed
        shutdown(request)
        with lock:
            load.connections -= 1

    http.process_request = counted_process  # type: ignore[method-assign]
    http.shutdown_request = counted_shutdown  # type: ignore[method-assign]
    try:
        yield srv, load
    finally:
        srv.stop()


def test_200_aretrieve_on_one_http_client_stay_within_max_concurrency(server: tuple[LoopbackLLM, Load]) -> None:
    srv, load = server
    llm = OpenAICompatible(base_url=srv.base_url, model="m", max_retries=0)
    assert llm.max_concurrency == 16  # the documented default
    pgr = PGR(make_store(), llm=llm, strategy="tot", min_score=0.1, delta=100)  # augment, Phase 1, summary

    async def everyone() -> list[RetrievalResult]:
        return await asyncio.gather(*(pgr.aretrieve(query(j), scope=user(j // 2)) for j in range(N_CALLS)))

    results = asyncio.run(everyone())
    for j, result in enumerate(results):
        assert_no_cross_talk(j, result)
    assert srv.count == 3 * N_CALLS
    assert 2 <= load.peak_requests <= 16  # concurrency happened, and stayed within the bound
    assert load.peak_connections <= 16


def test_threads_on_one_http_client_stay_within_max_concurrency(server: tuple[LoopbackLLM, Load]) -> None:
    srv, load = server
    llm = OpenAICompatible(base_url=srv.base_url, model="m", max_retries=0, max_concurrency=4)
    pgr = PGR(make_store(), llm=llm, strategy="cot", min_score=0.1, delta=100)
    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda j: pgr.retrieve(query(j), scope=user(j // 2)), range(48)))
    for j, result in enumerate(results):
        assert_no_cross_talk(j, result)
    assert 2 <= load.peak_requests <= 4 and load.peak_connections <= 4
