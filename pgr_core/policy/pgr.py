"""Prospection-Guided Retrieval: the policy, in the order the paper runs it.

    0. query augmentation   φ(q; τo, Ko) → the LLM restates the request as q_A
    1. initial prospection  steps from q_A → R = φ(q) ∪ ⋃ φ(step)            (one store call)
    2. personalisation      repeat: revise steps given R → Δ = new facts → R ∪= Δ
                            until |Δ| < δ or I_max rounds                     (one store call each)
    3. summary              which steps surfaced which facts, and why they matter
                            (ranking "llm": and which records matter most, in the same call)
       R* ranked            for a budget: the query's hits and the steps' share every prefix
                            (pgr_core.policy.ranking), so top(n) can hold what only a step found
    4. answer (optional)    PAG: a reply from R*'s head (a token budget) and the summary

Every store call φ is centred on the caller's memory (centring.py): each probe's list is read deep
and cut to its (K, τ) by cosine minus the fact's typicality, its mean cosine to the scope's facts.

Around the phases, not in this file: the options (config.py), centred scores (centring.py), the
adaptive decisions (savings.py; their steps are PGR's own ``_lookup``, ``_reusable``, ``_remember``),
the drivers and the budget meter (pgr_core.flow.drivers, pgr_core.flow.budget).

Every step is a generator yielding :class:`Search` / :class:`Ask` effects; :meth:`Driver.drive` and
:meth:`Driver.adrive` perform them, so the sync and async APIs share one flow. The drivers also hold the
call's :class:`Budget`: a refused LLM call is thrown back into the flow, and the phase that asked stops
prospecting and keeps what it has.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from pgr_core._dates import DateLike, as_utc, check_same_kind, parse_date
from pgr_core.errors import ConfigurationError, InvalidArgumentError, LLMError, StoreError
from pgr_core.flow.budget import BudgetStop, Meter
from pgr_core.flow.drivers import Driver
from pgr_core.flow.effects import Ask, Flow, Search, Typicality
from pgr_core.models.caches import CachedEmbedder, ProspectionCache, Reusable, current_count
from pgr_core.models.embedders import Embedder
from pgr_core.models.llm import LLM
from pgr_core.models.prompts import render
from pgr_core.observability.telemetry import Telemetry
from pgr_core.observability.trace import Answer, FoundFact, Probe, RetrievalResult, Round, Step, Trace, Usage
from pgr_core.policy.centring import MemoryCentre, centred, distinct_hits
from pgr_core.policy.config import PGRConfig
from pgr_core.policy.hygiene import clean_steps, normal_words
from pgr_core.policy.prospectors import (
    FeedbackProspector,
    LLMProspector,
    NoProspection,
    Prospection,
    Prospector,
    plain_summary,
    quoted,
    tidy_summary,
)
from pgr_core.policy.ranking import (
    QUERY_SIDE,
    choose,
    earned_order,
    fused_order,
    llm_order,
    shared_order,
    summed_order,
)
from pgr_core.policy.savings import cut_hits, heuristic, llm_decision
from pgr_core.stores.contract import Store
from pgr_core.types import Budget, Hit, Scope, SearchParams

__all__ = ["PGR", "Answer", "PGRConfig"]

_RRF_K = 60  # reciprocal-rank fusion constant (Cormack et al.): damps the weight of rank 1
_QUERY_WEIGHT = 1.5  # the request's own list in the fused order: its top 20 outrank every step-only fact
ANSWER_TOKENS = 500  # max_tokens of the answer call; answer() keeps them (and one call) in reserve
_MAX_INTENT_CHARS = 600  # q_A goes into every later prompt: a runaway restatement is cut
_MAX_SUMMARY_CHARS = 2000

BudgetArg = Budget | Mapping[str, Any] | None


# The strategy PGR runs when none is named; each chosen by leave-one-user-out on MQ-lite dev
# (docs/evidence.md). With an LLM: the chain (cot), chosen over the tree on every held-out user with a
# capable model's replies. Without an LLM: the feedback round, chosen over "none" on every held-out user.
LLM_STRATEGY = "cot"
NO_LLM_STRATEGY = "feedback"


def answer_prompt(
    p: Prospection,
    facts: Sequence[FoundFact],
    summary: str | None,
    *,
    max_tokens: int | None = None,
    limit: int | None = None,
    shown: list[str] | None = None,
) -> str:
    """The answer prompt (PAG): ``facts`` in their order, cut to ``limit`` facts or ``max_tokens``
    tokens, after the prospection ``summary`` ("(none)" without one). :meth:`PGR.answer` and the
    evaluation's answer comparison build the same request with it."""
    return render(
        "answer",
        date=p.date_text(),
        query=p.query,
        summary=quoted(summary, _MAX_SUMMARY_CHARS) if summary else "(none)",
        memories=p.memory_lines(facts, limit, max_tokens=max_tokens, shown=shown),
    )


def _strategy_prospector(strategy: str | Prospector | None, llm: LLM | None) -> Prospector:
    if isinstance(strategy, Prospector):
        if strategy.requires_llm and llm is None:
            raise ConfigurationError(f"prospector {strategy.name!r} needs an LLM: pass llm=...")
        return strategy
    if strategy is None:
        strategy = LLM_STRATEGY if llm is not None else NO_LLM_STRATEGY
    if strategy in ("cot", "tot"):
        if llm is None:
            raise ConfigurationError(
                f"strategy {strategy!r} needs an LLM: pass llm=OpenAICompatible(...), set PGR_LLM_BASE_URL, "
                "or use strategy='feedback' (no LLM)"
            )
        return LLMProspector(strategy)
    if strategy == "none":
        return NoProspection()
    if strategy == "feedback":
        return FeedbackProspector()
    raise InvalidArgumentError(f"unknown strategy {strategy!r}: use 'tot', 'cot', 'feedback', 'none' or a Prospector")


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


class PGR:
    """Prospection-Guided Retrieval over any :class:`~pgr_core.stores.contract.Store`.

    >>> pgr = PGR(store, llm=OpenAICompatible(base_url=..., model=...), strategy="tot")  # doctest: +SKIP
    >>> result = pgr.retrieve("Should I join a soccer league this summer?",
    ...                       scope=Scope(user_id="u1"), date="2025-05-01")  # doctest: +SKIP

    ``strategy``: ``"tot"`` or ``"cot"`` (LLM), ``"feedback"`` (one LLM-free round: the request joined
    to its first hits), ``"none"`` (no prospection: the query's own list), or a
    :class:`Prospector`. Left ``None``, it is :data:`LLM_STRATEGY` with an LLM and
    :data:`NO_LLM_STRATEGY` (``"feedback"``) without, as measured in docs/evidence.md. Keyword
    arguments that name :class:`PGRConfig` fields override its defaults.

    Watching a call (docs/observability.md):

    - ``progress``: called with one short line before each LLM call and after each store round, e.g.
      ``"query augmentation: waiting for the LLM (call 1)"`` or ``"personalisation round 1: 3 probes,
      5 new facts"``, so a CLI can show what a slow local model is doing. One that raises is logged and
      the call goes on.
    - OpenTelemetry (``pip install 'pgr[otel]'``; nothing is made without it): a span per call, per LLM
      call and per store round, and the GenAI token and duration histograms, through
      ``tracer_provider`` / ``meter_provider`` (None: the global ones).
    - ``record_content``: put the query, probes, facts, prompts, replies and scope values on the spans.
      They are personal data, so they are left off unless this is True or
      ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` is set.
    """

    def __init__(
        self,
        store: Store,
        llm: LLM | None = None,
        strategy: str | Prospector | None = None,
        *,
        config: PGRConfig | None = None,
        embedder: Embedder | None = None,
        progress: Callable[[str], object] | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        record_content: bool = False,
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
        self.telemetry = Telemetry(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            record_content=record_content,
            progress=progress,
        )
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
        # every probe's scores centred on the scope's memory (pgr_core.policy.centring); query_only() never is.
        # Typicality is measured in the store's own space when it has an embedder, whatever hygiene uses.
        space = CachedEmbedder.wrap(own, max_entries=cfg.embedding_cache_size) if own is not None else self.embedder
        # a store that centres its own scores (Anticipating(..., scoring="centred")) is not centred again
        self.store_centres = bool(getattr(store, "centres_scores", False))
        self.centre = MemoryCentre(store, space) if cfg.centring and not self.store_centres else None
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
        self._driver = Driver(store, llm, cfg, self.telemetry, self.centre)

    # ================================================================== savings: adaptive mode, Phase-1 reuse

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

    def _keep_query_hits(self, p: Prospection, rnd: Round, hits: list[Hit]) -> None:
        """Adaptive skip: R is the query's top K, exactly what :meth:`query_only` returns."""
        self._merge(p, rnd, rnd.probes[0], cut_hits(hits, self.config.query_only_k, 0.0))
        p.trace.stop_reason = "adaptive_skip"

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
        with self.telemetry.root("retrieve", str(self.strategy)) as root:
            meter = self._meter(budget)
            return root.finish(self._driver.drive(self._retrieve_flow(*self._check(query, scope, date), meter), meter))

    async def aretrieve(
        self,
        query: str,
        *,
        scope: Scope | Mapping[str, str],
        date: DateLike | None = None,
        budget: BudgetArg = None,
    ) -> RetrievalResult:
        """Async twin of :meth:`retrieve`."""
        with self.telemetry.root("retrieve", str(self.strategy)) as root:
            meter = self._meter(budget)
            flow = self._retrieve_flow(*self._check(query, scope, date), meter)
            return root.finish(await self._driver.adrive(flow, meter))

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
        with self.telemetry.root("query_only", "query-only") as root:
            return root.finish(
                self._driver.drive(self._query_only_flow(*self._check(query, scope, date), top_k, window))
            )

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
        with self.telemetry.root("query_only", "query-only") as root:
            flow = self._query_only_flow(*self._check(query, scope, date), top_k, window)
            return root.finish(await self._driver.adrive(flow))

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
        with self.telemetry.root("answer", str(self.strategy)) as root:
            meter = self._meter(budget)
            flow = self._answer_flow(*self._check(query, scope, date, needs_llm=True), meter)
            return root.finish(self._driver.drive(flow, meter))

    async def aanswer(
        self,
        query: str,
        *,
        scope: Scope | Mapping[str, str],
        date: DateLike | None = None,
        budget: BudgetArg = None,
    ) -> Answer:
        """Async twin of :meth:`answer`."""
        with self.telemetry.root("answer", str(self.strategy)) as root:
            meter = self._meter(budget)
            flow = self._answer_flow(*self._check(query, scope, date, needs_llm=True), meter)
            return root.finish(await self._driver.adrive(flow, meter))

    # ================================================================== argument checks

    def _check(
        self, query: str, scope: Scope | Mapping[str, str], date: DateLike | None, *, needs_llm: bool = False
    ) -> tuple[str, Scope, datetime | None]:
        if not isinstance(query, str) or not query.strip():
            raise InvalidArgumentError(f"query must be a non-empty string, got {query!r}")
        if needs_llm and self.llm is None:
            raise ConfigurationError("answer() needs an LLM: pass llm=... to PGR or set PGR_LLM_BASE_URL")
        moment = parse_date(date, what="date")
        if moment is not None and getattr(self.store, "naive_dates_are_utc", False):
            moment = as_utc(moment)  # its facts' dates are all aware (pgr_core._dates): compare like with like
        return query.strip(), Scope.coerce(scope), moment

    def _meter(self, budget: BudgetArg) -> Meter:
        """This call's budget: the instance's, tightened by the call's own (checked here, up front)."""
        return Meter(self.config.budget.tightened(Budget.coerce(budget)))

    # ================================================================== the flow

    def _retrieve_flow(self, query: str, scope: Scope, date: datetime | None, meter: Meter) -> Flow:
        trace = Trace(
            query=query,
            strategy=str(self.strategy),
            prospector=self.prospector.name,
            date=date.isoformat() if date else None,
            scope=scope.as_dict(),
            budget=meter.budget.as_dict() or None,
        )
        p = Prospection(query=query, date=date, scope=scope, trace=trace, intent=query)
        p.want_choice = self.config.ranking == "llm" and self.prospector.requires_llm
        started = time.perf_counter()
        try:
            yield from self._run_phases(p, meter)
        except LLMError as exc:
            trace.degrade("llm_error", exc)
        except StoreError as exc:
            trace.degrade("store_error", exc)
        except BudgetStop as stop:
            trace.hit_budget(stop.reason, stop.phase)
            trace.stop_reason = stop.reason
        p.trace.intent = p.intent
        summary = yield from self._summary(p)
        trace.seconds = time.perf_counter() - started
        facts = self._ranked(p)
        if trace.stop_reason == "adaptive_skip":
            facts = facts[: self.config.query_only_k]
        return RetrievalResult(facts=facts, summary=summary, trace=trace)

    def _run_phases(self, p: Prospection, meter: Meter) -> Flow:
        cfg = self.config
        cache = self.phase1_cache
        version = cache.begin(p.scope) if cache is not None else 0  # before anything reads the store
        lookup: tuple[Round, list[Hit]] | None = None
        if cfg.adaptive != "off":
            lookup = yield from self._lookup(p)
            if lookup is not None and cfg.adaptive == "heuristic":
                p.trace.adaptive = heuristic(p.query, lookup[1], self.config.adaptive_min_score)
                if p.trace.adaptive.skipped:
                    self._keep_query_hits(p, *lookup)
                    return
        if self.prospector.grounded:
            yield from self._grounded_round(p)
            return
        reused = self._reusable(p)
        if reused is not None:
            p.intent = reused.intent
            p.trace.reused_phase1_from, p.trace.reused_similarity = reused.query, round(reused.similarity, 6)
        elif self.prospector.requires_llm and not p.trace.degraded:
            p.ask_answered = cfg.adaptive == "llm"
            p.intent = yield from self._augment(p, lookup[1] if lookup is not None else None)
        if cfg.adaptive == "llm":
            p.trace.adaptive = llm_decision(p, reused)
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
                hits = cut_hits(context, cfg.augment_top_k, cfg.augment_min_score)
                hits = [h for h in hits if h.neighbour_of is None]
            p.context_top = max((h.score for h in hits), default=None)
            try:
                intent = yield from self.prospector.augment(p, hits)
            except LLMError as exc:
                p.trace.degrade("llm_error", exc)
                return p.query
            except BudgetStop as stop:
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
                except BudgetStop as stop:
                    p.trace.hit_budget(stop.reason, stop.phase)
            # the query is always probed, so a degraded result still holds its hits
            rnd.prospect_seconds = time.perf_counter() - t0
            p.plan = list(steps)
            cfg = self.config
            # q_A, the request restated with what augmentation found, probes beside the request itself
            asked = [Probe(p.query, "query")]
            if normal_words(p.intent) != normal_words(p.query):
                asked.append(Probe(p.intent, "intent"))
            probes = [*asked, *self._accept(p, rnd, steps)]
            # One store call: ask for the larger K and the lower floor, then cut each list back to its
            # own (K, τ): the query (and q_A) keep the baseline's (query_top_k, no floor), steps get (K, τ).
            params = cfg.probe_params().with_(top_k=max(cfg.top_k, cfg.query_top_k), min_score=0.0)
            limits = [(cfg.query_top_k, 0.0)] * len(asked) + [(cfg.top_k, cfg.min_score)] * (len(probes) - len(asked))
            try:
                yield from self._search(p, rnd, probes, params, limits=limits)
            except StoreError as exc:
                if len(probes) == 1:
                    raise
                p.trace.degrade("store_error", exc)
                yield from self._query_fallback(p)
        return [p.found[i] for i in rnd.new_fact_ids]

    def _grounded_round(self, p: Prospection) -> Flow:
        """A ``grounded`` prospector's LLM-free round (``strategy="feedback"``: the request joined to its
        first hits): the request, then the prospector's step from its hits, each read
        ``centring_depth`` deep (no floor) in one store call a round; R* is the summed order
        (``_ranked``). A failed second call leaves the request's own list."""
        cfg = self.config
        depth = max(cfg.query_top_k, cfg.centring_depth)
        params = cfg.probe_params().with_(top_k=depth, min_score=0.0)
        rnd = self._new_round(p, "initial")
        with self._phase(p.trace, "initial"):
            hits = (yield from self._search(p, rnd, [Probe(p.query, "query")], params, limits=[(depth, 0.0)]))[0]
        rnd = self._new_round(p, "personalized")
        step = self.prospector.grounded_step(p, hits)
        if step is None:
            p.trace.stop_reason = "no_new_probes"
            return
        rnd.steps.append(step)
        p.steps.append(step)
        p.plan = [step]
        with self._phase(p.trace, "personalized"):
            try:
                yield from self._search(
                    p, rnd, [Probe(step.probe or step.text, "step", step_id=step.id)], params, limits=[(depth, 0.0)]
                )
            except StoreError as exc:
                p.trace.degrade("store_error", exc)
                return
        p.trace.stop_reason = "no_new_probes"

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
                return self._without_choice(p, "no summary call (no LLM, degraded, a cap hit or an adaptive skip)")
            try:
                summary = yield from self.prospector.summarize(p)
            except LLMError as exc:
                p.trace.errors.append(f"summary: {type(exc).__name__}: {exc}")
                p.trace.degraded = True
                return self._without_choice(p, "the summary call failed")
            except BudgetStop as stop:  # the rounds ended on their own: stop_reason keeps why
                p.trace.hit_budget(stop.reason, stop.phase)
                return self._without_choice(p, f"no summary call ({stop.reason})")
            self._take_choice(p)
        return tidy_summary(str(summary), _MAX_SUMMARY_CHARS) or plain_summary(p)

    @staticmethod
    def _without_choice(p: Prospection, why: str) -> str:
        """The LLM-free summary; ranking "llm" records why it has no choice to rank by."""
        if p.want_choice:
            p.trace.ranking_fallback = why
        return plain_summary(p)

    @staticmethod
    def _take_choice(p: Prospection) -> None:
        """Ranking "llm": keep the records the summary call named, unless its reply made no choice."""
        if not p.want_choice:
            return
        shown = p.trace.summary_fact_ids
        if not shown:
            p.trace.ranking_fallback = "the prospector shows the summary no records"
            return
        choice = choose(p.choice, shown)
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
                yield from self._search(p, rnd, [Probe(query, "query")], params, centre=False)
            trace.stop_reason = "query_only"
        except StoreError as exc:
            trace.degrade("store_error", exc)
        trace.seconds = time.perf_counter() - started
        facts = sorted(p.found.values(), key=lambda f: -f.rank_score)
        return RetrievalResult(facts=facts[:k], summary="", trace=trace)

    def _answer_flow(self, query: str, scope: Scope, date: datetime | None, meter: Meter) -> Flow:
        meter.reserved_calls, meter.reserved_tokens = 1, ANSWER_TOKENS  # retrieval leaves room to answer
        result = yield from self._retrieve_flow(query, scope, date, meter)
        meter.reserved_calls = meter.reserved_tokens = 0
        facts = result.facts
        p = Prospection(query=query, date=date, scope=scope, trace=result.trace)
        shown: list[str] = []
        text = answer_prompt(p, facts, result.summary, max_tokens=self.config.answer_context_tokens, shown=shown)
        result.trace.answer_fact_ids = shown
        try:
            with self._phase(result.trace, "answer"):
                messages = [{"role": "user", "content": text}]
                completion = yield Ask("answer", messages, None, ANSWER_TOKENS, result.trace)
        except LLMError as exc:
            result.trace.errors.append(f"answer: {type(exc).__name__}: {exc}")
            return Answer(text="", facts=facts, retrieval=result, degraded=True, error=str(exc))
        except BudgetStop as stop:
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
                steps, query=p.query, earlier=earlier, rules=self.config.hygiene, embedder=self.embedder, into=rnd
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
        centre: bool = True,
    ) -> Flow:
        """One store call for the whole round; fold the hits into R (when ``count``).

        ``limits`` cuts each probe's list to its own (K, τ), a neighbour kept with its anchor; each
        neighbour then earns its place (:func:`~pgr_core.policy.ranking.earned_order`, ``neighbour_decay``). Centred
        (``centre`` and ``PGRConfig.centring``), each probe reads ``centring_depth`` candidates and is cut
        to its (K, τ) by centred score (:func:`pgr_core.policy.centring.centred`)."""
        cfg = self.config
        weight = cfg.centring if centre and self.centre is not None and p.trace.centring_off is None else None
        if centre and cfg.centring and self.store_centres and p.trace.centring_off is None:
            p.trace.centring_off = "the store centres its own scores"
        if weight:
            limits = list(limits) if limits is not None else [(params.top_k, params.min_score)] * len(probes)
            params = params.with_(top_k=max(params.top_k, cfg.centring_depth), min_score=0.0)
        t0 = time.perf_counter()
        rnd.probes.extend(probes)
        rnd.store_calls += 1
        typical: dict[str, float] | None = None
        try:
            with self._embeds(p.trace, rnd.phase):  # the store's own embedding of the probes
                hit_lists: list[list[Hit]] = yield Search([pr.text for pr in probes], params, p.scope, rnd)
                if weight:
                    try:
                        typical = yield Typicality(distinct_hits(hit_lists), p.scope)
                    except Exception as exc:  # the call goes on uncentred, and says why
                        p.trace.centring_off = f"{type(exc).__name__}: {exc}"
        finally:  # a failed call is billed too
            seconds = time.perf_counter() - t0
            rnd.search_seconds += seconds
            spent = Usage(store_calls=1, store_seconds=seconds)
            p.trace.usage.add(spent)
            p.trace.usage_by_phase.setdefault(rnd.phase, Usage()).add(spent)
        raw: dict[str, float] | None = None  # the anchors' own cosines, when their scores are centred
        if typical is not None and weight and limits is not None:
            p.trace.centring = weight
            raw = {h.key: h.score for hits in hit_lists for h in hits if h.neighbour_of is None}
            hit_lists = [
                centred(hits, typical, weight, k, tau) for hits, (k, tau) in zip(hit_lists, limits, strict=True)
            ]
        elif limits is not None:
            # a self-centring store's scores are not cosines: it read τ itself, at the call's floor (the
            # round's lowest), so each of its lists is cut to its K only
            hit_lists = [
                cut_hits(hits, k, -math.inf if self.store_centres else tau)
                for hits, (k, tau) in zip(hit_lists, limits, strict=True)
            ]
        if raw is None and self.store_centres:  # the similarities the store's centred scores came from
            raw = {h.key: h.raw for hits in hit_lists for h in hits if h.raw is not None}
        decay = self.config.neighbour_decay  # a window neighbour earns its place in the probe's list
        hit_lists = [earned_order(h, decay, raw) if any(x.neighbour_of for x in h) else h for h in hit_lists]
        for probe, hits in zip(probes, hit_lists, strict=True):
            probe.hits = [(h.key, round(h.score, 6)) for h in hits if h.neighbour_of is None]
            probe.neighbours = [h.key for h in hits if h.neighbour_of is not None]
            if probe.neighbours:
                probe.order = [h.key for h in hits]
            if count:
                self._merge(p, rnd, probe, hits)
        return hit_lists

    def _merge(self, p: Prospection, rnd: Round, probe: Probe, hits: list[Hit]) -> None:
        """R ∪= hits; Δ counts direct hits only (neighbours are recorded, not counted toward δ)."""
        weight = _QUERY_WEIGHT if probe.source in QUERY_SIDE else 1.0
        for hit in hits:
            if p.date is not None and hit.fact.date is not None:
                check_same_kind(hit.fact.date, p.date, a_name=f"fact {hit.fact.id!r}'s date", b_name="the query date")
            # reciprocal rank, max over probes: a fact is as good as its best placement, so many
            # look-alike probes hitting the same generic fact cannot push it above the query's hits
            fused = weight / (_RRF_K + hit.rank + (0.5 if hit.neighbour_of else 0.0))
            known = p.found.get(hit.key)
            if known is None:
                p.found[hit.key] = FoundFact(
                    fact=hit.fact,
                    score=hit.score if hit.neighbour_of is None else 0.0,
                    rank_score=fused,
                    round=rnd.index,
                    probe=probe.text,
                    step_id=probe.step_id,
                    via="neighbour" if hit.neighbour_of else "hit",
                    probes_hit=0 if hit.neighbour_of else 1,
                    beside=[hit.anchor] if hit.anchor else [],
                    cue=hit.cue,
                )
                (rnd.new_neighbour_ids if hit.neighbour_of else rnd.new_fact_ids).append(hit.key)
                continue
            known.rank_score = max(known.rank_score, fused)
            if hit.anchor is not None and hit.anchor not in known.beside:
                known.beside.append(hit.anchor)  # it rides with this anchor too, hit or not
            if hit.neighbour_of is None:
                known.probes_hit += 1
                if hit.score > known.score:
                    known.cue = hit.cue  # the cue (or None: the text) behind its best score
                known.score = max(known.score, hit.score)
                if known.via == "neighbour":  # reached directly now: it counts toward Δ
                    known.via = "hit"
                    known.round, known.probe, known.step_id = rnd.index, probe.text, probe.step_id
                    rnd.new_fact_ids.append(hit.key)

    def _ranked(self, p: Prospection) -> list[FoundFact]:
        """R*, in the configured order (see :mod:`pgr_core.policy.ranking`) and cut to ``max_facts``. An
        adaptive skip keeps the query's own order; "llm" without a usable choice is the shared order."""
        cfg = self.config
        p.trace.ranking = ranking = "fused" if p.trace.stop_reason == "adaptive_skip" else cfg.ranking
        probes = [pr for r in p.trace.rounds for pr in r.probes]
        if self.prospector.grounded and ranking != "fused":
            p.trace.ranking = "summed"
            facts = summed_order(p.found, probes)
        elif ranking == "fused":
            facts = fused_order(p.found)
        elif ranking == "llm" and p.trace.chosen_ids:
            facts = llm_order(p.found, probes, cfg.query_share, p.trace.chosen_ids)
        else:
            facts = shared_order(p.found, probes, cfg.query_share)
        return facts[: cfg.max_facts] if cfg.max_facts else facts

    @contextmanager
    def _embeds(self, trace: Trace, phase: str) -> Iterator[None]:
        """Bill to ``phase`` the embeddings made meanwhile (hygiene's, the store's, the reuse lookup's)."""
        count = current_count()
        if count is not None and count.scope is None:
            count.scope = Scope.coerce(trace.scope)  # the embedding cache serves a call only its own scope's entries
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
