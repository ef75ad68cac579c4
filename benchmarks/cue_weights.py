"""Query-only with and without cues, at the same number of facts, for several cue weights. No LLM call:
the cues come from a cue cache a build filled (``pgr eval --cues`` or ``pgr cues build``).

    python benchmarks/cue_weights.py --data ../shared/data/mq-lite/dev-facts.jsonl \
        --cue-cache .pgr-cache/cues.sqlite3 --model qwen [--weights 0.7,0.8,0.9,1.0] [--user U] [--json out.json]
    python benchmarks/cue_weights.py --kind locomo --data ../shared/data/locomo --user conv-30 ... --edge

It also times and scores PGR's LLM-free feedback round (``strategy="feedback"``) over both stores.

For each question, the question alone is searched (K = 20, τ = 0.3, as ``pgr eval``'s query-only) in the
plain store and through ``Anticipating`` at each weight (a fact scores max(own, weight x best cue)), and
recall@10 / recall@20 against the gold facts are averaged over the questions with gold. ``--model`` names
the model that wrote the cues (the cue cache is keyed by model, prompt and cues per fact); facts the
cache has no cues for are searched by their text alone, and their number is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pgr_core import PGR, Anticipating, CueCache, CueWriter
from pgr_core.anticipating import NEAREST
from pgr_core.cues import DEFAULT_CUES
from pgr_core.errors import LLMConnectionError
from pgr_core.evaluation import load_set
from pgr_core.evaluation.cache import disk_cached_embedder
from pgr_core.evaluation.metrics import recall_at
from pgr_core.evaluation.runner import build_store
from pgr_core.llm import LLM, Completion


class CacheOnly(LLM):
    """Stands in for the model that wrote the cues: the cache answers, a miss is 'unreachable'."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.name = f"cache-only:{model}"

    def complete(self, messages: Any, **kw: Any) -> Completion:
        raise LLMConnectionError("cache only: no model is called")


def recalls(store: Any, questions: list[Any], ks: list[int], strategy: str | None = None) -> dict[str, float]:
    """Query-only's recall@k, or (``strategy``) that of PGR's retrieve with it, its list cut to each k."""
    pgr = PGR(store) if strategy is None else PGR(store, strategy=strategy)
    out: dict[int, list[float]] = {k: [] for k in ks}
    for q in questions:
        if strategy is None:
            ids = pgr.query_only(q.question, scope=q.scope, date=q.date, top_k=max(ks)).ids
        else:
            ids = pgr.retrieve(q.question, scope=q.scope, date=q.date).ids
        for k in ks:
            out[k].append(recall_at(ids, q.gold, k, missing=q.missing))
    return {f"recall@{k}": round(statistics.fmean(v), 4) for k, v in out.items()}


def cold(store: Any, cues: Any, questions: list[Any]) -> dict[str, float]:
    """Median milliseconds of the first centred query-only search in a user's scope on a fresh wrapper
    (what the first search after a write pays: the scope's centres and cue trust built cold), with
    typicality against the nearest share of the memory (the default) and against the whole mean."""
    firsts = list({q.scope: q for q in questions}.values())
    times: dict[str, list[float]] = {"nearest": [], "whole_mean": []}
    for _ in range(3):
        for q in firsts:
            for name, nearest in (("nearest", NEAREST), ("whole_mean", None)):
                pgr = PGR(Anticipating(store, cues=cues, scoring="centred", nearest=nearest))
                t0 = time.perf_counter()
                pgr.query_only(q.question, scope=q.scope, date=q.date, top_k=20)
                times[name].append(1000 * (time.perf_counter() - t0))
    return {f"cold_{name}_ms": round(statistics.median(t), 3) for name, t in times.items()}


def latency(plain: Any, cued: Any, questions: list[Any], centred: Any = None) -> dict[str, Any]:
    """Median milliseconds of one query-only search (the question embedded from the probe cache after
    the first pass, so the figures compare the store calls), plain, through Anticipating, and through
    Anticipating(scoring="centred") when given (its default typicality, against the nearest share of
    the memory, and against the whole mean: ``centred_whole_mean``); and of one retrieve with the
    LLM-free feedback round (``strategy="feedback"``: two store calls, the joined text embedded) over
    the plain store and over the centred one (``*_feedback_ms``)."""
    pgrs = {"plain": PGR(plain), "cued": PGR(cued)}
    if centred is not None:
        whole = Anticipating(centred.store, cues=centred.cues, scoring="centred", nearest=None)
        pgrs |= {"centred": PGR(centred), "centred_whole_mean": PGR(whole)}
    feedback = {"plain_feedback": PGR(plain, strategy="feedback")}
    if centred is not None:
        feedback["centred_feedback"] = PGR(centred, strategy="feedback")
    times: dict[str, list[float]] = {name: [] for name in [*pgrs, *feedback]}
    for _ in range(3):
        for q in questions:
            for name, pgr in pgrs.items():
                t0 = time.perf_counter()
                pgr.query_only(q.question, scope=q.scope, date=q.date, top_k=20)
                times[name].append(1000 * (time.perf_counter() - t0))
            for name, pgr in feedback.items():
                t0 = time.perf_counter()
                pgr.retrieve(q.question, scope=q.scope, date=q.date)
                times[name].append(1000 * (time.perf_counter() - t0))
    return {"queries": len(questions)} | {f"{name}_ms": round(statistics.median(t), 3) for name, t in times.items()}


def judging(store: Any, cues: Any, owners: list[Any]) -> dict[str, Any]:
    """Median milliseconds to judge one user's cue trust cold (what the first centred search after a
    write in that scope pays on top: pgr_core.cue_trust), over every owner 3 times, and each one's figure."""
    times: list[float] = []
    found: dict[str, Any] = {}
    for _ in range(3):
        for owner in owners:
            fresh = Anticipating(store, cues=cues, scoring="centred")  # nothing judged yet
            t0 = time.perf_counter()
            alignment = fresh.cue_alignment(owner)
            times.append(1000 * (time.perf_counter() - t0))
            found[owner.user_id or str(owner)] = alignment.to_dict()
    return {"judge_ms": round(statistics.median(times), 3), "users": found}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--kind", default="jsonl", choices=["jsonl", "locomo"])
    p.add_argument("--cue-cache", type=Path, required=True)
    p.add_argument("--model", default="qwen", help="the model name the cues were cached under")
    p.add_argument("--cues-per-fact", type=int, default=DEFAULT_CUES, help="the build to read: cues asked per fact")
    p.add_argument("--weights", default="0.6,0.7,0.8,0.9,1.0")
    p.add_argument("--k", default="10,20")
    p.add_argument("--vector-cache", type=Path, default=Path(".pgr-cache/vectors"))
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--edge", action="store_true", help="also time EdgeStore with and without its cue index")
    p.add_argument("--user", action="append", default=None, help="only this user's facts and questions (repeatable)")
    args = p.parse_args()
    ks = [int(k) for k in args.k.split(",")]
    data = load_set(args.kind, args.data).select(users=args.user)
    questions = [q for q in data.questions if q.gold]
    from pgr_core import MiniLMEmbedder

    embedder = disk_cached_embedder(MiniLMEmbedder(), args.vector_cache)
    store = build_store(data.facts, embedder)
    wrapped = Anticipating(store, scoring="max")  # the weights below are the max rule's
    writer = CueWriter(CacheOnly(args.model), cues_per_fact=args.cues_per_fact, cache=CueCache(args.cue_cache))
    started = time.perf_counter()
    owners = list(dict.fromkeys(f.scope for f in store.facts))
    built = [wrapped.build(writer, scope=o) for o in owners]
    cued = sum(r.cued for r in built)
    print(
        f"{len(store.facts)} facts, {cued} with cues from the cache ({time.perf_counter() - started:.1f}s), "
        f"{len(questions)} questions with gold",
        file=sys.stderr,
    )
    rows: dict[str, dict[str, float]] = {"query-only (plain store)": recalls(store, questions, ks)}
    for weight in [float(w) for w in args.weights.split(",")]:
        wrapped.cue_weight = weight
        rows[f"query-only over Anticipating, cue weight {weight:g}"] = recalls(wrapped, questions, ks)
    for depth in (1, 4, 8):
        wrapped.cue_depth, wrapped.cue_weight = depth, 0.9
        rows[f"query-only over Anticipating, cue weight 0.9, {depth} x K cue hits per probe"] = recalls(
            wrapped, questions, ks
        )
    wrapped.cue_depth = 2
    wrapped.cue_weight = 0.9
    centred = Anticipating(store, cues=wrapped.cues, scoring="centred")  # the same cue index
    rows["query-only over Anticipating, scoring=centred"] = recalls(centred, questions, ks)
    rows["pgr-feedback (plain store, centred by pgr)"] = recalls(store, questions, ks, strategy="feedback")
    rows["pgr-feedback over Anticipating, scoring=centred"] = recalls(centred, questions, ks, strategy="feedback")
    rows["query-only over Anticipating, scoring=centred, nearest=None (the whole mean)"] = recalls(
        Anticipating(store, cues=wrapped.cues, scoring="centred", nearest=None), questions, ks
    )
    timing = latency(store, wrapped, questions, centred)
    timing["trust"] = judging(store, wrapped.cues, owners)
    timing |= cold(store, wrapped.cues, questions)
    print(
        f"query-only latency, median of {timing['queries']} (each question 3 times, interleaved): "
        f"plain {timing['plain_ms']:.2f} ms, through Anticipating {timing['cued_ms']:.2f} ms, "
        f"centred {timing['centred_ms']:.2f} ms (against the whole mean {timing['centred_whole_mean_ms']:.2f} ms); "
        f"a user's first centred search cold {timing['cold_nearest_ms']:.2f} ms "
        f"(against the whole mean {timing['cold_whole_mean_ms']:.2f} ms); "
        f"judging a user's cue trust cold {timing['trust']['judge_ms']:.2f} ms; "
        f"the feedback round {timing['plain_feedback_ms']:.2f} ms plain, "
        f"{timing['centred_feedback_ms']:.2f} ms centred",
        file=sys.stderr,
    )
    if args.edge:
        import tempfile

        from pgr_core import EdgeStore

        with (
            tempfile.TemporaryDirectory() as work,
            EdgeStore.open(Path(work) / "s", embedder=embedder, create=True) as edge,
        ):
            edge.add_from(store)
            with Anticipating(edge, scoring="max") as edge_cued:  # its cue index: <dir>/cues, another EdgeStore
                for owner in owners:
                    edge_cued.build(writer, scope=owner)
                edge_centred = Anticipating(edge, cues=edge_cued.cues, scoring="centred")
                timing["edge"] = latency(edge, edge_cued, questions, edge_centred)
                timing["edge"]["recall_cued"] = recalls(edge_cued, questions, ks)
                timing["edge"]["recall_centred"] = recalls(edge_centred, questions, ks)
                timing["edge"]["trust"] = judging(edge, edge_cued.cues, owners)
        print(
            f"EdgeStore: plain {timing['edge']['plain_ms']:.2f} ms, through Anticipating "
            f"{timing['edge']['cued_ms']:.2f} ms (recall {timing['edge']['recall_cued']}), centred "
            f"{timing['edge']['centred_ms']:.2f} ms (recall {timing['edge']['recall_centred']}; against the whole "
            f"mean {timing['edge']['centred_whole_mean_ms']:.2f} ms); judging a user's "
            f"cue trust cold {timing['edge']['trust']['judge_ms']:.2f} ms; the feedback round "
            f"{timing['edge']['plain_feedback_ms']:.2f} ms plain, "
            f"{timing['edge']['centred_feedback_ms']:.2f} ms centred",
            file=sys.stderr,
        )
    header = "| method | " + " | ".join(f"recall@{k}" for k in ks) + " |"
    print(header)
    print("|---|" + "---|" * len(ks))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[f'recall@{k}']:.3f}" for k in ks) + " |")
    if args.json:
        report = {"data": str(args.data), "facts": len(store.facts), "cued": cued, "questions": len(questions)}
        args.json.write_text(json.dumps(report | {"rows": rows, "latency": timing}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
