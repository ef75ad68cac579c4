"""Dense alone against BM25 + dense (fused by RRF in the engine) on EdgeStore, at the same number of facts.

    python lab/hybrid.py [--data ../shared/data] [--sets mq-facts,mq-turns,locomo] [--k 10,20] [--json out.json]

For each data set, every fact goes into two EdgeStores built from the same MiniLM vectors (cached on
disk, ``--vector-cache``): one dense, one ``hybrid=True``. Each question's own probe (query-only,
K = 20, no τ) is run on both, and recall@K against the gold facts is averaged over the questions.
No LLM. The figures decide ``EdgeStore``'s default (``hybrid=False`` unless BM25 wins here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pgr_core import EdgeStore, MiniLMEmbedder, SearchParams
from pgr_core.evaluation import load_set
from pgr_core.evaluation.cache import DiskCachedEmbedder
from pgr_core.evaluation.metrics import recall_at
from pgr_core.evaluation.runner import embed_in_chunks

SETS = {
    "mq-facts": ("jsonl", "mq-lite/dev-facts.jsonl"),
    "mq-turns": ("jsonl", "mq-lite/dev-turns.jsonl"),
    "locomo": ("locomo", "locomo"),
}


def run(name: str, args: argparse.Namespace, model: Any, work: Path) -> dict[str, Any]:
    kind, rel = SETS[name]
    data = load_set(kind, args.data / rel)
    questions = [q for q in data.questions if q.gold]  # recall needs gold facts
    facts = list(data.facts)
    print(f"{name}: {len(facts):,} facts, {len(questions):,} questions with gold", file=sys.stderr, flush=True)
    vectors = embed_in_chunks(model.embed, [f.text for f in facts], f"{name}: embedding facts", dim=model.dim)
    out: dict[str, Any] = {"facts": len(facts), "questions": len(questions)}
    k_max = max(args.k)
    for hybrid in (False, True):
        label = "hybrid" if hybrid else "dense"
        with EdgeStore.open(work / f"{name}-{label}", embedder=model, create=True, hybrid=hybrid) as store:
            store.add_facts(facts, vectors=vectors)
            recalls: dict[int, list[float]] = {k: [] for k in args.k}
            t0 = time.perf_counter()
            for q in questions:
                hits = store.search_batch([q.question], scope=q.scope, params=SearchParams(top_k=k_max, min_score=0.0))
                ids = [h.fact.id for h in hits[0]]
                for k in args.k:
                    recalls[k].append(recall_at(ids, q.gold, k, missing=q.missing))
            seconds = time.perf_counter() - t0
        out[label] = {f"recall@{k}": statistics.fmean(v) for k, v in recalls.items() if v}
        out[label]["ms_per_question"] = 1000 * seconds / max(1, len(questions))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--k", default="10,20")
    ap.add_argument("--vector-cache", type=Path, default=Path(".pgr-cache/vectors"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    args.k = [int(k) for k in args.k.split(",")]
    names = [n.strip() for n in args.sets.split(",") if n.strip()]
    unknown = [n for n in names if n not in SETS]
    if unknown:
        ap.error(f"unknown set(s) {unknown}; choose from {', '.join(SETS)}")
    model = DiskCachedEmbedder(MiniLMEmbedder(), args.vector_cache)
    work = Path(tempfile.mkdtemp(prefix="pgr-hybrid-"))
    report = {}
    for name in names:
        if not (args.data / SETS[name][1]).exists():
            print(f"{name}: skipped, no data at {args.data / SETS[name][1]}", file=sys.stderr)
            continue
        report[name] = run(name, args, model, work)
    cols = [f"recall@{k}" for k in args.k]
    print("| data set | facts | questions | " + " | ".join(f"dense {c} | hybrid {c}" for c in cols) + " |")
    print("|---" * (3 + 2 * len(cols)) + "|")
    for name, r in report.items():
        cells = " | ".join(f"{r['dense'][c]:.3f} | {r['hybrid'][c]:.3f}" for c in cols)
        print(f"| {name} | {r['facts']:,} | {r['questions']:,} | {cells} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
