"""The Qdrant adapter under PGR: store calls, Qdrant calls and wall time per round, on 10,000 facts.

    python lab/adapter_qdrant.py                      # 10,000 facts, 20 queries, windows 0 and 1
    python lab/adapter_qdrant.py --facts 2000 --queries 5

The facts (templates x names x topics, in sessions of ordered turns, 20 users) go into Qdrant local
mode (``:memory:``) through ``QdrantStore.upsert_facts``, embedded with MiniLM in batches. Each query
runs ``PGR(store, strategy="feedback")``; spies count the store's ``search_batch`` calls and the client's
``query_batch_points`` and ``scroll`` calls. Qdrant local mode is brute force and evaluates payload
filters in a Python loop over every point, so its times grow with the collection (slow past ~20k
points) and say little about a Qdrant server, where the calls per round are what carries over.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter

from _synthetic import QUERIES, USERS, make_facts
from pgr_adapters.qdrant import QdrantStore
from qdrant_client import QdrantClient

from pgr_core import PGR, MiniLMEmbedder, Scope


def spy(obj: object, name: str, log: list[float]) -> None:
    """Record the wall time of every call of ``obj.name``."""
    real = getattr(obj, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            log.append(time.perf_counter() - t0)

    setattr(obj, name, timed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--facts", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--windows", default="0,1", help="temporal windows to run, comma-separated")
    ap.add_argument("--batch", type=int, default=500, help="facts per upsert_facts call (one embedding batch)")
    args = ap.parse_args()

    embedder = MiniLMEmbedder()
    client = QdrantClient(":memory:")
    store = QdrantStore.create_collection(client, "facts", embedder.dim, embedder=embedder)
    facts = make_facts(args.facts)
    t0 = time.perf_counter()
    for start in range(0, len(facts), args.batch):
        store.upsert_facts(facts[start : start + args.batch])
        done = min(start + args.batch, len(facts))
        rate = done / (time.perf_counter() - t0)
        print(f"\rindexed {done}/{len(facts)} facts ({rate:.0f}/s)", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    build_s = time.perf_counter() - t0
    print(f"collection: {client.count('facts').count} points, {len(USERS)} users, built in {build_s:.1f} s")
    print(f"layout: {store.layout}")

    search_log: list[float] = []
    qbp_log: list[float] = []
    scroll_log: list[float] = []
    spy(store, "search_batch", search_log)
    spy(client, "query_batch_points", qbp_log)
    spy(client, "scroll", scroll_log)

    queries = [(QUERIES[i % len(QUERIES)], USERS[(i * 7) % len(USERS)]) for i in range(args.queries)]
    for window in [int(w) for w in args.windows.split(",")]:
        pgr = PGR(store, strategy="feedback", window=window)
        pgr.retrieve("warm-up question about the weekend", scope=Scope(user_id="alice"))  # loads MiniLM
        for log in (search_log, qbp_log, scroll_log):
            log.clear()
        rounds = probes = facts_found = 0
        per_round_seconds: list[float] = []
        calls_per_round: Counter[int] = Counter()
        t0 = time.perf_counter()
        for query, user in queries:
            before = len(search_log)
            result = pgr.retrieve(query, scope=Scope(user_id=user))
            assert not result.degraded, result.trace.errors
            probed = [r for r in result.trace.rounds if r.probes]
            rounds += len(probed)
            probes += sum(len(r.probes) for r in probed)
            facts_found += len(result.facts)
            per_round_seconds += [r.search_seconds for r in probed]
            calls_per_round.update(r.store_calls for r in probed)
            assert len(search_log) - before == sum(r.store_calls for r in result.trace.rounds)
        total = time.perf_counter() - t0
        print(f"\n== window={window}: {len(queries)} queries, {rounds} rounds with probes, {probes} probes")
        print(
            f"store calls per round:              {len(search_log) / rounds:.2f}  (histogram {dict(calls_per_round)})"
        )
        print(f"query_batch_points calls per round: {len(qbp_log) / rounds:.2f}")
        print(f"scroll calls per round (window):    {len(scroll_log) / rounds:.2f}")
        print(f"probes per round:                   {probes / rounds:.1f}")
        print(f"wall time per store call:           {1000 * statistics.mean(search_log):.1f} ms")
        print(f"  of which query_batch_points:      {1000 * sum(qbp_log) / len(search_log):.1f} ms")
        print(f"  of which scroll (window):         {1000 * sum(scroll_log) / len(search_log):.1f} ms")
        print(f"wall time per round (search):       {1000 * statistics.mean(per_round_seconds):.1f} ms")
        print(f"wall time per query (whole PGR):    {1000 * total / len(queries):.1f} ms")
        print(f"facts in R* per query:              {facts_found / len(queries):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
