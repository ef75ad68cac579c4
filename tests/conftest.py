from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from loopback_llm import LoopbackLLM, sane_reply

from pgr_core import Fact, HashingEmbedder, Hit, InMemoryStore, Scope, SearchParams, Store
from pgr_core.observability.trace import FoundFact, Step
from pgr_core.policy.prospectors import Prospection, Prospector

U1 = Scope(user_id="u1")
U2 = Scope(user_id="u2")

# One user's memories: turns of two sessions, words chosen so the hashing embedder links each probe
# below to exactly the facts that share its words.
TURNS = {
    "s1": [
        "I hurt my knee playing basketball in March",
        "the physio said no running for two months",
        "weeknights are busy with evening classes",
        "I sold my car and ride the bus now",
    ],
    "s2": [
        "rent went up so money is tight this year",
        "my coworker Sam plays football on Sundays",
        "I hate waking up early on weekends",
        "we watched the football final on television",
    ],
}


def make_store(embedder: Any = None) -> InMemoryStore:
    store = InMemoryStore(embedder=embedder or HashingEmbedder())
    facts = []
    for month, (session, turns) in enumerate(TURNS.items(), start=1):
        for i, text in enumerate(turns):
            facts.append(
                Fact(
                    id=f"{session}:{i}",
                    text=text,
                    scope=U1,
                    date=datetime(2025, month, 10),
                    session_id=session,
                    position=i,
                )
            )
    # another user's facts use the very same words: any leak would show up
    facts += [Fact(id=f"other:{i}", text=f.text, scope=U2, date=f.date) for i, f in enumerate(list(facts))]
    store.add_facts(facts)
    return store


class SpyStore(Store):
    """Wraps a store and records every call (probes, scope, params)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.embedder = getattr(inner, "embedder", None)
        self.calls: list[tuple[list[str], Scope, SearchParams]] = []

    # searches only: InMemoryStore's other abilities are its inner's, not this wrapper's
    capabilities = replace(
        InMemoryStore.capabilities, writable=False, window=False, lists=False, vectors=False, by_id=False, deletes=False
    )

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        self.calls.append((list(probes), scope, params))
        return self.inner.search_batch(probes, scope=scope, params=params)


class ScriptedProspector(Prospector):
    """Steps from a script: ``rounds[i]`` is the list of step texts for round i (Phase 1 is round 0)."""

    name = "scripted"

    def __init__(self, rounds: list[list[str]]) -> None:
        self.rounds = rounds
        self.seen_new: list[list[str]] = []
        self.calls = 0

    def _next(self, p: Prospection) -> list[Step]:
        texts = self.rounds[self.calls] if self.calls < len(self.rounds) else []
        self.calls += 1
        return [Step(id=f"r{p.round}.{i}", text=t, round=p.round) for i, t in enumerate(texts)]

    def initial(self, p: Prospection):  # type: ignore[override]
        return self._next(p)
        yield

    def revise(self, p: Prospection, new: list[FoundFact]):  # type: ignore[override]
        self.seen_new.append([f.id for f in new])
        return self._next(p)
        yield


@pytest.fixture
def store() -> InMemoryStore:
    return make_store()


@pytest.fixture
def spy(store: InMemoryStore) -> SpyStore:
    return SpyStore(store)


@pytest.fixture
def server() -> Iterator[LoopbackLLM]:
    """A loopback OpenAI-compatible server answering sanely unless a test queues otherwise."""
    srv = LoopbackLLM().start()
    srv.default = sane_reply
    try:
        yield srv
    finally:
        srv.stop()
