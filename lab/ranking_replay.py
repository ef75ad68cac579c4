"""What each ranking strategy does with the same steps: recall@K of R* re-ordered offline.

    python lab/ranking_replay.py --data ../shared/data/mq-lite/dev-facts.jsonl \\
        --records lab/results/mq-facts.records.jsonl [--methods pgr-cot,pgr-tot] [--json out.json]

A ``pgr eval`` records file holds, for each PGR question, the probes of every round and what each
returned (its compact trace), and for each question the query's own deep list (``_deep``, 400 facts).
Re-ordering R* needs neither the LLM nor the store, so every strategy is scored on exactly the steps
and hits the run produced:

- ``query-only``: the question's own top K (the baseline, from ``_deep``);
- ``fused``: best weighted reciprocal rank (query weight 1.5), pgr's ``ranking="fused"``;
- ``shared@S``: pgr's ``ranking="shared"`` with ``query_share=S``;
- ``recorded``: R* as the run ordered it (its own ranking option);
- ``rrf-sum@W``: reciprocal-rank fusion summed over the step probes and the query's own list read to
  depth 100 (weight W), as QueryFusion fuses its queries (candidates to read, not pgr options);
- ``corroborated@S``: shared slots, but a step find that the query's own list also holds within its
  top 100 goes before one it does not (the query's rank breaking ties).

Window neighbours are not in the compact trace: use it on runs without a window. Nor are the probes'
centred scores: the query pool is rebuilt by rank, so on runs made with centring and the q_A probe (the
defaults since issue 10's centring) ``shared@S`` does not reproduce the run's own order (9 MQ-lite
questions, pgr-tot: 0.267 at recall@20 against 0.300 recorded); read ``recorded`` there, not the rest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pgr_core import Fact, FoundFact, Probe, Scope
from pgr_core.evaluation import EvalQuestion, EvalSet, load_set
from pgr_core.evaluation.metrics import recall_at, recall_exact
from pgr_core.policy.ranking import fused_order, shared_order

SHARES = (0.25, 0.4, 0.5, 0.6, 0.75)
BUDGETS = (10, 20)


def rebuild(trace: Sequence[Mapping[str, Any]], query_weight: float = 1.5) -> tuple[dict[str, FoundFact], list[Probe]]:
    """R and the probes in order, from a record's compact trace (rounds that were counted into R)."""
    found: dict[str, FoundFact] = {}
    probes: list[Probe] = []
    scope = Scope(user_id="replay")
    for rnd in trace:
        if rnd["phase"] == "augment":  # its hits were context for q_A, not part of R
            continue
        for step_id, text, ids in rnd["probes"]:
            source = "query" if step_id is None else "step"
            probe = Probe(text=text, source=source, step_id=step_id, hits=[(i, 0.0) for i in ids])  # type: ignore[arg-type]
            probes.append(probe)
            weight = query_weight if source == "query" else 1.0
            for rank, fid in enumerate(ids):
                fused = weight / (60 + rank)
                known = found.get(fid)
                if known is None:
                    found[fid] = FoundFact(Fact(id=fid, text="", scope=scope), 0.0, fused, 0, text, step_id=step_id)
                else:
                    known.rank_score = max(known.rank_score, fused)
    return found, probes


def rrf_sum(probes: Sequence[Probe], deep: Sequence[str], weight: float, depth: int = 100) -> list[str]:
    score: dict[str, float] = {}
    for rank, fid in enumerate(deep[:depth]):
        score[fid] = score.get(fid, 0.0) + weight / (60 + rank)
    for probe in probes:
        if probe.source == "query":
            continue
        for rank, (fid, _) in enumerate(probe.hits):
            score[fid] = score.get(fid, 0.0) + 1.0 / (60 + rank)
    return sorted(score, key=lambda f: -score[f])


def corroborated(probes: Sequence[Probe], deep: Sequence[str], share: float, depth: int = 100) -> list[str]:
    qrank = {fid: r for r, fid in enumerate(deep[:depth])}
    hits: dict[str, list[tuple[int, int]]] = {}
    order = 0
    for probe in probes:
        if probe.source == "query":
            continue
        for rank, (fid, _) in enumerate(probe.hits):
            hits.setdefault(fid, []).append((rank, order))
        order += 1
    steps = sorted(hits, key=lambda f: (f not in qrank, -len(hits[f]), qrank.get(f, 0), *min(hits[f])))
    query = list(deep[:20])
    out: list[str] = []
    taken_q = 0
    qi = si = 0
    while qi < len(query) or si < len(steps):
        want_q = taken_q < share * (len(out) + 1) - 1e-9
        if (want_q and qi < len(query)) or si >= len(steps):
            fid, qi = query[qi], qi + 1
            if fid not in out:
                out.append(fid)
                taken_q += 1
        else:
            fid, si = steps[si], si + 1
            if fid not in out:
                out.append(fid)
    return out


def orders(record: Mapping[str, Any], deep: Sequence[str]) -> dict[str, list[str]]:
    found, probes = rebuild(record["extra"]["trace"])
    out = {"query-only": list(deep), "recorded": list(record["ids"]), "fused": [f.id for f in fused_order(found)]}
    for share in SHARES:
        out[f"shared@{share:g}"] = [f.id for f in shared_order(found, probes, share)]
    for weight in (1.0, 2.0):
        out[f"rrf-sum@{weight:g}"] = rrf_sum(probes, deep, weight)
    for share in (0.5, 0.6):
        out[f"corroborated@{share:g}"] = corroborated(probes, deep, share)
    return out


def pgr_records(
    data: EvalSet, records_path: Path, methods: Sequence[str] | None
) -> Iterator[tuple[Mapping[str, Any], EvalQuestion, list[str]]]:
    """Each PGR record with a compact trace, its question and the question's own deep list."""
    questions = {q.id: q for q in data.questions}
    records = [json.loads(line) for line in records_path.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    deep = {r["question"]: r["ids"] for r in records if r["method"] == "_deep"}
    for r in records:
        name = r["method"]
        if not name.startswith("pgr-") or (methods and name not in methods) or "trace" not in r.get("extra", {}):
            continue
        q = questions.get(r["question"])
        if q is not None and r["question"] in deep:
            yield r, q, deep[r["question"]]


def tally(rows: dict[str, Any], label: str, ids: Sequence[str], q: EvalQuestion, **more: float) -> None:
    """Add one question's list under ``label``: recall at each budget, RecallExact@20, and ``more``."""
    cell = rows.setdefault(label, {"n": 0, **{k: [] for k in more}, **{f"@{b}": [] for b in BUDGETS}, "exact@20": []})
    cell["n"] += 1
    for key, value in more.items():
        cell[key].append(value)
    for b in BUDGETS:
        cell[f"@{b}"].append(recall_at(ids, q.gold, b, missing=q.missing))
    cell["exact@20"].append(recall_exact(ids[:20], q.gold, missing=q.missing))


def averaged(report: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """Every list of a tallied report replaced by its mean."""
    return {
        name: {
            s: {k: (statistics.fmean(v) if isinstance(v, list) and v else v) for k, v in c.items()}
            for s, c in rows.items()
        }
        for name, rows in report.items()
    }


def replay(data_path: Path, records_path: Path, methods: Sequence[str] | None) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for r, q, deep in pgr_records(load_set("jsonl", data_path), records_path, methods):
        rows = report.setdefault(r["method"], {})
        for strategy, ids in orders(r, deep).items():
            tally(rows, strategy, ids, q)
    return averaged(report)


def arguments(description: str) -> argparse.ArgumentParser:
    """The options every replay script takes: --data, --records, --methods, --json."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="the jsonl data set the records were run on")
    ap.add_argument("--records", type=Path, required=True, help="a pgr eval .records.jsonl file")
    ap.add_argument("--methods", default=None, help="comma-separated pgr-* methods (default: all in the file)")
    ap.add_argument("--json", type=Path, default=None)
    return ap


def methods_of(args: argparse.Namespace) -> list[str] | None:
    return args.methods.split(",") if args.methods else None


def publish(report: Mapping[str, Any], heading: str, first: str, json_path: Path | None, size: bool = False) -> int:
    """Print each method's table (``heading`` after its name; ``first``: the label column; ``size``:
    a column R of facts found) and write the JSON; 1, with a message, when the report is empty."""
    if not report:
        print("no pgr-* records with a compact trace in that file (rerun pgr eval with this version)", file=sys.stderr)
        return 1
    cols = ["n", *(["R"] if size else []), "recall@10", "recall@20", "RecallExact@20"]
    for name, rows in report.items():
        print(f"\n{name} {heading}\n")
        print(f"| {first} | {' | '.join(cols)} |\n|{'---|' * (len(cols) + 1)}")
        for label, c in rows.items():
            cells = [
                str(c["n"]),
                *([f"{c['size']:.1f}"] if size else []),
                *(f"{c[k]:.3f}" for k in ("@10", "@20", "exact@20")),
            ]
            print(f"| {label} | {' | '.join(cells)} |")
    if json_path:
        json_path.write_text(json.dumps(report, indent=2), encoding="utf-8")
        print(f"\njson: {json_path}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(__doc__ or "").parse_args(argv)
    report = replay(args.data, args.records, methods_of(args))
    return publish(report, "(each strategy re-orders the same R; n = questions)", "ranking", args.json)


if __name__ == "__main__":
    sys.exit(main())
