"""Observability: the OpenTelemetry span tree and metrics of a call, content only on opt-in, the no-op
path without the package, and the progress hook."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest
from conftest import U1, SpyStore, make_store
from loopback_llm import LoopbackLLM, sane_reply

from pgr_core import PGR, InMemoryStore, InvalidArgumentError, LLMTimeoutError, OpenAICompatible
from pgr_core.observability.telemetry import CONTENT_ENV, DURATION_BUCKETS, TOKEN_BUCKETS
from pgr_core.testing import ScriptedLLM
from pgr_core.testing.faults import FaultyStore

pytest.importorskip("opentelemetry.sdk")  # the dev extra installs it (nox -s tests); the span tests read through it

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

QUERY = "Should I join a soccer league this summer?"
INTENT = "decide about a soccer league"
STEPS = ["knee physio running", "bus car"]
REVISED = ["football Sam"]
SUMMARY = "knee and money matter"


def cot_replies() -> list[Any]:
    """A CoT run: augmentation, Phase 1 (two steps), one Phase-2 round (one step), the summary."""
    return [{"intent": INTENT}, {"steps": STEPS}, {"steps": REVISED}, {"summary": SUMMARY}]


class Collected:
    """A private tracer and meter provider whose spans and metrics stay in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def pgr(self, store: Any = None, llm: Any = None, **options: Any) -> PGR:
        settings: dict[str, Any] = {"strategy": "cot", "min_score": 0.1, "delta": 3, "augment_min_score": 0.1}
        settings.update(options)
        return PGR(
            store if store is not None else make_store(),
            llm=llm if llm is not None else ScriptedLLM(cot_replies()),
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            **settings,
        )

    @property
    def spans(self) -> list[ReadableSpan]:
        """Finished spans in start order."""
        return sorted(self.exporter.get_finished_spans(), key=lambda s: s.start_time or 0)

    def root(self) -> ReadableSpan:
        (root,) = [s for s in self.spans if s.parent is None]
        return root

    def children(self) -> list[ReadableSpan]:
        root = self.root()
        kids = [s for s in self.spans if s.parent is not None]
        assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in kids)
        assert all(s.context.trace_id == root.context.trace_id for s in kids)
        return kids

    def metrics(self) -> dict[str, Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


@pytest.fixture
def otel(monkeypatch: pytest.MonkeyPatch) -> Iterator[Collected]:
    monkeypatch.delenv(CONTENT_ENV, raising=False)
    collected = Collected()
    yield collected
    collected.tracer_provider.shutdown()
    collected.meter_provider.shutdown()


def shape(spans: list[ReadableSpan]) -> list[tuple[str, Any, Any]]:
    return [(s.name, (s.attributes or {}).get("pgr.phase"), (s.attributes or {}).get("pgr.round")) for s in spans]


EXPECTED_TREE = [
    ("retrieval InMemoryStore", "augment", 0),
    ("chat", "augment", 0),
    ("chat", "initial", 1),
    ("retrieval InMemoryStore", "initial", 1),
    ("chat", "personalized", 2),
    ("retrieval InMemoryStore", "personalized", 2),
    ("chat", "summary", None),
]


def all_values(spans: list[ReadableSpan]) -> str:
    """Every attribute value, status description and event of the spans, as one text."""
    parts: list[str] = []
    for s in spans:
        parts += [s.name, s.status.description or ""]
        parts += [json.dumps(list(v)) if isinstance(v, tuple) else str(v) for v in (s.attributes or {}).values()]
        parts += [str(dict(e.attributes or {})) for e in s.events]
    return "\n".join(parts)


# ---------------------------------------------------------------- the span tree


def test_a_cot_run_gives_a_root_with_its_chat_and_retrieval_spans_in_order(otel: Collected) -> None:
    llm = ScriptedLLM(cot_replies())
    result = otel.pgr(llm=llm).retrieve(QUERY, scope=U1)
    trace = result.trace
    assert trace.stop_reason == "delta_below_threshold" and len(llm.calls) == 4

    root = otel.root()
    assert root.name == "invoke_workflow pgr.retrieve" and root.kind == SpanKind.INTERNAL
    assert root.status.status_code == StatusCode.UNSET
    assert dict(root.attributes or {}) == {
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.workflow.name": "pgr.retrieve",
        "pgr.strategy": "cot",
        "pgr.prospector": "llm-cot",
        "pgr.stop_reason": "delta_below_threshold",
        "pgr.degraded": False,
        "pgr.rounds": 3,
        "pgr.facts": len(result.facts),
        "pgr.llm_calls": 4,
        "pgr.store_calls": 3,
        "pgr.errors": 0,
        "pgr.ranking": "llm",
        "pgr.scope.keys": ("user_id",),
        "gen_ai.usage.input_tokens": trace.usage.prompt_tokens,
        "gen_ai.usage.output_tokens": trace.usage.completion_tokens,
    }

    kids = otel.children()
    assert shape(kids) == EXPECTED_TREE
    assert all(s.kind == SpanKind.CLIENT and s.status.status_code == StatusCode.UNSET for s in kids)
    assert all(root.start_time <= s.start_time and s.end_time <= root.end_time for s in kids)  # type: ignore[operator]
    assert all(a.end_time <= b.start_time for a, b in pairwise(kids))  # type: ignore[operator]  # one at a time

    chats = [s for s in kids if s.name == "chat"]
    for number, (span, call) in enumerate(zip(chats, llm.calls, strict=True), start=1):
        attrs = dict(span.attributes or {})
        phase = attrs["pgr.phase"]
        spent = trace.usage_by_phase[str(phase)]  # one call per phase in this run
        assert {k: v for k, v in attrs.items() if k not in ("pgr.phase", "pgr.round")} == {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "scripted",  # a custom LLM: the first word of its name
            "gen_ai.request.max_tokens": call.max_tokens,
            "gen_ai.output.type": "json",
            "pgr.call": number,
            "gen_ai.usage.input_tokens": spent.prompt_tokens,
            "gen_ai.usage.output_tokens": spent.completion_tokens,
            "gen_ai.response.model": "scripted",
            "gen_ai.response.finish_reasons": ("stop",),
            "pgr.usage.estimated": False,
        }
        assert "gen_ai.request.model" not in attrs  # ScriptedLLM names no model: left out, not invented

    searches = [s for s in kids if s.name.startswith("retrieval")]
    for span, rnd in zip(searches, trace.rounds, strict=True):
        assert dict(span.attributes or {}) == {
            "gen_ai.operation.name": "retrieval",
            "gen_ai.data_source.id": "InMemoryStore",
            "gen_ai.request.top_k": 100.0,  # every round reads centring_depth candidates, cut per probe after
            "pgr.phase": rnd.phase,
            "pgr.round": rnd.index,
            "pgr.probes": len(rnd.probes),
            "pgr.hits": sum(len(p.hits) for p in rnd.probes),
            "pgr.neighbours": 0,
            "pgr.new_facts": len(rnd.new_fact_ids),
        }
    # Phase 1 probes the request, its restatement q_A and the steps in one call
    assert [dict(s.attributes or {})["pgr.probes"] for s in searches] == [1, 2 + len(STEPS), len(REVISED)]
    assert dict(searches[1].attributes or {})["pgr.new_facts"] == len(trace.rounds[1].new_fact_ids) > 0


def test_the_async_api_gives_the_same_tree(otel: Collected) -> None:
    sync = otel.pgr().retrieve(QUERY, scope=U1)
    sync_root, sync_kids = otel.root(), otel.children()
    otel.exporter.clear()
    result = asyncio.run(otel.pgr().aretrieve(QUERY, scope=U1))
    assert result.ids == sync.ids
    assert otel.root().name == sync_root.name == "invoke_workflow pgr.retrieve"
    assert shape(otel.children()) == shape(sync_kids) == EXPECTED_TREE
    drop = ("gen_ai.usage", "pgr.usage")
    for a, b in zip(otel.children(), sync_kids, strict=True):
        assert {k: v for k, v in (a.attributes or {}).items() if not k.startswith(drop)} == {
            k: v for k, v in (b.attributes or {}).items() if not k.startswith(drop)
        }


def test_answer_adds_its_call_under_its_own_root(otel: Collected) -> None:
    llm = ScriptedLLM([*cot_replies(), "Join, but see the physio first."])
    answer = otel.pgr(llm=llm).answer(QUERY, scope=U1)
    assert answer.text == "Join, but see the physio first."
    root = otel.root()
    assert root.name == "invoke_workflow pgr.answer"
    assert dict(root.attributes or {})["gen_ai.workflow.name"] == "pgr.answer"
    assert dict(root.attributes or {})["pgr.llm_calls"] == 5
    assert shape(otel.children()) == [*EXPECTED_TREE, ("chat", "answer", None)]
    last = dict(otel.children()[-1].attributes or {})
    assert last["gen_ai.output.type"] == "text" and last["gen_ai.request.max_tokens"] == 500


def test_query_only_is_one_retrieval_under_its_root(otel: Collected) -> None:
    result = otel.pgr().query_only(QUERY, scope=U1, top_k=3)
    root = otel.root()
    assert root.name == "invoke_workflow pgr.query_only"
    attrs = dict(root.attributes or {})
    assert attrs["pgr.strategy"] == "query-only" and attrs["pgr.stop_reason"] == "query_only"
    assert attrs["pgr.llm_calls"] == 0 and attrs["pgr.facts"] == len(result.facts) == 3
    (search,) = otel.children()
    assert shape([search]) == [("retrieval InMemoryStore", "query_only", 0)]
    assert dict(search.attributes or {})["pgr.new_facts"] == 3


def test_a_store_names_itself_with_data_source_id(otel: Collected) -> None:
    spy = SpyStore(make_store())
    spy.data_source_id = "memories-eu"  # type: ignore[attr-defined]
    otel.pgr(store=spy).query_only(QUERY, scope=U1)
    (search,) = otel.children()
    assert search.name == "retrieval memories-eu"
    assert dict(search.attributes or {})["gen_ai.data_source.id"] == "memories-eu"


def test_an_openai_compatible_llm_gives_provider_model_and_server() -> None:
    collected = Collected()
    srv = LoopbackLLM().start()
    srv.default = sane_reply
    port = srv.port
    try:
        llm = OpenAICompatible(base_url=srv.base_url, model="qwen-test", timeout=5.0, max_retries=0)
        collected.pgr(llm=llm, strategy="tot").retrieve(QUERY, scope=U1)
    finally:
        srv.stop()
    chats = [s for s in collected.children() if s.name.startswith("chat")]
    assert chats and all(s.name == "chat qwen-test" for s in chats)
    attrs = dict(chats[0].attributes or {})
    assert attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.request.model"] == "qwen-test"
    assert attrs["gen_ai.response.model"] == "m"  # what the server said it ran
    assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", port)
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (11, 7)  # the server's counts


# ---------------------------------------------------------------- content only on opt-in


def test_no_text_reaches_a_span_without_opt_in(otel: Collected) -> None:
    llm = ScriptedLLM(cot_replies())
    result = otel.pgr(llm=llm).retrieve(QUERY, scope=U1)
    text = all_values(otel.spans)
    private = [QUERY, INTENT, *STEPS, *REVISED, SUMMARY, "u1", *(f.text for f in result.facts)]
    private += [call.prompt[:60] for call in llm.calls]
    assert [p for p in private if p in text] == []
    assert not any(
        k.startswith(("gen_ai.input", "gen_ai.output.messages", "gen_ai.retrieval."))
        for s in otel.spans
        for k in (s.attributes or {})
    )


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_opting_in_records_query_probes_facts_prompts_and_replies(
    otel: Collected, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "environment":
        monkeypatch.setenv(CONTENT_ENV, "True")
        pgr = otel.pgr()
    else:
        pgr = otel.pgr(record_content=True)
    result = pgr.retrieve(QUERY, scope=U1)
    root = dict(otel.root().attributes or {})
    assert root["pgr.query.text"] == QUERY and root["pgr.intent.text"] == INTENT and root["pgr.scope.user_id"] == "u1"
    kids = otel.children()
    first_chat = dict(kids[1].attributes or {})
    sent = json.loads(str(first_chat["gen_ai.input.messages"]))
    assert sent[0]["role"] == "user" and QUERY in sent[0]["parts"][0]["content"]
    (reply,) = json.loads(str(first_chat["gen_ai.output.messages"]))
    assert json.loads(reply["parts"][0]["content"]) == {"intent": INTENT} and reply["finish_reason"] == "stop"
    phase1 = dict(kids[3].attributes or {})
    assert str(phase1["gen_ai.retrieval.query.text"]).split("\n") == [QUERY, INTENT, *STEPS]
    documents = json.loads(str(phase1["gen_ai.retrieval.documents"]))
    found = {f.id: f.text for f in result.facts}
    assert {d["id"] for d in documents} >= set(result.trace.rounds[1].new_fact_ids)
    assert all(d["content"] == found[d["id"]] for d in documents if d["id"] in found)


# ---------------------------------------------------------------- failures and caps


def test_a_failed_llm_call_gives_error_type_and_status_error_and_the_call_still_returns(otel: Collected) -> None:
    llm = ScriptedLLM([{"intent": INTENT}, LLMTimeoutError("no answer in 3s")])
    result = otel.pgr(llm=llm).retrieve(QUERY, scope=U1)
    assert result.degraded and result.trace.stop_reason == "llm_error" and result.facts  # the query's hits stay
    kids = otel.children()
    failed = kids[2]
    assert shape([failed]) == [("chat", "initial", 1)]
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.status.description is None  # the message may quote a prompt: only on opt-in
    attrs = dict(failed.attributes or {})
    assert attrs["error.type"] == "LLMTimeoutError" and "gen_ai.usage.input_tokens" not in attrs
    assert all("error.type" not in (s.attributes or {}) for s in kids if s is not failed)
    root = dict(otel.root().attributes or {})
    assert otel.root().status.status_code == StatusCode.UNSET  # a degraded result is an answer, not a failure
    assert (root["pgr.degraded"], root["pgr.stop_reason"], root["pgr.errors"]) == (True, "llm_error", 1)
    durations = otel.metrics()["gen_ai.client.operation.duration"].data.data_points
    assert any(dict(p.attributes).get("error.type") == "LLMTimeoutError" for p in durations)


def test_a_failed_store_round_gives_error_type(otel: Collected, store: InMemoryStore) -> None:
    faulty = FaultyStore(store, "error", calls={1})  # the Phase-1 batch; the query alone after it works
    lines: list[str] = []
    result = otel.pgr(store=faulty, progress=lines.append).retrieve(QUERY, scope=U1)
    assert result.degraded and result.trace.stop_reason == "store_error"
    searches = [s for s in otel.children() if s.name.startswith("retrieval")]
    assert [dict(s.attributes or {})["pgr.phase"] for s in searches] == ["augment", "initial", "query_only"]
    assert [s.status.status_code for s in searches] == [StatusCode.UNSET, StatusCode.ERROR, StatusCode.UNSET]
    assert dict(searches[1].attributes or {})["error.type"] == "StoreError"
    assert "initial prospection: the store failed (StoreError)" in lines
    assert lines[-1].startswith("query only: 1 probe, ")  # the fallback round


def test_a_budget_hit_is_on_the_root_and_refused_calls_make_no_span(otel: Collected) -> None:
    result = otel.pgr().retrieve(QUERY, scope=U1, budget={"max_llm_calls": 2})
    assert result.trace.budget_hit == "budget_llm_calls"
    root = dict(otel.root().attributes or {})
    assert root["pgr.budget_hit"] == "budget_llm_calls" and root["pgr.budget_phase"] == "personalized"
    assert root["pgr.degraded"] is False and root["pgr.stop_reason"] == "budget_llm_calls"
    assert [name for name, _, _ in shape(otel.children())].count("chat") == 2


def test_an_exception_out_of_the_call_marks_the_root(otel: Collected) -> None:
    with pytest.raises(InvalidArgumentError):
        otel.pgr().retrieve("   ", scope=U1)
    root = otel.root()
    assert root.status.status_code == StatusCode.ERROR
    assert dict(root.attributes or {})["error.type"] == "InvalidArgumentError"
    assert otel.children() == []


# ---------------------------------------------------------------- metrics


def test_token_and_duration_histograms_follow_the_conventions(otel: Collected) -> None:
    result = otel.pgr().retrieve(QUERY, scope=U1)
    metrics = otel.metrics()
    tokens, duration = metrics["gen_ai.client.token.usage"], metrics["gen_ai.client.operation.duration"]
    assert (tokens.unit, duration.unit) == ("{token}", "s")
    points = tokens.data.data_points
    assert all(tuple(p.explicit_bounds) == TOKEN_BUCKETS for p in points)
    by = {(dict(p.attributes)["pgr.phase"], dict(p.attributes)["gen_ai.token.type"]): p for p in points}
    assert set(by) == {
        (phase, kind) for phase in ("augment", "initial", "personalized", "summary") for kind in ("input", "output")
    }
    for (phase, kind), p in by.items():
        spent = result.trace.usage_by_phase[phase]
        assert p.count == 1 and p.sum == (spent.prompt_tokens if kind == "input" else spent.completion_tokens)
        assert dict(p.attributes) == {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "scripted",
            "gen_ai.response.model": "scripted",
            "gen_ai.token.type": kind,
            "pgr.phase": phase,
        }
    seen = {
        (dict(p.attributes)["gen_ai.operation.name"], dict(p.attributes)["pgr.phase"]): p.count
        for p in duration.data.data_points
    }
    assert seen == {
        ("chat", "augment"): 1,
        ("chat", "initial"): 1,
        ("chat", "personalized"): 1,
        ("chat", "summary"): 1,
        ("retrieval", "augment"): 1,
        ("retrieval", "initial"): 1,
        ("retrieval", "personalized"): 1,
    }
    assert all(tuple(p.explicit_bounds) == DURATION_BUCKETS for p in duration.data.data_points)


# ---------------------------------------------------------------- without opentelemetry


def scripted_cot(**options: Any) -> PGR:
    """A CoT PGR over a fresh store and a fresh scripted LLM, outside any exporter."""
    return PGR(make_store(), llm=ScriptedLLM(cot_replies()), strategy="cot", min_score=0.1, **options)


def test_without_opentelemetry_everything_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    want = scripted_cot(delta=3).retrieve(QUERY, scope=U1)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # `import opentelemetry` now fails
    lines: list[str] = []
    pgr = scripted_cot(delta=3, record_content=True, progress=lines.append)
    assert pgr.telemetry.enabled is False
    got = pgr.retrieve(QUERY, scope=U1)
    assert got.ids == want.ids and got.trace.stop_reason == want.trace.stop_reason
    answer = PGR(make_store(), llm=ScriptedLLM([*cot_replies(), "ok"]), strategy="cot").answer(QUERY, scope=U1)
    assert answer.text == "ok"
    assert lines and lines[-1].startswith("summary: waiting for the LLM")  # progress needs no package


# ---------------------------------------------------------------- the progress hook


def test_progress_says_a_line_before_each_llm_call_and_after_each_store_round() -> None:
    lines: list[str] = []
    pgr = scripted_cot(delta=3, augment_min_score=0.1, progress=lines.append)
    result = pgr.retrieve(QUERY, scope=U1)
    rounds = result.trace.rounds
    assert lines == [
        f"query augmentation: 1 probe, {len(rounds[0].probes[0].hits)} hits",
        "query augmentation: waiting for the LLM (call 1)",
        "initial prospection: waiting for the LLM (call 2)",
        f"initial prospection: 4 probes, {len(rounds[1].new_fact_ids)} new facts",
        "personalisation round 1: waiting for the LLM (call 3)",
        f"personalisation round 1: 1 probe, {len(rounds[2].new_fact_ids)} new facts",
        "summary: waiting for the LLM (call 4)",
    ]
    assert len(rounds[1].new_fact_ids) > 1


def test_a_progress_callback_that_raises_does_not_break_the_call(caplog: pytest.LogCaptureFixture) -> None:
    def broken(line: str) -> None:
        raise RuntimeError("the terminal went away")

    want = scripted_cot().retrieve(QUERY, scope=U1)
    pgr = scripted_cot(progress=broken)
    with caplog.at_level(logging.WARNING, logger="pgr"):
        got = pgr.retrieve(QUERY, scope=U1)
        asynced = asyncio.run(scripted_cot(progress=broken).aretrieve(QUERY, scope=U1))
    assert got.ids == asynced.ids == want.ids and not got.degraded
    assert got.trace.usage.llm_calls == want.trace.usage.llm_calls
    warned = [r for r in caplog.records if "progress callback raised" in r.getMessage()]
    assert warned and all(r.exc_info and r.exc_info[0] is RuntimeError for r in warned)
