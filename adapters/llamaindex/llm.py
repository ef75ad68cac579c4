"""Any LlamaIndex LLM as pgr's generator: :class:`LlamaIndexLLM`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole
from llama_index.core.llms import LLM as LlamaLLM

from pgr_core.errors import (
    InvalidArgumentError,
    LLMConnectionError,
    LLMError,
    LLMStatusError,
    LLMTimeoutError,
)
from pgr_core.models.llm import CallFlow, Completion, Request, Usage, WrappedLLM

__all__ = ["LlamaIndexLLM"]

SchemaKwargs = Callable[[Mapping[str, Any]], Mapping[str, Any]]


class LlamaIndexLLM(WrappedLLM):
    """pgr's :class:`~pgr_core.models.llm.LLM` protocol on top of a LlamaIndex ``LLM`` (OpenAI, Ollama,
    Anthropic, a ``CustomLLM``...): ``complete`` calls ``llm.chat``, ``acomplete`` awaits ``llm.achat``.

    >>> from llama_index.core.llms import MockLLM
    >>> LlamaIndexLLM(MockLLM()).complete([{"role": "user", "content": "hi"}]).text
    'user: hi\\nassistant: '

    - JSON: pgr's prompts already ask for JSON only, and pgr checks (and once repairs) every reply, so
      by default the schema is not sent. For a model that can constrain its decoding, ``schema_kwargs``
      turns a schema into extra ``chat`` keyword arguments, e.g. for llama-index-llms-openai:
      ``schema_kwargs=lambda s: {"response_format": {"type": "json_schema",
      "json_schema": {"name": "reply", "schema": dict(s)}}}``.
    - ``max_tokens`` and ``temperature``: the LlamaIndex LLM's own settings apply; with
      ``forward_max_tokens=True`` pgr's per-call limit goes to ``chat(max_tokens=...)`` (OpenAI-style
      LLMs take it; others may reject it).
    - ``chat_kwargs``: extra keyword arguments for every ``chat`` call.
    - Usage: read from the response (``raw.usage`` with ``prompt_tokens``/``completion_tokens`` or
      ``input_tokens``/``output_tokens``, or the same keys in ``additional_kwargs``); when the response
      carries none, counted as characters / 4 and marked ``estimated``.
    - Errors: timeouts, refused connections and HTTP statuses become pgr's ``LLMTimeoutError``,
      ``LLMConnectionError``, ``LLMStatusError``; anything else ``LLMError``, with the cause attached.
    """

    def __init__(
        self,
        llm: LlamaLLM,
        *,
        schema_kwargs: SchemaKwargs | None = None,
        chat_kwargs: Mapping[str, Any] | None = None,
        forward_max_tokens: bool = False,
    ) -> None:
        if not isinstance(llm, LlamaLLM):
            raise InvalidArgumentError(f"llm must be a LlamaIndex LLM, not {type(llm).__name__}")
        model = _model_name(llm)
        super().__init__(llm, name=f"llamaindex:{model}")
        self.model = model
        self.schema_kwargs = schema_kwargs
        self.chat_kwargs = dict(chat_kwargs or {})
        self.forward_max_tokens = forward_max_tokens

    def __repr__(self) -> str:
        return f"LlamaIndexLLM({type(self.llm).__name__}, model={self.model!r})"

    # -- one call for complete and acomplete: chat (or achat), its errors mapped, its reply read
    def _call(self, request: Request) -> CallFlow:
        started = time.perf_counter()
        try:
            response = yield request
        except LLMError:
            raise
        except Exception as exc:
            raise _map_error(self.name, exc) from exc
        return self._completion(response, request.messages, started)

    def _send(self, request: Request) -> ChatResponse:
        return self.llm.chat(_chat_messages(request.messages), **self._kwargs(request))

    async def _asend(self, request: Request) -> ChatResponse:
        return await self.llm.achat(_chat_messages(request.messages), **self._kwargs(request))

    def _kwargs(self, request: Request) -> dict[str, Any]:
        kwargs = dict(self.chat_kwargs)
        if self.forward_max_tokens:
            kwargs["max_tokens"] = request.max_tokens
        if request.schema is not None and self.schema_kwargs is not None:
            kwargs.update(self.schema_kwargs(request.schema))
        return kwargs

    def _completion(self, response: ChatResponse, messages: Sequence[Mapping[str, str]], started: float) -> Completion:
        text = response.message.content or ""
        usage = _reported_usage(response)
        if usage is None:
            usage = Usage.estimate(messages, text)
        return Completion(
            text=text,
            usage=usage,
            model=self.model,
            seconds=time.perf_counter() - started,
            truncated=_stopped_at_length(response.raw),
        )


# ---------------------------------------------------------------------- helpers


def _chat_messages(messages: Sequence[Mapping[str, str]]) -> list[ChatMessage]:
    out = []
    for message in messages:
        role = message.get("role", "user")
        try:
            chat_role = MessageRole(role)
        except ValueError:
            chat_role = MessageRole.USER
        out.append(ChatMessage(role=chat_role, content=message.get("content", "")))
    return out


def _model_name(llm: LlamaLLM) -> str:
    try:
        return str(llm.metadata.model_name or type(llm).__name__)
    except Exception:  # a metadata property that needs a live client must not break construction
        return type(llm).__name__


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _tokens(source: Any) -> Usage | None:
    prompt = _get(source, "prompt_tokens")
    if prompt is None:
        prompt = _get(source, "input_tokens")
    completion = _get(source, "completion_tokens")
    if completion is None:
        completion = _get(source, "output_tokens")
    if not isinstance(prompt, int) and not isinstance(completion, int):
        return None
    return Usage(int(prompt or 0), int(completion or 0))


def _reported_usage(response: ChatResponse) -> Usage | None:
    """Token counts the provider reported, wherever the LlamaIndex integration put them."""
    for source in (
        _get(response.raw, "usage"),
        response.raw,
        response.additional_kwargs,
        response.message.additional_kwargs,
    ):
        usage = _tokens(source)
        if usage is not None:
            return usage
    return None


def _stopped_at_length(raw: Any) -> bool:
    """Whether the provider says it stopped at the token limit (OpenAI, Anthropic, Ollama shapes)."""
    choices = _get(raw, "choices")
    if isinstance(choices, Sequence) and choices:
        return _get(choices[0], "finish_reason") == "length"
    return _get(raw, "stop_reason") == "max_tokens" or _get(raw, "done_reason") == "length"


def _map_error(name: str, exc: Exception) -> LLMError:
    kinds = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, TimeoutError | asyncio.TimeoutError) or kinds & {"APITimeoutError", "TimeoutException"}:
        return LLMTimeoutError(f"{name}: timed out ({exc})")
    if isinstance(exc, ConnectionError) or kinds & {"APIConnectionError", "ConnectError"}:
        return LLMConnectionError(f"{name}: cannot reach the model ({exc})")
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return LLMStatusError(f"{name}: HTTP {status}: {exc}", status)
    return LLMError(f"{name}: {type(exc).__name__}: {exc}")
