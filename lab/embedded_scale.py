"""The embedded stores at scale: EdgeStore (Qdrant's engine) beside InMemoryStore and Qdrant local mode.

    python lab/embedded_scale.py                      # small sizes, about a minute
    python lab/embedded_scale.py --tenants 10000 --per-tenant 100 --one-tenant 1000000 \\
        --real 100000 --json scale.json                      # the issue's sizes (tens of minutes)

Every figure is measured in this run, on this machine; compare stores within one run (shared cores
are noisy). Nothing here is asserted: the script prints a table (and ``--json``).

Scenarios, each with random unit vectors of ``--dim`` (384, MiniLM's size) except the last:

- ``small-tenants``: ``--small-tenants`` × ``--per-tenant`` facts (small enough for Qdrant local mode);
- ``tenants``: ``--tenants`` × ``--per-tenant`` facts, one owner each (``Scope(user_id=...)``);
- ``one-tenant``: ``--one-tenant`` facts of a single owner (HNSW matters here);
- ``real``: ANN recall@5 of EdgeStore's HNSW against the exact top 5 (numpy over the same vectors) on
  real MiniLM vectors of ``--real`` texts (turns, facts and sentences of LoCoMo, PrefEval and MQ-lite
  from ``--data``), probed with those sets' questions. Vectors are cached on disk (``--vector-cache``).

Per store and scenario: bulk load (and, for EdgeStore, the HNSW build in ``optimize()``), one
7-probe round p50 (warm), the first round in a scope not searched before, one write p50 (a single
fact), a round right after a write p50, and close + reopen (InMemoryStore: save + load). Probes are
looked up in a table of precomputed vectors, so no embedding time is counted.

Qdrant local mode (``qdrant-client``, ``path=``) filters in a Python loop and runs a batch one probe
at a time; it is measured only up to ``--qdrant-max`` facts and marked ``skipped`` above that.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pgr_core import Fact, InMemoryStore, Scope, SearchParams

PROBES = 7


class TableEmbedder:
    """Vectors looked up by text (probes are registered ahead), so no model runs while timing."""

    def __init__(self, dim: int, name: str = "table") -> None:
        self.dim = dim
        self.name = f"{name}-{dim}"
        self.table: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.table[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def p50(xs: Sequence[float]) -> float:
    return statistics.median(xs) * 1000.0  # ms


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the stores, one interface


class Subject:
    """One store under test: build, search, write, reopen."""

    name = ""

    def __init__(self, embedder: TableEmbedder, work: Path) -> None:
        self.embedder = embedder
        self.work = work

    def load(self, facts: list[Fact], vectors: np.ndarray) -> dict[str, float]:
        raise NotImplementedError

    def search(self, probes: list[str], scope: Scope, k: int = 5) -> list[list[str]]:
        hits = self.store.search_batch(probes, scope=scope, params=SearchParams(top_k=k, min_score=0.0))
        return [[h.fact.id for h in hs] for hs in hits]

    def write(self, fact: Fact, vector: np.ndarray) -> None:
        self.store.add_facts([fact], vectors=vector[None, :])

    def reopen(self) -> float:
        raise NotImplementedError

    def close(self) -> None:
        pass


class Edge(Subject):
    name = "EdgeStore"

    def load(self, facts: list[Fact], vectors: np.ndarray) -> dict[str, float]:
        from pgr_core import EdgeStore

        self.path = self.work / "edge"
        self.store = EdgeStore.open(self.path, embedder=self.embedder, create=True, embedding_cache=0)
        auto = EdgeStore.auto_optimize_at
        self.store.auto_optimize_at = 1 << 62  # load first, then time the index build on its own
        t0 = time.perf_counter()
        for start in range(0, len(facts), 50_000):
            self.store.add_facts(facts[start : start + 50_000], vectors=vectors[start : start + 50_000])
        loaded = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.store.optimize()
        built = time.perf_counter() - t0
        self.store.auto_optimize_at = auto
        return {"load_s": loaded, "index_s": built, **self.store.stats()}

    def reopen(self) -> float:
        from pgr_core import EdgeStore

        t0 = time.perf_counter()
        self.store.close()
        self.store = EdgeStore.open(self.path, embedder=self.embedder, create=False, embedding_cache=0)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.store.close()


class Memory(Subject):
    name = "InMemoryStore"

    def load(self, facts: list[Fact], vectors: np.ndarray) -> dict[str, float]:
        self.store = InMemoryStore(embedder=self.embedder, embedding_cache=0)
        t0 = time.perf_counter()
        self.store.add_facts(facts, vectors=vectors)
        return {"load_s": time.perf_counter() - t0}

    def reopen(self) -> float:
        path = self.work / "memory.pgr"
        t0 = time.perf_counter()
        self.store.save(path)
        self.store = InMemoryStore.load(path, embedder=self.embedder)
        return time.perf_counter() - t0


class QdrantLocal(Subject):
    name = "Qdrant local"

    def load(self, facts: list[Fact], vectors: np.ndarray) -> dict[str, float]:
        from pgr_adapters.qdrant import QdrantStore
        from qdrant_client import QdrantClient, models

        self.path = self.work / "qdrant"
        self.models = models
        client = QdrantClient(path=str(self.path))
        client.create_collection(
            "facts", vectors_config=models.VectorParams(size=self.embedder.dim, distance=models.Distance.COSINE)
        )
        self.client = client
        self.store = QdrantStore(client, "facts", embedder=self.embedder)
        for fact, vector in zip(facts, vectors, strict=True):  # upsert_facts embeds: look the texts up
            self.embedder.table[fact.text] = vector
        t0 = time.perf_counter()
        for start in range(0, len(facts), 2000):
            self.store.upsert_facts(facts[start : start + 2000])
        return {"load_s": time.perf_counter() - t0}

    def write(self, fact: Fact, vector: np.ndarray) -> None:
        self.embedder.table[fact.text] = vector
        self.store.upsert_facts([fact])

    def reopen(self) -> float:
        from pgr_adapters.qdrant import QdrantStore
        from qdrant_client import QdrantClient

        t0 = time.perf_counter()
        self.client.close()
        self.client = QdrantClient(path=str(self.path))
        self.store = QdrantStore(self.client, "facts", embedder=self.embedder)
        self.store.search_batch(["p0"], scope=Scope(user_id="t0"), params=SearchParams(top_k=1))
        return time.perf_counter() - t0

    def close(self) -> None:
        self.client.close()


def qdrant_available() -> bool:
    try:
        import qdrant_client  # noqa: F401
        from pgr_adapters.qdrant import QdrantStore  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- timing one store


def measure(
    subject: Subject,
    facts: list[Fact],
    vectors: np.ndarray,
    owners: list[Scope],
    rng: random.Random,
    dim: int,
    rounds: int,
) -> dict[str, Any]:
    emb = subject.embedder
    nrng = np.random.default_rng(rng.randrange(1 << 30))
    probes = [f"p{i}" for i in range(PROBES)]
    for p, v in zip(probes, unit(nrng, PROBES, dim), strict=True):
        emb.table[p] = v
    out: dict[str, Any] = {"facts": len(facts)}
    say(f"  {subject.name}: loading {len(facts):,} facts")
    out.update(subject.load(facts, vectors))
    gc.collect()
    # the first round in a scope nobody searched yet
    cold = []
    for owner in rng.sample(owners, min(rounds, len(owners))):
        t0 = time.perf_counter()
        subject.search(probes, owner)
        cold.append(time.perf_counter() - t0)
    warm_owner = owners[0]
    subject.search(probes, warm_owner)
    warm = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        subject.search(probes, warm_owner)
        warm.append(time.perf_counter() - t0)
    writes, after = [], []
    for i in range(rounds):
        owner = rng.choice(owners)
        fact = Fact(id=f"new{i}", text=f"new fact {i}", scope=owner)
        vec = unit(nrng, 1, dim)[0]
        t0 = time.perf_counter()
        subject.write(fact, vec)
        writes.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        subject.search(probes, owner)
        after.append(time.perf_counter() - t0)
    out.update(
        round_p50_ms=p50(warm),
        first_round_in_scope_p50_ms=p50(cold),
        write_p50_ms=p50(writes),
        round_after_write_p50_ms=p50(after),
    )
    out["reopen_s"] = subject.reopen()
    t0 = time.perf_counter()
    subject.search(probes, warm_owner)
    out["first_round_after_reopen_ms"] = (time.perf_counter() - t0) * 1000
    subject.close()
    return out


def synthetic(tenants: int, per_tenant: int, dim: int, seed: int) -> tuple[list[Fact], np.ndarray, list[Scope]]:
    owners = [Scope(user_id=f"t{t}") for t in range(tenants)]
    facts = [
        Fact(id=f"f{t}-{i}", text=f"fact {i} of t{t}", scope=owners[t])
        for t in range(tenants)
        for i in range(per_tenant)
    ]
    return facts, unit(np.random.default_rng(seed), len(facts), dim), owners


def scenario(name: str, tenants: int, per_tenant: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    say(f"{name}: {tenants:,} tenant(s) × {per_tenant:,} facts")
    facts, vectors, owners = synthetic(tenants, per_tenant, args.dim, args.seed)
    rows: dict[str, Any] = {}
    makers: list[Callable[[TableEmbedder, Path], Subject]] = [Edge, Memory]
    if qdrant_available():
        makers.append(QdrantLocal)
    for make in makers:
        subject = make(TableEmbedder(args.dim), Path(tempfile.mkdtemp(dir=work)))
        if isinstance(subject, QdrantLocal) and len(facts) > args.qdrant_max:
            rows[subject.name] = {"skipped": f"more than --qdrant-max {args.qdrant_max:,} facts"}
            continue
        rows[subject.name] = measure(subject, facts, vectors, owners, random.Random(args.seed), args.dim, args.rounds)
        gc.collect()
    if not qdrant_available():
        rows["Qdrant local"] = {"skipped": "qdrant-client is not installed (pip install 'pgr[qdrant]')"}
    return rows


# --------------------------------------------------------------------------- ANN recall on real vectors


def real_texts(data: Path, want: int) -> tuple[list[str], list[str]]:
    """Up to ``want`` distinct texts (turns, facts, sentences) and the questions of the shared data sets."""
    texts: dict[str, None] = {}
    questions: list[str] = []

    def take(text: str) -> None:
        text = " ".join(str(text).split())
        if len(text) >= 12:
            texts.setdefault(text[:1000], None)
            for piece in re.split(r"(?<=[.!?])\s+", text):
                if len(piece) >= 24:
                    texts.setdefault(piece[:1000], None)

    for path in sorted((data / "mq-lite").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            for s in row.get("sessions", []):
                for t in s.get("turns", []):
                    take(t.get("text", ""))
            for f in row.get("facts", []):
                take(f.get("text", ""))
            questions += [q["query"] for q in row.get("queries", [])]
    for path in sorted((data / "locomo").glob("*.json")):
        for conv in json.loads(path.read_text(encoding="utf-8")):
            for value in conv.get("conversation", {}).values():
                if isinstance(value, list):
                    for turn in value:
                        take(turn.get("text", ""))
            questions += [q["question"] for q in conv.get("qa", []) if "question" in q]
    for path in sorted((data / "prefeval").rglob("*.json")):
        try:
            blob = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        stack = [blob]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, str):
                take(item)
        if len(texts) >= want:
            break
    return list(texts)[:want], list(dict.fromkeys(questions))


def ann_recall(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from pgr_core import EdgeStore, MiniLMEmbedder
    from pgr_core.evaluation.cache import DiskCachedEmbedder
    from pgr_core.evaluation.runner import embed_in_chunks

    texts, questions = real_texts(args.data, args.real)
    say(f"real: {len(texts):,} texts, {len(questions):,} questions from {args.data}")
    model = DiskCachedEmbedder(MiniLMEmbedder(), args.vector_cache)
    vectors = embed_in_chunks(model.embed, texts, "embedding texts (MiniLM)", dim=model.dim)
    rng = random.Random(args.seed)
    probes = rng.sample(questions, min(args.queries, len(questions)))
    qvecs = model.embed(probes)
    table = TableEmbedder(model.dim, "minilm-table")
    for p, v in zip(probes, qvecs, strict=True):
        table.table[p] = v
    owner = Scope(user_id="everyone")
    facts = [Fact(id=f"r{i}", text=t, scope=owner) for i, t in enumerate(texts)]
    store = EdgeStore.open(work / "real", embedder=table, create=True, embedding_cache=0)
    try:
        store.auto_optimize_at = 1 << 62
        t0 = time.perf_counter()
        for start in range(0, len(facts), 50_000):
            store.add_facts(facts[start : start + 50_000], vectors=vectors[start : start + 50_000])
        load = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.optimize()
        built = time.perf_counter() - t0
        stats = store.stats()
        exact = np.argsort(-(qvecs @ vectors.T), axis=1)[:, :5]
        got, seconds = [], []
        for i in range(0, len(probes), PROBES):
            batch = probes[i : i + PROBES]
            t0 = time.perf_counter()
            hits = store.search_batch(batch, scope=owner, params=SearchParams(top_k=5, min_score=0.0))
            seconds.append(time.perf_counter() - t0)
            got += [[int(h.fact.id[1:]) for h in hs] for hs in hits]
        recall = statistics.fmean(len(set(g) & set(e.tolist())) / 5 for g, e in zip(got, exact, strict=True))
    finally:
        store.close()
    return {
        "facts": len(facts),
        "queries": len(probes),
        "load_s": load,
        "index_s": built,
        **stats,
        "ann_recall_at_5": recall,
        "round_p50_ms": p50(seconds),
    }


# --------------------------------------------------------------------------- report


COLUMNS = [
    ("load_s", "load s", "{:.1f}"),
    ("index_s", "HNSW build s", "{:.1f}"),
    ("round_p50_ms", "7-probe round p50 ms", "{:.2f}"),
    ("first_round_in_scope_p50_ms", "first round in a scope ms", "{:.2f}"),
    ("write_p50_ms", "one write p50 ms", "{:.3f}"),
    ("round_after_write_p50_ms", "round after a write ms", "{:.2f}"),
    ("reopen_s", "close + reopen s", "{:.2f}"),
]


def markdown(report: dict[str, Any]) -> str:
    lines = []
    for name, rows in report.items():
        if name == "real":
            continue
        lines.append(f"\n{name}\n")
        lines.append("| store | " + " | ".join(c[1] for c in COLUMNS) + " |")
        lines.append("|---" * (len(COLUMNS) + 1) + "|")
        for store, row in rows.items():
            if "skipped" in row:
                lines.append(f"| {store} | skipped: {row['skipped']} |" + " |" * (len(COLUMNS) - 1))
                continue
            cells = [fmt.format(row[key]) if key in row else "-" for key, _, fmt in COLUMNS]
            lines.append(f"| {store} | " + " | ".join(cells) + " |")
    if "real" in report:
        r = report["real"]
        lines.append(
            f"\nANN recall@5 against exact, EdgeStore HNSW, {r['facts']:,} real MiniLM vectors, "
            f"{r['queries']} questions: **{r['ann_recall_at_5']:.3f}** (indexed {r.get('indexed_vectors')}, "
            f"build {r['index_s']:.1f} s, 7-probe round p50 {r['round_p50_ms']:.2f} ms)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small-tenants", type=int, default=200, help="tenants of a scenario Qdrant local also runs")
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--per-tenant", type=int, default=100)
    ap.add_argument("--one-tenant", type=int, default=50_000, help="facts of the single-tenant scenario (0: skip)")
    ap.add_argument("--real", type=int, default=0, help="real MiniLM texts for ANN recall (0: skip; the issue: 100000)")
    ap.add_argument("--queries", type=int, default=210, help="questions probed in the ANN recall scenario")
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--vector-cache", type=Path, default=Path(".pgr-cache/vectors"))
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=50, help="timed repetitions per figure")
    ap.add_argument("--qdrant-max", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pgr-scale-"))
    report: dict[str, Any] = {}
    if args.small_tenants:  # small enough for Qdrant local mode too: all three stores side by side
        report[f"{args.small_tenants:,} tenants × {args.per_tenant} facts"] = scenario(
            "small-tenants", args.small_tenants, args.per_tenant, args, work
        )
    if args.tenants:
        report[f"{args.tenants:,} tenants × {args.per_tenant} facts"] = scenario(
            "tenants", args.tenants, args.per_tenant, args, work
        )
    if args.one_tenant:
        report[f"one tenant, {args.one_tenant:,} facts"] = scenario("one-tenant", 1, args.one_tenant, args, work)
    if args.real:
        report["real"] = ann_recall(args, work)
    print(markdown(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
        say(f"json: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
