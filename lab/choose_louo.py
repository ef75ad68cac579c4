"""Choose a setting by leave-one-user-out: pick on two users, score the third, for every user.

    python lab/choose_louo.py --data ../shared/data/mq-lite/dev-facts.jsonl \\
        --methods pgr-cot,pgr-tot --run shared-0.75=runs/a.records.jsonl --run scored=runs/b.records.jsonl \\
        [--json out.json]

Each ``--run NAME=PATH`` (``NAME=PATH@METHODS``: other methods of that file) is a ``pgr eval``
records file written under one candidate setting (with
llm-relay replaying recorded replies, a candidate that changes only the ranking or the number of
rounds costs no LLM call: ``pgr eval ... --set ranking=scored``). A setting is scored per user by the
mean over ``--methods`` of recall@10 + recall@20 (both budgets a user may have: 10 facts and 20).

For each user: the setting with the best score on the other users (ties: the earlier ``--run``), and
what it reads on the held-out user. The held-out mean is the figure to report for the chosen default;
the in-sample row (the best setting on all users, read on all users) is printed beside it, never
instead of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pgr_core.evaluation import EvalSet, load_set
from pgr_core.evaluation.metrics import recall_at, recall_exact

BUDGETS = (10, 20)


def per_question(data: EvalSet, path: Path, methods: Sequence[str]) -> dict[str, dict[str, dict[str, float]]]:
    """{method: {question id: {"r10", "r20", "exact20"}}} from one records file; degraded records are not read."""
    by_id = {q.id: q for q in data.questions}
    out: dict[str, dict[str, dict[str, float]]] = {m: {} for m in methods}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        r = json.loads(line)
        if r.get("method") not in out or r.get("degraded"):
            continue
        q = by_id[r["question"]]
        ids = r["ids"]
        out[r["method"]][q.id] = {
            "r10": recall_at(ids, q.gold, 10, missing=q.missing),
            "r20": recall_at(ids, q.gold, 20, missing=q.missing),
            "exact20": recall_exact(ids[:20], q.gold, missing=q.missing),
        }
    return out


def user_of(question_id: str) -> str:
    return question_id.split(":", 1)[0]


def scores(rows: Mapping[str, Mapping[str, Mapping[str, float]]], users: Sequence[str]) -> dict[str, dict[str, float]]:
    """{user: {"score", "r10", "r20"}}: the mean over methods and the user's questions."""
    out: dict[str, dict[str, float]] = {}
    for u in users:
        cells = [v for m in rows.values() for q, v in m.items() if user_of(q) == u]
        if not cells:
            continue
        r10 = statistics.fmean(c["r10"] for c in cells)
        r20 = statistics.fmean(c["r20"] for c in cells)
        out[u] = {"score": r10 + r20, "r10": r10, "r20": r20, "n": len(cells)}
    return out


def pooled(per_user: Mapping[str, Mapping[str, float]], users: Sequence[str]) -> dict[str, float]:
    """Question-weighted means over ``users``."""
    n = sum(per_user[u]["n"] for u in users)
    return {k: sum(per_user[u][k] * per_user[u]["n"] for u in users) / n for k in ("score", "r10", "r20")}


def leave_one_user_out(table: Mapping[str, Mapping[str, Mapping[str, float]]], users: Sequence[str]) -> dict[str, Any]:
    names = list(table)
    held: dict[str, Any] = {}
    for u in users:
        others = [o for o in users if o != u]
        best = max(names, key=lambda n: (pooled(table[n], others)["score"], -names.index(n)))
        held[u] = {"chosen": best, **table[best][u]}
    n = sum(held[u]["n"] for u in users)
    mean = {k: sum(held[u][k] * held[u]["n"] for u in users) / n for k in ("r10", "r20")}
    in_sample = max(names, key=lambda n: (pooled(table[n], users)["score"], -names.index(n)))
    return {
        "held_out": held,
        "held_out_mean": mean,
        "in_sample": in_sample,
        "in_sample_mean": pooled(table[in_sample], users),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--kind", default="jsonl")
    ap.add_argument("--methods", default="pgr-cot,pgr-tot")
    ap.add_argument(
        "--run", action="append", required=True, help="NAME=PATH of a records file (PATH@M1,M2: its own methods)"
    )
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    data = load_set(args.kind, args.data)
    methods = args.methods.split(",")
    users = sorted({user_of(q.id) for q in data.questions})
    runs: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for spec in args.run:
        name, _, path = spec.partition("=")
        path, _, own = path.partition("@")  # PATH@METHODS: this run's own methods
        runs[name] = per_question(data, Path(path), own.split(",") if own else methods)
    # every setting is read on the same questions: those every run answered for every method
    common = set.intersection(*(set(v) for rows in runs.values() for v in rows.values()))
    if len(common) < len(data.questions):
        print(f"read on the {len(common)} of {len(data.questions)} questions every run answered", file=sys.stderr)
    table = {
        name: scores({m: {q: v for q, v in per.items() if q in common} for m, per in rows.items()}, users)
        for name, rows in runs.items()
    }
    result = leave_one_user_out(table, users)
    print(f"| setting | {' | '.join(f'{u} r@10 / r@20' for u in users)} | all r@10 | all r@20 |")
    print("|---|" + "---|" * (len(users) + 2))
    for name, per_user in table.items():
        cells = " | ".join(f"{per_user[u]['r10']:.3f} / {per_user[u]['r20']:.3f}" for u in users)
        allm = pooled(per_user, users)
        print(f"| {name} | {cells} | {allm['r10']:.3f} | {allm['r20']:.3f} |")
    print()
    for u, h in result["held_out"].items():
        print(f"held out {u}: chosen on the others {h['chosen']!r}, reads r@10 {h['r10']:.3f}, r@20 {h['r20']:.3f}")
    m = result["held_out_mean"]
    print(f"leave-one-user-out mean: r@10 {m['r10']:.3f}, r@20 {m['r20']:.3f}")
    s = result["in_sample_mean"]
    print(f"in-sample best {result['in_sample']!r}: r@10 {s['r10']:.3f}, r@20 {s['r20']:.3f} (in-sample, not a result)")
    if args.json:
        Path(args.json).write_text(json.dumps({"table": table, **result}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
