"""The policy's parameters (:class:`PGRConfig`), each checked on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from pgr_core.errors import InvalidArgumentError
from pgr_core.models.caches import ProspectionCache
from pgr_core.policy.hygiene import Hygiene
from pgr_core.policy.ranking import RANKINGS
from pgr_core.types import Budget, SearchParams

__all__ = ["ADAPTIVE_MODES", "PGRConfig"]

ADAPTIVE_MODES = ("off", "heuristic", "llm")


@dataclass(frozen=True)
class PGRConfig:
    """The policy's parameters, with the paper's defaults. Every value is checked on construction.

    - ``top_k`` / ``min_score``: K and τ per probe (5, 0.3).
    - ``augment_top_k`` / ``augment_min_score``: Ko and τo of the augmentation lookup (5, 0.3). The
      paper's τo is 0.6; with MiniLM's cosines that floor left augmentation (and so Phase 1, which
      sees the same records) without a single record for 16 of 18 MQ-lite dev requests, so pgr uses
      τ (see lab/RESULTS.md).
    - ``delta``: δ, stop when a round adds fewer new facts (5).
    - ``max_rounds``: I_max, the most Phase-2 rounds (10).
    - ``query_only_k``: K of the query-only baseline (20).
    - ``window``: temporal window w (±w turns around each hit, for stores that keep turn order).
    - ``max_facts``: cut R* to this many facts, neighbours included (None: keep all).
    - ``neighbour_decay``: γ, what a window neighbour earns (0.8, a number in (0, 1]): one ``d`` turns
      from its anchor scores γ^d x the anchor's score and takes its place in the probe's list by that
      score, so it displaces a direct hit only when it outscores it (see
      :func:`pgr_core.policy.ranking.earned_order`). 0.8 was best or level at ±1 on MQ-lite turns, PrefEval
      and LoCoMo among 0.7 to 1.0; the order before, every neighbour right behind its anchor, read below
      it at ±1 on all three (LoCoMo recall@20 0.524 against 0.560) and was deleted
      (lab/RESULTS.md, "Window neighbours earn their slot").
    - ``query_top_k``: K of the query's own probe in Phase 1 (20, the baseline's K, so the query's
      list can fill its share of any budget up to 40; the paper probes every text with K = 5).
    - ``ranking``: how R* is ordered for a budget (see :mod:`pgr_core.policy.ranking`): ``"llm"`` (the
      default: the summary call, which PGR makes anyway, also names the records that matter; they
      lead, and the shared order fills the rest; a reply that makes no choice, as a small model's
      does, falls back to the shared order and the trace says why) or ``"shared"`` (every prefix
      of R* gives the query's own list ``query_share`` of its slots and the step probes the rest,
      round-robin). ``"llm"`` was chosen by leave-one-user-out on MQ-lite dev with a capable
      model's replies, on every held-out user, over the shared order at five shares and three
      orders since deleted (docs/evidence.md).
    - ``query_share``: the query's share of every prefix under ``"shared"``, and under ``"llm"``
      after the chosen records or when there is no choice (0.25: with a capable model's steps the
      smallest share measured was chosen on every held-out user of MQ-lite dev; with the local 1.5B
      model's steps a larger share lost less, so a small model that cannot choose may want 0.75;
      docs/evidence.md).
    - ``answer_context_tokens``: how much of R* (in its order) the answer prompt holds (1500 tokens).
    - ``centring``: w, how far every probe's scores are centred on the scope's memory (1.0; ``None`` or
      0: off): a fact's cosine to a probe loses w x its mean cosine to the scope's facts, so the facts
      typical of everything the user says stop crowding out the specific ones (see
      :mod:`pgr_core.policy.centring`; no LLM). The floor τ still reads the store's cosine. Needs a store
      that can list a scope's facts (``facts_for``) and give their vectors (``vectors_for``) or an
      embedder; where it cannot, the call runs uncentred and its trace says why. ``query_only()``
      is never centred: it is the baseline.
    - ``centring_depth``: how many candidates per probe the centred order is taken from (100).
    - Not options: with an LLM, augmentation (the paper's step 0: the LLM restates the request as q_A
      from the records it found) always runs, and Phase 1 always probes q_A beside the request, read
      like it (``query_top_k``, no floor); the query's share of R* holds each fact at its best score
      over the two lists. Probing q_A gained about +0.03 at 20 facts with the local 1.5B model's steps
      (lab/RESULTS.md, "q_A as a probe").
    - ``budget``: the :class:`Budget` every call runs under (LLM calls, tokens, deadline; no cap by
      default). A call's own ``budget=`` can only tighten it.

    Savings (each switchable; see :mod:`pgr_core.models.caches`):

    - ``embedding_cache`` (on): probe texts are embedded once per call and across calls: hygiene and
      the store share one text → vector cache (the store's own :class:`~pgr_core.models.caches.CachedEmbedder`
      when it has one, else one of ``embedding_cache_size`` entries). Results are unchanged. Off, every
      cache on the call's path passes straight through.
    - ``phase1_reuse`` (off): a query whose cosine to an earlier one of the same scope and date reaches
      ``phase1_reuse_threshold`` (0.95) reuses that query's q_A and initial steps (no augmentation or
      Phase-1 LLM call); the store is probed afresh. At most ``phase1_reuse_max_entries`` (64) per
      scope, each ``phase1_reuse_ttl_s`` (3600) seconds at most, cleared when the store reports a
      change in the scope.
    - ``adaptive`` (``"off"``): skip prospection when the query's own hits already answer a plain
      factual question, returning the query-only top ``query_only_k``. ``"heuristic"``: a wh-question
      (when, where, who, which, what, how many...) asking no advice or plan, whose top hit scores at
      least ``adaptive_min_score`` (0.55); no LLM call at all. ``"llm"``: the augmentation call also
      says whether its records answer the question (no extra call).
    """

    top_k: int = 5
    min_score: float = 0.3
    augment_top_k: int = 5
    augment_min_score: float = 0.3
    delta: int = 5
    max_rounds: int = 10
    query_only_k: int = 20
    window: int = 0
    max_facts: int | None = None
    neighbour_decay: float = 0.8
    query_top_k: int = 20
    ranking: str = "llm"
    query_share: float = 0.25
    answer_context_tokens: int = 1500
    centring: float | None = 1.0
    centring_depth: int = 100
    hygiene: Hygiene = field(default_factory=Hygiene)
    budget: Budget = field(default_factory=Budget)
    embedding_cache: bool = True
    embedding_cache_size: int = 4096
    phase1_reuse: bool = False
    phase1_reuse_threshold: float = 0.95
    phase1_reuse_ttl_s: float = 3600.0
    phase1_reuse_max_entries: int = 64
    adaptive: str = "off"
    adaptive_min_score: float = 0.55

    def __post_init__(self) -> None:
        object.__setattr__(self, "budget", Budget.coerce(self.budget) or Budget())
        for name in ("embedding_cache", "phase1_reuse"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.adaptive not in ADAPTIVE_MODES:
            modes = ", ".join(map(repr, ADAPTIVE_MODES))
            raise InvalidArgumentError(f"adaptive must be one of {modes}, got {self.adaptive!r}")
        a = self.adaptive_min_score
        if isinstance(a, bool) or not isinstance(a, int | float) or not 0.0 <= a <= 1.0:
            raise InvalidArgumentError(f"adaptive_min_score must be a number in [0, 1], got {a!r}")
        size = self.embedding_cache_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidArgumentError(f"embedding_cache_size must be an integer >= 0, got {size!r}")
        ProspectionCache(  # validates the reuse options
            threshold=self.phase1_reuse_threshold,
            max_entries=self.phase1_reuse_max_entries,
            ttl_s=self.phase1_reuse_ttl_s,
        )
        self.probe_params()  # validates top_k, min_score, window
        SearchParams(self.augment_top_k, self.augment_min_score)
        SearchParams(self.query_only_k, 0.0)
        SearchParams(self.query_top_k, 0.0)
        for name in ("delta", "max_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgumentError(f"{name} must be an integer >= 0, got {value!r}")
        if self.max_facts is not None and (not isinstance(self.max_facts, int) or self.max_facts < 1):
            raise InvalidArgumentError(f"max_facts must be None or an integer >= 1, got {self.max_facts!r}")
        g = self.neighbour_decay
        if g is None:
            raise InvalidArgumentError(
                "neighbour_decay must be a number in (0, 1], got None (None, every neighbour right behind "
                "its anchor, lost to the earned order and was deleted)"
            )
        if isinstance(g, bool) or not isinstance(g, int | float) or not 0.0 < g <= 1.0:
            raise InvalidArgumentError(f"neighbour_decay must be a number in (0, 1], got {g!r}")
        if self.ranking not in RANKINGS:
            raise InvalidArgumentError(f"ranking must be one of {', '.join(map(repr, RANKINGS))}, got {self.ranking!r}")
        q = self.query_share
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0.0 <= q <= 1.0:
            raise InvalidArgumentError(f"query_share must be a number in [0, 1], got {q!r}")
        t = self.answer_context_tokens
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise InvalidArgumentError(f"answer_context_tokens must be an integer >= 1, got {t!r}")
        c = self.centring
        if c is not None and (isinstance(c, bool) or not isinstance(c, int | float) or not 0.0 <= c <= 5.0):
            raise InvalidArgumentError(f"centring must be None or a number in [0, 5], got {c!r}")
        d = self.centring_depth
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise InvalidArgumentError(f"centring_depth must be an integer >= 1, got {d!r}")

    def probe_params(self) -> SearchParams:
        return SearchParams(top_k=self.top_k, min_score=self.min_score, window=self.window)
