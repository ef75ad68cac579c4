"""Adaptive mode: prospection is skipped when the query's own hits already answer a plain factual
question (heuristic: the question's form and its top hit's score; llm: a verdict carried by the
augmentation call), the skip is recorded in the trace, and otherwise nothing changes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import U1, SpyStore, make_store

from pgr_core import PGR, HashingEmbedder, InMemoryStore
from pgr_core.errors import InvalidArgumentError
from pgr_core.policy.prospectors import INTENT_ANSWERED_SCHEMA, INTENT_SCHEMA
from pgr_core.testing import ScriptedLLM, planner_llm

FACTUAL = "When did I hurt my knee?"  # its top hit (s1:0) scores 0.58 with the hashing embedder
LOW = "What did the physio say about running?"  # a factual question whose top hit scores 0.50
ADVICE = "Should I join a soccer league this summer?"


def llm(answered: Any = None) -> ScriptedLLM:
    """Replies at once; the augmentation reply carries ``answered`` when it is not None."""

    def handler(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        props = (schema or {}).get("properties", {})
        if "intent" in props:
            reply: dict[str, Any] = {"intent": "find out when the knee injury happened"}
            if answered is not None:
                reply["answered"] = answered
            return reply
        if "steps" in props:
            return {"steps": [{"action": "physio appointment dates"}, {"action": "basketball games in March"}]}
        return {"summary": "the knee was hurt in March"}

    return ScriptedLLM(handler=handler)


def kinds(scripted: ScriptedLLM) -> list[str]:
    out = []
    for call in scripted.calls:
        props = (call.schema or {}).get("properties", {})
        out.append("augment" if "intent" in props else "steps" if "steps" in props else "summary")
    return out


# ------------------------------------------------------------------ heuristic


def test_heuristic_skips_a_plain_factual_question_with_a_strong_hit() -> None:
    spy = SpyStore(make_store())
    scripted = ScriptedLLM()  # no reply scripted: any LLM call would fail the retrieval
    pgr = PGR(spy, llm=scripted, strategy="cot", adaptive="heuristic")
    result = pgr.retrieve(FACTUAL, scope=U1)
    assert scripted.calls == [] and not result.degraded
    assert result.trace.stop_reason == "adaptive_skip" and len(spy.calls) == 1
    decision = result.trace.adaptive
    assert decision is not None and decision.skipped and decision.mode == "heuristic"
    assert "'when'" in decision.reason and decision.top_score == pytest.approx(0.58, abs=0.01)
    assert result.ids == pgr.query_only(FACTUAL, scope=U1).ids  # the query-only top K, as it is
    assert result.ids[0] == "s1:0" and result.summary.startswith("The request itself recalled")
    assert result.to_dict()["trace"]["adaptive"]["skipped"] is True


@pytest.mark.parametrize(
    ("query", "options", "why"),
    [
        (ADVICE, {}, "not a wh-question"),
        ("What should I bring to the knee appointment?", {}, "'should'"),
        ("When could I plan a basketball game with my knee?", {}, "'could'"),
        (LOW, {}, "0.50"),
        (FACTUAL, {"adaptive_min_score": 0.9}, "< 0.9"),
    ],
)
def test_heuristic_prospects_otherwise_and_says_why(query: str, options: dict[str, Any], why: str) -> None:
    scripted = llm()
    result = PGR(make_store(), llm=scripted, strategy="cot", adaptive="heuristic", **options).retrieve(query, scope=U1)
    decision = result.trace.adaptive
    assert decision is not None and not decision.skipped and why in decision.reason
    assert result.trace.stop_reason != "adaptive_skip" and kinds(scripted)[:2] == ["augment", "steps"]


def test_heuristic_lookup_serves_augmentation_without_an_extra_store_call() -> None:
    def run(adaptive: str) -> tuple[ScriptedLLM, SpyStore, Any]:
        scripted, spy = llm(), SpyStore(make_store())
        result = PGR(spy, llm=scripted, strategy="cot", adaptive=adaptive, augment_min_score=0.3).retrieve(
            LOW, scope=U1
        )
        return scripted, spy, result

    off_llm, off_spy, off = run("off")
    on_llm, on_spy, on = run("heuristic")
    assert len(on_spy.calls) == len(off_spy.calls)  # one lookup serves both the decision and augmentation
    assert on_llm.calls[0].prompt == off_llm.calls[0].prompt  # the same records, cut to (Ko, τo)
    assert on.ids == off.ids and on.trace.adaptive is not None and off.trace.adaptive is None


def test_a_skip_with_a_window_returns_the_windowed_baseline() -> None:
    pgr = PGR(make_store(), strategy="feedback", adaptive="heuristic", window=1, query_only_k=4)
    result = pgr.retrieve(FACTUAL, scope=U1)
    baseline = pgr.query_only(FACTUAL, scope=U1)
    assert result.trace.stop_reason == "adaptive_skip" and result.ids == baseline.ids and len(result.ids) == 4
    assert [f.via for f in result.facts] == [f.via for f in baseline.facts] and "neighbour" in {
        f.via for f in result.facts
    }


def test_the_async_twin_skips_the_same_way() -> None:
    pgr = PGR(make_store(), llm=ScriptedLLM(), strategy="tot", adaptive="heuristic")
    result = asyncio.run(pgr.aretrieve(FACTUAL, scope=U1))
    assert result.trace.stop_reason == "adaptive_skip" and result.ids == pgr.retrieve(FACTUAL, scope=U1).ids


@pytest.mark.parametrize(
    ("question", "plain"),
    [
        ("When did Caroline go to the LGBTQ support group?", True),
        ("and where did she move from?", True),
        ("How many children does Melanie have?", True),
        ("Which city did they visit in May?", True),
        ("Who is Jon's business partner?", True),
        ("What is Melanie's favourite book?", True),
        ("Would Caroline likely pursue writing as a career?", False),
        ("What might John's degree be in?", False),
        ("Can you help me plan a trip to Porto?", False),
        ("What should I cook for my sister?", False),
        ("How do I get to the match?", False),
        ("Did Melanie paint a sunrise?", False),
        ("Recommend a book for my flight", False),
    ],
)
def test_the_question_form_the_heuristic_accepts(question: str, plain: bool) -> None:
    pgr = PGR(make_store(), strategy="feedback", adaptive="heuristic", adaptive_min_score=0.0)
    decision = pgr.retrieve(question, scope=U1).trace.adaptive
    assert decision is not None and decision.skipped is plain


# ------------------------------------------------------------------ llm


def test_llm_mode_skips_when_the_augmentation_call_says_the_records_answer() -> None:
    spy = SpyStore(make_store())
    scripted = llm(answered=True)
    pgr = PGR(spy, llm=scripted, strategy="cot", adaptive="llm", augment_min_score=0.5)
    result = pgr.retrieve(FACTUAL, scope=U1)
    assert kinds(scripted) == ["augment"] and result.trace.usage.llm_calls == 1 and len(spy.calls) == 1
    ask = scripted.calls[0]
    assert ask.schema == INTENT_ANSWERED_SCHEMA and '"answered"' in ask.prompt and "I hurt my knee" in ask.prompt
    assert (
        result.trace.stop_reason == "adaptive_skip" and result.trace.intent == "find out when the knee injury happened"
    )
    decision = result.trace.adaptive
    assert decision is not None and decision.skipped and decision.mode == "llm" and "already answer" in decision.reason
    assert result.ids == pgr.query_only(FACTUAL, scope=U1).ids


@pytest.mark.parametrize(("answered", "why"), [(False, "do not answer"), (None, "no verdict"), ("maybe", "no verdict")])
def test_llm_mode_prospects_when_the_verdict_is_no_or_missing(answered: Any, why: str) -> None:
    scripted = llm(answered=answered)
    result = PGR(make_store(), llm=scripted, strategy="cot", adaptive="llm").retrieve(FACTUAL, scope=U1)
    assert kinds(scripted)[:2] == ["augment", "steps"] and result.trace.stop_reason != "adaptive_skip"
    decision = result.trace.adaptive
    assert decision is not None and not decision.skipped and why in decision.reason


def test_llm_mode_accepts_a_verdict_written_as_a_word() -> None:
    scripted = llm(answered="true")
    result = PGR(make_store(), llm=scripted, strategy="cot", adaptive="llm").retrieve(FACTUAL, scope=U1)
    assert result.trace.stop_reason == "adaptive_skip" and kinds(scripted) == ["augment"]


def test_llm_mode_without_an_augmentation_call_never_skips() -> None:
    result = PGR(make_store(), strategy="none", adaptive="llm").retrieve(FACTUAL, scope=U1)
    decision = result.trace.adaptive
    assert decision is not None and not decision.skipped and "no augmentation call" in decision.reason
    assert result.trace.stop_reason != "adaptive_skip"


def test_off_leaves_the_augmentation_call_as_it_was() -> None:
    scripted = llm()
    result = PGR(make_store(), llm=scripted, strategy="cot").retrieve(FACTUAL, scope=U1)
    ask = scripted.calls[0]
    assert ask.schema == INTENT_SCHEMA and "answered" not in ask.prompt and ask.max_tokens == 160
    assert ask.prompt.rstrip().endswith('Reply with JSON only: {"intent": "<your restatement>"}')
    assert result.trace.adaptive is None and result.trace.rounds[0].phase == "augment"


# ------------------------------------------------------------------ configuration and pgr eval --set


def test_bad_adaptive_options_say_what_to_pass() -> None:
    with pytest.raises(InvalidArgumentError, match="'off', 'heuristic', 'llm'"):
        PGR(make_store(), strategy="feedback", adaptive="sometimes")
    with pytest.raises(InvalidArgumentError, match="adaptive_min_score"):
        PGR(make_store(), strategy="feedback", adaptive_min_score=2)
    with pytest.raises(InvalidArgumentError, match="embedding_cache must be true or false"):
        PGR(make_store(), strategy="feedback", embedding_cache="yes")


def test_pgr_eval_switches_each_saving_with_set(tmp_path: Path) -> None:
    from pgr_core.cli.main import main

    line = {
        "user_id": "u1",
        "facts": [
            {"id": "knee", "text": "I hurt my knee playing basketball in March"},
            {"id": "bus", "text": "I sold my car and ride the bus now"},
        ],
        "queries": [
            {"query": FACTUAL, "references": [{"text": "knee", "fact_ids": ["knee"]}]},
            {"query": ADVICE, "references": [{"text": "knee", "fact_ids": ["knee"]}]},
        ],
    }
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(line) + "\n", encoding="utf-8")
    out = tmp_path / "r.json"
    sets = ['adaptive="heuristic"', "embedding_cache=false", "phase1_reuse=true", "adaptive_min_score=0.5"]
    argv = ["eval", "jsonl", "--data", str(data), "--methods", "pgr-feedback", "--json", str(out)]
    argv += ["--embedder", "hashing", "--no-llm", *(x for s in sets for x in ("--set", s))]
    assert main(argv) == 0
    records = [json.loads(x) for x in out.with_suffix(".records.jsonl").read_text().splitlines()]
    stops = {r["question"]: r["extra"]["stop"] for r in records if r.get("method") == "pgr-feedback"}
    assert stops["u1:q0"] == "adaptive_skip" and stops["u1:q1"] != "adaptive_skip"
    assert records[0]["header"]["overrides"]["adaptive"] == "heuristic"


def test_an_embedded_store_without_a_cache_still_runs_every_saving() -> None:
    store = InMemoryStore(embedder=HashingEmbedder(), embedding_cache=0)
    store.add_facts(make_store().facts)
    assert isinstance(store.embedder, HashingEmbedder)
    llm = planner_llm(["physio appointment dates", "the league's fixtures"])  # phase 1 is worth keeping
    pgr = PGR(store, llm=llm, adaptive="heuristic", phase1_reuse=True)
    assert pgr.retrieve(FACTUAL, scope=U1).trace.stop_reason == "adaptive_skip"
    first = pgr.retrieve(ADVICE, scope=U1)
    assert pgr.retrieve(ADVICE, scope=U1).trace.reused_phase1_from == ADVICE and first.facts
