"""The ingestion ledger: which sessions are in the store already, so ingestion is idempotent and resumable.

One record per ingested session (its owner, id, content hash, status and the fact ids it wrote),
written only once the store holding that session is durable: after each store checkpoint when the
store is a file saved from memory, at once when every write of the store is durable. Two files:

- :class:`Ledger`: an append-only JSON-lines file (``store.pgr.ledger.jsonl``), each line fsynced;
- :class:`SqliteLedger`: a SQLite database (``<store dir>/ledger.sqlite3``, WAL), one transaction
  per :meth:`~Ledger.record` call, for directory stores.

:func:`open_ledger` picks one by the path's suffix. A session is keyed by its owner's three scope
fields and its id, kept apart (``[user, agent, run, session]``), so ``u1/x`` + ``s`` and ``u1`` +
agent ``x`` + ``s`` are two keys. Ledgers written before that (keyed by the ``u1/agent/run`` label)
are still read.

A JSONL line torn by a crash (the last line, cut before its newline or mid-character) is skipped
with a warning and cut off before the next append: that session is simply done again, which writes
the same fact ids and replaces what the session wrote before, so nothing is duplicated. Any other
unreadable line (valid JSON that is no record, unknown keys, a broken line in the middle) is a
:class:`~pgr_core.errors.ConfigurationError` naming the file, the line and what to do.
"""

from __future__ import annotations

import json
import os
import sqlite3
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from pgr_core.errors import ConfigurationError
from pgr_core.types import Scope
from pgr_core.write.sessions import Session, legacy_scope_label, scope_label

__all__ = [
    "Ledger",
    "LedgerEntry",
    "SqliteLedger",
    "SqliteRecords",
    "Status",
    "ledger_path_for",
    "open_ledger",
    "owner_of",
    "read_jsonl_records",
    "store_file_path",
]

Status = Literal["ok", "raw", "failed"]
STATUSES = ("ok", "raw", "failed")
SQLITE_SUFFIX = ".sqlite3"

Owner = tuple[str | None, str | None, str | None]


def owner_of(scope: Scope) -> Owner:
    """The exact owner of a scope, field by field: ``(user_id, agent_id, run_id)``."""
    return (scope.user_id, scope.agent_id, scope.run_id)


@dataclass
class LedgerEntry:
    """One session's record. ``status``: ``ok`` (extracted or raw by choice), ``raw`` (the LLM's output
    was unusable, so the turns went in raw), ``failed`` (nothing written; tried again next run).
    ``owner``: ``[user_id, agent_id, run_id]`` of the scope (None on records of old ledgers)."""

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
    owner: list[str | None] | None = None


_ENTRY_FIELDS = {f.name for f in fields(LedgerEntry)}
_SESSION_KEYS = _ENTRY_FIELDS | {"kind"}
_CONSOLIDATION_KEYS = {"kind", "scope", "owner", "merged", "at"}
_LEDGER_ADVICE = (
    "fix or delete that line (its session is then ingested again), or delete the ledger to ingest every session again"
)


# --------------------------------------------------------------------------- reading JSON lines


def read_jsonl_records(
    path: Path, *, check: Callable[[Any], str | None], advice: str, torn_means: str
) -> tuple[list[tuple[int, dict[str, Any]]], int | None]:
    """Every record of an append-only JSON-lines file, with its line number, and where to cut the file
    before the next append (None: nothing to cut).

    ``check(value)`` says what is wrong with a parsed line (None: it is a good record). A torn last
    line (no newline at its end, or undecodable / unparseable) is skipped with a warning that says
    ``torn_means``; any other bad line raises a ConfigurationError naming the file and line, then
    ``advice``.
    """
    data = path.read_bytes()
    pieces = data.split(b"\n")  # a newline byte never occurs inside a UTF-8 character
    tail = pieces.pop()  # what follows the last newline: b"" unless the last line was torn
    records: list[tuple[int, dict[str, Any]]] = []
    offset = 0
    cut: int | None = None
    for n, raw in enumerate(pieces, 1):
        start, offset = offset, offset + len(raw) + 1
        if not raw.strip():
            continue
        try:
            value = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            if n == len(pieces) and not tail:
                cut = _torn(path, n, f"not UTF-8 at byte {exc.start}", torn_means, start)
                break
            raise ConfigurationError(f"{path} line {n}: not UTF-8 text (byte {exc.start}); {advice}") from None
        except json.JSONDecodeError as exc:
            if n == len(pieces) and not tail:
                cut = _torn(path, n, f"not JSON: {exc.msg}", torn_means, start)
                break
            raise ConfigurationError(f"{path} line {n}: not JSON ({exc.msg}); {advice}") from None
        problem = check(value)
        if problem:
            raise ConfigurationError(f"{path} line {n}: {problem}; {advice}")
        records.append((n, value))
    if tail:
        cut = _torn(path, len(pieces) + 1, "no newline at its end", torn_means, offset)
    return records, cut


def _torn(path: Path, n: int, why: str, means: str, start: int) -> int:
    warnings.warn(
        f"{path} line {n} was torn by a crash ({why}): skipped, and cut off before the next write; {means}",
        RuntimeWarning,
        stacklevel=4,
    )
    return start


def _cut(path: Path, at: int | None) -> None:
    """Drop a torn tail before appending, so the next record starts on a line of its own."""
    if at is not None and path.exists() and path.stat().st_size > at:
        os.truncate(path, at)


def append_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Append records as lines, flushed and fsynced (one write: a crash tears at most the last line)."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if not text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


def _check_owner(value: Any) -> str | None:
    if value is None:
        return None
    ok = (
        isinstance(value, list)
        and len(value) == 3
        and all(v is None or (isinstance(v, str) and v.strip()) for v in value)
        and any(v is not None for v in value)
    )
    return None if ok else f"'owner' must be [user_id, agent_id, run_id] (strings or null), got {value!r}"


def check_ledger_record(value: Any) -> str | None:
    """What is wrong with one ledger record (None: nothing)."""
    if not isinstance(value, dict):
        return f"a JSON {_kind(value)}, not a ledger record (an object)"
    kind = value.get("kind")
    if kind not in ("session", "consolidation"):
        return f"'kind' must be 'session' or 'consolidation', got {kind!r}"
    allowed = _SESSION_KEYS if kind == "session" else _CONSOLIDATION_KEYS
    unknown = sorted(set(value) - allowed)
    if unknown:
        return f"unknown key(s) {unknown} in a {kind} record"
    strings = ("scope", "session", "hash") if kind == "session" else ("scope",)
    for name in strings:
        if not isinstance(value.get(name), str):
            return f"'{name}' must be a string, got {value.get(name)!r}"
    problem = _check_owner(value.get("owner"))
    if problem:
        return problem
    if kind == "consolidation":
        merged = value.get("merged", 0)
        return None if isinstance(merged, int) and not isinstance(merged, bool) else "'merged' must be an integer"
    if value.get("status") not in STATUSES:
        return f"'status' must be one of {list(STATUSES)}, got {value.get('status')!r}"
    facts = value.get("facts", [])
    if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
        return "'facts' must be a list of fact ids (strings)"
    new = value.get("new_facts", 0)
    if not isinstance(new, int) or isinstance(new, bool) or new < 0:
        return f"'new_facts' must be an integer >= 0, got {new!r}"
    for name in ("mode", "at"):
        if name in value and not isinstance(value[name], str):
            return f"'{name}' must be a string, got {value[name]!r}"
    for name in ("guideline", "error"):
        if value.get(name) is not None and not isinstance(value[name], str):
            return f"'{name}' must be a string or null, got {value[name]!r}"
    return None


# --------------------------------------------------------------------------- the ledger


class Ledger:
    """Ingested sessions, in memory or in an append-only JSONL file (``path``).

    >>> ledger = Ledger()            # in memory: idempotent within one process
    >>> ledger = Ledger("store.pgr.ledger.jsonl")  # doctest: +SKIP
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._entries: dict[tuple[str | None, str | None, str | None, str], LedgerEntry] = {}
        self._pending: dict[Owner, int] = {}
        # records of ledgers written before owners were kept apart: keyed by the old label
        self._legacy: dict[tuple[str, str], LedgerEntry] = {}
        self._legacy_pending: dict[str, int] = {}
        self._cut_at: int | None = None
        for record in self._load():
            self._apply(record)

    # ------------------------------------------------------------------ storage (what a subclass changes)

    def _load(self) -> Iterator[dict[str, Any]]:
        if self.path is None or not self.path.exists():
            return iter(())
        records, self._cut_at = read_jsonl_records(
            self.path,
            check=check_ledger_record,
            advice=_LEDGER_ADVICE,
            torn_means="that session is ingested again",
        )
        return (record for _, record in records)

    def _persist(self, records: list[dict[str, Any]]) -> None:
        if self.path is None:
            return
        _cut(self.path, self._cut_at)
        self._cut_at = None
        append_jsonl(self.path, records)

    # ------------------------------------------------------------------ applying records

    def _apply(self, record: dict[str, Any]) -> None:
        owner = tuple(record["owner"]) if record.get("owner") is not None else None
        if record.get("kind") == "consolidation":
            if owner is None:
                self._legacy_pending[record["scope"]] = 0
            else:
                self._pending[owner] = 0  # type: ignore[index]
                self._legacy_pending[legacy_scope_label(Scope(*owner))] = 0
            return
        entry = LedgerEntry(**{k: v for k, v in record.items() if k != "kind"})
        counts = entry.status != "failed"
        if owner is None:
            self._legacy[(entry.scope, entry.session)] = entry
            if counts:
                self._legacy_pending[entry.scope] = self._legacy_pending.get(entry.scope, 0) + entry.new_facts
            return
        self._entries[(*owner, entry.session)] = entry  # type: ignore[index]
        if counts:
            self._pending[owner] = self._pending.get(owner, 0) + entry.new_facts  # type: ignore[index]

    def _append(self, records: Iterable[dict[str, Any]]) -> None:
        batch = list(records)
        if not batch:
            return
        self._persist(batch)  # durable first: memory never claims what the file does not hold
        for record in batch:
            self._apply(record)

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._entries) + len(self._legacy)

    def get(self, scope: Scope, session_id: str) -> LedgerEntry | None:
        entry = self._entries.get((*owner_of(scope), session_id))
        return entry if entry is not None else self._legacy.get((legacy_scope_label(scope), session_id))

    def is_done(self, scope: Scope, session: Session, *, redo_raw: bool = False) -> bool:
        """True when ``session`` is in, unchanged, and need not be redone."""
        entry = self.get(scope, session.id)
        if entry is None or entry.hash != session.content_hash or entry.status == "failed":
            return False
        return not (redo_raw and entry.status == "raw")

    def pending(self, scope: Scope) -> int:
        """Extracted facts added for ``scope`` since its last consolidation."""
        return self._pending.get(owner_of(scope), 0) + self._legacy_pending.get(legacy_scope_label(scope), 0)

    def entries(self) -> list[LedgerEntry]:
        return [*self._legacy.values(), *self._entries.values()]

    # ------------------------------------------------------------------ writing

    def record(self, entries: Iterable[LedgerEntry]) -> None:
        """Record sessions as done (call only once the store holding them is durable)."""
        self._append({"kind": "session", **asdict(e)} for e in entries)

    def record_consolidation(self, scope: Scope, merged: int) -> None:
        at = datetime.now(UTC).isoformat(timespec="seconds")
        record = {"kind": "consolidation", "scope": scope_label(scope), "owner": list(owner_of(scope))}
        self._append([record | {"merged": merged, "at": at}])

    def close(self) -> None:
        """Release the file (nothing to do for JSONL; the SQLite ledger closes its connection)."""

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SqliteRecords:
    """An append-only table of JSON records in a SQLite database (stdlib ``sqlite3``, WAL journal,
    ``synchronous=FULL``, explicit transactions): what :class:`SqliteLedger` and the consolidation
    journal (:class:`~pgr_core.write.consolidate.SqliteJournal`) keep their records in.

    ``kind`` names the file in messages ("ledger", "journal"), ``unit`` a record ("record", "row");
    ``check`` says what is wrong with a parsed record (None: nothing); ``advice`` follows a bad
    record's message, ``unusable`` a file that is not a database, ``old_format`` (after "upgrade pgr,
    or ") a file of another format.
    """

    FORMAT = 1  # PRAGMA user_version

    def __init__(
        self,
        path: Path,
        *,
        kind: str,
        unit: str,
        check: Callable[[Any], str | None],
        advice: str,
        unusable: str,
        old_format: str,
    ) -> None:
        self.path, self.unit, self.check, self.advice = path, unit, check, advice
        path.parent.mkdir(parents=True, exist_ok=True)
        db: sqlite3.Connection | None = None
        try:
            db = sqlite3.connect(path, isolation_level=None)  # transactions are explicit
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            db.execute("PRAGMA synchronous=FULL")  # a committed record survives power loss
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, self.FORMAT):
                raise ConfigurationError(
                    f"{path}: {kind} format {version}, this pgr reads format {self.FORMAT}; "
                    f"upgrade pgr, or {old_format}"
                )
            db.execute(
                "CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY AUTOINCREMENT, record TEXT NOT NULL)"
            )
            db.execute(f"PRAGMA user_version={self.FORMAT}")
        except BaseException as exc:
            if db is not None:
                db.close()
            if isinstance(exc, sqlite3.Error):
                raise ConfigurationError(f"{path} is not a usable SQLite {kind} ({exc}); {unusable}") from exc
            raise
        self.db = db
        self.journal_mode = str(mode).lower()

    def records(self) -> list[dict[str, Any]]:
        """Every record in order; one that is not JSON, or that ``check`` faults, is a ConfigurationError."""
        out = []
        for seq, text in self.db.execute("SELECT seq, record FROM records ORDER BY seq").fetchall():
            try:
                value = json.loads(text)
            except (TypeError, ValueError) as exc:  # not text, not UTF-8, not JSON
                raise ConfigurationError(f"{self.path} {self.unit} {seq}: not JSON ({exc}); {self.advice}") from None
            problem = self.check(value)
            if problem:
                raise ConfigurationError(f"{self.path} {self.unit} {seq}: {problem}; {self.advice}")
            out.append(value)
        return out

    def _transaction(self, what: str, run: Callable[[sqlite3.Connection], object]) -> None:
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                run(self.db)
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise ConfigurationError(f"{self.path}: could not {what}: {exc}") from exc

    def append(self, records: Iterable[dict[str, Any]], what: str) -> None:
        """Add ``records`` in one transaction (all or none)."""
        rows = [(json.dumps(r, ensure_ascii=False),) for r in records]
        self._transaction(what, lambda db: db.executemany("INSERT INTO records (record) VALUES (?)", rows))

    def clear(self, what: str) -> None:
        self._transaction(what, lambda db: db.execute("DELETE FROM records"))

    def close(self) -> None:
        self.db.close()


class SqliteLedger(Ledger):
    """The ledger in a SQLite database (:class:`SqliteRecords`): the same records as :class:`Ledger`,
    one transaction per :meth:`record` call, so a crash never leaves half a batch. For directory
    stores (``<dir>/ledger.sqlite3``).

    >>> ledger = SqliteLedger("memory/ledger.sqlite3")  # doctest: +SKIP
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._table = SqliteRecords(
            self.path,
            kind="ledger",
            unit="record",
            check=check_ledger_record,
            advice=_LEDGER_ADVICE,
            unusable="move it away, or delete it to ingest every session again",
            old_format="delete the ledger to ingest every session again",
        )
        self.journal_mode = self._table.journal_mode
        super().__init__(self.path)

    def _load(self) -> Iterator[dict[str, Any]]:
        return iter(self._table.records())

    def _persist(self, records: list[dict[str, Any]]) -> None:
        self._table.append(records, f"record {len(records)} ledger record(s)")

    def close(self) -> None:
        self._table.close()


def store_file_path(store: str | Path, name: str, *, directory: bool | None = None) -> Path:
    """Where a store keeps its file ``name`` (``ledger``, ``journal``): ``<dir>/<name>.sqlite3`` in a
    directory store, ``<file>.<name>.jsonl`` beside a store file. ``directory`` says which when the
    store does not exist yet (default: a path without a suffix is a directory)."""
    store = Path(store)
    if directory is None:
        directory = store.is_dir() or (not store.exists() and not store.suffix)
    return store / f"{name}{SQLITE_SUFFIX}" if directory else store.with_name(f"{store.name}.{name}.jsonl")


def open_ledger(path: str | Path | None) -> Ledger:
    """The ledger at ``path``: :class:`SqliteLedger` for a ``.sqlite3`` file, :class:`Ledger` (JSON
    lines) otherwise, in memory for None.

    >>> open_ledger(None).path is None
    True
    """
    if path is None:
        return Ledger()
    path = Path(path)
    return SqliteLedger(path) if path.suffix == SQLITE_SUFFIX else Ledger(path)


def ledger_path_for(store: str | Path, *, directory: bool | None = None) -> Path:
    """Where the ledger of the store at ``store`` lives: ``<dir>/ledger.sqlite3`` for a directory store
    (an embedded store's folder), ``<file>.ledger.jsonl`` beside a store file (:func:`store_file_path`)."""
    return store_file_path(store, "ledger", directory=directory)
