"""Probe hygiene when its embedder fails: it compares by word overlap instead, and the trace says so."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from conftest import U1, ScriptedProspector, SpyStore, make_store

from pgr_core import PGR, HashingEmbedder
from pgr_core.observability.trace import Round, Step
from pgr_core.policy.hygiene import Hygiene, clean_steps

QUERY = "Should I join a soccer league this summer?"


class Failing:
    """An embedder that is down."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        raise RuntimeError("embedding server down")


def _steps(*texts: str) -> list[Step]:
    return [Step(id=f"s{i}", text=t, round=1) for i, t in enumerate(texts)]


def test_a_failed_embedder_falls_back_to_word_overlap_and_the_round_records_why() -> None:
    rnd = Round(index=1, phase="revision")
    steps = _steps("knee physio appointment", "knee physio appointment!", "evening classes on weeknights")
    kept, dropped = clean_steps(steps, query=QUERY, earlier=[], rules=Hygiene(), embedder=Failing(), into=rnd)
    assert [s.text for s in kept] == ["knee physio appointment", "evening classes on weeknights"]
    assert [(d.text, d.reason) for d in dropped] == [("knee physio appointment!", "duplicate")]  # by Jaccard
    assert rnd.hygiene_fallback == "RuntimeError: embedding server down"

    fine = Round(index=1, phase="revision")
    clean_steps(_steps("knee physio"), query=QUERY, earlier=[], rules=Hygiene(), embedder=HashingEmbedder(), into=fine)
    assert fine.hygiene_fallback is None


def test_pgr_records_hygiene_falling_back_in_the_trace_and_keeps_going() -> None:
    spy = SpyStore(make_store())
    spy.embedder = Failing()  # type: ignore[assignment]  # hygiene's embedder; the inner store searches with its own
    prospector = ScriptedProspector([["knee physio", "knee physio!", "evening classes"]])
    result = PGR(spy, strategy=prospector, delta=100, min_score=0.1).retrieve(QUERY, scope=U1)
    first = result.trace.rounds[0]
    assert first.hygiene_fallback == "RuntimeError: embedding server down"
    assert [d.reason for d in first.dropped] == ["duplicate"] and result.facts and not result.degraded
    assert result.trace.to_dict()["rounds"][0]["hygiene_fallback"] == "RuntimeError: embedding server down"
