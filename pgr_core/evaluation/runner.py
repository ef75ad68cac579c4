"""Run methods over an :class:`EvalSet`, resumably, and summarise what they found and cost.

Every (method, question) result is appended to a records file (JSON lines) as soon as it exists, so
an interrupted run picks up where it stopped; the first line records the run's settings, and a
records file written under other settings is set aside (renamed ``.old``) rather than mixed in.
:func:`summarise` turns records into the report; it is pure and reruns in a second.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from pgr_core.evaluation.data import EvalQuestion, EvalSet
from pgr_core.evaluation.methods import LLM_METHODS, make_method, parse_method, scope_probe
from pgr_core.evaluation.metrics import judged_recall, recall, recall_at, recall_exact
from pgr_core.models.caches import CachedEmbedder
from pgr_core.models.embedders import Embedder
from pgr_core.models.llm import LLM
from pgr_core.stores.contract import Store
from pgr_core.stores.memory import InMemoryStore
from pgr_core.types import Fact, Scope

__all__ = ["BUDGETS", "Progress", "build_store", "embed_in_chunks", "run_eval", "summarise"]

BUDGETS = (10, 20, 35)
DEEP = 400  # how far down the question's own list "query-only at the same size" may read


class Progress:
    """One line per update on stderr: done/total, rate and time left."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, every: float = 2.0) -> None:
        self.total, self.label, self.stream, self.every = total, label, stream or sys.stderr, every
        self.done, self.started, self.last = 0, time.perf_counter(), 0.0

    def step(self, note: str = "", n: int = 1) -> None:
        """``n`` more done (a chunk of texts counts its texts)."""
        self.done += n
        now = time.perf_counter()
        if now - self.last < self.every and self.done < self.total:
            return
        self.last = now
        rate = self.done / max(now - self.started, 1e-9)
        left = (self.total - self.done) / rate if rate else 0.0
        print(
            f"  {self.label}: {self.done}/{self.total} ({rate:.2f}/s, ~{left:.0f}s left) {note}",
            file=self.stream,
            flush=True,
        )


def embed_in_chunks(
    embed: Callable[[Sequence[str]], np.ndarray], texts: Sequence[str], label: str, *, dim: int, chunk: int = 256
) -> np.ndarray:
    """``embed(texts)`` a chunk at a time, with a progress line: one batch of thousands shows nothing."""
    if not texts:
        return np.zeros((0, dim), dtype=np.float32)
    progress = Progress(len(texts), label)
    parts = []
    for start in range(0, len(texts), chunk):
        part = texts[start : start + chunk]
        parts.append(np.asarray(embed(part), dtype=np.float32))
        progress.step(n=len(part))
    return np.vstack(parts)


def build_store(facts: Sequence[Fact], embedder: Embedder, *, chunk: int = 256) -> InMemoryStore:
    """An :class:`InMemoryStore` holding ``facts``, embedded in chunks with a progress line."""
    store = InMemoryStore(embedder=embedder)
    facts = list(facts)
    if facts:
        inner = store.embedder
        # straight past the probe cache, as the store's own bulk writes go (a disk cache below still serves)
        embed = inner.embed_uncached if isinstance(inner, CachedEmbedder) else inner.embed
        texts = [f.text for f in facts]
        vectors = embed_in_chunks(embed, texts, f"embedding facts ({inner.name})", dim=inner.dim, chunk=chunk)
        store.add_facts(facts, vectors=vectors)
    return store


def _records_under(path: Path, header: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The records in ``path`` when its first line is ``header``; None when absent or written under
    other settings. A line cut by an interrupted write ends the list (the run redoes from there)."""
    if not path.exists():
        return None
    lines = path.read_text(encoding="utf-8").splitlines()
    try:
        first = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        first = None
    if not first or first.get("header") != header:
        return None
    out = []
    for line in lines[1:]:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def read_records(
    path: Path,
    data: EvalSet,
    overrides: Mapping[str, Any] | None = None,
    store_options: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The records a run with these settings wrote (empty when there are none, or other settings')."""
    return _records_under(path, _header(data, overrides, store_options)) or []


def _header(
    data: EvalSet, overrides: Mapping[str, Any] | None, store_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    header = {"dataset": data.name, "questions": [q.id for q in data.questions], "overrides": dict(overrides or {})}
    if store_options:  # e.g. cues: records over another store are never mixed in
        header["store"] = dict(store_options)
    return header


def with_cues(
    store: Store,
    writer: Any,
    *,
    cue_weight: float,
    scoring: str = "auto",
    retry_failed: bool = False,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> tuple[Any, dict[str, Any]]:
    """``store`` wrapped in :class:`~pgr_core.anticipation.anticipating.Anticipating`, every owner's facts cued by
    ``writer`` (its cache serves facts it has seen); returns the wrapper and the build report.

    ``retry_failed``: ask again about facts the cache records as failed (a call of their own at the
    retry temperature, as ``pgr cues build`` does); by default a rerun reuses the verdicts."""
    from pgr_core.anticipation.anticipating import Anticipating, CueBuildReport

    wrapped = Anticipating(store, cue_weight=cue_weight, scoring=scoring)
    writer.retry_failed = retry_failed
    owners = list(dict.fromkeys(f.scope for f in getattr(store, "facts", [])))
    total = CueBuildReport()
    started = time.perf_counter()
    for n, owner in enumerate(owners, 1):
        progress: Progress | None = None

        label = f"cues for {owner.user_id or owner} ({n}/{len(owners)})"

        def tick(done: int, sessions: int, label: str = label) -> None:
            nonlocal progress
            if progress is None:
                progress = Progress(sessions, label)
            progress.step()

        total.merge(wrapped.build(writer, scope=owner, progress=tick))
    summary = total.to_dict()
    summary["wall_seconds"] = round(time.perf_counter() - started, 1)
    # how far each owner's cues point at their own fact: the weight of its cue term (pgr_core.anticipation.cue_trust)
    summary["trust"] = {owner.user_id or str(owner): wrapped.cue_alignment(owner).to_dict() for owner in owners}
    log(
        f"cues: {summary['cued']} of {summary['facts']} facts cued ({summary['from_cache']} from the cue cache), "
        f"{summary['without_cues']} without, {summary['llm_calls']} LLM calls, {summary['tokens']} tokens"
    )
    if wrapped.judges_cues:
        trusts = ", ".join(
            f"{user} {t['cue_weight']:.2f} (trust {t['trust']:.2f}, kappa {t['kappa']:.2f}, {t['judged']} judged)"
            if t["judged"]
            else f"{user} 1 (none to judge)"
            for user, t in summary["trust"].items()
        )
        log(f"cue trust (the cue term's weight, per user): {trusts}")
    else:
        log("cue trust: off (every cue term counts in full)")
    return wrapped, summary


def run_eval(
    data: EvalSet,
    methods: Sequence[str],
    store: Store,
    *,
    llm: LLM | None = None,
    judge: LLM | None = None,
    records: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
    store_options: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run every method on every question; return the records (resumed from ``records`` if present).

    Methods that need an LLM are skipped, with a message, when ``llm`` is None. ``judge`` scores
    questions that have reference texts but no gold ids (LLM-judged recall).
    """
    for name in methods:
        parse_method(name)
    header = _header(data, overrides, store_options)
    found = _records_under(records, header) if records else None
    if records is not None and found is None and records.exists():
        records.rename(records.with_suffix(records.suffix + ".old"))  # other settings: set aside, never mixed
    # a degraded record (a refused or failed LLM call: with llm-relay, a request not yet answered) is
    # never a result: the run asks again, and the file is rewritten without it
    done = [r for r in found or [] if not r.get("degraded")]
    have = {(r["method"], r["question"]) for r in done}
    fh = None
    if records:
        records.parent.mkdir(parents=True, exist_ok=True)
        fresh = not done or len(done) != len(found or [])
        fh = records.open("w" if fresh else "a", encoding="utf-8")
        if fresh:
            fh.write(json.dumps({"header": header}) + "\n")
            for r in done:
                fh.write(json.dumps(r) + "\n")
            fh.flush()
    out = list(done)

    def emit(record: dict[str, Any]) -> None:
        out.append(record)
        if fh is not None:
            fh.write(json.dumps(record) + "\n")
            fh.flush()

    try:
        # the question's own deep list and how close its gold is to it: computed once per question
        todo = [q for q in data.questions if ("_deep", q.id) not in have]
        if todo:
            closeness = _closeness(store, todo)
            progress = Progress(len(todo), "baseline lists")
            for q, close in zip(todo, closeness, strict=True):
                emit(
                    {
                        "method": "_deep",
                        "question": q.id,
                        "ids": scope_probe(store, q.question, q.scope, DEEP),
                        "closeness": close,
                    }
                )
                progress.step()
        for name in methods:
            base, _ = parse_method(name)
            if base in LLM_METHODS and llm is None:
                log(f"skipping {name}: it needs an LLM (set PGR_LLM_BASE_URL, or pass --llm-base-url)")
                continue
            todo = [q for q in data.questions if (name, q.id) not in have]
            if not todo:
                continue
            method = make_method(name, store, llm=llm, overrides=overrides, facts=data.facts)
            progress = Progress(len(todo), name)
            for q in todo:
                result = method.run(q)
                record = {"method": name, "question": q.id, **asdict(result)}
                if result.degraded or result.error:
                    log(f"degraded: {name} [{q.id}]: {_one_line(result.error or 'no reason given')}")
                if judge is not None and q.references and not q.gold and not q.missing:
                    texts = [f.text for f in _facts(store, result.ids[:20], q.scope)]
                    verdict = judged_recall(judge, q.question, q.references, texts)
                    record["judged"] = {"found": verdict.found, "error": verdict.error, "calls": verdict.calls}
                    if verdict.error:
                        log(f"judge failed: {name} [{q.id}]: {_one_line(verdict.error)}")
                emit(record)
                progress.step(f"[{q.id}]")
    finally:
        if fh is not None:
            fh.close()
    return out


def _one_line(text: str, limit: int = 500) -> str:
    """``text`` on one line, cut at ``limit`` characters (a server's error page can be long)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _facts(store: Store, ids: Sequence[str], scope: Scope) -> list[Any]:
    """The facts ``ids`` that ``scope`` (the question's user) may see (none from a store that does not
    declare ``capabilities.by_id``)."""
    if not store.capabilities.by_id:
        return []
    get = store.get  # type: ignore[attr-defined]
    return [f for f in (get(i, scope=scope) for i in ids) if f is not None]


def _closeness(store: Store, questions: Sequence[EvalQuestion]) -> list[float | None]:
    """Max cosine between each question and its gold facts (None without gold or an embedder).

    The gold facts' vectors are the store's own when it gives them (``capabilities.vectors``:
    ``vectors_for``): re-embedding every question's gold costs minutes on a large set. Otherwise they
    go through the store's embedder. The gold is fetched by id (``capabilities.by_id``).
    """
    embedder = getattr(store, "embedder", None)
    if embedder is None or not store.capabilities.by_id:
        return [None] * len(questions)
    q_vecs = embed_in_chunks(
        embedder.embed, [q.question for q in questions], "baseline lists: embedding questions", dim=embedder.dim
    )
    stored = store.vectors_for if store.capabilities.vectors else None  # type: ignore[attr-defined]
    progress = Progress(len(questions), "baseline lists: gold closeness")
    out: list[float | None] = []
    for vec, q in zip(q_vecs, questions, strict=True):
        ids = [i for g in q.gold for i in ([g] if isinstance(g, str) else g)]
        facts = _facts(store, ids, q.scope)
        if facts:
            rows = (
                stored([f.id for f in facts], scope=q.scope)
                if stored is not None
                else embedder.embed([f.text for f in facts])
            )
            out.append(float(np.max(rows @ vec)))
        else:
            out.append(None)
        progress.step()
    return out


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarise(data: EvalSet, records: Sequence[Mapping[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """The report: per method, recall (all, at each budget, exact), cost and per-category recall@20.

    ``methods`` (the main table) compares the methods on the same questions: those every listed
    method with any record has a record for (``compared_questions`` of them). When a method has
    records for other questions too (an interrupted or partial run), its figures over all its own
    questions go in ``own_questions``: not comparable with the main table or with each other.
    Methods with no record at all are named in ``without_records``.

    - ``recall``: over everything the method returned; ``recall_at[N]`` over its first N facts.
    - ``recall_exact`` / ``recall_exact_at``: share of questions with every gold item found.
    - ``query_only_same_size``: the question's own list cut at as many facts as the method returned.
    - ``recall_at_20_hard_third``: the third of the questions summarised whose nearest gold fact is
      least like them.
    - ``judged_recall``: LLM-judged recall@20 over questions that have only reference texts.
    - ``degraded``: share of questions whose result is degraded; ``degraded_questions``: how many.
    """
    order = [q.id for q in data.questions]
    by = {(r["method"], r["question"]): r for r in records}
    own = {name: [qid for qid in order if (name, qid) in by] for name in methods}
    listed = [name for name in methods if own[name]]
    common = [qid for qid in order if all((name, qid) in by for name in listed)] if listed else []
    report: dict[str, Any] = {
        "dataset": data.name,
        "questions": len(order),
        "notes": list(data.notes),
        "compared_questions": len(common),
        "methods": {},
        "own_questions": {},
        "without_records": [name for name in methods if not own[name]],
    }
    for name in listed:
        stats = _stats(data, by, name, common)
        if stats is not None:
            report["methods"][name] = stats
        if own[name] != common:
            report["own_questions"][name] = _stats(data, by, name, own[name])
    return report


def _stats(
    data: EvalSet, by: Mapping[tuple[str, str], Mapping[str, Any]], name: str, qids: Sequence[str]
) -> dict[str, Any] | None:
    """One method's figures over the questions ``qids`` (None when it has no record for any)."""
    questions = {q.id: q for q in data.questions}
    closeness = {qid: by.get(("_deep", qid), {}).get("closeness") for qid in qids}
    ranked = sorted((c, qid) for qid, c in closeness.items() if c is not None)
    hard = {qid for _, qid in ranked[: max(len(ranked) // 3, 1)]}  # at least one, on tiny sets
    rows: dict[str, list[float]] = defaultdict(list)
    cats: dict[str, list[float]] = defaultdict(list)
    n = 0
    for qid in qids:
        r, q = by.get((name, qid)), questions[qid]
        if r is None:
            continue
        n += 1
        ids = r["ids"]
        for key in ("llm_calls", "prompt_tokens", "completion_tokens", "seconds", "store_calls"):
            rows[key].append(float(r.get(key, 0)))
        rows["tokens"].append(float(r.get("prompt_tokens", 0) + r.get("completion_tokens", 0)))
        rows["facts"].append(float(len(ids)))
        rows["degraded"].append(1.0 if r.get("degraded") else 0.0)
        if q.gold or q.missing:
            kw = {"missing": q.missing}
            rows["recall"].append(recall(ids, q.gold, **kw))
            rows["recall_exact"].append(recall_exact(ids, q.gold, **kw))
            for b in BUDGETS:
                rows[f"@{b}"].append(recall_at(ids, q.gold, b, **kw))
                rows[f"exact@{b}"].append(recall_exact(ids[:b], q.gold, **kw))
            deep = by.get(("_deep", qid), {}).get("ids")
            if deep is not None:
                rows["same"].append(recall(deep[: max(len(ids), 1)], q.gold, **kw))
            cats[q.category].append(recall_at(ids, q.gold, 20, **kw))
            if qid in hard:
                rows["hard"].append(recall_at(ids, q.gold, 20, **kw))
        judged = r.get("judged")
        if judged and judged.get("error") is None and judged.get("found"):
            found = judged["found"]
            rows["judged"].append(sum(1 for f in found if f) / len(found))
            rows["judged_exact"].append(1.0 if all(found) else 0.0)
        elif judged:
            rows["judge_failed"].append(1.0)
    if n == 0:
        return None
    return {
        "questions": n,
        "recall": _mean(rows["recall"]),
        "recall_at": {str(b): _mean(rows[f"@{b}"]) for b in BUDGETS},
        "recall_exact": _mean(rows["recall_exact"]),
        "recall_exact_at": {str(b): _mean(rows[f"exact@{b}"]) for b in BUDGETS},
        "query_only_same_size": _mean(rows["same"]),
        "recall_at_20_hard_third": _mean(rows["hard"]),
        "judged_recall": _mean(rows["judged"]),
        "judged_recall_exact": _mean(rows["judged_exact"]),
        "judge_failures": len(rows["judge_failed"]),
        "facts": _mean(rows["facts"]),
        "llm_calls": _mean(rows["llm_calls"]),
        "prompt_tokens": _mean(rows["prompt_tokens"]),
        "completion_tokens": _mean(rows["completion_tokens"]),
        "tokens": _mean(rows["tokens"]),
        "seconds": _mean(rows["seconds"]),
        "store_calls": _mean(rows["store_calls"]),
        "degraded": _mean(rows["degraded"]),
        "degraded_questions": int(sum(rows["degraded"])),
        "by_category": {c: _mean(v) for c, v in sorted(cats.items())},
    }
