"""The ingestion ledger: which sessions are in the store already, so ingestion is idempotent and resumable.

One JSON line per ingested session (its scope, id, content hash, status and the fact ids it wrote),
appended and flushed to disk as each session is done, or after each store checkpoint when the store
is a file saved from memory. A line torn by a crash is ignored: that session is simply done again,
which writes the same fact ids (raw turns and extracted facts both get ids derived from the session)
and never bumps a frequency twice (an update counts a session once), so nothing is duplicated.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from ..types import Scope
from .sessions import Session, scope_label

__all__ = ["Ledger", "LedgerEntry", "Status"]

Status = Literal["ok", "raw", "failed"]


@dataclass
class LedgerEntry:
    """One session's record. ``status``: ``ok`` (extracted or raw by choice), ``raw`` (the LLM's output
    was unusable, so the turns went in raw), ``failed`` (nothing written; tried again next run)."""

    scope: str
    session: str
    hash: str
    status: Status
    facts: list[str] = field(default_factory=list)
    new_facts: int = 0  # extracted facts added (they count toward the next consolidation)
    mode: str = "raw"
    guideline: str | None = None
    error: str | None = None
    at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))


class Ledger:
    """Ingested sessions, in memory or in an append-only JSONL file (``path``).

    >>> ledger = Ledger()            # in memory: idempotent within one process
    >>> ledger = Ledger("store.pgr.ledger.jsonl")  # doctest: +SKIP
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._entries: dict[tuple[str, str], LedgerEntry] = {}
        self._pending: dict[str, int] = {}
        if self.path is not None and self.path.exists():
            self._read()

    def _read(self) -> None:
        assert self.path is not None
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a crash: its session is done again
            self._apply(record)

    def _apply(self, record: dict) -> None:
        if record.get("kind") == "consolidation":
            self._pending[record["scope"]] = 0
            return
        entry = LedgerEntry(**{k: v for k, v in record.items() if k != "kind"})
        self._entries[(entry.scope, entry.session)] = entry
        if entry.status != "failed":
            self._pending[entry.scope] = self._pending.get(entry.scope, 0) + entry.new_facts

    def _append(self, records: Iterable[dict]) -> None:
        records = list(records)
        for record in records:
            self._apply(record)
        if self.path is None or not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, scope: Scope, session_id: str) -> LedgerEntry | None:
        return self._entries.get((scope_label(scope), session_id))

    def is_done(self, scope: Scope, session: Session, *, redo_raw: bool = False) -> bool:
        """True when ``session`` is in, unchanged, and need not be redone."""
        entry = self.get(scope, session.id)
        if entry is None or entry.hash != session.content_hash or entry.status == "failed":
            return False
        return not (redo_raw and entry.status == "raw")

    def pending(self, scope: Scope) -> int:
        """Extracted facts added for ``scope`` since its last consolidation."""
        return self._pending.get(scope_label(scope), 0)

    def entries(self) -> list[LedgerEntry]:
        return list(self._entries.values())

    # ------------------------------------------------------------------ writing

    def record(self, entries: Iterable[LedgerEntry]) -> None:
        self._append({"kind": "session", **asdict(e)} for e in entries)

    def record_consolidation(self, scope: Scope, merged: int) -> None:
        at = datetime.now(UTC).isoformat(timespec="seconds")
        self._append([{"kind": "consolidation", "scope": scope_label(scope), "merged": merged, "at": at}])
