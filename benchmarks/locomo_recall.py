"""LoCoMo evidence recall: query-only against PGR's prospectors, at equal numbers of returned facts.

    python benchmarks/locomo_recall.py --data ../shared/data/locomo --limit 300 --json out.json

Every turn is one fact (MiniLM), each conversation its own scope. For each question with gold
evidence, each method returns a ranked list; recall@N is the share of the question's evidence turns
(unresolvable evidence ids count as misses) among its first N facts, neighbours included. "all" is
the method's whole list, whose mean length is printed beside it. Methods with an LLM read
PGR_LLM_BASE_URL / PGR_LLM_MODEL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from pgr_core import PGR, FacetProspector, InMemoryStore, MiniLMEmbedder, llm_from_env
from pgr_core.datasets import load_locomo

BUDGETS = (10, 20, 35)


def recall(found: list[str], gold: list[str], missing: int) -> float:
    total = len(gold) + missing
    return sum(1 for g in gold if g in set(found)) / total if total else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data/locomo")
    ap.add_argument("--limit", type=int, default=None, help="first N questions with evidence")
    ap.add_argument("--every", type=int, default=1, help="take every k-th question (a spread sample)")
    ap.add_argument("--methods", default="query-only,query-only+w1,pgr-facet,pgr-facet+w1")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--set", action="append", default=[], help="PGRConfig override, e.g. --set query_weight=2")
    args = ap.parse_args()
    data_path = Path(args.data)
    if not data_path.exists():
        print(f"LoCoMo not found at {data_path}: pass --data PATH (see ../shared/data/README.md)", file=sys.stderr)
        return 2

    locomo = load_locomo(data_path)
    questions = [q for q in locomo.questions if q.evidence or q.unresolved][:: args.every]
    if args.limit:
        questions = questions[: args.limit]
    t0 = time.perf_counter()
    store = InMemoryStore(embedder=MiniLMEmbedder())
    store.add_facts(locomo.facts)
    print(f"embedded {len(store)} turns in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

    overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    llm = llm_from_env()
    pgrs: dict[str, PGR] = {}
    for name in args.methods.split(","):
        base, _, window = name.partition("+w")
        w = int(window or 0)
        if base == "query-only":
            pgrs[name] = PGR(store, strategy="facet", window=w)
        elif base == "pgr-facet":
            pgrs[name] = PGR(store, strategy=FacetProspector(), window=w, **overrides)
        elif base in ("pgr-cot", "pgr-tot"):
            if llm is None:
                print(f"skipping {name}: no LLM configured (PGR_LLM_BASE_URL)", file=sys.stderr)
                continue
            pgrs[name] = PGR(store, llm=llm, strategy=base[4:], window=w, **overrides)
        else:
            raise SystemExit(f"unknown method {name}")

    baseline = PGR(store, strategy="facet")
    rows: dict[str, dict[str, list[float]]] = {m: defaultdict(list) for m in pgrs}
    by_cat: dict[str, dict[int, list[float]]] = {m: defaultdict(list) for m in pgrs}
    cost: dict[str, dict[str, list[float]]] = {m: defaultdict(list) for m in pgrs}
    started = time.perf_counter()
    # how close each question's nearest evidence turn is to it: the lowest third are the "hard" ones,
    # where the answer shares least with the question
    q_vecs = store.embedder.embed([q.question for q in questions])
    closeness = []
    for vec, q in zip(q_vecs, questions, strict=True):
        evidence_rows = [store._ids[e] for e in q.evidence]
        closeness.append(float(max(store._vectors[evidence_rows] @ vec)) if evidence_rows else -1.0)
    hard = set(sorted(range(len(questions)), key=lambda i: closeness[i])[: len(questions) // 3])
    hard_rows: dict[str, list[float]] = {m: [] for m in pgrs}

    for n, q in enumerate(questions, 1):
        scope = locomo.scope_of(q)
        for name, pgr in pgrs.items():
            if name.startswith("query-only"):
                result = pgr.query_only(q.question, scope=scope, date=q.date, top_k=max(BUDGETS))
            else:
                result = pgr.retrieve(q.question, scope=scope, date=q.date)
            ids = result.ids
            for b in BUDGETS:
                rows[name][f"@{b}"].append(recall(ids[:b], q.evidence, len(q.unresolved)))
            rows[name]["all"].append(recall(ids, q.evidence, len(q.unresolved)))
            rows[name]["size"].append(len(ids))
            if not name.startswith("query-only"):
                # the baseline given the same number of facts this method returned for this question
                same = baseline.query_only(q.question, scope=scope, date=q.date, top_k=max(len(ids), 1))
                rows[name]["qo_same"].append(recall(same.ids, q.evidence, len(q.unresolved)))
            by_cat[name][q.category].append(recall(ids[:20], q.evidence, len(q.unresolved)))
            if n - 1 in hard:
                hard_rows[name].append(recall(ids[:20], q.evidence, len(q.unresolved)))
            cost[name]["llm_calls"].append(result.trace.usage.llm_calls)
            cost[name]["tokens"].append(result.trace.usage.prompt_tokens + result.trace.usage.completion_tokens)
            cost[name]["store_calls"].append(result.trace.store_calls)
            cost[name]["seconds"].append(result.trace.seconds)
        if n % 25 == 0 or n == len(questions):
            rate = n / (time.perf_counter() - started)
            print(f"  {n}/{len(questions)} questions ({rate:.1f}/s)", file=sys.stderr, flush=True)

    mean = statistics.fmean
    print(f"\nLoCoMo: {len(questions)} questions with evidence; {locomo.unresolved_evidence} evidence ids unresolvable")
    print(
        "| method | recall@10 | recall@20 | recall@35 | recall (all) | mean facts | query-only at the same size "
        "| recall@20, hard third | LLM calls | store calls | s/query |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    out = {"dataset": "locomo", "questions": len(questions), "methods": {}}
    for name in pgrs:
        r, c = rows[name], cost[name]
        print(
            f"| {name} | {mean(r['@10']):.3f} | {mean(r['@20']):.3f} | {mean(r['@35']):.3f} | {mean(r['all']):.3f} "
            f"| {mean(r['size']):.1f} | {mean(r['qo_same']) if r['qo_same'] else float('nan'):.3f} "
            f"| {mean(hard_rows[name]) if hard_rows[name] else float('nan'):.3f} "
            f"| {mean(c['llm_calls']):.2f} | {mean(c['store_calls']):.2f} "
            f"| {mean(c['seconds']):.3f} |"
        )
        out["methods"][name] = {
            "recall_at": {str(b): mean(r[f"@{b}"]) for b in BUDGETS},
            "recall": mean(r["all"]),
            "mean_facts": mean(r["size"]),
            "query_only_same_size": mean(r["qo_same"]) if r["qo_same"] else None,
            "recall_at_20_hard_third": mean(hard_rows[name]) if hard_rows[name] else None,
            "by_category_at20": {str(k): mean(v) for k, v in sorted(by_cat[name].items())},
            **{k: mean(v) for k, v in c.items()},
        }
    print("\nrecall@20 by LoCoMo category:")
    cats = sorted({k for m in by_cat.values() for k in m})
    print("| method | " + " | ".join(f"cat {k}" for k in cats) + " |")
    print("|---|" + "---|" * len(cats))
    for name in pgrs:
        print(f"| {name} | " + " | ".join(f"{mean(by_cat[name][k]):.3f}" for k in cats) + " |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
