"""Extraction: one LLM call turns a session into short typed facts, each new or an update of a
remembered fact (upsert). The guideline S goes into the prompt; the reply is checked fact by fact,
and at most ``max_facts`` of its facts are read (a reply listing 100,000 facts stores 50, not all).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pgr_core.errors import InvalidArgumentError, LLMOutputError
from pgr_core.models.llm import LLM, Completion, parse_json
from pgr_core.models.prompts import render
from pgr_core.types import Fact
from pgr_core.write.guideline import Guideline
from pgr_core.write.sessions import Session

__all__ = [
    "EXTRACT_SCHEMA",
    "MAX_FACTS_PER_SESSION",
    "ExtractedFact",
    "Extraction",
    "extract",
    "extraction_messages",
    "parse_extraction",
]

EXTRACT_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "required": ["facts"],
    "properties": {
        "facts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["text", "type"],
                "properties": {
                    "text": {"type": "string"},
                    "type": {"type": "string"},
                    "entities": {"type": "array", "items": {"type": "string"}},
                    "date": {"type": "string"},
                    "updates": {"type": "string"},
                },
            },
        }
    },
}

MAX_FACT_CHARS = 400
MAX_FACTS_PER_SESSION = 50  # of one reply's facts, the rest are cut (counted in Extraction.cut)
_DAY = re.compile(r"(\d{4})-(\d{2})-(\d{2})")


@dataclass(frozen=True)
class ExtractedFact:
    text: str
    type: str
    entities: tuple[str, ...] = ()
    date: datetime | None = None
    updates: str | None = None  # the handle (E1, E2, ...) of the remembered fact it revises


@dataclass
class Extraction:
    """What one extraction produced: the accepted facts, why others were refused, how many were cut
    unread past ``max_facts``, the LLM's replies."""

    facts: list[ExtractedFact]
    rejected: list[str] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    raw: str = ""
    cut: int = 0


def handles(existing: Sequence[Fact]) -> dict[str, Fact]:
    """``E1``, ``E2``... for the remembered facts shown to the LLM (short and hard to garble)."""
    return {f"E{i}": fact for i, fact in enumerate(existing, 1)}


def _existing_lines(existing: Sequence[Fact]) -> str:
    if not existing:
        return "(none)"
    lines = []
    for handle, fact in handles(existing).items():
        moment = fact.updated_at or fact.date
        when = moment.date().isoformat() if moment else "undated"
        times = int(fact.metadata.get("frequency", 1) or 1)
        lines.append(f"{handle} [{fact.type or 'untyped'}, {when}, said {times}x] {fact.text}")
    return "\n".join(lines)


def extraction_messages(session: Session, guideline: Guideline, existing: Sequence[Fact]) -> list[dict[str, str]]:
    """The chat messages of one extraction call."""
    content = render(
        "write_extract",
        guideline=guideline.render(),
        session_id=session.id,
        date=session.date.date().isoformat() if session.date else "an unknown date",
        conversation=session.transcript(),
        existing=_existing_lines(existing),
        type_names=", ".join(guideline.type_names),
    )
    return [{"role": "user", "content": content}]


def _as_date(value: Any, like: datetime | None) -> datetime | None:
    if not isinstance(value, str):
        return None
    m = _DAY.search(value)
    if not m:
        return None
    try:
        day = datetime(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        return None
    return day.replace(tzinfo=like.tzinfo) if like is not None and like.tzinfo is not None else day


def parse_extraction(
    text: str, *, types: Sequence[str], known_handles: Sequence[str] = (), session_date: datetime | None = None
) -> tuple[list[ExtractedFact], list[str]]:
    """Check a reply fact by fact. Returns (accepted facts, reasons for each refused one).

    Raises :class:`LLMOutputError` when the reply as a whole is unusable (not JSON, no ``facts`` list).
    A fact is refused for empty or over-long text or a type outside ``types``; an ``updates`` handle
    that names no remembered fact is dropped (the fact counts as new). Every fact is read; :func:`extract`
    reads at most ``max_facts``.
    """
    return _checked_facts(_reply_facts(text), types, known_handles, session_date)


def _reply_facts(text: str) -> list[Any]:
    """The reply's list of facts (schema-checked: a null or wrong-typed list is unusable output)."""
    facts: list[Any] = parse_json(text, EXTRACT_SCHEMA)["facts"]
    return facts


def _checked_facts(
    items: Sequence[Any], types: Sequence[str], known_handles: Sequence[str], session_date: datetime | None
) -> tuple[list[ExtractedFact], list[str]]:
    by_name = {t.lower(): t for t in types}
    known = set(known_handles)
    accepted: list[ExtractedFact] = []
    rejected: list[str] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        body = " ".join(str(item.get("text") or "").split())
        kind = by_name.get(str(item.get("type") or "").strip().lower())
        if not body:
            rejected.append(f"fact {i}: empty text")
            continue
        if len(body) > MAX_FACT_CHARS:
            rejected.append(f"fact {i}: {len(body)} characters, more than {MAX_FACT_CHARS} (not atomic)")
            continue
        if kind is None:
            rejected.append(f"fact {i}: type {str(item.get('type'))[:40]!r} is not one of {', '.join(types)}")
            continue
        if body.lower() in seen:
            rejected.append(f"fact {i}: repeats an earlier fact of the same reply")
            continue
        seen.add(body.lower())
        entities = tuple(dict.fromkeys(str(e).strip() for e in item.get("entities") or [] if str(e).strip()))
        handle = str(item.get("updates") or "").strip().upper() or None
        accepted.append(
            ExtractedFact(
                text=body,
                type=kind,
                entities=entities,
                date=_as_date(item.get("date"), session_date),
                updates=handle if handle in known else None,
            )
        )
    return accepted, rejected


def extract(
    llm: LLM,
    session: Session,
    guideline: Guideline,
    existing: Sequence[Fact],
    *,
    max_tokens: int = 800,
    temperature: float = 0.0,
    max_facts: int = MAX_FACTS_PER_SESSION,
) -> Extraction:
    """Ask the LLM for the session's facts; one repair retry when the reply is unusable.

    Only the reply's first ``max_facts`` facts are read; how many more it listed is ``cut``.
    Raises :class:`LLMOutputError` when the retry is unusable too, and lets connection, timeout and
    status errors through (the caller decides: raw fallback for bad output, retry later for the rest).
    """
    if isinstance(max_facts, bool) or not isinstance(max_facts, int) or max_facts < 1:
        raise InvalidArgumentError(f"max_facts must be an integer >= 1, got {max_facts!r}")
    messages = extraction_messages(session, guideline, existing)
    known = list(handles(existing))
    completions: list[Completion] = []
    problem = ""
    for attempt in range(2):
        completion = llm.complete(messages, schema=EXTRACT_SCHEMA, max_tokens=max_tokens, temperature=temperature)
        completions.append(completion)
        try:
            if completion.truncated:
                raise LLMOutputError("the reply was cut off at the token limit", raw=completion.text)
            items = _reply_facts(completion.text)
            facts, rejected = _checked_facts(items[:max_facts], guideline.type_names, known, session.date)
            cut = max(len(items) - max_facts, 0)
            return Extraction(facts, rejected, completions, completion.text, cut)
        except LLMOutputError as exc:
            problem = str(exc)
            if attempt == 0:
                messages = [
                    *messages,
                    {"role": "assistant", "content": completion.text[:2000]},
                    {"role": "user", "content": render("repair", problem=problem)},
                ]
    raise LLMOutputError(f"extraction for session {session.id} unusable after a repair: {problem}")
