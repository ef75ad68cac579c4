"""What the policy itself costs: its overhead over raw store time, store calls per round, and wall time
per query as the store grows.

    python lab/policy_cost.py                          # in-memory store, 1k / 10k / 100k facts
    python lab/policy_cost.py --sizes 1000,10000 --qdrant   # Qdrant local too (pip install 'pgr[qdrant]')
    python lab/policy_cost.py --embedder minilm        # the real embedder (slower to build)

The facts are the synthetic multi-user memory of ``lab/_synthetic.py`` (20 users, ordered turns).
The LLM is an instant scripted stand-in (``pgr_core.testing.ScriptedLLM``): every reply is ready at
once, so whatever time is not spent in the store is the policy's own (prompt building, probe hygiene,
merging, ranking, trace). For each strategy (feedback, CoT, ToT) and size it prints, per query:

- wall time; time inside ``store.search_batch``; time embedding probes (hygiene embeds each round's
  probes once, to refuse echoes and duplicates, and the store reuses those vectors from the shared
  embedding cache: it is the store's work, done a moment earlier); time inside the LLM (about zero
  here); and the rest, the policy's own work (prompts, hygiene's comparisons, merging, ranking,
  trace), as a share of the total. The stand-in words every step anew, so no probe is served from
  the cache and every probe is really embedded, as with a real model;
- store calls per round with probes (the design's target: 1) and rounds per query.

Every query is checked: no degraded result, every store call under the query's own scope.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from _synthetic import QUERIES, TOPICS, USERS, make_facts

from pgr_core import PGR, HashingEmbedder, Hit, InMemoryStore, MiniLMEmbedder, Scope, SearchParams, Store
from pgr_core.testing import ScriptedLLM


class TimedEmbedder:
    """An embedder that adds up the seconds of its calls, split by who asked (the store or the policy)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.seconds = {"store": 0.0, "policy": 0.0}
        self.caller = "policy"

    def embed(self, texts: Sequence[str]) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner.embed(texts)
        finally:
            self.seconds[self.caller] += time.perf_counter() - t0


class TimedStore(Store):
    """Passes through to ``inner``, timing each call and checking its scope."""

    def __init__(self, inner: Store, embedder: TimedEmbedder | None) -> None:
        self.inner, self.timed = inner, embedder
        self.embedder = getattr(inner, "embedder", None)
        self.capabilities = replace(
            inner.capabilities, writable=False, window=False, lists=False, vectors=False, by_id=False, deletes=False
        )  # searches only
        self.seconds = 0.0
        self.calls = 0
        self.scopes: set[Scope] = set()

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        self.calls += 1
        self.scopes.add(scope)
        if self.timed is not None:
            self.timed.caller = "store"
        t0 = time.perf_counter()
        try:
            return self.inner.search_batch(probes, scope=scope, params=params)
        finally:
            self.seconds += time.perf_counter() - t0
            if self.timed is not None:
                self.timed.caller = "policy"


def instant_llm() -> ScriptedLLM:
    """Replies at once, with steps that differ by query and round, so every round probes something new."""

    def handler(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        prompt = messages[-1]["content"]
        props = (schema or {}).get("properties", {})
        seed = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)
        # new wording every call, so no probe is served from the embedding cache: the store (or hygiene)
        # really embeds each one, as with a real model
        picks = [f"{TOPICS[(seed + 7 * i) % len(TOPICS)][1]} ({seed % 997}-{i})" for i in range(4)]
        if "intent" in props:
            return {"intent": "plan around what the user remembers"}
        if "steps" in props:
            return {"steps": [{"action": f"check {t}", "dimension": "logistics"} for t in picks]}
        if "nodes" in props:
            return {"nodes": [{"id": f"n{i}", "action": f"look into {t}", "parent": None} for i, t in enumerate(picks)]}
        return {"summary": "the steps above surfaced what matters"}

    return ScriptedLLM(handler=handler)


def measure(store: Store, timed_embedder: TimedEmbedder | None, strategy: str, queries: list[tuple[str, str]]) -> dict:
    spy = TimedStore(store, timed_embedder)
    llm = None if strategy in ("feedback", "none") else instant_llm()
    pgr = PGR(spy, llm=llm, strategy=strategy, embedder=timed_embedder)
    for user in USERS:  # warm every scope's row index and the embedder: measure steady state, not first use
        pgr.retrieve("a warm-up question about the weekend", scope=Scope(user_id=user))
    spy.seconds, spy.calls, spy.scopes = 0.0, 0, set()
    if timed_embedder is not None:
        timed_embedder.seconds = {"store": 0.0, "policy": 0.0}
    wall: list[float] = []
    llm_s = 0.0
    rounds = probed_rounds = 0
    for query, user in queries:
        t0 = time.perf_counter()
        result = pgr.retrieve(query, scope=Scope(user_id=user))
        wall.append(time.perf_counter() - t0)
        assert not result.degraded, result.trace.errors
        llm_s += result.trace.usage.seconds
        rounds += len(result.trace.rounds)
        probed_rounds += sum(1 for r in result.trace.rounds if r.probes)
    assert spy.scopes <= {Scope(user_id=u) for u in USERS}
    total = sum(wall)
    hygiene = timed_embedder.seconds["policy"] if timed_embedder is not None else 0.0
    # probe embedding is the store's work (phi embeds its probes); hygiene does it first and the store
    # reuses the vectors from the shared cache, so it is counted apart from the policy's own work
    overhead = total - spy.seconds - llm_s - hygiene
    return {
        "query_ms": 1000 * total / len(queries),
        "query_ms_median": 1000 * statistics.median(wall),
        "store_ms": 1000 * spy.seconds / len(queries),
        "llm_ms": 1000 * llm_s / len(queries),
        "overhead_ms": 1000 * overhead / len(queries),
        "overhead_share": overhead / total,
        "probe_embed_ms": 1000 * hygiene / len(queries),
        "store_calls_per_round": spy.calls / max(probed_rounds, 1),
        "rounds_per_query": rounds / len(queries),
    }


def build(kind: str, n: int, embedder: Any) -> Store:
    facts = make_facts(n)
    t0 = time.perf_counter()
    if kind == "memory":
        store: Store = InMemoryStore(embedder=embedder)
        for i in range(0, n, 5000):
            store.add_facts(facts[i : i + 5000])  # type: ignore[attr-defined]
            print(f"\r  {kind}: {min(i + 5000, n)}/{n} facts", end="", file=sys.stderr, flush=True)
    else:
        from pgr_adapters.qdrant import QdrantStore
        from qdrant_client import QdrantClient

        store = QdrantStore.create_collection(QdrantClient(":memory:"), "facts", embedder.dim, embedder=embedder)
        for i in range(0, n, 2000):
            store.upsert_facts(facts[i : i + 2000])  # type: ignore[attr-defined]
            print(f"\r  {kind}: {min(i + 2000, n)}/{n} facts", end="", file=sys.stderr, flush=True)
    print(f" ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)
    return store


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--strategies", default="feedback,cot,tot")
    ap.add_argument("--embedder", choices=["hashing", "minilm"], default="hashing")
    ap.add_argument("--qdrant", action="store_true", help="also Qdrant local mode (slow past ~20k points)")
    args = ap.parse_args()
    queries = [(QUERIES[i % len(QUERIES)], USERS[(i * 7) % len(USERS)]) for i in range(args.queries)]
    kinds = ["memory"] + (["qdrant"] if args.qdrant else [])
    print(f"embedder: {args.embedder}; {len(queries)} queries per cell; instant scripted LLM")
    print(
        "| store | facts | strategy | ms/query | store search ms | probe embedding ms | LLM ms "
        "| policy's own ms | policy's own share | store calls/round | rounds/query |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        for n in [int(s) for s in args.sizes.split(",")]:
            inner = MiniLMEmbedder() if args.embedder == "minilm" else HashingEmbedder()
            timed = TimedEmbedder(inner)
            store = build(kind, n, timed)
            for strategy in args.strategies.split(","):
                m = measure(store, timed, strategy, queries)
                print(
                    f"| {kind} | {n} | {strategy} | {m['query_ms']:.1f} | {m['store_ms']:.1f} "
                    f"| {m['probe_embed_ms']:.1f} | {m['llm_ms']:.2f} | {m['overhead_ms']:.1f} "
                    f"| {100 * m['overhead_share']:.1f} % | {m['store_calls_per_round']:.2f} "
                    f"| {m['rounds_per_query']:.1f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
