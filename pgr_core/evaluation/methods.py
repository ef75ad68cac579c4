"""The retrieval methods an evaluation compares, all over the same store, scope and LLM.

Each method turns one :class:`~pgr_core.evaluation.data.EvalQuestion` into a ranked list of fact ids
plus its cost. Names (``METHODS``), each also with ``+wN`` for a temporal window of N turns (each
direct hit brings its N neighbours either side, right after it, and they count in every budget):

- ``query-only``: the question's top K = 20 (the PGR paper's baseline).
- ``pgr-none``: PGR's no-LLM default (no prospection) through ``retrieve``: the query's own list, centred.
- ``pgr-feedback``: PGR's LLM-free feedback round (``strategy="feedback"``): the request, then the request
  joined to its first three hits, R* by the sum of the two centred scores; two store calls, no LLM call.
- ``pgr-cot``, ``pgr-tot``: PGR with an LLM chain / tree.
- ``query-fusion``: LlamaIndex's ``QueryFusionRetriever`` (the LLM writes 3 more queries, one retrieval
  per query, reciprocal-rank fusion), over a LlamaIndex retriever that searches the same pgr store.
- ``mem0``: mem0's own ``search`` (top_k 20, its other defaults) on a mem0 ``Memory`` holding the same
  facts: the ``mem0`` baseline the mem0 plugin registers (``pgr_adapters/mem0/evaluation.py``); no
  window (mem0 keeps no turn order).
- ``hyde``: LlamaIndex's ``HyDEQueryTransform`` writes a hypothetical answer; facts are ranked by the
  cosine to the mean of its embedding and the question's (LlamaIndex's own HyDE retrieval). For unit
  vectors that ranking equals the sum of the two cosines, which is what is computed from one store
  call with both texts as probes.

Cost per question: LLM calls, prompt and completion tokens (as the server reported them), and seconds.
With a :class:`~pgr_core.evaluation.cache.CachedLLM`, a cached reply costs what it cost the first time:
seconds = wall time, minus the time spent inside cache lookups, plus the original call's seconds.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgr_core.errors import ConfigurationError, InvalidArgumentError
from pgr_core.evaluation.data import EvalQuestion
from pgr_core.models.llm import LLM, CallFlow, Completion, Request, WrappedLLM
from pgr_core.observability.trace import RetrievalResult
from pgr_core.policy.pgr import PGR
from pgr_core.stores.contract import Store
from pgr_core.types import Hit, Scope, SearchParams

__all__ = ["METHODS", "Method", "MethodOutput", "Meter", "make_method", "parse_method"]

METHODS = ("query-only", "pgr-none", "pgr-feedback", "pgr-cot", "pgr-tot", "query-fusion", "hyde", "mem0")
LLM_METHODS = ("pgr-cot", "pgr-tot", "query-fusion", "hyde")


@dataclass
class MethodOutput:
    ids: list[str]
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    store_calls: int = 0
    degraded: bool = False
    error: str | None = None  # why the result is degraded (None when it is not)
    extra: dict[str, Any] = field(default_factory=dict)


def _reason(result: RetrievalResult) -> str | None:
    """What went wrong in a PGR result: its trace's errors, else its stop reason when degraded."""
    errors = "; ".join(result.trace.errors)
    if errors:
        return errors
    return f"degraded (stop: {result.trace.stop_reason})" if result.degraded else None


class Meter(WrappedLLM):
    """Counts what passes through to ``llm``: calls, tokens, and the seconds each call originally took."""

    def __init__(self, llm: LLM) -> None:
        super().__init__(llm)
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.llm_seconds = 0.0  # as the completions report them (originals, for cache hits)
        self.inside = 0.0  # wall time actually spent inside complete()

    def _count(self, completion: Completion, started: float) -> Completion:
        self.calls += 1
        self.prompt_tokens += completion.usage.prompt_tokens
        self.completion_tokens += completion.usage.completion_tokens
        self.llm_seconds += completion.seconds
        self.inside += time.perf_counter() - started
        return completion

    def _call(self, request: Request) -> CallFlow:
        started = time.perf_counter()
        try:
            completion = yield request
        except Exception:
            spent = time.perf_counter() - started
            self.calls += 1
            self.inside += spent
            self.llm_seconds += spent
            raise
        return self._count(completion, started)


def _metered(method: str, llm: LLM | None) -> Meter:
    """``llm`` behind a :class:`Meter`, for a method that needs one; without one, say how to set it."""
    if llm is None:
        raise ConfigurationError(f"{method} needs an LLM: set PGR_LLM_BASE_URL (and PGR_LLM_MODEL)")
    return Meter(llm)


class Method(ABC):
    name: str
    needs_llm = False

    def __init__(self, store: Store, *, window: int = 0, top_k: int = 20) -> None:
        self.store = store
        self.window = window
        self.top_k = top_k

    @abstractmethod
    def _run(self, q: EvalQuestion, meter: Meter | None) -> MethodOutput: ...

    def run(self, q: EvalQuestion) -> MethodOutput:
        meter = getattr(self, "meter", None)
        if meter is not None:
            meter.reset()
        started = time.perf_counter()
        out = self._run(q, meter)
        wall = time.perf_counter() - started
        if meter is not None:
            out.llm_calls = meter.calls
            out.prompt_tokens = meter.prompt_tokens
            out.completion_tokens = meter.completion_tokens
            wall = wall - meter.inside + meter.llm_seconds
        out.seconds = wall
        return out


class QueryOnly(Method):
    def __init__(self, store: Store, **kw: Any) -> None:
        super().__init__(store, **kw)
        self.pgr = PGR(store, strategy="none", window=self.window)

    def _run(self, q: EvalQuestion, meter: Meter | None) -> MethodOutput:
        result = self.pgr.query_only(q.question, scope=q.scope, date=q.date, top_k=self.top_k)
        return MethodOutput(
            result.ids, store_calls=result.trace.store_calls, degraded=result.degraded, error=_reason(result)
        )


class PGRMethod(Method):
    def __init__(
        self,
        store: Store,
        *,
        strategy: str,
        llm: LLM | None = None,
        overrides: Mapping[str, Any] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(store, **kw)
        if strategy not in ("none", "feedback"):
            self.meter: Meter | None = _metered(f"pgr-{strategy}", llm)
            self.needs_llm = True
            self.pgr = PGR(store, llm=self.meter, strategy=strategy, window=self.window, **dict(overrides or {}))
        else:  # an LLM-free strategy: PGR names its prospector
            self.meter = None
            self.pgr = PGR(store, strategy=strategy, window=self.window, **dict(overrides or {}))

    def _run(self, q: EvalQuestion, meter: Meter | None) -> MethodOutput:
        result = self.pgr.retrieve(q.question, scope=q.scope, date=q.date)
        t = result.trace
        return MethodOutput(
            result.ids,
            store_calls=t.store_calls,
            degraded=result.degraded,
            error=_reason(result),
            extra={
                "rounds": len(t.rounds),
                "stop": t.stop_reason,
                "probes": sum(len(r.probes) for r in t.rounds),
                "ranking": t.ranking,
                "ranking_fallback": t.ranking_fallback,
                "chosen": t.chosen_ids,
                "intent": t.intent,
                "summary": result.summary if self.needs_llm else None,  # PAG answers with it (--win-rate)
                # where each round's steps went and what they found: enough to see which phase fails
                "trace": [
                    {
                        "phase": r.phase,
                        "steps": [[s.id, s.status, s.text] for s in r.steps],
                        "dropped": [[d.reason, d.text] for d in r.dropped],
                        "probes": [[pr.step_id, pr.text, [i for i, _ in pr.hits]] for pr in r.probes],
                        "new": r.new_fact_ids,
                        "prompt": r.prompt_fact_ids,
                        "pruned": r.pruned,
                    }
                    for r in t.rounds
                ],
            },
        )


def _windowed(ranked: Sequence[str], neighbours: Mapping[str, list[str]], limit: int) -> list[str]:
    """The ranked direct hits, each followed by its window neighbours, without repeats, cut at ``limit``."""
    out: list[str] = []
    seen: set[str] = set()
    for fid in ranked:
        for item in (fid, *neighbours.get(fid, ())):
            if item not in seen:
                seen.add(item)
                out.append(item)
    return out[:limit]


def _split(hits: list[Hit], neighbours: dict[str, list[str]]) -> list[Hit]:
    direct = []
    for h in hits:
        if h.neighbour_of is None:
            direct.append(h)
        else:
            neighbours.setdefault(h.neighbour_of, []).append(h.fact.id)
    return direct


class HyDE(Method):
    """Hypothetical document embeddings, with LlamaIndex's generation prompt and mean-embedding ranking."""

    needs_llm = True

    def __init__(self, store: Store, *, llm: LLM | None, depth: int = 200, out_k: int = 35, **kw: Any) -> None:
        super().__init__(store, **kw)
        self.meter = _metered("hyde", llm)
        from pgr_core.evaluation._llamaindex import hyde_transform

        self.transform = hyde_transform(self.meter)
        self.depth = depth
        self.out_k = out_k

    def _run(self, q: EvalQuestion, meter: Meter | None) -> MethodOutput:
        failure: str | None = None
        try:
            bundle = self.transform.run(q.question)
            texts = [t for t in bundle.embedding_strs if t and t.strip()]
        except Exception as exc:  # the LLM failed: HyDE falls back to the question alone
            texts, failure = [q.question], f"{type(exc).__name__}: {exc}"
        if q.question not in texts:
            texts.append(q.question)
        params = SearchParams(top_k=self.depth, min_score=0.0, window=self.window)
        lists = self.store.search_batch(texts, scope=q.scope, params=params)
        neighbours: dict[str, list[str]] = {}
        score_lists: list[tuple[dict[str, float], float]] = []
        for hits in lists:
            direct = _split(hits, neighbours)
            # a fact below one probe's cut-off gets that probe's lowest score seen: an upper bound
            score_lists.append(({h.fact.id: h.score for h in direct}, direct[-1].score if direct else 0.0))
        order = list(dict.fromkeys(fid for scores, _ in score_lists for fid in scores))
        total = {fid: sum(scores.get(fid, floor) for scores, floor in score_lists) for fid in order}
        ranked = sorted(order, key=lambda f: -total[f])
        ids = _windowed(ranked, neighbours, self.out_k) if self.window else ranked[: self.out_k]
        return MethodOutput(
            ids,
            store_calls=1,
            degraded=failure is not None,
            error=failure,
            extra={"hypothetical": texts[0][:300], **({"error": failure} if failure else {})},
        )


class QueryFusion(Method):
    """LlamaIndex ``QueryFusionRetriever`` (4 queries, reciprocal rank fusion) over the same pgr store."""

    needs_llm = True

    def __init__(self, store: Store, *, llm: LLM | None, num_queries: int = 4, out_k: int = 35, **kw: Any) -> None:
        super().__init__(store, **kw)
        self.meter = _metered("query-fusion", llm)
        from pgr_core.evaluation._llamaindex import fusion_retriever

        self.num_queries = num_queries
        self.out_k = out_k
        self._fusion = fusion_retriever

    def _run(self, q: EvalQuestion, meter: Meter | None) -> MethodOutput:
        assert self.meter is not None
        neighbours: dict[str, list[str]] = {}
        retriever, counter = self._fusion(
            self.store,
            self.meter,
            scope=q.scope,
            top_k=self.top_k,
            window=self.window,
            neighbours=neighbours,
            num_queries=self.num_queries,
            out_k=self.out_k,
        )
        try:
            nodes = retriever.retrieve(q.question)
            failure = None
        except Exception as exc:  # the LLM failed: fall back to the question's own hits
            failure = f"{type(exc).__name__}: {exc}"
            hits = self.store.search_batch(
                [q.question], scope=q.scope, params=SearchParams(top_k=self.top_k, min_score=0.0, window=self.window)
            )
            nodes = None
            ranked = [h.fact.id for h in _split(hits[0], neighbours)]
        if nodes is not None:
            ranked = [n.node.node_id for n in nodes]
        ids = _windowed(ranked, neighbours, self.out_k) if self.window else ranked[: self.out_k]
        return MethodOutput(
            ids,
            store_calls=counter["calls"] or 1,
            degraded=failure is not None,
            error=failure,
            extra={"error": failure} if failure else {},
        )


class Mem0Search(Method):
    """mem0's own search over a mem0 Memory holding the data set's facts (built on first use).

    The baseline comes from the plugin registry (the mem0 plugin registers it), so the core never
    imports the adapter."""

    def __init__(self, store: Store, *, facts: Sequence[Any] | None, **kw: Any) -> None:
        super().__init__(store, **kw)
        if self.window:
            raise InvalidArgumentError("mem0 keeps no turn order: the mem0 method takes no +wN window")
        if facts is None:
            raise InvalidArgumentError("the mem0 method needs the data set's facts (make_method(..., facts=...))")
        self.facts = facts
        self.search: Any = None

    def _run(self, q: EvalQuestion, meter: Meter | None) -> MethodOutput:
        if self.search is None:
            from pgr_core.plugins.registry import load

            self.search = load().baseline("mem0", facts=self.facts)
        return MethodOutput(list(self.search(q.question, q.scope, self.top_k)), store_calls=1)


def parse_method(name: str) -> tuple[str, int]:
    """``"pgr-tot+w1"`` -> ``("pgr-tot", 1)``; raises for unknown names."""
    base, _, window = name.partition("+w")
    if base not in METHODS:
        raise InvalidArgumentError(f"unknown method {name!r}; known: {', '.join(METHODS)} (each also with +wN)")
    if window and not window.isdigit():
        raise InvalidArgumentError(f"bad window in {name!r}: write +w1, +w2, ...")
    return base, int(window or 0)


def make_method(
    name: str,
    store: Store,
    *,
    llm: LLM | None = None,
    overrides: Mapping[str, Any] | None = None,
    facts: Sequence[Any] | None = None,
) -> Method:
    base, window = parse_method(name)
    method: Method
    if base == "query-only":
        method = QueryOnly(store, window=window)
    elif base.startswith("pgr-"):
        method = PGRMethod(store, strategy=base[4:], llm=llm, overrides=overrides, window=window)
    elif base == "hyde":
        method = HyDE(store, llm=llm, window=window)
    elif base == "mem0":
        method = Mem0Search(store, facts=facts, window=window)
    else:
        method = QueryFusion(store, llm=llm, window=window)
    method.name = name
    return method


def scope_probe(store: Store, query: str, scope: Scope, k: int) -> list[str]:
    """The question's own deep list (for "query-only at the same size")."""
    hits = store.search_batch([query], scope=scope, params=SearchParams(top_k=k, min_score=0.0))[0]
    return [h.fact.id for h in hits if h.neighbour_of is None]
