"""Prospection-Guided Retrieval: the policy, in the order the paper runs it.

    0. query augmentation   φ(q; τo, Ko) → the LLM restates the request as q_A
    1. initial prospection  steps from q_A → R = φ(q) ∪ ⋃ φ(step)            (one store call)
    2. personalisation      repeat: revise steps given R → Δ = new facts → R ∪= Δ
                            until |Δ| < δ or I_max rounds                     (one store call each)
    3. summary              which steps surfaced which facts, and why they matter
    4. answer (optional)    PAG: a reply from R* and the summary

Every step is a generator yielding :class:`Search` / :class:`Ask` effects; :meth:`PGR._drive` and
:meth:`PGR._adrive` perform them, so the sync and async APIs share one flow. The drivers also hold the
call's :class:`Budget`: a refused LLM call is thrown back into the flow, and the phase that asked stops
prospecting and keeps what it has.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ._dates import DateLike, check_same_kind, parse_date
from ._effects import Ask, Flow, Search
from .caches import CachedEmbedder, ProspectionCache, Reusable, counting_embeddings, current_count
from .embedders import Embedder
from .errors import ConfigurationError, InvalidArgumentError, LLMError, LLMTimeoutError, StoreError
from .hygiene import Hygiene, clean_steps
from .llm import LLM, Completion
from .llm import Usage as CallUsage
from .prompts import render
from .prospectors import (
    FacetProspector,
    LLMProspector,
    NoProspection,
    Prospection,
    Prospector,
    plain_summary,
    quoted,
)
from .ranking import RANKINGS, choose, fused_order, llm_order, shared_order
from .store import Store
from .trace import Adaptive, BudgetReason, FoundFact, Probe, RetrievalResult, Round, Step, Trace, Usage
from .types import Budget, Hit, Scope, SearchParams

__all__ = ["PGR", "Answer", "PGRConfig"]

_RRF_K = 60  # reciprocal-rank fusion constant (Cormack et al.): damps the weight of rank 1
_ANSWER_TOKENS = 500  # max_tokens of the answer call; answer() keeps them (and one call) in reserve
_MAX_INTENT_CHARS = 600  # q_A goes into every later prompt: a runaway restatement is cut
_MAX_SUMMARY_CHARS = 2000
_ABANDONED = "no answer in the {seconds:.3g}s the deadline left; the call was abandoned"
_ADAPTIVE_MODES = ("off", "heuristic", "llm")
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

BudgetArg = Budget | Mapping[str, Any] | None


@dataclass(frozen=True)
class PGRConfig:
    """The policy's parameters, with the paper's defaults. Every value is checked on construction.

    - ``top_k`` / ``min_score``: K and τ per probe (5, 0.3).
    - ``augment_top_k`` / ``augment_min_score``: Ko and τo of the augmentation lookup (5, 0.6).
    - ``delta``: δ, stop when a round adds fewer new facts (5).
    - ``max_rounds``: I_max, the most Phase-2 rounds (10).
    - ``query_only_k``: K of the query-only baseline (20).
    - ``window``: temporal window w (±w turns around each hit, for stores that keep turn order).
    - ``max_facts``: cut R* to this many facts, neighbours included (None: keep all).
    - ``query_top_k``: K of the query's own probe in Phase 1 (20, the baseline's K, so the query's
      list can fill its share of any budget up to 40; the paper probes every text with K = 5).
    - ``ranking``: how R* is ordered for a budget (see :mod:`pgr_core.ranking`): ``"shared"`` (the
      default: every prefix of R* gives the query's own list ``query_share`` of its slots and the
      step probes the rest, round-robin, facts several probes found first), ``"llm"`` (the summary
      call names the records that matter; they lead, the shared order fills the rest; a non-choice
      falls back to it) or ``"fused"`` (best weighted reciprocal rank: with ``query_weight`` above
      1.32 the query's top 20 outrank every step-only fact, so ``top(20)`` is the query-only list).
    - ``query_share``: the query's share of every prefix under ``"shared"`` and ``"llm"`` (0.5).
    - ``query_weight``: weight of the query's own hit list under ``"fused"``.
    - ``answer_context_tokens``: how much of R* (in its order) the answer prompt holds (1500 tokens).
    - ``budget``: the :class:`Budget` every call runs under (LLM calls, tokens, deadline; no cap by
      default). A call's own ``budget=`` can only tighten it.

    Savings (each switchable; see :mod:`pgr_core.caches`):

    - ``embedding_cache`` (on): probe texts are embedded once per call and across calls: hygiene and
      the store share one text → vector cache (the store's own :class:`~pgr_core.caches.CachedEmbedder`
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
    augment_min_score: float = 0.6
    delta: int = 5
    max_rounds: int = 10
    query_only_k: int = 20
    window: int = 0
    max_facts: int | None = None
    query_top_k: int = 20
    query_weight: float = 1.5
    ranking: str = "shared"
    query_share: float = 0.5
    answer_context_tokens: int = 1500
    augment: bool = True
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
        for name in ("augment", "embedding_cache", "phase1_reuse"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.adaptive not in _ADAPTIVE_MODES:
            modes = ", ".join(map(repr, _ADAPTIVE_MODES))
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
        if self.ranking not in RANKINGS:
            raise InvalidArgumentError(f"ranking must be one of {', '.join(map(repr, RANKINGS))}, got {self.ranking!r}")
        q = self.query_share
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0.0 <= q <= 1.0:
            raise InvalidArgumentError(f"query_share must be a number in [0, 1], got {q!r}")
        t = self.answer_context_tokens
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise InvalidArgumentError(f"answer_context_tokens must be an integer >= 1, got {t!r}")
        if not self.query_weight >= 0:
            raise InvalidArgumentError(f"query_weight must be >= 0, got {self.query_weight!r}")

    def probe_params(self) -> SearchParams:
        return SearchParams(top_k=self.top_k, min_score=self.min_score, window=self.window)


@dataclass
class Answer:
    """A prospection-augmented answer (PAG). ``text`` is empty when the LLM failed (``degraded``)."""

    text: str
    facts: list[FoundFact]
    retrieval: RetrievalResult
    degraded: bool = False
    error: str | None = None


def _strategy_prospector(strategy: str | Prospector | None, llm: LLM | None) -> Prospector:
    if isinstance(strategy, Prospector):
        if strategy.requires_llm and llm is None:
            raise ConfigurationError(f"prospector {strategy.name!r} needs an LLM: pass llm=...")
        return strategy
    if strategy is None:
        strategy = "tot" if llm is not None else "none"
    if strategy in ("cot", "tot"):
        if llm is None:
            raise ConfigurationError(
                f"strategy {strategy!r} needs an LLM: pass llm=OpenAICompatible(...), set PGR_LLM_BASE_URL, "
                "or use strategy='facet' (no LLM)"
            )
        return LLMProspector(strategy)
    if strategy == "facet":
        return FacetProspector()
    if strategy == "none":
        return NoProspection()
    raise InvalidArgumentError(f"unknown strategy {strategy!r}: use 'tot', 'cot', 'facet', 'none' or a Prospector")


def _renumbered(steps: Sequence[Step], round_index: int) -> list[Step]:
    """Fresh copies of reused steps with this call's ids (``r<round>.<n>``), tree links kept."""
    ids = {s.id: f"r{round_index}.{i}" for i, s in enumerate(steps, 1)}
    return [
        Step(
            id=ids[s.id],
            text=s.text,
            dimension=s.dimension,
            parent=ids.get(s.parent) if s.parent else None,
            children=[ids[c] for c in s.children if c in ids],
            round=round_index,
        )
        for s in steps
    ]


def _cut(hits: list[Hit], top_k: int, min_score: float) -> list[Hit]:
    """A probe's hits cut to its own K and τ; a neighbour stays exactly when its anchor does."""
    kept_anchors = {h.fact.id for h in hits if h.neighbour_of is None and h.rank < top_k and h.score >= min_score}
    return [h for h in hits if (h.neighbour_of or h.fact.id) in kept_anchors]


class PGR:
    """Prospection-Guided Retrieval over any :class:`~pgr_core.store.Store`.

    >>> pgr = PGR(store, llm=OpenAICompatible(base_url=..., model=...), strategy="tot")  # doctest: +SKIP
    >>> result = pgr.retrieve("Should I join a soccer league this summer?",
    ...                       scope=Scope(user_id="u1"), date="2025-05-01")  # doctest: +SKIP

    ``strategy``: ``"tot"`` or ``"cot"`` (LLM), ``"facet"`` (LLM-free probes), ``"none"`` (no
    prospection: the query's own list), or a :class:`Prospector`. Left ``None``, it is ``"tot"`` with
    an LLM and ``"none"`` without: the facet prospector found less than the query alone at an equal
    number of facts on MQ-lite (see benchmarks/RESULTS.md), so it is opt-in. Keyword arguments that name
    :class:`PGRConfig` fields override its defaults.
    """

    def __init__(
        self,
        store: Store,
        llm: LLM | None = None,
        strategy: str | Prospector | None = None,
        *,
        config: PGRConfig | None = None,
        embedder: Embedder | None = None,
        **overrides: Any,
    ) -> None:
        if not isinstance(store, Store):
            raise InvalidArgumentError(f"store must be a pgr_core.Store, not {type(store).__name__}")
        unknown = set(overrides) - set(PGRConfig.__dataclass_fields__)
        if unknown:
            raise InvalidArgumentError(
                f"unknown option(s) {sorted(unknown)}; options are {sorted(PGRConfig.__dataclass_fields__)}"
            )
        base = config or PGRConfig()
        self.config = PGRConfig(**{**base.__dict__, **overrides}) if overrides else base
        if not store.capabilities.scoped:
            raise ConfigurationError(
                f"{type(store).__name__} cannot filter by scope (capabilities.scoped=False): pgr refuses to run "
                "on a store it would have to search unscoped"
            )
        self.store = store
        self.llm = llm
        self.prospector = _strategy_prospector(strategy, llm)
        self.strategy = getattr(self.prospector, "strategy", self.prospector.name)
        # Hygiene compares probes by embedding: the store's own embedder when it has one, behind a cache
        # (the store's own when it caches, so the store's embedding of each round's probes is free).
        cfg = self.config
        own = getattr(store, "embedder", None)
        if embedder is None or (isinstance(own, CachedEmbedder) and own.inner is embedder):
            embedder = own
        self.embedder: Embedder | None = (
            CachedEmbedder.wrap(embedder, max_entries=cfg.embedding_cache_size) if embedder is not None else None
        )
        self.phase1_cache: ProspectionCache | None = None
        if cfg.phase1_reuse:
            if self.embedder is None:
                raise ConfigurationError(
                    "phase1_reuse compares queries by embedding: pass embedder=... or use a store that has one"
                )
            self.phase1_cache = ProspectionCache(
                threshold=cfg.phase1_reuse_threshold,
                max_entries=cfg.phase1_reuse_max_entries,
                ttl_s=cfg.phase1_reuse_ttl_s,
            )
            store.add_listener(self.phase1_cache.invalidate)  # held weakly: dropping this PGR drops it

    def __repr__(self) -> str:
        return f"PGR(store={type(self.store).__name__}, prospector={self.prospector.name!r}, llm={self.llm!r})"

    # ================================================================== public API

    def retrieve(
        self,
        query: str,
        *,
        scope: Scope | Mapping[str, str],
        date: DateLike | None = None,
        budget: BudgetArg = None,
    ) -> RetrievalResult:
        """Run prospection and return R* (ranked), the summary and the trace. Never raises for LLM or
        store failures: the result is then ``degraded`` and holds what was found so far.

        ``budget`` caps this call's LLM calls, tokens and time (see :class:`Budget`); when a cap is
        reached the result holds what was found so far and ``trace.budget_hit`` names the cap.
        """
        meter = self._meter(budget)
        return self._drive(self._retrieve_flow(*self._check(query, scope, date), meter), meter)

    async def aretrieve(
        self,
        query: str,
        *,
        scope: Scope | Mapping[str, str],
        date: DateLike | None = None,
        budget: BudgetArg = None,
    ) -> RetrievalResult:
        """Async twin of :meth:`retrieve`."""
        meter = self._meter(budget)
        return await self._adrive(self._retrieve_flow(*self._check(query, scope, date), meter), meter)

    def query_only(
        self,
        query: str,
        *,
        scope: Scope | Mapping[str, str],
        date: DateLike | None = None,
        top_k: int | None = None,
        window: int | None = None,
    ) -> RetrievalResult:
        """The baseline through the same store: the query's top K (20) facts, window included.

        With a window, neighbours count toward K: the top hits and their neighbours fill the budget.
        """
        return self._drive(self._query_only_flow(*self._check(query, scope, date), top_k, window))

    async def aquery_only(
        self,
        query: str,
        *,
        scope: Scope | Mapping[str, str],
        date: DateLike | None = None,
        top_k: int | None = None,
        window: int | None = None,
    ) -> RetrievalResult:
        """Async twin of :meth:`query_only`."""
        return await self._adrive(self._query_only_flow(*self._check(query, scope, date), top_k, window))

    def answer(
        self,
        query: str,
        *,
        scope: Scope | Mapping[str, str],
        date: DateLike | None = None,
        budget: BudgetArg = None,
    ) -> Answer:
        """Prospection-augmented generation: retrieve, then answer from R* and the summary.

        Under a ``budget``, retrieval leaves one LLM call and the answer's 500 completion tokens for the
        answer; when even that does not fit, ``text`` is empty and the answer is ``degraded``.
        """
        meter = self._meter(budget)
        return self._drive(self._answer_flow(*self._check(query, scope, date, needs_llm=True), meter), meter)

    async def aanswer(
        self,
        query: str,
        *,
        scope: Scope | Mapping[str, str],
        date: DateLike | None = None,
        budget: BudgetArg = None,
    ) -> Answer:
        """Async twin of :meth:`answer`."""
        meter = self._meter(budget)
        return await self._adrive(self._answer_flow(*self._check(query, scope, date, needs_llm=True), meter), meter)

    # ================================================================== argument checks

    def _check(
        self, query: str, scope: Scope | Mapping[str, str], date: DateLike | None, *, needs_llm: bool = False
    ) -> tuple[str, Scope, datetime | None]:
        if not isinstance(query, str) or not query.strip():
            raise InvalidArgumentError(f"query must be a non-empty string, got {query!r}")
        if needs_llm and self.llm is None:
            raise ConfigurationError("answer() needs an LLM: pass llm=... to PGR or set PGR_LLM_BASE_URL")
        return query.strip(), Scope.coerce(scope), parse_date(date, what="date")

    def _meter(self, budget: BudgetArg) -> _Meter:
        """This call's budget: the instance's, tightened by the call's own (checked here, up front)."""
        return _Meter(self.config.budget.tightened(Budget.coerce(budget)))

    # ================================================================== the flow

    def _retrieve_flow(self, query: str, scope: Scope, date: datetime | None, meter: _Meter) -> Flow:
        trace = Trace(
            query=query,
            strategy=str(self.strategy),
            prospector=self.prospector.name,
            date=date.isoformat() if date else None,
            scope=scope.as_dict(),
            budget=meter.budget.as_dict() or None,
        )
        p = Prospection(query=query, date=date, scope=scope, trace=trace, intent=query)
        p.ranker = lambda: self._order(p)
        p.want_choice = self.config.ranking == "llm"
        started = time.perf_counter()
        try:
            yield from self._run_phases(p, meter)
        except LLMError as exc:
            trace.degrade("llm_error", exc)
        except StoreError as exc:
            trace.degrade("store_error", exc)
        except _BudgetStop as stop:
            trace.hit_budget(stop.reason, stop.phase)
            trace.stop_reason = stop.reason
        p.trace.intent = p.intent
        summary = yield from self._summary(p)
        trace.seconds = time.perf_counter() - started
        facts = self._ranked(p)
        if trace.stop_reason == "adaptive_skip":
            facts = facts[: self.config.query_only_k]
        return RetrievalResult(facts=facts, summary=summary, trace=trace)

    def _run_phases(self, p: Prospection, meter: _Meter) -> Flow:
        cfg = self.config
        cache = self.phase1_cache
        version = cache.begin(p.scope) if cache is not None else 0  # before anything reads the store
        lookup: tuple[Round, list[Hit]] | None = None
        if cfg.adaptive != "off":
            lookup = yield from self._lookup(p)
            if lookup is not None and cfg.adaptive == "heuristic":
                p.trace.adaptive = self._heuristic(p.query, lookup[1])
                if p.trace.adaptive.skipped:
                    self._keep_query_hits(p, *lookup)
                    return
        reused = self._reusable(p)
        if reused is not None:
            p.intent = reused.intent
            p.trace.reused_phase1_from, p.trace.reused_similarity = reused.query, round(reused.similarity, 6)
        elif self.prospector.requires_llm and cfg.augment and not p.trace.degraded:
            p.ask_answered = cfg.adaptive == "llm"
            p.intent = yield from self._augment(p, lookup[1] if lookup is not None else None)
        if cfg.adaptive == "llm":
            p.trace.adaptive = self._llm_decision(p, reused)
            if p.trace.adaptive.skipped and lookup is not None:
                self._keep_query_hits(p, *lookup)
                return
        new = yield from self._initial_prospection(p, reused)
        if cache is not None and reused is None and p.query_vector is not None:
            self._remember(p, cache, version)
        if p.trace.degraded:
            return
        if p.trace.budget_hit:
            p.trace.stop_reason = p.trace.budget_hit
            return
        phase2_rounds = 0
        while True:
            if len(new) < cfg.delta:
                p.trace.stop_reason = "delta_below_threshold"
                return
            if phase2_rounds >= cfg.max_rounds:
                p.trace.stop_reason = "max_rounds"
                return
            if meter.expired():  # also bounds an LLM-free prospector's rounds
                p.trace.hit_budget("deadline", "personalized")
                p.trace.stop_reason = "deadline"
                return
            phase2_rounds += 1
            new, probed = yield from self._personalized_round(p, new)
            if not probed:
                p.trace.stop_reason = "no_new_probes"
                return

    # ------------------------------------------------------------------ adaptive mode

    def _lookup(self, p: Prospection) -> Flow:
        """The query's own top K (the baseline's, window included), read by adaptive mode and, cut to
        (Ko, τo), by augmentation: one store call serves both. None when the store failed."""
        cfg = self.config
        rnd = self._new_round(p, "augment")
        params = SearchParams(max(cfg.query_only_k, cfg.augment_top_k), 0.0, window=cfg.window)
        with self._phase(p.trace, "augment"):
            try:
                hits = yield from self._search(p, rnd, [Probe(p.query, "query")], params, count=False)
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
            return Adaptive("llm", False, "no augmentation call to ask (LLM-free prospector or augment=False)", top)
        if p.answered is None:
            return Adaptive("llm", False, "the augmentation call gave no verdict", top)
        if not p.answered:
            return Adaptive("llm", False, "the LLM found the records do not answer the question", top)
        return Adaptive("llm", True, "the LLM found the records already answer the question", top)

    def _keep_query_hits(self, p: Prospection, rnd: Round, hits: list[Hit]) -> None:
        """Adaptive skip: R is the query's top K, exactly what :meth:`query_only` returns."""
        self._merge(p, rnd, rnd.probes[0], _cut(hits, self.config.query_only_k, 0.0))
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

    # ------------------------------------------------------------------ the paper's phases

    def _augment(self, p: Prospection, context: list[Hit] | None = None) -> Flow:
        """Step 0: the query under the strict floor τo, then the LLM's restatement q_A.

        ``context``: the query's hits already fetched (adaptive mode's lookup), cut here to (Ko, τo)."""
        cfg = self.config
        with self._phase(p.trace, "augment"):
            if context is None:
                rnd = self._new_round(p, "augment")
                params = SearchParams(cfg.augment_top_k, cfg.augment_min_score)
                try:
                    hits = (yield from self._search(p, rnd, [Probe(p.query, "query")], params, count=False))[0]
                except StoreError as exc:  # Phase 1 still probes the query: the store may answer that
                    p.trace.degrade("store_error", exc)
                    return p.query
            else:
                hits = [h for h in _cut(context, cfg.augment_top_k, cfg.augment_min_score) if h.neighbour_of is None]
            p.context_top = max((h.score for h in hits), default=None)
            try:
                intent = yield from self.prospector.augment(p, hits)
            except LLMError as exc:
                p.trace.degrade("llm_error", exc)
                return p.query
            except _BudgetStop as stop:
                p.trace.hit_budget(stop.reason, stop.phase)
                return p.query
        return " ".join(str(intent).split())[:_MAX_INTENT_CHARS] or p.query

    def _initial_prospection(self, p: Prospection, reused: Reusable | None = None) -> Flow:
        """Phase 1: steps from q_A (or reused from a near-identical query); R = φ(q) ∪ ⋃ φ(step)."""
        rnd = self._new_round(p, "initial")
        with self._phase(p.trace, "initial"):
            t0 = time.perf_counter()
            steps: list[Step] = []
            if reused is not None:
                steps = _renumbered(reused.steps, p.round)
            elif not p.trace.degraded and not p.trace.budget_hit:  # once the LLM failed or a cap was hit, stop asking
                try:
                    steps = yield from self.prospector.initial(p)
                except LLMError as exc:
                    p.trace.degrade("llm_error", exc)
                except _BudgetStop as stop:
                    p.trace.hit_budget(stop.reason, stop.phase)
            # the query is always probed, so a degraded result still holds its hits
            rnd.prospect_seconds = time.perf_counter() - t0
            p.plan = list(steps)
            probes = [Probe(p.query, "query"), *self._accept(p, rnd, steps)]
            # One store call: ask for the larger K and the lower floor, then cut each list back to its
            # own (K, τ): the query keeps the baseline's (query_top_k, no floor), steps get (K, τ).
            cfg = self.config
            params = cfg.probe_params().with_(top_k=max(cfg.top_k, cfg.query_top_k), min_score=0.0)
            limits = [(cfg.query_top_k, 0.0)] + [(cfg.top_k, cfg.min_score)] * (len(probes) - 1)
            try:
                yield from self._search(p, rnd, probes, params, limits=limits)
            except StoreError as exc:
                if len(probes) == 1:
                    raise
                p.trace.degrade("store_error", exc)
                yield from self._query_fallback(p)
        return [p.found[i] for i in rnd.new_fact_ids]

    def _query_fallback(self, p: Prospection) -> Flow:
        """After a failed Phase-1 batch, the query alone, once: a store that can still answer it gives
        the baseline's hits. A second failure propagates (the result is then empty and degraded)."""
        cfg = self.config
        rnd = self._new_round(p, "query_only")
        params = cfg.probe_params().with_(top_k=cfg.query_top_k, min_score=0.0)
        yield from self._search(p, rnd, [Probe(p.query, "query")], params)

    def _personalized_round(self, p: Prospection, new: list[FoundFact]) -> Flow:
        """Phase 2, one round: revise the steps given R; probe; return (Δ, whether anything was probed)."""
        rnd = self._new_round(p, "personalized")
        with self._phase(p.trace, "personalized"):
            t0 = time.perf_counter()
            steps = yield from self.prospector.revise(p, new)
            rnd.prospect_seconds = time.perf_counter() - t0
            if self.prospector.whole_plan:  # the plan revised: what is left out is pruned
                ids = {s.id for s in steps}
                rnd.pruned = [s.id for s in p.plan if s.id not in ids]
                rnd.kept = [s.id for s in steps if s.status == "kept"]
                p.plan = list(steps)
                steps = [s for s in steps if s.status != "kept"]
            else:
                p.plan = [*p.plan, *steps]
            probes = self._accept(p, rnd, steps)
            if self.prospector.whole_plan:
                rnd.steps = list(p.plan)  # the whole plan as revised, kept steps included
            if not probes:
                return [], False
            yield from self._search(p, rnd, probes, self.config.probe_params())
        return [p.found[i] for i in rnd.new_fact_ids], True

    def _summary(self, p: Prospection) -> Flow:
        with self._phase(p.trace, "summary"):
            skipped = p.trace.stop_reason == "adaptive_skip"
            if p.trace.degraded or p.trace.budget_hit or self.llm is None or skipped:
                if p.want_choice:
                    p.trace.ranking_fallback = "no summary call (no LLM, degraded, a cap hit or an adaptive skip)"
                return plain_summary(p)
            try:
                summary = yield from self.prospector.summarize(p)
                p.trace.summary_fact_ids = list(p.summary_shown)
                if p.want_choice:
                    self._take_choice(p)
            except LLMError as exc:
                p.trace.errors.append(f"summary: {type(exc).__name__}: {exc}")
                p.trace.degraded = True
                if p.want_choice:
                    p.trace.ranking_fallback = "the summary call failed"
                return plain_summary(p)
            except _BudgetStop as stop:  # the rounds ended on their own: stop_reason keeps why
                p.trace.hit_budget(stop.reason, stop.phase)
                if p.want_choice:
                    p.trace.ranking_fallback = f"no summary call ({stop.reason})"
                return plain_summary(p)
        return str(summary).strip()[:_MAX_SUMMARY_CHARS] or plain_summary(p)

    def _take_choice(self, p: Prospection) -> None:
        """Ranking "llm": keep the records the summary call named, unless its reply made no choice."""
        if not p.summary_shown:
            p.trace.ranking_fallback = "the prospector shows the summary no records"
            return
        choice = choose(p.choice, p.summary_shown)
        p.trace.chosen_ids, p.trace.ranking_fallback = choice.chosen, choice.fallback

    def _query_only_flow(
        self, query: str, scope: Scope, date: datetime | None, top_k: int | None, window: int | None
    ) -> Flow:
        cfg = self.config
        k = cfg.query_only_k if top_k is None else top_k
        w = cfg.window if window is None else window
        params = SearchParams(top_k=k, min_score=0.0, window=w)
        trace = Trace(
            query=query,
            strategy="query-only",
            prospector="none",
            scope=scope.as_dict(),
            date=date.isoformat() if date else None,
        )
        p = Prospection(query=query, date=date, scope=scope, trace=trace, intent=query)
        started = time.perf_counter()
        rnd = self._new_round(p, "query_only")
        try:
            with self._phase(trace, "query_only"):
                yield from self._search(p, rnd, [Probe(query, "query")], params)
            trace.stop_reason = "query_only"
        except StoreError as exc:
            trace.degrade("store_error", exc)
        trace.seconds = time.perf_counter() - started
        facts = sorted(p.found.values(), key=lambda f: -f.rank_score)
        return RetrievalResult(facts=facts[:k], summary="", trace=trace)

    def _answer_flow(self, query: str, scope: Scope, date: datetime | None, meter: _Meter) -> Flow:
        meter.reserved_calls, meter.reserved_tokens = 1, _ANSWER_TOKENS  # retrieval leaves room to answer
        result = yield from self._retrieve_flow(query, scope, date, meter)
        meter.reserved_calls = meter.reserved_tokens = 0
        facts = result.facts
        p = Prospection(query=query, date=date, scope=scope, trace=result.trace)
        shown: list[str] = []
        text = render(
            "answer",
            date=p.date_text(),
            query=query,
            summary=quoted(result.summary, _MAX_SUMMARY_CHARS) if result.summary else "(none)",
            memories=p.memory_lines(facts, max_tokens=self.config.answer_context_tokens, shown=shown),
        )
        result.trace.answer_fact_ids = shown
        try:
            with self._phase(result.trace, "answer"):
                messages = [{"role": "user", "content": text}]
                completion = yield Ask("answer", messages, None, _ANSWER_TOKENS, result.trace)
        except LLMError as exc:
            result.trace.errors.append(f"answer: {type(exc).__name__}: {exc}")
            return Answer(text="", facts=facts, retrieval=result, degraded=True, error=str(exc))
        except _BudgetStop as stop:
            result.trace.hit_budget(stop.reason, stop.phase)
            return Answer(text="", facts=facts, retrieval=result, degraded=True, error=f"{stop.reason}: {stop}")
        return Answer(text=completion.text.strip(), facts=facts, retrieval=result, degraded=result.degraded)

    # ================================================================== helpers of the flow

    def _new_round(self, p: Prospection, phase: Any) -> Round:
        p.round = len(p.trace.rounds)
        rnd = Round(index=p.round, phase=phase)
        p.trace.rounds.append(rnd)
        return rnd

    def _accept(self, p: Prospection, rnd: Round, steps: Sequence[Step]) -> list[Probe]:
        """Probe hygiene: keep distinct, short steps; record the dropped ones."""
        earlier = [pr.text for r in p.trace.rounds for pr in r.probes]
        if p.intent != p.query:
            earlier.append(p.intent)
        with self._embeds(p.trace, rnd.phase):  # one embedding call for the whole round
            kept, dropped = clean_steps(
                steps, query=p.query, earlier=earlier, rules=self.config.hygiene, embedder=self.embedder
            )
        rnd.dropped.extend(dropped)
        rnd.steps.extend(steps)
        p.steps.extend(steps)
        return [Probe(s.probe or s.text, "step", step_id=s.id) for s in kept]

    def _search(
        self,
        p: Prospection,
        rnd: Round,
        probes: list[Probe],
        params: SearchParams,
        *,
        count: bool = True,
        limits: Sequence[tuple[int, float]] | None = None,
    ) -> Flow:
        """One store call for the whole round; fold the hits into R (when ``count``).

        ``limits`` cuts each probe's list to its own (K, τ); neighbours follow their anchor."""
        t0 = time.perf_counter()
        rnd.probes.extend(probes)
        rnd.store_calls += 1
        try:
            with self._embeds(p.trace, rnd.phase):  # the store's own embedding of the probes
                hit_lists: list[list[Hit]] = yield Search([pr.text for pr in probes], params, p.scope)
        finally:  # a failed call is billed too
            seconds = time.perf_counter() - t0
            rnd.search_seconds += seconds
            spent = Usage(store_calls=1, store_seconds=seconds)
            p.trace.usage.add(spent)
            p.trace.usage_by_phase.setdefault(rnd.phase, Usage()).add(spent)
        if limits is not None:
            hit_lists = [_cut(hits, k, tau) for hits, (k, tau) in zip(hit_lists, limits, strict=True)]
        for probe, hits in zip(probes, hit_lists, strict=True):
            probe.hits = [(h.fact.id, round(h.score, 6)) for h in hits if h.neighbour_of is None]
            probe.neighbours = [h.fact.id for h in hits if h.neighbour_of is not None]
            if count:
                self._merge(p, rnd, probe, hits)
        return hit_lists

    def _merge(self, p: Prospection, rnd: Round, probe: Probe, hits: list[Hit]) -> None:
        """R ∪= hits; Δ counts direct hits only (neighbours are recorded, not counted toward δ)."""
        weight = self.config.query_weight if probe.source == "query" else 1.0
        for hit in hits:
            if p.date is not None and hit.fact.date is not None:
                check_same_kind(hit.fact.date, p.date, a_name=f"fact {hit.fact.id!r}'s date", b_name="the query date")
            # reciprocal rank, max over probes: a fact is as good as its best placement, so many
            # look-alike probes hitting the same generic fact cannot push it above the query's hits
            fused = weight / (_RRF_K + hit.rank + (0.5 if hit.neighbour_of else 0.0))
            known = p.found.get(hit.fact.id)
            if known is None:
                p.found[hit.fact.id] = FoundFact(
                    fact=hit.fact,
                    score=hit.score if hit.neighbour_of is None else 0.0,
                    rank_score=fused,
                    round=rnd.index,
                    probe=probe.text,
                    step_id=probe.step_id,
                    via="neighbour" if hit.neighbour_of else "hit",
                    probes_hit=0 if hit.neighbour_of else 1,
                    anchor=hit.neighbour_of,
                )
                (rnd.new_neighbour_ids if hit.neighbour_of else rnd.new_fact_ids).append(hit.fact.id)
                continue
            known.rank_score = max(known.rank_score, fused)
            if hit.neighbour_of is None:
                known.probes_hit += 1
                known.score = max(known.score, hit.score)
                if known.via == "neighbour":  # reached directly now: it counts toward Δ
                    known.via, known.anchor = "hit", None
                    known.round, known.probe, known.step_id = rnd.index, probe.text, probe.step_id
                    rnd.new_fact_ids.append(hit.fact.id)

    def _order(self, p: Prospection) -> list[FoundFact]:
        """R in the configured order (see :mod:`pgr_core.ranking`); "llm" uses the summary's choice
        once there is one, the shared order until then."""
        cfg = self.config
        if cfg.ranking == "fused" or p.trace.stop_reason == "adaptive_skip":
            return fused_order(p.found)
        probes = [pr for r in p.trace.rounds for pr in r.probes]
        if cfg.ranking == "llm" and p.trace.chosen_ids:
            return llm_order(p.found, probes, cfg.query_share, p.trace.chosen_ids)
        return shared_order(p.found, probes, cfg.query_share)

    def _ranked(self, p: Prospection) -> list[FoundFact]:
        """R*, ordered for a budget and cut to ``max_facts``."""
        p.trace.ranking = "fused" if p.trace.stop_reason == "adaptive_skip" else self.config.ranking
        facts = self._order(p)
        return facts[: self.config.max_facts] if self.config.max_facts else facts

    @contextmanager
    def _embeds(self, trace: Trace, phase: str) -> Iterator[None]:
        """Bill to ``phase`` the embeddings made meanwhile (hygiene's, the store's, the reuse lookup's)."""
        count = current_count()
        before = count.snapshot() if count is not None else (0, 0, 0)
        try:
            yield
        finally:
            if count is not None:
                calls, texts, hits = (now - then for now, then in zip(count.snapshot(), before, strict=True))
                if calls or texts or hits:
                    spent = Usage(embed_calls=calls, embed_texts=texts, embed_cache_hits=hits)
                    trace.usage.add(spent)
                    trace.usage_by_phase.setdefault(phase, Usage()).add(spent)

    @contextmanager
    def _phase(self, trace: Trace, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            trace.seconds_by_phase[phase] = trace.seconds_by_phase.get(phase, 0.0) + time.perf_counter() - t0

    # ================================================================== drivers

    def _drive(self, flow: Flow, meter: _Meter | None = None) -> Any:
        """Run a flow with blocking calls (its embeddings counted, and cached or not, as configured)."""
        meter = meter or _Meter(Budget())
        to_send: Any = None
        to_throw: BaseException | None = None
        with counting_embeddings(use_cache=self.config.embedding_cache):
            while True:
                try:
                    effect = flow.throw(to_throw) if to_throw is not None else flow.send(to_send)
                except StopIteration as stop:
                    return stop.value
                to_send, to_throw = None, None
                try:
                    if isinstance(effect, Search):
                        to_send = self.store._checked_search(effect.probes, effect.scope, effect.params)
                    else:
                        meter.admit(effect)
                        with self._billing(effect) as box:
                            box.append(self._ask(effect, meter.time_left()))
                        to_send = box[0]
                except (LLMError, StoreError, _BudgetStop) as exc:
                    to_throw = meter.explain(exc, effect)

    async def _adrive(self, flow: Flow, meter: _Meter | None = None) -> Any:
        """Run a flow with awaitable calls. The embedding count lives in this task's context, and worker
        threads of ``asyncio.to_thread`` inherit it, so concurrent calls never mix their counts."""
        meter = meter or _Meter(Budget())
        to_send: Any = None
        to_throw: BaseException | None = None
        with counting_embeddings(use_cache=self.config.embedding_cache):
            while True:
                try:
                    effect = flow.throw(to_throw) if to_throw is not None else flow.send(to_send)
                except StopIteration as stop:
                    return stop.value
                to_send, to_throw = None, None
                try:
                    if isinstance(effect, Search):
                        to_send = await self.store._achecked_search(effect.probes, effect.scope, effect.params)
                    else:
                        meter.admit(effect)
                        with self._billing(effect) as box:
                            box.append(await self._aask(effect, meter.time_left()))
                        to_send = box[0]
                except (LLMError, StoreError, _BudgetStop) as exc:
                    to_throw = meter.explain(exc, effect)

    def _ask(self, effect: Ask, time_left: float | None) -> Completion:
        """One blocking LLM call, bounded by the time the deadline leaves (None: unbounded)."""
        llm = self._llm()

        def call(**extra: Any) -> Completion:
            return llm.complete(effect.messages, schema=effect.schema, max_tokens=effect.max_tokens, **extra)

        if time_left is None:
            return _completion(call(), llm)
        if llm.accepts_timeout:
            return _completion(call(timeout=time_left), llm)
        return _completion(_abandon_after(time_left, call), llm)

    async def _aask(self, effect: Ask, time_left: float | None) -> Completion:
        """One awaited LLM call; past the deadline the await is abandoned (the call is cancelled)."""
        llm = self._llm()
        extra: dict[str, Any] = {"timeout": time_left} if time_left is not None and llm.accepts_timeout else {}
        call = llm.acomplete(effect.messages, schema=effect.schema, max_tokens=effect.max_tokens, **extra)
        if time_left is None:
            return _completion(await call, llm)
        try:
            return _completion(await asyncio.wait_for(call, time_left), llm)
        except TimeoutError:
            raise LLMTimeoutError(
                f"no answer in the {time_left:.3g}s the deadline left; the call was abandoned"
            ) from None

    def _llm(self) -> LLM:
        if self.llm is None:  # a prospector that needs an LLM is refused at construction
            raise ConfigurationError("this step needs an LLM: pass llm=... to PGR")
        return self.llm

    @contextmanager
    def _billing(self, effect: Ask) -> Iterator[list[Completion]]:
        """Time one LLM call and bill it to the trace; a custom LLM's own exception becomes LLMError."""
        t0, box = time.perf_counter(), list[Completion]()
        try:
            yield box
        except LLMError:
            self._bill(effect, None, time.perf_counter() - t0)
            raise
        except Exception as exc:
            self._bill(effect, None, time.perf_counter() - t0)
            raise LLMError(f"{type(exc).__name__}: {exc}") from exc
        self._bill(effect, box[0] if box else None, time.perf_counter() - t0)

    @staticmethod
    def _bill(effect: Ask, completion: Completion | None, seconds: float) -> None:
        """Count one LLM call (failed ones too) in the trace, overall and for its phase."""
        spent = Usage(llm_calls=1, seconds=seconds)
        if completion is not None:
            spent.prompt_tokens = completion.usage.prompt_tokens
            spent.completion_tokens = completion.usage.completion_tokens
        effect.trace.usage.add(spent)
        effect.trace.usage_by_phase.setdefault(effect.phase, Usage()).add(spent)


# ====================================================================== budgets


class _BudgetStop(Exception):
    """Thrown into the flow when a cap refuses an LLM call; the phase that asked catches it."""

    def __init__(self, reason: BudgetReason, phase: str, detail: str) -> None:
        super().__init__(detail)
        self.reason: BudgetReason = reason
        self.phase = phase


class _Meter:
    """One call's budget and what is left of it. Spending is read from the call's own trace."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.started = time.perf_counter()
        self.reserved_calls = 0  # kept back for the answer while retrieving
        self.reserved_tokens = 0

    def time_left(self) -> float | None:
        if self.budget.deadline_s is None:
            return None
        return self.budget.deadline_s - (time.perf_counter() - self.started)

    def expired(self) -> bool:
        left = self.time_left()
        return left is not None and left <= 0

    def admit(self, effect: Ask) -> None:
        """Raise :class:`_BudgetStop` unless the LLM call ``effect`` fits in what is left."""
        b, spent = self.budget, effect.trace.usage
        if self.expired():
            raise _BudgetStop("deadline", effect.phase, f"the {b.deadline_s:g}s deadline passed")
        if b.max_llm_calls is not None and spent.llm_calls + 1 + self.reserved_calls > b.max_llm_calls:
            raise _BudgetStop(
                "budget_llm_calls", effect.phase, f"{spent.llm_calls} of {b.max_llm_calls} LLM calls spent"
            )
        if b.max_tokens is not None:
            need = CallUsage.estimate(effect.messages, "").prompt_tokens + effect.max_tokens
            if spent.total_tokens + need + self.reserved_tokens > b.max_tokens:
                raise _BudgetStop(
                    "budget_tokens",
                    effect.phase,
                    f"{spent.total_tokens} of {b.max_tokens} tokens spent; the next call may take {need}",
                )

    def explain(self, exc: BaseException, effect: Search | Ask) -> BaseException:
        """An LLM failure once the deadline has passed is the deadline's doing."""
        if isinstance(exc, LLMError) and isinstance(effect, Ask) and self.expired():
            return _BudgetStop("deadline", effect.phase, f"the {self.budget.deadline_s:g}s deadline passed ({exc})")
        return exc


def _completion(value: object, llm: LLM) -> Completion:
    if not isinstance(value, Completion):
        raise LLMError(f"{llm!r} returned a {type(value).__name__}, not a Completion")
    return value


def _abandon_after(seconds: float, call: Callable[[], Completion]) -> Completion:
    """Run a blocking call in a daemon thread and stop waiting after ``seconds``: for LLM clients that
    take no timeout. An abandoned call runs on in the background; its reply is dropped."""
    box: list[tuple[bool, Any]] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as exc:  # handed to the waiting thread, never lost
            box.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="pgr-llm-call", daemon=True).start()
    if not done.wait(max(seconds, 0.0)):
        raise LLMTimeoutError(_ABANDONED.format(seconds=seconds))
    ok, value = box[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value
