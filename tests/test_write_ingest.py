"""Ingestion: raw turns without an LLM, typed facts with upserts with one; idempotent, resumable, and an
LLM failure never corrupts the store."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from pgr_core import HashingEmbedder, InMemoryStore, LLMConnectionError, Scope
from pgr_core.cli.main import main
from pgr_core.errors import ConfigurationError
from pgr_core.testing import ScriptedLLM
from pgr_core.types import Fact
from pgr_core.write import (
    DEFAULT_GUIDELINE,
    Guideline,
    GuidelineError,
    Ingestor,
    Ledger,
    Session,
    Turn,
    raw_facts,
)

U = Scope(user_id="u1")
SESSIONS = [
    Session(
        "s1",
        "2025-03-02",
        [
            Turn("user", "I hurt my knee playing basketball last week"),
            Turn("assistant", "Sorry to hear that. Did you see a physio?"),
            Turn("user", "Yes, the physio said no running until July"),
        ],
    ),
    Session(
        "s2",
        "2025-03-20",
        [
            Turn("user", "I sold my car, so I take the bus to work now"),
            Turn("assistant", "That must save money."),
            Turn("user", "My knee is still sore after the basketball injury"),
        ],
    ),
]


def _store() -> InMemoryStore:
    return InMemoryStore(embedder=HashingEmbedder())


def _snapshot(store: InMemoryStore) -> list[dict[str, Any]]:
    return sorted((f.to_dict() for f in store.facts), key=lambda d: d["id"])


# --------------------------------------------------------------------------- raw mode


def test_each_user_turn_becomes_a_dated_fact_with_its_session_and_position() -> None:
    store = _store()
    report = Ingestor(store).ingest(SESSIONS, scope=U)
    assert report.ingested == 2 and report.facts_added == 4 and report.llm_calls == 0
    by_id = {f.id: f for f in store.facts}
    assert sorted(by_id) == ["u1:s1:0", "u1:s1:2", "u1:s2:0", "u1:s2:2"]  # the assistant's turns are left out
    fact = by_id["u1:s1:2"]
    assert fact.text == "user: Yes, the physio said no running until July"
    assert fact.date is not None and fact.date.isoformat() == "2025-03-02T00:00:00"
    assert (fact.session_id, fact.position) == ("u1:s1", 1)  # positions count kept turns: the window works
    assert fact.scope == U and fact.metadata["sessions"] == ["s1"]


def test_a_window_of_turns_becomes_one_fact_and_speakers_can_be_chosen() -> None:
    session = SESSIONS[0]
    windows = raw_facts(session, U, window=2, speakers=["user", "assistant"])
    assert [f.text.count("\n") for f in windows] == [1, 0]  # turns 0-1 together, then turn 2
    assert windows[0].text.startswith("user: I hurt my knee") and "assistant: Sorry" in windows[0].text
    only_assistant = raw_facts(session, U, speakers=["assistant"])
    assert [f.text for f in only_assistant] == ["assistant: Sorry to hear that. Did you see a physio?"]


def test_ingesting_the_same_sessions_twice_changes_nothing(tmp_path: Path) -> None:
    store = _store()
    ledger_path = tmp_path / "ledger.jsonl"
    Ingestor(store, ledger=Ledger(ledger_path)).ingest(SESSIONS, scope=U)
    before = _snapshot(store)
    again = Ingestor(store, ledger=Ledger(ledger_path)).ingest(SESSIONS, scope=U)  # a new process: ledger from disk
    assert again.skipped == 2 and again.ingested == 0 and again.facts_added == 0
    assert _snapshot(store) == before
    # without a ledger file, ingestors on the same store object share one in memory
    assert Ingestor(store).ingest(SESSIONS, scope=U).ingested == 2
    assert Ingestor(store).ingest(SESSIONS, scope=U).skipped == 2
    assert _snapshot(store) == before


def test_a_changed_session_is_done_again_and_its_vanished_turns_removed() -> None:
    store = _store()
    ingestor = Ingestor(store)
    ingestor.ingest(SESSIONS[:1], scope=U)
    shorter = Session("s1", "2025-03-02", [Turn("user", "I hurt my knee playing basketball last week")])
    report = ingestor.ingest([shorter], scope=U)
    assert report.ingested == 1
    assert sorted(f.id for f in store.facts) == ["u1:s1:0"]


def test_an_interrupted_run_resumes_without_duplicates(tmp_path: Path) -> None:
    path, ledger_path = tmp_path / "m.pgr", tmp_path / "m.pgr.ledger.jsonl"
    sessions = [
        Session(f"s{i}", f"2025-01-{i + 1:02d}", [Turn("user", f"note number {i} about topic {i}")]) for i in range(6)
    ]
    store = _store()
    saves = {"n": 0}

    def checkpoint() -> None:
        saves["n"] += 1
        if saves["n"] >= 3:
            raise KeyboardInterrupt  # the process is stopped at the third save
        store.save(path)

    with pytest.raises(KeyboardInterrupt):
        Ingestor(store, ledger=Ledger(ledger_path), checkpoint=checkpoint, checkpoint_every=1).ingest(sessions, scope=U)
    # a new process: what is on disk
    resumed = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert len(resumed) == 2 and len(Ledger(ledger_path)) == 2
    report = Ingestor(resumed, ledger=Ledger(ledger_path), checkpoint=lambda: resumed.save(path)).ingest(
        sessions, scope=U
    )
    assert report.skipped == 2 and report.ingested == 4
    final = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert sorted(f.id for f in final.facts) == [f"u1:s{i}:0" for i in range(6)]


def test_a_crash_between_saving_the_store_and_writing_the_ledger_duplicates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, ledger_path = tmp_path / "m.pgr", tmp_path / "m.pgr.ledger.jsonl"
    store = _store()

    def die(self: Ledger, entries: Any) -> None:
        raise SystemExit("killed after the store was saved, before the ledger line")

    monkeypatch.setattr(Ledger, "record", die)
    with pytest.raises(SystemExit):
        Ingestor(store, ledger=Ledger(ledger_path), checkpoint=lambda: store.save(path)).ingest(SESSIONS, scope=U)
    monkeypatch.undo()
    resumed = InMemoryStore.load(path, embedder=HashingEmbedder())
    assert len(resumed) == 2 and len(Ledger(ledger_path)) == 0  # the store has s1, the ledger does not
    report = Ingestor(resumed, ledger=Ledger(ledger_path)).ingest(SESSIONS, scope=U)
    assert report.ingested == 2 and len(resumed) == 4  # s1 done again under the same ids: no copies


def test_the_progress_bar_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    Ingestor(_store(), progress=True).ingest(SESSIONS, scope=U)
    out, err = capsys.readouterr()
    assert out == "" and "ingest [" in err and "2/2" in err


# --------------------------------------------------------------------------- with an LLM


def extraction_handler(replies: Mapping[str, Any]) -> Any:
    """An LLM stand-in: the reply for the session named in the extraction prompt."""

    def handler(messages: Sequence[Mapping[str, str]], schema: Any) -> Any:
        prompt = messages[-1]["content"] if messages[-1]["role"] == "user" else messages[0]["content"]
        session = re.search(r"session (\S+), held on", messages[0]["content"])
        assert session, prompt[:200]
        reply = replies[session.group(1)]
        return reply(messages) if callable(reply) else reply

    return handler


S1_FACTS = {
    "facts": [
        {
            "text": "The user hurt their knee playing basketball in late February 2025.",
            "type": "Event",
            "entities": ["knee", "basketball"],
            "date": "2025-02-24",
            "updates": None,
        },
        {"text": "The user's physio said no running until July.", "type": "event", "entities": ["physio"]},
        {"text": "", "type": "Event"},
        {"text": "The user is a wizard.", "type": "Superpower"},
    ]
}


def _s2_reply(messages: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    prompt = messages[0]["content"]
    handle = re.search(r"(E\d+) \[Event, [^\]]*\] [^\n]*knee", prompt)
    assert handle, "the remembered knee fact must be shown to the LLM with a handle"
    return {
        "facts": [
            {"text": "The user sold their car and commutes by bus.", "type": "Activity", "entities": ["car", "bus"]},
            {
                "text": "The user's basketball knee injury is still sore in March 2025.",
                "type": "Event",
                "entities": ["knee"],
                "updates": handle.group(1),
            },
        ]
    }


def _llm() -> ScriptedLLM:
    return ScriptedLLM(handler=extraction_handler({"s1": S1_FACTS, "s2": _s2_reply}))


def test_extraction_writes_typed_facts_with_provenance_under_the_guideline() -> None:
    store, llm = _store(), _llm()
    report = Ingestor(store, llm=llm).ingest(SESSIONS[:1], scope=U)
    assert report.facts_added == 2 and report.facts_rejected == 2 and report.llm_calls == 1
    prompt = llm.calls[0].prompt
    assert DEFAULT_GUIDELINE.render() in prompt  # S, with {types} filled
    assert "- Preference: what the user likes" in prompt and "{types}" not in prompt
    facts = {f.id: f for f in store.facts}
    knee = facts["u1:s1:f0"]
    assert knee.type == "Event" and knee.date is not None and knee.date.isoformat().startswith("2025-02-24")
    assert knee.metadata["frequency"] == 1 and knee.metadata["sessions"] == ["s1"]
    assert knee.metadata["entities"] == ["knee", "basketball"] and knee.metadata["guideline"] == DEFAULT_GUIDELINE.id
    physio = facts["u1:s1:f1"]
    assert physio.type == "Event"  # "event" normalised
    assert physio.date is not None and physio.date.isoformat().startswith("2025-03-02")  # no date given: the session's


def test_an_update_keeps_the_id_bumps_frequency_and_unions_provenance() -> None:
    store, llm = _store(), _llm()
    report = Ingestor(store, llm=llm).ingest(SESSIONS, scope=U)
    assert report.facts_updated == 1 and report.facts_added == 3
    knee = store.get("u1:s1:f0", scope=U)
    assert knee is not None
    assert knee.text == "The user's basketball knee injury is still sore in March 2025."
    assert knee.metadata["frequency"] == 2 and knee.metadata["sessions"] == ["s1", "s2"]
    assert knee.updated_at is not None and knee.updated_at.isoformat().startswith("2025-03-20")
    assert knee.date is not None and knee.date.isoformat().startswith("2025-02-24")  # when it happened stays
    assert len(store) == 3  # s1: 2 facts, s2: 1 new + 1 update


def test_reingesting_with_an_llm_asks_nothing_and_changes_nothing(tmp_path: Path) -> None:
    store, llm = _store(), _llm()
    ledger = Ledger(tmp_path / "l.jsonl")
    Ingestor(store, llm=llm, ledger=ledger).ingest(SESSIONS, scope=U)
    before, calls = _snapshot(store), len(llm.calls)
    report = Ingestor(store, llm=llm, ledger=Ledger(tmp_path / "l.jsonl")).ingest(SESSIONS, scope=U)
    assert report.skipped == 2 and len(llm.calls) == calls and _snapshot(store) == before


def test_a_session_done_again_after_a_lost_ledger_line_counts_once() -> None:
    store, llm = _store(), _llm()
    Ingestor(store, llm=llm, ledger=Ledger()).ingest(SESSIONS, scope=U)
    before = _snapshot(store)
    Ingestor(store, llm=llm, ledger=Ledger()).ingest(SESSIONS[1:], scope=U)  # as if s2's ledger line was lost
    assert _snapshot(store) == before  # same ids, and s2 is already in the knee fact's provenance


def test_unusable_llm_output_falls_back_to_raw_turns_and_can_be_redone() -> None:
    store = _store()
    bad = ScriptedLLM(["not json at all", '{"facts": "nope"}'])
    report = Ingestor(store, llm=bad).ingest(SESSIONS[:1], scope=U)
    assert report.raw_fallback == 1 and report.llm_calls == 2
    assert len(bad.calls) == 2 and "could not be used" in bad.calls[1].prompt  # one repair retry
    assert sorted(f.id for f in store.facts) == ["u1:s1:0", "u1:s1:2"] and all(f.type == "turn" for f in store.facts)
    ingestor = Ingestor(store, llm=_llm())
    assert ingestor.ledger.get(U, "s1").status == "raw"  # type: ignore[union-attr]
    assert ingestor.ingest(SESSIONS[:1], scope=U).skipped == 1  # not redone unless asked
    redo = Ingestor(store, llm=_llm(), redo_raw=True).ingest(SESSIONS[:1], scope=U)
    assert redo.ingested == 1
    assert sorted(f.id for f in store.facts) == ["u1:s1:f0", "u1:s1:f1"]  # raw turns replaced


def test_an_unreachable_llm_writes_nothing_and_the_session_is_retried_next_run() -> None:
    store = _store()
    down = ScriptedLLM([LLMConnectionError("refused")])
    report = Ingestor(store, llm=down).ingest(SESSIONS[:1], scope=U)
    assert report.failed and report.failed[0][:2] == ("u1", "s1") and "refused" in report.failed[0][2]
    assert len(store) == 0
    retry = Ingestor(store, llm=_llm()).ingest(SESSIONS[:1], scope=U)
    assert retry.ingested == 1 and len(store) == 2


def test_a_truncated_reply_counts_as_unusable() -> None:
    store = _store()
    llm = ScriptedLLM([json.dumps(S1_FACTS)] * 2, truncate_at=40)
    report = Ingestor(store, llm=llm).ingest(SESSIONS[:1], scope=U)
    assert report.raw_fallback == 1 and all(f.type == "turn" for f in store.facts)


# --------------------------------------------------------------------------- stores


class UpsertOnly:
    """A store with only ``upsert_facts`` (the Qdrant adapter's shape), no search."""

    def __init__(self) -> None:
        self.written: list[Fact] = []

    def upsert_facts(self, facts: Sequence[Fact]) -> list[str]:
        self.written += facts
        return [f.id for f in facts]


def test_any_store_with_upsert_facts_can_be_written() -> None:
    target = UpsertOnly()
    report = Ingestor(target, llm=_llm()).ingest(SESSIONS[:1], scope=U)
    assert report.facts_added == 2 and [f.id for f in target.written] == ["u1:s1:f0", "u1:s1:f1"]


def test_a_read_only_store_is_refused_with_what_it_lacks() -> None:
    with pytest.raises(ConfigurationError, match=r"add_facts\(facts\) or upsert_facts\(facts\)"):
        Ingestor(object())


# --------------------------------------------------------------------------- the guideline


def test_the_guideline_keeps_its_placeholders_through_edits(tmp_path: Path) -> None:
    edited = DEFAULT_GUIDELINE.edited('Remember allergies first.\nTypes:\n{types}\nJSON like {"a": 1} is left alone.')
    assert edited.version == 1 and edited.parent == 0
    rendered = edited.render()
    assert "- Identity: who the user is" in rendered and '{"a": 1}' in rendered
    with pytest.raises(GuidelineError, match=r"\{types\}"):
        DEFAULT_GUIDELINE.edited("Remember everything.")
    path = edited.save(tmp_path)
    assert path.name == "S_v001.md" and Guideline.load(path) == edited.__class__(edited.text, version=1)


# --------------------------------------------------------------------------- the command line


@pytest.fixture
def no_llm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "PGR_LLM",
        "PGR_LLM_BASE_URL",
        "PGR_LLM_MODEL",
        "PGR_LLM_API_KEY",
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
    ):
        monkeypatch.delenv(name, raising=False)


def test_pgr_ingest_jsonl_builds_a_store_that_pgr_retrieve_searches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_llm_env: None
) -> None:
    data = tmp_path / "users.jsonl"
    line = {
        "user_id": "u17",
        "sessions": [
            {
                "id": "s1",
                "date": "2025-03-02",
                "turns": [{"speaker": "user", "text": "My physio says no sudden stops until July."}],
            },
            {
                "id": "s2",
                "date": "2025-04-11",
                "turns": [{"role": "user", "content": "I work night shifts at the hospital."}],
            },
        ],
    }
    data.write_text(json.dumps(line) + "\n", encoding="utf-8")
    store = tmp_path / "u.pgr"
    args = ["ingest", "jsonl", "--data", str(data), "--out", str(store), "--embedder", "hashing", "--no-progress"]
    assert main(args) == 0
    out, _ = capsys.readouterr()
    assert "ingested 2 session(s)" in out and (tmp_path / "u.pgr.ledger.jsonl").exists()
    assert main(args) == 0
    assert "ingested 0 session(s), skipped 2 already in" in capsys.readouterr()[0]
    query = ["retrieve", "--store", str(store), "--user", "u17", "--embedder", "hashing", "--query-only", "--json"]
    assert main([*query, "what did the physio say about sudden stops?"]) == 0
    result = json.loads(capsys.readouterr()[0])
    assert result["facts"][0]["id"] == "u17:s1:0"


def test_pgr_ingest_extract_without_an_llm_says_how_to_configure_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_llm_env: None
) -> None:
    data = tmp_path / "users.jsonl"
    data.write_text(json.dumps({"user_id": "u", "sessions": [{"id": "s", "turns": [{"text": "hi"}]}]}) + "\n")
    code = main(["ingest", "jsonl", "--data", str(data), "--out", str(tmp_path / "x.pgr"), "--mode", "extract"])
    assert code == 2 and "PGR_LLM_BASE_URL" in capsys.readouterr()[1]


def test_the_write_side_docs_example_runs_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pgr_core

    section = (Path(__file__).resolve().parent.parent / "docs" / "write-side.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code, "docs/write-side.md has no python example"
    llm = ScriptedLLM([{"facts": [{"text": "The user's physio forbids sudden stops until July.", "type": "Event"}]}])
    monkeypatch.setattr(pgr_core, "OpenAICompatible", lambda **kwargs: llm)
    monkeypatch.setattr(pgr_core, "InMemoryStore", lambda: InMemoryStore(embedder=HashingEmbedder()))
    monkeypatch.chdir(tmp_path)
    exec(compile(code.group(1), "README.md", "exec"), {})
    assert capsys.readouterr().out.strip() == '1 ["The user\'s physio forbids sudden stops until July."]'
    assert (tmp_path / "store.pgr.ledger.jsonl").exists()
