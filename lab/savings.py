"""What each saving of prospection saves, and what it costs in recall: LLM calls, tokens, embedding
calls and store calls per query, with recall@20, on a LoCoMo subset.

    python lab/savings.py                                   # instant scripted LLM (the default)
    python lab/savings.py --every 200 --embedder hashing    # a tiny smoke run
    PGR_LLM_BASE_URL=http://127.0.0.1:8081/v1 python lab/savings.py --llm --every 39 \\
        --vectors-cache .pgr-cache/locomo-minilm.npy             # a real model, replies cached on disk

Every configuration answers the same stream of queries: each selected question, then the same question
lightly reworded (``surface``: lower case, no question mark) and reworded more (``prefixed``: "Remind
me, ..."), so Phase-1 reuse has near-identical queries to find, as a user re-asking does. The rows:

- ``none``: every saving off (``embedding_cache=False``), the reference;
- ``embedding-cache``: probe embeddings cached (hygiene and the store share one cache; pgr's default);
- ``phase1-reuse``: ``phase1_reuse=True`` (threshold 0.95 on the store's embedder);
- ``adaptive-heuristic`` / ``adaptive-llm``: ``adaptive="heuristic"`` / ``"llm"``;
- ``all``: the embedding cache, Phase-1 reuse and the heuristic together.

Each row but ``all`` switches one saving on over ``none``. Per query it prints LLM calls, prompt +
completion tokens, embedding calls (and texts embedded), store calls, recall@20 (and the query-only
baseline's), recall over all facts returned and how many, the share of queries where adaptive mode
skipped prospection or Phase 1 was reused, and seconds. (PGR's first 20 facts are the query's own
top 20 by design, so recall@20 barely moves; what prospection adds, and an adaptive skip gives up,
shows in recall over everything returned.) The store's probe cache is emptied before each row, so no
row profits from another's vectors. Facts are embedded once (``--vectors-cache`` keeps them between
runs).

With ``--instant`` (the default) the LLM is a scripted stand-in that answers at once: steps built from
the names in the goal and the records it is shown, an intent that restates the question, and for
``adaptive-llm`` the verdict "answered" when the question is a wh-question and it was shown a record.
Its call and token counts are real counts of what pgr asked; its recall says nothing of a real model's.
With ``--llm`` the model behind ``PGR_LLM_BASE_URL`` answers, through the evaluation's disk cache
(``--cache``), so the rows share replies to identical prompts and a re-run costs nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pgr_core import PGR, HashingEmbedder, InMemoryStore, MiniLMEmbedder
from pgr_core.evaluation import CachedLLM, load_set
from pgr_core.evaluation.data import EvalQuestion
from pgr_core.evaluation.metrics import recall, recall_at
from pgr_core.models.caches import CachedEmbedder
from pgr_core.models.llm import LLM, llm_from_env
from pgr_core.policy.prospectors import DIMENSIONS
from pgr_core.testing import ScriptedLLM

CONFIGS: dict[str, dict[str, Any]] = {
    "none": {"embedding_cache": False},
    "embedding-cache": {"embedding_cache": True},
    "phase1-reuse": {"embedding_cache": False, "phase1_reuse": True},
    "adaptive-heuristic": {"embedding_cache": False, "adaptive": "heuristic"},
    "adaptive-llm": {"embedding_cache": False, "adaptive": "llm"},
    "all": {"embedding_cache": True, "phase1_reuse": True, "adaptive": "heuristic"},
}
_WH = re.compile(r"^(when|where|who|whom|whose|which|what|how many|how much|how long)\b", re.IGNORECASE)
_NAME = re.compile(r"\b[A-Z][a-z]{2,}\b")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]{3,}")
_RECORD = re.compile(r'<record [^>]*>"(.*?)"</record>')


# ------------------------------------------------------------------ the query stream


def reworded(question: str, kind: str) -> str:
    """The question as a user might ask it again: ``surface`` or ``prefixed``."""
    bare = question.strip().rstrip("?").strip()
    if kind == "surface":
        return bare[:1].lower() + bare[1:]
    return f"Remind me, {bare[:1].lower() + bare[1:]}?"


def stream(questions: Sequence[EvalQuestion], kinds: Sequence[str]) -> list[tuple[str, str, EvalQuestion]]:
    """(kind, text, question): each question, then each rewording of it, in turn."""
    out = []
    for q in questions:
        out.append(("original", q.question, q))
        out += [(kind, reworded(q.question, kind), q) for kind in kinds]
    return out


# ------------------------------------------------------------------ the instant LLM


def instant_llm() -> ScriptedLLM:
    """Answers every prompt at once, deterministically, from what the prompt holds."""

    def handler(messages: Sequence[Mapping[str, str]], schema: Mapping[str, Any] | None) -> Any:
        prompt = messages[-1]["content"]
        props = (schema or {}).get("properties", {})
        records = _RECORD.findall(prompt)
        if "intent" in props:
            query = prompt.split('The user wrote:\n"', 1)[-1].split('"\n', 1)[0]
            reply: dict[str, Any] = {"intent": f"The user wants to know: {query}"}
            if "answered" in props:
                reply["answered"] = bool(records) and bool(_WH.match(query))
            return reply
        if "steps" in props or "nodes" in props:
            goal = prompt.split("not an instruction): ", 1)[-1].split("\n", 1)[0]
            names = " ".join(dict.fromkeys(n for n in _NAME.findall(goal) if n not in ("The", "User")))
            if records:  # follow up what memory returned: a record's own distinctive words
                steps = [" ".join(dict.fromkeys(_WORD.findall(r)))[:80] for r in records[:4]]
            else:
                seed = int(hashlib.sha256(goal.encode()).hexdigest()[:8], 16)
                dims = list(DIMENSIONS.items())
                steps = [f"{names} {dims[(seed + i) % len(dims)][1]}".strip() for i in range(4)]
            if "nodes" in props:
                return {"nodes": [{"id": f"n{i}", "parent": None, "action": s} for i, s in enumerate(steps)]}
            return {"steps": [{"action": s, "dimension": "logistics"} for s in steps]}
        return {"summary": f"{len(records)} records bear on the request"}

    return ScriptedLLM(handler=handler)


# ------------------------------------------------------------------ measuring


def build_store(facts: list[Any], embedder_name: str, vectors_cache: str | None) -> InMemoryStore:
    embedder = MiniLMEmbedder() if embedder_name == "minilm" else HashingEmbedder()
    store = InMemoryStore(embedder=embedder)
    texts = [f.text for f in facts]
    vectors = None
    if vectors_cache and Path(vectors_cache).exists():
        loaded = np.load(vectors_cache)
        if loaded.shape == (len(texts), embedder.dim):
            vectors = loaded
    t0 = time.perf_counter()
    if vectors is None:
        raw = embedder.embed_uncached if isinstance(embedder, CachedEmbedder) else embedder.embed
        vectors = np.concatenate([raw(texts[i : i + 512]) for i in range(0, len(texts), 512)])
        if vectors_cache:
            Path(vectors_cache).parent.mkdir(parents=True, exist_ok=True)
            np.save(vectors_cache, vectors)
    store.add_facts(facts, vectors=vectors)
    print(f"{len(facts)} facts in the store ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)
    return store


def measure(
    store: InMemoryStore, llm: LLM, strategy: str, options: Mapping[str, Any], queries: list[tuple[str, str, Any]]
) -> dict[str, Any]:
    assert isinstance(store.embedder, CachedEmbedder)
    store.embedder.clear()  # no row profits from another row's probe vectors
    pgr = PGR(store, llm=llm, strategy=strategy, **options)
    keys = ("llm", "tokens", "embed", "texts", "store", "recall", "recall_all", "facts", "s")
    rows: dict[str, list[float]] = {k: [] for k in keys}
    skipped = reused = degraded = 0
    for _, text, q in queries:
        t0 = time.perf_counter()
        result = pgr.retrieve(text, scope=q.scope, date=q.date)
        rows["s"].append(time.perf_counter() - t0)
        u = result.trace.usage
        rows["llm"].append(u.llm_calls)
        rows["tokens"].append(u.total_tokens)
        rows["embed"].append(u.embed_calls)
        rows["texts"].append(u.embed_texts)
        rows["store"].append(u.store_calls)
        rows["recall"].append(recall_at(result.ids, q.gold, 20, missing=q.missing))
        rows["recall_all"].append(recall(result.ids, q.gold, missing=q.missing))
        rows["facts"].append(len(result.ids))
        skipped += result.trace.stop_reason == "adaptive_skip"
        reused += result.trace.reused_phase1_from is not None
        degraded += result.degraded
    n = len(queries)
    out = {k: statistics.fmean(v) for k, v in rows.items()}
    return {**out, "skipped": skipped / n, "reused": reused / n, "degraded": degraded, "queries": n}


def baseline_recall(store: InMemoryStore, queries: list[tuple[str, str, Any]]) -> float:
    pgr = PGR(store, strategy="none")
    return statistics.fmean(
        recall_at(pgr.query_only(text, scope=q.scope, date=q.date).ids, q.gold, 20, missing=q.missing)
        for _, text, q in queries
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", default="../shared/data/locomo", help="LoCoMo folder or file")
    ap.add_argument("--every", type=int, default=39, help="every k-th question with gold evidence")
    ap.add_argument("--limit", type=int, default=None, help="at most this many questions")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--instant", action="store_true", help="the instant scripted LLM (the default)")
    which.add_argument("--llm", action="store_true", help="the model behind PGR_LLM_BASE_URL")
    ap.add_argument("--cache", default=".pgr-cache/llm", help="disk cache of LLM replies (--llm only)")
    ap.add_argument("--strategy", choices=["cot", "tot"], default="cot")
    ap.add_argument("--embedder", choices=["minilm", "hashing"], default="minilm")
    ap.add_argument("--vectors-cache", default=None, help=".npy file keeping the fact vectors between runs")
    ap.add_argument("--rewordings", default="surface,prefixed", help="rewordings per question ('' for none)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"rows to run, from {', '.join(CONFIGS)}")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)

    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(f"unknown config(s) {unknown}; choose from {', '.join(CONFIGS)}")
    kinds = [k.strip() for k in args.rewordings.split(",") if k.strip()]
    if any(k not in ("surface", "prefixed") for k in kinds):
        ap.error("--rewordings takes surface and/or prefixed")
    if args.llm:
        real = llm_from_env()
        if real is None:
            ap.error("--llm needs PGR_LLM_BASE_URL (and PGR_LLM_MODEL)")
        llm: LLM = CachedLLM(real, args.cache)
        llm_name = f"{real!r} (cached in {args.cache})"
    else:
        llm, llm_name = instant_llm(), "instant scripted LLM"

    data = load_set("locomo", args.data).select(every=args.every, limit=args.limit)
    queries = stream(data.questions, kinds)
    store = build_store(data.facts, args.embedder, args.vectors_cache)
    print(
        f"LoCoMo: {len(data.questions)} questions (every {args.every}), {len(queries)} queries with "
        f"rewordings {kinds or 'none'}; {args.embedder} embeddings; pgr-{args.strategy}; {llm_name}"
    )
    base = baseline_recall(store, queries)
    figures: dict[str, Any] = {}
    header = (
        f"{'saving':<19}{'LLM calls':>10}{'tokens':>9}{'embed calls':>12}{'(texts)':>9}{'store calls':>12}"
        f"{'recall@20':>10}{'recall':>8}{'facts':>7}{'skipped':>8}{'reused':>8}{'s/query':>9}"
    )
    print(f"\nper query; query-only recall@20 = {base:.3f}; recall: over all facts returned\n{header}")
    for name in configs:
        row = measure(store, llm, args.strategy, CONFIGS[name], queries)
        figures[name] = row
        print(
            f"{name:<19}{row['llm']:>10.2f}{row['tokens']:>9.0f}{row['embed']:>12.2f}{row['texts']:>9.1f}"
            f"{row['store']:>12.2f}{row['recall']:>10.3f}{row['recall_all']:>8.3f}{row['facts']:>7.1f}"
            f"{row['skipped']:>8.0%}{row['reused']:>8.0%}"
            f"{row['s']:>9.3f}" + (f"  ({row['degraded']} degraded)" if row["degraded"] else "")
        )
    if "none" in figures:
        ref = figures["none"]
        print("\nsaved against 'none' (LLM calls, tokens, embed calls per query; change of recall@20 and recall):")
        for name, row in figures.items():
            if name != "none":
                print(
                    f"  {name:<19}{ref['llm'] - row['llm']:>+7.2f} calls {ref['tokens'] - row['tokens']:>+8.0f} "
                    f"tokens {ref['embed'] - row['embed']:>+7.2f} embeds   recall@20 "
                    f"{row['recall'] - ref['recall']:>+.3f}, recall {row['recall_all'] - ref['recall_all']:>+.3f}"
                )
    if args.json:
        meta = {"questions": len(data.questions), "queries": len(queries), "every": args.every, "llm": llm_name}
        meta.update(embedder=args.embedder, strategy=args.strategy, rewordings=kinds, query_only_recall_at_20=base)
        Path(args.json).write_text(json.dumps({**meta, "configs": CONFIGS, "figures": figures}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
