"""How InMemoryStore scales: the cost of one write as the store grows, and of searches among many tenants.

    python lab/memory_scale.py                               # N = 10k, 100k; 10,000 tenants x 100 facts
    python lab/memory_scale.py --sizes 10000,100000,1000000  # up to a million facts (about 1.5 GB)
    python lab/memory_scale.py --impl /tmp/memory_old.py     # the same figures for another memory.py
    python lab/memory_scale.py --json out.json

Vectors are random 384-d unit rows. The embedder is a stand-in that hands out fixed random vectors
(one of 4,096, picked by the text's CRC), so no figure includes embedding; facts are written with
their vectors given (``add_facts(..., vectors=...)``) and the probe cache is off (``embedding_cache=0``).

It prints:

- write cost against N (N facts in N/100 tenants of 100): the p50, p90 and worst of adding one fact to
  a random existing tenant, and the ratio p50(largest N) / p50(smallest N): flat is about 1;
- at ``--tenants`` x ``--per-tenant``: the first search in a tenant never searched before, a search in
  a tenant right after a write to it, and one round of 7 probes (top 10), each p50 over ``--repeats``;
- save and reopen of that store, in seconds.

``--impl PATH`` loads another copy of ``pgr_core/stores/memory.py`` (say, the last commit's, from
``git show HEAD:pgr_core/stores/memory.py > /tmp/memory_old.py``) in place of the installed one, to compare.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pgr_core import Fact, Scope, SearchParams

DIM = 384
PROBES = [
    "knee injury and physio",
    "evening classes on weeknights",
    "sold the car, rides the bus",
    "soccer league dues",
    "money is tight this year",
    "weekend football on television",
    "early mornings at the gym",
]


class FixedRandomEmbedder:
    """Fixed random unit vectors, one of ``pool`` chosen by the text's CRC: embedding costs nothing."""

    def __init__(self, dim: int = DIM, pool: int = 4096, seed: int = 7) -> None:
        self.dim, self.name = dim, f"fixed-random-{dim}"
        self._pool = unit_rows(np.random.default_rng(seed), pool, dim)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._pool[[zlib.crc32(t.encode("utf-8")) % len(self._pool) for t in texts]]


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    rows = rng.standard_normal((n, dim), dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


def store_class(impl: str | None) -> Any:
    if impl is None:
        from pgr_core import InMemoryStore

        return InMemoryStore
    # a package-relative name, so the file's own `from .errors import ...` resolve against pgr_core
    spec = importlib.util.spec_from_file_location("pgr_core._memory_under_test", impl)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.InMemoryStore


def tenant(i: int) -> Scope:
    return Scope(user_id=f"tenant{i:06d}")


def build(cls: Any, tenants: int, per_tenant: int, rng: np.random.Generator, chunk: int = 100_000) -> Any:
    """``tenants`` x ``per_tenant`` facts, written in batches of about ``chunk`` facts."""
    store = cls(embedder=FixedRandomEmbedder(), embedding_cache=0)
    per_batch = max(1, chunk // per_tenant)
    for first in range(0, tenants, per_batch):
        owners = [tenant(i) for i in range(first, min(tenants, first + per_batch))]
        facts = [
            Fact(id=f"{o.user_id}:{j}", text=f"fact {j} of {o.user_id}", scope=o)
            for o in owners
            for j in range(per_tenant)
        ]
        store.add_facts(facts, vectors=unit_rows(rng, len(facts), DIM))
    return store


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def ms(seconds: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds) * 1000, q))


def write_cost(cls: Any, n: int, per_tenant: int, repeats: int, rng: np.random.Generator) -> dict[str, Any]:
    tenants = max(1, n // per_tenant)
    t0 = time.perf_counter()
    store = build(cls, tenants, per_tenant, rng)
    built = time.perf_counter() - t0
    times = []
    for k in range(repeats):
        owner = tenant(int(rng.integers(tenants)))
        fact = Fact(id=f"{owner.user_id}:new{k}", text=f"a new fact {k}", scope=owner)
        vector = unit_rows(rng, 1, DIM)
        times.append(timed(lambda: store.add_facts([fact], vectors=vector)))  # noqa: B023
    return {
        "n": len(store),
        "tenants": tenants,
        "build_s": built,
        "add_p50_ms": ms(times, 50),
        "add_p90_ms": ms(times, 90),
        "add_max_ms": max(times) * 1000,
    }


def tenant_searches(cls: Any, tenants: int, per_tenant: int, repeats: int, rng: np.random.Generator) -> dict[str, Any]:
    t0 = time.perf_counter()
    store = build(cls, tenants, per_tenant, rng)
    built = time.perf_counter() - t0
    params = SearchParams(top_k=10, min_score=0.0)
    order = rng.permutation(tenants)
    fresh = [tenant(int(i)) for i in order[:repeats]]  # never searched before

    def search_in(owner: Scope, probes: list[str]) -> Callable[[], Any]:
        return lambda: store.search_batch(probes, scope=owner, params=params)

    first = [timed(search_in(o, PROBES[:1])) for o in fresh]
    after_write = []
    for k in range(repeats):
        owner = tenant(int(order[(repeats + k) % tenants]))
        store.add_facts(
            [Fact(id=f"{owner.user_id}:w{k}", text=f"written {k}", scope=owner)], vectors=unit_rows(rng, 1, DIM)
        )
        after_write.append(timed(search_in(owner, PROBES[1:2])))
    warm = fresh[0]
    store.search_batch(PROBES, scope=warm, params=params)
    rounds = [timed(lambda: store.search_batch(PROBES, scope=warm, params=params)) for _ in range(repeats)]
    hits = store.search_batch(PROBES, scope=warm, params=params)
    assert all(len(h) == min(10, per_tenant) and all(x.fact.scope == warm for x in h) for h in hits)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scale.pgr"
        save_s = timed(lambda: store.save(path))
        size = path.stat().st_size
        t0 = time.perf_counter()
        loaded = cls.load(path, embedder=FixedRandomEmbedder())
        load_s = time.perf_counter() - t0
        assert len(loaded) == len(store)
    return {
        "tenants": tenants,
        "per_tenant": per_tenant,
        "n": len(store),
        "build_s": built,
        "first_search_p50_ms": ms(first, 50),
        "search_after_write_p50_ms": ms(after_write, 50),
        "round_7_probes_p50_ms": ms(rounds, 50),
        "save_s": save_s,
        "reopen_s": load_s,
        "file_mb": size / 2**20,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000", help="total facts for the write-cost sweep (comma list)")
    ap.add_argument("--tenants", type=int, default=10_000, help="tenants for the search figures (0: skip)")
    ap.add_argument("--per-tenant", type=int, default=100, help="facts per tenant")
    ap.add_argument("--repeats", type=int, default=50, help="timed operations per figure")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--impl", help="path of another memory.py to measure instead of pgr_core.stores.memory")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    cls = store_class(args.impl)
    rng = np.random.default_rng(args.seed)
    label = args.impl or "pgr_core.stores.memory"
    print(f"InMemoryStore from {label}; {DIM}-d random unit vectors; {args.repeats} repeats per figure\n")

    sweep = []
    print(f"{'N facts':>10} {'tenants':>8} {'build s':>8} {'add p50 ms':>11} {'add p90 ms':>11} {'add max ms':>11}")
    for n in sizes:
        row = write_cost(cls, n, args.per_tenant, args.repeats, rng)
        sweep.append(row)
        print(
            f"{row['n']:>10,} {row['tenants']:>8,} {row['build_s']:>8.1f} {row['add_p50_ms']:>11.3f} "
            f"{row['add_p90_ms']:>11.3f} {row['add_max_ms']:>11.3f}",
            flush=True,
        )
    ratio = sweep[-1]["add_p50_ms"] / sweep[0]["add_p50_ms"] if len(sweep) > 1 else 1.0
    if len(sweep) > 1:
        print(f"write cost ratio p50(N={sweep[-1]['n']:,}) / p50(N={sweep[0]['n']:,}) = {ratio:.2f}")

    searches = None
    if args.tenants:
        searches = tenant_searches(cls, args.tenants, args.per_tenant, args.repeats, rng)
        print(
            f"\n{searches['tenants']:,} tenants x {searches['per_tenant']} facts ({searches['n']:,} facts, "
            f"built in {searches['build_s']:.1f} s)"
        )
        for key, name in (
            ("first_search_p50_ms", "first search in a tenant, p50"),
            ("search_after_write_p50_ms", "search right after a write, p50"),
            ("round_7_probes_p50_ms", "one 7-probe round, p50"),
        ):
            print(f"  {name:<36} {searches[key]:>10.3f} ms")
        print(f"  {'save':<36} {searches['save_s']:>10.2f} s  ({searches['file_mb']:.0f} MB)")
        print(f"  {'reopen (load)':<36} {searches['reopen_s']:>10.2f} s")

    if args.json:
        report = {
            "impl": label,
            "dim": DIM,
            "repeats": args.repeats,
            "write_cost": sweep,
            "write_cost_ratio": ratio,
            "tenants": searches,
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
