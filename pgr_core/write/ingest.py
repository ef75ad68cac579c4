"""Ingestion: conversation sessions in, facts out, written through the store.

Without an LLM, each turn (or each window of ``window`` turns) becomes one dated fact that keeps its
session and position, so the temporal window and the evaluation's turn-level gold both work. With an
LLM, :func:`~pgr_core.write.extract.extract` turns each session into short typed facts under the
guideline S, and each fact is either new or an update of a remembered one (upsert: the LLM is shown
the nearest remembered facts and names the one it revises; the update keeps that fact's id and bumps
its frequency once per session).

Idempotent and resumable through the :class:`~pgr_core.write.ledger.Ledger`: a session already in,
unchanged, is skipped. Fact ids are derived from the owner and the session (``<user>:<session>:<position>``
for raw turns, ``<user>:<session>:f<k>`` for extracted facts; the parts escaped, see
:func:`~pgr_core.write.sessions.scope_label`), and every fact a session writes carries
``metadata["pgr_session"]``. A session done again (after a crash the ledger did not see, or because it
changed) replaces what it wrote before: the same ids are written again, and its earlier facts that the
new pass does not write are deleted (found through that marker when the ledger does not know them),
so a rerun whose LLM words a fact differently still leaves one fact per statement.

A session is recorded in the ledger only once the store holding it is durable: with ``checkpoint``,
ledger lines follow a successful checkpoint (never on a failed one, nor when the run is interrupted
before it); without one, the store is taken to make every write durable itself.

When the LLM fails on a session:

- its reply is unusable even after one repair (bad JSON, cut off, wrong shape): the session's turns go
  in raw, the ledger says ``raw``, and ``redo_raw=True`` (``pgr ingest --redo-raw``) extracts it again
  later, replacing those raw facts;
- it cannot be reached (timeout, refused connection, HTTP error): nothing is written, the ledger says
  ``failed``, and the next run tries that session again.

Either way the store never holds half a session.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pgr_core.anticipation.cues import CueWriter, without_cues
from pgr_core.errors import ConfigurationError, InvalidArgumentError, LLMError, LLMOutputError
from pgr_core.models.llm import LLM
from pgr_core.stores.contract import Store
from pgr_core.types import SESSION_KEY, Fact, Scope, SearchParams
from pgr_core.write._progress import ProgressBar
from pgr_core.write.consolidate import listed_facts, remove_owned
from pgr_core.write.extract import MAX_FACTS_PER_SESSION, Extraction, extract, handles
from pgr_core.write.guideline import DEFAULT_GUIDELINE, Guideline
from pgr_core.write.ledger import Ledger, LedgerEntry, Status, owner_of
from pgr_core.write.sessions import ASSISTANT_ROLES, Session, UserSessions, key_part, scope_label
from pgr_core.write.stores import FactWriter, writer_for

__all__ = ["IngestReport", "Ingestor", "SESSION_KEY", "raw_facts"]


# A store object's in-memory ledger, shared by every Ingestor made on it without a ledger of its own,
# so ingesting the same sessions twice into one store is a no-op within a process.
_LEDGERS: weakref.WeakKeyDictionary[Any, Ledger] = weakref.WeakKeyDictionary()


def _ledger_of(store: Any) -> Ledger:
    try:
        return _LEDGERS.setdefault(store, Ledger())
    except TypeError:  # not weak-referenceable or not hashable: a ledger of this ingestor's own
        return Ledger()


@dataclass
class IngestReport:
    """What a run did. ``failed`` lists ``(user, session, error)``; those sessions are retried next run."""

    sessions: int = 0
    ingested: int = 0
    skipped: int = 0  # already in the ledger, unchanged
    raw_fallback: int = 0
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    facts_added: int = 0
    facts_updated: int = 0
    facts_rejected: int = 0
    facts_cut: int = 0  # extracted facts past the per-session cap (Ingestor.max_facts), not stored
    llm_calls: int = 0
    consolidations: int = 0
    merged: int = 0
    facts_cued: int = 0  # Ingestor(cues=True): facts that got cues
    facts_without_cues: int = 0  # ... and facts the model gave none (``pgr cues build`` retries them)
    cue_calls: int = 0
    cue_tokens: int = 0
    cue_seconds: float = 0.0
    #: per session, the facts left without cues and why: {"session", "facts": [ids], "why"}
    cues_missing: list[dict[str, Any]] = field(default_factory=list)
    #: extracted sessions that gave no fact to store, and why: {"session", "why"}
    without_facts: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.cue_calls:
            asked = max(self.facts_cued + self.facts_without_cues, 1)
            out["cue_calls_per_fact"] = round(self.cue_calls / asked, 4)
            out["cue_tokens_per_fact"] = round(self.cue_tokens / asked, 1)
            out["cue_seconds_per_session"] = round(self.cue_seconds / max(self.ingested, 1), 2)
        return out


def raw_facts(session: Session, scope: Scope, *, window: int = 1, speakers: Sequence[str] | None = None) -> list[Fact]:
    """The LLM-free memory of a session: one dated fact per turn (or per ``window`` consecutive turns).

    ``speakers`` keeps only those speakers' turns; by default every turn except the assistant's (and
    system or tool messages) is kept. A fact's id is ``<user>:<turn id>`` when the data set names its
    turns (LoCoMo; the data set names each turn once) and ``<user>:<session>:<position>`` otherwise.
    """
    label, session_key = scope_label(scope), key_part(session.id)
    keep = [
        (i, t)
        for i, t in enumerate(session.turns)
        if (t.speaker in speakers if speakers else t.speaker.lower() not in ASSISTANT_ROLES) and t.text.strip()
    ]
    facts = []
    for position, start in enumerate(range(0, len(keep), max(window, 1))):
        chunk = keep[start : start + max(window, 1)]
        first_index, first = chunk[0]
        turn_key = first.id if first.id and window == 1 else f"{session_key}:{first_index}"
        facts.append(
            Fact(
                id=f"{label}:{turn_key}",
                text="\n".join(t.line for _, t in chunk),
                scope=scope,
                type="turn",
                date=session.date,
                session_id=f"{label}:{session_key}",
                position=position,
                metadata={"speaker": first.speaker, "sessions": [session.id], "source": "raw", SESSION_KEY: session.id},
            )
        )
    return facts


class Ingestor:
    """Builds a fact memory from sessions, through any writable store.

    >>> ingestor = Ingestor(store)                          # raw turns, no LLM   # doctest: +SKIP
    >>> report = ingestor.ingest(sessions, scope=Scope(user_id="u1"))            # doctest: +SKIP
    >>> Ingestor(store, llm=llm, guideline=DEFAULT_GUIDELINE).ingest(sessions, scope=...)  # doctest: +SKIP

    - ``ledger``: where ingested sessions are recorded (default: in memory, shared by every ingestor
      on the same store object; pass ``Ledger(path)`` to keep it across processes).
    - ``window`` / ``speakers``: raw mode only (see :func:`raw_facts`).
    - ``related_k``: how many nearest remembered facts the LLM sees for upserts (8).
    - ``consolidate_every``: run ``consolidator`` on a user once this many extracted facts have been
      added since its last consolidation (50; None turns it off). Raw turns are never consolidated.
    - ``checkpoint``: called to make the store durable (e.g. ``lambda: store.save(path)``) before
      ledger lines are written, every ``checkpoint_every`` sessions and at the end of a run.
    - ``progress``: draw a progress bar on stderr.
    - ``cues``: write cues for each session's new and updated facts (one LLM call per session, with
      ``llm`` or the :class:`~pgr_core.anticipation.cues.CueWriter` given); the store must be an
      :class:`~pgr_core.anticipation.anticipating.Anticipating`. A session whose cues fail is still ingested; its
      facts are cued by the next ``Anticipating.build`` (``pgr cues build``).

    ``max_facts`` (an attribute, 50): of one extraction reply, at most this many facts are read; the
    rest are counted in the report's ``facts_cut``.
    """

    max_facts: int = MAX_FACTS_PER_SESSION

    def __init__(
        self,
        store: Any,
        llm: LLM | None = None,
        *,
        guideline: Guideline = DEFAULT_GUIDELINE,
        ledger: Ledger | None = None,
        window: int = 1,
        speakers: Sequence[str] | None = None,
        related_k: int = 8,
        consolidate_every: int | None = 50,
        consolidator: Any = None,
        checkpoint: Callable[[], Any] | None = None,
        checkpoint_every: int = 1,
        redo_raw: bool = False,
        max_tokens: int = 800,
        temperature: float = 0.0,
        progress: bool = False,
        cues: bool | CueWriter = False,
    ) -> None:
        self.cue_writer = _cue_writer(store, llm, cues)
        self.writer: FactWriter = writer_for(store)
        self.store = store
        self.llm = llm
        self.guideline = guideline
        self.ledger = ledger if ledger is not None else _ledger_of(store)
        self.window = window
        self.speakers = speakers
        self.related_k = related_k
        self.consolidate_every = consolidate_every
        self.consolidator = consolidator
        self.checkpoint = checkpoint
        self.checkpoint_every = max(1, checkpoint_every)
        self.redo_raw = redo_raw
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.progress = progress
        self._unsaved: list[LedgerEntry] = []
        # per owner: session id -> {id of a fact it wrote: True when no other session has said it since}
        # (read from the store once per owner and run)
        self._written: dict[Scope, dict[str, dict[str, bool]]] = {}

    @property
    def mode(self) -> str:
        return "extract" if self.llm is not None else "raw"

    # ================================================================== public API

    def ingest(self, sessions: Iterable[Session], *, scope: Scope) -> IngestReport:
        """Ingest one user's sessions, in order. Returns what was done; never raises for LLM failures."""
        return self.ingest_users([UserSessions(Scope.coerce(scope), list(sessions))])

    def ingest_users(self, users: Iterable[UserSessions]) -> IngestReport:
        """Ingest several users' sessions (LoCoMo's conversations, a JSONL file's lines)."""
        users = list(users)
        report = IngestReport()
        bar = ProgressBar("ingest", sum(len(u.sessions) for u in users), enabled=self.progress)
        self._written = {}  # the store may have changed since the last run: read it again
        try:
            for user in users:
                for session in user.sessions:
                    self._ingest_session(session, user.scope, report)
                    self._maybe_consolidate(user.scope, report)
                    bar.advance(note=f"{scope_label(user.scope)} +{report.facts_added} facts")
        except BaseException:
            self._flush_after_error()
            raise
        else:
            self._flush()
        finally:
            bar.close()
        return report

    # ================================================================== one session, step by step

    def _ingest_session(self, session: Session, scope: Scope, report: IngestReport) -> None:
        report.sessions += 1
        if self.ledger.is_done(scope, session, redo_raw=self.redo_raw and self.llm is not None):
            report.skipped += 1
            return
        earlier = self._earlier_facts(session, scope)
        status, facts, new, error = self._facts_for(session, scope, report, earlier, self._kept_facts(session, scope))
        if status == "failed":
            report.failed.append((scope_label(scope), session.id, error or ""))
            self._remember(
                LedgerEntry(
                    scope_label(scope),
                    session.id,
                    session.content_hash,
                    "failed",
                    error=error,
                    owner=list(owner_of(scope)),
                )
            )
            return
        self.writer.put(facts)  # first: a crash before the deletions leaves extra facts, never none
        self._retire(session, scope, earlier, facts)
        if self.cue_writer is not None and facts:
            batch = self.store.cue(facts, self.cue_writer)
            report.facts_cued += len(batch.cues)
            report.facts_without_cues += len(batch.missing)
            report.cue_calls += batch.calls
            report.cue_tokens += batch.tokens
            report.cue_seconds += sum(c.seconds for c in batch.completions)
            report.cues_missing.extend(without_cues(batch, f"{scope_label(scope)}/{session.id}"))
        report.ingested += 1
        report.raw_fallback += status == "raw"
        entry = LedgerEntry(
            scope_label(scope),
            session.id,
            session.content_hash,
            status,
            facts=[f.id for f in facts],
            new_facts=new if status == "ok" and self.llm is not None else 0,
            mode=self.mode,
            guideline=self.guideline.id if self.llm is not None else None,
            error=error,
            owner=list(owner_of(scope)),
        )
        self._remember(entry)

    def _facts_for(
        self,
        session: Session,
        scope: Scope,
        report: IngestReport,
        earlier: set[str] | None = None,
        kept: set[str] | None = None,
    ) -> tuple[Status, list[Fact], int, str | None]:
        """(status, facts to write, how many are new, error) for one session. ``earlier``: what an earlier
        pass wrote and this one replaces (not shown to the LLM); ``kept``: what an earlier pass wrote and
        later sessions confirmed (never overwritten by a new fact)."""
        if self.llm is None:
            facts = raw_facts(session, scope, window=self.window, speakers=self.speakers)
            report.facts_added += len(facts)
            return "ok", facts, len(facts), None
        related = [f for f in self._related(session, scope) if f.id not in (earlier or ())]
        try:
            extraction = extract(
                self.llm,
                session,
                self.guideline,
                related,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                max_facts=self.max_facts,
            )
        except LLMOutputError as exc:
            report.llm_calls += 2
            facts = raw_facts(session, scope, window=self.window, speakers=self.speakers)
            report.facts_added += len(facts)
            return "raw", facts, 0, str(exc)
        except LLMError as exc:
            report.llm_calls += 1
            return "failed", [], 0, f"{type(exc).__name__}: {exc}"
        report.llm_calls += len(extraction.completions)
        report.facts_rejected += len(extraction.rejected)
        report.facts_cut += extraction.cut
        if not extraction.facts:  # nothing to store: say why, rather than a silent 0
            why = (
                f"every fact the model extracted was refused ({'; '.join(extraction.rejected[:3])})"
                if extraction.rejected
                else "the model extracted no fact from it"
            )
            report.without_facts.append({"session": f"{scope_label(scope)}/{session.id}", "why": why})
        facts, added, updated = self._upsert(extraction, related, session, scope, kept or set())
        report.facts_added += added
        report.facts_updated += updated
        return "ok", facts, added, None

    def _related(self, session: Session, scope: Scope) -> list[Fact]:
        """The remembered facts nearest the session's turns (what an update may revise)."""
        if not isinstance(self.store, Store) or self.related_k <= 0:
            return []
        probes = [t.text[:500] for t in session.turns if t.text.strip() and t.speaker.lower() not in ASSISTANT_ROLES]
        probes = list(dict.fromkeys(probes))[:24] or [t.text[:500] for t in session.turns if t.text.strip()][:24]
        if not probes:
            return []
        params = SearchParams(top_k=min(self.related_k, 5), min_score=0.3)
        best: dict[str, tuple[float, Fact]] = {}
        for hits in self.store.search_batch(probes, scope=scope, params=params):
            for hit in hits:
                if hit.fact.type == "turn" or hit.neighbour_of is not None or hit.fact.scope != scope:
                    continue  # an update revises a fact of this owner only (ids are the owner's)
                if hit.fact.id not in best or hit.score > best[hit.fact.id][0]:
                    best[hit.fact.id] = (hit.score, hit.fact)
        ranked = sorted(best.values(), key=lambda pair: -pair[0])
        return [fact for _, fact in ranked[: self.related_k]]

    def _upsert(
        self,
        extraction: Extraction,
        related: Sequence[Fact],
        session: Session,
        scope: Scope,
        kept: set[str] | frozenset[str] = frozenset(),
    ) -> tuple[list[Fact], int, int]:
        """New facts get ids derived from the owner and session (``<prefix>:f<k>``, or ``f<k>.<n>`` where
        ``f<k>`` is a fact of ``kept``); updates keep the remembered fact's id and count this session
        once in its frequency and provenance."""
        prefix = f"{scope_label(scope)}:{key_part(session.id)}"
        by_handle = handles(related)
        updates: dict[str, Fact] = {}
        new: list[Fact] = []
        for k, item in enumerate(extraction.facts):
            target = by_handle.get(item.updates) if item.updates else None
            if target is not None and self.writer.keeps_ids:
                base = updates.get(target.id, target)
                updates[target.id] = _updated(base, item, session)
                continue
            metadata = {
                "frequency": 1,
                "entities": list(item.entities),
                "sessions": [session.id],
                "source": "extracted",
                "guideline": self.guideline.id,
                SESSION_KEY: session.id,
            }
            fact_id, n = f"{prefix}:f{k}", 0
            while fact_id in kept:
                n += 1
                fact_id = f"{prefix}:f{k}.{n}"
            new.append(
                Fact(
                    id=fact_id,
                    text=item.text,
                    scope=scope,
                    type=item.type,
                    date=item.date or session.date,
                    updated_at=session.date,
                    metadata=metadata,
                )
            )
        return [*new, *updates.values()], len(new), len(updates)

    # ================================================================== a session done again

    def _earlier_facts(self, session: Session, scope: Scope) -> set[str]:
        """The ids of the facts an earlier pass of ``session`` wrote and this pass replaces: its raw turns
        (from the ledger), and the facts carrying its marker that no other session has confirmed since
        (found in the store, so a pass the ledger never heard of is found too)."""
        if not self.writer.can_remove:
            return set()
        ids: set[str] = set()
        previous = self.ledger.get(scope, session.id)
        if previous is not None and previous.facts and (previous.mode == "raw" or previous.status == "raw"):
            ids.update(previous.facts)  # raw turns: this session's alone
        ids.update(i for i, alone in self._written_by(scope).get(session.id, {}).items() if alone)
        return ids

    def _kept_facts(self, session: Session, scope: Scope) -> set[str]:
        """The ids of facts an earlier pass of ``session`` wrote that later sessions have confirmed."""
        return {i for i, alone in self._written_by(scope).get(session.id, {}).items() if not alone}

    def _written_by(self, scope: Scope) -> dict[str, dict[str, bool]]:
        """session id -> {id of a fact of this owner that session wrote: whether only it has said it}
        (one listing of the store per owner and run, kept up to date as sessions are written)."""
        index = self._written.get(scope)
        if index is not None:
            return index
        index = {}
        store_lists = self.writer.can_list
        for fact in listed_facts(self.writer, scope) if store_lists else ():
            if fact.scope != scope:
                continue
            writer_session = _session_of(fact, scope)
            if writer_session is not None:
                index.setdefault(writer_session, {})[fact.id] = _only_said_in(fact, writer_session)
        self._written[scope] = index
        return index

    def _retire(self, session: Session, scope: Scope, earlier: set[str], facts: Sequence[Fact]) -> None:
        """Delete what an earlier pass of ``session`` wrote and this pass did not write again (a raw turn
        replaced by extracted facts, a turn cut from the session, a fact worded differently)."""
        kept = {f.id for f in facts}
        if self.writer.can_remove:
            remove_owned(self.writer, sorted(earlier - kept), scope)
        index = self._written.get(scope)
        if index is not None:
            index[session.id] = {i: False for i in self._kept_facts(session, scope)}  # the retired are gone
            for fact in facts:  # what this pass wrote, and the facts of other sessions it updated
                marker = fact.metadata.get(SESSION_KEY)
                if isinstance(marker, str):
                    index.setdefault(marker, {})[fact.id] = _only_said_in(fact, marker)

    # ================================================================== durability

    def _remember(self, entry: LedgerEntry) -> None:
        if self.checkpoint is None:
            self.ledger.record([entry])  # no checkpoint: every write of the store is durable by itself
            return
        self._unsaved.append(entry)
        if len(self._unsaved) >= self.checkpoint_every:
            self._flush()

    def _flush(self) -> None:
        """Make the store durable, then record the sessions it now holds, in that order: a failed
        checkpoint records nothing (the sessions stay unsaved, and are done again by the next run), and
        a crash between the two only means those sessions are done again."""
        if not self._unsaved:
            return
        if self.checkpoint is not None:
            self.checkpoint()  # raises: nothing below runs, nothing is recorded
        entries, self._unsaved = self._unsaved, []
        self.ledger.record(entries)

    def _flush_after_error(self) -> None:
        """On the way out of a failed or interrupted run: keep the sessions already done if the store can
        still be made durable; if it cannot, record nothing and let the first error through."""
        try:
            self._flush()
        except Exception:  # the error that stopped the run is the one to report
            pass

    def _maybe_consolidate(self, scope: Scope, report: IngestReport) -> None:
        """Consolidate ``scope`` once ``consolidate_every`` extracted facts came in since the last time."""
        if self.consolidator is None or self.consolidate_every is None:
            return
        label = scope_label(scope)
        unsaved = sum(e.new_facts for e in self._unsaved if e.scope == label and e.status == "ok")
        if self.ledger.pending(scope) + unsaved < self.consolidate_every:
            return
        self._flush()  # the sessions behind these facts are durable before any fact is merged
        result = self.consolidator.consolidate(scope)
        if self.checkpoint is not None and result.merged:
            self.checkpoint()  # the merges are durable before the ledger says they happened
        self.ledger.record_consolidation(scope, result.merged)
        self._written.pop(scope, None)  # merges replaced facts: read the store again when needed
        report.consolidations += 1
        report.merged += result.merged


def _cue_writer(store: Any, llm: LLM | None, cues: bool | CueWriter) -> CueWriter | None:
    if cues is False or cues is None:
        return None
    from pgr_core.anticipation.anticipating import Anticipating

    if not isinstance(store, Anticipating):
        raise ConfigurationError(
            f"cues=True writes cues into a cue index: wrap the store first, Ingestor(Anticipating(store), ...); "
            f"got {type(store).__name__}"
        )
    if isinstance(cues, CueWriter):
        return cues
    if cues is not True:
        raise InvalidArgumentError(f"cues must be True, False or a CueWriter, got {cues!r}")
    if llm is None:
        raise ConfigurationError("cues=True needs an LLM to write the cues: pass llm= (or cues=CueWriter(llm))")
    return CueWriter(llm)


def _session_of(fact: Fact, scope: Scope) -> str | None:
    """The session that wrote ``fact``: its marker, or (facts written before markers) the session named
    in an extracted fact's id ``<owner>:<session>:f<k>``."""
    marker = fact.metadata.get(SESSION_KEY)
    if isinstance(marker, str):
        return marker
    sessions = fact.metadata.get("sessions")
    if fact.metadata.get("source") == "extracted" and isinstance(sessions, list) and sessions:
        first = sessions[0]
        if isinstance(first, str) and re.fullmatch(
            re.escape(f"{scope_label(scope)}:{key_part(first)}:f") + r"\d+", fact.id
        ):
            return first
    return None


def _only_said_in(fact: Fact, session_id: str) -> bool:
    """True when no session but ``session_id`` has said or confirmed ``fact`` (an update by a later
    session makes it that session's too: it is not deleted when ``session_id`` is done again)."""
    sessions = fact.metadata.get("sessions")
    return not isinstance(sessions, list) or all(s == session_id for s in sessions)


def _updated(old: Fact, item: Any, session: Session) -> Fact:
    meta = dict(old.metadata)
    sessions = list(meta.get("sessions") or [])
    if session.id not in sessions:  # a session counts once, however often it is ingested
        sessions.append(session.id)
        meta["frequency"] = int(meta.get("frequency", 1) or 1) + 1
    meta["sessions"] = sessions
    meta["entities"] = list(dict.fromkeys([*(meta.get("entities") or []), *item.entities]))
    meta.setdefault("source", "extracted")
    latest = max((d for d in (old.updated_at, old.date, session.date) if d is not None), default=None)
    return Fact(
        id=old.id,
        text=item.text,
        scope=old.scope,
        type=item.type or old.type,
        date=old.date or item.date,
        updated_at=latest,
        session_id=old.session_id,
        position=old.position,
        metadata=meta,
    )
