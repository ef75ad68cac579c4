"""Consolidation: near-duplicate facts of the same week become one fact, atomically per cluster.

In the order it runs:

1. group a scope's facts by their exact owner (a merge never crosses owners: ``Scope(agent_id="bot")``
   sees alice's and bob's facts, and merges each one's apart);
2. cluster each owner's facts by cosine similarity (every pair in a cluster at least ``threshold``),
   admitting a fact only while the cluster's whole span of dates stays within ``window_days`` (7);
   undated facts and raw turns are left alone;
3. one LLM merge per cluster (without an LLM: the most repeated, then latest, wording is kept);
4. the merged fact sums the frequencies, unions provenance and entities, and records the ids it
   replaces (``metadata["merged_from"]``), the texts of the original facts it stands for
   (``metadata["merged_texts"]``) and their first and last dates (``metadata["span"]``);
5. the swap goes through a write-ahead journal (:class:`Journal`, JSON lines beside a store file, or
   :class:`SqliteJournal`, ``<dir>/journal.sqlite3`` in a directory store; :func:`open_journal` picks
   by suffix): intent (the merged fact and the originals, durable on disk) → add the merged fact →
   delete the originals → checkpoint the store → commit.

Consolidation is a fixed point: a merged fact is compared through the original facts it stands for
(similarity is the least over their texts, the window holds for its whole span, ``max_cluster``
counts originals), so running it again on its own output finds nothing more to merge, however the
LLM worded the merge; only facts that came in since can join.

If the LLM fails, nothing of that cluster is written. If the process dies anywhere in step 5, the
next :class:`Consolidator` on the same store and journal rolls every uncommitted intent forward: the
merged fact has a fixed id (derived from the ids it replaces), so adding it again replaces it, and
deleting originals already gone deletes nothing. No fact is lost and none is duplicated.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from pgr_core._dates import parse_date
from pgr_core.errors import InvalidArgumentError, LLMError, LLMOutputError, PGRError
from pgr_core.models.embedders import Embedder
from pgr_core.models.llm import LLM, parse_json
from pgr_core.models.prompts import render
from pgr_core.types import Fact, Scope
from pgr_core.write.guideline import FACT_TYPES
from pgr_core.write.ledger import SQLITE_SUFFIX, SqliteRecords, append_jsonl, read_jsonl_records, store_file_path
from pgr_core.write.sessions import scope_label
from pgr_core.write.stores import FactWriter, fact_from_dict, latest_date, writer_for

__all__ = [
    "ConsolidationReport",
    "Consolidator",
    "Journal",
    "MERGE_SCHEMA",
    "SqliteJournal",
    "journal_path_for",
    "listed_facts",
    "open_journal",
    "remove_owned",
]

MERGE_SCHEMA = {
    "type": "object",
    "required": ["text"],
    "properties": {"text": {"type": "string"}, "type": {"type": "string"}},
}

# the points of the swap where a test can make the process "die" (see Consolidator.fault)
FAULT_POINTS = ("intent", "added", "deleted", "checkpointed", "committed")


@dataclass
class ConsolidationReport:
    scope: str
    facts_before: int = 0
    facts_after: int = 0
    clusters: int = 0  # clusters of two or more facts found
    merged: int = 0  # clusters merged
    failed: list[str] = field(default_factory=list)  # clusters left alone, and why
    recovered: int = 0  # uncommitted swaps rolled forward when the consolidator opened
    llm_calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_JOURNAL_KEYS = {"intent": {"op", "swap", "merged", "originals"}, "commit": {"op", "swap"}}


def _check_journal_record(value: Any) -> str | None:
    if not isinstance(value, dict):
        kind = "array" if isinstance(value, list) else type(value).__name__
        return f"a JSON {kind}, not a journal record (an object)"
    op = value.get("op")
    if op not in _JOURNAL_KEYS:
        return f"'op' must be 'intent' or 'commit', got {op!r}"
    unknown = sorted(set(value) - _JOURNAL_KEYS[op])
    missing = sorted(_JOURNAL_KEYS[op] - set(value))
    if unknown or missing:
        return f"{op} record with " + "; ".join(
            part for part in (unknown and f"unknown key(s) {unknown}", missing and f"missing {missing}") if part
        )
    if not isinstance(value["swap"], str):
        return f"'swap' must be a string, got {value['swap']!r}"
    if op == "intent":
        if not isinstance(value["originals"], list):
            return "'originals' must be a list of facts"
        for what, data in [("merged", value["merged"]), *(("originals", f) for f in value["originals"])]:
            try:
                if not isinstance(data, dict):
                    raise TypeError(f"a {type(data).__name__}, not a fact object")
                fact_from_dict(data)
            except (KeyError, TypeError, ValueError, PGRError) as exc:
                return f"'{what}' holds a fact that cannot be read ({type(exc).__name__}: {exc})"
    return None


def _journal_advice(unit: str) -> str:
    return (
        f"the journal holds consolidation swaps not yet finished: restore the {unit} from a backup, or move "
        "the journal away and check the store for facts a swap left half done (a merged fact next to the "
        "facts named in its merged_from)"
    )


_JOURNAL_ADVICE = _journal_advice("line")


class Journal:
    """Write-ahead record of cluster swaps: ``intent`` lines (with full facts) and ``commit`` lines.

    In memory when ``path`` is None. Each line is flushed and fsynced before the store is touched. A
    last line torn by a crash is skipped with a warning (its swap had not started) and cut off before
    the next line is written; any other unreadable line is a ConfigurationError naming the line.
    :class:`SqliteJournal` keeps the same records in a SQLite database (directory stores);
    :func:`open_journal` picks one by the path's suffix.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._cut_at: int | None = None
        self._lines: list[dict[str, Any]] = self._load()

    # ------------------------------------------------------------------ storage (what a subclass changes)

    def _load(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.exists():
            return []
        records, self._cut_at = read_jsonl_records(
            self.path,
            check=_check_journal_record,
            advice=_JOURNAL_ADVICE,
            torn_means="that swap had not started",
        )
        return [record for _, record in records]

    def _persist(self, record: dict[str, Any]) -> None:
        if self.path is None:
            return
        if self._cut_at is not None and self.path.exists() and self.path.stat().st_size > self._cut_at:
            with self.path.open("r+b") as fh:  # a torn tail: the next line starts on its own
                fh.truncate(self._cut_at)
        self._cut_at = None
        append_jsonl(self.path, [record])

    def _erase(self) -> None:
        self._cut_at = None
        if self.path is not None and self.path.exists():
            tmp = self.path.with_suffix(self.path.suffix + ".tmp")
            tmp.write_text("", encoding="utf-8")
            tmp.replace(self.path)

    # ------------------------------------------------------------------ the interface

    def _write(self, record: dict[str, Any]) -> None:
        self._persist(record)  # durable first: memory never claims what the file does not hold
        self._lines.append(record)

    def intent(self, swap: str, merged: Fact, originals: Sequence[Fact]) -> None:
        self._write(
            {"op": "intent", "swap": swap, "merged": merged.to_dict(), "originals": [f.to_dict() for f in originals]}
        )

    def commit(self, swap: str) -> None:
        self._write({"op": "commit", "swap": swap})

    def pending(self) -> list[tuple[str, Fact, list[Fact]]]:
        """Intents without a commit, oldest first."""
        committed = {r["swap"] for r in self._lines if r.get("op") == "commit"}
        out = []
        for r in self._lines:
            if r.get("op") == "intent" and r["swap"] not in committed:
                out.append((r["swap"], fact_from_dict(r["merged"]), [fact_from_dict(f) for f in r["originals"]]))
        return out

    def clear(self) -> None:
        """Forget committed history (only when nothing is pending)."""
        if self.pending():
            return
        self._erase()
        self._lines = []

    def close(self) -> None:
        """Release the file (nothing to do for JSONL; the SQLite journal closes its connection)."""

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SqliteJournal(Journal):
    """The journal in a SQLite database (stdlib ``sqlite3``, WAL, ``synchronous=FULL``): the same
    records as :class:`Journal`, one committed transaction per :meth:`intent` and :meth:`commit`, so an
    intent is durable before its swap starts and a crash never leaves a torn record. For directory
    stores (``<dir>/journal.sqlite3``). A row that cannot be read is a ConfigurationError naming the
    file and the row.

    >>> journal = SqliteJournal("memory/journal.sqlite3")  # doctest: +SKIP
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._table = SqliteRecords(
            self.path,
            kind="journal",
            unit="row",
            check=_check_journal_record,
            advice=_journal_advice("row"),
            unusable="move it away, then check the store for facts a swap left half done (a merged fact "
            "next to the facts named in its merged_from)",
            old_format="move the journal away and check the store for facts a swap left half done",
        )
        self.journal_mode = self._table.journal_mode
        try:
            super().__init__(self.path)
        except BaseException:
            self._table.close()
            raise

    def _load(self) -> list[dict[str, Any]]:
        return self._table.records()

    def _persist(self, record: dict[str, Any]) -> None:
        self._table.append([record], f"record the {record['op']} of {record['swap']}")

    def _erase(self) -> None:
        self._table.clear("clear the journal")

    def close(self) -> None:
        self._table.close()


def open_journal(path: str | Path | None) -> Journal:
    """The journal at ``path``: :class:`SqliteJournal` for a ``.sqlite3`` file, :class:`Journal` (JSON
    lines) otherwise, in memory for None.

    >>> open_journal(None).path is None
    True
    """
    if path is None:
        return Journal()
    path = Path(path)
    return SqliteJournal(path) if path.suffix == SQLITE_SUFFIX else Journal(path)


def journal_path_for(store: str | Path, *, directory: bool | None = None) -> Path:
    """Where the journal of the store at ``store`` lives: ``<dir>/journal.sqlite3`` for a directory store,
    ``<file>.journal.jsonl`` beside a store file (:func:`~pgr_core.write.ledger.store_file_path`)."""
    return store_file_path(store, "journal", directory=directory)


# --------------------------------------------------------------------------- listing and deleting by owner


def listed_facts(writer: FactWriter, scope: Scope) -> list[Fact]:
    """Every fact ``scope`` sees (:meth:`FactWriter.facts_of`)."""
    return writer.facts_of(scope)


def remove_owned(writer: FactWriter, ids: Iterable[str], scope: Scope) -> int:
    """Delete the facts ``ids`` of the owner ``scope`` (:meth:`FactWriter.remove`)."""
    return writer.remove(ids, scope=scope)


def _remove_originals(writer: FactWriter, merged: Fact, originals: Sequence[Fact]) -> None:
    """Delete a swap's originals, each through its own owner (a journal written before merges kept to
    one owner may name several)."""
    by_owner: dict[Scope, list[str]] = {}
    for fact in originals:
        if (fact.id, fact.scope) != (merged.id, merged.scope):
            by_owner.setdefault(fact.scope, []).append(fact.id)
    for owner, ids in by_owner.items():
        remove_owned(writer, ids, owner)


class Consolidator:
    """Merges near-duplicate facts of one user, cluster by cluster, through a journal.

    >>> consolidator = Consolidator(store, llm=llm, journal=Journal("store.pgr.journal.jsonl"),
    ...                             checkpoint=lambda: store.save("store.pgr"))  # doctest: +SKIP
    >>> consolidator.consolidate(Scope(user_id="u1")).merged  # doctest: +SKIP

    Opening a consolidator rolls forward any swap a crash left uncommitted (``self.recovered``).
    The store must be able to list, replace and delete facts by id (InMemoryStore can).
    ``fault`` is for tests: called with each point of the swap (``FAULT_POINTS``); raising there
    simulates the process dying at that point.
    """

    def __init__(
        self,
        store: Any,
        llm: LLM | None = None,
        *,
        threshold: float = 0.85,
        window_days: float = 7.0,
        max_cluster: int = 8,
        journal: Journal | None = None,
        checkpoint: Callable[[], Any] | None = None,
        embedder: Embedder | None = None,
        include_turns: bool = False,
        types: Sequence[str] = tuple(FACT_TYPES),
        max_tokens: int = 300,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        if not 0.0 < threshold <= 1.0:
            raise InvalidArgumentError(f"threshold must be in (0, 1], got {threshold!r}")
        if window_days < 0 or max_cluster < 2:
            raise InvalidArgumentError("window_days must be >= 0 and max_cluster >= 2")
        self.writer: FactWriter = writer_for(store)
        self.writer.require_rewrite("consolidation")
        self.llm = llm
        self.threshold = threshold
        self.window = timedelta(days=window_days)
        self.max_cluster = max_cluster
        self.journal = journal if journal is not None else Journal()
        self.checkpoint = checkpoint
        self.embedder = embedder
        self.include_turns = include_turns
        self.types = list(types)
        self.max_tokens = max_tokens
        self.fault = fault
        self.recovered = self.recover()

    # ================================================================== recovery

    def recover(self) -> int:
        """Roll every uncommitted swap forward; returns how many there were."""
        pending = self.journal.pending()
        for swap, merged, originals in pending:
            self.writer.put([merged])
            _remove_originals(self.writer, merged, originals)
            if self.checkpoint is not None:
                self.checkpoint()
            self.journal.commit(swap)
        if pending:
            self.journal.clear()
        return len(pending)

    # ================================================================== the steps

    def candidates(self, scope: Scope) -> list[Fact]:
        """The facts that may be merged: the scope's, dated, and not raw turns (unless asked)."""
        return [
            f
            for f in listed_facts(self.writer, scope)
            if latest_date(f) is not None and (self.include_turns or f.type != "turn")
        ]

    def clusters(self, facts: Sequence[Fact]) -> list[list[Fact]]:
        """Complete-linkage clusters at ``threshold`` whose whole span of dates is at most ``window_days``,
        each of one owner's facts (facts of several owners are grouped by owner first)."""
        by_owner: dict[Scope, list[Fact]] = {}
        for fact in facts:
            by_owner.setdefault(fact.scope, []).append(fact)
        out: list[list[Fact]] = []
        for owner in sorted(by_owner, key=scope_label):
            out += self._owner_clusters(by_owner[owner])
        return out

    def _owner_clusters(self, facts: Sequence[Fact]) -> list[list[Fact]]:
        """Clusters of one owner's facts. A merged fact counts as the originals it stands for: its
        similarity to another fact is the least over those originals' texts, its dates are their span,
        and each original counts toward ``max_cluster``, so a second run merges nothing the first kept
        apart."""
        if len(facts) < 2:
            return []
        units = [_Unit.of(f) for f in facts]
        sims = self._unit_similarity(units)
        order = sorted(range(len(units)), key=lambda i: (units[i].first, facts[i].id))
        taken: set[int] = set()
        out: list[list[Fact]] = []
        for i in order:
            if i in taken:
                continue
            members = [i]
            near = sorted(
                (j for j in order if j not in taken and j != i and sims[i, j] >= self.threshold),
                key=lambda j: -sims[i, j],
            )
            for j in near:
                size = sum(units[m].size for m in members)
                if size + units[j].size > self.max_cluster:
                    continue
                if all(sims[j, m] >= self.threshold for m in members) and self._within_window(
                    [units[m] for m in [*members, j]]
                ):
                    members.append(j)
            if len(members) > 1:
                taken.update(members)
                out.append([facts[m] for m in members])
        return out

    def _unit_similarity(self, units: Sequence[_Unit]) -> np.ndarray:
        """units × units: the least cosine between an original of one and an original of the other."""
        texts = [t for u in units for t in u.texts]
        vectors = np.asarray(self.writer.embed(texts, self.embedder), dtype=np.float32)
        leaf = vectors @ vectors.T
        if len(texts) == len(units):
            return leaf
        starts = np.cumsum([0, *(u.size for u in units[:-1])])
        rows = np.minimum.reduceat(leaf, starts, axis=0)
        return np.minimum.reduceat(rows, starts, axis=1)

    def _within_window(self, units: Sequence[_Unit]) -> bool:
        return max(u.last for u in units) - min(u.first for u in units) <= self.window

    def merge_text(self, cluster: Sequence[Fact], report: ConsolidationReport) -> tuple[str, str | None]:
        """One LLM call for the cluster's merged wording and type (raises LLMError on failure)."""
        if self.llm is None:
            kept = max(cluster, key=lambda f: (_frequency(f), latest_date(f), f.id))
            return kept.text, Counter(f.type for f in cluster).most_common(1)[0][0]
        lines = "\n".join(
            f"- [{f.type or 'untyped'}, {latest_date(f).date().isoformat()}] {f.text}"  # type: ignore[union-attr]
            for f in cluster
        )
        messages = [{"role": "user", "content": render("write_merge", facts=lines, type_names=", ".join(self.types))}]
        report.llm_calls += 1
        completion = self.llm.complete(messages, schema=MERGE_SCHEMA, max_tokens=self.max_tokens)
        if completion.truncated:
            raise LLMOutputError("the merge reply was cut off", raw=completion.text)
        reply = parse_json(completion.text, MERGE_SCHEMA)
        text = " ".join(str(reply.get("text") or "").split())
        if not text:
            raise LLMOutputError("the merge reply has empty text", raw=completion.text)
        by_name = {t.lower(): t for t in self.types}
        kind = (
            by_name.get(str(reply.get("type") or "").lower()) or Counter(f.type for f in cluster).most_common(1)[0][0]
        )
        return text, kind

    def merged_fact(self, cluster: Sequence[Fact], text: str, kind: str | None) -> Fact:
        """The fact replacing ``cluster`` (all of one owner): frequencies summed, provenance and entities
        unioned, the originals' texts and the span of their dates kept."""
        owners = {f.scope for f in cluster}
        if len(owners) != 1:
            raise InvalidArgumentError(f"a merge takes facts of one owner, got {sorted(map(scope_label, owners))}")
        ids = sorted(f.id for f in cluster)
        digest = hashlib.sha1(json.dumps(ids).encode("utf-8")).hexdigest()[:16]
        scope = cluster[0].scope
        sessions: list[str] = []
        entities: list[str] = []
        texts: list[str] = []
        units = [_Unit.of(f) for f in cluster]
        for f, unit in zip(cluster, units, strict=True):
            sessions += [s for s in f.metadata.get("sessions") or [] if s not in sessions]
            entities += [e for e in f.metadata.get("entities") or [] if e not in entities]
            texts += unit.texts
        first, last = min(u.first for u in units), max(u.last for u in units)
        if last - first > self.window:
            raise InvalidArgumentError(
                f"merging {ids} would span {first.date()} to {last.date()}, more than the {self.window.days}-day window"
            )
        dated = [f.date for f in cluster if f.date is not None]
        metadata = {
            "frequency": sum(_frequency(f) for f in cluster),
            "sessions": sessions,
            "entities": entities,
            "merged_from": ids,
            "merged_texts": texts,
            "span": [first.isoformat(), last.isoformat()],
            "source": "merged",
            "merged_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        return Fact(
            id=f"{scope_label(scope)}:m{digest}",
            text=text,
            scope=scope,
            type=kind,
            date=min(dated) if dated else None,
            updated_at=last,
            metadata=metadata,
        )

    def swap(self, merged: Fact, originals: Sequence[Fact]) -> None:
        """intent → add merged → delete originals → checkpoint → commit (see the module docstring)."""
        swap = merged.id
        self.journal.intent(swap, merged, originals)
        self._at("intent")
        self.writer.put([merged])
        self._at("added")
        _remove_originals(self.writer, merged, originals)
        self._at("deleted")
        if self.checkpoint is not None:
            self.checkpoint()
        self._at("checkpointed")
        self.journal.commit(swap)
        self._at("committed")

    def _at(self, point: str) -> None:
        if self.fault is not None:
            self.fault(point)

    # ================================================================== public API

    def consolidate(self, scope: Scope | Any) -> ConsolidationReport:
        """Cluster and merge the facts ``scope`` sees, each owner's apart. LLM failures leave their
        cluster as it was."""
        scope = Scope.coerce(scope)
        report = ConsolidationReport(scope_label(scope), recovered=self.recovered)
        facts = self.candidates(scope)
        report.facts_before = len(listed_facts(self.writer, scope))
        groups = self.clusters(facts)
        report.clusters = len(groups)
        for cluster in groups:
            try:
                text, kind = self.merge_text(cluster, report)
            except LLMError as exc:
                report.failed.append(f"{[f.id for f in cluster]}: {type(exc).__name__}: {exc}")
                continue
            self.swap(self.merged_fact(cluster, text, kind), cluster)
            report.merged += 1
        self.journal.clear()
        report.facts_after = len(listed_facts(self.writer, scope))
        return report


@dataclass(frozen=True)
class _Unit:
    """What one fact stands for in clustering: the texts of its originals and the span of their dates."""

    texts: tuple[str, ...]
    first: datetime
    last: datetime

    @property
    def size(self) -> int:
        return len(self.texts)

    @classmethod
    def of(cls, fact: Fact) -> _Unit:
        latest = latest_date(fact)
        assert latest is not None, "only dated facts are clustered"
        meta = fact.metadata
        texts = meta.get("merged_texts")
        if not (isinstance(texts, list) and texts and all(isinstance(t, str) and t.strip() for t in texts)):
            texts = [fact.text]
        first, last = latest, latest
        span = meta.get("span")
        if isinstance(span, list) and len(span) == 2:
            try:
                first, last = parse_date(span[0]) or latest, parse_date(span[1]) or latest
            except PGRError:
                first, last = latest, latest
        elif meta.get("source") == "merged" and fact.date is not None:
            first = min(fact.date, latest)  # merged before spans were kept: date .. updated_at
        return cls(tuple(texts), min(first, last), max(first, last))


def _frequency(fact: Fact) -> int:
    try:
        return max(1, int(fact.metadata.get("frequency", 1) or 1))
    except (TypeError, ValueError):
        return 1
