"""pgr_core.models.llm against a real loopback HTTP server speaking OpenAI's chat-completions API."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import openai  # noqa: F401 - imported up front so no timing below includes the import
import pytest
from loopback_llm import LoopbackLLM, Reply, Request, error, ok

from pgr_core.errors import (
    InvalidArgumentError,
    LLMConnectionError,
    LLMOutputError,
    LLMStatusError,
    LLMTimeoutError,
)
from pgr_core.models.llm import Completion, OpenAICompatible, Usage, llm_from_env, parse_json

SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "confidence": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["answer", "confidence"],
}
MESSAGES = [
    {"role": "system", "content": "You answer questions about the user's memories, in JSON."},
    {"role": "user", "content": "Where did I park the car on Tuesday?"},
]
REPLY = '{"answer": "level 3 of the station car park", "confidence": 0.8, "tags": ["car"]}'
ENV_NAMES = (
    "PGR_LLM_BASE_URL",
    "PGR_LLM_MODEL",
    "PGR_LLM_API_KEY",
    "PGR_LLM_TIMEOUT",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_MODEL",
    "PGR_LLM",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the developer's LLM settings."""
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[LoopbackLLM]:
    srv = LoopbackLLM().start()
    try:
        yield srv
    finally:
        srv.stop()


def make_llm(srv: LoopbackLLM, **kwargs: object) -> OpenAICompatible:
    options: dict[str, object] = {"model": "test-model", "timeout": 5.0, "backoff": 0.01}
    options.update(kwargs)
    return OpenAICompatible(base_url=srv.base_url, **options)  # type: ignore[arg-type]


def llama_cpp(request: Request) -> Reply:
    """llama.cpp's behaviour: 500 on json_schema response formats, json_object with a schema works."""
    fmt = (request.body or {}).get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return error(500, "Unsupported response_format type: json_schema")
    if fmt.get("type") == "json_object" and fmt.get("schema") == SCHEMA:
        return ok(REPLY, prompt_tokens=40, completion_tokens=20)
    return error(400, f"unexpected response_format {fmt!r}")


def free_port() -> int:
    """A port nothing listens on (bound, read, closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------- structured output


def test_json_schema_mode_sends_schema_and_reads_usage(server: LoopbackLLM) -> None:
    server.queue(ok(REPLY, prompt_tokens=123, completion_tokens=45, model="served-model"))
    llm = make_llm(server, structured="json_schema")

    result = llm.complete(MESSAGES, schema=SCHEMA, max_tokens=64, temperature=0.2)

    assert isinstance(result, Completion)
    assert result.text == REPLY
    assert result.usage == Usage(prompt_tokens=123, completion_tokens=45, estimated=False)
    assert result.usage.total_tokens == 168
    assert result.model == "served-model"
    assert result.truncated is False
    assert result.seconds > 0
    assert parse_json(result.text, SCHEMA) == {
        "answer": "level 3 of the station car park",
        "confidence": 0.8,
        "tags": ["car"],
    }

    assert server.count == 1
    sent = server.requests[0]
    assert sent.method == "POST"
    assert sent.path == "/v1/chat/completions"
    assert sent.headers.get("authorization") == "Bearer not-needed"
    body = sent.body
    assert body["model"] == "test-model"
    assert body["messages"] == MESSAGES
    assert body["max_tokens"] == 64
    assert body["temperature"] == 0.2
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["schema"] == SCHEMA
    assert fmt["json_schema"]["name"]


def test_no_schema_sends_no_response_format(server: LoopbackLLM) -> None:
    server.queue(ok("plain text answer"))
    llm = make_llm(server)

    assert llm.complete(MESSAGES).text == "plain text answer"
    assert "response_format" not in server.bodies()[0]


def test_auto_falls_back_to_json_object_and_remembers(server: LoopbackLLM) -> None:
    server.default = llama_cpp
    llm = make_llm(server, structured="auto")

    first = llm.complete(MESSAGES, schema=SCHEMA)

    assert first.text == REPLY
    assert first.usage == Usage(40, 20)
    assert parse_json(first.text, SCHEMA)["answer"] == "level 3 of the station car park"
    bodies = server.bodies()
    assert len(bodies) == 2
    assert bodies[0]["response_format"]["type"] == "json_schema"
    assert bodies[1]["response_format"] == {"type": "json_object", "schema": SCHEMA}
    assert llm.structured == "json_object"

    second = llm.complete(MESSAGES, schema=SCHEMA)

    assert second.text == REPLY
    bodies = server.bodies()
    assert len(bodies) == 3  # straight to json_object, no second rejection
    assert bodies[2]["response_format"] == {"type": "json_object", "schema": SCHEMA}


def test_json_schema_mode_does_not_fall_back(server: LoopbackLLM) -> None:
    """Only "auto" switches formats; an explicit json_schema client reports the rejection."""
    server.default = llama_cpp
    llm = make_llm(server, structured="json_schema", max_retries=1)

    with pytest.raises(LLMStatusError) as info:
        llm.complete(MESSAGES, schema=SCHEMA)

    assert info.value.status_code == 500
    assert server.count == 2
    assert all(b["response_format"]["type"] == "json_schema" for b in server.bodies())


# --------------------------------------------------------------------------- retries and errors


def test_429_with_retry_after_zero_is_retried(server: LoopbackLLM) -> None:
    server.queue(error(429, "rate limited", {"Retry-After": "0"}), ok(REPLY))
    llm = make_llm(server, structured="none")

    started = time.perf_counter()
    result = llm.complete(MESSAGES, schema=SCHEMA)

    assert result.text == REPLY
    assert parse_json(result.text, SCHEMA)["confidence"] == 0.8
    assert server.count == 2
    assert time.perf_counter() - started < 2.0


def test_429_with_retry_after_zero_forever_gives_up(server: LoopbackLLM) -> None:
    """A server that keeps answering 429 / Retry-After: 0 must not be retried more than max_retries."""
    server.queue(*[error(429, "rate limited", {"Retry-After": "0"}) for _ in range(10)])
    server.default = ok(REPLY)  # reached only if the client retries too often
    llm = make_llm(server, structured="none", max_retries=2)

    with pytest.raises(LLMStatusError) as info:
        llm.complete(MESSAGES)

    assert info.value.status_code == 429
    assert server.count == 3


def test_500_beyond_max_retries_raises_status_error(server: LoopbackLLM) -> None:
    server.default = error(500, "model crashed")
    llm = make_llm(server, structured="none", max_retries=3)

    with pytest.raises(LLMStatusError) as info:
        llm.complete(MESSAGES, schema=SCHEMA)

    assert info.value.status_code == 500
    assert "500" in str(info.value)
    assert server.count == 3 + 1
    assert all("response_format" not in b for b in server.bodies())


def test_500_then_success_within_retries(server: LoopbackLLM) -> None:
    server.queue(error(503, "loading model"), error(502, "bad gateway"), ok(REPLY))
    llm = make_llm(server, max_retries=2)

    assert llm.complete(MESSAGES).text == REPLY
    assert server.count == 3


def test_non_retryable_status_is_not_retried(server: LoopbackLLM) -> None:
    server.default = error(401, "invalid api key")
    llm = make_llm(server, max_retries=3)

    with pytest.raises(LLMStatusError) as info:
        llm.complete(MESSAGES, schema=SCHEMA)  # auto mode: a 401 is not a format rejection either

    assert info.value.status_code == 401
    assert server.count == 1
    assert llm.structured == "auto"


def test_timeout_raises_timeout_error(server: LoopbackLLM) -> None:
    server.default = Reply(200, ok(REPLY).body, delay=1.5)  # cut short when the fixture stops the server
    llm = make_llm(server, timeout=0.3, max_retries=2)

    started = time.perf_counter()
    with pytest.raises(LLMTimeoutError) as info:
        llm.complete(MESSAGES)
    elapsed = time.perf_counter() - started

    assert 0.25 <= elapsed < 1.2  # gave up at the client timeout, did not wait for the server
    assert "0.3s" in str(info.value)
    assert server.count == 1  # a timeout is not retried


def test_refused_connection_raises_connection_error() -> None:
    port = free_port()
    llm = OpenAICompatible(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout=2.0, backoff=0.01)

    started = time.perf_counter()
    with pytest.raises(LLMConnectionError) as info:
        llm.complete(MESSAGES)

    assert not isinstance(info.value, LLMTimeoutError)
    assert str(port) in str(info.value)
    assert time.perf_counter() - started < 2.0


# --------------------------------------------------------------------------- response details


def test_missing_usage_is_estimated(server: LoopbackLLM) -> None:
    server.queue(ok(REPLY, usage=False))
    llm = make_llm(server)

    result = llm.complete(MESSAGES)

    assert result.text == REPLY
    assert result.usage.estimated is True
    assert result.usage.prompt_tokens > 0
    assert result.usage.completion_tokens > 0
    prompt_chars = sum(len(m["content"]) for m in MESSAGES)
    assert result.usage.prompt_tokens == pytest.approx(prompt_chars / 4, abs=1)
    assert result.usage.completion_tokens == pytest.approx(len(REPLY) / 4, abs=1)


def test_null_usage_counts_is_estimated(server: LoopbackLLM) -> None:
    server.queue(ok(REPLY, prompt_tokens=None, completion_tokens=None))
    llm = make_llm(server)

    usage = llm.complete(MESSAGES).usage

    assert usage.estimated is True
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0


def test_finish_reason_length_marks_truncated(server: LoopbackLLM) -> None:
    cut = '{"answer": "level 3 of the sta'
    server.queue(ok(cut, finish_reason="length"))
    llm = make_llm(server, structured="json_schema")

    result = llm.complete(MESSAGES, schema=SCHEMA, max_tokens=8)

    assert result.truncated is True
    assert result.text == cut
    assert server.bodies()[0]["max_tokens"] == 8
    with pytest.raises(LLMOutputError) as info:
        parse_json(result.text, SCHEMA)
    assert info.value.raw == cut


def test_empty_content_gives_empty_text(server: LoopbackLLM) -> None:
    body = ok("").body
    body["choices"][0]["message"]["content"] = None
    server.queue(Reply(200, body))
    llm = make_llm(server)

    result = llm.complete(MESSAGES)

    assert result.text == ""
    with pytest.raises(LLMOutputError):
        parse_json(result.text, SCHEMA)


# --------------------------------------------------------------------------- parse_json


@pytest.mark.parametrize(
    "text",
    [
        REPLY,
        f"```json\n{REPLY}\n```",
        f"```\n{REPLY}\n```",
        f"Sure! Here is the JSON you asked for:\n{REPLY}\nLet me know if you need more.",
        f"Here you go:\n```json\n{REPLY}\n```\nHope that helps.",
    ],
    ids=["bare", "json-fence", "plain-fence", "chatter", "chatter-and-fence"],
)
def test_parse_json_accepts_fences_and_chatter(text: str) -> None:
    assert parse_json(text, SCHEMA) == {
        "answer": "level 3 of the station car park",
        "confidence": 0.8,
        "tags": ["car"],
    }


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"answer": 42, "confidence": 0.5}', "answer"),
        ('{"answer": "x", "confidence": "high"}', "confidence"),
        ('{"answer": "x", "confidence": true}', "confidence"),
        ('{"answer": "x", "confidence": 0.5, "tags": ["a", 3]}', "tags[1]"),
        ('{"answer": "x"}', "confidence"),
        ('["answer", "confidence"]', "object"),
        ("I don't know where you parked.", "JSON"),
        ('{"answer": "x", "confidence": 0.5,}', "JSON"),
    ],
    ids=[
        "wrong-type-string",
        "wrong-type-number",
        "bool-is-not-number",
        "wrong-item-type",
        "missing-required",
        "not-an-object",
        "no-json",
        "invalid-json",
    ],
)
def test_parse_json_rejects_bad_replies(text: str, fragment: str) -> None:
    with pytest.raises(LLMOutputError) as info:
        parse_json(text, SCHEMA)
    assert fragment in str(info.value)
    assert info.value.raw == text


def test_parse_json_without_schema_and_null_optional() -> None:
    assert parse_json('{"a": [1, 2]}') == {"a": [1, 2]}
    assert parse_json('{"answer": "x", "confidence": 1, "tags": null}', SCHEMA)["tags"] is None


# --------------------------------------------------------------------------- async path


def ask(llm: OpenAICompatible, mode: str, **options: Any) -> Completion:
    """One call through ``complete`` (mode "sync") or ``acomplete`` (mode "async")."""
    if mode == "sync":
        return llm.complete(MESSAGES, **options)
    return asyncio.run(llm.acomplete(MESSAGES, **options))


def test_both_apis_walk_the_same_retry_flow(server: LoopbackLLM) -> None:
    """A format rejection, a 429 with Retry-After, a 503, then a reply: complete and acomplete send the
    same requests in the same order, wait out the same Retry-After, and give the same completion."""

    def story() -> list[Reply]:
        return [
            error(500, "Unsupported response_format type: json_schema"),
            error(429, "rate limited", {"Retry-After": "0.3"}),
            error(503, "busy"),
            ok(REPLY, prompt_tokens=40, completion_tokens=20),
        ]

    outcomes = []
    for mode in ("sync", "async"):
        llm = make_llm(server, structured="auto", max_retries=2)
        before = server.count
        server.queue(*story())
        started = time.perf_counter()
        reply = ask(llm, mode, schema=SCHEMA)
        waited = time.perf_counter() - started
        formats = [b["response_format"]["type"] for b in server.bodies()[before:]]
        outcomes.append((reply.text, reply.usage, formats, llm.structured))
        assert waited >= 0.3  # the Retry-After was honoured
    assert outcomes[0] == outcomes[1]
    assert outcomes[0] == (
        REPLY,
        Usage(40, 20),
        ["json_schema", "json_object", "json_object", "json_object"],
        "json_object",
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_retry_after_past_the_call_timeout_ends_the_call_at_once(server: LoopbackLLM, mode: str) -> None:
    server.queue(error(429, "rate limited", {"Retry-After": "10"}))
    server.default = ok(REPLY)  # reached only if the client waited
    llm = make_llm(server, structured="none", max_retries=3)

    started = time.perf_counter()
    with pytest.raises(LLMStatusError) as info:
        ask(llm, mode, timeout=2.0)

    assert info.value.status_code == 429 and server.count == 1
    assert time.perf_counter() - started < 1.5


def test_async_falls_back_to_json_object_and_remembers(server: LoopbackLLM) -> None:
    server.default = llama_cpp
    llm = make_llm(server, structured="auto")

    async def two_calls() -> tuple[Completion, Completion]:
        first = await llm.acomplete(MESSAGES, schema=SCHEMA)
        second = await llm.acomplete(MESSAGES, schema=SCHEMA)
        return first, second

    first, second = asyncio.run(two_calls())

    assert first.text == REPLY and second.text == REPLY
    assert first.usage == Usage(40, 20)
    assert parse_json(second.text, SCHEMA)["confidence"] == 0.8
    types = [b["response_format"]["type"] for b in server.bodies()]
    assert types == ["json_schema", "json_object", "json_object"]
    assert server.bodies()[1]["response_format"]["schema"] == SCHEMA


def test_async_calls_in_separate_event_loops(server: LoopbackLLM) -> None:
    """asyncio.run twice on one client: the second loop must not reuse the first loop's connections."""
    server.default = ok(REPLY)
    llm = make_llm(server)

    first = asyncio.run(llm.acomplete(MESSAGES))
    second = asyncio.run(llm.acomplete(MESSAGES))

    assert first.text == REPLY and second.text == REPLY
    assert server.count == 2


def test_async_retries_then_gives_up(server: LoopbackLLM) -> None:
    server.queue(*[error(429, "rate limited", {"Retry-After": "0"}) for _ in range(10)])
    server.default = ok(REPLY)
    llm = make_llm(server, structured="none", max_retries=1)

    with pytest.raises(LLMStatusError) as info:
        asyncio.run(llm.acomplete(MESSAGES))

    assert info.value.status_code == 429
    assert server.count == 2


def test_async_refused_connection_raises_connection_error() -> None:
    port = free_port()
    llm = OpenAICompatible(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout=2.0, backoff=0.01)

    with pytest.raises(LLMConnectionError) as info:
        asyncio.run(llm.acomplete(MESSAGES, schema=SCHEMA))

    assert not isinstance(info.value, LLMTimeoutError)
    assert str(port) in str(info.value)


def test_async_timeout_raises_timeout_error(server: LoopbackLLM) -> None:
    server.default = Reply(200, ok(REPLY).body, delay=1.5)
    llm = make_llm(server, timeout=0.3)

    with pytest.raises(LLMTimeoutError):
        asyncio.run(llm.acomplete(MESSAGES))
    assert server.count == 1


# --------------------------------------------------------------------------- configuration


def test_llm_from_env_reads_base_url_and_model(server: LoopbackLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGR_LLM_BASE_URL", server.base_url)
    monkeypatch.setenv("PGR_LLM_MODEL", "env-model")
    monkeypatch.setenv("PGR_LLM_TIMEOUT", "7")

    llm = llm_from_env()

    assert isinstance(llm, OpenAICompatible)
    assert llm.base_url == server.base_url
    assert llm.model == "env-model"
    assert llm.timeout == 7.0
    server.queue(ok("hello"))
    assert llm.complete(MESSAGES).text == "hello"
    assert server.bodies()[0]["model"] == "env-model"


def test_llm_from_env_base_url_only_uses_default_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGR_LLM_BASE_URL", "http://127.0.0.1:9/v1")

    llm = llm_from_env()

    assert isinstance(llm, OpenAICompatible)
    assert llm.model == "default"


def test_llm_from_env_nothing_set_returns_none() -> None:
    assert llm_from_env() is None


def test_llm_from_env_pgr_llm_none_returns_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGR_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("PGR_LLM_MODEL", "env-model")
    monkeypatch.setenv("PGR_LLM", "none")

    assert llm_from_env() is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"structured": "xml"},
        {"timeout": 0},
        {"max_retries": -1},
        {"backoff": -0.1},
    ],
    ids=["structured-xml", "zero-timeout", "negative-retries", "negative-backoff"],
)
def test_bad_arguments_raise_invalid_argument(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        OpenAICompatible(base_url="http://127.0.0.1:9/v1", model="m", **kwargs)  # type: ignore[arg-type]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts this process's file descriptors in /proc")
def test_a_new_event_loop_per_call_leaves_no_socket_behind(
    server: LoopbackLLM, capfd: pytest.CaptureFixture[str]
) -> None:
    """asyncio.run once per request (issue 35, item 3): each loop's client is closed with its loop."""
    server.queue(*[ok("hi") for _ in range(40)])
    llm = OpenAICompatible(base_url=server.base_url, model="m", timeout=5)
    asyncio.run(llm.acomplete(MESSAGES))  # the first call imports and sets up what every later one reuses
    before = _open_fds()
    for _ in range(30):
        assert asyncio.run(llm.acomplete(MESSAGES)).text == "hi"
    gc.collect()
    assert _open_fds() - before < 5  # it was one socket more per call
    assert "Event loop is closed" not in capfd.readouterr().err
