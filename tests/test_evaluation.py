"""The evaluation harness: each metric on hand-made cases with known answers, the reply cache, the
loaders, the resumable runner and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import U1, make_store

from pgr_core import Fact, HashingEmbedder, InMemoryStore, LLMTimeoutError, Scope
from pgr_core.errors import InvalidArgumentError, LLMError
from pgr_core.evaluation import (
    CachedLLM,
    EvalQuestion,
    EvalSet,
    judged_recall,
    load_jsonl,
    load_prefeval,
    make_method,
    markdown,
    parse_method,
    recall,
    recall_at,
    recall_exact,
    request_key,
    run_eval,
    summarise,
    win_rate,
    write_report,
)
from pgr_core.evaluation.methods import Meter
from pgr_core.models.llm import Completion, Usage
from pgr_core.testing import ScriptedLLM

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"

# ------------------------------------------------------------------ exact metrics


def test_recall_counts_gold_found_and_missing_as_misses() -> None:
    assert recall(["a", "x", "b"], ["a", "b", "c"]) == pytest.approx(2 / 3)
    assert recall(["a"], ["a"], missing=1) == 0.5  # an unresolvable gold id is a miss
    assert recall(["a", "a", "a"], ["a", "b"]) == 0.5  # repeats do not count twice
    assert recall([], ["a"]) == 0.0
    assert recall(["b"], [["a", "b"]]) == 1.0  # a group: found when any member is
    assert recall(["z"], [["a", "b"]]) == 0.0
    assert recall(["b", "c"], [["a", "b"], "c", "d"]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="no gold"):
        recall(["a"], [])


def test_recall_exact_is_all_or_nothing() -> None:
    assert recall_exact(["b", "a", "z"], ["a", "b"]) == 1.0
    assert recall_exact(["a"], ["a", "b"]) == 0.0
    assert recall_exact(["a", "b"], ["a", "b"], missing=1) == 0.0  # a missing gold can never be found


def test_recall_at_cuts_the_list_before_scoring() -> None:
    found = ["x", "a", "y", "b"]
    assert recall_at(found, ["a", "b"], 1) == 0.0
    assert recall_at(found, ["a", "b"], 2) == 0.5
    assert recall_at(found, ["a", "b"], 4) == 1.0
    assert recall_at(found, ["a", "b"], 100) == 1.0
    with pytest.raises(ValueError):
        recall_at(found, ["a"], 0)


# ------------------------------------------------------------------ LLM-judged metrics


def test_judged_recall_reads_one_verdict_per_reference() -> None:
    judge = ScriptedLLM([{"found": [True, False, True]}])
    verdict = judged_recall(judge, "q?", ["knee injury", "no car", "busy evenings"], ["I hurt my knee", "evenings"])
    assert verdict.found == [True, False, True]
    assert verdict.recall == pytest.approx(2 / 3)
    assert verdict.exact == 0.0
    prompt = judge.calls[0].prompt
    assert "1. knee injury" in prompt and "2. no car" in prompt and "I hurt my knee" in prompt


def test_judged_recall_retries_a_wrong_length_then_fails_softly() -> None:
    ok = judged_recall(ScriptedLLM([{"found": [True]}, {"found": [True, True]}]), "q", ["a", "b"], ["x"])
    assert ok.found == [True, True] and ok.calls == 2 and ok.recall == 1.0 and ok.exact == 1.0
    bad = judged_recall(ScriptedLLM(["not json", LLMTimeoutError("slow")]), "q", ["a", "b"], ["x"])
    assert bad.recall is None and bad.exact is None  # a failed judgement is not a zero
    assert bad.error is not None and "LLMTimeoutError" in bad.error


def test_win_rate_swaps_the_order_and_counts_ties_half() -> None:
    # first answer shown as A wins, then shown as B wins: a clean win
    assert win_rate(ScriptedLLM([{"winner": "A"}, {"winner": "B"}]), "q", "mine", "theirs").score == 1.0
    # the judge prefers whatever is shown first: a split verdict is worth half
    assert win_rate(ScriptedLLM([{"winner": "A"}, {"winner": "A"}]), "q", "mine", "theirs").score == 0.5
    assert win_rate(ScriptedLLM([{"winner": "tie"}, {"winner": "B"}]), "q", "mine", "theirs").score == 0.75
    assert win_rate(ScriptedLLM([{"winner": "B"}, {"winner": "A"}]), "q", "mine", "theirs").score == 0.0
    judge = ScriptedLLM([{"winner": "A"}, {"winner": "B"}])
    win_rate(judge, "q", "mine", "theirs")
    first, second = (c.prompt for c in judge.calls)
    assert first.index("mine") < first.index("theirs") and second.index("theirs") < second.index("mine")
    failed = win_rate(ScriptedLLM([{"winner": "A"}, {"winner": "maybe"}]), "q", "mine", "theirs")
    assert failed.score is None and failed.errors


# ------------------------------------------------------------------ the reply cache


def test_cached_llm_replays_the_first_reply_with_its_cost(tmp_path: Path) -> None:
    class Slow(ScriptedLLM):
        def complete(self, messages, **kw):  # type: ignore[no-untyped-def]
            reply = super().complete(messages, **kw)
            return Completion(reply.text, Usage(100, 7), "m", seconds=3.5)

    inner = Slow([{"x": 1}, {"x": 2}])
    llm = CachedLLM(inner, tmp_path)
    msgs = [{"role": "user", "content": "hello"}]
    first = llm.complete(msgs, max_tokens=50)
    again = llm.complete(msgs, max_tokens=50)
    assert again.text == first.text == '{"x": 1}'
    assert (again.usage.prompt_tokens, again.usage.completion_tokens, again.seconds) == (100, 7, 3.5)
    assert len(inner.calls) == 1 and llm.stats.hits == 1 and llm.stats.saved_seconds == 3.5
    # any change to the request is a different key
    assert llm.complete(msgs, max_tokens=51).text == '{"x": 2}'
    assert request_key("m", msgs, None, 50, 0.0) != request_key("m", msgs, None, 50, 0.5)
    assert request_key("m", msgs, None, 50, 0.0) == request_key("m", [dict(m) for m in msgs], None, 50, 0.0)
    # a fresh client on the same folder (another process) hits too
    assert CachedLLM(ScriptedLLM([]), tmp_path, model=llm.model).complete(msgs, max_tokens=50).text == '{"x": 1}'


def test_cached_llm_never_caches_failures_and_survives_a_torn_entry(tmp_path: Path) -> None:
    inner = ScriptedLLM([LLMTimeoutError("slow"), {"ok": True}])
    llm = CachedLLM(inner, tmp_path)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(LLMTimeoutError):
        llm.complete(msgs)
    assert llm.complete(msgs).text == '{"ok": true}'
    key = request_key(llm.model, msgs, None, 512, 0.0)
    (tmp_path / key[:2] / f"{key}.json").write_text('{"text": "cut off', encoding="utf-8")
    inner.extend([{"ok": "again"}])
    assert llm.complete(msgs).text == '{"ok": "again"}'  # unreadable entry: asked again, rewritten


# ------------------------------------------------------------------ loaders


def _write_jsonl(path: Path) -> Path:
    lines = [
        {
            "user_id": "u1",
            "facts": [
                {"id": "f1", "text": "I hurt my knee playing basketball", "date": "2025-03-01"},
                {"id": "f2", "text": "I sold my car and ride the bus now"},
                {"id": "f3", "text": "my sister lives in Porto"},
            ],
            "queries": [
                {
                    "id": "q1",
                    "query": "knee basketball",
                    "date": "2025-05-01",
                    "category": "health",
                    "references": [{"text": "knee injury", "fact_ids": ["f1"]}, {"text": "x", "fact_ids": ["nope"]}],
                },
                {"id": "q2", "query": "visit family", "references": ["sister in Porto"]},
            ],
        },
        {
            "user_id": "u2",
            "sessions": [
                {
                    "id": "s1",
                    "date": "2025-01-02",
                    "turns": [{"speaker": "user", "text": "I sold my car"}, {"role": "assistant", "text": "Noted."}],
                }
            ],
            "queries": [{"query": "car", "references": [{"text": "sold car", "fact_ids": ["u2:s1:0"]}]}],
        },
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n", encoding="utf-8")
    return path


def test_load_jsonl_reads_facts_or_turns_and_resolves_gold(tmp_path: Path) -> None:
    data = load_jsonl(_write_jsonl(tmp_path / "d.jsonl"))
    assert [f.id for f in data.facts] == ["f1", "f2", "f3", "u2:s1:0", "u2:s1:1"]
    turn = data.facts[3]
    assert turn.text == "user: I sold my car" and turn.scope == Scope(user_id="u2") and turn.position == 0
    q1, q2, q3 = data.questions
    assert (q1.gold, q1.missing, q1.category, q1.references) == (["f1"], 1, "health", ["knee injury", "x"])
    assert q1.date is not None and q1.date.month == 5
    assert (q2.gold, q2.references) == ([], ["sister in Porto"])  # texts only: judged
    assert (q3.id, q3.gold, q3.scope) == ("u2:q0", ["u2:s1:0"], Scope(user_id="u2"))


def test_load_jsonl_names_the_bad_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"user_id": "u1"}\n{not json\n', encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="line 2"):
        load_jsonl(bad)
    bad.write_text('{"facts": []}\n', encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="user_id"):
        load_jsonl(bad)


def test_select_takes_every_kth_then_the_first_n(tmp_path: Path) -> None:
    facts = [Fact(id=f"f{i}", text=f"t{i}", scope=Scope(user_id=f"u{i}")) for i in range(10)]
    qs = [EvalQuestion(id=f"q{i}", question="x", scope=Scope(user_id=f"u{i}"), gold=[f"f{i}"]) for i in range(10)]
    qs.append(EvalQuestion(id="nogold", question="x", scope=Scope(user_id="u0")))
    picked = EvalSet("t", facts, qs).select(every=3, limit=3)
    assert [q.id for q in picked.questions] == ["q0", "q3", "q6"]
    assert sorted(f.id for f in picked.facts) == ["f0", "f3", "f6"]  # only the facts their scopes own
    with pytest.raises(InvalidArgumentError):
        EvalSet("t", facts, qs).select(every=0)


@pytest.mark.skipif(not (SHARED / "prefeval").exists(), reason="PrefEval not found at ../shared/data/prefeval")
def test_prefeval_builds_one_history_per_preference() -> None:
    data = load_prefeval(SHARED / "prefeval", fillers=2, per_topic=1)
    assert len(data.questions) == 20 and len({q.category for q in data.questions}) == 20
    ids = {f.id for f in data.facts}
    for q in data.questions:
        assert q.gold and all(g in ids for g in q.gold)
        owned = [f for f in data.facts if f.scope == q.scope]
        assert owned[0].id == q.gold[0] and owned[0].text.startswith("user: ")  # the preference comes first
        assert len({f.session_id for f in owned}) == 3  # the preference and two filler conversations
    implicit = load_prefeval(SHARED / "prefeval", kind="choice-based", fillers=0, per_topic=1)
    assert all(len(q.gold) == 1 and len(q.gold[0]) == 3 for q in implicit.questions)  # one group of 3 turns
    with pytest.raises(InvalidArgumentError, match="fillers"):
        load_prefeval(SHARED / "prefeval", fillers=99)


@pytest.mark.skipif(not (SHARED / "prefeval").exists(), reason="PrefEval not found at ../shared/data/prefeval")
def test_prefeval_filler_pool_draws_from_the_first_n_conversations() -> None:
    whole = load_prefeval(SHARED / "prefeval", fillers=2, per_topic=2)
    pooled = load_prefeval(SHARED / "prefeval", fillers=2, per_topic=2, filler_pool=3)
    first_turns = {  # the opening turn of each filler conversation, as the loader writes it
        f.text for f in whole.facts if f.position == 0 and not f.session_id.endswith(":S0")
    }
    pooled_openings = {f.text for f in pooled.facts if f.position == 0 and not f.session_id.endswith(":S0")}
    assert len(pooled_openings) == 3 and len(first_turns) > 3  # only three conversations serve the 40 draws
    assert all(len({f.session_id for f in pooled.facts if f.scope == q.scope}) == 3 for q in pooled.questions)
    assert "first 3" in pooled.notes[0]
    for bad in (1, 25):  # fewer than the fillers each history needs, more than there are
        with pytest.raises(InvalidArgumentError, match="filler_pool"):
            load_prefeval(SHARED / "prefeval", fillers=2, filler_pool=bad)


def test_prefeval_missing_folder_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="explicit_preference"):
        load_prefeval(tmp_path)


# ------------------------------------------------------------------ runner and report


def _bus_plan(messages, schema):  # type: ignore[no-untyped-def]
    """A cot model for the small set: q_A, one step, a summary."""
    props = (schema or {}).get("properties", {})
    if "intent" in props:
        return {"intent": "get around without a car"}
    if "steps" in props:
        return {"steps": [{"action": "check the bus timetable", "dimension": "logistics"}]}
    return {"summary": "the bus matters"}


def _small_set() -> tuple[InMemoryStore, EvalSet]:
    store = make_store()
    questions = [
        EvalQuestion(id="knee", question="knee basketball", scope=U1, gold=["s1:0"], category="health"),
        EvalQuestion(id="car", question="sold my car bus", scope=U1, gold=["s1:3", "s2:0"], category="logistics"),
    ]
    return store, EvalSet("tiny", store.facts, questions)


def test_summarise_computes_each_metric_from_hand_made_records() -> None:
    _, data = _small_set()
    records = [
        {"method": "_deep", "question": "knee", "ids": ["x", "s1:0", "y"], "closeness": 0.9},
        {"method": "_deep", "question": "car", "ids": ["s1:3", "z", "s2:0"], "closeness": 0.1},
        {
            "method": "m",
            "question": "knee",
            "ids": ["s1:0"] + [f"n{i}" for i in range(30)],
            "llm_calls": 2,
            "prompt_tokens": 100,
            "completion_tokens": 10,
            "seconds": 1.0,
            "store_calls": 3,
        },
        {
            "method": "m",
            "question": "car",
            "ids": ["s1:3"] + [f"n{i}" for i in range(24)] + ["s2:0"],
            "llm_calls": 4,
            "prompt_tokens": 300,
            "completion_tokens": 30,
            "seconds": 3.0,
            "store_calls": 5,
        },
    ]
    m = summarise(data, records, ["m"])["methods"]["m"]
    assert m["questions"] == 2
    assert m["recall_at"] == {"10": 0.75, "20": 0.75, "35": 1.0}  # knee 1, car 1/2 until rank 26
    assert m["recall"] == 1.0 and m["recall_exact"] == 1.0
    assert m["recall_exact_at"]["20"] == 0.5
    assert m["query_only_same_size"] == 1.0  # the deep lists hold every gold item within 26 and 31
    assert m["recall_at_20_hard_third"] == 0.5  # one third of 2 = 1 question: "car", least close
    assert m["by_category"] == {"health": 1.0, "logistics": 0.5}
    assert (m["llm_calls"], m["tokens"], m["seconds"], m["store_calls"], m["facts"]) == (3.0, 220.0, 2.0, 4.0, 28.5)
    table = markdown({"dataset": "tiny", "questions": 2, "methods": {"m": m}})
    assert "| m | 2 | 0.750 | 0.750 | 1.000 | 1.000 | 28.5 |" in table


def test_the_main_table_compares_methods_on_the_same_questions() -> None:
    _, data = _small_set()

    def rec(method: str, qid: str, ids: list[str], **kw: object) -> dict[str, object]:
        return {"method": method, "question": qid, "ids": ids, "llm_calls": 0, **kw}

    records = [
        rec("full", "knee", ["s1:0"]),
        rec("full", "car", ["x"], degraded=True, error="LLMTimeoutError: no answer"),
        rec("cut", "knee", ["y"]),  # interrupted: no record for "car"
    ]
    report = summarise(data, records, ["full", "cut", "never-ran"])
    assert report["questions"] == 2 and report["compared_questions"] == 1
    assert report["without_records"] == ["never-ran"]
    main = report["methods"]
    assert main["full"]["questions"] == main["cut"]["questions"] == 1  # both on "knee" only
    assert (main["full"]["recall_at"]["20"], main["cut"]["recall_at"]["20"]) == (1.0, 0.0)
    assert main["full"]["degraded_questions"] == 0  # the degraded question is not a compared one
    own = report["own_questions"]
    assert set(own) == {"full"}  # "cut"'s own questions are the compared ones
    assert own["full"]["questions"] == 2 and own["full"]["recall_at"]["20"] == 0.5
    assert (own["full"]["degraded_questions"], own["full"]["degraded"]) == (1, 0.5)
    table = markdown(report)
    main_part, rest = table.split("Own questions, not comparable")
    own_part, by_category = rest.split("recall@20 by category")
    assert "same 1 of the 2 questions" in main_part and "| full | 1 |" in main_part and "| cut | 1 |" in main_part
    assert "| full ⚠ 1 degraded | 2 |" in own_part and "| cut |" not in own_part
    assert "never-ran" in main_part
    assert "the same 1 questions" in by_category and "| cut | 0.000 |" in by_category
    # every method on every question: one table, no "own questions" part
    full = summarise(data, records, ["full"])
    assert full["compared_questions"] == 2 and full["own_questions"] == {}
    assert "| full ⚠ 1 degraded | 2 |" in markdown(full) and "not comparable" not in markdown(full)


def test_run_eval_resumes_and_never_mixes_settings(tmp_path: Path) -> None:
    store, data = _small_set()
    records = tmp_path / "r.jsonl"
    rows = run_eval(data, ["query-only", "pgr-feedback"], store, records=records, log=lambda s: None)
    assert {(r["method"], r["question"]) for r in rows} == {
        (m, q) for m in ("_deep", "query-only", "pgr-feedback") for q in ("knee", "car")
    }
    report = summarise(data, rows, ["query-only", "pgr-feedback"])
    qo = next(r for r in rows if r["method"] == "query-only" and r["question"] == "knee")
    assert qo["ids"][0] == "s1:0" and report["methods"]["query-only"]["recall_at"]["10"] == pytest.approx(
        (
            recall_at(qo["ids"], ["s1:0"], 10)
            + recall_at(
                next(r for r in rows if r["method"] == "query-only" and r["question"] == "car")["ids"],
                ["s1:3", "s2:0"],
                10,
            )
        )
        / 2
    )

    # a second run with the same settings runs nothing again (a store that fails on any search proves it)
    class Refuses(InMemoryStore):
        def search_batch(self, *a, **k):  # type: ignore[no-untyped-def]
            raise AssertionError("searched again")

    again = run_eval(data, ["query-only", "pgr-feedback"], Refuses(HashingEmbedder()), records=records)
    assert len(again) == len(rows)
    # a torn last line (an interrupted write) is dropped and redone
    text = records.read_text().splitlines()
    records.write_text("\n".join(text[:-1]) + "\n" + text[-1][:15] + "\n")
    redone = run_eval(data, ["query-only", "pgr-feedback"], store, records=records)
    assert len(redone) == len(rows)
    # other settings: the old records are set aside, not mixed in
    run_eval(data, ["query-only"], store, records=records, overrides={"delta": 3})
    assert records.with_suffix(".jsonl.old").exists()


def test_llm_methods_are_skipped_without_an_llm_and_billed_with_one(tmp_path: Path) -> None:
    store, data = _small_set()
    said: list[str] = []
    rows = run_eval(data, ["pgr-cot"], store, log=said.append)
    assert not [r for r in rows if r["method"] == "pgr-cot"] and "needs an LLM" in said[0]

    llm = ScriptedLLM(handler=_bus_plan)
    cached = CachedLLM(llm, tmp_path / "cache")
    rows = run_eval(data, ["pgr-cot"], store, llm=cached)
    cot = [r for r in rows if r["method"] == "pgr-cot"]
    # every request is billed, including one answered from the cache within the run
    assert cached.stats.misses == len(llm.calls)
    assert len(cot) == 2 and sum(r["llm_calls"] for r in cot) == cached.stats.hits + cached.stats.misses
    assert all(r["prompt_tokens"] > 0 for r in cot)
    # re-run from the cache: no new calls, same billed cost
    rows2 = run_eval(data, ["pgr-cot"], store, llm=CachedLLM(ScriptedLLM([]), tmp_path / "cache", model=llm.name))
    assert [r["llm_calls"] for r in rows2 if r["method"] == "pgr-cot"] == [r["llm_calls"] for r in cot]


def test_meter_replays_cached_seconds() -> None:
    class Recorded(ScriptedLLM):
        def complete(self, messages, **kw):  # type: ignore[no-untyped-def]
            return Completion("{}", Usage(5, 1), seconds=40.0)

    meter = Meter(Recorded())
    meter.complete([{"role": "user", "content": "x"}])
    assert (meter.calls, meter.prompt_tokens, meter.llm_seconds) == (1, 5, 40.0) and meter.inside < 40.0


def test_method_names_are_checked() -> None:
    assert parse_method("pgr-tot+w2") == ("pgr-tot", 2)
    for bad in ("bm25", "query-only+wx"):
        with pytest.raises(InvalidArgumentError):
            parse_method(bad)
    with pytest.raises(Exception, match="needs an LLM"):
        make_method("pgr-tot", make_store())


def test_write_report_writes_json_markdown_and_chart(tmp_path: Path) -> None:
    store, data = _small_set()
    rows = run_eval(data, ["query-only", "query-only+w1"], store)
    paths = write_report(summarise(data, rows, ["query-only", "query-only+w1"]), tmp_path / "out.json")
    report = json.loads(paths["json"].read_text())
    assert set(report["methods"]) == {"query-only", "query-only+w1"}
    assert set(report["methods"]["query-only"]["recall_at"]) == {"10", "20", "35"}
    assert "| query-only+w1 |" in paths["markdown"].read_text()
    pytest.importorskip("matplotlib")
    assert paths["chart"] is not None and paths["chart"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scripted_failures_never_reach_the_runner(tmp_path: Path) -> None:
    store, data = _small_set()
    llm = ScriptedLLM(handler=lambda m, s: LLMError("server down"))
    rows = run_eval(data, ["pgr-tot"], store, llm=llm)
    tot = [r for r in rows if r["method"] == "pgr-tot"]
    assert len(tot) == 2 and all(r["degraded"] and r["ids"] for r in tot)  # the query's hits survive


def test_a_degraded_question_says_why_on_stderr_and_in_its_record() -> None:
    from pgr_core.testing.faults import FaultyLLM

    store, data = _small_set()
    llm = FaultyLLM(ScriptedLLM(handler=lambda m, s: {}), "server_error")
    said: list[str] = []
    rows = run_eval(data, ["query-only", "pgr-cot"], store, llm=llm, log=said.append)
    cot = {r["question"]: r for r in rows if r["method"] == "pgr-cot"}
    assert set(cot) == {"knee", "car"} and all(r["degraded"] for r in cot.values())
    assert all("LLMStatusError" in r["error"] and "500" in r["error"] for r in cot.values())
    assert all(r["error"] is None for r in rows if r["method"] == "query-only")  # fine: no reason
    lines = [line for line in said if line.startswith("degraded:")]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    for qid in ("knee", "car"):
        (line,) = [line for line in lines if f"[{qid}]" in line]
        assert line == f"degraded: pgr-cot [{qid}]: {cot[qid]['error']}"


def test_compare_answers_judges_both_orders_and_resumes() -> None:
    from pgr_core.evaluation.answers import compare_answers

    store, data = _small_set()
    rows = run_eval(data, ["query-only", "pgr-feedback"], store)

    def handler(messages, schema):  # type: ignore[no-untyped-def]
        prompt = messages[0]["content"]
        if schema is None:  # an answer: say which facts it saw
            return "bus" if "ride the bus" in prompt else "no idea"
        # the judge prefers whichever reply mentions the bus, in either position
        a = prompt.split("Reply A:")[1].split("Reply B:")[0]
        return {"winner": "A" if "bus" in a else "B"}

    llm = ScriptedLLM(handler=handler)
    result = compare_answers(data, rows, store, "query-only", "pgr-feedback", llm=llm)
    assert result["questions"] == 2 and result["decided"] == 2
    assert 0.0 <= result["win_rate"] <= 1.0
    calls = len(llm.calls)
    assert calls == 2 * (2 + 2)  # per question: two answers, two verdicts
    again = compare_answers(data, rows, store, "query-only", "pgr-feedback", llm=ScriptedLLM([]))
    assert again == result  # everything came from the records


def test_pgr_eval_command_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pgr_core.cli.main import main

    data = _write_jsonl(tmp_path / "d.jsonl")
    out = tmp_path / "report.json"
    code = main(
        [
            "eval",
            "jsonl",
            "--data",
            str(data),
            "--methods",
            "query-only,pgr-feedback+w1",
            "--json",
            str(out),
            "--embedder",
            "hashing",
            "--no-llm",
            "--vector-cache",
            str(tmp_path / "vectors"),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert report["dataset"] == "jsonl" and report["questions"] == 3
    qo = report["methods"]["query-only"]
    assert set(qo) >= {"recall", "recall_at", "recall_exact", "llm_calls", "tokens", "seconds", "by_category"}
    assert qo["recall_at"]["20"] == 0.75  # q1: f1 found, its second reference names no fact; q3: found
    assert out.with_suffix(".md").exists() and out.with_suffix(".records.jsonl").exists()
    assert "| query-only | 3 |" in capsys.readouterr().out
    assert main(["eval", "jsonl", "--data", str(data), "--methods", "bm25", "--json", str(out)]) == 2


def test_a_reference_spread_over_several_facts_is_one_gold_item(tmp_path: Path) -> None:
    line = {
        "user_id": "u",
        "facts": [{"id": "a", "text": "knee"}, {"id": "b", "text": "knee again"}, {"id": "c", "text": "car"}],
        "queries": [
            {
                "query": "q",
                "references": [{"text": "knee", "fact_ids": ["a", "b"]}, {"text": "car", "fact_ids": ["c", "gone"]}],
            }
        ],
    }
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps(line) + "\n", encoding="utf-8")
    (q,) = load_jsonl(path).questions
    assert q.gold == [["a", "b"], "c"] and q.missing == 0  # "gone" names no fact, but "c" does
    assert recall(["b"], q.gold) == 0.5  # one of the two references, however many facts hold it
    assert recall_exact(["b", "c"], q.gold) == 1.0


def test_report_only_rewrites_the_report_from_records(tmp_path: Path) -> None:
    from pgr_core.cli.main import main

    data = _write_jsonl(tmp_path / "d.jsonl")
    out = tmp_path / "report.json"
    common = [
        "eval",
        "jsonl",
        "--data",
        str(data),
        "--json",
        str(out),
        "--embedder",
        "hashing",
        "--no-llm",
        "--no-cache",
    ]
    assert main([*common, "--report-only", "--methods", "query-only"]) == 2  # nothing recorded yet
    assert main([*common, "--methods", "query-only"]) == 0
    first = json.loads(out.read_text())
    out.unlink()
    assert main([*common, "--report-only", "--methods", "query-only"]) == 0
    assert json.loads(out.read_text())["methods"] == first["methods"]


def test_pgr_none_the_no_llm_default_returns_the_query_only_list() -> None:
    # uncentred, pgr-none is exactly the question's own list; centred (the default) it holds the same
    # facts here (the user has fewer than 20), in the centred order
    store, data = _small_set()
    methods = ["query-only", "pgr-none", "query-only+w1", "pgr-none+w1"]
    plain = run_eval(data, methods, store, overrides={"centring": None}, log=lambda s: None)
    ids = {(r["method"], r["question"]): r["ids"] for r in plain}
    centred = {(r["method"], r["question"]): r["ids"] for r in run_eval(data, methods, store, log=lambda s: None)}
    for q in data.questions:
        assert ids[("pgr-none", q.id)] == ids[("query-only", q.id)]
        assert ids[("pgr-none+w1", q.id)][:20] == ids[("query-only+w1", q.id)]
        assert sorted(centred[("pgr-none", q.id)]) == sorted(ids[("query-only", q.id)])
        assert centred[("query-only", q.id)] == ids[("query-only", q.id)]  # the baseline is never centred


def test_a_rerun_asks_again_for_degraded_records_and_keeps_the_rest(tmp_path: Path) -> None:
    """The relay procedure: a round's unanswered requests degrade; the next round must ask again."""
    store, data = _small_set()
    records = tmp_path / "r.jsonl"

    refused = ScriptedLLM(handler=lambda m, s: LLMError("no reply yet"))
    first = run_eval(data, ["query-only", "pgr-cot"], store, llm=refused, records=records, log=lambda s: None)
    assert all(r["degraded"] for r in first if r["method"] == "pgr-cot")
    answered = ScriptedLLM(handler=_bus_plan)
    second = run_eval(data, ["query-only", "pgr-cot"], store, llm=answered, records=records, log=lambda s: None)
    cot = [r for r in second if r["method"] == "pgr-cot"]
    assert len(cot) == 2 and not any(r["degraded"] for r in cot) and answered.calls
    # the file holds each question once, the degraded records gone; query-only was not run again
    lines = [json.loads(line) for line in records.read_text().splitlines()[1:]]
    assert sorted((r["method"], r["question"]) for r in lines) == sorted((r["method"], r["question"]) for r in second)
    assert [r["ids"] for r in lines if r["method"] == "query-only"] == [
        r["ids"] for r in first if r["method"] == "query-only"
    ]


def test_a_pgr_answer_is_pag_and_a_failed_answer_or_verdict_is_asked_again() -> None:
    from pgr_core.evaluation.answers import compare_answers

    store, data = _small_set()
    rows = run_eval(data, ["query-only"], store)
    # a prospector's record: its R* and its summary (what PGR.answer answers from)
    for r in [r for r in rows if r["method"] == "query-only"]:
        rows.append({**r, "method": "pgr-cot", "ids": list(reversed(r["ids"])), "summary": "the knee and the bus"})
    prompts: list[str] = []

    def handler(messages, schema):  # type: ignore[no-untyped-def]
        prompt = messages[0]["content"]
        if schema is None:
            prompts.append(prompt)
            return "answer with briefing" if "the knee and the bus" in prompt else "plain answer"
        a = prompt.split("Reply A:")[1].split("Reply B:")[0]
        return {"winner": "A" if "briefing" in a else "B"}

    refused = ScriptedLLM(handler=lambda m, s: LLMError("no reply yet"))
    first = compare_answers(data, rows, store, "pgr-cot", "query-only", llm=refused)
    assert first["decided"] == 0 and first["undecided"] == 2
    result = compare_answers(data, rows, store, "pgr-cot", "query-only", llm=ScriptedLLM(handler=handler))
    assert result["decided"] == 2 and result["win_rate"] == 1.0
    pag = [p for p in prompts if "the knee and the bus" in p]
    assert len(pag) == 2 and len(prompts) == 4  # the briefing reaches PGR's answers only
    answers = [r for r in rows if r["method"] == "_answer:pgr-cot" and r["text"]]
    assert answers and all(r["pag"] for r in answers)
