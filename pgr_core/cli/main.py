"""The ``pgr`` command: ``pgr demo``, ``pgr retrieve``, ``pgr eval``, ``pgr plugins``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pgr_core.cli.argtypes import OneLineParser, nonnegative_float, nonnegative_int, positive_int, unit_float
from pgr_core.cli.common import Interrupted, _embedder, add_llm_options, llm_from_args
from pgr_core.errors import InvalidArgumentError, PGRError
from pgr_core.models.embedders import Embedder
from pgr_core.models.llm import LLM
from pgr_core.observability.trace import RetrievalResult, Step

if TYPE_CHECKING:
    from pgr_core.evaluation.cache import DiskCachedEmbedder
    from pgr_core.evaluation.data import EvalSet

__all__ = ["main"]

DEGRADED_EXIT = 3  # --strict: a result came back degraded
NO_FACTS_EXIT = 1  # pgr retrieve: the scope owns no facts in the store


class NoFactsError(PGRError):
    """``pgr retrieve`` for a scope that owns nothing in the store (a typo, or a user not yet ingested)."""


NO_LLM_NOTE = (
    "No LLM configured (set PGR_LLM_BASE_URL and PGR_LLM_MODEL to use one): one LLM-free feedback round "
    "(the request joined to its first hits), no imagined steps (--query-only for the plain search)."
)
DEMO_REPLAY_NOTE = (
    "No LLM configured: REPLAYING the replies a capable model wrote for this bundled history (recorded "
    "offline; no model runs now). Set PGR_LLM_BASE_URL and PGR_LLM_MODEL, or pass --base-url and --model, "
    "to run it live with your own LLM."
)
DEMO_NO_REPLAY_NOTE = (
    "No LLM configured, and the recorded replies answer only the default run's prompts (MiniLM, the default "
    "strategy, no window; {embedder} here): the PGR side runs the LLM-free {strategy} strategy."
)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _pgr(store: Any, llm: LLM | None, args: argparse.Namespace) -> Any:
    from pgr_core.policy.pgr import NO_LLM_STRATEGY, PGR

    strategy = args.strategy
    if llm is None and strategy in ("cot", "tot"):
        if args.strategy_given:
            _say(f"note: strategy {args.strategy!r} needs an LLM")
        strategy = NO_LLM_STRATEGY
    return PGR(
        store,
        llm=llm,
        strategy=strategy,
        window=args.window,
        max_facts=args.max_facts,
        progress=_progress() if llm is not None else None,
    )


def _progress() -> Any:
    """Progress lines on stderr while an LLM works (a CPU model takes a minute a call): what is being
    waited for, and the time since the command started."""
    start = time.perf_counter()

    def say(line: str) -> None:
        _say(f"  [{time.perf_counter() - start:5.0f}s] {line}")

    return say


# --------------------------------------------------------------------------- rendering


def tree_lines(steps: Sequence[Step]) -> list[str]:
    """The prospection tree as indented text lines (roots first, children under their parent)."""
    by_id = {s.id: s for s in steps}
    lines: list[str] = []

    def walk(step: Step, depth: int) -> None:
        dim = f" [{step.dimension}]" if step.dimension else ""
        lines.append(f"{'  ' * depth}- {step.text}{dim}")
        for child in step.children:
            if child in by_id:
                walk(by_id[child], depth + 1)

    for step in steps:
        if step.parent is None or step.parent not in by_id:
            walk(step, 0)
    return lines


def _fact_line(text: str, mark: str, width: int = 100) -> str:
    text = text if len(text) <= width else text[: width - 1] + "…"
    return f"  {mark} {text}"


def _print_demo_query(item: Any, out: TextIO) -> None:
    rel = set(item.relevant)
    qo, pg = item.query_only, item.pgr
    n = item.budget
    qo_ids, pg_ids = set(qo.ids), set(item.pgr_ids)
    print(f"\n=== {item.query}   (asked {item.date})", file=out)
    print(
        f"at {n} facts each: query-only {len(rel & qo_ids)}/{len(rel)} of the facts that matter   |   "
        f"PGR {len(rel & pg_ids)}/{len(rel)} ({pg.trace.ranking} ranking, {len(pg.trace.rounds)} rounds; "
        f"all {len(pg.facts)} facts of R*: {len(rel & set(pg.ids))}/{len(rel)})",
        file=out,
    )
    if pg.trace.steps:
        print("\nProspection tree:", file=out)
        for line in tree_lines(pg.trace.steps)[:40]:
            print("  " + line, file=out)
    texts = {f.id: f.text for f in (*qo.facts, *pg.facts)}
    print(f"\nFacts that matter, in each list of {n} (✓ found, · missed):", file=out)
    print(f"  {'query-only':>10} {'PGR':>4}", file=out)
    for fid in item.relevant:
        a = "✓" if fid in qo_ids else "·"
        b = "✓" if fid in pg_ids else "·"
        why = item.why.get(fid, "")
        print(f"  {a:>10} {b:>4}  {fid:<7} {why}", file=out)
    only = [i for i in item.only_pgr if i in rel]
    if only:
        print(f"\nOnly PGR found (in its top {n}):", file=out)
        for fid in only:
            print(_fact_line(texts.get(fid, fid), "+"), file=out)
    print(f"\nSummary: {pg.summary}", file=out)
    usage = pg.trace.usage
    print(
        f"Cost: {usage.llm_calls} LLM calls, {usage.prompt_tokens}+{usage.completion_tokens} tokens, "
        f"{pg.trace.store_calls} store calls, {pg.trace.seconds:.2f}s; stop: {pg.trace.stop_reason}"
        + (f"; DEGRADED: {'; '.join(pg.trace.errors)}" if pg.trace.degraded else ""),
        file=out,
    )


# --------------------------------------------------------------------------- commands


def cmd_demo(args: argparse.Namespace) -> int:
    from pgr_core import demo
    from pgr_core.observability.trace_page import write_trace_page

    llm = llm_from_args(args)
    embedder = _embedder(args.embedder)
    replaying = False
    if llm is not None:
        _say(f"LLM: {llm!r}")
    elif not args.no_llm and args.strategy in ("cot", "tot"):
        from pgr_core.policy.pgr import LLM_STRATEGY, NO_LLM_STRATEGY

        # the replies answer the prompts of the default run only: its strategy, MiniLM, no window
        recorded = embedder.name == demo.RECORDED_WITH and args.strategy == LLM_STRATEGY and not args.window
        if recorded:
            llm, replaying = demo.recorded_llm(), True
            _say(DEMO_REPLAY_NOTE)
        else:
            _say(DEMO_NO_REPLAY_NOTE.format(embedder=embedder.name, strategy=NO_LLM_STRATEGY))
    _say(f"building the demo store with {embedder.name} (first use loads the model, a few seconds)...")
    t0 = time.perf_counter()
    store = demo.build_store(embedder)
    _say(f"  {len(store)} facts in {time.perf_counter() - t0:.1f}s")
    if args.save_store:
        from pgr_core.stores.builtin import save_copy

        _say(f"  store saved to {save_copy(store, args.save_store)}")
    pgr = _pgr(store, llm, args)
    items = demo.run_demo(pgr, progress=lambda m: _say(f"running {m}"))
    page = write_trace_page(args.html, [i.page_item() for i in items], title="pgr demo: query-only vs PGR")
    if args.json:
        payload = {
            "prospector": pgr.prospector.name,
            "embedder": embedder.name,
            "llm": getattr(llm, "name", None),
            "replayed": replaying,
            "html": str(page),
            "queries": [i.to_dict() for i in items],
        }
        print(json.dumps(payload, ensure_ascii=False))
    else:
        who = demo.load_history()["person"]
        how = " (replayed: a capable model's recorded replies)" if replaying else ""
        print(f"pgr demo: {len(store)} remembered turns of {who['name']}, prospector: {pgr.prospector.name}{how}")
        for item in items:
            _print_demo_query(item, sys.stdout)
        print(f"\nTrace page: {page.resolve()}")
    _say(f"trace page written to {page.resolve()}")
    return _strict_status(args, [i.pgr for i in items])


def cmd_retrieve(args: argparse.Namespace) -> int:
    from pgr_core.stores.builtin import opened_store

    if args.top_k is not None and not args.query_only:
        raise InvalidArgumentError("--top-k sets K for --query-only; to cut PGR's ranked facts to N, use --max-facts N")
    llm = llm_from_args(args)
    if llm is None:
        _say(NO_LLM_NOTE)
    with opened_store(args.store, _embedder(args.embedder), lock_timeout_s=args.lock_timeout) as store:
        return _retrieve(args, store, llm)


def cmd_store_import(args: argparse.Namespace) -> int:
    """Copy an InMemoryStore ``.pgr`` file (facts and vectors) into a new directory store."""
    from pgr_core.stores.builtin import is_file_store
    from pgr_core.stores.edge import EdgeStore

    if not is_file_store(args.source) or not args.source.exists():
        raise InvalidArgumentError(f"{args.source} is not a .pgr store file")
    if is_file_store(args.out) or (args.out.exists() and any(args.out.iterdir())):
        raise InvalidArgumentError(f"--out {args.out} must be a new (or empty) directory")
    store = EdgeStore.import_pgr(args.source, args.out, embedder=_embedder(args.embedder))
    try:
        n = len(store)
    finally:
        store.close()
    for suffix in (".ledger.jsonl", ".journal.jsonl"):
        old = args.source.with_name(args.source.name + suffix)
        if old.exists():
            _say(
                f"note: {old} was not imported (a ledger of the old file); a re-ingest into {args.out} "
                "re-checks each session and rewrites nothing that is already there"
            )
    print(f"imported {n} facts from {args.source} into {args.out}")
    print(f'search it: pgr retrieve --store {args.out} --user USER "..."')
    return 0


def _edge_dirs(path: Path) -> list[Path]:
    """The EdgeStore at ``path`` and the cue index inside it, if any (``<dir>/cues``)."""
    from pgr_core.stores.builtin import is_file_store
    from pgr_core.stores.edge import META_FILE

    if is_file_store(path):
        raise InvalidArgumentError(
            f"{path} is a .pgr file: loading it checks it whole (a damaged one is refused, naming the damaged "
            "part); `pgr store check` and `repair` are for EdgeStore directories"
        )
    if not (path / META_FILE).exists():
        raise InvalidArgumentError(f"{path} is not an EdgeStore directory (no {META_FILE})")
    return [path] + ([path / "cues"] if (path / "cues" / META_FILE).exists() else [])


def _lost_lines(lost: Sequence[Sequence[Any]], limit: int = 20) -> list[str]:
    names = ("user_id", "agent_id", "run_id")
    lines = []
    for *owner, fact_id in lost[:limit]:
        who = ", ".join(f"{k}={v}" for k, v in zip(names, owner, strict=True) if v is not None)
        lines.append(f"  lost: {fact_id} ({who})")
    if len(lost) > limit:
        lines.append(f"  ... and {len(lost) - limit} more (all of them with --json)")
    return lines


def cmd_store_check(args: argparse.Namespace) -> int:
    """Compare an EdgeStore's engine files (and its cue index's) with what it acknowledged; exit 1 when
    something is lost. Changes nothing."""
    from pgr_core.stores.edge import EdgeStore

    reports = [EdgeStore.check(d) for d in _edge_dirs(args.path)]
    for r in reports:
        if r["ok"]:
            print(f"{r['path']}: ok, {r['held']} facts (all acknowledged ones)")
            continue
        problem = r["error"] or f"{len(r['lost'])} of {r['acknowledged']} acknowledged facts are gone"
        print(f"{r['path']}: DAMAGED: {problem}; {r['held']} facts intact")
        print("\n".join(_lost_lines(r["lost"])))
    if args.json:
        _write_json(args.json, reports)
    damaged = [r["path"] for r in reports if not r["ok"]]
    if damaged:
        _say(f"repair keeps every intact fact: pgr store repair {args.path}")
    return 1 if damaged else 0


def cmd_store_repair(args: argparse.Namespace) -> int:
    """Rebuild a damaged EdgeStore (and its cue index) from the facts its files still hold."""
    from pgr_core.stores.edge import EdgeStore

    reports = [EdgeStore.repair(d) for d in _edge_dirs(args.path)]
    for r in reports:
        if not r["repaired"]:
            print(f"{r['path']}: whole, nothing to repair ({r['kept']} facts)")
            continue
        lost = f"{len(r['lost'])} lost"
        if r["lost_unknown"]:
            lost = "which facts were lost is unknown (its record was gone)"
        print(f"{r['path']}: repaired: {r['kept']} facts kept (read from the {r['read_from']}), {lost}")
        print("\n".join(_lost_lines(r["lost"])))
        print(f"  the damaged shard is kept at {r['damaged_copy']} (delete it when satisfied); report: {r['report']}")
    if args.json:
        _write_json(args.json, reports)
    return 0


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")


def _users_note(store: Any) -> str:
    from pgr_core.cli.write import users_of

    try:
        users = users_of(store)
    except (AttributeError, TypeError):  # a store that cannot list its owners
        return ""
    shown = ", ".join(users[:5]) + (", ..." if len(users) > 5 else "")
    return f"it holds {len(users)} user(s)" + (f": {shown}" if users else "")


def _scope_of(args: argparse.Namespace, store: Any) -> Any:
    """The caller's scope; a missing one names ``--user``, and one that owns nothing says so."""
    from pgr_core.types import Scope, SearchParams

    if not (args.user or args.agent or args.run):
        note = _users_note(store)
        raise InvalidArgumentError(
            f"--user is required: whose memories to search in {args.store}" + (f" ({note})" if note else "")
        )
    scope = Scope(user_id=args.user, agent_id=args.agent, run_id=args.run)
    (hits,) = store.search_batch([args.query], scope=scope, params=SearchParams(top_k=1, min_score=0.0))
    if not hits:  # one search, no floor: the scope owns nothing at all
        who = " ".join(f"--{k.split('_')[0]} {v}" for k, v in scope.as_dict().items())
        note = _users_note(store)
        raise NoFactsError(f"{args.store} holds no facts for {who}" + (f"; {note}" if note else ""))
    return scope


def _retrieve(args: argparse.Namespace, store: Any, llm: LLM | None) -> int:
    scope = _scope_of(args, store)
    pgr = _pgr(store, llm, args)
    result: RetrievalResult = (
        pgr.query_only(args.query, scope=scope, date=args.date, top_k=args.top_k)
        if args.query_only
        else pgr.retrieve(args.query, scope=scope, date=args.date)
    )
    if args.html:
        from pgr_core.observability.trace_page import write_trace_page

        baseline = pgr.query_only(args.query, scope=scope, date=args.date)
        item = {"query": args.query, "date": args.date, "query_only": baseline.to_dict(), "pgr": result.to_dict()}
        _say(f"trace page written to {write_trace_page(args.html, [item]).resolve()}")
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False))
        return _strict_status(args, [result])
    print(f"{len(result.facts)} facts ({pgr.prospector.name if not args.query_only else 'query-only'}):")
    for f in result.facts:
        when = f.fact.date.date().isoformat() if f.fact.date else "undated"
        print(f"  [{f.id}] {when}  {f.text}" + (f"  (found through the cue {f.cue!r})" if f.cue else ""))
    if result.summary:
        print(f"\nSummary: {result.summary}")
    if result.trace.steps:
        print("\nProspection tree:")
        print("\n".join("  " + line for line in tree_lines(result.trace.steps)))
    if result.degraded:
        print(f"\nDEGRADED ({result.trace.stop_reason}): {'; '.join(result.trace.errors)}")
    return _strict_status(args, [result])


def _strict_status(args: argparse.Namespace, results: Sequence[RetrievalResult]) -> int:
    """0, or with ``--strict`` :data:`DEGRADED_EXIT` when any result is degraded (said on stderr)."""
    degraded = [r for r in results if r.degraded]
    if not (args.strict and degraded):
        return 0
    _say(f"pgr: {len(degraded)} of {len(results)} result(s) degraded (--strict): {degraded[0].trace.stop_reason}")
    return DEGRADED_EXIT


def cmd_plugins(args: argparse.Namespace) -> int:
    from pgr_core.plugins import registry as plugins

    registry = plugins.load()
    print("plugins:")
    for name, usable, note in registry.status():
        print(f"  {name:<12} {'usable' if usable else 'NOT usable'}{'  (' + note + ')' if note else ''}")
    for kind in ("stores", "llms", "embedders", "baselines"):
        print(f"{kind}: " + (", ".join(sorted(getattr(registry, kind))) or "(none)"))
    return 0


# --------------------------------------------------------------------------- parser


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--strategy",
        choices=["tot", "cot", "feedback", "none"],
        default=None,
        help="prospection (default: cot with an LLM; without one, feedback: one LLM-free round, the request "
        "joined to its first hits; none: the query's own list)",
    )
    add_llm_options(p, no_llm=True)
    p.add_argument("--embedder", choices=["auto", "minilm", "hashing"], default="auto")
    p.add_argument("--window", type=nonnegative_int, default=0, help="temporal window: ±w turns around each hit")
    p.add_argument("--max-facts", type=positive_int, default=None, help="cut R* to this many facts")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--strict", action="store_true", help=f"exit {DEGRADED_EXIT} when a result is degraded (an LLM call failed)"
    )


def parse_set_options(items: Sequence[str]) -> dict[str, Any]:
    """``--set NAME=VALUE`` pairs, VALUE in JSON (``3``, ``0.5``, ``true``, ``"llm"``); a bare word is
    taken as a string. Each must name a PGR option (checked here, before any loading)."""
    from dataclasses import fields

    from pgr_core.policy.config import PGRConfig

    known = {f.name for f in fields(PGRConfig)}
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InvalidArgumentError(f"--set {item!r}: write NAME=VALUE, e.g. --set delta=3")
        if name not in known:
            options = ", ".join(sorted(known))
            raise InvalidArgumentError(f"--set {item!r}: {name!r} is not a PGR option; known: {options}")
        try:
            value = json.loads(raw)
        except ValueError:
            if not raw.strip() or not raw.strip().replace("_", "").isalpha():
                raise InvalidArgumentError(
                    f'--set {item!r}: the value must be JSON (3, 0.5, true, "llm") or a plain word'
                ) from None
            value = raw.strip()
        out[name] = value
    try:
        PGRConfig(**out)
    except TypeError as exc:
        raise InvalidArgumentError(f"--set: {exc}") from None
    return out


def dataset_arguments(p: argparse.ArgumentParser) -> None:
    """PrefEval's loader flags, which :func:`dataset_options` reads (``pgr eval``, benchmark scripts)."""
    p.add_argument("--prefeval-kind", choices=["explicit", "choice-based", "persona-driven"], default="explicit")
    p.add_argument("--fillers", type=nonnegative_int, default=5, help="PrefEval: filler conversations per history")
    p.add_argument("--per-topic", type=positive_int, default=None, help="PrefEval: first N preferences of each topic")
    p.add_argument(
        "--filler-pool",
        type=positive_int,
        default=None,
        help="PrefEval: draw each history's fillers from the first N of the 24 filler conversations (default all)",
    )


def dataset_options(args: argparse.Namespace) -> dict[str, Any]:
    """The loader options ``pgr eval``'s flags name for ``args.dataset`` (PrefEval's; none elsewhere)."""
    if args.dataset != "prefeval":
        return {}
    return {
        "kind": args.prefeval_kind,
        "fillers": args.fillers,
        "per_topic": args.per_topic,
        "filler_pool": args.filler_pool,
    }


def cmd_eval(args: argparse.Namespace) -> int:
    """Compare retrieval methods on a data set; write JSON, Markdown and a PNG chart."""
    from pgr_core.evaluation import load_set, markdown, summarise, write_report
    from pgr_core.evaluation.cache import DiskCachedEmbedder, disk_cached_embedder
    from pgr_core.evaluation.methods import parse_method

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        parse_method(m)  # fail before any loading
    overrides = parse_set_options(args.set)
    for pair in args.win_rate:
        if pair.count(":") != 1 or not set(pair.split(":")) <= set(methods):
            _say(f"pgr: error: --win-rate {pair!r}: write A:B with A and B among --methods")
            return 2
    data = load_set(args.dataset, args.data, **dataset_options(args)).select(
        limit=args.limit, every=args.every, users=args.user
    )
    if not data.questions:
        _say("pgr: error: no questions with gold evidence or references in that selection")
        return 2
    _say(f"{data.name}: {len(data.questions)} questions over {len(data.facts)} facts")
    json_path: Path = args.json
    records = json_path.with_suffix(".records.jsonl")
    if args.report_only:
        from pgr_core.evaluation.runner import read_records

        store_options = None
        if args.cues:  # the records of a --cues run are filed under the cue writer that made them
            from pgr_core.anticipation.cues import CueWriter

            model = args.model or os.environ.get("PGR_LLM_MODEL") or os.environ.get("OPENAI_MODEL") or "default"
            store_options = _cue_options(CueWriter.identity_for(model), args)
        rows = read_records(records, data, overrides, store_options)
        if not rows:
            _say(f"pgr: error: no records for these settings at {records}: run without --report-only first")
            return 2
        report = summarise(data, rows, methods)
        paths = write_report(report, json_path)
        print(markdown(report))
        _say(", ".join(f"{kind}: {path}" for kind, path in paths.items() if path is not None))
        return 0
    embedder: Embedder = _embedder(args.embedder)
    disk: DiskCachedEmbedder | None = None
    if not args.no_cache:
        cached = disk_cached_embedder(embedder, args.vector_cache)
        disk = cached.inner if isinstance(cached.inner, DiskCachedEmbedder) else None
        embedder = cached
    try:
        return _run_eval(args, data, methods, records, overrides, embedder, disk)
    finally:
        if disk is not None:
            disk.close()


def _cue_options(writer: str, args: argparse.Namespace) -> dict[str, Any]:
    """What a --cues run's records are filed under: the cue writer, the weight, and a rule other than
    max (records over the max rule keep the header they had before rules were options)."""
    options: dict[str, Any] = {"cues": writer, "cue_weight": args.cue_weight}
    if args.cue_scoring != "max":
        options["cue_scoring"] = args.cue_scoring
        # the centred rule's cue term is weighted by each user's cue trust, always now: the mark keeps
        # records from before it, and from the deleted --no-cue-trust, from being reused
        options["cue_trust"] = True
    return options


def _run_eval(
    args: argparse.Namespace,
    data: EvalSet,
    methods: list[str],
    records: Path,
    overrides: dict[str, Any],
    embedder: Embedder,
    disk: DiskCachedEmbedder | None,
) -> int:
    """``pgr eval`` once the data set is loaded: embed, run, report (``disk``: the vector cache or None)."""
    from pgr_core.evaluation import CachedLLM, markdown, run_eval, summarise, write_report
    from pgr_core.evaluation.runner import build_store

    json_path: Path = args.json
    started = time.perf_counter()
    _say(f"embedding {len(data.facts)} facts with {embedder.name}...")
    store = build_store(data.facts, embedder)
    from_disk = f", {disk.hits} from the vector cache {disk.path}" if disk is not None and disk.active else ""
    _say(f"embedded {len(store)} facts in {time.perf_counter() - started:.1f}s{from_disk}")
    llm = llm_from_args(args)
    if args.replies is not None:
        from pgr_core.models.recorded import RecordedLLM

        llm = RecordedLLM.from_path(args.replies, name=f"recorded:{args.replies}")
        _say(f"replaying {len(llm.replies)} recorded replies from {args.replies} (no LLM is called)")
    elif llm is not None and not args.no_cache:
        llm = CachedLLM(llm, args.cache)
    judge = llm if args.judge else None
    store_options: dict[str, Any] | None = None
    cue_report: dict[str, Any] | None = None
    if args.cues:
        from pgr_core.cli.write import cue_writer
        from pgr_core.evaluation.runner import with_cues

        if llm is None:
            _say("pgr: error: --cues needs an LLM to write cues (set PGR_LLM_BASE_URL; cached cues cost no call)")
            return 2
        writer = cue_writer(args, llm)
        store, cue_report = with_cues(
            store,
            writer,
            cue_weight=args.cue_weight,
            scoring=args.cue_scoring,
            retry_failed=args.cue_retry,
            log=_say,
        )
        store_options = _cue_options(writer.identity, args)
    rows = run_eval(
        data,
        methods,
        store,
        llm=llm,
        judge=judge,
        records=records,
        overrides=overrides,
        log=_say,
        store_options=store_options,
    )
    report = summarise(data, rows, methods)
    if cue_report is not None:
        report["cues"] = cue_report
    if args.win_rate:
        from pgr_core.evaluation.answers import compare_answers

        if llm is None:
            _say("pgr: error: --win-rate needs an LLM to answer and to judge")
            return 2
        with records.open("a", encoding="utf-8") as fh:

            def emit(record: dict[str, Any]) -> None:
                rows.append(record)
                fh.write(json.dumps(record) + "\n")
                fh.flush()

            report["win_rates"] = [
                compare_answers(data, rows, store, *pair.split(":", 1), llm=llm, emit=emit) for pair in args.win_rate
            ]
    if isinstance(llm, CachedLLM):
        report["llm_cache"] = {"root": str(llm.root), "hits": llm.stats.hits, "misses": llm.stats.misses}
    if disk is not None:
        report["vector_cache"] = {
            "path": str(disk.path),
            "active": disk.active,
            "hits": disk.hits,
            "misses": disk.misses,
        }
    report["command"] = "pgr " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("pgr") else None
    paths = write_report(report, json_path)
    print(markdown(report))
    for kind, path in paths.items():
        if path is None:
            _say(f"no {kind} written (pip install 'pgr[eval]' for matplotlib)")
        else:
            _say(f"{kind}: {path}")
    _say(f"records (resumable): {records}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="pgr", description="Prospection-Guided Retrieval")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="query-only vs PGR on a bundled history, offline")
    _common(demo)
    demo.add_argument("--html", type=Path, default=Path("pgr-demo-trace.html"), help="where to write the trace page")
    demo.add_argument(
        "--save-store", type=Path, default=None, help="also save the demo store: a directory (or a .pgr file)"
    )
    demo.set_defaults(func=cmd_demo)

    ret = sub.add_parser("retrieve", help="run one query against a store file")
    ret.add_argument("query")
    ret.add_argument(
        "--store",
        type=Path,
        required=True,
        help="a store directory or .pgr file (from `pgr ingest --out` or `pgr demo --save-store`)",
    )
    ret.add_argument(
        "--lock-timeout", type=nonnegative_float, default=30.0, help="seconds to wait for a process writing the store"
    )
    ret.add_argument("--user", default=None)
    ret.add_argument("--agent", default=None)
    ret.add_argument("--run", default=None)
    ret.add_argument("--date", default=None, help="the query's date, ISO (e.g. 2025-05-01)")
    ret.add_argument("--query-only", action="store_true", help="the baseline: top-K by the query alone")
    ret.add_argument("--top-k", type=positive_int, default=None, help="K for --query-only (default 20)")
    ret.add_argument("--html", type=Path, default=None, help="write a trace page here")
    _common(ret)
    ret.set_defaults(func=cmd_retrieve)

    ev = sub.add_parser("eval", help="compare retrieval methods on a benchmark (recall, cost)")
    ev.add_argument("dataset", choices=["locomo", "prefeval", "memoryquest", "jsonl"])
    ev.add_argument("--data", type=Path, required=True, help="the data set's file or folder")
    ev.add_argument(
        "--methods",
        default="query-only,pgr-feedback",
        help="comma-separated: query-only, pgr-none, pgr-feedback, pgr-cot, pgr-tot, query-fusion, hyde, mem0; "
        "+wN adds a temporal window (e.g. query-only+w1)",
    )
    ev.add_argument("--limit", type=positive_int, default=None, help="the first N questions (after --every)")
    ev.add_argument("--every", type=positive_int, default=1, help="every k-th question: a spread sample")
    ev.add_argument("--user", action="append", default=[], help="only this user's questions and facts (repeatable)")
    ev.add_argument(
        "--json",
        type=Path,
        default=Path("pgr-eval.json"),
        help="report path; .md, .png and .records.jsonl are written beside it",
    )
    ev.add_argument("--cache", type=Path, default=Path(".pgr-cache/llm"), help="LLM reply cache folder")
    ev.add_argument(
        "--vector-cache",
        type=Path,
        default=Path(".pgr-cache/vectors"),
        help="embedding cache folder (SQLite, keyed by embedder and text): a re-run embeds nothing again",
    )
    ev.add_argument("--no-cache", action="store_true", help="no LLM reply cache and no vector cache")
    ev.add_argument(
        "--replies",
        type=Path,
        default=None,
        help="answer every LLM request from recorded replies (llm-relay's folder, e.g. lab/replies/capable); "
        "a request with no reply degrades",
    )
    ev.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite the report from the records file; run nothing, embed nothing",
    )
    ev.add_argument("--judge", action="store_true", help="LLM-judged recall for questions with reference texts only")
    ev.add_argument(
        "--win-rate",
        action="append",
        default=[],
        metavar="A:B",
        help="answer with each method's top 20 facts and judge A against B (both orders)",
    )
    ev.add_argument("--set", action="append", default=[], help="PGR option for pgr-* methods, e.g. --set delta=3")
    ev.add_argument(
        "--cues",
        action="store_true",
        help="search every method through Anticipating: cues written by the LLM for each fact (cached)",
    )
    ev.add_argument("--cue-weight", type=unit_float, default=0.9, help="a cue's similarity counts this much (0-1]")
    from pgr_core.anticipation.anticipating import SCORINGS

    ev.add_argument(
        "--cue-scoring",
        choices=SCORINGS,
        default="centred",
        help="how a fact's own and cue similarities combine (Anticipating's scoring; default centred, what "
        "scoring='auto' picks for the in-memory eval store)",
    )
    from pgr_core.cli.write import cue_options

    cue_options(ev)
    ev.add_argument(
        "--cue-retry",
        action="store_true",
        help="ask again about facts the cue cache records as failed (a call of their own at temperature 0.7); "
        "by default an eval reuses that verdict",
    )
    dataset_arguments(ev)
    add_llm_options(ev, no_llm=True)
    ev.add_argument("--embedder", choices=["auto", "minilm", "hashing"], default="auto")
    ev.set_defaults(func=cmd_eval)

    from pgr_core.cli.write import register as register_write_side  # ingest, consolidate, guideline

    register_write_side(sub)

    st = sub.add_parser("store", help="manage embedded stores")
    st_sub = st.add_subparsers(dest="store_command", required=True)
    imp = st_sub.add_parser("import", help="copy an InMemoryStore .pgr file into a new directory store")
    imp.add_argument("source", type=Path, help="the .pgr file")
    imp.add_argument("--out", type=Path, required=True, help="the new store directory")
    imp.add_argument("--embedder", choices=["auto", "minilm", "hashing"], default="auto")
    imp.set_defaults(func=cmd_store_import)
    chk = st_sub.add_parser("check", help="say whether an EdgeStore lost facts it acknowledged (changes nothing)")
    chk.add_argument("path", type=Path, help="the store directory")
    chk.add_argument("--json", type=Path, help="also write the report here")
    chk.set_defaults(func=cmd_store_check)
    rep_ = st_sub.add_parser("repair", help="rebuild a damaged EdgeStore from every intact fact; lists the lost")
    rep_.add_argument("path", type=Path, help="the store directory")
    rep_.add_argument("--json", type=Path, help="also write the report here")
    rep_.set_defaults(func=cmd_store_repair)

    plug = sub.add_parser("plugins", help="list plugins and what they register")
    plug.set_defaults(func=cmd_plugins)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "strategy"):
        from pgr_core.policy.pgr import LLM_STRATEGY

        args.strategy_given = args.strategy is not None
        args.strategy = args.strategy or LLM_STRATEGY
    try:
        return int(args.func(args))
    except NoFactsError as exc:
        _say(f"pgr: {exc}")
        return NO_FACTS_EXIT
    except PGRError as exc:
        _say(f"pgr: error: {exc}")
        return 2
    except OSError as exc:  # a path the user gave: unreadable, unwritable, a folder where a file goes...
        where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        _say(f"pgr: error: cannot use{where}: {exc.strerror or exc}")
        return 2
    except Interrupted as exc:
        _say(f"pgr: {exc}")
        return 130
    except KeyboardInterrupt:
        _say("pgr: interrupted")
        return 130


def run() -> None:
    """The ``pgr`` console script: :func:`main`, and after a Ctrl-C a second one is ignored while Python
    winds down (worker threads, torch's pools), so the user sees one line, not a traceback."""
    code = main()
    if code == 130:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
