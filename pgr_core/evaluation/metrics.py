"""Retrieval and answer metrics, each a plain function with a hand-checkable definition.

Exact (gold fact ids known):

- ``recall(found, gold)``: the share of gold items in ``found``; ``missing`` gold items that name no
  fact count as misses. An item is a fact id or a group of ids (one reference that lives in several
  facts), found when any of its ids is.
- ``recall_exact``: 1.0 only when every gold item is found (the paper's RecallExact), else 0.0.
- ``recall_at(found, gold, n)``: recall over the first ``n`` results, so a method cannot win by
  returning more.

LLM-judged (reference texts only): :func:`judged_recall` asks a judge LLM, per reference, whether the
returned records contain it. Answers: :func:`win_rate` has the judge compare two answers twice with
the order swapped; a win counts 1, a tie or a split verdict 0.5.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pgr_core.errors import LLMError
from pgr_core.models.llm import LLM, parse_json
from pgr_core.models.prompts import render

__all__ = [
    "PairVerdict",
    "Judged",
    "judged_recall",
    "recall",
    "recall_at",
    "recall_exact",
    "win_rate",
]

Gold = Sequence[str | Sequence[str]]  # an item: one fact id, or a group found when any member is


def _items(gold: Gold) -> list[frozenset[str]]:
    items = [frozenset([g]) if isinstance(g, str) else frozenset(g) for g in gold]
    return list(dict.fromkeys(i for i in items if i))


def recall(found: Iterable[str], gold: Gold, *, missing: int = 0) -> float:
    """Share of gold items found; ``missing`` unresolvable gold items count as misses.

    A gold item is a fact id, or a group of ids (one reference spread over several facts) that counts
    as found when any of its ids is.

    >>> recall(["a", "x"], ["a", "b"])
    0.5
    >>> recall(["a"], ["a"], missing=1)
    0.5
    >>> recall(["b"], [["a", "b"], "c"])
    0.5
    """
    items = _items(gold)
    total = len(items) + missing
    if total == 0:
        raise ValueError("recall of a question with no gold is undefined; filter such questions out")
    seen = set(found)
    return sum(1 for item in items if item & seen) / total


def recall_exact(found: Iterable[str], gold: Gold, *, missing: int = 0) -> float:
    """1.0 when every gold item is found, else 0.0.

    >>> recall_exact(["a", "b", "c"], ["a", "b"]), recall_exact(["a"], ["a", "b"])
    (1.0, 0.0)
    """
    return 1.0 if recall(found, gold, missing=missing) == 1.0 else 0.0


def recall_at(found: Sequence[str], gold: Gold, n: int, *, missing: int = 0) -> float:
    """Recall over the first ``n`` results.

    >>> recall_at(["x", "y", "a"], ["a"], 2), recall_at(["x", "y", "a"], ["a"], 3)
    (0.0, 1.0)
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    return recall(list(found)[:n], gold, missing=missing)


# --------------------------------------------------------------------------- LLM-judged recall

_RECALL_SCHEMA = {
    "type": "object",
    "properties": {"found": {"type": "array", "items": {"type": "boolean"}}},
    "required": ["found"],
}


@dataclass
class Judged:
    """A judged recall: per-reference verdicts (None where the judge gave no usable answer)."""

    found: list[bool | None]
    calls: int = 0
    error: str | None = None

    @property
    def recall(self) -> float | None:
        """Share of references found; None when the judge failed (counted apart, never as 0)."""
        if self.error is not None or not self.found:
            return None
        return sum(1 for f in self.found if f) / len(self.found)

    @property
    def exact(self) -> float | None:
        r = self.recall
        return None if r is None else (1.0 if r == 1.0 else 0.0)


def _numbered(items: Sequence[str], limit: int = 400) -> str:
    return "\n".join(f"{i}. {' '.join(t.split())[:limit]}" for i, t in enumerate(items, 1)) or "(none)"


def judged_recall(
    judge: LLM, query: str, references: Sequence[str], retrieved: Sequence[str], *, max_tokens: int = 200
) -> Judged:
    """Ask ``judge`` which ``references`` the ``retrieved`` texts contain (one call; one retry when the
    reply is unusable). A judge that fails twice yields ``Judged(error=...)``, never an exception."""
    if not references:
        raise ValueError("judged recall needs at least one reference")
    prompt = render(
        "judge_recall",
        query=query,
        references=_numbered(references),
        retrieved=_numbered(retrieved, limit=300),
    )
    calls, error = 0, None
    for _ in range(2):
        calls += 1
        try:
            reply = judge.complete([{"role": "user", "content": prompt}], schema=_RECALL_SCHEMA, max_tokens=max_tokens)
            flags = parse_json(reply.text, _RECALL_SCHEMA)["found"]
        except LLMError as exc:
            error = f"{type(exc).__name__}: {exc}"
            continue
        if len(flags) != len(references):
            error = f"judge gave {len(flags)} verdicts for {len(references)} references"
            continue
        return Judged([bool(f) for f in flags], calls)
    return Judged([None] * len(references), calls, error)


# --------------------------------------------------------------------------- pairwise win rate

_PAIR_SCHEMA = {
    "type": "object",
    "properties": {"winner": {"type": "string"}, "reason": {"type": "string"}},
    "required": ["winner"],
}


@dataclass
class PairVerdict:
    """Both orders' verdicts for one question, and the first answer's score (1, 0.5 or 0)."""

    forward: str | None  # "A", "B", "tie" with the first answer shown as A; None: judge failed
    backward: str | None  # with the first answer shown as B
    calls: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def score(self) -> float | None:
        """1 if the first answer wins both orders, 0 if it loses both, 0.5 for ties and split verdicts.
        None when either order got no usable verdict."""
        if self.forward is None or self.backward is None:
            return None
        first = {"A": 1.0, "B": 0.0, "tie": 0.5}[self.forward]
        second = {"B": 1.0, "A": 0.0, "tie": 0.5}[self.backward]
        return (first + second) / 2


def _verdict(judge: LLM, query: str, context: str, first: str, second: str, errors: list[str]) -> str | None:
    prompt = render("judge_pair", query=query, context=context, first=first, second=second)
    try:
        reply = judge.complete([{"role": "user", "content": prompt}], schema=_PAIR_SCHEMA, max_tokens=120)
        winner = str(parse_json(reply.text, _PAIR_SCHEMA)["winner"]).strip().strip(".").upper()
    except LLMError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
        return None
    if winner in ("A", "B"):
        return winner
    if winner == "TIE":
        return "tie"
    errors.append(f"judge named no winner ({winner!r})")
    return None


def win_rate(judge: LLM, query: str, first: str, second: str, *, context: str = "") -> PairVerdict:
    """Judge ``first`` against ``second`` twice, swapping which is shown as A.

    ``context`` (optional) is shown to the judge before the replies, e.g. the user's stated preference.
    """
    context_block = f"\nWhat is known about the user:\n{context}\n" if context else ""
    errors: list[str] = []
    forward = _verdict(judge, query, context_block, first, second, errors)
    backward = _verdict(judge, query, context_block, second, first, errors)
    return PairVerdict(forward, backward, 2, errors)
