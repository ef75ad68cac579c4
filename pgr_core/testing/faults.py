"""Fault injection: an LLM and a store that fail on purpose, reproducibly (a seeded schedule).

:class:`FaultyLLM` wraps any :class:`~pgr_core.models.llm.LLM` and :class:`FaultyStore` any
:class:`~pgr_core.stores.contract.Store`; each injects one kind of fault (or a seeded mix) into the calls you
pick. The core suite runs every kind with a fixed seed (``tests/test_faults.py``); run the same
against your own LLM and store to see pgr's behaviour on them.

>>> llm = FaultyLLM(ScriptedLLM(handler=reply), "truncated_json", calls={1})  # doctest: +SKIP
>>> store = FaultyStore(InMemoryStore(), ["timeout", "missing_lists"], rate=0.3, seed=7)  # doctest: +SKIP

What each fault does, and the outcome pgr defines for it. Nothing is ever raised to the caller but
configuration and argument errors; the trace's ``errors`` name each failure; pgr never writes to the
store on the read path, so nothing in it is lost or changed. "Query hits" are what
``PGR.query_only`` returns for the same query.

=================== ==================================== ==============================================
LLM fault           what the model does                  outcome (fault on every call)
=================== ==================================== ==============================================
malformed_json      answers prose with broken JSON       one repair retry, still unusable: pgr stops
                                                         asking; ``degraded``, stop ``llm_error``,
                                                         facts = query hits, ``unusable_outputs`` 2,
                                                         ``repairs`` 1
truncated_json      its reply is cut in half (finish     the same; the repair prompt says the reply
                    reason ``length``)                   was cut off
wrong_schema        valid JSON without the required      the same (the reply is schema-checked)
                    keys
empty_steps         every list empty, every string ""    not degraded: q_A stays the query, nothing
                                                         but the query is probed, stop
                                                         ``no_new_probes`` (or ``delta_below_threshold``),
                                                         facts = query hits, the plain summary
query_echo          every step (and q_A) repeats the     not degraded: hygiene drops each step as
                    query                                ``echo_of_query``; as for empty_steps
enormous_output     megabytes: 1,000 steps of 1,000      not degraded: q_A cut to 600 characters, at
                    characters, huge strings             most 2 × n_steps steps read (each cut to 300
                                                         characters), at most ``max_probes`` probes of
                                                         ``max_words`` words and ``max_chars``
                                                         characters, the summary cut to 2,000; facts ⊇
                                                         query hits
timeout             raises LLMTimeoutError               pgr stops asking; ``degraded``, stop
                                                         ``llm_error``, facts = query hits, one call
rate_limited        raises LLMStatusError 429 (a client  the same; ``OpenAICompatible`` itself retries
                    whose retries, honouring             a 429 ``max_retries`` times, honouring
                    Retry-After, ran out)                Retry-After, and gives up at once when
                                                         Retry-After exceeds the time a deadline leaves
server_error        raises LLMStatusError 500            the same
connection_refused  raises LLMConnectionError            the same
slow                answers after ``delay`` seconds      with a ``Budget(deadline_s=...)`` shorter than
                    (honours ``timeout=``)               the delay: the call is cut at the deadline,
                                                         stop ``deadline``, not degraded, facts =
                                                         query hits
=================== ==================================== ==============================================

=================== ==================================== ==============================================
hostile reply       what the model sends                 outcome (fault on every call)
=================== ==================================== ==============================================
deep_nesting        2 KB of JSON 1,000 levels deep       unusable output, caught before parsing (no
                                                         RecursionError): one repair retry, then as
                                                         for malformed_json: ``degraded``, stop
                                                         ``llm_error``, facts = query hits
huge_integer        a 5,000-digit integer                the same (no int-conversion ValueError)
nan_constant        ``NaN`` where a value belongs        the same (NaN and Infinity are not JSON)
null_field          every required key ``null``          the same (a null required key is unusable)
wrong_types         every required key of another type   the same
oversized_reply     more than ``MAX_REPLY_CHARS``        the same, the text left unparsed
                    characters
huge_list           100,000 items in every list          not degraded: at most 2 × n_steps steps
                                                         read, as for enormous_output; an extraction
                                                         stores at most ``max_facts`` (50)
=================== ==================================== ==============================================

These are :data:`HOSTILE_FAULTS`; :class:`FaultyLLM` takes them like the others. Over HTTP,
``OpenAICompatible`` also cuts off a body over ``max_reply_bytes``, bounds a trickling (slow-loris)
server by its timeouts, and replaces implausible token counts with the estimate
(``tests/test_llm_hostile.py``).

=================== ==================================== ==============================================
store fault         what the store does                  outcome
=================== ==================================== ==============================================
timeout             raises TimeoutError (after           every failure is a StoreError and pgr stops
                    ``delay`` seconds)                   prospecting, ``degraded``, stop
error               raises ConnectionError               ``store_error``. A failed Phase-1 batch (or
missing_lists       returns one hit list fewer than      augmentation lookup) is followed by one call
                    there are probes                     with the query alone. So: fault on every call:
wrong_length        ignores K: a hit list longer than    facts = [] ; on the first call only: facts =
                    ``top_k`` (or an extra list when     query hits; from the second call on: facts =
                    every list is empty)                 what earlier rounds found (⊇ query hits).
                                                         A partial or over-long batch is never half
                                                         used.
=================== ==================================== ==============================================

Faults of the files, the processes and the caller, outside these wrappers (driven as a disk, a crash
or a user would drive them; the tests named run in the default suite, ``nox -s soak`` repeats the
damage on a store that several killed writers built):

=================== ==================================== ==============================================
fault               what happens                         outcome
=================== ==================================== ==============================================
log byte flipped,   the engine would open an EdgeStore   opening raises DamagedStoreError (a
log truncated, id   holding 0-90 % of what it            ConfigurationError) naming the store, how many
map truncated,      acknowledged                         facts are gone and the repair; nothing is
segment emptied                                          changed. ``pgr store check`` lists them,
                                                         ``pgr store repair`` keeps every intact fact
                                                         and lists the lost (tests/test_store_damage.py);
                                                         the cue index alike
record deleted      ``acknowledged.sqlite3`` is gone     the same; a repair keeps every fact and says
                                                         which were lost cannot be told
kill -9 mid-write   the engine holds a write its record  the next open adopts it: nothing lost or
                    did not take                         refused (tests/test_store_damage.py)
two processes save  both load, add and save one ``.pgr`` the later save raises ConfigurationError;
                                                         the file keeps the first writer's facts
                                                         (tests/test_bad_input.py)
a new event loop    ``asyncio.run(pgr.aretrieve(...))``  each loop's HTTP client is closed with it: no
per call            per request                          socket or memory kept per call
                                                         (tests/test_llm_client.py)
one id, two owners  two agents of one user hold "f1"     two facts under the user's scope, both
                                                         returned, centring on
                                                         (tests/test_shared_ids.py)
hostile input       positions past 2**63-1, metadata     InvalidArgumentError naming the field; a
                    2,000 deep, string vectors, a string ``.lock`` directory: ConfigurationError; a
                    as an id list, a CLI line 100,000    CLI line: one line of error
                    deep                                 (tests/test_bad_input.py)
=================== ==================================== ==============================================
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pgr_core.errors import (
    InvalidArgumentError,
    LLMConnectionError,
    LLMStatusError,
    LLMTimeoutError,
)
from pgr_core.models.llm import LLM, MAX_REPLY_CHARS, CallFlow, Completion, Request, Sleep, Usage, WrappedLLM
from pgr_core.stores.contract import Store
from pgr_core.testing import LLMCall
from pgr_core.types import Hit, Scope, SearchParams

__all__ = ["HOSTILE_FAULTS", "LLM_FAULTS", "STORE_FAULTS", "FaultyLLM", "FaultyStore"]

LLM_FAULTS = (
    "malformed_json",
    "truncated_json",
    "wrong_schema",
    "empty_steps",
    "query_echo",
    "enormous_output",
    "timeout",
    "rate_limited",
    "server_error",
    "connection_refused",
)
"""The LLM faults of issue 6, in the order of the outcome table (``"slow"`` is also accepted)."""

HOSTILE_FAULTS = (
    "deep_nesting",
    "huge_integer",
    "nan_constant",
    "null_field",
    "wrong_types",
    "oversized_reply",
    "huge_list",
)
"""Replies built to break a JSON parser or a caller that trusts shapes (the LLM boundary)."""

STORE_FAULTS = ("timeout", "error", "missing_lists", "wrong_length")

_RAISED = {"timeout", "rate_limited", "server_error", "connection_refused"}


class _Schedule:
    """Which calls fail, and how: call indices and/or a seeded coin, then a seeded pick of the kind."""

    def __init__(
        self,
        fault: str | Sequence[str],
        known: Collection[str],
        calls: Collection[int] | None,
        rate: float,
        seed: int,
    ) -> None:
        kinds = [fault] if isinstance(fault, str) else list(fault)
        unknown = [k for k in kinds if k not in known]
        if not kinds or unknown:
            raise InvalidArgumentError(f"unknown fault(s) {unknown or kinds!r}; known: {', '.join(sorted(known))}")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
            raise InvalidArgumentError(f"rate must be a number in [0, 1], got {rate!r}")
        self.kinds = kinds
        self.calls = None if calls is None else frozenset(calls)
        self.rate = float(rate)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.count = 0
        self.injected: list[tuple[int, str]] = []  # (call index, fault kind), in call order

    def next(self) -> str | None:
        with self._lock:
            index = self.count
            self.count += 1
            # the coin and the pick are drawn for every call, so the schedule does not depend on `calls`
            coin, pick = self._rng.random(), self._rng.choice(self.kinds)
            if (self.calls is not None and index not in self.calls) or coin >= self.rate:
                return None
            self.injected.append((index, pick))
            return pick


class FaultyLLM(WrappedLLM):
    """An LLM that injects ``fault`` (a kind of :data:`LLM_FAULTS` or :data:`HOSTILE_FAULTS`, ``"slow"``,
    or a list to pick from).

    - ``calls``: the 0-based indices of the calls to fault (None: any call), and of those a fraction
      ``rate`` drawn with ``seed``. Other calls go to ``inner`` untouched.
    - ``query``: the text ``query_echo`` repeats (default: read from the prompt).
    - ``delay``: seconds a ``slow`` call takes.

    ``injected`` lists ``(call index, kind)`` of every fault injected, ``calls`` every call received.
    Faults that replace the reply do not call ``inner`` (as if the server had answered instead);
    ``truncated_json`` and ``slow`` do. It takes ``timeout=`` (a slow reply honours it) and passes it
    on where ``inner`` takes one.
    """

    def __init__(
        self,
        inner: LLM,
        fault: str | Sequence[str],
        *,
        calls: Collection[int] | None = None,
        rate: float = 1.0,
        seed: int = 0,
        query: str | None = None,
        delay: float = 1.0,
    ) -> None:
        if not isinstance(inner, LLM):
            raise InvalidArgumentError(f"inner must be a pgr_core LLM, not {type(inner).__name__}")
        super().__init__(inner, name=f"faulty:{inner.name}")
        self.accepts_timeout = True  # a slow reply is cut at the timeout, whatever inner takes
        self.schedule = _Schedule(fault, {*LLM_FAULTS, *HOSTILE_FAULTS, "slow"}, calls, rate, seed)
        self.query = query
        self.delay = delay
        self.calls: list[LLMCall] = []

    @property
    def injected(self) -> list[tuple[int, str]]:
        return list(self.schedule.injected)

    def __repr__(self) -> str:
        return f"FaultyLLM({self.inner!r}, {self.schedule.kinds!r})"

    # -- the protocol, once for complete and acomplete
    def _call(self, request: Request) -> CallFlow:
        kind = self._next(request.messages, request.schema, request.max_tokens)
        if kind == "slow":
            wait, gives_up = self._slow(request.timeout)
            yield Sleep(wait)
            if gives_up:
                raise LLMTimeoutError(f"{self.name}: no answer within {wait:.3g}s (injected slow reply)")
        inner = (yield request) if kind in (None, "truncated_json", "slow") else None
        return self._finish(kind, request.messages, request.schema, inner)

    # -- faults
    def _next(
        self, messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None, max_tokens: int
    ) -> str | None:
        self.calls.append(LLMCall([dict(m) for m in messages], schema, max_tokens))  # list.append: thread-safe
        return self.schedule.next()

    def _slow(self, timeout: float | None) -> tuple[float, bool]:
        """How long a slow reply waits, and whether the client's timeout ends it first (then it fails
        as a client would)."""
        if timeout is not None and timeout < self.delay:
            return max(timeout, 0.0), True
        return self.delay, False

    def _finish(
        self,
        kind: str | None,
        messages: Sequence[Mapping[str, str]],
        schema: Mapping[str, Any] | None,
        inner: Completion | None,
    ) -> Completion:
        if kind in (None, "slow"):
            assert inner is not None
            return inner
        if kind in _RAISED:
            raise _raised(kind, self.name)
        if kind == "truncated_json":
            assert inner is not None
            text = inner.text[: max(len(inner.text) // 2, 1) - 1] if inner.text else ""
            return Completion(text, Usage.estimate(messages, text, estimated=False), inner.model, truncated=True)
        text = _reply(kind, schema, self.query or _query_in(messages))
        return Completion(text, Usage.estimate(messages, text, estimated=False), "faulty")


def _raised(kind: str, name: str) -> Exception:
    if kind == "timeout":
        return LLMTimeoutError(f"{name}: no answer within the timeout (injected)")
    if kind == "rate_limited":
        error = LLMStatusError(f"{name}: HTTP 429: rate limited, retry after 2s (injected)", 429)
        error.retry_after = 2.0  # type: ignore[attr-defined]
        return error
    if kind == "server_error":
        return LLMStatusError(f"{name}: HTTP 500: internal server error (injected)", 500)
    return LLMConnectionError(f"{name}: cannot reach the server ([Errno 111] Connection refused, injected)")


def _query_in(messages: Sequence[Mapping[str, str]]) -> str:
    """The user's request as our prompts quote it (augment, summary, answer), else the quoted goal."""
    prompt = "\n".join(m.get("content", "") for m in messages)
    for pattern in (r'The user (?:wrote|asks|asked):\s*"(.+?)"\s*$', r'goal[^\n:]*:\s*"(.+?)"\s*$'):
        found = re.search(pattern, prompt, re.MULTILINE)
        if found:
            return found.group(1)
    return prompt.strip().splitlines()[0] if prompt.strip() else "the request"


def _fill(schema: Mapping[str, Any] | None, array: list[Any], string: str) -> dict[str, Any]:
    """An object with every required key of ``schema``: arrays get ``array``, strings ``string``."""
    out: dict[str, Any] = {}
    properties = (schema or {}).get("properties", {})
    for key in (schema or {}).get("required", ()):
        kind = properties.get(key, {}).get("type")
        out[key] = array if kind == "array" else {} if kind == "object" else string
    return out


def _reply(kind: str, schema: Mapping[str, Any] | None, query: str) -> str:
    if kind == "malformed_json":
        return 'Sure! Here is the plan: {nodes: [see the physio, "take the bus",'
    if kind == "wrong_schema":
        return json.dumps({"answer": "I would rather not plan this.", "items": "none"})
    if kind == "empty_steps":
        return json.dumps(_fill(schema, [], "")) if schema else ""
    if kind == "query_echo":
        variants = [query, query.lower().rstrip("?!. "), query.upper()]
        items = [{"id": f"e{i}", "parent": None, "action": v, "dimension": "timing"} for i, v in enumerate(variants)]
        return json.dumps(_fill(schema, items, query)) if schema else query
    if kind == "enormous_output":
        items = [
            {"id": f"n{i}", "parent": None, "action": f"step{i} " + "unbounded " * 100, "dimension": "x" * 500}
            for i in range(1000)
        ]
        huge = "enormous " * 200_000
        return json.dumps(_fill(schema, items, huge)) if schema else huge
    if kind in HOSTILE_FAULTS:
        return _hostile(kind, schema)
    raise InvalidArgumentError(f"no reply for fault {kind!r}")  # pragma: no cover - kinds are checked


_WRONG = {"array": "not a list", "string": [1, 2], "object": 5, "boolean": "yes", "number": "many", "integer": "many"}


def _hostile(kind: str, schema: Mapping[str, Any] | None) -> str:
    """A reply of :data:`HOSTILE_FAULTS` for ``schema``: every required key holds the hostile value."""
    properties = (schema or {}).get("properties", {})
    required = list((schema or {}).get("required", ())) or ["value"]
    literal = {
        "deep_nesting": "[" * 1000 + "]" * 1000,
        "huge_integer": "9" * 5000,
        "nan_constant": "NaN",
        "null_field": "null",
    }
    if kind in literal:  # written out by hand: json.dumps will not write these
        return "{" + ", ".join(f"{json.dumps(k)}: {literal[kind]}" for k in required) + "}"
    if kind == "wrong_types":
        return json.dumps({k: _WRONG.get(str(properties.get(k, {}).get("type")), None) for k in required})
    if kind == "oversized_reply":
        return json.dumps({k: "x" * MAX_REPLY_CHARS for k in required})
    many = [f"s{i}" for i in range(100_000)]
    return json.dumps(_fill(schema, many, "x")) if schema else json.dumps(many)


class FaultyStore(Store):
    """A store that injects ``fault`` (a kind of :data:`STORE_FAULTS`, or a list to pick from) into the
    calls picked by ``calls``, ``rate`` and ``seed`` (as :class:`FaultyLLM`); ``delay`` seconds pass
    before a ``timeout``. Other calls, and every write, go to ``inner`` untouched. It searches and
    nothing else: it declares ``inner``'s capabilities less those of methods it does not have (writes,
    ``with_window``, listings, vectors, look-ups by id, deletes: make those through ``inner``).
    """

    def __init__(
        self,
        inner: Store,
        fault: str | Sequence[str],
        *,
        calls: Collection[int] | None = None,
        rate: float = 1.0,
        seed: int = 0,
        delay: float = 0.0,
    ) -> None:
        if not isinstance(inner, Store):
            raise InvalidArgumentError(f"inner must be a pgr_core Store, not {type(inner).__name__}")
        self.inner = inner
        self.schedule = _Schedule(fault, set(STORE_FAULTS), calls, rate, seed)
        self.delay = delay
        # searches only: the abilities of inner's other methods are not this store's
        self.capabilities = replace(  # type: ignore[misc]
            inner.capabilities, writable=False, window=False, lists=False, vectors=False, by_id=False, deletes=False
        )
        self.embedder = getattr(inner, "embedder", None)

    @property
    def injected(self) -> list[tuple[int, str]]:
        return list(self.schedule.injected)

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        kind = self.schedule.next()
        if kind == "timeout":
            time.sleep(self.delay)
            raise TimeoutError(f"the store did not answer within {self.delay:g}s (injected)")
        if kind == "error":
            raise ConnectionError("the store is unreachable (injected)")
        result = list(self.inner.search_batch(probes, scope=scope, params=params))
        if kind == "missing_lists":
            return result[:-1]
        if kind == "wrong_length":
            for i, hits in enumerate(result):
                direct = [h for h in hits if h.neighbour_of is None]
                if direct:
                    result[i] = [*hits, *direct * (params.top_k + 1)]  # past K, whatever the window added
                    return result
            return [*result, []]
        return result
