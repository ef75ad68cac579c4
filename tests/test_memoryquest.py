"""MemoryQuest construction: the paper's filters and bounds, resuming, and the output's round trip.

The builder is lab code, outside the wheel (lab/memoryquest/build.py); its tests stay in the suite.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from pgr_core.errors import InvalidArgumentError, LLMError, LLMTimeoutError
from pgr_core.evaluation.data import load_jsonl
from pgr_core.models.embedders import HashingEmbedder
from pgr_core.testing import ScriptedLLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab" / "memoryquest"))
from build import build_memoryquest, example_personas, load_personas, main

# References far from every request in the hashing embedder's space (no shared words).
FAR = [
    "Hurt my knee playing basketball in March",
    "Sold the car and rides buses everywhere",
    "Rent went up sharply this year",
    "Hates waking early at weekends",
]
CLOSE_QUERY = "Should I join a soccer league this summer?"
CLOSE_REFS = [
    "I want to join a soccer league this summer",
    "A soccer league this summer sounds good",
    "Should I join the soccer league?",
]


class Killed(Exception):
    """Stands in for the process being killed (not an LLMError: nothing catches it)."""


class World:
    """A scripted LLM for the whole pipeline: it answers each stage by reading the request's schema
    and prompt, so its replies depend on the prompt only (reruns get the same data)."""

    def __init__(self, *, per_call: int = 2, plan: Mapping[str, list[str]] | None = None) -> None:
        self.per_call = per_call
        self.plan = plan or {}  # persona marker -> request texts to give, in order (then numbered ones)
        self.kill_at: int | None = None  # the call (1-based) that raises Killed
        self.fail_from: int | None = None  # this call (1-based) and every later one time out
        self.llm = ScriptedLLM(handler=self.handle)

    @property
    def calls(self) -> list[Any]:
        return self.llm.calls

    def handle(self, messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        n = len(self.llm.calls)
        if self.kill_at is not None and n >= self.kill_at:
            raise Killed(f"call {n}")
        if self.fail_from is not None and n >= self.fail_from:
            return LLMTimeoutError("no answer within 60s")
        assert schema is not None
        first = messages[0]["content"]
        retry = len(messages) > 1
        stage = next(iter(schema["properties"]))
        return {"queries": self.queries, "events": self.timeline, "turns": self.dialogue}[stage](first, retry)

    def queries(self, prompt: str, retry: bool) -> dict[str, Any]:
        written = len(re.findall(r"^- ", prompt, re.MULTILINE))
        marker = next((m for m in self.plan if m in prompt), None)
        texts = list(self.plan.get(marker, [])) if marker else []
        texts += [f"Should I book plan {i} soon?" for i in range(1, 100)]
        out = []
        for text in texts[written : written + self.per_call]:
            refs = CLOSE_REFS if text == CLOSE_QUERY else FAR
            out.append({"query": text, "category": "plans", "references": refs})
        return {"queries": out}

    def timeline(self, prompt: str, retry: bool) -> dict[str, Any]:
        n_refs = len(re.findall(r"^\d+\. ", prompt, re.MULTILINE))
        when = max(date.fromisoformat(d) for d in re.findall(r"\d{4}-\d{2}-\d{2}", prompt))
        query = re.search(r'will ask their assistant: "(.*)"', prompt).group(1)  # type: ignore[union-attr]
        events: list[dict[str, Any]] = [
            {
                "date": (when - timedelta(days=70 - 10 * i)).isoformat(),
                "event": f"Day {i} before: {query}",
                "references": [i + 1] if i < n_refs else [],
            }
            for i in range(6)
        ]
        if "TWICE" in query or ("ONCE" in query and not retry):
            events[1]["references"].append(1)  # reference 1 in two events
        return {"events": events}

    def dialogue(self, prompt: str, retry: bool) -> dict[str, Any]:
        refs = re.findall(r"^\d+\. (.*)$", prompt, re.MULTILINE)
        count = 3 if "SHORT" in prompt else 40 if "LONG" in prompt else 8
        turns = []
        for k in range(count):
            speaker = "user" if k % 2 == 0 else "assistant"
            r = k // 2
            late = "LONG" in prompt and "Day 3 before" in prompt  # this event's fact comes up past turn 30
            if speaker == "user" and r < len(refs) and not late:
                turns.append({"speaker": speaker, "text": f"By the way: {refs[r]}", "references": [r + 1]})
            else:
                turns.append({"speaker": speaker, "text": f"Small talk, turn {k}.", "references": []})
        if late and refs:
            turns[34] = {"speaker": "user", "text": f"Also: {refs[0]}", "references": [1]}
        return {"turns": turns}


def write_personas(path: Path, *personas: tuple[str, str]) -> Path:
    path.write_text("".join(json.dumps({"user_id": u, "persona": p}) + "\n" for u, p in personas), encoding="utf-8")
    return path


def build(tmp: Path, world: World | ScriptedLLM, personas: Path, **options: Any) -> tuple[Path, dict[str, Any]]:
    options = {"max_queries_per_user": 2, **options}
    out = build_memoryquest(
        personas,
        tmp / "mq.jsonl",
        llm=world.llm if isinstance(world, World) else world,
        embedder=HashingEmbedder(),
        work_dir=tmp / "work",
        log=lambda m: None,
        **options,
    )
    return out, json.loads((tmp / "work" / "summary.json").read_text(encoding="utf-8"))


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def personas(tmp_path: Path) -> Path:
    return write_personas(
        tmp_path / "personas.jsonl",
        ("u1", "A nurse in Leeds, marker ALPHA."),
        ("u2", "A bike mechanic in Gdansk, marker BETA."),
    )


def test_output_loads_with_load_jsonl_and_gold_ids_name_the_turns_that_reveal_each_reference(
    tmp_path: Path, personas: Path
) -> None:
    out, summary = build(tmp_path, World(), personas)
    data = load_jsonl(out)
    assert {q.scope.user_id for q in data.questions} == {"u1", "u2"}
    assert len(data.questions) == 4 and summary["written"] == 4
    texts = {f.id: f.text for f in data.facts}
    for q in data.questions:
        assert q.missing == 0 and len(q.gold) == len(FAR)  # one tagged turn per reference
        assert q.date is not None and all(texts[g].startswith("user: By the way:") for g in q.gold)
    record = lines(out)[0]
    for q in record["queries"]:
        for ref in q["references"]:
            (fid,) = ref["fact_ids"]
            assert texts[fid] == f"user: By the way: {ref['text']}"  # the turn that mentions it
            assert ref["date"] < q["date"]
    assert all(5 <= len(s["turns"]) <= 30 for s in record["sessions"])
    assert record["sessions"] == sorted(record["sessions"], key=lambda s: s["date"])
    assert summary["sessions"] == 4 * 6 and summary["pending"] == {} and summary["errors"] == []


def test_cosine_filter_drops_a_query_whose_references_are_close_to_it(tmp_path: Path) -> None:
    personas = write_personas(tmp_path / "p.jsonl", ("u1", "Plays football, marker ALPHA."))
    world = World(plan={"ALPHA": [CLOSE_QUERY, "Where should we go on holiday?"]})
    out, summary = build(tmp_path, world, personas, max_queries_per_user=1)
    (record,) = lines(out)
    assert [q["query"] for q in record["queries"]] == ["Where should we go on holiday?"]
    assert summary["dropped"]["too-similar"] == 1
    assert summary["candidates"] == 2 and summary["kept"] == 1
    assert any("too-similar mean cosine" in n for n in summary["notes"])


def test_at_most_15_queries_per_user(tmp_path: Path) -> None:
    personas = write_personas(tmp_path / "p.jsonl", ("u1", "marker ALPHA"))
    world = World(per_call=7)  # 7, 14, then 21 candidates: the third call overshoots the cap
    out, summary = build(tmp_path, world, personas, max_queries_per_user=15)
    (record,) = lines(out)
    assert len(record["queries"]) == 15
    assert summary["dropped"]["over-cap"] == 6
    assert sum(1 for c in world.calls if c.schema and "queries" in c.schema["properties"]) == 3
    assert len({q["id"] for q in record["queries"]}) == 15


def test_timeline_placing_a_reference_in_two_events_is_retried_then_dropped(tmp_path: Path) -> None:
    personas = write_personas(tmp_path / "p.jsonl", ("u1", "marker ALPHA"))
    plan = {"ALPHA": ["Plan it TWICE?", "Plan it ONCE?", "Plan it well?"]}
    world = World(plan=plan, per_call=3)
    out, summary = build(tmp_path, world, personas, max_queries_per_user=3)
    (record,) = lines(out)
    assert [q["query"] for q in record["queries"]] == ["Plan it ONCE?", "Plan it well?"]  # ONCE: fixed on retry
    assert summary["dropped"] == {"invalid-timeline": 1}
    assert any("reference 1 is placed in 2 events" in n for n in summary["notes"])
    twice = [c for c in world.calls if "events" in c.schema["properties"] and "TWICE" in c.messages[0]["content"]]
    assert len(twice) == 2
    assert "reference 1 is placed in 2 events" in twice[1].messages[-1]["content"]  # the retry says why
    assert not any("TWICE" in c.messages[0]["content"] for c in world.calls if "turns" in c.schema["properties"])


def test_dialogue_turn_bounds_short_is_dropped_long_is_clipped(tmp_path: Path) -> None:
    personas = write_personas(tmp_path / "p.jsonl", ("u1", "marker ALPHA"))
    plan = {"ALPHA": ["Is it SHORT?", "Is it LONG?", "Is it normal?"]}
    world = World(plan=plan, per_call=3)
    out, summary = build(tmp_path, world, personas, max_queries_per_user=3)
    (record,) = lines(out)
    assert [q["query"] for q in record["queries"]] == ["Is it LONG?", "Is it normal?"]
    assert summary["dropped"] == {"invalid-dialogue": 1}
    assert summary["dialogues_dropped"] == 6 and summary["clipped_dialogues"] == 6
    assert all(5 <= len(s["turns"]) <= 30 for s in record["sessions"])
    short_calls = [c for c in world.calls if "SHORT" in c.messages[0]["content"] and "turns" in c.schema["properties"]]
    assert len(short_calls) == 12  # six events, each asked twice
    assert "has 3 turns" in short_calls[1].messages[-1]["content"]
    # LONG: the last reference was tagged past turn 30 only: its gold falls back to the session's user turns
    long_q = record["queries"][0]
    assert [len(r["fact_ids"]) for r in long_q["references"]] == [1, 1, 1, 15]
    assert summary["references_by_fallback"] == 1
    late = [c for c in world.calls if "LONG" in c.messages[0]["content"] and "Day 3 before" in c.messages[0]["content"]]
    assert len(late) == 2 and "no turn is marked with fact 1" in late[1].messages[-1]["content"]


def test_rerun_without_the_output_rebuilds_it_from_checkpoints_without_asking(tmp_path: Path, personas: Path) -> None:
    out, _ = build(tmp_path, World(), personas)
    first = out.read_text(encoding="utf-8")
    out.unlink()
    dead = ScriptedLLM(handler=lambda m, s: LLMError("must not be asked"))
    build_memoryquest(
        personas, out, llm=dead, embedder=HashingEmbedder(), work_dir=tmp_path / "work", max_queries_per_user=2
    )
    assert dead.calls == []
    assert out.read_text(encoding="utf-8") == first


def test_with_a_cache_the_build_reruns_from_replies_alone(tmp_path: Path, personas: Path) -> None:
    out, _ = build(tmp_path, World(), personas, cache_dir=tmp_path / "cache")
    first = out.read_text(encoding="utf-8")
    shutil.rmtree(tmp_path / "work")
    out.unlink()
    dead = ScriptedLLM(handler=lambda m, s: LLMError("must not be asked"))
    _, summary = build(tmp_path, dead, personas, cache_dir=tmp_path / "cache")
    assert dead.calls == []
    assert out.read_text(encoding="utf-8") == first
    assert summary["llm_cache"]["misses"] == 0 and summary["llm_cache"]["hits"] > 0


def test_a_killed_run_resumes_where_it_stopped(tmp_path: Path, personas: Path) -> None:
    clean_world = World()
    clean, _ = build(tmp_path / "clean", clean_world, personas)
    killed = World()
    killed.kill_at = 9  # 2 query calls, 4 timelines, 2 dialogues done; killed in the third dialogue
    with pytest.raises(Killed):
        build(tmp_path / "run", killed, personas)
    resumed = World()
    out, _ = build(tmp_path / "run", resumed, personas)
    assert out.read_text(encoding="utf-8") == clean.read_text(encoding="utf-8")
    assert len(clean_world.calls) == 30
    assert len(resumed.calls) == 30 - 8  # nothing done before the kill was asked again


def test_llm_failure_mid_run_leaves_a_usable_partial_output(tmp_path: Path, personas: Path) -> None:
    world = World()
    world.fail_from = 20  # 19 calls answered: the server dies during the dialogues
    out, summary = build(tmp_path, world, personas)
    data = load_jsonl(out)
    assert 0 < len(data.questions) < 4
    known = {f.id for f in data.facts}
    assert all(q.gold and q.missing == 0 and set(q.gold) <= known for q in data.questions)
    assert summary["pending"] and summary["errors"]
    assert any("stopped asking" in e for e in summary["errors"])
    assert len(world.calls) == 19 + 5  # five failures in a row, then no more asking
    # the next run, with the server back, completes the set
    out, summary = build(tmp_path, World(), personas)
    assert len(load_jsonl(out).questions) == 4 and summary["pending"] == {}


def test_a_custom_extractor_gets_the_sessions_and_gold_is_the_facts_of_the_reference_session(
    tmp_path: Path, personas: Path
) -> None:
    def one_fact_per_session(sessions: Sequence[Mapping[str, Any]], user_id: str) -> list[dict[str, Any]]:
        return [
            {"id": f"{user_id}:f{i}", "text": f"summary of {s['id']}", "session_id": f"{user_id}:{s['id']}"}
            for i, s in enumerate(sessions)
        ]

    out, _ = build(tmp_path, World(), personas, extract=one_fact_per_session)
    record = lines(out)[0]
    text = {f["id"]: f["text"] for f in record["facts"]}
    for q in record["queries"]:
        local = q["id"].split(":")[-1]
        for i, ref in enumerate(q["references"], 1):
            assert [text[f] for f in ref["fact_ids"]] == [f"summary of {local}e{i}"]


def test_personas_bundled_and_bad_files_named(tmp_path: Path) -> None:
    bundled = load_personas(example_personas())
    assert len(bundled) == 3 and len({p.user_id for p in bundled}) == 3
    bad = write_personas(tmp_path / "bad.jsonl", ("u1", "x"), ("u1", "y"))
    with pytest.raises(InvalidArgumentError, match=r"u1.*twice"):
        load_personas(bad)
    (tmp_path / "empty.jsonl").write_text('{"user_id": "u1"}\n', encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="persona must be a non-empty string"):
        load_personas(tmp_path / "empty.jsonl")


def test_cli_memoryquest_build_without_an_llm_says_how_to_give_one(
    tmp_path: Path, personas: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PGR_LLM", "none")
    code = main(["--personas", str(personas), "--out", str(tmp_path / "o.jsonl"), "--work", str(tmp_path / "w")])
    assert code == 2
    assert "--base-url" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()


def test_cli_memoryquest_build_end_to_end_over_http(
    tmp_path: Path, personas: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from loopback_llm import LoopbackLLM, Request, ok

    world = World()

    def answer(request: Request) -> Any:
        schema = request.body["response_format"]["json_schema"]["schema"]
        return ok(json.dumps(world.handle(request.body["messages"], schema)))

    out = tmp_path / "mq.jsonl"
    with LoopbackLLM() as srv:
        srv.default = answer
        args = ["--personas", str(personas), "--out", str(out), "--work", str(tmp_path / "w"),
                "--cache", str(tmp_path / "c"), "--base-url", srv.base_url, "--model", "m", "--embedder", "hashing",
                "--max-queries", "2"]  # fmt: skip
        assert main(args) == 0
        assert srv.count == 30
    captured = capsys.readouterr()
    assert json.loads(captured.out)["written"] == 4
    assert "memoryquest dialogues: 24/24 events" in captured.err
    assert len(load_jsonl(out).questions) == 4
