"""What each phase of PGR adds: where each reference was first found, and whether R*'s head kept it.

    python lab/phase_gains.py --data ../shared/data/mq-lite/dev-facts.jsonl \\
        --records lab/results/capable/mq-facts-llm.records.jsonl [--methods pgr-cot,pgr-tot]

From each PGR record's compact trace (every round's phase, probes and the ids each returned), a
reference is credited to the first of: augmentation (the query's strict lookup whose records the LLM
restates the request from), Phase 1's request list, Phase 1's q_A probe, Phase 1's steps, then each
Phase-2 round. Read with recall: a find counts for the user only if R*'s first 10 or 20 hold it.
Degraded records are left out.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from pgr_core.evaluation import load_set


def first_found(trace: list[dict], query: str) -> dict[str, str]:
    where: dict[str, str] = {}
    phase2 = 0
    for rnd in trace:
        phase = rnd["phase"]
        if phase == "personalized":
            phase2 += 1
        for step_id, text, ids in rnd["probes"]:
            if phase == "augment":
                label = "augmentation"
            elif phase == "personalized":
                label = f"phase 2, round {phase2}"
            elif step_id is not None:
                label = "phase 1, steps"
            elif text == query:
                label = "phase 1, the request"
            else:
                label = "phase 1, q_A"
            for fid in ids:
                where.setdefault(fid, label)
    return where


def rank(label: str, order: list[str]) -> int:
    """Phases in the order they run: Phase 1's parts, then Phase-2 rounds by number."""
    return order.index(label) if label in order else len(order) + int(label.split()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--records", required=True)
    ap.add_argument("--methods", default="pgr-cot,pgr-tot")
    args = ap.parse_args()
    data = load_set("jsonl", args.data)
    by_id = {q.id: q for q in data.questions}
    order = ["augmentation", "phase 1, the request", "phase 1, q_A", "phase 1, steps"]
    for method in args.methods.split(","):
        counts: Counter[str] = Counter()
        kept10: Counter[str] = Counter()
        kept20: Counter[str] = Counter()
        total = 0
        for line in Path(args.records).read_text(encoding="utf-8").splitlines()[1:]:
            r = json.loads(line)
            if r["method"] != method or r.get("degraded") or "extra" not in r:
                continue
            q = by_id[r["question"]]
            where = first_found(r["extra"]["trace"], q.question)
            for item in q.gold:
                total += 1
                ids = [item] if isinstance(item, str) else list(item)
                hits = [where[i] for i in ids if i in where]
                label = min(hits, key=lambda h: rank(h, order)) if hits else "never found"
                counts[label] += 1
                if any(i in r["ids"][:10] for i in ids):
                    kept10[label] += 1
                if any(i in r["ids"][:20] for i in ids):
                    kept20[label] += 1
        rounds = sorted((k for k in counts if k.startswith("phase 2")), key=lambda k: int(k.split()[-1]))
        print(f"\n{method}: {total} references")
        print("| first found by | references | share | in R*'s top 10 | in R*'s top 20 |")
        print("|---|---|---|---|---|")
        for label in [*order, *rounds, "never found"]:
            if counts[label]:
                print(
                    f"| {label} | {counts[label]} | {counts[label] / total:.3f} | {kept10[label]} | {kept20[label]} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
