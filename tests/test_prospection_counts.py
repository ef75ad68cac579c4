"""Prospection that counts: what the steps find reaches the next round's prompt, the top of R* and the
answer, at default settings; each ranking strategy pinned by a hand-computed case."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import pytest

from pgr_core import PGR, Fact, FoundFact, HashingEmbedder, InMemoryStore, Probe, Scope
from pgr_core.policy.centring import centred
from pgr_core.policy.ranking import choose, fused_order, llm_order, shared_order
from pgr_core.testing import ScriptedLLM
from pgr_core.types import SearchParams

U = Scope(user_id="u1")
QUERY = "Should I join a soccer league this summer?"
# 25 facts that look like the query, and three that matter and share no word with it
NEAR = [f"soccer league number {i} plays this summer in the park" for i in range(25)]
FAR = {
    "knee": "the surgeon fixed my torn ligament in March",
    "bus": "sold the hatchback, commuting by tram now",
    "class": "pottery lessons every Tuesday and Thursday evening",
}
STEPS = ["ligament surgeon", "tram hatchback commuting", "pottery lessons evening"]


def far_store() -> InMemoryStore:
    store = InMemoryStore(embedder=HashingEmbedder())
    facts = [Fact(id=f"near{i}", text=t, scope=U, date=datetime(2025, 4, 1)) for i, t in enumerate(NEAR)]
    facts += [Fact(id=k, text=t, scope=U, date=datetime(2025, 3, 2)) for k, t in FAR.items()]
    store.add_facts(facts)
    return store


def scripted(summary_ids: list[str] | None = None) -> ScriptedLLM:
    def handler(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        required = (schema or {}).get("required", [])
        if "intent" in required:
            return {"intent": "decide whether to join a soccer league"}
        if "nodes" in required:
            return {"nodes": [{"id": f"n{i}", "parent": None, "action": s} for i, s in enumerate(STEPS)]}
        if "summary" in required:
            return {"summary": "The knee surgery matters.", **({"ids": summary_ids} if summary_ids else {})}
        return "Wait for the knee."

    return ScriptedLLM(handler=handler)


def test_a_step_found_fact_reaches_the_revise_prompt_top_20_and_the_answer_prompt() -> None:
    store = far_store()
    llm = scripted()
    pgr = PGR(store, llm=llm, strategy="tot", min_score=0.1)  # τ lowered: the hashing embedder scores low
    baseline = pgr.query_only(QUERY, scope=U)
    assert not set(FAR) & set(baseline.ids)  # the query alone never finds them in its top 20
    answer = pgr.answer(QUERY, scope=U)
    result = answer.retrieval
    top = [f.id for f in result.top(20)]
    assert set(FAR) <= set(top)  # each step's best hit competes for the budget, and wins a slot
    revise = [c for c in llm.calls if "revising a plan" in c.prompt]
    assert revise and all(FAR[k] in revise[0].prompt for k in FAR)
    personalized = next(r for r in result.trace.rounds if r.phase == "personalized")
    # centred, the query's own list reaches the tram fact (25 look-alikes are typical, it is not);
    # the steps find the other two, and the last round's step finds come first in the revise prompt
    by_steps = {f.id for f in result.facts if f.id in FAR and f.step_id is not None}
    assert by_steps == {"knee", "class"}
    assert by_steps <= set(personalized.prompt_fact_ids[:2])
    assert set(FAR) <= set(personalized.prompt_fact_ids)
    assert all(FAR[k] in llm.calls[-1].prompt for k in FAR)  # the answer prompt holds them
    assert set(FAR) <= set(result.trace.answer_fact_ids)


def test_revise_prompt_lists_delta_first_with_age_and_finding_step() -> None:
    llm = scripted()
    # uncentred, so that the steps alone find the three (centred, the query's list finds the tram fact)
    PGR(far_store(), llm=llm, strategy="tot", min_score=0.1, centring=None).retrieve(QUERY, scope=U, date="2025-05-01")
    prompt = next(c.prompt for c in llm.calls if "revising a plan" in c.prompt)
    records = re.findall(r'<record id="(r\d+)" step="([\w.-]+)" noted="([^"]+)">"([^"]*)"</record>', prompt)
    first = {text: (step, noted) for _, step, noted, text in records[:3]}
    assert set(first) == set(FAR.values())
    assert {step for step, _ in first.values()} == {"s1", "s2", "s3"}  # the plan's labels in the prompt
    assert {noted for _, noted in first.values()} == {"2 months before"}  # 2 March → 1 May: 60 days
    assert any(step == "request" for _, step, _, _ in records)  # the query's hits follow


def test_revision_keeps_rewrites_prunes_and_adds_with_tree_ids_kept() -> None:
    replies = [
        {"intent": "join a soccer league"},
        {
            "nodes": [
                {"id": "n1", "parent": None, "action": "ligament surgeon", "dimension": "health"},
                {"id": "n2", "parent": "n1", "action": "tram hatchback commuting"},
                {"id": "n3", "parent": None, "action": "pottery lessons evening"},
            ]
        },
        {  # keep r1.1, rewrite r1.2 (its parent kept), prune r1.3, add one under r1.1
            "nodes": [
                {"id": "r1.1", "parent": None, "action": "ligament surgeon"},
                {"id": "r1.2", "action": "ask the surgeon about running"},
                {"id": "new", "parent": "r1.1", "action": "physio exercises for the ligament"},
            ]
        },
        {"nodes": [{"id": "r1.1", "parent": None, "action": "ligament surgeon"}]},
        {"summary": "s"},
    ]
    llm = ScriptedLLM(replies)
    result = PGR(far_store(), llm=llm, strategy="tot", min_score=0.1, delta=0, max_rounds=2).retrieve(QUERY, scope=U)
    rnd = result.trace.rounds[2]
    assert rnd.phase == "personalized"
    by_id = {s.id: s for s in rnd.steps}
    assert [s.id for s in rnd.steps] == ["r1.1", "r1.2", "r2.1"]
    assert by_id["r1.1"].status == "kept" and by_id["r1.2"].status == "rewritten" and by_id["r2.1"].status == "added"
    assert by_id["r1.2"].text == "ask the surgeon about running" and by_id["r1.2"].parent == "r1.1"
    assert by_id["r2.1"].parent == "r1.1" and {"r1.2", "r2.1"} <= set(by_id["r1.1"].children)
    assert rnd.kept == ["r1.1"] and rnd.pruned == ["r1.3"]
    assert [p.step_id for p in rnd.probes] == ["r1.2", "r2.1"]  # a kept step is not probed again
    # the next round's prompt shows the plan as revised, with its ids
    third = [c.prompt for c in llm.calls if "revising a plan" in c.prompt][1]
    assert "id s2 (under s1)" in third and "pottery" not in third.split("What the memory")[0]


def test_a_reply_naming_no_step_of_the_plan_only_adds() -> None:
    replies: list[Any] = [
        {"intent": "join a soccer league"},
        {"steps": [{"action": "ligament surgeon"}, {"action": "tram hatchback commuting"}]},
        {"steps": [{"id": "new", "action": "pottery lessons evening"}]},
        {"steps": []},
        {"summary": "s"},
    ]
    result = PGR(far_store(), llm=ScriptedLLM(replies), strategy="cot", min_score=0.1, delta=1).retrieve(QUERY, scope=U)
    rnd = result.trace.rounds[2]
    assert rnd.pruned == [] and rnd.kept == ["r1.1", "r1.2"]
    added = [s for s in rnd.steps if s.status == "added"]
    assert [s.text for s in added] == ["pottery lessons evening"] and added[0].parent == "r1.2"  # the chain goes on


def _found(fid: str, *, via: str = "hit", anchor: str | None = None, rank_score: float = 0.0) -> FoundFact:
    fact = Fact(id=fid, text=fid, scope=U)
    beside = [anchor] if anchor else []
    return FoundFact(fact, 0.5, rank_score, 1, "p", via=via, beside=beside)  # type: ignore[arg-type]


def _probe(source: str, ids: list[str]) -> Probe:
    return Probe(text=source, source=source, hits=[(i, 0.5) for i in ids])  # type: ignore[arg-type]


def test_shared_order_by_hand() -> None:
    # query: q1 q2 q3 q4; step A: a1 x a2; step B: b1 x; x is hit by two step probes
    ids = ["q1", "q2", "q3", "q4", "a1", "a2", "b1", "x"]
    found = {i: _found(i) for i in ids}
    probes = [_probe("query", ["q1", "q2", "q3", "q4"]), _probe("step", ["a1", "x", "a2"]), _probe("step", ["b1", "x"])]
    order = [f.id for f in shared_order(found, probes, 0.5)]
    # slots alternate query, steps; the steps' list: x (two probes), then rank 0 of A, of B, rank 2 of A
    assert order == ["q1", "x", "q2", "a1", "q3", "b1", "q4", "a2"]
    assert [f.id for f in shared_order(found, probes, 1.0)][:4] == ["q1", "q2", "q3", "q4"]
    assert [f.id for f in shared_order(found, probes, 0.0)][:4] == ["x", "a1", "b1", "a2"]


def test_shared_order_a_fact_both_lists_hold_takes_the_first_slot() -> None:
    found = {i: _found(i) for i in ["q1", "q2", "a1"]}
    probes = [_probe("query", ["q1", "q2"]), _probe("step", ["q1", "a1"])]
    order = [f.id for f in shared_order(found, probes, 0.5)]
    assert order == ["q1", "a1", "q2"]  # q1 placed once, by the query's slot; the steps' turn takes a1


def test_fused_order_by_hand() -> None:
    found = {"a": _found("a", rank_score=0.01), "b": _found("b", rank_score=0.03), "c": _found("c", rank_score=0.02)}
    assert [f.id for f in fused_order(found)] == ["b", "c", "a"]


def test_llm_order_puts_the_chosen_first_then_the_shared_order() -> None:
    found = {i: _found(i) for i in ["q1", "q2", "a1"]}
    probes = [_probe("query", ["q1", "q2"]), _probe("step", ["a1"])]
    assert [f.id for f in llm_order(found, probes, 0.5, ["q2", "a1"])] == ["q2", "a1", "q1"]


def test_llm_order_a_chosen_fact_brings_its_window_neighbours() -> None:
    found = {i: _found(i) for i in ["q1", "q2", "a1"]}
    found["n"] = _found("n", via="neighbour", anchor="q2")
    query = Probe(text="q", source="query", hits=[("q1", 0.9), ("q2", 0.8)], neighbours=["n"], order=["q1", "q2", "n"])
    probes = [query, _probe("step", ["a1"])]
    assert [f.id for f in shared_order(found, probes, 0.5)] == ["q1", "a1", "q2", "n"]  # n at its earned rank
    assert [f.id for f in llm_order(found, probes, 0.5, ["q2", "a1"])] == ["q2", "n", "a1", "q1"]


@pytest.mark.parametrize(
    ("reply", "fallback"),
    [
        (["r1", "r2", "r3", "r4"], "echo"),  # the given order, echoed
        ([1, 2, 3], "echo"),
        (["r2", "r40"], "out of range"),
        (["r3"], "too few"),
        ("r3, r2", "no ids"),
        ([], "no ids"),
        (["zzz", "r1", "r2"], "unknown id"),
    ],
)
def test_a_non_choice_is_detected(reply: Any, fallback: str) -> None:
    choice = choose(reply, [f"f{i}" for i in range(12)])
    assert choice.chosen == [] and choice.fallback is not None and fallback in choice.fallback


def test_llm_ranking_uses_a_real_choice_and_counts_a_non_choice_in_the_trace() -> None:
    store = far_store()
    pick = PGR(store, llm=scripted(), strategy="tot", min_score=0.1, ranking="llm")
    plain = pick.retrieve(QUERY, scope=U)
    shown = plain.trace.summary_fact_ids
    assert plain.trace.ranking_fallback is not None and "no ids" in plain.trace.ranking_fallback
    assert plain.ids == PGR(store, llm=scripted(), strategy="tot", min_score=0.1).retrieve(QUERY, scope=U).ids
    # a real choice: the third, first and fifth records of the summary prompt, in that order
    chosen = PGR(store, llm=scripted(["r3", "r1", "r5"]), strategy="tot", min_score=0.1, ranking="llm")
    result = chosen.retrieve(QUERY, scope=U)
    assert result.trace.ranking_fallback is None
    assert result.ids[:3] == [shown[2], shown[0], shown[4]] == result.trace.chosen_ids
    echoed = PGR(store, llm=scripted(["r1", "r2", "r3"]), strategy="tot", min_score=0.1, ranking="llm")
    assert "echo" in (echoed.retrieve(QUERY, scope=U).trace.ranking_fallback or "")


def test_without_an_llm_the_default_is_the_feedback_round() -> None:
    store = far_store()
    pgr = PGR(store)
    assert pgr.prospector.name == "feedback"
    result = pgr.retrieve(QUERY, scope=U)
    assert result.trace.usage.llm_calls == 0 and result.trace.store_calls == 2 and result.trace.ranking == "summed"


def test_strategy_none_is_the_query_only_list_centred() -> None:
    store = far_store()
    pgr = PGR(store, strategy="none")
    deep = store.search_batch([QUERY], scope=U, params=SearchParams(top_k=100, min_score=0.0))[0]
    typical = pgr.centre.typicality(U, [h.fact for h in deep])  # type: ignore[union-attr]
    by_hand = [h.fact.id for h in centred(deep, typical, 1.0, 20, 0.0)]
    for window in (0, 1):
        result = PGR(store, strategy="none", window=window).retrieve(QUERY, scope=U)
        assert [f.id for f in result.facts if f.via == "hit"] == by_hand
        assert result.trace.usage.llm_calls == 0 and result.trace.store_calls == 1
        plain = PGR(store, strategy="none", window=window, centring=None).retrieve(QUERY, scope=U)
        assert plain.ids == PGR(store, window=window).query_only(QUERY, scope=U).ids


def test_the_answer_context_is_cut_to_its_token_budget() -> None:
    store = far_store()
    llm = scripted()
    answer = PGR(store, llm=llm, strategy="tot", min_score=0.1, answer_context_tokens=60).answer(QUERY, scope=U)
    held = answer.retrieval.trace.answer_fact_ids
    assert 1 <= len(held) < len(answer.retrieval.facts)
    assert held == answer.retrieval.ids[: len(held)]  # R*'s head, in order
    assert llm.calls[-1].prompt.count("<record ") == len(held)


def test_within_tokens_is_the_ranked_head_that_fits() -> None:
    result = PGR(far_store(), llm=scripted(), strategy="tot", min_score=0.1).retrieve(QUERY, scope=U)
    cost = [len(f.text) // 4 + 1 + 12 for f in result.facts]
    budget = sum(cost[:5]) + 1  # room for five records, not six
    assert [f.id for f in result.within_tokens(budget)] == result.ids[:5]
    assert [f.id for f in result.within_tokens(1)] == result.ids[:1]  # at least one


def test_guideline_induction_pgr_retrieval_gets_the_budgeted_head_of_r_star() -> None:
    from pgr_core.write.examples import TrainingExample
    from pgr_core.write.induction import InductionConfig, retrieve_for

    store = far_store()
    example = TrainingExample(id="e1", sessions=(), question=QUERY, answer="wait")
    facts = retrieve_for(store, U, example, scripted(), InductionConfig(retrieval="pgr", context_tokens=400))
    assert set(FAR) <= {f.id for f in facts}  # step finds are in the answerer's context
    baseline = retrieve_for(store, U, example, scripted(), InductionConfig(retrieval="query-only", context_tokens=400))
    assert not set(FAR) & {f.id for f in baseline} and abs(len(baseline) - len(facts)) <= 2  # same context size


def test_revision_reads_the_prompts_labels_and_repeated_words_as_the_plans_steps() -> None:
    replies: list[Any] = [
        {"intent": "join a soccer league"},
        {"steps": [{"action": "ligament surgeon"}, {"action": "tram hatchback commuting"}]},
        # the prompt's label for the second step, and the first step's words under a garbled id
        {"steps": [{"id": "r1", "action": "ligament surgeon"}, {"id": "s2", "action": "pottery lessons evening"}]},
        {"steps": []},
        {"summary": "s"},
    ]
    llm = ScriptedLLM(replies)
    result = PGR(far_store(), llm=llm, strategy="cot", min_score=0.1, delta=1).retrieve(QUERY, scope=U)
    rnd = result.trace.rounds[2]
    assert [(s.id, s.status) for s in rnd.steps] == [("r1.1", "kept"), ("r1.2", "rewritten")]
    assert [p.step_id for p in rnd.probes] == ["r1.2"] and not rnd.dropped
    assert "- id s1: " in llm.calls[2].prompt and 'step="s2"' in llm.calls[2].prompt


def test_phase_1_sees_the_records_augmentation_saw_and_none_is_said_when_there_are_none() -> None:
    store = far_store()
    llm = scripted()
    PGR(store, llm=llm, strategy="tot", augment_min_score=0.1).retrieve(QUERY, scope=U, date="2025-05-01")
    augment, initial = llm.calls[0].prompt, llm.calls[1].prompt
    shown = re.findall(r'<record[^>]*>"([^"]*)"</record>', augment)
    assert shown and all(text in initial for text in shown)  # the same records, no extra store call
    assert "Let the steps fit this person" in initial
    llm = scripted()
    PGR(store, llm=llm, strategy="tot", augment_min_score=0.99).retrieve(QUERY, scope=U, date="2025-05-01")
    assert "(none found)" in llm.calls[1].prompt and "<record" not in llm.calls[1].prompt


def test_the_augmentation_floor_defaults_to_tau() -> None:
    from pgr_core.policy.config import PGRConfig

    config = PGRConfig()
    assert config.augment_min_score == config.min_score == 0.3


def test_the_query_share_takes_each_fact_at_its_best_score_over_the_request_and_its_restatement() -> None:
    found = {i: _found(i) for i in ("a", "b", "c", "d", "s")}
    request = Probe(QUERY, "query", hits=[("a", 0.50), ("b", 0.30), ("c", 0.10)])
    restated = Probe("decide on a league given the knee", "intent", hits=[("d", 0.45), ("c", 0.40)])
    step = Probe("knee", "step", step_id="s1", hits=[("s", 0.9)])
    # by score over both lists: a 0.50, d 0.45, c 0.40 (its better score), b 0.30; the step's s fills
    # the steps' share (every 4th slot at 0.75)
    assert [f.id for f in shared_order(found, [request, restated, step], 0.75)] == ["a", "d", "c", "s", "b"]
    # the request alone keeps its own order
    assert [f.id for f in shared_order(found, [request, step], 0.75)][:3] == ["a", "b", "c"]


def test_phase_1_probes_the_restatement_and_what_only_it_finds_reaches_top_20() -> None:
    restated = "decide by the Friday sign-up deadline"

    def handler(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        if "intent" in (schema or {}).get("required", []):
            return {"intent": restated}
        return scripted().handler(messages, schema)  # type: ignore[union-attr]

    store = far_store()
    store.add_facts([Fact(id="deadline", text="the sign-up deadline is Friday", scope=U)])
    # uncentred, so that only q_A can bring the deadline into the query's share (centring alone might)
    result = PGR(store, llm=ScriptedLLM(handler=handler), strategy="tot", min_score=0.1, centring=None).retrieve(
        QUERY, scope=U
    )
    initial = next(r for r in result.trace.rounds if r.phase == "initial")
    assert [(p.source, p.text) for p in initial.probes[:2]] == [("query", QUERY), ("intent", restated)]
    assert "deadline" in {f.id for f in result.top(20)}

    def echoed(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        if "intent" in (schema or {}).get("required", []):
            return {"intent": QUERY}
        return scripted().handler(messages, schema)  # type: ignore[union-attr]

    # the same run with a restatement that only echoes the request: q_A is not probed, nor found the deadline
    alone = PGR(store, llm=ScriptedLLM(handler=echoed), strategy="tot", min_score=0.1, centring=None).retrieve(
        QUERY, scope=U
    )
    assert all(p.source != "intent" for r in alone.trace.rounds for p in r.probes)
    assert "deadline" not in {f.id for f in alone.top(20)}


def test_a_restatement_that_only_echoes_the_request_is_not_probed_twice() -> None:
    def echo(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        required = (schema or {}).get("required", [])
        if "intent" in required:
            return {"intent": "  should I join a SOCCER league this summer?"}
        return scripted().handler(messages, schema)  # type: ignore[union-attr]

    result = PGR(far_store(), llm=ScriptedLLM(handler=echo), strategy="tot", min_score=0.1).retrieve(QUERY, scope=U)
    assert all(p.source != "intent" for r in result.trace.rounds for p in r.probes)
