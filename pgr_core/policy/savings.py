"""The savings that skip LLM work (see :mod:`pgr_core.models.caches` for the caches themselves).

- Adaptive mode: a plain factual question whose own hits already answer it skips prospection, by a
  heuristic (no LLM call) or by the augmentation call's verdict (no extra call).
- Phase-1 reuse: a near-identical query of the same scope and date reuses q_A and the initial steps.

Mixed into :class:`~pgr_core.policy.pgr.PGR`; the flow calls these where the paper's phases begin.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pgr_core.errors import StoreError
from pgr_core.flow.effects import Flow
from pgr_core.models.caches import ProspectionCache, Reusable
from pgr_core.observability.trace import Adaptive, Probe, Round
from pgr_core.policy.prospectors import Prospection
from pgr_core.types import Hit, SearchParams

if TYPE_CHECKING:
    from pgr_core.models.embedders import Embedder
    from pgr_core.policy.config import PGRConfig

__all__ = ["Savings", "cut_hits"]

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


class Savings:
    """Adaptive mode and Phase-1 reuse, as steps of :class:`~pgr_core.policy.pgr.PGR`'s flow."""

    config: PGRConfig
    embedder: Embedder | None
    phase1_cache: ProspectionCache | None
    _new_round: Any
    _search: Any
    _merge: Any
    _phase: Any
    _embeds: Any

    # ------------------------------------------------------------------ adaptive mode

    def _lookup(self, p: Prospection) -> Flow:
        """The query's own top K (the baseline's, window included), read by adaptive mode and, cut to
        (Ko, τo), by augmentation: one store call serves both. None when the store failed."""
        cfg = self.config
        rnd = self._new_round(p, "augment")
        params = SearchParams(max(cfg.query_only_k, cfg.augment_top_k), 0.0, window=cfg.window)
        with self._phase(p.trace, "augment"):
            try:
                hits = yield from self._search(p, rnd, [Probe(p.query, "query")], params, count=False, centre=False)
            except StoreError as exc:  # Phase 1 still probes the query: the store may answer that
                p.trace.degrade("store_error", exc)
                return None
        return rnd, hits[0]

    def _heuristic(self, query: str, hits: list[Hit]) -> Adaptive:
        """Skip when the query is a plain factual wh-question and its top hit scores high enough."""
        threshold = self.config.adaptive_min_score
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

    def _llm_decision(self, p: Prospection, reused: Reusable | None) -> Adaptive:
        top = p.context_top
        if reused is not None:
            return Adaptive("llm", False, "a near-identical query's Phase 1 was reused (no augmentation call)", top)
        if not p.ask_answered:
            return Adaptive(
                "llm", False, "no augmentation call to ask (LLM-free prospector, or a failure before it)", top
            )
        if p.answered is None:
            return Adaptive("llm", False, "the augmentation call gave no verdict", top)
        if not p.answered:
            return Adaptive("llm", False, "the LLM found the records do not answer the question", top)
        return Adaptive("llm", True, "the LLM found the records already answer the question", top)

    def _keep_query_hits(self, p: Prospection, rnd: Round, hits: list[Hit]) -> None:
        """Adaptive skip: R is the query's top K, exactly what :meth:`query_only` returns."""
        self._merge(p, rnd, rnd.probes[0], cut_hits(hits, self.config.query_only_k, 0.0))
        p.trace.stop_reason = "adaptive_skip"

    # ------------------------------------------------------------------ Phase-1 reuse

    def _reusable(self, p: Prospection) -> Reusable | None:
        """An earlier Phase-1 prospection of this scope and date for a near-identical query, if any."""
        cache = self.phase1_cache
        if cache is None or self.embedder is None:
            return None
        try:
            with self._embeds(p.trace, "augment"):
                p.query_vector = self.embedder.embed([p.query])[0]
        except Exception as exc:  # no reuse then; the call goes on as usual
            p.trace.errors.append(f"phase1_reuse: {type(exc).__name__}: {exc}")
            return None
        return cache.lookup(p.scope, p.date_text(), p.query_vector)

    def _remember(self, p: Prospection, cache: ProspectionCache, version: int) -> None:
        """Keep this call's Phase 1 when it is whole: q_A and steps from the prospector, nothing cut."""
        initial = next((r for r in p.trace.rounds if r.phase == "initial"), None)
        if initial is None or not initial.steps or p.trace.degraded or p.trace.budget_hit:
            return
        assert p.query_vector is not None
        cache.put(p.scope, p.date_text(), p.query, p.query_vector, p.intent, initial.steps, version=version)
