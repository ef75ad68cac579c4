"""The LLM-free feedback round (strategy="feedback"): the request, then the request joined to its first
hits; R* by the sum of each fact's two scores. A fact that sits beside what the request found (the knee
beside the physio visit) comes up although the request alone ranks it below look-alikes; every probe
carries the caller's scope; a failed second call leaves the request's own list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from pgr_core import PGR, Fact, FeedbackProspector, InMemoryStore, Scope
from pgr_core.errors import InvalidArgumentError, StoreError
from pgr_core.evaluation.methods import METHODS, make_method
from pgr_core.stores.contract import Store
from pgr_core.types import Hit, SearchParams

ALICE, BOB = Scope(user_id="alice"), Scope(user_id="bob")
QUERY = "should I join a soccer league"
VECTORS: dict[str, tuple[float, ...]] = {
    QUERY: (1.0, 0.0, 0.0, 0.0),
    "physio visit on Tuesday": (0.7, 0.7, 0.0, 0.0),  # near the request and near the knee
    "knee surgery in March": (0.4, 0.917, 0.0, 0.0),  # the request alone ranks it below the look-alikes
    **{f"watched a match {i}": (0.45, 0.0, 0.0, 0.893) for i in range(3)},  # look-alikes of the request
}


class Pieces:
    """A text's vector: the sum of the vectors of the known texts it holds (the feedback probe holds the
    request and the facts it found), normalised; an unknown text is the request's direction."""

    name = "pieces"
    dim = 4

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows = []
        for text in texts:
            parts = [np.asarray(v) for k, v in VECTORS.items() if k in text]
            rows.append(np.sum(parts, axis=0) if parts else np.asarray(VECTORS[QUERY]))
        out = np.asarray(rows, dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def _store() -> InMemoryStore:
    store = InMemoryStore(embedder=Pieces())
    texts = [t for t in VECTORS if t != QUERY]
    store.add_facts([Fact(id=f"a{i}", text=t, scope=ALICE) for i, t in enumerate(texts)])
    # Bob holds the same knee fact: it must never reach Alice's list or probe
    store.add_facts([Fact(id="bob-knee", text="knee surgery in March", scope=BOB)])
    return store


class Spy(Store):
    def __init__(self, inner: Store, fail_on: int | None = None) -> None:
        self.inner = inner
        self.embedder = inner.embedder  # type: ignore[attr-defined]
        self.calls: list[tuple[list[str], Scope, SearchParams]] = []
        self.fail_on = fail_on

    # searches and lists (facts_for) only
    capabilities = replace(
        InMemoryStore.capabilities, writable=False, window=False, vectors=False, by_id=False, deletes=False
    )

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        self.calls.append((list(probes), scope, params))
        if self.fail_on == len(self.calls):
            raise StoreError("the store went away")
        return self.inner.search_batch(probes, scope=scope, params=params)

    def facts_for(self, scope: Scope) -> list[Fact]:
        return self.inner.facts_for(scope)


def test_the_fact_beside_what_the_request_found_comes_up() -> None:
    store = _store()
    plain = PGR(store).query_only(QUERY, scope=ALICE, top_k=2)
    assert [f.text for f in plain.facts] == ["physio visit on Tuesday", "watched a match 0"]
    result = PGR(store, strategy=FeedbackProspector(facts=1), centring=None).retrieve(QUERY, scope=ALICE)
    assert [f.text for f in result.top(2)] == ["physio visit on Tuesday", "knee surgery in March"]
    assert result.trace.ranking == "summed"
    assert [r.phase for r in result.trace.rounds] == ["initial", "personalized"]
    step = result.trace.rounds[1].steps[0]
    assert step.probe == f"{QUERY} physio visit on Tuesday" and step.dimension == "feedback"
    assert result.trace.usage.llm_calls == 0 and result.trace.store_calls == 2
    assert "bob-knee" not in result.ids


def test_centred_by_default_and_named_by_strategy() -> None:
    result = PGR(_store(), strategy="feedback").retrieve(QUERY, scope=ALICE)
    assert result.trace.centring == 1.0
    assert "knee surgery in March" in [f.text for f in result.top(2)]
    step = result.trace.rounds[1].steps[0]
    assert step.probe is not None and step.probe.startswith(QUERY)
    assert step.probe.count("watched a match") + step.probe.count("physio") + step.probe.count("knee") == 3


def test_every_probe_carries_the_callers_scope_and_reads_deep() -> None:
    spy = Spy(_store())
    PGR(spy, strategy=FeedbackProspector(facts=2), centring=None).retrieve(QUERY, scope=ALICE)
    assert [scope for _, scope, _ in spy.calls] == [ALICE, ALICE]
    assert [len(probes) for probes, _, _ in spy.calls] == [1, 1]
    assert all(params.top_k >= 100 and params.min_score == 0.0 for _, _, params in spy.calls)
    assert "bob" not in str(spy.calls[1][0])


def test_a_failed_second_call_leaves_the_requests_own_list() -> None:
    spy = Spy(_store(), fail_on=2)
    result = PGR(spy, strategy=FeedbackProspector(facts=1), centring=None).retrieve(QUERY, scope=ALICE)
    assert result.degraded and result.trace.stop_reason == "store_error"
    plain = PGR(_store()).query_only(QUERY, scope=ALICE, top_k=5)
    assert result.ids[:5] == plain.ids


def test_an_empty_memory_asks_once_and_returns_nothing() -> None:
    spy = Spy(_store())
    result = PGR(spy, strategy="feedback").retrieve(QUERY, scope=Scope(user_id="nobody"))
    assert result.ids == [] and len(spy.calls) == 1 and not result.degraded


def test_a_users_own_grounded_prospector_gets_the_same_round() -> None:
    """The round belongs to any prospector that says it is ``grounded``, not to one class: a step built
    from the request's hits is probed, and R* is summed over both probes."""
    from pgr_core.observability.trace import Step
    from pgr_core.policy.prospectors import NoProspection, Prospection

    class Second(NoProspection):
        name = "second"
        grounded = True

        def __init__(self) -> None:
            self.seen: list[str] = []

        def grounded_step(self, p: Prospection, hits: Sequence[Hit]) -> Step | None:
            self.seen.extend(h.fact.text for h in hits)
            return Step(id="r1.1", text="the knee", dimension="mine", round=p.round, probe="knee surgery in March")

    spy = Spy(_store())
    second = Second()
    result = PGR(spy, strategy=second, centring=None).retrieve(QUERY, scope=ALICE)
    assert second.seen[0] == "physio visit on Tuesday" and "knee surgery in March" in second.seen
    assert [probes for probes, _, _ in spy.calls] == [[QUERY], ["knee surgery in March"]]
    assert [scope for _, scope, _ in spy.calls] == [ALICE, ALICE]
    assert result.trace.ranking == "summed" and result.trace.usage.llm_calls == 0
    assert "knee surgery in March" in [f.text for f in result.top(2)]
    # a prospector that is not grounded is never asked for a grounded step
    assert NoProspection().grounded is False
    assert PGR(_store(), strategy="none", centring=None).retrieve(QUERY, scope=ALICE).trace.ranking != "summed"


def test_bad_fact_count_is_named() -> None:
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InvalidArgumentError, match="facts"):
            FeedbackProspector(facts=bad)  # type: ignore[arg-type]


def test_eval_method_runs_with_no_llm() -> None:
    from pgr_core.evaluation.data import EvalQuestion

    assert "pgr-feedback" in METHODS
    method = make_method("pgr-feedback", _store())
    out = method.run(EvalQuestion(id="q", question=QUERY, scope=ALICE, gold=["a1"]))
    assert out.llm_calls == 0 and out.store_calls == 2 and not out.degraded
    assert "a1" in out.ids[:20]


def test_a_long_fact_is_cut_in_the_probe_and_the_request_stays_first() -> None:
    store = InMemoryStore(embedder=Pieces())
    long = "physio visit on Tuesday " + "and more notes " * 200
    store.add_facts([Fact(id="long", text=long, scope=ALICE)])
    result = PGR(store, strategy="feedback").retrieve(QUERY, scope=ALICE)
    probe = result.trace.rounds[1].steps[0].probe
    assert probe is not None and probe.startswith(QUERY + " physio visit on Tuesday")
    assert len(probe) == len(QUERY) + 1 + 500
