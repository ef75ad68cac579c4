"""What one retrieval did, round by round: the record behind ``RetrievalResult.trace``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pgr_core.models.llm import estimate_tokens
from pgr_core.types import Fact

__all__ = [
    "Adaptive",
    "Answer",
    "DroppedProbe",
    "FoundFact",
    "Probe",
    "RetrievalResult",
    "Round",
    "Step",
    "Trace",
    "Usage",
]

Phase = Literal["augment", "initial", "personalized", "query_only", "summary", "answer"]
StopReason = Literal[
    "delta_below_threshold",  # |Δ| < δ
    "max_rounds",  # I_max rounds of Phase 2 ran
    "no_new_probes",  # the prospector had no probe left that hygiene let through
    "llm_error",  # the LLM failed; what was found so far is returned
    "store_error",  # the store failed; what was found so far is returned
    "query_only",  # no prospection was asked for
    "budget_llm_calls",  # Budget.max_llm_calls was reached; pgr stopped asking the LLM
    "budget_tokens",  # the next LLM call would not fit in Budget.max_tokens
    "deadline",  # Budget.deadline_s ran out (before a call, or while one was in flight)
    "adaptive_skip",  # adaptive mode: the query's own hits already answer a plain factual question
]
BudgetReason = Literal["budget_llm_calls", "budget_tokens", "deadline"]


@dataclass
class Step:
    """One imagined step. In a ToT tree ``parent``/``children`` link the nodes; a CoT chain has none."""

    id: str
    text: str
    dimension: str | None = None
    parent: str | None = None
    children: list[str] = field(default_factory=list)
    round: int = 1
    probe: str | None = None  # the text sent to the store, after hygiene (None: not probed)
    status: Literal["added", "kept", "rewritten"] = "added"  # what a Phase-2 revision did with it


@dataclass
class Probe:
    """A text sent to the store: the query itself, or a step's text."""

    text: str
    source: Literal["query", "step", "intent"]
    step_id: str | None = None
    hits: list[tuple[str, float]] = field(default_factory=list)  # (fact id, score), direct hits
    neighbours: list[str] = field(default_factory=list)  # fact ids the window brought in
    order: list[str] = field(default_factory=list)  # hits and neighbours as ranked, each neighbour at the
    # place it earned (PGRConfig.neighbour_decay); empty when the window brought none: the hits' order


@dataclass
class DroppedProbe:
    text: str
    reason: Literal["empty", "echo_of_query", "duplicate", "over_limit"]
    similar_to: str | None = None


@dataclass
class Usage:
    """What a retrieval spent, overall (``Trace.usage``) or in one phase (``Trace.usage_by_phase``).

    ``seconds`` is time spent waiting on the LLM, ``store_seconds`` on the store; failed calls count.
    A phase's wall time (prompt building, hygiene and ranking included) is in ``Trace.seconds_by_phase``.

    Embeddings (probe hygiene's, and the store's when it embeds through a
    :class:`~pgr_core.models.caches.CachedEmbedder`, as the embedded store and MiniLM do): ``embed_calls`` that
    reached an embedding model, the ``embed_texts`` it embedded, and ``embed_cache_hits``, texts served
    from the cache instead. The cache serves a call only entries that calls of its own scope filled
    (:mod:`pgr_core.models.caches`), so these counts never tell one user what another asked.
    """

    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    store_calls: int = 0
    store_seconds: float = 0.0
    embed_calls: int = 0
    embed_texts: int = 0
    embed_cache_hits: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, other: Usage) -> None:
        self.llm_calls += other.llm_calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.seconds += other.seconds
        self.store_calls += other.store_calls
        self.store_seconds += other.store_seconds
        self.embed_calls += other.embed_calls
        self.embed_texts += other.embed_texts
        self.embed_cache_hits += other.embed_cache_hits

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_tokens": self.total_tokens}


@dataclass
class Adaptive:
    """What adaptive mode decided: whether prospection was skipped, and why.

    ``mode`` is ``"heuristic"`` (a plain factual question whose top hit scores at least the threshold)
    or ``"llm"`` (the augmentation call said its records already answer the question).
    """

    mode: Literal["heuristic", "llm"]
    skipped: bool
    reason: str
    top_score: float | None = None


@dataclass
class Round:
    """One store call and what led to it."""

    index: int
    phase: Phase
    steps: list[Step] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    dropped: list[DroppedProbe] = field(default_factory=list)
    new_fact_ids: list[str] = field(default_factory=list)  # Δ: direct hits not seen before
    new_neighbour_ids: list[str] = field(default_factory=list)  # window neighbours not seen before
    prompt_fact_ids: list[str] = field(default_factory=list)  # the facts this round's prompt showed, in order
    kept: list[str] = field(default_factory=list)  # step ids the revision kept as they were (not probed again)
    pruned: list[str] = field(default_factory=list)  # step ids the revision left out
    # why probe hygiene compared this round's steps by word overlap instead of cosine (its embedder
    # failed: "RuntimeError: ..."); None when it did not fall back
    hygiene_fallback: str | None = None
    store_calls: int = 0
    prospect_seconds: float = 0.0
    search_seconds: float = 0.0


@dataclass
class FoundFact:
    """A fact in R*, with where it was first found."""

    fact: Fact
    score: float  # best cosine any probe gave it (0 for a fact only reached through the window)
    rank_score: float  # the fused score R* is ordered by
    round: int
    probe: str
    step_id: str | None = None
    via: Literal["hit", "neighbour"] = "hit"
    probes_hit: int = 1  # how many probes returned it directly
    beside: list[str] = field(default_factory=list)  # the keys of the hits whose window brought it in
    cue: str | None = None  # the cue that scored its best hit, when a cue beat its text (Anticipating)

    @property
    def id(self) -> str:
        return self.fact.id

    @property
    def key(self) -> str:
        """The fact's id, and its owner where one user's agents or runs may share the id (``Fact.key``)."""
        return self.fact.key

    @property
    def text(self) -> str:
        return self.fact.text

    def to_dict(self) -> dict[str, Any]:
        out = self.fact.to_dict()
        out.update(
            score=round(self.score, 6),
            rank_score=round(self.rank_score, 6),
            round=self.round,
            probe=self.probe,
            step_id=self.step_id,
            via=self.via,
            probes_hit=self.probes_hit,
            beside=list(self.beside),
        )
        if self.cue is not None:
            out["cue"] = self.cue
        return out


@dataclass
class Trace:
    query: str
    strategy: str
    prospector: str
    date: str | None = None
    scope: dict[str, str] = field(default_factory=dict)
    intent: str | None = None  # q_A, the augmented query
    rounds: list[Round] = field(default_factory=list)
    stop_reason: StopReason | None = None
    degraded: bool = False
    errors: list[str] = field(default_factory=list)
    unusable_outputs: int = 0  # LLM replies that failed to parse or match the schema
    repairs: int = 0  # repair retries made after an unusable reply
    usage: Usage = field(default_factory=Usage)
    usage_by_phase: dict[str, Usage] = field(default_factory=dict)
    seconds_by_phase: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    budget: dict[str, float] | None = None  # the caps this call ran under (None: no cap)
    budget_hit: BudgetReason | None = None  # the cap that stopped pgr asking the LLM
    budget_phase: str | None = None  # the phase whose LLM call (or round) that cap refused
    adaptive: Adaptive | None = None  # adaptive mode's decision (None: mode off)
    reused_phase1_from: str | None = None  # the earlier query whose Phase-1 prospection was reused
    reused_similarity: float | None = None  # its cosine to this query
    ranking: str | None = None  # how R* was ordered: "llm", "shared", "summed" (feedback) or "fused" (an adaptive skip)
    centring: float | None = None  # w the probes' scores were centred with (None: not centred)
    centring_off: str | None = None  # why a call configured to centre could not
    chosen_ids: list[str] = field(default_factory=list)  # ranking "llm": the facts the summary call put first
    ranking_fallback: str | None = None  # ranking "llm": why its choice was not used (None: it was)
    summary_fact_ids: list[str] = field(default_factory=list)  # the facts the summary prompt showed
    answer_fact_ids: list[str] = field(default_factory=list)  # answer(): the facts its prompt held

    @property
    def store_calls(self) -> int:
        return sum(r.store_calls for r in self.rounds)

    @property
    def dropped_probes(self) -> int:
        return sum(len(r.dropped) for r in self.rounds)

    @property
    def steps(self) -> list[Step]:
        """Every step proposed, in order: a rewritten one again under its id, a kept one once."""
        return [s for r in self.rounds for s in r.steps if s.status != "kept"]

    def degrade(self, reason: StopReason, error: BaseException) -> None:
        self.degraded = True
        self.stop_reason = reason
        self.errors.append(f"{type(error).__name__}: {error}")

    def hit_budget(self, reason: BudgetReason, phase: str) -> None:
        """Record the first cap reached; a budget stop is by design, so the result is not ``degraded``."""
        if self.budget_hit is None:
            self.budget_hit, self.budget_phase = reason, phase

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["usage"] = self.usage.to_dict()
        out["usage_by_phase"] = {phase: u.to_dict() for phase, u in self.usage_by_phase.items()}
        out["store_calls"] = self.store_calls
        out["dropped_probes"] = self.dropped_probes
        out["llm_calls"] = self.usage.llm_calls
        return out


@dataclass
class RetrievalResult:
    """What :meth:`PGR.retrieve` returns: R* ranked, the prospection summary, and the trace."""

    facts: list[FoundFact]
    summary: str
    trace: Trace

    @property
    def ids(self) -> list[str]:
        return [f.id for f in self.facts]

    @property
    def degraded(self) -> bool:
        return self.trace.degraded

    @property
    def usage(self) -> Usage:
        """What the call spent overall (per phase: ``trace.usage_by_phase``)."""
        return self.trace.usage

    def top(self, n: int) -> list[FoundFact]:
        """The first ``n`` facts of R* in its ranking order (neighbours count): what a prompt with room
        for ``n`` facts gets. Under the default ``ranking="shared"`` three in four are the query's own
        best hits (``query_share``) and the rest the step probes' best; see :mod:`pgr_core.policy.ranking`."""
        return self.facts[:n]

    def within_tokens(self, max_tokens: int, *, per_fact: int = 12) -> list[FoundFact]:
        """The head of R* whose texts fit in ``max_tokens`` (about four characters a token, plus
        ``per_fact`` for each record's markup); at least the first fact when there is one."""
        out: list[FoundFact] = []
        used = 0
        for f in self.facts:
            cost = estimate_tokens(f.text) + 1 + per_fact
            if out and used + cost > max_tokens:
                break
            used += cost
            out.append(f)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "facts": [f.to_dict() for f in self.facts],
            "summary": self.summary,
            "trace": self.trace.to_dict(),
        }


@dataclass
class Answer:
    """A prospection-augmented answer (PAG). ``text`` is empty when the LLM failed (``degraded``)."""

    text: str
    facts: list[FoundFact]
    retrieval: RetrievalResult
    degraded: bool = False
    error: str | None = None
