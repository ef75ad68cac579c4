"""What an EdgeStore has acknowledged, kept outside the engine: ``<dir>/acknowledged.sqlite3``.

One row per point the engine was told to hold (its point id, owner and fact id). The engine's files
can be damaged (a flipped bit in its write-ahead log, a truncated id map, a lost segment) and the
engine then opens holding fewer points without a word; comparing its points with these rows is how
:class:`~pgr_core.stores.edge.EdgeStore` notices, refuses to open, and how ``pgr store repair`` says exactly
which facts it could not keep.

Order makes a crash harmless: an add is written to the engine first and recorded here after, a delete
is removed here first and from the engine after. A ``kill -9`` between the two leaves the engine
holding *more* than these rows say (never fewer), and the next open adopts those points.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

FILE = "acknowledged.sqlite3"

Row = tuple[str, str | None, str | None, str | None, str]  # point id, user_id, agent_id, run_id, fact_id


class Acknowledged:
    """The acknowledged points of one EdgeStore (see the module docstring). One lock serialises its
    statements; the store changes it under its own write lock, so a change and its engine write go together."""

    def __init__(self, root: Path, *, durable: bool = False) -> None:
        self.path = root / FILE
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL survives the process dying (the engine's own guarantee); FULL a power cut, as sync_writes
        self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS points (id TEXT PRIMARY KEY, user_id TEXT, agent_id TEXT, run_id TEXT, "
            "fact_id TEXT NOT NULL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL)")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add(self, rows: Iterable[Row]) -> None:
        with self._lock, self._db:
            self._db.executemany("INSERT OR REPLACE INTO points VALUES (?, ?, ?, ?, ?)", list(rows))

    def remove(self, ids: Iterable[str]) -> None:
        with self._lock, self._db:
            self._db.executemany("DELETE FROM points WHERE id = ?", [(i,) for i in ids])

    def replace_all(self, rows: Iterable[Row]) -> None:
        with self._lock, self._db:
            self._db.execute("DELETE FROM points")
            self._db.executemany("INSERT OR REPLACE INTO points VALUES (?, ?, ?, ?, ?)", list(rows))

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM points").fetchone()[0])

    def ids(self) -> set[str]:
        with self._lock:
            return {r[0] for r in self._db.execute("SELECT id FROM points")}

    def rows(self, ids: Iterable[str]) -> list[Row]:
        wanted = list(ids)
        out: list[Row] = []
        with self._lock:
            for start in range(0, len(wanted), 500):
                part = wanted[start : start + 500]
                marks = ",".join("?" * len(part))
                out.extend(self._db.execute(f"SELECT * FROM points WHERE id IN ({marks})", part))
        return sorted(out, key=lambda r: (r[1] or "", r[2] or "", r[3] or "", r[4]))

    def get_state(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_state(self, key: str, value: str) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO state VALUES (?, ?)", (key, value))
