"""How deep a step probe should read: the same steps re-probed at other K and τ, with no LLM.

    python lab/probe_depth_replay.py --data ../shared/data/mq-lite/dev-facts.jsonl \\
        --records mq-facts.records.jsonl [--methods pgr-cot] [--vector-cache .pgr-cache/vectors] [--json out.json]

A ``pgr eval`` records file keeps every round's probes (the step texts the LLM wrote) in each PGR
record's compact trace. This script embeds those texts again, searches the same store (MiniLM, the
facts of the data set, each question under its own scope) at each (K, τ) of the grid, and ranks R
exactly as pgr does (:func:`pgr_core.policy.ranking.shared_order` at ``query_share`` 0.75; the query's own
probe read to ``query_top_k`` = 20, as recorded). The steps stay as the run wrote them, so this
measures the probes' depth alone: in a real run Phase 2 would see the other finds and could write
other steps, and the rounds it adds are replayed with their recorded texts. "recorded" is the run's
own R* order, the check that the replay at the run's K and τ gives what the run gave.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ranking_replay import arguments, averaged, methods_of, pgr_records, publish, rebuild, tally

from pgr_core import MiniLMEmbedder, SearchParams
from pgr_core.evaluation import load_set
from pgr_core.evaluation.runner import build_store
from pgr_core.policy.ranking import shared_order

GRID = ((5, 0.3), (5, 0.2), (5, 0.0), (10, 0.3), (10, 0.2), (10, 0.0), (20, 0.0))


def reprobe(
    store: Any, trace: Sequence[Mapping[str, Any]], scope: Any, k: int, tau: float, share: float
) -> tuple[list[str], int]:
    """R* of one record with every step probe re-read at (k, tau); the query's probe as recorded."""
    rounds = [rnd for rnd in trace if rnd["phase"] != "augment"]
    steps = [text for rnd in rounds for step_id, text, _ in rnd["probes"] if step_id is not None]
    fresh = iter(store.search_batch(steps, scope=scope, params=SearchParams(top_k=k, min_score=tau)) if steps else [])
    reread = [
        {
            "phase": rnd["phase"],
            "probes": [
                (step_id, text, ids if step_id is None else [h.fact.id for h in next(fresh)])
                for step_id, text, ids in rnd["probes"]
            ],
        }
        for rnd in rounds
    ]
    found, probes = rebuild(reread)
    return [f.id for f in shared_order(found, probes, share)], len(found)


def replay(
    data_path: Path, records_path: Path, methods: Sequence[str] | None, vector_cache: Path | None, share: float
) -> dict[str, Any]:
    embedder: Any = MiniLMEmbedder()
    if vector_cache is not None:
        from pgr_core.evaluation.cache import disk_cached_embedder

        embedder = disk_cached_embedder(embedder, vector_cache)
    data = load_set("jsonl", data_path)
    store = build_store(data.facts, embedder)
    report: dict[str, Any] = {}
    for r, q, deep in pgr_records(data, records_path, methods):
        rows = report.setdefault(r["method"], {})
        tally(rows, "query-only", deep, q, size=20)
        tally(rows, "recorded", r["ids"], q, size=len(r["ids"]))
        for k, tau in GRID:
            ids, size = reprobe(store, r["extra"]["trace"], q.scope, k, tau, share)
            tally(rows, f"K={k} τ={tau:g}", ids, q, size=size)
    return averaged(report)


def main(argv: Sequence[str] | None = None) -> int:
    ap = arguments(__doc__ or "")
    ap.add_argument("--vector-cache", type=Path, default=None, help="pgr eval's vector cache folder")
    ap.add_argument("--query-share", type=float, default=0.75)
    args = ap.parse_args(argv)
    report = replay(args.data, args.records, methods_of(args), args.vector_cache, args.query_share)
    heading = "the recorded steps re-probed (n = questions; R = facts found)"
    return publish(report, heading, "step probes", args.json, size=True)


if __name__ == "__main__":
    sys.exit(main())
