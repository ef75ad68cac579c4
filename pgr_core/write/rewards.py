"""GMPO's rewards, as plain functions of text (no training library needed to use or test them).

- :func:`adherence_reward`: does an extraction output follow the guideline S? Format (a JSON object
  with a ``facts`` list), types (each one of S's types), atomicity (one short statement each, at most
  the number of words S asks for), fields (entities a list, date ``YYYY-MM-DD`` or null, updates a
  handle or null). Scored 0..1.
- :func:`answer_reward`: is the downstream answer right (the chosen option, or the reference text)?
- :func:`memory_answer_reward`: the answer reward of an extraction: its facts become the memory, an
  answerer answers the example's question from them, and the answer is scored.
- :func:`gmpo_reward`: the mix α · adherence + (1 − α) · answer that GMPO optimises.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from pgr_core.errors import LLMError, LLMOutputError
from pgr_core.models.embedders import Embedder, HashingEmbedder
from pgr_core.models.llm import LLM, parse_json
from pgr_core.types import Fact, Scope
from pgr_core.write.examples import TrainingExample
from pgr_core.write.extract import EXTRACT_SCHEMA
from pgr_core.write.guideline import DEFAULT_GUIDELINE, Guideline
from pgr_core.write.induction import answer_question, chosen_letter

__all__ = [
    "AdherenceScore",
    "Answerer",
    "LLMAnswerer",
    "LexicalAnswerer",
    "adherence_reward",
    "answer_reward",
    "gmpo_reward",
    "memory_answer_reward",
]

WEIGHTS = {"format": 0.25, "types": 0.25, "atomicity": 0.3, "fields": 0.2}
_MAX_WORDS = re.compile(r"at most (\d+) words", re.IGNORECASE)
_SENTENCE_BREAK = re.compile(r"[.!?]\s+[A-Z]")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_HANDLE = re.compile(r"^E\d+$")


@dataclass(frozen=True)
class AdherenceScore:
    """Each part in 0..1 and their weighted ``total`` (weights: ``WEIGHTS``)."""

    format: float
    types: float
    atomicity: float
    fields: float
    total: float
    facts: int

    def __float__(self) -> float:
        return self.total


def max_words_of(guideline: Guideline, default: int = 25) -> int:
    """The fact length S asks for ("at most N words"), or ``default``."""
    m = _MAX_WORDS.search(guideline.text)
    return int(m.group(1)) if m else default


def _atomic(text: str, max_words: int) -> bool:
    words = text.split()
    return 0 < len(words) <= max_words and not _SENTENCE_BREAK.search(text) and ";" not in text and "\n" not in text


def _fields_ok(item: dict[str, Any]) -> bool:
    entities = item.get("entities", [])
    date = item.get("date")
    updates = item.get("updates")
    return (
        isinstance(entities, list)
        and all(isinstance(e, str) for e in entities)
        and (date is None or (isinstance(date, str) and bool(_DAY.match(date))))
        and (updates is None or (isinstance(updates, str) and bool(_HANDLE.match(updates))))
    )


def adherence_reward(
    completion: str, guideline: Guideline = DEFAULT_GUIDELINE, *, max_words: int | None = None
) -> AdherenceScore:
    """How well an extraction output follows S, 0..1.

    Unparseable output scores 0. An empty ``facts`` list earns only the format part: S asks for facts,
    and whether nothing was worth keeping is for the answer reward to judge.

    >>> adherence_reward('{"facts": [{"text": "The user is vegan.", "type": "Preference"}]}').total
    1.0
    """
    try:
        reply = parse_json(completion, EXTRACT_SCHEMA)
    except LLMOutputError:
        return AdherenceScore(0.0, 0.0, 0.0, 0.0, 0.0, 0)
    items = [i for i in reply["facts"] if isinstance(i, dict)]
    if not items:
        return AdherenceScore(1.0, 0.0, 0.0, 0.0, WEIGHTS["format"], 0)
    limit = max_words or max_words_of(guideline)
    names = {t.lower() for t in guideline.type_names}
    n = len(items)
    types = sum(str(i.get("type", "")).strip().lower() in names for i in items) / n
    atomicity = sum(_atomic(str(i.get("text", "")), limit) for i in items) / n
    fields = sum(_fields_ok(i) for i in items) / n
    fmt = 1.0 if n == len(reply["facts"]) else 0.5  # non-object items in the list
    parts = {"format": fmt, "types": types, "atomicity": atomicity, "fields": fields}
    total = sum(WEIGHTS[k] * v for k, v in parts.items())
    return AdherenceScore(fmt, types, atomicity, fields, round(total, 6), n)


def _tokens(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def answer_reward(answer: str, example: TrainingExample) -> float:
    """1.0 for the right option (multiple choice); for free answers 1.0 when the reference is contained
    in the answer, else the token F1 between them."""
    if example.options:
        return 1.0 if chosen_letter(answer, len(example.options)) == example.gold_letter else 0.0
    gold, got = _tokens(example.answer), _tokens(answer)
    if not gold or not got:
        return 0.0
    if " ".join(gold) in " ".join(got):
        return 1.0
    common = sum(min(gold.count(t), got.count(t)) for t in set(gold))
    if common == 0:
        return 0.0
    precision, recall = common / len(got), common / len(gold)
    return round(2 * precision * recall / (precision + recall), 6)


class Answerer(Protocol):
    """Answers an example's question from a memory (the facts an extraction produced)."""

    def __call__(self, example: TrainingExample, facts: Sequence[Fact]) -> str: ...


class LexicalAnswerer:
    """An LLM-free answerer for smoke tests: the option closest (cosine) to the memory's facts.

    Without facts it answers "A". Good enough to give the answer reward a signal on PrefEval-style
    choices; real GMPO uses :class:`LLMAnswerer`.
    """

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embedder = embedder or HashingEmbedder()

    def __call__(self, example: TrainingExample, facts: Sequence[Fact]) -> str:
        if not example.options or not facts:
            return "A"
        memory = self.embedder.embed([f.text for f in facts])
        options = self.embedder.embed(list(example.options))
        best = int(np.argmax((options @ memory.T).max(axis=1)))
        return "ABCDEFGHIJ"[best]


class LLMAnswerer:
    """Answers with an LLM over the facts (the answer prompt of guideline induction)."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm

    def __call__(self, example: TrainingExample, facts: Sequence[Fact]) -> str:
        try:
            return answer_question(example, facts, self.llm)
        except LLMError:
            return ""


def facts_of(completion: str, guideline: Guideline = DEFAULT_GUIDELINE) -> list[Fact]:
    """The facts of an extraction output (whatever parses; nothing when it does not)."""
    try:
        reply = parse_json(completion, EXTRACT_SCHEMA)
    except LLMOutputError:
        return []
    scope = Scope(user_id="gmpo")
    out = []
    for i, item in enumerate(reply["facts"]):
        text = " ".join(str(item.get("text") or "").split()) if isinstance(item, dict) else ""
        if text:
            out.append(Fact(id=f"f{i}", text=text, scope=scope, type=str(item.get("type") or "") or None))
    return out


def memory_answer_reward(completion: str, example: TrainingExample, answerer: Answerer) -> float:
    """The answer reward of an extraction output: answer the example's question from its facts."""
    return answer_reward(answerer(example, facts_of(completion)), example)


def gmpo_reward(adherence: float, answer: float, *, alpha: float = 0.5) -> float:
    """α · adherence + (1 − α) · answer."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    return alpha * float(adherence) + (1.0 - alpha) * float(answer)
