"""Probe hygiene: whatever the prospector proposes, only distinct, short probes reach the store."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pgr_core.errors import InvalidArgumentError
from pgr_core.models.embedders import Embedder
from pgr_core.observability.trace import DroppedProbe, Round, Step

__all__ = ["Hygiene", "clean_steps"]

_WORD = re.compile(r"[\w']+", re.UNICODE)


@dataclass(frozen=True)
class Hygiene:
    """Limits applied to every round's steps before they become probes.

    - ``max_words``: a probe is cut to this many words (long probes blur the embedding).
    - ``max_chars``: and to this many characters (a model's runaway output can hold huge "words").
    - ``max_probes``: at most this many step probes per round.
    - ``echo_threshold``: a step whose cosine to the query reaches this only repeats the query.
    - ``duplicate_threshold``: a step this close to an earlier probe (this round or before) is dropped.
    Without an embedder, word-set overlap (Jaccard) stands in for cosine. A probe keeps the query's own
    words: stripping them from the 1.5B model's steps found no more relevant turns (7 in all, as
    without it; lab/RESULTS.md), and that option was deleted.
    """

    max_words: int = 32
    max_chars: int = 400
    max_probes: int = 8
    echo_threshold: float = 0.9
    duplicate_threshold: float = 0.9

    def __post_init__(self) -> None:
        for name in ("max_words", "max_chars", "max_probes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgumentError(f"Hygiene.{name} must be an integer >= 1, got {value!r}")
        for name in ("echo_threshold", "duplicate_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
                raise InvalidArgumentError(f"Hygiene.{name} must be a number in [0, 1], got {value!r}")


def normal_words(text: str) -> str:
    """The lower-case words of ``text``, single-spaced: two texts that differ only in case, spacing or
    punctuation come out the same."""
    return " ".join(_WORD.findall(text.lower()))


def _jaccard(a: str, b: str) -> float:
    sa, sb = set(_WORD.findall(a.lower())), set(_WORD.findall(b.lower()))
    return len(sa & sb) / len(sa | sb) if sa and sb else 0.0


def clean_steps(
    steps: Sequence[Step],
    *,
    query: str,
    earlier: Sequence[str],
    rules: Hygiene,
    embedder: Embedder | None,
    into: Round | None = None,
) -> tuple[list[Step], list[DroppedProbe]]:
    """Keep the steps whose text is a usable probe; say why each other one was dropped.

    ``earlier`` holds the probes already sent (earlier rounds and the query's own). Each kept step's
    ``probe`` is set: its text, cut to ``rules.max_words`` words and
    ``rules.max_chars`` characters. When the embedder fails, similarity falls back to word overlap
    (Jaccard) and the failure is recorded in ``into.hygiene_fallback`` (the round being cleaned).
    """
    dropped: list[DroppedProbe] = []
    candidates: list[Step] = []
    for step in steps:
        step.probe = step.text
        words = step.probe.split()
        if not normal_words(step.probe):
            dropped.append(DroppedProbe(step.text, "empty"))
            step.probe = None
            continue
        if len(words) > rules.max_words:
            step.probe = " ".join(words[: rules.max_words])
        step.probe = step.probe[: rules.max_chars]
        candidates.append(step)
    if not candidates:
        return [], dropped

    texts = [s.probe or s.text for s in candidates]
    matrix = None
    if embedder is not None:
        try:
            matrix = embedder.embed([query, *earlier, *texts])
        except Exception as exc:  # hygiene must not fail a round: compare by word overlap, and say so
            matrix = None
            if into is not None:
                into.hygiene_fallback = f"{type(exc).__name__}: {exc}"
    if matrix is not None:
        # every similarity this round needs, in three matrix products (no Python loop over pairs)
        q_sims = matrix[1 + len(earlier) :] @ matrix[0]
        e_sims = matrix[1 + len(earlier) :] @ matrix[1 : 1 + len(earlier)].T
        c_sims = matrix[1 + len(earlier) :] @ matrix[1 + len(earlier) :].T

        def to_query(i: int) -> float:
            return float(q_sims[i])

        def to_others(i: int, kept: list[int]) -> tuple[float, str | None]:
            best, similar = 0.0, None
            if len(earlier):
                j = int(e_sims[i].argmax())
                best, similar = float(e_sims[i, j]), earlier[j]
            if kept:
                row = c_sims[i, kept]
                j = int(row.argmax())
                if float(row[j]) > best or similar is None:
                    best, similar = float(row[j]), texts[kept[j]]
            return best, similar

    else:

        def to_query(i: int) -> float:
            return _jaccard(texts[i], query)

        def to_others(i: int, kept: list[int]) -> tuple[float, str | None]:
            pool = [(_jaccard(texts[i], e), e) for e in earlier] + [
                (_jaccard(texts[i], texts[j]), texts[j]) for j in kept
            ]
            return max(pool, default=(0.0, None), key=lambda p: p[0])

    kept: list[int] = []
    seen_exact = {normal_words(e) for e in earlier}
    for i, step in enumerate(candidates):
        norm = normal_words(texts[i])
        if norm == normal_words(query) or to_query(i) >= rules.echo_threshold:
            dropped.append(DroppedProbe(step.text, "echo_of_query", similar_to=query))
            step.probe = None
            continue
        best, similar = to_others(i, kept)
        if norm in seen_exact or best >= rules.duplicate_threshold:
            dropped.append(DroppedProbe(step.text, "duplicate", similar_to=similar))
            step.probe = None
            continue
        if len(kept) >= rules.max_probes:
            dropped.append(DroppedProbe(step.text, "over_limit"))
            step.probe = None
            continue
        kept.append(i)
        seen_exact.add(norm)
    return [candidates[i] for i in kept], dropped
