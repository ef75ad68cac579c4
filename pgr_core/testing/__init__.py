"""Test doubles that ship with pgr: a scripted LLM, and helpers to build small stores.

The conformance suite for store adapters lives in :mod:`pgr_core.testing.conformance` (adapters issue).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgr_core.errors import LLMError
from pgr_core.models.llm import LLM, Completion, Usage

__all__ = [
    "CUE_BACKFILL_NOTES",
    "CUE_BACKFILL_OTHER",
    "LLMCall",
    "ScriptedLLM",
    "asked_facts",
    "cue_llm",
    "planner_llm",
]

Reply = str | Mapping[str, Any] | BaseException
Handler = Callable[[Sequence[Mapping[str, str]], Mapping[str, Any] | None], Reply]


@dataclass
class LLMCall:
    messages: list[dict[str, str]]
    schema: Mapping[str, Any] | None
    max_tokens: int
    temperature: float = 0.0

    @property
    def prompt(self) -> str:
        return "\n".join(m.get("content", "") for m in self.messages)


@dataclass
class ScriptedLLM(LLM):
    """An LLM that answers from a script, for tests.

    ``replies`` is consumed in order; each item is a string (the reply text), a mapping (sent as
    JSON), or an exception instance (raised; use pgr's LLMError subclasses to simulate timeouts and
    refused connections). ``handler``, when given, is called with (messages, schema) for every call
    after the replies run out. Each call is recorded in ``calls``; usage is counted as characters / 4.

    >>> llm = ScriptedLLM([{"intent": "x"}, '{"nodes": []}'])
    """

    replies: list[Reply] = field(default_factory=list)
    handler: Handler | None = None
    truncate_at: int | None = None  # cut every reply to this many characters (simulates max_tokens)
    calls: list[LLMCall] = field(default_factory=list)
    name: str = "scripted"

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._queue = list(self.replies)

    def extend(self, replies: Iterable[Reply]) -> None:
        with self._lock:
            self._queue.extend(replies)

    def complete(
        self,
        messages: Sequence[Mapping[str, str]],
        *,
        schema: Mapping[str, Any] | None = None,
        max_tokens: int = 512,
        temperature: float = 0.0,
    ) -> Completion:
        with self._lock:
            self.calls.append(LLMCall([dict(m) for m in messages], schema, max_tokens, temperature))
            reply: Reply | None = self._queue.pop(0) if self._queue else None
        if reply is None:
            if self.handler is None:
                raise LLMError("ScriptedLLM ran out of replies")
            reply = self.handler(messages, schema)
        if isinstance(reply, BaseException):
            raise reply
        text = reply if isinstance(reply, str) else json.dumps(reply)
        truncated = self.truncate_at is not None and len(text) > self.truncate_at
        if truncated:
            text = text[: self.truncate_at]
        usage = Usage.estimate(messages, text, estimated=False)  # the script's own count, by definition
        return Completion(text=text, usage=usage, model="scripted", truncated=truncated)


# --------------------------------------------------------------------------- cue writing

_CUE_LINE = re.compile(r'^(F\d+): (".*")$', re.MULTILINE)


def asked_facts(messages: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """handle -> fact text, from the last (real) request of a cue call (``F1: "text"`` lines)."""
    return {h: json.loads(t) for h, t in _CUE_LINE.findall(messages[-1]["content"])}


def cue_llm(cues_by_text: Mapping[str, Sequence[str]]) -> ScriptedLLM:
    """A model that answers every cue request from ``cues_by_text`` (facts it does not know get none)."""

    def handler(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Reply:
        asked = asked_facts(messages)
        return {"cues": [{"id": h, "cues": list(cues_by_text.get(text, []))} for h, text in asked.items()]}

    return ScriptedLLM(handler=handler)


def planner_llm(
    steps: Sequence[str] = ("check the knee with the physio",), summary: str = "It matters."
) -> ScriptedLLM:
    """A model that answers PGR's prompts by the reply schema they send: the request restated, ``steps``
    the first time a plan is asked for and none after (chain or tree), and ``summary``. For examples
    that run as a user would write them, with a model swapped in."""
    planned: list[bool] = []

    def handler(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Reply:
        required = set((schema or {}).get("required", []))
        if "intent" in required:
            return {"intent": "the request, restated", "answered": False}
        if "steps" in required or "nodes" in required:
            first = not planned
            planned.append(True)
            if "steps" in required:
                return {"steps": list(steps) if first else []}
            nodes = [{"id": f"n{i}", "parent": None, "action": s} for i, s in enumerate(steps, 1)]
            return {"nodes": nodes if first else []}
        if "summary" in required:
            return {"summary": summary, "ids": []}
        return {}

    return ScriptedLLM(handler=handler)


#: An application's notes about alice, each with the cues a model would write (the adapters' backfill tests).
CUE_BACKFILL_NOTES: dict[str, list[str]] = {
    "Twisted my knee skiing in February; physio says no running until July": [
        "should I join a soccer league this summer",
        "signing up for a charity race",
    ],
    "Sold the car in January and takes the bus": ["plan a weekend road trip", "picking up a sofa from the store"],
    "Has a bookkeeping class on Tuesday and Thursday evenings": [
        "booking midweek dinner plans",
        "a concert after work",
    ],
    "In run 7 Alice asked for a vegetarian dinner recipe": ["what should I cook tonight", "hosting friends for a meal"],
}
#: ... and bob's, which must never reach a prompt of alice's backfill.
CUE_BACKFILL_OTHER = "Bob runs marathons every spring and loves soccer"
