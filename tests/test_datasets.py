"""One reader per data set: the evaluation and the write side read LoCoMo, PrefEval and JSON Lines alike."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pgr_core.datasets import json_objects, load_locomo, prefeval_root, read_locomo
from pgr_core.errors import InvalidArgumentError
from pgr_core.evaluation.data import load_jsonl, load_prefeval
from pgr_core.write import jsonl_sessions, locomo_sessions, prefeval_examples

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def _turn(dia_id: str, speaker: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"dia_id": dia_id, "speaker": speaker, "text": text, **extra}


def _locomo(tmp_path: Path, **conversation: Any) -> Path:
    """A one-conversation LoCoMo file; ``conversation`` overrides or adds keys of its sessions."""
    sessions: dict[str, Any] = {
        "speaker_a": "Ana",
        "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [_turn("D1:1", "Ana", "I signed up for a pottery class."), _turn("D1:2", "Ben", "Nice!")],
        "session_2": [_turn("D2:1", "Ana", "Look at my first bowl.", blip_caption="a photo of a blue bowl")],
        "session_3_date_time": "10:04 am on 2 Jun, 2023",
        "session_3": [_turn("D3:1", "Ben", "How is the class going?")],
        # a date time naming no session, as conv-26 has sixteen of
        "session_4_date_time": "9:00 am on 1 January, 2024",
    }
    sessions.update(conversation)
    qa = [{"question": "What class did Ana sign up for?", "category": 1, "evidence": ["D1:1", "D9:9"]}]
    path = tmp_path / "locomo10.json"
    path.write_text(json.dumps([{"sample_id": "c1", "conversation": sessions, "qa": qa}]), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- LoCoMo dates


def test_a_locomo_session_without_a_date_time_is_undated_and_borrows_no_neighbours_date(tmp_path: Path) -> None:
    path = _locomo(tmp_path)
    (user,) = locomo_sessions(path)
    assert [(s.id, s.date) for s in user.sessions] == [
        ("S1", datetime(2023, 5, 8, 13, 56)),
        ("S2", None),
        ("S3", datetime(2023, 6, 2, 10, 4)),
    ]
    data = load_locomo(path)
    assert {f.id: f.date for f in data.facts} == {
        "c1:D1:1": datetime(2023, 5, 8, 13, 56),
        "c1:D1:2": datetime(2023, 5, 8, 13, 56),
        "c1:D2:1": None,
        "c1:D3:1": datetime(2023, 6, 2, 10, 4),
    }
    # the question comes after the last dated session, not after a date time that names no session
    (q,) = data.questions
    assert q.date == datetime(2023, 6, 2, 10, 4)
    assert (q.evidence, q.unresolved) == (["c1:D1:1"], ["D9:9"])


def test_the_last_session_undated_keeps_the_question_after_the_last_dated_one(tmp_path: Path) -> None:
    path = _locomo(tmp_path, session_3_date_time="")
    assert read_locomo(path)[0].last_date == datetime(2023, 5, 8, 13, 56)
    assert load_locomo(path).questions[0].date == datetime(2023, 5, 8, 13, 56)


def test_an_unreadable_locomo_date_names_its_session_in_both_readers(tmp_path: Path) -> None:
    path = _locomo(tmp_path, session_3_date_time="sometime in June")
    with pytest.raises(InvalidArgumentError, match=r"c1 session_3: date time 'sometime in June'"):
        load_locomo(path)
    with pytest.raises(InvalidArgumentError, match=r"c1 session_3: date time 'sometime in June'"):
        list(locomo_sessions(path))


def test_an_iso_locomo_date_is_read(tmp_path: Path) -> None:
    (user,) = locomo_sessions(_locomo(tmp_path, session_2_date_time="2023-05-20T08:30"))
    assert user.sessions[1].date == datetime(2023, 5, 20, 8, 30)


def test_a_locomo_turn_without_its_strings_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="c1 session_3 turn 0: a LoCoMo turn needs"):
        load_locomo(_locomo(tmp_path, session_3=[{"speaker": "Ben", "text": "no id"}]))


# --------------------------------------------------------------------------- the two former parsers agree


def _agree(path: Path) -> int:
    """Assert that the evaluation's facts are the write side's turns, one for one; return how many."""
    facts = load_locomo(path).facts
    turns = [
        (f"{u.scope.user_id}:{t.id}", t.line, s.date, f"{u.scope.user_id}:{s.id}", position)
        for u in locomo_sessions(path)
        for s in u.sessions
        for position, t in enumerate(s.turns)
    ]
    assert [(f.id, f.text, f.date, f.session_id, f.position) for f in facts] == turns
    return len(turns)


def test_the_evaluation_and_the_write_side_read_the_same_locomo_turns(tmp_path: Path) -> None:
    assert _agree(_locomo(tmp_path)) == 4
    (user,) = locomo_sessions(_locomo(tmp_path))
    assert user.sessions[1].turns[0].text == "Look at my first bowl. [shares a photo of a blue bowl]"


@pytest.mark.skipif(not (SHARED / "locomo" / "locomo10.json").exists(), reason="no LoCoMo data")
def test_the_two_readers_agree_on_the_real_locomo_and_every_session_there_is_dated() -> None:
    path = SHARED / "locomo"
    assert _agree(path) == 5882
    conversations = read_locomo(path)
    assert all(s.date is not None for c in conversations for s in c.sessions)
    conv26 = next(c for c in conversations if c.sample_id == "conv-26")
    # conv-26 lists date times up to session_35 but holds 19 sessions: its questions follow session 19
    assert len(conv26.sessions) == 19 and conv26.last_date == datetime(2023, 10, 22, 9, 55)
    assert {q.date for q in load_locomo(path).questions if q.conversation == "conv-26"} == {conv26.last_date}


# --------------------------------------------------------------------------- JSON Lines


def test_json_objects_number_lines_as_the_file_does() -> None:
    lines = ['{"user_id": "u1"}\n', "\n", '{"user_id": "u2"}\n']
    assert list(json_objects(lines, "d.jsonl")) == [(1, {"user_id": "u1"}), (3, {"user_id": "u2"})]
    with pytest.raises(InvalidArgumentError, match=r"d\.jsonl line 2: expected one JSON object"):
        list(json_objects(["{}", "[1, 2]"], "d.jsonl"))


def test_both_jsonl_loaders_name_the_same_bad_line_after_a_blank_one(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"user_id": "u1", "sessions": []}\n\n{not json\n', encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="line 3: not JSON"):
        load_jsonl(path)
    with pytest.raises(InvalidArgumentError, match="line 3: not JSON"):
        list(jsonl_sessions(path))
    path.write_text('\n{"sessions": [{"id": "s1", "turns": []}]}\n', encoding="utf-8")
    with pytest.raises(InvalidArgumentError, match="line 2: missing key 'user_id'"):
        load_jsonl(path)
    with pytest.raises(InvalidArgumentError, match="line 2: expected an object with a 'user_id'"):
        list(jsonl_sessions(path))


# --------------------------------------------------------------------------- PrefEval


def test_prefeval_is_found_in_its_folder_or_its_benchmark_dataset(tmp_path: Path) -> None:
    (tmp_path / "benchmark_dataset" / "explicit_preference").mkdir(parents=True)
    assert prefeval_root(tmp_path) == tmp_path / "benchmark_dataset"
    assert prefeval_root(tmp_path / "benchmark_dataset") == tmp_path / "benchmark_dataset"


def test_both_prefeval_readers_say_the_same_thing_when_it_is_missing(tmp_path: Path) -> None:
    messages = []
    for read in (lambda: load_prefeval(tmp_path), lambda: prefeval_examples(tmp_path)):
        with pytest.raises(InvalidArgumentError) as info:
            read()
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "explicit_preference/" in messages[0] and "mcq_options/" in messages[0]
