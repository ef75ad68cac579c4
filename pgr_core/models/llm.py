"""The LLM side: a one-method protocol, an OpenAI-compatible client, and JSON output checking.

Any object with ``complete(messages, schema=..., max_tokens=...) -> Completion`` is an LLM to pgr.
:class:`OpenAICompatible` reaches OpenAI, vLLM, Ollama, LM Studio and llama.cpp servers; adapters can
wrap other frameworks' models behind the same protocol.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import re
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

from pgr_core.errors import (
    ConfigurationError,
    InvalidArgumentError,
    LLMConnectionError,
    LLMError,
    LLMOutputError,
    LLMStatusError,
    LLMTimeoutError,
)
from pgr_core.flow.timeouts import default_llm_timeout

__all__ = [
    "LLM",
    "MAX_JSON_DEPTH",
    "MAX_REPLY_BYTES",
    "MAX_REPLY_CHARS",
    "MAX_USAGE_TOKENS",
    "CallFlow",
    "CallOptions",
    "Completion",
    "OpenAICompatible",
    "Request",
    "Sleep",
    "Usage",
    "WrappedLLM",
    "estimate_tokens",
    "llm_from_env",
    "complete_objects",
    "parse_json",
    "plausible_usage",
]

Message = Mapping[str, str]
Schema = Mapping[str, Any] | None  # a JSON schema of an object, or None for free text


def estimate_tokens(text: str) -> int:
    """A text's length in tokens, guessed as characters / 4 (prompt budgets, servers that report none)."""
    return len(text) // 4


StructuredMode = Literal["auto", "json_schema", "json_object", "none"]


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False  # the server reported no (or no believable) usage; counted as characters / 4

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def estimate(cls, messages: Sequence[Message], text: str, *, estimated: bool = True) -> Usage:
        """Token counts guessed as characters / 4, for servers (and stand-ins) that report none."""
        prompt = sum(estimate_tokens(m.get("content", "")) for m in messages)
        return cls(prompt, estimate_tokens(text), estimated=estimated)


MAX_USAGE_TOKENS = 10_000_000  # no single call spends more; a larger reported count is a broken server
_USAGE_SLACK = 100  # a reported count may exceed the characters / 4 guess this many times over
_USAGE_FLOOR = 1_000  # ... or this many tokens (chat templates, tiny prompts), whichever is more


def _believable(value: Any, ceiling: int) -> int | None:
    """``value`` as a token count when it is a whole number in [0, ceiling], else None."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= ceiling:
        return None
    return value


def plausible_usage(
    prompt_tokens: Any, completion_tokens: Any, messages: Sequence[Message], text: str, *, max_tokens: int = 0
) -> Usage:
    """Token counts a server reported, each believed only when plausible, else the local estimate.

    A count is believed when it is a whole number, not negative, at most :data:`MAX_USAGE_TOKENS`
    and at most 100 times the characters / 4 guess (or 1,000 tokens; for the completion, also
    ``max_tokens``). A replaced count marks the usage ``estimated``: a server reporting -5 tokens
    cannot undo a :class:`~pgr_core.types.Budget`'s ``max_tokens``, nor 10^30 exhaust it.
    """
    guess = Usage.estimate(messages, text)
    ceiling = max(_USAGE_SLACK * guess.prompt_tokens, _USAGE_FLOOR)
    prompt = _believable(prompt_tokens, min(ceiling, MAX_USAGE_TOKENS))
    ceiling = max(_USAGE_SLACK * guess.completion_tokens, _USAGE_FLOOR, max_tokens)
    completion = _believable(completion_tokens, min(ceiling, MAX_USAGE_TOKENS))
    return Usage(
        guess.prompt_tokens if prompt is None else prompt,
        guess.completion_tokens if completion is None else completion,
        estimated=prompt is None or completion is None,
    )


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
    accepts_timeout: bool = False  # a class attribute; a wrapper sets it per instance, from what it wraps

    @abstractmethod
    def complete(
        self, messages: Sequence[Message], *, schema: Schema = None, max_tokens: int = 512, temperature: float = 0.0
    ) -> Completion:
        """Return the model's reply to ``messages``.

        With ``schema`` (a JSON schema of an object), the reply text must be JSON matching it; servers
        that can constrain decoding should. Raises :class:`~pgr_core.errors.LLMError` subclasses only.
        """

    async def acomplete(
        self, messages: Sequence[Message], *, schema: Schema = None, max_tokens: int = 512, temperature: float = 0.0
    ) -> Completion:
        return await asyncio.to_thread(
            self.complete, messages, schema=schema, max_tokens=max_tokens, temperature=temperature
        )


# --------------------------------------------------------------------------- one call, written once


class CallOptions(TypedDict, total=False):
    """The keyword arguments of a call, past ``messages`` (each described in :class:`Request`)."""

    schema: Schema
    max_tokens: int
    temperature: float
    timeout: float | None


@dataclass(frozen=True)
class Request:
    """One call to a model, as a :data:`CallFlow` hands it on."""

    messages: Sequence[Message]
    schema: Schema = None  # the reply must be JSON matching it (None: free text)
    max_tokens: int = 512
    temperature: float = 0.0
    timeout: float | None = None  # seconds for the whole call (None: unbounded)


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds``: ``time.sleep`` under :meth:`~LLM.complete`, ``asyncio.sleep`` under
    :meth:`~LLM.acomplete`."""

    seconds: float


CallFlow = Generator[Any, Any, Completion]
"""One call written once for both APIs: a generator that yields effects (something to send, a
:class:`Sleep`), receives what each came to (an error is raised at the ``yield`` that asked for it)
and returns the caller's completion."""


class _Steps:
    """A flow taken one effect at a time: iterating gives its effects; what each came to is handed back
    through ``result`` or ``error`` before the next one; ``value`` is what the flow returned."""

    def __init__(self, flow: CallFlow) -> None:
        self._flow = flow
        self.result: Any = None
        self.error: Exception | None = None
        self.value: Any = None

    def __iter__(self) -> _Steps:
        return self

    def __next__(self) -> Any:
        result, error = self.result, self.error
        self.result, self.error = None, None
        try:
            return self._flow.throw(error) if error is not None else self._flow.send(result)
        except StopIteration as stop:
            self.value = stop.value
            raise


class _FlowLLM(LLM):
    """An LLM whose call is one :data:`CallFlow` (:meth:`_call`), driven with blocking calls by
    :meth:`complete` and with awaited ones by :meth:`acomplete`: the two never copy each other.
    A subclass writes the flow and the two ways of sending what it yields (:meth:`_send`,
    :meth:`_asend`); a :class:`Sleep` is performed here."""

    def complete(self, messages: Sequence[Message], **options: Unpack[CallOptions]) -> Completion:
        steps = _Steps(self._call(Request(messages, **options)))
        for effect in steps:
            try:
                steps.result = self._perform(effect)
            except Exception as exc:  # raised inside the flow, where it asked
                steps.error = exc
        return steps.value

    async def acomplete(self, messages: Sequence[Message], **options: Unpack[CallOptions]) -> Completion:
        steps = _Steps(self._call(Request(messages, **options)))
        for effect in steps:
            try:
                steps.result = await self._aperform(effect)
            except Exception as exc:  # raised inside the flow, where it asked
                steps.error = exc
        return steps.value

    def _perform(self, effect: Any) -> Any:
        if isinstance(effect, Sleep):
            time.sleep(effect.seconds)
            return None
        return self._send(effect)

    async def _aperform(self, effect: Any) -> Any:
        if isinstance(effect, Sleep):
            await asyncio.sleep(effect.seconds)
            return None
        return await self._asend(effect)

    @abstractmethod
    def _call(self, request: Request) -> CallFlow:
        """The call, written once: yields what to send (and any :class:`Sleep`), returns the completion."""

    @abstractmethod
    def _send(self, effect: Any) -> Any:
        """Send what the flow yielded, blocking; return the answer."""

    @abstractmethod
    async def _asend(self, effect: Any) -> Any:
        """Send what the flow yielded, awaiting; return the answer."""


class WrappedLLM(_FlowLLM):
    """An LLM that hands each call on to another model, ``inner``, with something done around it:
    caching replies, counting calls, injecting faults, adapting another framework's model.

    A subclass overrides one method, :meth:`_call`, a generator that serves :meth:`complete` and
    :meth:`acomplete` alike. ``completion = yield request`` hands a :class:`Request` on to ``inner``
    (``inner.complete`` under ``complete``, ``await inner.acomplete`` under ``acomplete``) and receives
    its reply, or has its error raised right there; ``yield Sleep(seconds)`` waits; what the generator
    returns is the caller's completion, whether ``inner`` was asked or not.

    ``name`` and ``model`` default to the inner model's, and ``accepts_timeout`` is the inner model's,
    so a ``timeout=`` reaches an inner model that takes one (and only such a model). An adapter of
    another framework's model passes it as ``inner`` and overrides :meth:`_send` and :meth:`_asend`,
    the two places where a request meets it.

    >>> class Counting(WrappedLLM):
    ...     calls = 0
    ...     def _call(self, request):
    ...         self.calls += 1  # once per call, sync or async
    ...         return (yield request)
    """

    def __init__(self, inner: Any, *, name: str | None = None) -> None:
        own = str(getattr(inner, "name", None) or type(inner).__name__)
        self.inner = inner
        self.name = name or own
        self.model = str(getattr(inner, "model", None) or own)
        self.accepts_timeout = bool(getattr(inner, "accepts_timeout", False))

    @property
    def llm(self) -> Any:
        """The same as ``inner``: ``CachedLLM``, ``Meter`` and ``LlamaIndexLLM`` always called it ``llm``."""
        return self.inner

    def _call(self, request: Request) -> CallFlow:
        """Override: what is done around each call. By default nothing: the request goes on as it came."""
        return (yield request)

    def _send(self, request: Request) -> Any:
        return self.inner.complete(request.messages, **self._options(request))

    async def _asend(self, request: Request) -> Any:
        return await self.inner.acomplete(request.messages, **self._options(request))

    def _options(self, request: Request) -> CallOptions:
        """The request's keyword arguments for ``inner``: ``timeout`` only where it takes one."""
        options = CallOptions(schema=request.schema, max_tokens=request.max_tokens, temperature=request.temperature)
        if request.timeout is not None and getattr(self.inner, "accepts_timeout", False):
            options["timeout"] = request.timeout
        return options


# --------------------------------------------------------------------------- JSON output

MAX_REPLY_CHARS = 4_000_000
"""The longest reply :func:`parse_json` reads (characters); longer is unusable output, left unparsed."""

MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects :func:`parse_json` accepts; pgr's schemas need 4."""

_ESCAPE = re.compile(r"\\.", re.DOTALL)
_STRING = re.compile(r'"[^"]*"')  # once escapes are gone; linear, where one regex for both backtracks
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _nesting(text: str) -> int:
    """How deep ``text`` nests arrays and objects, brackets inside strings not counted (no parsing:
    json's C scanner recurses once per level, so a 2 KB reply 1,000 levels deep is a RecursionError)."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", _ESCAPE.sub("", text)))
    return max(itertools.accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# how pgr reads a reply: a raw newline inside a string is still an answer (strict=False); NaN and
# Infinity are not numbers
_DECODER = json.JSONDecoder(strict=False, parse_constant=_no_constant)


def _loads(text: str, *, max_chars: int, max_depth: int, what: str = "reply") -> Any:
    """``json.loads`` with the size and depth checked first; every failure is :class:`LLMOutputError`."""
    if len(text) > max_chars:
        raise LLMOutputError(f"{what} is {len(text):,} characters, more than the {max_chars:,} pgr reads")
    depth = _nesting(text)
    if depth > max_depth:
        raise LLMOutputError(f"{what} nests {depth} levels deep, more than the {max_depth} pgr reads")
    try:
        return _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise LLMOutputError(f"{what} is not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit integer, NaN, Infinity
        raise LLMOutputError(f"{what} is not usable JSON ({str(exc)[:120]})") from None


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


_KINDS: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def _is(value: Any, kind: str) -> bool:
    if kind not in _KINDS:
        return True  # a type pgr does not check
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _KINDS[kind])


def _check(value: Any, schema: Mapping[str, Any], path: str) -> None:
    where = path or "reply"
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else list(kind) if isinstance(kind, list) else []
    if kinds and not any(_is(value, k) for k in kinds):
        shown = "null" if value is None else type(value).__name__
        raise LLMOutputError(f"{where} should be {' or '.join(kinds)}, got {shown}")
    if isinstance(value, dict) and "object" in kinds:
        properties = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                raise LLMOutputError(f"{where} lacks required key {key!r}")
            if value[key] is None and not _allows_null(properties.get(key, {})):
                raise LLMOutputError(f"{path + '.' if path else ''}{key} is null")
        for key, sub in properties.items():
            if key in value and value[key] is not None:  # an optional key may be null: the caller's default
                _check(value[key], sub, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and "array" in kinds and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]")


def _allows_null(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "null" or (isinstance(kind, list) and "null" in kind)


def parse_json(
    text: str,
    schema: Schema = None,
    *,
    max_chars: int = MAX_REPLY_CHARS,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Parse a model's JSON reply and check it against the (small subset of) JSON schema pgr uses.

    Raises :class:`LLMOutputError` with the raw text attached when the reply is unusable: not JSON,
    longer than ``max_chars``, nested deeper than ``max_depth``, a number Python will not read (5,000
    digits, NaN), a wrong type, a missing or null required key. An optional key may be null.
    """
    if not isinstance(text, str):
        raise LLMOutputError(f"reply should be text, got {type(text).__name__}")
    if len(text) > max_chars:  # not even searched for JSON
        raise LLMOutputError(
            f"reply is {len(text):,} characters, more than the {max_chars:,} pgr reads", raw=text[:2000]
        )
    try:
        value = _loads(_extract_json_text(text), max_chars=max_chars, max_depth=max_depth)
        if schema is not None:
            _check(value, schema, "")
    except LLMOutputError as exc:
        raise LLMOutputError(str(exc), raw=text) from None
    return value


def complete_objects(
    text: str,
    schema: Schema,
    *,
    key: str,
    max_chars: int = MAX_REPLY_CHARS,
    max_depth: int = MAX_JSON_DEPTH,
) -> list[Any]:
    """The whole JSON objects opening with ``"key":`` in a reply cut off part-way (at the token limit),
    each checked against ``schema``: the one the cut fell in, and any that fail the schema, are left out.

    The same guards as :func:`parse_json` (size, nesting depth, numbers Python will not read), so a
    cut-off reply of garbage yields nothing rather than an error."""
    text = text[:max_chars]
    if _nesting(text) > max_depth:
        return []
    found: list[Any] = []
    taken = 0  # the end of the last object read: a match before it lies inside that object
    for match in re.finditer(r'\{\s*"' + re.escape(key) + r'"\s*:', text):
        if match.start() < taken:
            continue
        try:
            value, end = _DECODER.raw_decode(text, match.start())
            if schema is not None:
                _check(value, schema, "")
        except (ValueError, RecursionError, LLMOutputError):  # the object the cut fell in, or a wrong one
            continue
        found.append(value)
        taken = end
    return found


# --------------------------------------------------------------------------- OpenAI-compatible client

_RETRY_STATUSES = {408, 409, 429, 500, 502, 503, 504}
_FORMAT_REJECTION_STATUSES = {400, 422, 500}

MAX_REPLY_BYTES = 1 << 20
"""The default cap on a reply's HTTP body (1 MiB, some 250,000 tokens of text): beyond it the body is
left unread and the reply is unusable output."""


class _Body:
    """A reply body read chunk by chunk: at most ``limit`` bytes, and nothing once ``until`` (a
    ``time.perf_counter()`` instant) has passed, so neither a huge body nor one trickled a byte at a
    time holds the caller."""

    def __init__(self, name: str, limit: int, until: float, waited: float) -> None:
        self.name, self.limit, self.until, self.waited = name, limit, until, waited
        self.parts: list[bytes] = []
        self.size = 0

    def expect(self, headers: Any) -> None:
        """Refuse a body whose announced length is over the cap before reading any of it."""
        announced = headers.get("content-length") if hasattr(headers, "get") else None
        if announced is not None and announced.isdigit() and int(announced) > self.limit:
            raise self._too_long(int(announced))

    def feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise self._too_long(self.size)
        if time.perf_counter() > self.until:
            raise LLMTimeoutError(f"{self.name}: no answer within {self.waited:.3g}s (the reply was still arriving)")
        self.parts.append(chunk)

    def text(self) -> str:
        return b"".join(self.parts).decode("utf-8", errors="replace")

    def _too_long(self, size: int) -> LLMOutputError:
        return LLMOutputError(
            f"{self.name}: the reply is over {self.limit:,} bytes ({size:,} seen), cut off unread; "
            "raise max_reply_bytes if the model really writes that much"
        )


def _within(seconds: float, call: Callable[[], Completion], late: LLMTimeoutError) -> Completion:
    """Run a blocking HTTP exchange in a daemon thread and wait ``seconds`` for it at most: a socket's
    read timeout restarts with every byte, so only a wait from outside bounds a trickling server.
    An abandoned exchange ends at its own next chunk (``_Body``) or read timeout."""
    box: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as exc:  # handed to the waiting thread
            box.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="pgr-llm-http", daemon=True).start()
    if not done.wait(max(seconds, 0.0)):
        raise late
    ok, value = box[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


@dataclass(frozen=True)
class _Exchange:
    """One HTTP attempt, as :meth:`OpenAICompatible._call` asks for it."""

    request: Request
    kwargs: dict[str, Any]  # the arguments of openai's chat.completions.create
    body: _Body  # reads the reply: at most max_reply_bytes, and only until `bound` has passed
    bound: float  # seconds the exchange may take, headers and body
    late: LLMTimeoutError  # raised when it takes longer
    left: float | None  # seconds left of the whole call: the longest wait for a free slot (None: no bound)
    started: float  # when the call began (time.perf_counter())


class OpenAICompatible(_FlowLLM):
    """Any OpenAI-compatible chat server, through the ``openai`` package.

    Structured output: ``structured="auto"`` asks for ``{"type": "json_schema", ...}`` first and, when
    the server rejects it (llama.cpp answers 500), switches to ``{"type": "json_object", "schema":
    ...}`` for the rest of the client's life. Errors 408/409/429/5xx are retried with exponential
    backoff (honouring ``Retry-After``), ``max_retries`` times.

    ``timeout`` bounds each attempt, whole: headers and body, however slowly they trickle in. Left
    None it is ``PGR_LLM_TIMEOUT``, else 600 s for a server on this machine or the private network and
    60 s for any other (:func:`~pgr_core.flow.timeouts.default_llm_timeout`). A
    ``timeout=`` passed to :meth:`complete` bounds the whole call (waiting for a free slot, every
    attempt and every backoff): a ``Retry-After`` longer than the time left ends the call at once.
    ``max_concurrency`` (16) bounds the requests in flight, and so the connections in use: across
    threads for :meth:`complete`, per event loop for :meth:`acomplete`. A call waits for a free slot;
    the slot is released while it backs off.

    The reply is read as it streams in and never trusted: a body over ``max_reply_bytes``
    (:data:`MAX_REPLY_BYTES`) is cut off unread, and a body that is not a chat completion (too deep,
    wrong types) is :class:`~pgr_core.errors.LLMOutputError`, as is bad output; reported token counts
    go through :func:`plausible_usage`.

    >>> llm = OpenAICompatible(base_url="http://127.0.0.1:8081/v1", model="qwen")  # doctest: +SKIP
    """

    accepts_timeout = True

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | None = None,
        max_retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 20.0,
        structured: StructuredMode = "auto",
        max_concurrency: int = 16,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise InvalidArgumentError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        if isinstance(max_reply_bytes, bool) or not isinstance(max_reply_bytes, int) or max_reply_bytes < 1:
            raise InvalidArgumentError(f"max_reply_bytes must be an integer >= 1, got {max_reply_bytes!r}")
        if structured not in ("auto", "json_schema", "json_object", "none"):
            raise InvalidArgumentError(
                f"structured must be 'auto', 'json_schema', 'json_object' or 'none', got {structured!r}"
            )
        self.base_url = base_url or os.environ.get("PGR_LLM_BASE_URL") or os.environ.get("OPENAI_BASE_URL")
        if timeout is None:  # a CPU model on this machine needs minutes, a hosted API seconds
            timeout = default_llm_timeout(self.base_url)
        if timeout <= 0 or max_retries < 0 or backoff < 0:
            raise InvalidArgumentError("timeout must be > 0, max_retries and backoff >= 0")
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
        self.max_reply_bytes = max_reply_bytes
        self._client: Any = None
        self._slots = threading.BoundedSemaphore(max_concurrency)  # sync requests in flight
        # One async client and one slot semaphore per event loop: pooled connections die with the loop
        # that opened them (asyncio.run twice), and an asyncio.Semaphore belongs to one loop.
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, asyncio.Semaphore, Any]] = (
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

    async def _async_state(self) -> tuple[Any, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._per_loop.get(loop)
            fresh = state is None
            if state is None:
                client = self._openai().AsyncOpenAI(
                    base_url=self.base_url, api_key=self._api_key, timeout=self.timeout, max_retries=0
                )
                closer = _closed_with_loop(client)
                state = self._per_loop[loop] = (client, asyncio.Semaphore(self.max_concurrency), closer)
        if fresh:
            # started in this loop, so the loop's shutdown_asyncgens (asyncio.run does it) finishes it:
            # the client's connections are closed while the loop can still run the close
            await state[2].__anext__()
        return state[0], state[1]

    # -- request building and error mapping, shared by sync and async
    def _mode_for(self, schema: Schema) -> str:
        if schema is None or self.structured == "none":
            return "none"
        return "json_schema" if self.structured == "auto" else self.structured

    def _request(self, request: Request, mode: str) -> dict[str, Any]:
        """openai's ``chat.completions.create`` arguments for ``request``, its schema sent in ``mode``."""
        schema = request.schema
        kwargs: dict[str, Any] = {
            "model": self.model or "",
            "messages": [dict(m) for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
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
        if isinstance(exc, LLMError):
            return exc  # raised here already (a cut-off body, an unusable envelope, a deadline)
        openai = self._openai()
        if isinstance(exc, openai.APITimeoutError | TimeoutError) or "Timeout" in type(exc).__name__:
            return LLMTimeoutError(f"{self.name}: no answer within {waited or self.timeout:.3g}s")
        if isinstance(exc, openai.APIConnectionError):
            return LLMConnectionError(f"{self.name}: cannot reach {self.base_url or 'api.openai.com'} ({exc})")
        if isinstance(exc, openai.APIStatusError):
            return LLMStatusError(f"{self.name}: HTTP {exc.status_code}: {exc.message}", exc.status_code)
        if type(exc).__module__.split(".")[0].startswith(("httpx", "httpcore")):  # while reading the body
            return LLMConnectionError(f"{self.name}: the connection failed mid-reply ({type(exc).__name__}: {exc})")
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

    def _completion(self, body: str, request: Request, started: float) -> Completion:
        """The chat completion in a body, its shape checked (the envelope is as untrusted as the text)."""
        messages, max_tokens = request.messages, request.max_tokens
        try:
            data = _loads(body, max_chars=len(body), max_depth=MAX_JSON_DEPTH, what="the server's reply")
        except LLMOutputError as exc:
            raise LLMOutputError(f"{self.name}: {exc}", raw=body[:2000]) from None
        if not isinstance(data, dict):
            raise LLMOutputError(f"{self.name}: the server's reply is not a JSON object", raw=body[:2000])
        choices = data.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else {}
        message = choice.get("message") if isinstance(choice, dict) else None
        text = message.get("content") if isinstance(message, dict) else None
        shapes = (choices, list | None), (choice, dict), (message, dict | None), (text, str | None)
        if not all(isinstance(value, kind) for value, kind in shapes):
            raise LLMOutputError(f"{self.name}: the server's reply is not a chat completion", raw=body[:2000])
        text = text or ""
        usage = data.get("usage")
        if isinstance(usage, dict) and usage.get("prompt_tokens") is not None:
            counted = plausible_usage(
                usage.get("prompt_tokens"), usage.get("completion_tokens"), messages, text, max_tokens=max_tokens
            )
        else:
            counted = Usage.estimate(messages, text)
        model = data.get("model")
        return Completion(
            text=text,
            usage=counted,
            model=model if isinstance(model, str) and model else str(self.model),
            seconds=time.perf_counter() - started,
            truncated=choice.get("finish_reason") == "length",
        )

    # -- one HTTP exchange: the body streamed through a _Body, sync and async
    def _stream(self, exchange: _Exchange) -> Completion:
        with self._sync_client().chat.completions.with_streaming_response.create(**exchange.kwargs) as response:
            exchange.body.expect(response.headers)
            for chunk in response.iter_bytes():
                exchange.body.feed(chunk)
        return self._completion(exchange.body.text(), exchange.request, exchange.started)

    async def _astream(self, client: Any, exchange: _Exchange) -> Completion:
        async with client.chat.completions.with_streaming_response.create(**exchange.kwargs) as response:
            exchange.body.expect(response.headers)
            async for chunk in response.iter_bytes():
                exchange.body.feed(chunk)
        return self._completion(exchange.body.text(), exchange.request, exchange.started)

    # -- the protocol: one flow for complete and acomplete (attempt, switch format or back off, again)
    def _call(self, request: Request) -> CallFlow:
        """Attempt; after a failure switch the structured-output format, or back off, and attempt again,
        until a reply, a final error, or the end of ``request.timeout``."""
        mode, attempt, started = self._mode_for(request.schema), 0, time.perf_counter()
        while True:
            exchange = self._prepare(request, mode, self._time_left(started, request.timeout), started)
            try:
                return (yield exchange)
            except Exception as exc:  # every failure is mapped to an LLMError below
                failure = exc
            next_mode, delay = self._next_try(failure, mode, attempt, started, request.timeout)
            attempt += 0 if next_mode != mode else 1  # a format switch is no retry, Retry-After: 0 is
            mode = next_mode
            yield Sleep(delay)

    def _time_left(self, started: float, timeout: float | None) -> float | None:
        """Seconds left of a whole-call ``timeout`` (None: no overall bound); raises once none is left."""
        if timeout is None:
            return None
        left = timeout - (time.perf_counter() - started)
        if left <= 0:
            raise LLMTimeoutError(f"{self.name}: no answer within {timeout:.3g}s")
        return left

    def _prepare(self, request: Request, mode: str, left: float | None, started: float) -> _Exchange:
        """One attempt: its request, its body reader, how long it may take, and the error when it does."""
        timeout = request.timeout
        kwargs = self._request(request, mode)
        bound = self.timeout if left is None else min(left, self.timeout)
        waited = timeout if timeout is not None and left is not None and left <= self.timeout else self.timeout
        kwargs["timeout"] = bound
        body = _Body(self.name, self.max_reply_bytes, time.perf_counter() + bound, waited)
        late = LLMTimeoutError(f"{self.name}: no answer within {waited:.3g}s")
        return _Exchange(request, kwargs, body, bound, late, left, started)

    def _next_try(
        self, exc: Exception, mode: str, attempt: int, started: float, timeout: float | None
    ) -> tuple[str, float]:
        """After a failed attempt: the next mode and the wait before it, or raise the mapped error."""
        if isinstance(exc, LLMError):
            raise exc  # already final: cut off, unusable, or out of time
        next_mode, delay = self._decide(exc, mode, attempt)
        if delay is not None and timeout is not None and time.perf_counter() - started + delay >= timeout:
            delay = None  # a Retry-After (or backoff) longer than the time left: give up now
        if delay is None:
            raise self._map_error(exc, timeout) from exc
        return next_mode, delay

    def _no_slot(self, exchange: _Exchange) -> LLMTimeoutError:
        return LLMTimeoutError(f"{self.name}: no free request slot within {exchange.request.timeout:.3g}s")

    # -- sending one attempt: in a free request slot, bounded whole by its time
    def _send(self, exchange: _Exchange) -> Completion:
        if not self._slots.acquire(timeout=exchange.left):
            raise self._no_slot(exchange)

        def in_slot() -> Completion:
            try:
                return self._stream(exchange)
            finally:
                self._slots.release()  # by the exchange itself: an abandoned one keeps its connection

        return _within(exchange.bound, in_slot, exchange.late)

    async def _asend(self, exchange: _Exchange) -> Completion:
        client, slots = await self._async_state()
        try:
            await asyncio.wait_for(slots.acquire(), exchange.left)
        except TimeoutError:
            raise self._no_slot(exchange) from None
        try:
            async with asyncio.timeout(exchange.bound):
                return await self._astream(client, exchange)
        except TimeoutError:
            raise exchange.late from None
        finally:
            slots.release()


async def _closed_with_loop(client: Any) -> AsyncIterator[None]:
    """Holds ``client`` open until its event loop shuts its async generators down, then closes it: a
    loop per call (``asyncio.run`` per request) must not leave a socket behind each time."""
    try:
        yield
    finally:
        await client.close()


def llm_from_env(timeout: float | None = None) -> LLM | None:
    """The LLM the environment configures, or ``None`` when nothing is set.

    Reads ``PGR_LLM_BASE_URL``, ``PGR_LLM_MODEL``, ``PGR_LLM_API_KEY`` (or OpenAI's ``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY``). ``PGR_LLM=none`` forces no LLM. ``timeout`` (seconds per request) wins over
    ``PGR_LLM_TIMEOUT``, so a command-line ``--llm-timeout`` holds whatever set the URL; with neither,
    the server decides (600 s on this machine or the private network, 60 s elsewhere).
    """
    if os.environ.get("PGR_LLM", "").lower() == "none":
        return None
    names = ("PGR_LLM_BASE_URL", "PGR_LLM_MODEL", "PGR_LLM_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY")
    if not any(os.environ.get(n) for n in names):
        return None
    return OpenAICompatible(timeout=timeout)
