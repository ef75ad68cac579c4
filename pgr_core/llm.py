"""The LLM side: a one-method protocol, an OpenAI-compatible client, and JSON output checking.

Any object with ``complete(messages, schema=..., max_tokens=...) -> Completion`` is an LLM to pgr.
:class:`OpenAICompatible` reaches OpenAI, vLLM, Ollama, LM Studio and llama.cpp servers; adapters can
wrap other frameworks' models behind the same protocol.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from .errors import (
    ConfigurationError,
    InvalidArgumentError,
    LLMConnectionError,
    LLMError,
    LLMOutputError,
    LLMStatusError,
    LLMTimeoutError,
)

__all__ = ["LLM", "Completion", "OpenAICompatible", "Usage", "estimate_tokens", "llm_from_env", "parse_json"]

Message = Mapping[str, str]


def estimate_tokens(text: str) -> int:
    """A text's length in tokens, guessed as characters / 4 (prompt budgets, servers that report none)."""
    return len(text) // 4


StructuredMode = Literal["auto", "json_schema", "json_object", "none"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False  # the server reported no usage; counted as characters / 4

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def estimate(cls, messages: Sequence[Message], text: str, *, estimated: bool = True) -> Usage:
        """Token counts guessed as characters / 4, for servers (and stand-ins) that report none."""
        prompt = sum(estimate_tokens(m.get("content", "")) for m in messages)
        return cls(prompt, estimate_tokens(text), estimated=estimated)


@dataclass(frozen=True)
class Completion:
    text: str
    usage: Usage = Usage()
    model: str = ""
    seconds: float = 0.0
    truncated: bool = False  # the server stopped at max_tokens


class LLM(ABC):
    """A chat model. Implement :meth:`complete`; :meth:`acomplete` runs it in a thread by default.

    Set ``accepts_timeout`` when :meth:`complete` and :meth:`acomplete` also take ``timeout=`` (seconds
    for the whole call, retries and waits included): under a :class:`~pgr_core.types.Budget` deadline pgr
    then passes the time left. Without it, pgr abandons a call still running when the deadline passes.
    """

    name: str = "llm"
    accepts_timeout: ClassVar[bool] = False

    @abstractmethod
    def complete(
        self,
        messages: Sequence[Message],
        *,
        schema: Mapping[str, Any] | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
    ) -> Completion:
        """Return the model's reply to ``messages``.

        With ``schema`` (a JSON schema of an object), the reply text must be JSON matching it; servers
        that can constrain decoding should. Raises :class:`~pgr_core.errors.LLMError` subclasses only.
        """

    async def acomplete(
        self,
        messages: Sequence[Message],
        *,
        schema: Mapping[str, Any] | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
    ) -> Completion:
        return await asyncio.to_thread(
            self.complete, messages, schema=schema, max_tokens=max_tokens, temperature=temperature
        )


# --------------------------------------------------------------------------- JSON output


def _extract_json_text(text: str) -> str:
    """The JSON object in a reply, tolerating code fences and chatter around it."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        text = fenced.group(1)
    start = text.find("{")
    end = text.rfind("}")
    if start == -1 or end < start:
        return text.strip()
    return text[start : end + 1]


def _check(value: Any, schema: Mapping[str, Any], path: str) -> None:
    kind = schema.get("type")
    checks: dict[str, type | tuple[type, ...]] = {
        "object": dict,
        "array": list,
        "string": str,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
    }
    if isinstance(kind, str) and kind in checks:
        ok = isinstance(value, checks[kind]) and not (kind in ("integer", "number") and isinstance(value, bool))
        if not ok:
            raise LLMOutputError(f"{path or 'reply'} should be {kind}, got {type(value).__name__}")
    if kind == "object":
        for key in schema.get("required", ()):
            if key not in value:
                raise LLMOutputError(f"{path or 'reply'} lacks required key {key!r}")
        for key, sub in schema.get("properties", {}).items():
            if key in value and value[key] is not None:
                _check(value[key], sub, f"{path}.{key}" if path else key)
    elif kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]")


def parse_json(text: str, schema: Mapping[str, Any] | None = None) -> Any:
    """Parse a model's JSON reply and check it against the (small subset of) JSON schema pgr uses.

    Raises :class:`LLMOutputError` with the raw text attached when the reply is unusable.
    """
    try:
        value = json.loads(_extract_json_text(text), strict=False)  # a raw newline inside a string is still an answer
    except json.JSONDecodeError as exc:
        raise LLMOutputError(f"reply is not valid JSON ({exc.msg})", raw=text) from None
    if schema is not None:
        try:
            _check(value, schema, "")
        except LLMOutputError as exc:
            raise LLMOutputError(str(exc), raw=text) from None
    return value


# --------------------------------------------------------------------------- OpenAI-compatible client

_RETRY_STATUSES = {408, 409, 429, 500, 502, 503, 504}
_FORMAT_REJECTION_STATUSES = {400, 422, 500}


class OpenAICompatible(LLM):
    """Any OpenAI-compatible chat server, through the ``openai`` package.

    Structured output: ``structured="auto"`` asks for ``{"type": "json_schema", ...}`` first and, when
    the server rejects it (llama.cpp answers 500), switches to ``{"type": "json_object", "schema":
    ...}`` for the rest of the client's life. Errors 408/409/429/5xx are retried with exponential
    backoff (honouring ``Retry-After``), ``max_retries`` times.

    ``timeout`` bounds each attempt; a ``timeout=`` passed to :meth:`complete` bounds the whole call
    (waiting for a free slot, every attempt and every backoff): a ``Retry-After`` longer than the time
    left ends the call at once. ``max_concurrency`` (16) bounds the requests in flight, and so the
    connections in use: across threads for :meth:`complete`, per event loop for :meth:`acomplete`.
    A call waits for a free slot; the slot is released while it backs off.

    >>> llm = OpenAICompatible(base_url="http://127.0.0.1:8081/v1", model="qwen")  # doctest: +SKIP
    """

    accepts_timeout = True

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        structured: StructuredMode = "auto",
        max_concurrency: int = 16,
    ) -> None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise InvalidArgumentError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        if structured not in ("auto", "json_schema", "json_object", "none"):
            raise InvalidArgumentError(
                f"structured must be 'auto', 'json_schema', 'json_object' or 'none', got {structured!r}"
            )
        if timeout <= 0 or max_retries < 0 or backoff < 0:
            raise InvalidArgumentError("timeout must be > 0, max_retries and backoff >= 0")
        self.base_url = base_url or os.environ.get("PGR_LLM_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
        self.model = model or os.environ.get("PGR_LLM_MODEL") or os.environ.get("OPENAI_MODEL")
        if not self.model:
            if self.base_url:
                self.model = "default"  # llama.cpp, vLLM with one model: any name works
            else:
                raise ConfigurationError("no model given: pass model=... or set PGR_LLM_MODEL")
        key = api_key or os.environ.get("PGR_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY")
        if not key:
            if not self.base_url:
                raise ConfigurationError(
                    "no API key for OpenAI: set PGR_LLM_API_KEY (or OPENAI_API_KEY), "
                    "or point PGR_LLM_BASE_URL at a local OpenAI-compatible server"
                )
            key = "not-needed"  # local servers ignore it, the openai package insists on one
        self._api_key = key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.structured: StructuredMode = structured
        self.name = f"openai-compatible:{self.model}"
        self.max_concurrency = max_concurrency
        self._client: Any = None
        self._slots = threading.BoundedSemaphore(max_concurrency)  # sync requests in flight
        # One async client and one slot semaphore per event loop: pooled connections die with the loop
        # that opened them (asyncio.run twice), and an asyncio.Semaphore belongs to one loop.
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, asyncio.Semaphore]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OpenAICompatible(base_url={self.base_url!r}, model={self.model!r})"

    # -- the openai clients, built on first use so importing pgr stays cheap
    def _openai(self) -> Any:
        try:
            import openai
        except ImportError as exc:  # pragma: no cover - openai is a core dependency
            raise ConfigurationError("the openai package is missing: pip install openai") from exc
        return openai

    def _sync_client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._openai().OpenAI(
                    base_url=self.base_url, api_key=self._api_key, timeout=self.timeout, max_retries=0
                )
            return self._client

    def _async_state(self) -> tuple[Any, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._per_loop.get(loop)
            if state is None:
                client = self._openai().AsyncOpenAI(
                    base_url=self.base_url, api_key=self._api_key, timeout=self.timeout, max_retries=0
                )
                state = self._per_loop[loop] = (client, asyncio.Semaphore(self.max_concurrency))
            return state

    # -- request building and error mapping, shared by sync and async
    def _mode_for(self, schema: Mapping[str, Any] | None) -> str:
        if schema is None or self.structured == "none":
            return "none"
        return "json_schema" if self.structured == "auto" else self.structured

    @staticmethod
    def _request(
        model: str,
        messages: Sequence[Message],
        schema: Mapping[str, Any] | None,
        mode: str,
        max_tokens: int,
        temperature: float,
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": [dict(m) for m in messages],
            "max_tokens": max_tokens,
            "temperature": temperature,
        }
        if mode == "json_schema" and schema is not None:
            kwargs["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": dict(schema), "strict": False},
            }
        elif mode == "json_object" and schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": dict(schema)}
        return kwargs

    def _map_error(self, exc: Exception, waited: float | None = None) -> LLMError:
        openai = self._openai()
        if isinstance(exc, openai.APITimeoutError):
            return LLMTimeoutError(f"{self.name}: no answer within {waited or self.timeout:.3g}s")
        if isinstance(exc, openai.APIConnectionError):
            return LLMConnectionError(f"{self.name}: cannot reach {self.base_url or 'api.openai.com'} ({exc})")
        if isinstance(exc, openai.APIStatusError):
            return LLMStatusError(f"{self.name}: HTTP {exc.status_code}: {exc.message}", exc.status_code)
        return LLMError(f"{self.name}: {type(exc).__name__}: {exc}")

    def _retry_delay(self, exc: Exception, attempt: int) -> float:
        headers = getattr(getattr(exc, "response", None), "headers", None) or {}
        after = headers.get("retry-after") if hasattr(headers, "get") else None
        if after is not None:
            try:
                return min(max(float(after), 0.0), self.max_backoff)
            except ValueError:
                pass
        return min(self.backoff * (2**attempt) * (0.5 + random.random() / 2), self.max_backoff)

    def _decide(self, exc: Exception, mode: str, attempt: int) -> tuple[str, float | None]:
        """After a failed attempt: the mode for the next one and how long to wait (None: give up)."""
        openai = self._openai()
        status = getattr(exc, "status_code", None) if isinstance(exc, openai.APIStatusError) else None
        if mode == "json_schema" and self.structured == "auto" and status in _FORMAT_REJECTION_STATUSES:
            self.structured = "json_object"  # remembered: this server wants llama.cpp's form
            return "json_object", 0.0
        if attempt >= self.max_retries:
            return mode, None
        if status in _RETRY_STATUSES:
            return mode, self._retry_delay(exc, attempt)
        return mode, None

    def _completion(self, response: Any, messages: Sequence[Message], started: float) -> Completion:
        choice = response.choices[0] if getattr(response, "choices", None) else None
        text = (choice.message.content if choice and choice.message else None) or ""
        usage = getattr(response, "usage", None)
        if usage is not None and getattr(usage, "prompt_tokens", None) is not None:
            counted = Usage(int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0))
        else:
            counted = Usage.estimate(messages, text)
        return Completion(
            text=text,
            usage=counted,
            model=str(getattr(response, "model", "") or self.model),
            seconds=time.perf_counter() - started,
            truncated=bool(choice and choice.finish_reason == "length"),
        )

    # -- the protocol
    def _time_left(self, started: float, timeout: float | None) -> float | None:
        """Seconds left of a whole-call ``timeout`` (None: no overall bound); raises once none is left."""
        if timeout is None:
            return None
        left = timeout - (time.perf_counter() - started)
        if left <= 0:
            raise LLMTimeoutError(f"{self.name}: no answer within {timeout:.3g}s")
        return left

    def _next_try(
        self, exc: Exception, mode: str, attempt: int, started: float, timeout: float | None
    ) -> tuple[str, float]:
        """After a failed attempt: the next mode and the wait before it, or raise the mapped error."""
        next_mode, delay = self._decide(exc, mode, attempt)
        if delay is not None and timeout is not None and time.perf_counter() - started + delay >= timeout:
            delay = None  # a Retry-After (or backoff) longer than the time left: give up now
        if delay is None:
            raise self._map_error(exc, timeout) from exc
        return next_mode, delay

    def complete(
        self,
        messages: Sequence[Message],
        *,
        schema: Mapping[str, Any] | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
        timeout: float | None = None,
    ) -> Completion:
        mode, attempt, started = self._mode_for(schema), 0, time.perf_counter()
        while True:
            left = self._time_left(started, timeout)
            kwargs = self._request(self.model or "", messages, schema, mode, max_tokens, temperature)
            if left is not None:
                kwargs["timeout"] = min(left, self.timeout)
            if not self._slots.acquire(timeout=left):
                raise LLMTimeoutError(f"{self.name}: no free request slot within {timeout:.3g}s")
            try:
                response = self._sync_client().chat.completions.create(**kwargs)
                return self._completion(response, messages, started)
            except Exception as exc:  # every failure is mapped to an LLMError below
                failure = exc
            finally:
                self._slots.release()
            next_mode, delay = self._next_try(failure, mode, attempt, started, timeout)
            attempt += 0 if next_mode != mode else 1  # a format switch is no retry, Retry-After: 0 is
            mode = next_mode
            time.sleep(delay)

    async def acomplete(
        self,
        messages: Sequence[Message],
        *,
        schema: Mapping[str, Any] | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
        timeout: float | None = None,
    ) -> Completion:
        mode, attempt, started = self._mode_for(schema), 0, time.perf_counter()
        client, slots = self._async_state()
        while True:
            left = self._time_left(started, timeout)
            kwargs = self._request(self.model or "", messages, schema, mode, max_tokens, temperature)
            if left is not None:
                kwargs["timeout"] = min(left, self.timeout)
            try:
                await asyncio.wait_for(slots.acquire(), left)
            except TimeoutError:
                raise LLMTimeoutError(f"{self.name}: no free request slot within {timeout:.3g}s") from None
            try:
                response = await client.chat.completions.create(**kwargs)
                return self._completion(response, messages, started)
            except Exception as exc:
                failure = exc
            finally:
                slots.release()
            next_mode, delay = self._next_try(failure, mode, attempt, started, timeout)
            attempt += 0 if next_mode != mode else 1  # a format switch is no retry, Retry-After: 0 is
            mode = next_mode
            await asyncio.sleep(delay)


def llm_from_env(timeout: float | None = None) -> LLM | None:
    """The LLM the environment configures, or ``None`` when nothing is set.

    Reads ``PGR_LLM_BASE_URL``, ``PGR_LLM_MODEL``, ``PGR_LLM_API_KEY`` (or OpenAI's ``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY``). ``PGR_LLM=none`` forces no LLM. ``timeout`` (seconds per request) wins over
    ``PGR_LLM_TIMEOUT`` (default 60), so a command-line ``--llm-timeout`` holds whatever set the URL.
    """
    if os.environ.get("PGR_LLM", "").lower() == "none":
        return None
    names = ("PGR_LLM_BASE_URL", "PGR_LLM_MODEL", "PGR_LLM_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY")
    if not any(os.environ.get(n) for n in names):
        return None
    if timeout is None:
        timeout = float(os.environ.get("PGR_LLM_TIMEOUT", "60"))
    return OpenAICompatible(timeout=timeout)
