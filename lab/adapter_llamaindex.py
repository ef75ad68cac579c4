"""PGR over a LlamaIndex VectorStoreIndex through RetrieverStore: calls and wall time per round.

    python lab/adapter_llamaindex.py [--facts 10000] [--users 10] [--queries 20] [--window 0]
                                            [--modes sync,async,sync-batch]
                                            [--vectors-cache FILE.npy] [--hygiene-embedder]

Builds a VectorStoreIndex (SimpleVectorStore, the default docstore) of synthetic facts: templates x
names x places x topics, spread over users, in sessions of ordered turns linked by PREVIOUS/NEXT.
Facts are embedded with MiniLM in batches up front and handed to LlamaIndex with their embeddings, so
the index does not embed them again. Then PGR (feedback strategy, no LLM) runs each query with its user's
scope, in up to three modes: ``sync`` (``retrieve``: one ``retrieve`` call per probe, in turn, each
embedding its probe), ``async`` (``aretrieve``: the probes of a round run concurrently) and
``sync-batch`` (``batch_embed=True``: one embedding call per round, then one ``retrieve`` per probe
with its vector). The script prints, per PGR round, the pgr store calls, the
LlamaIndex retriever calls and docstore look-ups, and wall times. Figures only; nothing is asserted.

Each mode starts with an empty embedding cache: no mode profits from another one's probe embeddings.
Probe hygiene compares probes by their words unless ``--hygiene-embedder`` (MiniLM: slower per query,
and outside the rounds' timings). ``--vectors-cache`` keeps the fact embeddings between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

import numpy as np
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.llms.mock import MockLLM
from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode
from pgr_adapters.llamaindex import MiniLMEmbedding, RetrieverStore

from pgr_core import PGR, MiniLMEmbedder, Scope
from pgr_core.types import Hit, SearchParams

NAMES = """Sam Priya Jonas Mei Tariq Olga Diego Hannah Kofi Lena Marco Aisha Tom Yuki Ravi Chloe Ben Fatima Luca
Ingrid Omar Sofia Kenji Nadia Pavel Grace Hugo Amara Felix Zoe Ahmed Clara Ivan Maya Noah Elif Sean Rosa Theo""".split()
PLACES = """the gym|the office|the park|the library|the pool|the climbing wall|the market|the clinic|the station|
the community centre|the bakery|the football pitch|the allotment|the cinema|the college|the bike shop|
the dentist|the yoga studio|the pub quiz|the riverside path""".replace("\n", "").split("|")
TOPICS = [
    "a twisted knee that still aches on stairs",
    "a peanut allergy that needs an epipen",
    "the rent going up by a hundred pounds",
    "saving for a deposit on a flat",
    "evening classes on Tuesdays and Thursdays",
    "selling the car and relying on the bus",
    "a new puppy that cannot be left alone",
    "night shifts every other week",
    "learning Spanish before a trip to Seville",
    "a promise to help a sister move house",
    "training for a 10k charity run",
    "hating early mornings at the weekend",
    "a tight budget until the next payday",
    "a bad back after lifting boxes",
    "volunteering at the food bank on Saturdays",
    "a wedding to attend in August",
    "a vegetarian diet with no mushrooms",
    "a fear of deep water",
    "a broken bike waiting for a new chain",
    "a dentist appointment that keeps moving",
    "a gym membership that renews in June",
    "migraines triggered by bright lights",
    "a night course in bookkeeping",
    "sharing a flat with two noisy students",
    "a grandmother who needs visits on Sundays",
    "a knee brace the physio recommended",
    "a season ticket for the football club",
    "a sourdough starter that needs feeding daily",
    "a loan repayment due at the end of the month",
    "a half-finished online coding course",
]
TEMPLATES = [
    "I told {name} at {place} about {topic}",
    "{name} and I talked about {topic} on the way to {place}",
    "Since March I have been dealing with {topic}",
    "At {place} I kept thinking about {topic}",
    "{name} asked me how I was coping with {topic}",
    "My plans for {place} depend on {topic}",
    "I wrote in my diary about {topic} after seeing {name}",
    "Remind me that {topic} matters when {name} suggests {place}",
    "{name} offered to drive me to {place} because of {topic}",
    "Last week at {place} I mentioned {topic}",
]
QUERIES = [
    "Should I join a five-a-side football league this summer?",
    "Can I host a dinner party next Saturday?",
    "Is it a good idea to sign up for a marathon in autumn?",
    "Should I take a weekend trip to the coast?",
    "Could I start a new evening course in September?",
    "Should I adopt a cat this year?",
    "Can I afford a new laptop this month?",
    "Is it worth buying a bike for commuting?",
    "Should I go on a ski holiday in February?",
    "Can I help my friend paint their flat on Sunday?",
    "Should I try a swimming class?",
    "Is it sensible to take on a second job?",
    "Should I book a concert for next Friday night?",
    "Can I join the office hiking trip?",
    "Should I move to a bigger flat?",
    "Is now a good time to learn to drive?",
    "Should I go to my cousin's wedding abroad?",
    "Could I volunteer more at weekends?",
    "Should I take up rock climbing?",
    "Can I cook a big family lunch on Sunday?",
]


def synthetic_nodes(n: int, users: int, turns_per_session: int, seed: int = 0) -> list[TextNode]:
    rng = random.Random(seed)
    start = datetime(2024, 1, 1)
    nodes: list[TextNode] = []
    seen: set[str] = set()
    while len(nodes) < n:
        i = len(nodes)
        text = rng.choice(TEMPLATES).format(name=rng.choice(NAMES), place=rng.choice(PLACES), topic=rng.choice(TOPICS))
        if text in seen:  # keep texts unique: a repeat is nudged with a time marker
            text = f"{text} ({rng.choice(['again', 'once more', 'that evening', 'that morning', 'today'])})"
            if text in seen:
                continue
        seen.add(text)
        session = i // turns_per_session
        metadata = {
            "user_id": f"user{session % users}",
            "date": (start + timedelta(days=session % 500, minutes=i % turns_per_session)).isoformat(),
            "type": "turn",
            "session_id": f"s{session}",
            "position": i % turns_per_session,
        }
        nodes.append(
            TextNode(
                id_=f"f{i}",
                text=text,
                metadata=metadata,
                excluded_embed_metadata_keys=list(metadata),
                excluded_llm_metadata_keys=list(metadata),
            )
        )
    for a, b in pairwise(nodes):
        if a.metadata["session_id"] == b.metadata["session_id"]:
            a.relationships[NodeRelationship.NEXT] = RelatedNodeInfo(node_id=b.node_id)
            b.relationships[NodeRelationship.PREVIOUS] = RelatedNodeInfo(node_id=a.node_id)
    return nodes


def embed_facts(embedder: MiniLMEmbedder, texts: list[str], cache: str | None) -> tuple[np.ndarray, bool]:
    """MiniLM in batches with progress on stderr; kept in ``cache`` (a .npy file) when given."""
    if cache and os.path.exists(cache):
        vectors = np.load(cache)
        if vectors.shape == (len(texts), embedder.dim):
            return vectors, True
    t0, batch, parts = time.perf_counter(), 512, []
    for start in range(0, len(texts), batch):
        parts.append(embedder.embed(texts[start : start + batch]))
        done = min(start + batch, len(texts))
        rate = done / (time.perf_counter() - t0)
        print(f"\rembedded {done}/{len(texts)} facts ({rate:.0f}/s)", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    vectors = np.concatenate(parts)
    if cache:
        np.save(cache, vectors)
    return vectors, False


class CountingStore(RetrieverStore):
    """RetrieverStore recording, per pgr store call: probes, retriever calls, docstore look-ups, seconds."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[int, int, int, int, float]] = []

    def _counters(self) -> tuple[int, int, int]:
        return self.retriever_calls, self.neighbour_lookups, self.embed_batches

    def _record(self, probes: Sequence[str], before: tuple[int, int, int], started: float) -> None:
        deltas = [now - then for now, then in zip(self._counters(), before, strict=True)]
        self.log.append((len(probes), *deltas, time.perf_counter() - started))

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        before, started = self._counters(), time.perf_counter()
        try:
            return super().search_batch(probes, scope=scope, params=params)
        finally:
            self._record(probes, before, started)

    async def asearch_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        before, started = self._counters(), time.perf_counter()
        try:
            return await super().asearch_batch(probes, scope=scope, params=params)
        finally:
            self._record(probes, before, started)


def run(pgr: PGR, store: CountingStore, queries: list[tuple[str, Scope]], mode: str) -> dict[str, float]:
    store.log.clear()
    rounds, round_seconds, query_seconds, facts = 0, [], [], []
    for query, scope in queries:
        t0 = time.perf_counter()
        if mode == "async":
            result = asyncio.run(pgr.aretrieve(query, scope=scope))
        else:
            result = pgr.retrieve(query, scope=scope)
        query_seconds.append(time.perf_counter() - t0)
        rounds += len(result.trace.rounds)
        round_seconds += [r.prospect_seconds + r.search_seconds for r in result.trace.rounds]
        facts.append(len(result.facts))
        assert not result.degraded, result.trace.errors
    calls = store.log
    return {
        "queries": len(queries),
        "rounds": rounds,
        "store_calls": len(calls),
        "store_calls_per_round": len(calls) / rounds,
        "probes_per_round": sum(c[0] for c in calls) / rounds,
        "retriever_calls_per_round": sum(c[1] for c in calls) / rounds,
        "max_retriever_calls_in_a_round": max(c[1] for c in calls),
        "docstore_lookups_per_round": sum(c[2] for c in calls) / rounds,
        "embed_batches_per_round": sum(c[3] for c in calls) / rounds,
        "ms_per_store_call": 1000 * statistics.mean(c[4] for c in calls),
        "ms_per_retriever_call": 1000 * sum(c[4] for c in calls) / max(1, sum(c[1] for c in calls)),
        "ms_per_round": 1000 * statistics.mean(round_seconds),
        "s_per_query": statistics.mean(query_seconds),
        "facts_per_query": statistics.mean(facts),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--facts", type=int, default=10_000)
    ap.add_argument("--users", type=int, default=10)
    ap.add_argument("--turns", type=int, default=10, help="turns per session (PREVIOUS/NEXT chains)")
    ap.add_argument("--queries", type=int, default=len(QUERIES))
    ap.add_argument("--window", type=int, default=0, help="temporal window w (neighbours via the docstore)")
    ap.add_argument("--modes", default="sync,async,sync-batch", help="any of sync, async, sync-batch")
    ap.add_argument("--vectors-cache", default=None, help="a .npy file keeping the fact embeddings between runs")
    ap.add_argument("--hygiene-embedder", action="store_true", help="probe hygiene compares MiniLM embeddings")
    args = ap.parse_args()

    embedder = MiniLMEmbedder(cache_size=2 * args.facts)
    embed_model = MiniLMEmbedding(embedder, embed_batch_size=256)
    Settings.embed_model, Settings.llm = embed_model, MockLLM()  # nothing reaches for OpenAI

    nodes = synthetic_nodes(args.facts, args.users, args.turns)
    t0 = time.perf_counter()
    vectors, from_cache = embed_facts(embedder, [n.text for n in nodes], args.vectors_cache)
    for node, vector in zip(nodes, vectors, strict=True):
        node.embedding = vector.tolist()
    embed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = VectorStoreIndex(nodes, embed_model=embed_model)  # embeddings given: nothing re-embedded
    index_s = time.perf_counter() - t0
    print(f"indexed in {index_s:.1f}s", file=sys.stderr)

    store = CountingStore(index, cosine_scores=True, dates=True, embedder=embedder if args.hygiene_embedder else None)
    pgr = PGR(store, strategy="feedback", window=args.window)
    queries = [(q, Scope(user_id=f"user{i % args.users}")) for i, q in enumerate(QUERIES[: args.queries])]

    print(f"LlamaIndex VectorStoreIndex (SimpleVectorStore) via RetrieverStore: {args.facts} facts, {args.users} users")
    cached = " (read from --vectors-cache)" if from_cache else ""
    print(f"MiniLM embedding {embed_s:.1f}s{cached}, index build {index_s:.1f}s")
    print(f"PGR strategy=feedback, window={args.window}, {len(queries)} queries, each scoped to its user\n")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - {"sync", "async", "sync-batch"}
    if unknown:
        ap.error(f"unknown mode(s) {sorted(unknown)}")
    results = {}
    for mode in modes:
        print(f"running {mode}...", file=sys.stderr)
        embedder._cache.clear()  # no mode profits from the other's probe embeddings
        store.batch_embed = mode == "sync-batch"
        results[mode] = run(pgr, store, queries, mode)
    rows = list(results[modes[0]])
    print(f"{'':34}" + "".join(f"{m:>12}" for m in modes))
    for row in rows:
        values = [results[m][row] for m in modes]
        cells = "".join(f"{v:>12.0f}" if isinstance(v, int) else f"{v:>12.2f}" for v in values)
        print(f"{row:34}{cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
