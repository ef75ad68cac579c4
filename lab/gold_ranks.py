"""Where each gold fact sits in the lists a ``pgr eval`` run recorded: below a saturated recall@20 (a
set where the question alone finds almost every gold fact), the rank shows whether a change pushed the
gold down or lifted it.

    python lab/gold_ranks.py prefeval --data ../shared/data/prefeval --per-topic 5 --fillers 5 \\
        --filler-pool 6 --records plain.records.jsonl cued.records.jsonl [--methods query-only] [--json out.json]

The set is loaded with the options the run used (the gold comes from it, not from the records). For
every records file and method, each gold item (a fact id, or a group found when any of its ids is)
gets the 1-based rank of its first id in the recorded list, or none when the list misses it. Printed
per file and method: how many gold items, the share at rank 1, within 3, 5, 10 and 20, the mean
reciprocal rank (a missing item counts 0) and how many the list missed. No store, model or LLM call.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pgr_core.cli.main import dataset_arguments, dataset_options
from pgr_core.evaluation import load_set

CUTS = (1, 3, 5, 10, 20)


def rank_of(gold: str | Sequence[str], ids: Sequence[str]) -> int | None:
    """The 1-based rank of ``gold`` (an id, or a group: its earliest id) in ``ids``; None if absent."""
    members = [gold] if isinstance(gold, str) else list(gold)
    found = [ids.index(m) + 1 for m in members if m in ids]
    return min(found) if found else None


def summarise(ranks: Sequence[int | None]) -> dict[str, Any]:
    n = len(ranks)
    row: dict[str, Any] = {"gold": n}
    for cut in CUTS:
        row[f"at_{cut}"] = round(sum(1 for r in ranks if r is not None and r <= cut) / n, 3) if n else None
    row["mrr"] = round(sum(1 / r for r in ranks if r is not None) / n, 3) if n else None
    row["missed"] = sum(1 for r in ranks if r is None)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dataset", choices=["locomo", "prefeval", "memoryquest", "jsonl"])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--records", type=Path, nargs="+", required=True, help="pgr eval records files (*.records.jsonl)")
    ap.add_argument("--methods", default=None, help="comma-separated; default every method in the files")
    dataset_arguments(ap)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    data = load_set(args.dataset, args.data, **dataset_options(args))
    gold = {q.id: list(q.gold) for q in data.questions}
    wanted = None if args.methods is None else {m.strip() for m in args.methods.split(",") if m.strip()}
    out: dict[str, dict[str, Any]] = {}
    for path in args.records:
        ranks: dict[str, list[int | None]] = {}
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                rec = json.loads(line)
                method = rec.get("method")
                if not method or method.startswith("_") or (wanted is not None and method not in wanted):
                    continue  # the header, and the runner's own baseline lists
                if rec.get("question") not in gold:
                    print(f"{path}: question {rec.get('question')!r} is not in this set: load it as the run did")
                    return 2
                ranks.setdefault(method, []).extend(rank_of(g, rec["ids"]) for g in gold[rec["question"]])
        out[str(path)] = {m: summarise(r) for m, r in ranks.items()}
    header = ["records", "method", "gold", *(f"rank ≤ {c}" for c in CUTS), "MRR", "missed"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for path, methods in out.items():
        for method, row in methods.items():
            cells = [Path(path).name, method, str(row["gold"]), *(f"{row[f'at_{c}']:.3f}" for c in CUTS)]
            print("| " + " | ".join([*cells, f"{row['mrr']:.3f}", str(row["missed"])]) + " |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
        print(f"json: {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
