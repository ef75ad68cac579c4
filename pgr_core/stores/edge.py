"""A persistent embedded store on Qdrant's own engine (``qdrant-edge-py``), one directory on disk.

``<dir>/shard/`` is an :class:`qdrant_edge.EdgeShard` with its write-ahead log on; ``<dir>/meta.json``
says what wrote it (format ``pgr-edge/1``, the embedder's name and dimension, hybrid or not);
``<dir>/.lock`` is the :class:`~pgr_core.stores._filelock.StoreLock` of the one process that has it open.
Every tenant shares the one shard: each point carries its owner (``user_id``, ``agent_id``,
``run_id``) in its payload, the owner fields are indexed (``user_id`` as the tenant key), and every
read filters by the caller's scope inside the engine.

>>> with EdgeStore.open("memory.edge", embedder=HashingEmbedder()) as store:  # doctest: +SKIP
...     store.add("I hurt my knee in March", scope=Scope(user_id="u1"), date="2025-03-10")
...     store.search_batch(["knee"], scope=Scope(user_id="u1"), params=SearchParams())
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

import numpy as np

from pgr_core.errors import ConfigurationError, DamagedStoreError, InvalidArgumentError, PGRError, StoreError
from pgr_core.models.caches import CachedEmbedder
from pgr_core.models.embedders import Embedder, default_embedder
from pgr_core.stores._acknowledged import FILE as ACK_FILE
from pgr_core.stores._acknowledged import Acknowledged, Row
from pgr_core.stores._filelock import StoreLock
from pgr_core.stores._validate import check_date_kind, check_facts, check_id, check_ids, check_vectors
from pgr_core.stores.contract import AddsOneFact, Store, validate_probes
from pgr_core.types import EVERY_ABILITY, Capabilities, Fact, Hit, Scope, SearchParams

__all__ = ["EdgeStore"]

logger = logging.getLogger(__name__)

FORMAT = "pgr-edge/1"
META_FILE = "meta.json"
SHARD_DIR = "shard"
DENSE = "dense"  # the named dense vector
SPARSE = "bm25"  # the named sparse vector of a hybrid store
_OWNER_FIELDS = ("user_id", "agent_id", "run_id")
_POINT_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://pgr.invalid/edge-store/point")
_UPSERT_CHUNK = 1024  # points per update operation
_SCROLL_PAGE = 1024
_RRF_K = 60  # the usual reciprocal-rank-fusion constant (Cormack et al.)
_INSTALL = "pip install 'pgr[local]'"

_OPEN_LOCK = threading.Lock()
_OPEN_DIRS: set[str] = set()  # directories an EdgeStore of this process has open
_SEQ_LOCK = threading.Lock()
_last_seq = 0


def _engine() -> Any:
    """The ``qdrant_edge`` module, imported on first use so ``import pgr_core`` never needs it."""
    try:
        import qdrant_edge
    except ImportError as exc:
        raise ConfigurationError(
            f"EdgeStore needs the embedded Qdrant engine (qdrant-edge-py), which is not installed: {_INSTALL}"
        ) from exc
    return qdrant_edge


def point_id(scope: Scope, fact_id: str) -> str:
    """The point id of fact ``fact_id`` owned by ``scope``: a UUID5 of the owner fields and the id, so
    the same fact id under two owners is two points, and writing one (owner, id) again replaces it."""
    key = json.dumps([scope.user_id, scope.agent_id, scope.run_id, fact_id], ensure_ascii=False)
    return str(uuid.uuid5(_POINT_NAMESPACE, key))


def _next_seqs(n: int) -> int:
    """The first of ``n`` increasing write sequence numbers (nanoseconds, never repeated in a process):
    ``facts_for`` lists facts in the order they were written."""
    global _last_seq
    with _SEQ_LOCK:
        first = max(time.time_ns(), _last_seq + 1)
        _last_seq = first + n - 1
        return first


class _Gate:
    """Counts the calls in flight so :meth:`EdgeStore.close` closes the shard only after they end, and
    turns away every call that comes after close."""

    def __init__(self, where: Path) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self.closed = False
        self.where = where

    @contextmanager
    def open(self) -> Iterator[None]:
        with self._cond:
            if self.closed:
                raise ConfigurationError(f"store is closed ({self.where}); open it again with EdgeStore.open(path)")
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if not self._active:
                    self._cond.notify_all()

    def shut(self) -> bool:
        """Refuse new calls and wait for those in flight; False when it was shut already."""
        with self._cond:
            if self.closed:
                return False
            self.closed = True
            while self._active:
                self._cond.wait()
            return True


class _Resources:
    """What an open EdgeStore holds, apart from the store object, so a finalizer can close it."""

    def __init__(self, root: Path, key: str, gate: _Gate) -> None:
        self.root = root
        self.key = key
        self.gate = gate
        self.shard: Any = None
        self.lock: StoreLock | None = None
        self.ack: Acknowledged | None = None

    def close(self) -> None:
        try:
            if self.gate.shut() and self.shard is not None:
                try:
                    self.shard.flush()
                finally:
                    self.shard.close()
                if self.ack is not None:  # the engine's files are whole: the next open need not list them
                    self.ack.set_state("clean", "1")
        except Exception as exc:  # a close at exit or collection must not raise; the WAL still holds the writes
            logger.warning("closing the EdgeStore at %s failed: %s", self.root, exc)
        finally:
            self.shard = None
            if self.ack is not None:
                self.ack.close()
                self.ack = None
            if self.lock is not None:
                self.lock.release()
                self.lock = None
            with _OPEN_LOCK:
                _OPEN_DIRS.discard(self.key)


@contextmanager
def _backend(what: str) -> Iterator[None]:
    """An engine exception becomes a :class:`StoreError` with the engine's own as its cause."""
    try:
        yield
    except PGRError:
        raise
    except Exception as exc:
        raise StoreError(f"EdgeStore: {what} failed in the engine: {type(exc).__name__}: {exc}") from exc


class EdgeStore(AddsOneFact, Store):
    """Facts in an embedded Qdrant shard on disk: HNSW, payload indexes, a write-ahead log, in-process.

    Mirrors :class:`~pgr_core.stores.memory.InMemoryStore`'s API, with one difference: a fact is identified by
    its owner *and* its id, so every id-taking and listing method takes ``scope=`` (required), and a
    fact outside that scope is never returned, listed or deleted. The same fact id written by two
    owners is two facts; writing the same (owner, id) again replaces it.

    - **One process per store.** Opening takes the directory's lock (``<dir>/.lock``) and holds it
      until :meth:`close` (or the end of a ``with`` block; garbage collection and interpreter exit
      close it too, best effort). A second process waits up to ``lock_timeout_s`` and then gets
      :class:`~pgr_core.stores._filelock.StoreLockedError` naming the holder's pid; a second open in the same
      process is refused at once. Several processes share one memory through a Qdrant server instead:
      :class:`pgr_adapters.qdrant.QdrantStore`.
    - **Durable writes.** :meth:`add_facts` validates every fact and vector first (a bad one leaves the
      store unchanged) and upserts in one update operation per 1024 points, which the engine writes
      ahead to its log: once it returns, a ``kill -9`` loses nothing (the log is replayed on open).
      Segments are flushed every ``flush_every_s`` (5 s) of writing and at :meth:`close`;
      ``sync_writes=True`` flushes on every write (survives a power cut too; tens of milliseconds a
      write).
    - **Search.** One ``query_batch`` call per round for every probe, filtered by the scope in the
      engine, ``score_threshold`` = τ (inclusive); with a window, one paged scroll per round fetches every
      hit's ±w same-owner, same-session neighbours.
    - **Indexing.** Small shards are scanned exactly. HNSW graphs are built per tenant (``payload_m``,
      no global graph: ``m=0``) only by :meth:`optimize`, never on the query path; a bulk
      :meth:`add_facts` of ``auto_optimize_at`` (10 000) facts or more runs it before returning. The
      engine holds the GIL for the whole optimization (measured with qdrant-edge-py 0.9: no other
      Python thread runs meanwhile), so it runs synchronously rather than in a thread that would stall
      the process anyway. Tenants whose vectors fit under ``full_scan_threshold`` (10 MB: about 6 500
      facts at 384 dimensions) are always searched exactly.
    - **Hybrid** (``hybrid=True`` when the store is created; kept in ``meta.json``): a BM25 sparse vector
      beside the dense one, and each probe searches both (dense with τ, BM25 without) fused by
      reciprocal rank in the same ``query_batch`` call. Scores are then RRF scores (about 1/60 at the
      top), not cosines: such an instance declares ``capabilities.cosine_scores = False``, and τ only
      filters the dense side, so an exact keyword match comes back even when its cosine is below τ.

    ``EdgeStore(path, ...)`` and ``EdgeStore.open(path, ...)`` are the same. The engine's calls hold
    the GIL, so searches from several threads are safe but run one at a time.

    >>> store = EdgeStore.open("memory.edge", embedder=HashingEmbedder())  # doctest: +SKIP
    >>> store.add("I hurt my knee in March", scope=Scope(user_id="u1"), date="2025-03-10")  # doctest: +SKIP
    >>> store.close()  # doctest: +SKIP
    """

    capabilities: ClassVar[Capabilities] = EVERY_ABILITY
    #: a bulk add_facts of at least this many facts builds the HNSW index before returning
    auto_optimize_at: int = 10_000
    #: flush the segments after a write once this many seconds have passed since the last flush
    flush_every_s: float = 5.0
    #: HNSW beam width at query time (the engine's default, 100, loses a few percent of recall)
    hnsw_ef: int = 128

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        embedder: Embedder | None = None,
        create: bool = True,
        hybrid: bool | None = None,
        lock_timeout_s: float | None = 30.0,
        embedding_cache: int = 4096,
        sync_writes: bool = False,
    ) -> None:
        """Open the store in directory ``path``, creating it (``create=True``) when the directory is
        missing or empty.

        ``embedder`` must be the one that wrote an existing store (name and dimension are checked);
        ``hybrid`` (None: as stored, False for a new store) adds BM25 at creation; ``lock_timeout_s``
        is how long to wait for another process holding the store (None: forever); ``sync_writes``
        flushes every write to disk (see the class docstring).
        """
        if not isinstance(sync_writes, bool):
            raise InvalidArgumentError(f"sync_writes must be true or false, got {sync_writes!r}")
        if isinstance(embedding_cache, bool) or not isinstance(embedding_cache, int) or embedding_cache < 0:
            raise InvalidArgumentError(f"embedding_cache must be an integer >= 0, got {embedding_cache!r}")
        engine = _engine()
        root = Path(path).expanduser()
        if root.exists() and not root.is_dir():
            raise ConfigurationError(
                f"{root} is a file, not an EdgeStore directory; pass the path of a directory (a missing one is "
                f"created), or import a .pgr file with EdgeStore.import_pgr({str(root)!r}, <new directory>)"
            )
        if not root.exists():
            if not create:
                raise ConfigurationError(f"no EdgeStore at {root}; pass create=True to make one there")
            root.mkdir(parents=True, exist_ok=True)
        key = str(root.resolve())
        with _OPEN_LOCK:
            if key in _OPEN_DIRS:
                raise ConfigurationError(
                    f"the EdgeStore at {root} is already open in this process; use that EdgeStore object, "
                    "or close() it first"
                )
            _OPEN_DIRS.add(key)
        chosen = embedder if embedder is not None else default_embedder()
        self.embedder: Embedder = (
            CachedEmbedder.wrap(chosen, max_entries=embedding_cache) if embedding_cache else chosen
        )
        self._edge = engine
        self._root = root
        self._gate = _Gate(root)
        self._res = _Resources(root, key, self._gate)
        self._finalizer = weakref.finalize(self, self._res.close)  # also runs at interpreter exit
        self._write_lock = threading.Lock()
        self._sync_writes = sync_writes
        self._last_flush = time.monotonic()
        self._aware: bool | None = None  # all dates timezone-aware, or all naive; None until known
        try:
            self._res.lock = StoreLock(root, timeout_s=lock_timeout_s, what="EdgeStore").acquire()
            self._hybrid = self._open_or_create(create, hybrid)
        except BaseException:
            self._finalizer()
            raise
        self._bm25 = engine.Bm25() if self._hybrid else None
        if self._hybrid:  # RRF scores are not cosines: τ means something else here
            self.__dict__["capabilities"] = replace(EdgeStore.capabilities, cosine_scores=False)

    @classmethod
    def open(cls, path: str | os.PathLike[str], **options: Any) -> EdgeStore:
        """``EdgeStore(path, **options)``, the name that reads well beside ``close()``."""
        return cls(path, **options)

    # ------------------------------------------------------------------ opening and closing

    def _open_or_create(self, create: bool, hybrid: bool | None) -> bool:
        """Read ``meta.json`` and load the shard, or create both; returns whether the store is hybrid."""
        root, meta_path = self._root, self._root / META_FILE
        if meta_path.exists():
            meta = self._read_meta(meta_path)
            if hybrid is not None and bool(hybrid) != bool(meta.get("hybrid")):
                raise ConfigurationError(
                    f"{root} was created with hybrid={bool(meta.get('hybrid'))}; open it with hybrid=None "
                    "(as stored), or create a new store to change it"
                )
            shard_dir = root / SHARD_DIR
            try:
                self._res.shard = self._edge.EdgeShard.load(str(shard_dir))
            except Exception as exc:
                if "WouldBlock" in str(exc):
                    raise ConfigurationError(
                        f"{shard_dir} is open in another program (the engine's write-ahead log is locked); "
                        "close it there first"
                    ) from exc
                raise DamagedStoreError(
                    f"{root} is damaged: the engine cannot load {shard_dir} ({type(exc).__name__}: {exc}); "
                    f"nothing was changed. {_repair_hint(root)}",
                    path=root,
                ) from exc
            self._verify(meta)
            return bool(meta.get("hybrid"))
        others = sorted(p.name for p in root.iterdir() if p.name != ".lock")
        if others:
            hint = (
                "it holds a shard but no meta.json (a creation that was interrupted?): remove the directory "
                "and create the store again"
                if others == [SHARD_DIR]
                else "open an EdgeStore directory, or pass a new or empty one to create a store"
            )
            raise ConfigurationError(
                f"{root} is not an EdgeStore (no {META_FILE}) and is not empty ({others[:5]}); {hint}"
            )
        if not create:
            raise ConfigurationError(f"no EdgeStore at {root}; pass create=True to make one there")
        is_hybrid = bool(hybrid)
        with _backend("creating the shard"):
            self._res.shard = _create_shard(self._edge, root / SHARD_DIR, int(self.embedder.dim), is_hybrid)
        self._res.ack = Acknowledged(root, durable=self._sync_writes)
        self._res.ack.set_state("clean", "0")
        _write_meta(
            root,
            {
                "format": FORMAT,
                "embedder": self.embedder.name,
                "dim": int(self.embedder.dim),
                "hybrid": is_hybrid,
                "dense_vector": DENSE,
                "sparse_vector": SPARSE if is_hybrid else None,
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "acknowledged": True,
            },
        )
        return is_hybrid

    def _verify(self, meta: Mapping[str, Any]) -> None:
        """Compare the loaded shard with the acknowledged record (see :mod:`pgr_core.stores._acknowledged`):
        refuse a shard that lost an acknowledged fact, adopt points a crashed writer did not record.

        After a clean close a count suffices; after a crash (or a count that differs) every point id is
        listed and compared."""
        root, shard = self._root, self._res.shard
        had = (root / ACK_FILE).exists()
        if not had and meta.get("acknowledged"):
            raise DamagedStoreError(
                f"{root} is damaged: {root / ACK_FILE} is missing, so which facts the store acknowledged is "
                f"unknown; nothing was changed. {_repair_hint(root)}",
                path=root,
            )
        ack = Acknowledged(root, durable=self._sync_writes)
        try:
            if not had:  # written before pgr kept this record: what the engine holds now is the record
                ack.replace_all(_engine_rows(self._edge, shard))
                _write_meta(root, {**meta, "acknowledged": True})
            elif ack.get_state("clean") != "1" or _engine_count(self._edge, shard) != ack.count():
                report = _compare(self._edge, shard, ack)
                if report["lost"]:
                    raise _damaged(root, report)
                ack.add(report["unrecorded"])  # a writer died between the engine's log and this record
            ack.set_state("clean", "0")
        except BaseException:
            ack.close()
            raise
        self._res.ack = ack

    def _read_meta(self, meta_path: Path) -> dict[str, Any]:
        meta = _load_meta(meta_path)
        name, dim = meta.get("embedder"), meta.get("dim")
        if name != self.embedder.name or dim != self.embedder.dim:
            raise ConfigurationError(
                f"{self._root} was embedded with {name} ({dim} dimensions), not {self.embedder.name} "
                f"({self.embedder.dim} dimensions); open it with the embedder that wrote it"
            )
        return meta

    def close(self) -> None:
        """Wait for calls in flight, flush, close the shard and release the lock (idempotent)."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._gate.closed

    @property
    def path(self) -> Path:
        return self._root

    @property
    def hybrid(self) -> bool:
        return self._hybrid

    def __enter__(self) -> EdgeStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"EdgeStore({str(self._root)!r}, embedder={self.embedder.name!r}, hybrid={self._hybrid}, {state})"

    @contextmanager
    def _shard(self) -> Iterator[Any]:
        with self._gate.open():
            yield self._res.shard

    # ------------------------------------------------------------------ writing

    def add_facts(self, facts: Iterable[Fact], *, vectors: Any = None) -> list[str]:
        """Store facts (one embedding batch) and return their ids; an (owner, id) that exists is replaced.

        Every fact and vector is checked first (NaN, infinite or zero vectors are refused): a bad one
        leaves the store unchanged. The points go in one update operation per 1024, written ahead to the
        engine's log before this returns, so a returned write survives the process dying (``kill -9``
        included: the log is replayed on open). Segments are flushed to disk at most every
        ``flush_every_s`` seconds and at :meth:`close`; ``sync_writes=True`` flushes on every write, for
        a returned write that survives a power cut too (about 90 ms a write on this disk instead of
        0.05 ms). At least ``auto_optimize_at`` facts: the HNSW index is built before returning
        (:meth:`optimize`).
        """
        batch = check_facts(list(facts))
        dim = int(self.embedder.dim)
        rows = check_vectors(vectors, len(batch), dim) if vectors is not None else None
        if not batch:
            return []
        if rows is None:  # straight to the model: a bulk write would flush the probe cache
            embedder = self.embedder
            embed = embedder.embed_uncached if isinstance(embedder, CachedEmbedder) else embedder.embed
            rows = check_vectors(embed([f.text for f in batch]), len(batch), dim)
        with self._shard() as shard, self._write_lock:
            self._aware = check_date_kind(batch, self._aware, lambda: self._stored_kind(shard))
            points, acknowledged = self._points(batch, rows)
            with _backend(f"writing {len(points)} point(s)"):
                for start in range(0, len(points), _UPSERT_CHUNK):
                    shard.update(self._edge.UpdateOperation.upsert_points(points[start : start + _UPSERT_CHUNK]))
                self._maybe_flush(shard)
            # after the engine's log: a crash in between leaves an unrecorded point, adopted on open
            self._acknowledge(lambda ack: ack.add(acknowledged))
        self._notify({f.scope for f in batch})
        if len(batch) >= self.auto_optimize_at:
            self.optimize()
        return [f.id for f in batch]

    def _points(self, batch: list[Fact], rows: np.ndarray) -> tuple[list[Any], list[Row]]:
        """One point per (owner, id), the last of a batch winning as an upsert would, and the record
        rows of those points (see :mod:`pgr_core.stores._acknowledged`)."""
        edge, first = self._edge, _next_seqs(len(batch))
        latest: dict[str, Any] = {}
        owners: dict[str, Row] = {}
        for i, (fact, row) in enumerate(zip(batch, rows, strict=True)):
            vector: dict[str, Any] = {DENSE: row.tolist()}
            if self._bm25 is not None:
                vector[SPARSE] = self._bm25.embed_document(fact.text)
            pid = point_id(fact.scope, fact.id)
            latest.pop(pid, None)  # keep batch order for the survivor
            latest[pid] = edge.Point(pid, vector, _payload(fact, first + i))
            owners[pid] = _fact_row(pid, fact)
        return list(latest.values()), list(owners.values())

    def _stored_kind(self, shard: Any) -> bool | None:
        """Whether the store's dates are aware (True), naive (False) or absent (None): one small scroll."""
        edge = self._edge
        for key in ("date", "updated_at"):
            flt = edge.Filter(must_not=[edge.IsEmptyCondition(key)])
            with _backend("reading a stored date"):
                records, _ = shard.scroll(
                    edge.ScrollRequest(limit=1, filter=flt, with_payload=edge.PayloadSelector.Include([key]))
                )
            if records:
                moment = _read_iso((records[0].payload or {}).get(key))
                if moment is not None:
                    return moment.tzinfo is not None and moment.utcoffset() is not None
        return None

    def delete(self, fact_ids: Iterable[str], *, scope: Scope | Mapping[str, str]) -> int:
        """Remove the facts with these ids that ``scope`` allows; returns how many were removed.

        A scope wider than the owner (``user_id`` alone for a fact of that user's agent) removes every
        fact with that id it allows: each owner's is one fact. Facts outside ``scope`` stay.
        """
        scope = Scope.coerce(scope)
        wanted = check_ids(fact_ids)
        if not wanted:
            return 0
        edge = self._edge
        with self._shard() as shard, self._write_lock:
            found = self._scroll(shard, self._ids_filter(wanted, scope), _OWNER_FIELDS, what="finding facts to delete")
            if not found:
                return 0
            # before the engine: a crash in between leaves a point the next open adopts, never a lost one
            self._acknowledge(lambda ack: ack.remove(str(r.id) for r in found))
            with _backend(f"deleting {len(found)} point(s)"):
                shard.update(edge.UpdateOperation.delete_points([r.id for r in found]))
                self._maybe_flush(shard)
        self._notify({_owner(r.payload or {}) for r in found})
        return len(found)

    def _acknowledge(self, change: Any) -> None:
        ack = self._res.ack
        if ack is None:  # pragma: no cover - an open store always has its record
            raise StoreError(f"EdgeStore: {self._root} has no record of acknowledged facts open")
        try:
            change(ack)
        except sqlite3.Error as exc:
            raise StoreError(f"EdgeStore: recording acknowledged facts in {ack.path} failed: {exc}") from exc

    def _maybe_flush(self, shard: Any) -> None:
        """Flush the segments when ``sync_writes`` is on or ``flush_every_s`` has passed (under the write lock)."""
        now = time.monotonic()
        if self._sync_writes or now - self._last_flush >= self.flush_every_s:
            shard.flush()
            self._last_flush = now

    def optimize(self) -> bool:
        """Build the HNSW index (per tenant) and merge segments; True if the engine changed anything.

        Blocks until done: the engine holds the GIL throughout, so nothing else in this process runs
        meanwhile (a thread would not help). Never called on the query path; :meth:`add_facts` calls
        it after a bulk write. A shard too small to need an index is left as it is (False).
        """
        with self._shard() as shard, self._write_lock, _backend("optimize"):
            return bool(shard.optimize())

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        """How many facts the store holds, every owner together."""
        with self._shard() as shard:
            return _engine_count(self._edge, shard)

    def stats(self) -> dict[str, int]:
        """The engine's own numbers: points, segments, and how many vectors HNSW indexes."""
        with self._shard() as shard, _backend("info"):
            info = shard.info()
            return {
                "points": int(info.points_count),
                "segments": int(info.segments_count),
                "indexed_vectors": int(info.indexed_vectors_count),
            }

    def get(self, fact_id: str, *, scope: Scope | Mapping[str, str]) -> Fact | None:
        """The fact ``fact_id`` that ``scope`` allows, or None.

        When several owners within ``scope`` hold that id, the one owned by ``scope`` itself is
        returned; with none of them owned by ``scope`` the call is ambiguous (InvalidArgumentError:
        pass the owner's full scope).
        """
        scope = Scope.coerce(scope)
        fact_id = check_id(fact_id)
        with self._shard() as shard:
            records = self._resolve(shard, [fact_id], scope, with_vector=False)
        record = records.get(fact_id)
        return None if record is None else _fact(record.payload or {})

    def get_many(self, fact_ids: Sequence[str], *, scope: Scope | Mapping[str, str]) -> dict[str, Fact]:
        """fact id -> fact for those of ``fact_ids`` that ``scope`` allows (one paged scroll); ids
        are resolved as :meth:`get` resolves them, and unknown ones are left out."""
        scope = Scope.coerce(scope)
        with self._shard() as shard:
            records = self._resolve(shard, [str(i) for i in fact_ids], scope, with_vector=False)
        return {fid: _fact(r.payload or {}) for fid, r in records.items()}

    def with_window(
        self, hits: Sequence[Hit], *, scope: Scope | Mapping[str, str], window: int
    ) -> dict[str, list[Hit]]:
        """The ±window same-session neighbours of each hit's fact (one scroll): fact id -> hits."""
        scope = Scope.coerce(scope)
        anchors = list(hits)
        with self._shard() as shard:
            turns = self._neighbours(shard, [anchors], scope, window)
        out: dict[str, list[Hit]] = {}
        for hit in _with_neighbours(anchors, turns, window):
            if hit.neighbour_of is not None:
                out.setdefault(hit.neighbour_of, []).append(hit)
        return out

    def vectors_for(self, fact_ids: Sequence[str], *, scope: Scope | Mapping[str, str]) -> np.ndarray:
        """The stored unit vectors of ``fact_ids`` (float32, one row each, in that order); a KeyError
        names an id that ``scope`` does not see. Ids are resolved as :meth:`get` resolves them."""
        scope = Scope.coerce(scope)
        ids = [str(i) for i in fact_ids]
        with self._shard() as shard:
            records = self._resolve(shard, ids, scope, with_vector=True)
        out = np.zeros((len(ids), int(self.embedder.dim)), dtype=np.float32)
        for row, fact_id in enumerate(ids):
            record = records.get(fact_id)
            if record is None:
                raise KeyError(f"no fact {fact_id!r} within scope {scope.as_dict()} in this store")
            vector = record.vector[DENSE] if isinstance(record.vector, dict) else record.vector
            out[row] = np.asarray(vector, dtype=np.float32)
        return out

    def facts_for(self, scope: Scope | Mapping[str, str]) -> list[Fact]:
        """Every fact ``scope`` allows, in the order they were (last) written."""
        scope = Scope.coerce(scope)
        with self._shard() as shard:
            records = self._scroll(shard, self._scope_filter(scope), True, what="listing facts")
        payloads = sorted((r.payload or {} for r in records), key=lambda p: p.get("seq") or 0)
        return [_fact(p) for p in payloads]

    def scopes(self) -> list[Scope]:
        """Every distinct owner in the store (one scroll over the owner fields), sorted."""
        with self._shard() as shard:
            records = self._scroll(shard, None, _OWNER_FIELDS, what="listing owners")
        owners = {_owner(r.payload or {}) for r in records}
        return sorted(owners, key=lambda s: tuple((v is not None, v or "") for v in (s.user_id, s.agent_id, s.run_id)))

    def user_ids(self) -> list[str]:
        """The distinct ``user_id`` values that own facts, sorted: one facet call on the tenant index
        (its cost grows with the number of users, not of facts, unlike :meth:`scopes`)."""
        edge = self._edge
        with self._shard() as shard, _backend("listing users"):
            limit = max(1, len(self))
            response = shard.facet(edge.FacetRequest(key="user_id", limit=limit, exact=True))
        return sorted(str(hit.value) for hit in response.hits if isinstance(hit.value, str) and hit.value)

    def _resolve(self, shard: Any, ids: list[str], scope: Scope, *, with_vector: bool) -> dict[str, Any]:
        """fact id -> the one record it names within ``scope`` (see :meth:`get`)."""
        if not ids:
            return {}
        fields = (*_OWNER_FIELDS, "fact_id") if with_vector else True
        records = self._scroll(
            shard, self._ids_filter(ids, scope), fields, with_vector=[DENSE] if with_vector else False, what="get"
        )
        by_id: dict[str, list[Any]] = {}
        for record in records:
            by_id.setdefault(str((record.payload or {}).get("fact_id")), []).append(record)
        out: dict[str, Any] = {}
        for fact_id, found in by_id.items():
            if len(found) == 1:
                out[fact_id] = found[0]
                continue
            mine = [r for r in found if _owner(r.payload or {}) == scope]
            if len(mine) != 1:
                owners = sorted(str(_owner(r.payload or {}).as_dict()) for r in found)
                raise InvalidArgumentError(
                    f"fact id {fact_id!r} is held by {len(found)} owners within scope {scope.as_dict()} "
                    f"({', '.join(owners)}); pass the owner's full scope"
                )
            out[fact_id] = mine[0]
        return out

    def _scroll(
        self, shard: Any, flt: Any, payload: bool | Sequence[str], *, with_vector: Any = False, what: str
    ) -> list[Any]:
        """Every record matching ``flt``, page by page."""
        return list(_engine_points(self._edge, shard, flt, payload=payload, vectors=with_vector, what=what))

    # -- filters

    def _scope_conditions(self, scope: Scope) -> list[Any]:
        """One condition per set scope field: a fact is visible when every set field matches."""
        edge = self._edge
        return [edge.FieldCondition(k, match=edge.MatchValue(v)) for k, v in scope.as_dict().items()]

    def _scope_filter(self, scope: Scope) -> Any:
        return self._edge.Filter(must=self._scope_conditions(scope))

    def _ids_filter(self, ids: list[str], scope: Scope) -> Any:
        edge = self._edge
        return edge.Filter(
            must=[*self._scope_conditions(scope), edge.FieldCondition("fact_id", match=edge.MatchAny(ids))]
        )

    def _owner_conditions(self, owner: Scope) -> list[Any]:
        """Exactly this owner: its set fields match, its unset ones are empty."""
        edge = self._edge
        return [
            edge.FieldCondition(k, match=edge.MatchValue(v)) if v is not None else edge.IsEmptyCondition(k)
            for k, v in zip(_OWNER_FIELDS, (owner.user_id, owner.agent_id, owner.run_id), strict=True)
        ]

    # ------------------------------------------------------------------ searching

    def search_batch(self, probes: Sequence[str], *, scope: Scope, params: SearchParams) -> list[list[Hit]]:
        probes = validate_probes(probes)
        scope = Scope.coerce(scope)
        if not probes:
            return []
        vectors = self.embedder.embed(probes)
        with self._shard() as shard:
            requests = [
                self._request(probe, vector, scope, params) for probe, vector in zip(probes, vectors, strict=True)
            ]
            with _backend(f"query_batch of {len(requests)} probe(s)"):
                responses = shard.query_batch(self._edge.QueryBatchRequest(requests))
            direct = [self._direct(points, params) for points in responses]
            turns = self._neighbours(shard, direct, scope, params.window) if params.window else {}
        return [_with_neighbours(hits, turns, params.window) for hits in direct]

    def _request(self, probe: str, vector: np.ndarray, scope: Scope, params: SearchParams) -> Any:
        edge = self._edge
        flt = self._scope_filter(scope)
        search = edge.SearchParams(hnsw_ef=max(self.hnsw_ef, params.top_k))
        dense = edge.Query.Nearest(np.asarray(vector, dtype=np.float32).tolist(), using=DENSE)
        # the engine keeps scores strictly above the threshold; τ is inclusive (checked again in _direct)
        threshold = params.min_score - 1e-6
        if not self._hybrid:
            return edge.QueryRequest(
                limit=params.top_k, query=dense, filter=flt, score_threshold=threshold, params=search, with_payload=True
            )
        assert self._bm25 is not None
        depth = max(4 * params.top_k, 32)  # each side's candidates for the fusion
        return edge.QueryRequest(
            limit=params.top_k,
            prefetches=[
                edge.Prefetch(limit=depth, query=dense, filter=flt, score_threshold=threshold, params=search),
                edge.Prefetch(
                    limit=depth, query=edge.Query.Nearest(self._bm25.embed_query(probe), using=SPARSE), filter=flt
                ),
            ],
            query=edge.Fusion.Rrf(k=_RRF_K),
            filter=flt,
            with_payload=True,
        )

    def _direct(self, points: Sequence[Any], params: SearchParams) -> list[Hit]:
        hits: list[Hit] = []
        for point in points:
            score = float(point.score)
            if not self._hybrid and score < params.min_score:
                continue
            hits.append(Hit(fact=_fact(point.payload or {}), score=score, rank=len(hits)))
        return hits[: params.top_k]

    def _neighbours(
        self, shard: Any, direct: list[list[Hit]], scope: Scope, window: int
    ) -> dict[tuple[Scope, str, int], Fact]:
        """Every direct hit's ±window turns of the same owner and session, in one paged scroll for the
        whole batch: (owner, session, position) -> fact."""
        wanted: dict[tuple[Scope, str], set[int]] = {}
        for hit in (h for hits in direct for h in hits):
            fact = hit.fact
            if fact.session_id is None or fact.position is None:
                continue
            positions = wanted.setdefault((fact.scope, fact.session_id), set())
            for d in range(1, window + 1):
                positions.update(p for p in (fact.position - d, fact.position + d) if p >= 0)
        if not wanted:
            return {}
        edge = self._edge
        per_session = [
            edge.Filter(
                must=[
                    *self._owner_conditions(owner),
                    edge.FieldCondition("session_id", match=edge.MatchValue(session)),
                    edge.FieldCondition("position", match=edge.MatchAny(sorted(positions))),
                ]
            )
            for (owner, session), positions in wanted.items()
        ]
        flt = edge.Filter(must=[*self._scope_conditions(scope), edge.Filter(should=per_session)])
        turns: dict[tuple[Scope, str, int], Fact] = {}
        for record in self._scroll(shard, flt, True, what="fetching window neighbours"):
            fact = _fact(record.payload or {})
            if fact.session_id is not None and fact.position is not None and scope.allows(fact.scope):
                turns.setdefault((fact.scope, fact.session_id, fact.position), fact)
        return turns

    # ------------------------------------------------------------------ damage

    @classmethod
    def check(cls, path: str | os.PathLike[str], *, lock_timeout_s: float | None = 30.0) -> dict[str, Any]:
        """Compare the store's engine files with the facts it acknowledged, changing nothing.

        Returns ``{"path", "ok", "acknowledged", "held", "lost": [(user_id, agent_id, run_id, fact_id)],
        "unrecorded", "error"}``; ``error`` is the engine's own when it cannot load the shard. Takes the
        store's lock, so the store must not be open elsewhere.
        """
        root = Path(path).expanduser()
        with _offline(root, lock_timeout_s) as meta:
            edge, out = _engine(), {"path": str(root), "error": None, "unrecorded": 0}
            ack = Acknowledged(root) if (root / ACK_FILE).exists() else None
            try:
                try:
                    shard = edge.EdgeShard.load(str(root / SHARD_DIR))
                except Exception as exc:
                    rows, out["error"] = [], f"the engine cannot load the shard: {type(exc).__name__}: {exc}"
                else:
                    try:
                        rows = _engine_rows(edge, shard)
                    finally:
                        shard.close()
                if ack is None:
                    out.update(acknowledged=None, held=len(rows), lost=[])
                    if meta.get("acknowledged"):
                        out["error"] = f"{root / ACK_FILE} is missing"
                else:
                    report = _compare(edge, None, ack, rows)
                    out.update(report, unrecorded=len(report["unrecorded"]))
                    out["lost"] = [(r[1], r[2], r[3], r[4]) for r in report["lost"]]
            finally:
                if ack is not None:
                    ack.close()
        out["ok"] = not out["lost"] and out["error"] is None
        return out

    @classmethod
    def repair(cls, path: str | os.PathLike[str], *, lock_timeout_s: float | None = 30.0) -> dict[str, Any]:
        """Rebuild a damaged store from every point its engine files still hold; returns what it kept
        and lost.

        The points are read from the shard as it is (or, when the engine cannot load it, from its
        flushed segments without the write-ahead log), with their vectors and payloads as stored, and
        written to a new shard that takes the old one's place; the old one is kept beside it as
        ``shard.damaged-<time>`` for inspection (delete it when satisfied). The facts that were
        acknowledged but are in neither are the ``lost`` ones, also written to ``repair-<time>.json``
        in the store directory. A store that is whole is left as it is (``repaired: False``).
        """
        root = Path(path).expanduser()
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        with _offline(root, lock_timeout_s) as meta:
            edge, shard_dir = _engine(), root / SHARD_DIR
            points, source = _salvage(edge, shard_dir)
            rows = [_row(r.payload or {}, r.id) for r in points]
            ack = Acknowledged(root) if (root / ACK_FILE).exists() else None
            if ack is None:
                ack = Acknowledged(root)
                ack.replace_all(rows)
                unknown = True
            else:
                unknown = False
            try:
                report = _compare(edge, None, ack, rows)
                out: dict[str, Any] = {
                    "path": str(root),
                    "kept": len(rows),
                    "lost": [(r[1], r[2], r[3], r[4]) for r in report["lost"]],
                    "lost_unknown": unknown,  # the record itself was gone: what was lost cannot be said
                    "read_from": source,
                    "repaired": False,
                    "damaged_copy": None,
                    "report": None,
                }
                if not report["lost"] and source == "shard" and not unknown:
                    ack.add(report["unrecorded"])
                    return out
                fresh = root / f"shard.repairing-{stamp}"
                shutil.rmtree(fresh, ignore_errors=True)
                with _backend("writing the repaired shard"):
                    shard = _create_shard(edge, fresh, int(meta["dim"]), bool(meta.get("hybrid")))
                    try:
                        for start in range(0, len(points), _UPSERT_CHUNK):
                            part = points[start : start + _UPSERT_CHUNK]
                            batch = [edge.Point(r.id, r.vector, r.payload or {}) for r in part]
                            shard.update(edge.UpdateOperation.upsert_points(batch))
                        shard.flush()
                    finally:
                        shard.close()
                damaged = root / f"shard.damaged-{stamp}"
                os.replace(shard_dir, damaged)
                os.replace(fresh, shard_dir)
                _fsync_dir(root)
                ack.replace_all(rows)
                ack.set_state("clean", "1")
                _write_meta(root, {**meta, "acknowledged": True})
                out.update(repaired=True, damaged_copy=str(damaged), report=str(root / f"repair-{stamp}.json"))
                Path(out["report"]).write_text(json.dumps(out, indent=1), encoding="utf-8")
                return out
            finally:
                ack.close()

    # ------------------------------------------------------------------ import

    def add_from(self, source: Any) -> int:
        """Add every fact of the InMemoryStore ``source`` with the vectors it holds (nothing is
        re-embedded), owner by owner; returns how many."""
        by_owner: dict[Scope, list[Fact]] = {}
        for fact in source.facts:
            by_owner.setdefault(fact.scope, []).append(fact)
        for owner, facts in by_owner.items():
            self.add_facts(facts, vectors=source.vectors_for([f.id for f in facts], scope=owner))
        return sum(map(len, by_owner.values()))

    @classmethod
    def import_pgr(
        cls,
        pgr_file: str | os.PathLike[str],
        target_dir: str | os.PathLike[str],
        embedder: Embedder | None = None,
        *,
        hybrid: bool = False,
        lock_timeout_s: float | None = 30.0,
    ) -> EdgeStore:
        """A new EdgeStore in ``target_dir`` holding every fact of an InMemoryStore ``.pgr`` file, with
        the vectors stored in it (nothing is re-embedded). ``embedder`` must be the file's; the target
        must be a new or empty directory. Returns the open store (close it when done)."""
        from pgr_core.stores.memory import InMemoryStore

        source = InMemoryStore.load(Path(pgr_file), embedder=embedder)
        target = Path(target_dir)
        if (target / META_FILE).exists():
            raise ConfigurationError(
                f"{target} already holds an EdgeStore; import into a new directory (or open it and add_facts)"
            )
        store = cls(target, embedder=source.embedder, create=True, hybrid=hybrid, lock_timeout_s=lock_timeout_s)
        try:
            store.add_from(source)
        except BaseException:
            store.close()
            raise
        return store


# ---------------------------------------------------------------------- files


def _load_meta(meta_path: Path) -> dict[str, Any]:
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{meta_path} is unreadable ({exc}); this is not a usable EdgeStore") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise ConfigurationError(f"{meta_path}: unknown store format {found!r} (this pgr reads {FORMAT!r})")
    return meta


def _fsync_dir(root: Path) -> None:
    try:
        fd = os.open(root, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms that cannot open a directory
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_meta(root: Path, meta: Mapping[str, Any]) -> None:
    """Write ``meta.json`` atomically (a temporary file, fsync, rename, fsync of the directory)."""
    final = root / META_FILE
    tmp = final.with_name(final.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(meta, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    _fsync_dir(root)


def _create_shard(edge: Any, where: Path, dim: int, hybrid: bool) -> Any:
    """A new, empty shard with pgr's vectors and payload indexes, flushed."""
    config = edge.EdgeConfig(
        vectors={DENSE: edge.EdgeVectorParams(size=dim, distance=edge.Distance.Cosine)},
        sparse_vectors={SPARSE: edge.EdgeSparseVectorParams(modifier=edge.Modifier.Idf)} if hybrid else None,
        # per-tenant graphs only (m=0, payload_m): every search is filtered by an owner field;
        # a tenant under full_scan_threshold KB of vectors is scanned exactly
        hnsw_config=edge.HnswIndexConfig(m=0, ef_construct=100, full_scan_threshold=10_000, payload_m=16),
        wal_enabled=True,
    )
    shard = edge.EdgeShard.create(str(where), config)
    op, keyword = edge.UpdateOperation.create_field_index, edge.KeywordIndexParams
    for index in (
        op("user_id", keyword(is_tenant=True)),
        op("agent_id", keyword()),
        op("run_id", keyword()),
        # lookups only: no per-value HNSW graphs for these
        op("session_id", keyword(enable_hnsw=False)),
        op("fact_id", keyword(enable_hnsw=False)),
        op("position", edge.IntegerIndexParams(lookup=True, range=True, enable_hnsw=False)),
    ):
        shard.update(index)
    shard.flush()
    return shard


# ---------------------------------------------------------------------- acknowledged facts


@contextmanager
def _offline(root: Path, lock_timeout_s: float | None) -> Iterator[dict[str, Any]]:
    """The store's meta, with its lock held and no EdgeStore of this process open on it."""
    if not (root / META_FILE).exists():
        raise ConfigurationError(f"no EdgeStore at {root} (no {META_FILE})")
    meta = _load_meta(root / META_FILE)
    key = str(root.resolve())
    with _OPEN_LOCK:
        if key in _OPEN_DIRS:
            raise ConfigurationError(f"the EdgeStore at {root} is open in this process; close() it first")
        _OPEN_DIRS.add(key)
    try:
        lock = StoreLock(root, timeout_s=lock_timeout_s, what="EdgeStore").acquire()
        try:
            yield meta
        finally:
            lock.release()
    finally:
        with _OPEN_LOCK:
            _OPEN_DIRS.discard(key)


def _salvage(edge: Any, shard_dir: Path) -> tuple[list[Any], str]:
    """Every point (payload and vectors) the shard still holds, and where they were read from: the
    shard as it is, or, when the engine cannot load it, a copy of its segments without the log."""
    try:
        shard = edge.EdgeShard.load(str(shard_dir))
    except Exception as exc:
        logger.warning("the engine cannot load %s (%s); reading its segments without the log", shard_dir, exc)
    else:
        try:
            return list(_engine_points(edge, shard, payload=True, vectors=True)), "shard"
        finally:
            shard.close()
    copy = shard_dir.with_name(shard_dir.name + ".segments-only")
    shutil.rmtree(copy, ignore_errors=True)
    try:
        shutil.copytree(shard_dir, copy, ignore=lambda d, names: ["wal"] if Path(d) == shard_dir else [])
        (copy / "wal").mkdir()
        try:
            shard = edge.EdgeShard.load(str(copy))
        except Exception as exc:
            logger.warning("the engine cannot load the segments of %s either (%s): nothing to keep", shard_dir, exc)
            return [], "nothing"
        try:
            return list(_engine_points(edge, shard, payload=True, vectors=True)), "segments"
        finally:
            shard.close()
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _repair_hint(root: Path) -> str:
    return (
        f"`pgr store repair {root}` (EdgeStore.repair) keeps every intact fact and lists the lost ones; "
        f"`pgr store check {root}` only reports"
    )


def _row(payload: Mapping[str, Any], pid: object) -> Row:
    get = payload.get
    return (str(pid), get("user_id"), get("agent_id"), get("run_id"), str(get("fact_id")))


def _engine_count(edge: Any, shard: Any) -> int:
    with _backend("count"):
        return int(shard.count(edge.CountRequest(exact=True)))


def _engine_points(
    edge: Any, shard: Any, flt: Any = None, *, payload: Any, vectors: Any, what: str = "listing every point"
) -> Iterator[Any]:
    """Every point of the shard matching ``flt`` (None: all), page by page, with the payload fields and
    vectors asked for."""
    selector = payload if isinstance(payload, bool) else edge.PayloadSelector.Include(list(payload))
    offset = None
    while True:
        with _backend(what):
            records, offset = shard.scroll(
                edge.ScrollRequest(
                    offset=offset, limit=_SCROLL_PAGE, filter=flt, with_payload=selector, with_vector=vectors
                )
            )
        yield from records
        if offset is None or not records:
            return


def _engine_rows(edge: Any, shard: Any) -> list[Row]:
    fields = (*_OWNER_FIELDS, "fact_id")
    return [_row(r.payload or {}, r.id) for r in _engine_points(edge, shard, payload=fields, vectors=False)]


def _compare(edge: Any, shard: Any, ack: Acknowledged, held: list[Row] | None = None) -> dict[str, Any]:
    """What the shard holds against what was acknowledged: counts, the lost rows, the unrecorded rows."""
    rows = _engine_rows(edge, shard) if held is None else held
    ids, acked = {r[0] for r in rows}, ack.ids()
    return {
        "acknowledged": len(acked),
        "held": len(ids),
        "lost": ack.rows(acked - ids),
        "unrecorded": [r for r in rows if r[0] not in acked],
    }


def _named(rows: Sequence[Row], limit: int = 3) -> str:
    def one(row: Row) -> str:
        owner = ", ".join(f"{k}={v!r}" for k, v in zip(_OWNER_FIELDS, row[1:4], strict=True) if v is not None)
        return f"{row[4]!r} ({owner})"

    shown = "; ".join(one(r) for r in rows[:limit])
    return shown + (f"; and {len(rows) - limit} more" if len(rows) > limit else "")


def _damaged(root: Path, report: Mapping[str, Any]) -> DamagedStoreError:
    lost: list[Row] = report["lost"]
    return DamagedStoreError(
        f"{root} is damaged: its engine files hold {report['held']} facts, but {len(lost)} of the "
        f"{report['acknowledged']} it acknowledged are gone (such as {_named(lost)}); nothing was changed. "
        f"{_repair_hint(root)}",
        path=root,
        missing=[(r[1], r[2], r[3], r[4]) for r in lost],
    )


# ---------------------------------------------------------------------- payloads


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _timestamp(moment: datetime | None) -> float | None:
    """Seconds since the epoch; a naive date is read as UTC (for range filters, not for display)."""
    if moment is None:
        return None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def _read_iso(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _payload(fact: Fact, seq: int) -> dict[str, Any]:
    return {
        "fact_id": fact.id,
        "text": fact.text,
        "user_id": fact.scope.user_id,
        "agent_id": fact.scope.agent_id,
        "run_id": fact.scope.run_id,
        "type": fact.type,
        "date": _iso(fact.date),
        "date_ts": _timestamp(fact.date),
        "updated_at": _iso(fact.updated_at),
        "updated_at_ts": _timestamp(fact.updated_at),
        "session_id": fact.session_id,
        "position": fact.position,
        "metadata": dict(fact.metadata),
        "seq": seq,
    }


def _fact_row(pid: str, fact: Fact) -> Row:
    return (pid, fact.scope.user_id, fact.scope.agent_id, fact.scope.run_id, fact.id)


def _owner(payload: Mapping[str, Any]) -> Scope:
    return Scope(**{k: str(payload[k]) for k in _OWNER_FIELDS if payload.get(k) is not None})


def _fact(payload: Mapping[str, Any]) -> Fact:
    position = payload.get("position")
    session = payload.get("session_id")
    metadata = payload.get("metadata")
    return Fact(
        id=str(payload.get("fact_id")),
        text=str(payload.get("text") or ""),
        scope=_owner(payload),
        type=payload.get("type"),
        date=_read_iso(payload.get("date")),
        updated_at=_read_iso(payload.get("updated_at")),
        session_id=session if isinstance(session, str) and isinstance(position, int) else None,
        position=position if isinstance(session, str) and isinstance(position, int) else None,
        metadata=metadata if isinstance(metadata, dict) else {},
    )


def _with_neighbours(hits: list[Hit], turns: Mapping[tuple[Scope, str, int], Fact], window: int) -> list[Hit]:
    """Each direct hit followed by its neighbours, nearest first (-1, +1, -2, +2, ...), as InMemoryStore."""
    if not window or not turns:
        return hits
    out: list[Hit] = []
    for hit in hits:
        out.append(hit)
        fact = hit.fact
        if fact.session_id is None or fact.position is None:
            continue
        for offset in (d for w in range(1, window + 1) for d in (-w, w)):
            neighbour = turns.get((fact.scope, fact.session_id, fact.position + offset))
            if neighbour is not None:
                out.append(Hit(fact=neighbour, score=0.0, rank=hit.rank, neighbour_of=fact.id))
    return out
