"""RecordedLLM: replies keyed by exactly what was asked, replayed without a model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgr_core.errors import InvalidArgumentError, LLMError
from pgr_core.models.recorded import RecordedLLM, request_key

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


def test_a_run_replayed_from_its_recorded_replies_reproduces_its_records(tmp_path: Path) -> None:
    from pgr_core import HashingEmbedder, InMemoryStore
    from pgr_core.evaluation import run_eval
    from pgr_core.evaluation.data import load_jsonl
    from pgr_core.testing import ScriptedLLM

    data_file = tmp_path / "d.jsonl"
    user = {
        "user_id": "u1",
        "facts": [
            {"id": "f1", "text": "Twisted my knee skiing in February", "date": "2025-02-10"},
            {"id": "f2", "text": "Sold the car in January", "date": "2025-01-05"},
            {"id": "f3", "text": "Evening class on Tuesdays and Thursdays", "date": "2025-03-01"},
        ],
        "queries": [
            {
                "id": "q1",
                "query": "Should I join a soccer league?",
                "date": "2025-05-01",
                "references": [{"text": "knee", "fact_ids": ["f1"]}, {"text": "class", "fact_ids": ["f3"]}],
            }
        ],
    }
    data_file.write_text(json.dumps(user) + "\n")
    data = load_jsonl(data_file)
    store = InMemoryStore(embedder=HashingEmbedder())
    store.add_facts(data.facts)
    replies: dict[str, str] = {}

    def handler(messages, schema):  # type: ignore[no-untyped-def]
        props = (schema or {}).get("properties", {})
        reply = (
            {"intent": "join a soccer league"}
            if "intent" in props
            else {"steps": [{"action": "ask the physio about my knee", "dimension": "health"}]}
            if "steps" in props
            else {"summary": "the knee matters"}
        )
        return reply

    class Recording(ScriptedLLM):
        def complete(self, messages, **kw):  # type: ignore[no-untyped-def]
            done = super().complete(messages, **kw)
            replies[request_key(messages, kw.get("schema"), kw.get("max_tokens", 512), kw.get("temperature", 0.0))] = (
                done.text
            )
            return done

    live = run_eval(data, ["pgr-cot"], store, llm=Recording(handler=handler))
    replayed = run_eval(data, ["pgr-cot"], store, llm=RecordedLLM(replies))
    ids = [r["ids"] for r in live if r["method"] == "pgr-cot"]
    assert ids and ids == [r["ids"] for r in replayed if r["method"] == "pgr-cot"]
    assert not any(r.get("degraded") for r in replayed)
    # a recording missing one reply degrades the question instead of answering from another prompt's reply
    short = RecordedLLM(dict(list(replies.items())[:-1]))
    assert all(r["degraded"] for r in run_eval(data, ["pgr-cot"], store, llm=short) if r["method"] == "pgr-cot")
