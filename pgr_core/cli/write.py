"""The write side's commands: ``pgr ingest``, ``pgr consolidate``, ``pgr guideline induce|show``.

``register(sub)`` adds them to the ``pgr`` parser (called from :func:`pgr_core.cli.main.build_parser`).
A store file ``S`` keeps its ingestion ledger in ``S.ledger.jsonl`` and its consolidation journal in
``S.journal.jsonl``, beside it; a directory store keeps both in SQLite, ``S/ledger.sqlite3`` and
``S/journal.sqlite3`` (see :func:`~pgr_core.write.ledger.ledger_path_for` and
:func:`~pgr_core.write.consolidate.journal_path_for`). ``pgr ingest`` and ``pgr consolidate`` hold the
store's lock (:class:`~pgr_core.stores._filelock.StoreLock`) for the whole run, from before the store and
its ledger are read until the last save: a second run on the same store waits up to
``--lock-timeout`` seconds, then stops with a one-line error naming the process that holds it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pgr_core.cli.argtypes import nonnegative_float, nonnegative_int, positive_int, unit_float
from pgr_core.cli.common import add_llm_options, llm_from_args, required_llm
from pgr_core.errors import ConfigurationError, InvalidArgumentError
from pgr_core.models.llm import LLM

__all__ = ["register"]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def _opened(out: Path, args: argparse.Namespace, what: str, *, create: bool, cues: bool | None = None) -> Iterator[Any]:
    """The store at ``out``, this process's own for the whole command: a store file under its lock
    (taken before the store and its ledger are read), a directory store holding its own; closed at the end."""
    from pgr_core.cli.common import _embedder
    from pgr_core.stores.builtin import opened_store

    with (
        _lock(out, args, what),
        opened_store(
            out, _embedder(args.embedder), create=create, lock_timeout_s=args.lock_timeout, cues=cues
        ) as store,
    ):
        yield store


def users_of(store: Any) -> list[str]:
    """The user ids that own facts in an embedded store, sorted."""
    if callable(getattr(store, "user_ids", None)):
        return list(store.user_ids())
    owners = store.scopes() if callable(getattr(store, "scopes", None)) else {f.scope for f in store.facts}
    return sorted({s.user_id for s in owners if s.user_id})


def _durable(store: Any) -> bool:
    """True for a store whose every write is durable when it returns (a directory store): it needs no
    checkpoint, and the ledger may follow each write at once."""
    return not hasattr(store, "save")


def _checkpoint(store: Any, out: Path) -> Any:
    return None if _durable(store) else (lambda: store.save(out))


def _ledger_path(out: Path) -> Path:
    from pgr_core.stores.builtin import is_file_store
    from pgr_core.write.ledger import ledger_path_for

    return ledger_path_for(out, directory=not is_file_store(out))


def _journal(out: Path) -> Any:
    """The store's consolidation journal (the caller closes it): ``<file>.journal.jsonl`` beside a store
    file, ``<dir>/journal.sqlite3`` in a directory store. Swaps a ``<dir>/journal.jsonl`` written by an
    older pgr left pending move into the SQLite journal (durably, before the old file is removed), so
    they are rolled forward too."""
    from pgr_core.stores.builtin import is_file_store
    from pgr_core.write.consolidate import Journal, journal_path_for, open_journal

    directory = not is_file_store(out)
    journal = open_journal(journal_path_for(out, directory=directory))
    legacy = out / "journal.jsonl"
    if directory and legacy.is_file():
        try:
            for swap, merged, originals in Journal(legacy).pending():
                journal.intent(swap, merged, originals)
        except BaseException:
            journal.close()
            raise
        legacy.unlink()
    return journal


def _lock(out: Path, args: argparse.Namespace, what: str) -> Any:
    """The store's lock, held for the whole command (a second writer waits, then is told who holds it).
    A directory store takes its own lock when it is opened and holds it until it is closed."""
    import contextlib

    from pgr_core.stores._filelock import StoreLock
    from pgr_core.stores.builtin import is_file_store

    timeout = args.lock_timeout
    if timeout is not None and timeout < 0:
        raise InvalidArgumentError(f"--lock-timeout must be >= 0 seconds, got {timeout:g}")
    if not is_file_store(out):
        return contextlib.nullcontext()
    return StoreLock(out, timeout_s=timeout, what=what)


def _guideline(path: Path | None) -> Any:
    from pgr_core.write import DEFAULT_GUIDELINE, Guideline

    return DEFAULT_GUIDELINE if path is None else Guideline.load(path)


def _consolidator(store: Any, llm: LLM | None, out: Path, args: argparse.Namespace, journal: Any) -> Any:
    from pgr_core.write import Consolidator

    return Consolidator(
        store,
        llm,
        threshold=args.threshold,
        window_days=args.window_days,
        journal=journal,
        checkpoint=_checkpoint(store, out),
    )


# --------------------------------------------------------------------------- commands


def cmd_ingest(args: argparse.Namespace) -> int:
    """Sessions from a data set into a store file, raw or extracted; resumable (rerun the command)."""
    from pgr_core.write import jsonl_sessions, locomo_sessions

    users_filter = args.user or None
    loader = locomo_sessions if args.source == "locomo" else jsonl_sessions
    users = list(loader(args.data, users=users_filter))
    if not users:
        raise InvalidArgumentError(
            f"no sessions found in {args.data}" + (f" for {users_filter}" if users_filter else "")
        )
    llm = required_llm(args, "--mode extract") if args.mode == "extract" else None
    if args.cues and llm is None:
        llm = required_llm(args, "--cues")
    out: Path = args.out
    with _opened(out, args, "pgr ingest", create=True, cues=True if args.cues else None) as store:
        return _ingest_opened(args, users, llm, out, store)


def _ingest_opened(args: argparse.Namespace, users: list[Any], llm: LLM | None, out: Path, store: Any) -> int:
    from pgr_core.write.ledger import open_ledger

    with _journal(out) as journal:
        consolidator = None
        if llm is not None and args.consolidate_every > 0:
            consolidator = _consolidator(store, llm, out, args, journal)
        elif journal.pending():
            consolidator = _consolidator(store, None, out, args, journal)  # roll forward what a crash left
        if consolidator is not None and consolidator.recovered:
            _say(f"recovered {consolidator.recovered} interrupted consolidation swap(s)")
        with open_ledger(_ledger_path(out)) as ledger:
            return _ingest_run(args, users, llm, out, store, consolidator, ledger)


def _ingest_run(
    args: argparse.Namespace, users: list[Any], llm: LLM | None, out: Path, store: Any, consolidator: Any, ledger: Any
) -> int:
    from pgr_core.write import Ingestor

    writer = cue_writer(args, llm) if args.cues else None
    ingestor = Ingestor(
        store,
        llm if args.mode == "extract" else None,
        guideline=_guideline(args.guideline),
        ledger=ledger,
        window=args.window,
        speakers=[s for s in (args.speakers or "").split(",") if s] or None,
        consolidate_every=args.consolidate_every if args.consolidate_every > 0 else None,
        consolidator=consolidator,
        checkpoint=_checkpoint(store, out),
        checkpoint_every=args.checkpoint_every,
        redo_raw=args.redo_raw,
        progress=not args.no_progress,
        cues=writer or False,
    )
    sessions = sum(len(u.sessions) for u in users)
    _say(f"{args.source}: {len(users)} user(s), {sessions} sessions, mode {ingestor.mode}, into {out}")
    try:
        report = ingestor.ingest_users(users)
    except KeyboardInterrupt:
        raise _interrupted(users, ledger, out) from None
    if not _durable(store):
        store.save(out)
    summary = report.to_dict() | {"store": str(out), "facts_in_store": len(store)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"ingested {report.ingested} session(s), skipped {report.skipped} already in, "
            f"{report.raw_fallback} raw fallback(s), {len(report.failed)} failed; "
            f"+{report.facts_added} facts, {report.facts_updated} updated, {report.facts_rejected} refused, "
            f"{report.llm_calls} LLM calls, {report.consolidations} consolidation(s) merging {report.merged} cluster(s)"
        )
        if writer is not None:
            per_fact = summary.get("cue_tokens_per_fact", 0)
            print(
                f"cues: {report.facts_cued} fact(s) cued, {report.facts_without_cues} left for `pgr cues build`; "
                f"{report.cue_calls} LLM call(s), {report.cue_tokens} tokens ({per_fact} per fact)"
            )
        for entry in report.without_facts[:20]:
            print(f"  no fact: {entry['session']}: {entry['why']}")
        _print_without(report.cues_missing)
        for user, session, error in report.failed[:10]:
            print(f"  failed {user}/{session}: {error} (retried on the next run)")
        print(f"store: {out} ({len(store)} facts); ledger: {_ledger_path(out)}")
        first = users[0].scope.user_id
        print(f'search it: pgr retrieve --store {out} --user {first} "..."')
    return 1 if report.failed and not report.ingested else 0


def _interrupted(users: list[Any], ledger: Any, out: Path) -> Exception:
    """Ctrl-C mid-ingest: the sessions the ledger lists are in the store for good (a session is listed
    only once its facts are durable), and a rerun of the same command skips them."""
    from pgr_core.cli.common import Interrupted

    total = sum(len(u.sessions) for u in users)
    kept = sum(1 for u in users for s in u.sessions if ledger.is_done(u.scope, s))
    return Interrupted(
        f"interrupted: {kept} of {total} session(s) are kept in {out}; "
        "rerun the same command to resume (kept sessions are skipped)"
    )


def cue_writer(args: argparse.Namespace, llm: LLM | None) -> Any:
    """The :class:`~pgr_core.anticipation.cues.CueWriter` that :func:`cue_options` describe."""
    from pgr_core.anticipation.cues import CueCache, CueWriter

    if llm is None:
        raise ConfigurationError("cues are written by an LLM: set PGR_LLM_BASE_URL or pass --base-url")
    return CueWriter(llm, cues_per_fact=args.cues_per_fact, cache=CueCache(args.cue_cache))


def cmd_cues(args: argparse.Namespace) -> int:
    """``pgr cues build``: backfill cues for every fact of a store that has none (resumable);
    ``pgr cues show``: list a user's facts with their cues."""
    from pgr_core.types import Scope
    from pgr_core.write._progress import ProgressBar

    if args.action == "show":
        return _show_cues(args)
    if args.fact:
        raise InvalidArgumentError("a fact id is for `pgr cues show`; `pgr cues build` takes --user")

    writer = cue_writer(args, required_llm(args, "pgr cues build"))
    out: Path = args.store
    with _opened(out, args, "pgr cues build", create=False, cues=True) as store:
        users = args.user or users_of(store.store)
        reports = {}
        for user in users:
            bar = ProgressBar(f"cues {user}", None, enabled=not args.no_progress)

            def tick(done: int, total: int, bar: Any = bar) -> None:
                bar.total = total
                bar.advance(done - bar.done)

            try:
                report = store.build(writer, scope=Scope(user_id=user), progress=tick)
            finally:
                bar.close()
            reports[user] = report.to_dict()
            reports[user]["trust"] = store.cue_alignment(Scope(user_id=user)).to_dict()
            if not args.json:
                r = reports[user]
                print(
                    f"{user}: {r['cued']} fact(s) cued ({r['from_cache']} from the cache), {r['already_cued']} "
                    f"already, {r['without_cues']} without (rerun to retry); {r['llm_calls']} LLM call(s), "
                    f"{r['tokens']} tokens, {r['seconds_per_session']} s per session; {_trust_line(r['trust'])}"
                )
                _print_without(report.without, prefix=f"{user}/")
        if args.json:
            print(json.dumps({"store": str(out), "cue_index": str(store.cues.path), "users": reports}))
        else:
            print(f"cue index: {store.cues.path}; pgr retrieve --store {out} uses it")
    return 0


def _show_cues(args: argparse.Namespace) -> int:
    """Each fact of ``--user`` (or the one fact named) with the cues held for it."""
    from pgr_core.types import Scope

    if len(args.user) != 1:
        raise InvalidArgumentError("pgr cues show needs one --user: whose facts to list")
    scope = Scope(user_id=args.user[0])
    with _opened(args.store, args, "pgr cues show", create=False, cues=True) as store:
        facts = store.store.facts_for(scope)
        if args.fact:
            facts = [f for f in facts if f.id == args.fact]
            if not facts:
                raise InvalidArgumentError(f"no fact {args.fact!r} of user {args.user[0]!r} in {args.store}")
        cues = store.cues_of([f.id for f in facts], scope=scope)
    rows = [{"id": f.id, "text": f.text, "cues": list(cues.get(f.id, ()))} for f in facts]
    if args.json:
        print(json.dumps({"store": str(args.store), "user": args.user[0], "facts": rows}))
        return 0
    for row in rows:
        print(f"[{row['id']}] {row['text']}")
        for cue in row["cues"]:
            print(f"    cue: {cue}")
        if not row["cues"]:
            print("    no cues (`pgr cues build` writes them)")
    cued = sum(bool(r["cues"]) for r in rows)
    print(f"{cued} of {len(rows)} fact(s) cued")
    return 0


def _print_without(without: list[dict[str, Any]], prefix: str = "", limit: int = 20) -> None:
    """One line per session whose facts got no cue, and why (the rest with --json)."""
    for entry in without[:limit]:
        shown = ", ".join(entry["facts"][:5]) + (", ..." if len(entry["facts"]) > 5 else "")
        print(f"  no cue: {prefix}{entry['session']}: {shown}: {entry['why']}")
    if len(without) > limit:
        print(f"  ... and {len(without) - limit} more session(s) (all of them with --json)")


def _trust_line(trust: dict[str, Any]) -> str:
    """One user's cue trust (:mod:`pgr_core.anticipation.cue_trust`) in words."""
    if not trust["judged"]:
        return "cue trust 1 (no session of two or more cued facts to judge)"
    return (
        f"cue trust {trust['trust']:.2f} ({trust['aligned']} of {trust['judged']} cue sets closest to their own "
        f"fact of their session, {trust['chance']:.0f} by chance; kappa {trust['kappa']:.2f}; "
        f"cue term weighted {trust['cue_weight']:.2f})"
    )


def cmd_consolidate(args: argparse.Namespace) -> int:
    """Merge near-duplicate facts of the same week in a store file, per user."""
    out: Path = args.store
    with _opened(out, args, "pgr consolidate", create=False) as store:
        return _consolidate_opened(args, out, store)


def _consolidate_opened(args: argparse.Namespace, out: Path, store: Any) -> int:
    from pgr_core.write.ledger import open_ledger

    llm = llm_from_args(args)
    if llm is None:
        _say("no LLM configured: merged facts keep the most repeated (then latest) wording of their cluster")
    with _journal(out) as journal:
        consolidator = _consolidator(store, llm, out, args, journal)
        consolidator.include_turns = args.include_turns
        if consolidator.recovered:
            _say(f"recovered {consolidator.recovered} interrupted swap(s)")
        users = args.user or users_of(store)
        ledger_path = _ledger_path(out)
        ledger = open_ledger(ledger_path) if ledger_path.exists() else None
        try:
            return _consolidate_users(args, out, store, consolidator, users, ledger)
        finally:
            if ledger is not None:
                ledger.close()


def _consolidate_users(
    args: argparse.Namespace, out: Path, store: Any, consolidator: Any, users: list[str], ledger: Any
) -> int:
    from pgr_core.types import Scope

    reports = []
    for user in users:
        report = consolidator.consolidate(Scope(user_id=user))
        if ledger is not None:  # each swap was checkpointed: the merges are durable already
            ledger.record_consolidation(Scope(user_id=user), report.merged)
        reports.append(report.to_dict())
        if not args.json:
            print(
                f"{user}: {report.facts_before} -> {report.facts_after} facts, {report.merged}/{report.clusters} "
                f"cluster(s) merged" + (f", {len(report.failed)} left (LLM failed)" if report.failed else "")
            )
    if not _durable(store):
        store.save(out)
    if args.json:
        print(json.dumps({"store": str(out), "users": reports}))
    return 0


def cmd_guideline(args: argparse.Namespace) -> int:
    if args.action == "show":
        guideline = _guideline(args.guideline)
        print(guideline.render() if args.rendered else guideline.text)
        return 0
    return _cmd_induce(args)


def _cmd_induce(args: argparse.Namespace) -> int:
    """Guideline induction on PrefEval: train, keep the best S on the validation split."""
    from pgr_core.cli.common import _embedder
    from pgr_core.write.examples import prefeval_examples
    from pgr_core.write.induction import InductionConfig, induce

    if args.data is None:
        raise InvalidArgumentError("pgr guideline induce needs --data: the PrefEval folder (../shared/data/prefeval)")
    llm = required_llm(args, "guideline induction")
    assert llm is not None
    if args.cache is not None:
        from pgr_core.evaluation import CachedLLM

        llm = CachedLLM(llm, args.cache)
    train, val = prefeval_examples(
        args.data, train=args.train, val=args.val, fillers=args.fillers, seed=args.seed, options=not args.free_form
    )
    config = InductionConfig(
        steps=args.steps,
        batch_size=args.batch,
        candidates=args.candidates,
        rollouts=args.rollouts,
        retrieval=args.retrieval,
        top_k=args.top_k,
        seed=args.seed,
    )
    result = induce(
        train,
        val,
        llm=llm,
        guideline=_guideline(args.guideline),
        config=config,
        out_dir=args.out,
        embedder=_embedder(args.embedder),
        log=_say,
    )
    for row in result.history:
        print(
            f"step {row['step']}: S v{row['version']} validation {row['val_score']:.3f}"
            + (f" (train batch {row['train_score']:.3f})" if row.get("train_score") is not None else "")
            + ("  kept" if row["accepted"] else f"  not kept: {row.get('reason', '')}")
        )
    print(f"best: S v{result.best.version} ({result.best_score:.3f}) -> {result.best_path}")
    print(f"history: {result.history_path}")
    return 0


# --------------------------------------------------------------------------- parser


def _llm_options(p: argparse.ArgumentParser) -> None:
    add_llm_options(p)
    p.add_argument("--embedder", choices=["auto", "minilm", "hashing"], default="auto")


def cue_options(p: argparse.ArgumentParser) -> None:
    """``--cue-cache`` and ``--cues-per-fact``: what :func:`cue_writer` reads (ingest, cues build, eval)."""
    from pgr_core.anticipation.cues import DEFAULT_CUES, MAX_CUES, MIN_CUES

    p.add_argument("--cue-cache", type=Path, default=Path(".pgr-cache/cues.sqlite3"), help="cues by fact text (SQLite)")
    p.add_argument(
        "--cues-per-fact",
        type=int,
        choices=range(MIN_CUES, MAX_CUES + 1),
        default=DEFAULT_CUES,
        metavar="N",
        help=f"cues the LLM writes for each fact ({MIN_CUES}-{MAX_CUES}; default {DEFAULT_CUES})",
    )


def _lock_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lock-timeout",
        type=nonnegative_float,
        default=30.0,
        help="seconds to wait for another process writing the same store (30; 0: do not wait)",
    )


def _merge_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threshold", type=unit_float, default=0.85, help="cosine a cluster's facts share pairwise (0.85)")
    p.add_argument(
        "--window-days", type=nonnegative_float, default=7.0, help="most days between a cluster's latest dates (7)"
    )


def register(sub: Any) -> None:
    """Add ``ingest``, ``consolidate`` and ``guideline`` to the ``pgr`` subcommands."""
    ing = sub.add_parser("ingest", help="build a fact memory from conversation sessions (raw turns or LLM extraction)")
    ing.add_argument(
        "source", choices=["locomo", "jsonl"], help="locomo10.json, or JSONL sessions (docs/eval-format.md)"
    )
    ing.add_argument("--data", type=Path, required=True, help="the data file or folder")
    ing.add_argument("--out", type=Path, required=True, help="the store file to create or extend (.pgr)")
    ing.add_argument("--user", action="append", default=[], help="only this user (repeatable)")
    ing.add_argument("--mode", choices=["raw", "extract"], default="raw", help="raw turns (no LLM) or LLM extraction")
    ing.add_argument("--window", type=nonnegative_int, default=1, help="raw mode: turns per fact (1)")
    ing.add_argument(
        "--speakers", default=None, help="raw mode: comma-separated speakers to keep (default: all but the assistant)"
    )
    ing.add_argument(
        "--guideline", type=Path, default=None, help="extract mode: a guideline file S (default: built in)"
    )
    ing.add_argument("--checkpoint-every", type=positive_int, default=10, help="save the store every N sessions (10)")
    ing.add_argument(
        "--consolidate-every",
        type=nonnegative_int,
        default=50,
        help="extract mode: consolidate after N new facts (0: never)",
    )
    ing.add_argument("--redo-raw", action="store_true", help="extract again sessions that fell back to raw turns")
    ing.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    ing.add_argument("--json", action="store_true", help="print the report as one JSON object")
    ing.add_argument(
        "--cues", action="store_true", help="write cues for each session's facts (one LLM call per session)"
    )
    cue_options(ing)
    _merge_options(ing)
    _lock_option(ing)
    _llm_options(ing)
    ing.set_defaults(func=cmd_ingest)

    con = sub.add_parser("consolidate", help="merge near-duplicate facts of the same week in a store file")
    con.add_argument("--store", type=Path, required=True, help="a .pgr store file")
    con.add_argument("--user", action="append", default=[], help="only this user (repeatable; default: all)")
    con.add_argument("--include-turns", action="store_true", help="merge raw turns too (off: they are evidence)")
    con.add_argument("--no-llm", action="store_true", help="merge without an LLM (keep the most repeated wording)")
    con.add_argument("--json", action="store_true")
    _merge_options(con)
    _lock_option(con)
    _llm_options(con)
    con.set_defaults(func=cmd_consolidate)

    cue = sub.add_parser("cues", help="anticipatory memory: cues that let a plain search find what matters")
    cue.add_argument(
        "action",
        choices=["build", "show"],
        help="build: backfill cues for facts that have none (resumable); show: a user's facts and their cues",
    )
    cue.add_argument("fact", nargs="?", help="show: only this fact id")
    cue.add_argument("--store", type=Path, required=True, help="a directory store or a .pgr file")
    cue.add_argument("--user", action="append", default=[], help="only this user (repeatable; default: all)")
    cue.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    cue.add_argument("--json", action="store_true")
    cue_options(cue)
    _lock_option(cue)
    _llm_options(cue)
    cue.set_defaults(func=cmd_cues)

    gl = sub.add_parser("guideline", help="the extraction guideline S: show it, or induce a better one")
    gl.add_argument("action", choices=["induce", "show"])
    gl.add_argument("--guideline", type=Path, default=None, help="start from this guideline file (default: built in)")
    gl.add_argument("--rendered", action="store_true", help="show: with its placeholders filled")
    gl.add_argument("--data", type=Path, default=None, help="induce: the PrefEval folder")
    gl.add_argument("--out", type=Path, default=Path("guideline-induction"), help="induce: S versions and history.json")
    gl.add_argument("--train", type=positive_int, default=8, help="training examples (8)")
    gl.add_argument("--val", type=positive_int, default=4, help="held-out validation examples (4)")
    gl.add_argument("--fillers", type=nonnegative_int, default=0, help="filler conversations per history (0)")
    gl.add_argument("--steps", type=positive_int, default=2, help="induction steps (2)")
    gl.add_argument("--batch", type=positive_int, default=4, help="training examples per step (4)")
    gl.add_argument("--candidates", type=positive_int, default=1, help="edited guidelines tried per step (1)")
    gl.add_argument("--rollouts", type=positive_int, default=2, help="rollouts per training example, to contrast (2)")
    gl.add_argument("--retrieval", choices=["query-only", "pgr"], default="query-only")
    gl.add_argument("--top-k", type=positive_int, default=10, help="facts given to the answerer (10)")
    gl.add_argument(
        "--free-form", action="store_true", help="answer in words and judge with the LLM, not multiple choice"
    )
    gl.add_argument("--seed", type=int, default=0)
    gl.add_argument("--cache", type=Path, default=None, help="LLM reply cache folder")
    _llm_options(gl)
    gl.set_defaults(func=cmd_guideline)
