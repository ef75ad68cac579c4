"""The evaluation's LlamaIndex baselines over a pgr store: HyDE ranks by the mean embedding of the
hypothetical answer and the question; QueryFusion fuses the question's and the LLM's queries."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("llama_index.core", reason="needs the llamaindex extra: pip install 'pgr[llamaindex]'")

from conftest import U1, U2, make_store

from pgr_core.errors import LLMConnectionError
from pgr_core.evaluation import EvalQuestion, make_method
from pgr_core.testing import ScriptedLLM


def _question(text: str, scope=U1) -> EvalQuestion:  # type: ignore[no-untyped-def]
    return EvalQuestion(id="q", question=text, scope=scope, gold=["s1:3"])


def test_hyde_ranks_by_the_mean_of_the_two_embeddings() -> None:
    store = make_store()
    llm = ScriptedLLM(["I sold my car last year and now I take the bus to work"])
    out = make_method("hyde", store, llm=llm).run(_question("how do I get to the match"))
    # the same ranking computed directly: cosine to the normalised mean of both vectors, this user only
    vecs = store.embedder.embed(["I sold my car last year and now I take the bus to work", "how do I get to the match"])
    mean = vecs.mean(axis=0)
    mean /= np.linalg.norm(mean)
    mine = [f for f in store.facts if f.scope == U1]
    scores = store.embedder.embed([f.text for f in mine]) @ mean
    expected = [mine[i].id for i in np.argsort(-scores, kind="stable") if scores[i] > 0]
    assert out.ids[:5] == expected[:5]
    assert out.llm_calls == 1 and out.store_calls == 1 and not out.degraded
    assert "how do I get to the match" in llm.calls[0].prompt
    assert all(i.startswith("s") for i in out.ids)  # never the other user's copies of the same texts


def test_hyde_falls_back_to_the_question_when_the_llm_fails() -> None:
    out = make_method("hyde", make_store(), llm=ScriptedLLM([LLMConnectionError("down")])).run(
        _question("sold my car bus")
    )
    assert out.degraded and out.ids[0] == "s1:3" and "LLMConnectionError" in out.extra["error"]


def test_query_fusion_probes_each_generated_query_and_fuses() -> None:
    store = make_store()
    llm = ScriptedLLM(["knee physio running\nsold car bus\nrent money tight"])
    out = make_method("query-fusion", store, llm=llm).run(_question("should I join a football team", scope=U1))
    assert out.llm_calls == 1 and out.store_calls == 4  # the question and three generated queries
    assert {"s1:0", "s1:3", "s2:0"} <= set(out.ids) and all(i.startswith("s") for i in out.ids)
    assert "should I join a football team" in llm.calls[0].prompt


def test_query_fusion_window_brings_neighbours_after_each_hit() -> None:
    store = make_store()
    out = make_method("query-fusion+w1", store, llm=ScriptedLLM(["sold car bus"])).run(_question("sold my car"))
    first = out.ids.index("s1:3")
    assert out.ids[first + 1] == "s1:2"  # the turn before it in the same session
    other = make_method("query-fusion", store, llm=ScriptedLLM([LLMConnectionError("down")])).run(
        _question("sold my car", scope=U2)
    )
    assert other.degraded and other.ids and all(i.startswith("other:") for i in other.ids)
