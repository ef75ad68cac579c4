"""Against a real OpenAI-compatible server (`nox -s llm`). Skipped with a reason when none answers.

Start one with ``../shared/tools/local-llm serve`` (Qwen2.5-Coder-1.5B on 127.0.0.1:8081) or point
PGR_LLM_BASE_URL / PGR_LLM_MODEL at another. Prints LLM calls, tokens and seconds per query.
"""

from __future__ import annotations

import json
import os
import statistics
import urllib.request

import pytest

from pgr_core import PGR, OpenAICompatible, Scope, default_embedder
from pgr_core.demo import build_store, load_history
from pgr_core.models.llm import parse_json
from pgr_core.policy.prospectors import TOT_SCHEMA

pytestmark = pytest.mark.llm

BASE_URL = os.environ.get("PGR_LLM_BASE_URL", "http://127.0.0.1:8081/v1")


@pytest.fixture(scope="module")
def llm() -> OpenAICompatible:
    try:
        urllib.request.urlopen(f"{BASE_URL}/models", timeout=3)
    except OSError as exc:
        pytest.skip(f"no OpenAI-compatible server at {BASE_URL} ({exc}); start ../shared/tools/local-llm serve")
    timeout = float(os.environ.get("PGR_LLM_TIMEOUT", "180"))
    return OpenAICompatible(base_url=BASE_URL, model=os.environ.get("PGR_LLM_MODEL", "local"), timeout=timeout)


@pytest.fixture(scope="module")
def demo_store():
    return build_store(default_embedder())


def test_structured_output_works_in_auto_mode(llm: OpenAICompatible) -> None:
    messages = [{"role": "user", "content": 'Give two next steps for planning a picnic, as JSON {"nodes": [...]}.'}]
    completion = llm.complete(messages, schema=TOT_SCHEMA, max_tokens=200)
    reply = parse_json(completion.text, {"type": "object", "required": ["nodes"]})
    assert isinstance(reply["nodes"], list)
    assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
    print(f"\nstructured mode in use: {llm.structured}")


@pytest.mark.parametrize("strategy", ["tot", "cot"])
def test_prospection_on_the_demo(llm: OpenAICompatible, demo_store, strategy: str) -> None:
    history = load_history()
    scope = Scope(user_id=history["person"]["user_id"])
    pgr = PGR(demo_store, llm=llm, strategy=strategy)
    rows = []
    questions = history["questions"] if strategy == "tot" else history["questions"][:1]
    for q in questions:
        result = pgr.retrieve(q["query"], scope=scope, date=q["date"])
        baseline = pgr.query_only(q["query"], scope=scope, date=q["date"])
        trace = result.trace
        assert trace.usage.llm_calls >= 1
        assert set(baseline.ids) <= set(result.ids)  # the query's own top 20 are always in R*
        if not result.degraded:
            assert trace.steps and result.summary
            assert trace.stop_reason in ("delta_below_threshold", "max_rounds", "no_new_probes")
        relevant = set(q["relevant"])
        rows.append(
            {
                "query": q["query"],
                "llm_calls": trace.usage.llm_calls,
                "prompt_tokens": trace.usage.prompt_tokens,
                "completion_tokens": trace.usage.completion_tokens,
                "seconds": round(trace.seconds, 1),
                "rounds": len(trace.rounds),
                "facts": len(result.facts),
                "relevant_found": len(relevant & set(result.ids)),
                "relevant_query_only": len(relevant & set(baseline.ids)),
                "degraded": result.degraded,
                "unusable_outputs": trace.unusable_outputs,
                "dropped_probes": trace.dropped_probes,
            }
        )
    print(f"\n[{strategy}] " + json.dumps(rows, indent=1))
    print(
        f"[{strategy}] mean per query: {statistics.fmean(r['llm_calls'] for r in rows):.1f} LLM calls, "
        f"{statistics.fmean(r['prompt_tokens'] + r['completion_tokens'] for r in rows):.0f} tokens, "
        f"{statistics.fmean(r['seconds'] for r in rows):.1f} s"
    )


def test_answer_comes_back_with_its_facts(llm: OpenAICompatible, demo_store) -> None:
    q = load_history()["questions"][0]
    answer = PGR(demo_store, llm=llm, strategy="cot", max_rounds=1).answer(
        q["query"], scope=Scope(user_id="maya"), date=q["date"]
    )
    assert answer.facts
    assert answer.text or answer.degraded
    print(f"\nanswer ({answer.retrieval.trace.usage.llm_calls} calls): {answer.text[:400]}")
