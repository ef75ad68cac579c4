"""Do the LLM's steps carry signal a ranking could use? Every fact of the user scored offline against
the request, its restatement q_A and the recorded steps, each centred as pgr centres a probe.

    python lab/step_scores_replay.py --data ../shared/data/mq-lite/dev-facts.jsonl \\
        --records mq-e2.records.jsonl [--methods pgr-cot] [--vector-cache .pgr-cache/vectors] [--json out.json]

A ``pgr eval`` records file keeps every round's probe texts in each PGR record's compact trace. This
script embeds the request, q_A and every step text again (MiniLM, as the run did), and scores each of
the user's facts by its cosine less its typicality (its cosine to the mean of the user's facts:
pgr's centring at w = 1, read over every fact rather than a probe's top 100). Each rule below is then a
ranking over all of the user's facts, cut at 10, 20, 30 and 40, against the request's own centred
list (``request``: what pgr returns with no LLM) at the same sizes:

- ``request + L x best step``: the request's centred score plus L times the fact's best centred
  score over the steps (the rule ``Anticipating`` uses for cues, with the steps as the cues);
- ``request + L x best step, top 5 only``: the same, a step counting only for the 5 facts it would
  return (K = 5, as pgr reads a step; the rest take the lowest of those);
- ``max(request, q_A)`` and ``request + 0.5 x q_A``: the restatement as a second query.

No LLM and no store call: the steps are the run's. If no rule beats ``request`` at some size, no
order of R* can make these steps count there.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ranking_replay import arguments, methods_of, pgr_records

from pgr_core import MiniLMEmbedder
from pgr_core.evaluation import load_set
from pgr_core.evaluation.metrics import recall_at
from pgr_core.models.embedders import unit_rows

SIZES = (10, 20, 30, 40)
WEIGHTS = (0.25, 0.5, 1.0)


def texts_of(trace: Sequence[Any], request: str) -> tuple[str | None, list[str]]:
    """q_A (the query-side probe that is not the request) and the step texts, in order."""
    restated: str | None = None
    steps: list[str] = []
    for rnd in trace:
        if rnd["phase"] == "augment":
            continue
        for step_id, text, _ in rnd["probes"]:
            if step_id is None:
                restated = text if text != request else restated
            else:
                steps.append(text)
    return restated, steps


def rules(request: np.ndarray, restated: np.ndarray | None, steps: list[np.ndarray]) -> dict[str, np.ndarray]:
    out = {"request (pgr with no LLM)": request}
    if steps:
        best = np.max(steps, axis=0)
        top5 = np.full(request.shape, -np.inf)
        for s in steps:
            o = np.argsort(-s)[:5]
            top5[o] = np.maximum(top5[o], s[o])
        top5 = np.where(np.isfinite(top5), top5, top5[np.isfinite(top5)].min())
        for w in WEIGHTS:
            out[f"request + {w:g} x best step"] = request + w * best
            out[f"request + {w:g} x best step, top 5 only"] = request + w * top5
    if restated is not None:
        out["max(request, q_A)"] = np.maximum(request, restated)
        out["request + 0.5 x q_A"] = request + 0.5 * restated
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = arguments(__doc__ or "")
    ap.add_argument("--vector-cache", type=Path, default=None, help="pgr eval's vector cache folder")
    args = ap.parse_args(argv)
    embedder: Any = MiniLMEmbedder()
    if args.vector_cache is not None:
        from pgr_core.evaluation.cache import disk_cached_embedder

        embedder = disk_cached_embedder(embedder, args.vector_cache)
    data = load_set("jsonl", args.data)
    vectors = unit_rows(embedder.embed([f.text for f in data.facts]))
    table: dict[str, dict[str, dict[int, list[float]]]] = {}
    for r, q, _ in pgr_records(data, args.records, methods_of(args)):
        mine = [i for i, f in enumerate(data.facts) if f.scope == q.scope]
        ids = [data.facts[i].id for i in mine]
        own = vectors[mine]
        typical = own @ own.mean(0)
        restated, steps = texts_of(r["extra"]["trace"], q.question)
        asked = unit_rows(embedder.embed([q.question, *([restated] if restated else []), *steps]))
        centred = [own @ v - typical for v in asked]
        scored = rules(centred[0], centred[1] if restated else None, centred[2 if restated else 1 :])
        rows = table.setdefault(r["method"], {})
        for name, scores in scored.items():
            order = [ids[j] for j in np.argsort(-scores, kind="stable")]
            cell = rows.setdefault(name, {k: [] for k in SIZES})
            for k in SIZES:
                cell[k].append(recall_at(order, q.gold, k, missing=q.missing))
    if not table:
        print("no pgr-* records with a compact trace in that file", file=sys.stderr)
        return 1
    report = {
        method: {name: {f"recall@{k}": statistics.fmean(cell[k]) for k in SIZES} for name, cell in rows.items()}
        for method, rows in table.items()
    }
    for method, means in report.items():
        n = len(next(iter(table[method].values()))[SIZES[0]])
        print(f"\n{method}: every fact of the user ranked by each rule ({n} questions)\n")
        print(f"| rule | {' | '.join(f'recall@{k}' for k in SIZES)} |\n|{'---|' * (len(SIZES) + 1)}")
        for name, mean in means.items():
            cells = " | ".join(f"{mean['recall@' + str(k)]:.3f}" for k in SIZES)
            print(f"| {name} | {cells} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
        print(f"\njson: {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
