"""The savings that skip LLM work (see :mod:`pgr_core.models.caches` for the caches themselves).

- Adaptive mode: a plain factual question whose own hits already answer it skips prospection, by a
  heuristic (no LLM call) or by the augmentation call's verdict (no extra call).
- Phase-1 reuse: a near-identical query of the same scope and date reuses q_A and the initial steps.

The decisions live here; :class:`~pgr_core.policy.pgr.PGR`'s flow takes them where the paper's phases
begin (its ``_lookup``, ``_reusable`` and ``_remember`` steps).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pgr_core.models.caches import Reusable
from pgr_core.observability.trace import Adaptive
from pgr_core.policy.prospectors import Prospection
from pgr_core.types import Hit

if TYPE_CHECKING:
    pass

__all__ = ["cut_hits", "heuristic", "llm_decision"]

# A plain factual question opens with a wh-word (after an optional "and"/"so"/"but")...
_FACTUAL = re.compile(
    r"^(?:(?:and|so|but|also|ok|okay)[ ,]+)?"
    r"(when|where|who|whom|whose|which|what|how (?:many|much|long|old|often|far))\b",
    re.IGNORECASE,
)
# ...and asks for no advice, plan, judgement or guess: those are what prospection is for.
_NOT_PLAIN = re.compile(
    r"\b(should|shall|could|would|might|ought|can i|can we|can you|do you think|help me|plan|planning|"
    r"recommend\w*|suggest\w*|advi[cs]e|ideas?|tips?|what if|worth|better|best way|likely|probably|"
    r"how do i|how can i)\b",
    re.IGNORECASE,
)


def cut_hits(hits: list[Hit], top_k: int, min_score: float) -> list[Hit]:
    """A probe's hits cut to its own K and τ; a neighbour stays exactly when its anchor does."""
    kept_anchors = {h.key for h in hits if h.neighbour_of is None and h.rank < top_k and h.score >= min_score}
    return [h for h in hits if (h.anchor or h.key) in kept_anchors]


def heuristic(query: str, hits: list[Hit], threshold: float) -> Adaptive:
    """Skip when the query is a plain factual wh-question and its top hit scores high enough."""
    top = max((h.score for h in hits if h.neighbour_of is None), default=None)
    opener = _FACTUAL.match(query.strip())
    if opener is None:
        return Adaptive("heuristic", False, "not a wh-question of fact (when, where, who, which, what...)", top)
    advice = _NOT_PLAIN.search(query)
    if advice is not None:
        return Adaptive("heuristic", False, f"asks for more than a fact ({advice.group(0).lower()!r})", top)
    if top is None:
        return Adaptive("heuristic", False, "the query found nothing", top)
    if top < threshold:
        return Adaptive("heuristic", False, f"top hit scores {top:.3f} < {threshold:g}", top)
    why = f"plain factual question ({opener.group(1).lower()!r}), top hit {top:.3f} >= {threshold:g}"
    return Adaptive("heuristic", True, why, top)


def llm_decision(p: Prospection, reused: Reusable | None) -> Adaptive:
    """Skip when the augmentation call said its records already answer the question."""
    top = p.context_top
    if reused is not None:
        return Adaptive("llm", False, "a near-identical query's Phase 1 was reused (no augmentation call)", top)
    if not p.ask_answered:
        return Adaptive("llm", False, "no augmentation call to ask (LLM-free prospector, or a failure before it)", top)
    if p.answered is None:
        return Adaptive("llm", False, "the augmentation call gave no verdict", top)
    if not p.answered:
        return Adaptive("llm", False, "the LLM found the records do not answer the question", top)
    return Adaptive("llm", True, "the LLM found the records already answer the question", top)
