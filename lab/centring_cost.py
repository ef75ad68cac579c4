"""What centring costs per query: the no-LLM retrieve centred and uncentred, against the plain search,
on the embedded stores, with the scope's mean warm (cached) and cold (just after a write there).

    python lab/centring_cost.py                     # EdgeStore and InMemoryStore, 100 / 1k / 10k facts a user
    python lab/centring_cost.py --sizes 100,1000 --repeats 30

One user's memory of N facts (the synthetic turns of ``lab/_synthetic.py``, cycled and
numbered) beside nine other users' of the same size, hashing embedder (the time is the store's and
the policy's, not a model's). For each store and N it prints the median milliseconds per query of:

- ``query_only``: ``PGR.query_only`` (the plain search, top 20);
- ``uncentred``: ``PGR(centring=None).retrieve`` with no LLM (one store call, top 20);
- ``centred, warm``: ``PGR().retrieve`` with the scope's mean already built (the deeper read of 100
  candidates, their vectors, and the cut);
- ``centred, cold``: the same right after a write in the scope, so the mean is rebuilt
  (``facts_for`` and the vectors of all N facts).

Compare ratios within one run: the machines are shared.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _synthetic import QUERIES, make_facts

from pgr_core import PGR, EdgeStore, Fact, HashingEmbedder, InMemoryStore, Scope

USERS = 10


def _facts(n: int) -> list[Fact]:
    base = make_facts(2000)
    out = []
    for u in range(USERS):
        scope = Scope(user_id=f"user{u}")
        for i in range(n):
            f = base[i % len(base)]
            out.append(Fact(id=f"u{u}-{i}", text=f"{f.text} (#{i})", scope=scope, date=f.date))
    return out


def _median_ms(call: Callable[[], Any], repeats: int, before: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def measure(store: Any, repeats: int) -> dict[str, float]:
    scope = Scope(user_id="user0")
    query = QUERIES[0]
    plain, centred, off = PGR(store), PGR(store), PGR(store, centring=None)
    counter = iter(range(10**9))

    def write() -> None:
        store.add_facts([Fact(id=f"new-{next(counter)}", text="a new note", scope=scope)])

    centred.retrieve(query, scope=scope)  # the mean built once
    result = {
        "query_only": _median_ms(lambda: plain.query_only(query, scope=scope), repeats),
        "uncentred": _median_ms(lambda: off.retrieve(query, scope=scope), repeats),
        "centred, warm": _median_ms(lambda: centred.retrieve(query, scope=scope), repeats),
        "centred, cold": _median_ms(lambda: centred.retrieve(query, scope=scope), repeats, before=write),
    }
    check = centred.retrieve(query, scope=scope)
    assert check.trace.centring == 1.0 and not check.degraded, check.trace.centring_off
    assert all(f.fact.scope == scope for f in check.facts)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100,1000,10000", help="facts per user, comma-separated")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        facts = _facts(n)
        with tempfile.TemporaryDirectory() as tmp:
            for name, build in (
                ("EdgeStore", lambda: EdgeStore.open(Path(tmp) / "edge", embedder=HashingEmbedder())),
                ("InMemoryStore", lambda: InMemoryStore(embedder=HashingEmbedder())),
            ):
                print(f"{name}, {n} facts a user x {USERS} users: loading...", file=sys.stderr, flush=True)
                store = build()
                store.add_facts(facts)
                if hasattr(store, "optimize"):
                    store.optimize()
                rows.append((name, n, measure(store, args.repeats)))
                if hasattr(store, "close"):
                    store.close()
    cols = ["query_only", "uncentred", "centred, warm", "centred, cold"]
    print("| store | facts a user | " + " | ".join(f"{c} ms" for c in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for name, n, r in rows:
        print(f"| {name} | {n:,} | " + " | ".join(f"{r[c]:.2f}" for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
