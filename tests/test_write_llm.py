"""The write side against a real OpenAI-compatible server (`nox -s llm`); skipped with a reason when none
answers. Runs extraction on one PrefEval history and 1-2 guideline induction steps on a tiny PrefEval
split, printing the validation score of every step (set PGR_INDUCTION_STEPS, default 1)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

from pgr_core import HashingEmbedder, InMemoryStore, OpenAICompatible, Scope
from pgr_core.write import FACT_TYPES, Ingestor
from pgr_core.write.examples import prefeval_examples
from pgr_core.write.induction import InductionConfig, induce

pytestmark = pytest.mark.llm

BASE_URL = os.environ.get("PGR_LLM_BASE_URL", "http://127.0.0.1:8081/v1")
PREFEVAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "prefeval"


@pytest.fixture(scope="module")
def llm() -> OpenAICompatible:
    try:
        urllib.request.urlopen(f"{BASE_URL}/models", timeout=3)
    except OSError as exc:
        pytest.skip(f"no OpenAI-compatible server at {BASE_URL} ({exc}); start ../shared/tools/local-llm serve")
    if not PREFEVAL.exists():
        pytest.skip(f"no PrefEval data at {PREFEVAL}")
    timeout = float(os.environ.get("PGR_LLM_TIMEOUT", "180"))
    return OpenAICompatible(base_url=BASE_URL, model=os.environ.get("PGR_LLM_MODEL", "local"), timeout=timeout)


def test_extraction_writes_typed_facts_from_a_prefeval_history(llm: OpenAICompatible) -> None:
    train, _ = prefeval_examples(PREFEVAL, train=1, val=0)
    store = InMemoryStore(embedder=HashingEmbedder())
    report = Ingestor(store, llm=llm).ingest(train[0].sessions, scope=Scope(user_id="p"))
    print(f"\n{report.to_dict()}\n" + "\n".join(f"  [{f.type}] {f.text}" for f in store.facts))
    assert report.ingested == 1
    if not report.raw_fallback:
        assert all(f.type in FACT_TYPES and f.metadata["sessions"] == ["pref"] for f in store.facts)


def test_guideline_induction_steps_on_a_tiny_prefeval_split(llm: OpenAICompatible, tmp_path: Path) -> None:
    steps = int(os.environ.get("PGR_INDUCTION_STEPS", "1"))
    train, val = prefeval_examples(PREFEVAL, train=4, val=3, seed=0)
    config = InductionConfig(steps=steps, batch_size=2, candidates=1, rollouts=2, top_k=5)
    result = induce(train, val, llm=llm, config=config, out_dir=tmp_path, embedder=HashingEmbedder(), log=print)
    rows = [
        {k: h.get(k) for k in ("step", "version", "train_score", "val_score", "accepted", "reason", "llm_calls")}
        for h in result.history
    ]
    print("\nper step: " + json.dumps(rows, indent=1))
    print(f"best: S v{result.best.version} {result.best_score:.3f}\n{result.best.text}")
    assert result.history[0]["step"] == 0 and len({h["step"] for h in result.history}) == steps + 1
    assert "{types}" in result.best.text and (tmp_path / "history.json").exists()
