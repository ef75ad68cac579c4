"""RecordedLLM: replies keyed by exactly what was asked, replayed without a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgr_core.errors import InvalidArgumentError, LLMError
from pgr_core.recorded import RecordedLLM, request_key

ASK = [{"role": "user", "content": "Restate: should I join a soccer league?"}]
SCHEMA = {"type": "object", "properties": {"intent": {"type": "string"}}, "required": ["intent"]}


def test_a_recorded_reply_answers_only_the_request_it_was_written_for(tmp_path: Path) -> None:
    key = request_key(ASK, SCHEMA, 160, 0.0)
    # llm-relay's layout: answers/<key>.json holding {"content": ...}
    (tmp_path / "answers").mkdir()
    (tmp_path / "answers" / f"{key}.json").write_text(json.dumps({"content": '{"intent": "play soccer"}'}))
    llm = RecordedLLM.from_path(tmp_path, name="capable")
    assert json.loads(llm.complete(ASK, schema=SCHEMA, max_tokens=160).text) == {"intent": "play soccer"}
    # the same words under another max_tokens, schema or temperature are another request
    for kw in (
        {"schema": SCHEMA, "max_tokens": 200},
        {"max_tokens": 160},
        {"schema": SCHEMA, "max_tokens": 160, "temperature": 0.7},
    ):
        with pytest.raises(LLMError, match="no recorded reply"):
            llm.complete(ASK, **kw)  # type: ignore[arg-type]
    # a JSON file {key: reply} works the same
    (tmp_path / "r.json").write_text(json.dumps({key: "plain"}))
    assert RecordedLLM.from_path(tmp_path / "r.json").complete(ASK, schema=SCHEMA, max_tokens=160).text == "plain"


def test_recorded_replies_are_checked_on_load(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="no recorded replies"):
        RecordedLLM.from_path(tmp_path / "missing")
    with pytest.raises(InvalidArgumentError, match="bad entries"):
        RecordedLLM({"k": {"intent": "x"}})  # type: ignore[dict-item]


def test_the_key_is_llm_relays() -> None:
    # llm-relay (../shared/tools/llm-relay) hashes the body's messages, schema, max_tokens and temperature
    # as sorted, compact JSON; this pins one key so a change to either side shows
    # (the key below is what llm-relay's own request_key gives for this request's body)
    assert request_key(ASK, SCHEMA, 160, 0.0) == "a4d18e20ad0772b4832be8317a0fe5bd"
    assert len(request_key(ASK, None, 160, 0.0)) == 32
