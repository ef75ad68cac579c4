"""WrappedLLM: one hook (_call) serves complete and acomplete; the inner model's capabilities carry over."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest

from pgr_core.errors import LLMError, LLMTimeoutError
from pgr_core.models.llm import LLM, CallFlow, Completion, Request, Sleep, WrappedLLM
from pgr_core.testing import ScriptedLLM

MESSAGES = [{"role": "user", "content": "Where did I park the car?"}]


class Shouting(WrappedLLM):
    """Upper-cases every reply and records every request it saw: a hook that works before and after."""

    def __init__(self, inner: LLM) -> None:
        super().__init__(inner, name=f"shouting:{inner.name}")
        self.seen: list[Request] = []

    def _call(self, request: Request) -> CallFlow:
        self.seen.append(request)
        completion = yield dataclasses.replace(request, max_tokens=request.max_tokens + 1)
        return dataclasses.replace(completion, text=completion.text.upper())


class Timed(LLM):
    """A model that takes ``timeout=`` (in both APIs) and notes what it was given."""

    accepts_timeout = True

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    def complete(self, messages: Any, *, timeout: float | None = None, **options: Any) -> Completion:
        self.timeouts.append(timeout)
        return Completion("in time")

    async def acomplete(self, messages: Any, **options: Any) -> Completion:
        return self.complete(messages, **options)


def test_complete_and_acomplete_both_go_through_the_one_hook() -> None:
    inner = ScriptedLLM(["first", "second"])
    llm = Shouting(inner)
    sync = llm.complete(MESSAGES, max_tokens=10, temperature=0.5)
    awaited = asyncio.run(llm.acomplete(MESSAGES, schema={"type": "object"}, max_tokens=20))
    assert (sync.text, awaited.text) == ("FIRST", "SECOND")
    assert [(r.max_tokens, r.temperature, r.schema) for r in llm.seen] == [
        (10, 0.5, None),
        (20, 0.0, {"type": "object"}),
    ]
    # what the hook yielded is what reached the inner model
    assert [call.max_tokens for call in inner.calls] == [11, 21]
    assert [call.messages for call in inner.calls] == [MESSAGES, MESSAGES]


def test_the_default_hook_passes_every_call_through_untouched() -> None:
    inner = ScriptedLLM(["as it came"])
    reply = WrappedLLM(inner).complete(MESSAGES, max_tokens=7)
    assert reply.text == "as it came" and inner.calls[0].max_tokens == 7


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_inner_error_is_raised_at_the_yield_where_the_hook_can_handle_it(mode: str) -> None:
    class Explaining(WrappedLLM):
        def _call(self, request: Request) -> CallFlow:
            try:
                return (yield request)
            except LLMTimeoutError as exc:
                raise LLMError(f"{self.name} gave up: {exc}") from exc

    llm = Explaining(ScriptedLLM([LLMTimeoutError("no answer in 2s")]), name="explaining")
    with pytest.raises(LLMError, match="explaining gave up: no answer in 2s") as caught:
        llm.complete(MESSAGES) if mode == "sync" else asyncio.run(llm.acomplete(MESSAGES))
    assert isinstance(caught.value.__cause__, LLMTimeoutError)


def test_a_hook_that_returns_without_yielding_never_reaches_the_inner_model() -> None:
    class Canned(WrappedLLM):
        def _call(self, request: Request) -> CallFlow:
            return Completion("canned")
            yield  # a generator all the same

    inner = ScriptedLLM([])
    llm = Canned(inner)
    assert llm.complete(MESSAGES).text == asyncio.run(llm.acomplete(MESSAGES)).text == "canned"
    assert inner.calls == []


def test_a_sleep_blocks_complete_and_is_awaited_by_acomplete() -> None:
    class Patient(WrappedLLM):
        def _call(self, request: Request) -> CallFlow:
            yield Sleep(0.3)
            return (yield request)

    llm = Patient(ScriptedLLM(["a", "b", "c"]))
    started = time.perf_counter()
    assert llm.complete(MESSAGES).text == "a"
    assert time.perf_counter() - started >= 0.3

    async def two_at_once() -> list[str]:
        return [c.text for c in await asyncio.gather(llm.acomplete(MESSAGES), llm.acomplete(MESSAGES))]

    started = time.perf_counter()
    assert sorted(asyncio.run(two_at_once())) == ["b", "c"]
    assert 0.3 <= time.perf_counter() - started < 0.55  # both waits at once: the loop was never blocked


def test_name_model_and_accepts_timeout_come_from_the_inner_model() -> None:
    plain = WrappedLLM(ScriptedLLM([]))
    assert (plain.name, plain.model, plain.accepts_timeout) == ("scripted", "scripted", False)
    timed = WrappedLLM(Timed(), name="mine")
    assert (timed.name, timed.model, timed.accepts_timeout) == ("mine", "llm", True)


def test_a_timeout_reaches_only_an_inner_model_that_takes_one() -> None:
    inner = Timed()
    llm = Shouting(inner)
    llm.complete(MESSAGES, timeout=2.5)
    asyncio.run(llm.acomplete(MESSAGES, timeout=1.5))
    llm.complete(MESSAGES)
    assert inner.timeouts == [2.5, 1.5, None]
    assert [r.timeout for r in llm.seen] == [2.5, 1.5, None]
    untimed = ScriptedLLM(["no timeout taken"])  # its complete() has no timeout= at all
    assert Shouting(untimed).complete(MESSAGES, timeout=2.5).text == "NO TIMEOUT TAKEN"
