"""The evaluation harness against a real OpenAI-compatible server (`nox -s llm`): PGR-CoT on three
LoCoMo questions, billed and cached, and the LLM judge on a hand-made case. Skipped with a reason when
no server answers or LoCoMo is absent."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest

from pgr_core import InMemoryStore, OpenAICompatible, default_embedder
from pgr_core.evaluation import CachedLLM, judged_recall, load_locomo_set, run_eval, summarise

pytestmark = pytest.mark.llm

BASE_URL = os.environ.get("PGR_LLM_BASE_URL", "http://127.0.0.1:8081/v1")
LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo"


@pytest.fixture(scope="module")
def llm() -> OpenAICompatible:
    try:
        urllib.request.urlopen(f"{BASE_URL}/models", timeout=3)
    except OSError as exc:
        pytest.skip(f"no OpenAI-compatible server at {BASE_URL} ({exc}); start ../shared/tools/local-llm serve")
    timeout = float(os.environ.get("PGR_LLM_TIMEOUT", "180"))
    return OpenAICompatible(base_url=BASE_URL, model=os.environ.get("PGR_LLM_MODEL", "local"), timeout=timeout)


@pytest.mark.skipif(not LOCOMO.exists(), reason="LoCoMo not found at ../shared/data/locomo")
def test_pgr_cot_on_locomo_is_billed_and_replayed_from_the_cache(llm: OpenAICompatible, tmp_path: Path) -> None:
    data = load_locomo_set(LOCOMO).select(every=400)
    store = InMemoryStore(embedder=default_embedder())
    store.add_facts(data.facts)
    cached = CachedLLM(llm, tmp_path / "cache")
    rows = run_eval(data, ["query-only", "pgr-cot"], store, llm=cached, records=tmp_path / "r.jsonl")
    report = summarise(data, rows, ["query-only", "pgr-cot"])
    cot = report["methods"]["pgr-cot"]
    print(f"\n{len(data.questions)} questions: {cot}")
    assert cot["questions"] == len(data.questions) and cot["llm_calls"] >= 1 and cot["tokens"] > 0
    asked = cached.stats.misses
    again = CachedLLM(llm, tmp_path / "cache")
    rows2 = run_eval(data, ["pgr-cot"], store, llm=again)  # no records file: everything is re-run
    assert again.stats.misses == 0 and again.stats.hits >= asked  # ... from the cache alone
    assert [r["ids"] for r in rows2 if r["method"] == "pgr-cot"] == [r["ids"] for r in rows if r["method"] == "pgr-cot"]


def test_the_judge_finds_a_stated_fact_and_misses_an_absent_one(llm: OpenAICompatible) -> None:
    verdict = judged_recall(
        llm,
        "Should I join a soccer league this summer?",
        ["The user injured their knee in March", "The user owns a boat"],
        ["I hurt my knee badly in March and the physio says no running for two months", "I sold my car"],
    )
    print(f"\njudge: {verdict}")
    assert verdict.error is None, verdict.error
    assert verdict.found[0] is True
